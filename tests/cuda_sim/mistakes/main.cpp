// Runs one mistake of the catalogue (mistake.hpp): `cuda_sim_mistakes NAME`. Exit status 0
// when the simulator refused it (its words are printed), 1 when it let it through, 2 for a
// name not in the catalogue.
#include "mistake.hpp"

#include <cstdio>

namespace mistakes {
std::map<std::string, Body>& registry() {
    static std::map<std::string, Body> r;
    return r;
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
