// Runs one mistake of the catalogue (mistake.hpp): `cuda_sim_mistakes NAME`. Exit status 0
// when the simulator refused it (its words are printed), 1 when it let it through, 2 for a
// name not in the catalogue, 77 when this build cannot make it (mistakes::skip).
#include "mistake.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace mistakes {
std::map<std::string, Body>& registry() {
    static std::map<std::string, Body> r;
    return r;
}

std::string said_by_child(void (*body)()) {
    int words[2];
    if (pipe(words) != 0) return "";
    const pid_t child = fork();
    if (child == 0) {
        close(words[0]);
        dup2(words[1], 2);
        body();
        _exit(0);
    }
    close(words[1]);
    std::string said;
    char chunk[256];
    for (ssize_t n; (n = read(words[0], chunk, sizeof chunk)) > 0;) said.append(chunk, static_cast<std::size_t>(n));
    close(words[0]);
    int status = 0;
    waitpid(child, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? "" : said;
}

void skip(const char* why) {
    std::printf("skipped: %s\n", why);
    std::fflush(stdout);
    std::_Exit(77);
}
}  // namespace mistakes

int main(int argc, char** argv) {
    const auto& r = mistakes::registry();
    if (argc != 2 || !r.count(argv[1])) {
        std::fprintf(stderr, "usage: cuda_sim_mistakes NAME, NAME one of:");
        for (const auto& [name, body] : r) std::fprintf(stderr, " %s", name.c_str());
        std::fprintf(stderr, "\n");
        return 2;
    }
    const std::string refusal = r.at(argv[1])();
    if (refusal.empty()) {
        std::printf("NOT refused: the simulator let the mistake '%s' through\n", argv[1]);
        return 1;
    }
    std::printf("refused: %s\n", refusal.c_str());
    return 0;
}
