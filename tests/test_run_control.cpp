#include "attn/run_control.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <csignal>
#include <fstream>

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
