#include "attn/run_control.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <string>

using namespace attn;
namespace fs = std::filesystem;

namespace {
std::string read(const fs::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
}  // namespace

TEST_CASE("a directory written atomically replaces the old one only when complete") {
    const fs::path dir = attn_test::scratch("attn_test_atomic") / "ckpt";
    fs::remove_all(dir.parent_path());
    write_directory_atomically(dir, [](const fs::path& d) { std::ofstream(d / "a.txt") << "one"; });
    CHECK(read(dir / "a.txt") == "one");
    write_directory_atomically(dir, [](const fs::path& d) { std::ofstream(d / "a.txt") << "two"; });
    CHECK(read(dir / "a.txt") == "two");
    // A writer that fails half-way leaves the previous checkpoint exactly as it was.
    CHECK_THROWS_AS(write_directory_atomically(dir,
                                               [](const fs::path& d) {
                                                   std::ofstream(d / "a.txt") << "half";
                                                   throw std::runtime_error("disk full");
                                               }),
                    std::runtime_error);
    CHECK(read(dir / "a.txt") == "two");
    std::size_t entries = 0;
    for (const auto& e : fs::directory_iterator(dir.parent_path())) entries += (void(e), 1);
    CHECK(entries == 1);  // no temporary directory left behind
    fs::remove_all(dir.parent_path());
}

TEST_CASE("a save killed at any point leaves a whole checkpoint, old or new, and the next save cleans up") {
    // A child process saves "two" over "one" and is killed (SIGKILL) at one point of the
    // save (ATTN_CHECKPOINT_FAULT); the folder must then hold "one" or "two" whole, at once or
    // after recover_directory(), as every loader calls it. With the atomic exchange and with
    // the two renames a file system without it takes (ATTN_CHECKPOINT_NO_EXCHANGE).
    struct Case {
        const char* point;
        bool exchange;
        const char* expected;  // what the folder holds afterwards
        bool killed;           // whether the save reaches that point at all
    };
    const Case cases[] = {
        {"written", true, "one", true},        {"synced", true, "one", true},
        {"stepped-aside", true, "two", false},  // not on the exchange's path: the save completes
        {"swapped", true, "two", true},         {"written", false, "one", true},
        {"synced", false, "one", true},         {"stepped-aside", false, "two", true},
        {"swapped", false, "two", true},
    };
    const fs::path dir = attn_test::scratch("attn_test_atomic_kill") / "checkpoint";
    for (const Case& c : cases) {
        CAPTURE(c.point);
        CAPTURE(c.exchange);
        fs::remove_all(dir.parent_path());
        write_directory_atomically(dir, [](const fs::path& d) { std::ofstream(d / "a.txt") << "one"; });
        const pid_t child = ::fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            ::setenv("ATTN_CHECKPOINT_FAULT", (std::string(c.point) + ":1").c_str(), 1);
            if (!c.exchange) ::setenv("ATTN_CHECKPOINT_NO_EXCHANGE", "1", 1);
            write_directory_atomically(dir, [](const fs::path& d) { std::ofstream(d / "a.txt") << "two"; });
            ::_exit(0);
        }
        int status = 0;
        REQUIRE(::waitpid(child, &status, 0) == child);
        CHECK(WIFSIGNALED(status) == c.killed);
        recover_directory(dir);
        CHECK(read(dir / "a.txt") == c.expected);
        // The next save goes through and leaves nothing beside the checkpoint.
        write_directory_atomically(dir, [](const fs::path& d) { std::ofstream(d / "a.txt") << "three"; });
        CHECK(read(dir / "a.txt") == "three");
        std::size_t entries = 0, inside = 0;
        for (const auto& e : fs::directory_iterator(dir.parent_path())) entries += (void(e), 1);
        for (const auto& e : fs::directory_iterator(dir)) inside += (void(e), 1);
        CHECK(entries == 1);
        CHECK(inside == 1);  // a.txt alone: the completion marker is gone
    }
    fs::remove_all(dir.parent_path());
}

TEST_CASE("Ctrl-C becomes a stop request instead of killing the process") {
    StopRequest stop;
    CHECK_FALSE(stop.requested());
    std::raise(SIGINT);
    CHECK(stop.requested());
}

TEST_CASE("durations are formatted for people") {
    CHECK(format_duration(42) == "42s");
    CHECK(format_duration(185) == "3m05s");
    CHECK(format_duration(3720) == "1h02m");
}

TEST_CASE("the progress line shows step, loss, learning rate and an ETA") {
    ProgressLine p(100, 768);
    const std::string line = p.format(9, 2.3456, 1e-3);
    CHECK(line.find("step    10/100") == 0);
    CHECK(line.find("loss 2.3456") != std::string::npos);
    CHECK(line.find("lr 1.00e-03") != std::string::npos);
    CHECK(line.find("ETA") != std::string::npos);
}
