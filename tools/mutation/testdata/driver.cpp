// Calls every function of sample.cpp on inputs that tell its mutants apart, and prints what
// each returns or throws, one line a call, so that two builds can be compared as text.
#include "sample.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <limits>

using namespace exercise;

template <class F>
void show(const char* what, F&& f) {
    try {
        std::printf("%s: %s\n", what, f().c_str());
    } catch (const std::exception& e) {
        std::printf("%s: threw %s\n", what, e.what());
    }
}

static std::string num(double x) {
    char b[64];
    std::snprintf(b, sizeof b, "%.17g", x);
    return b;
}

int main() {
    std::setvbuf(stdout, nullptr, _IONBF, 0);  // a crash loses no line
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (float bound : {1.0f, 0.0f, -1.0f, nan, 2e30f, 1e30f})
        show("mean bound", [&] { return num(mean_checked({0.5f, 0.25f, 1.0f}, bound)); });
    show("mean empty", [&] { return num(mean_checked({}, 1.0f)); });
    show("mean big", [&] { return num(mean_checked({1e8f, 1.0f, -1e8f, 3.0f}, 1e9f)); });
    show("mean tiny", [&] { return num(mean_checked({16777216.0f, 1.0f, 1.0f}, 1e9f)); });
    show("mean edge", [&] { return num(mean_checked({-1.0f, 1.0f}, 1.0f)); });
    show("mean below", [&] { return num(mean_checked({-2.0f, 0.5f}, 1.0f)); });
    show("mean above", [&] { return num(mean_checked({2.0f, 0.5f}, 1.0f)); });
    show("mean nan", [&] { return num(mean_checked({nan}, 1.0f)); });
    for (bool causal : {false, true}) {
        show("softmax", [&] { return num(softmax_top({1.0f, 2.0f, 3.0f, 0.5f}, causal)); });
        show("softmax masked", [&] { return num(softmax_top({-inf, 2.0f, -inf, 1.0f}, causal)); });
        show("softmax all masked", [&] { return num(softmax_top({-inf, -inf}, causal)); });
        show("softmax large", [&] { return num(softmax_top({-2e9f, -3e9f, 1.0f}, causal)); });
        show("softmax zero", [&] { return num(softmax_top({0.0f, -inf, 2.0f, -1e31f}, causal)); });
    }
    for (std::size_t n : {std::size_t{10}, std::size_t{7}, std::size_t{7000000001ULL}})
        for (int ranks : {1, 2, 3})
            for (int rank : {-1, 0, 1, 2, 3})
                show("part", [&] {
                    const Range p = part_of(n, rank, ranks);
                    return num(double(p.begin)) + " " + num(double(p.end));
                });
    show("part none", [&] { const Range p = part_of(5, 0, 0); return num(double(p.begin)); });
    for (float a : {1.0f, -2.0f, 300.0f, 198.0f}) {
        show("axpy", [&] {
            std::vector<float> y = {1, 2, 3, 4};
            axpy(y, {0.5f, 0.25f, 2.0f, 3.0f}, a);
            return num(y[0]) + " " + num(y[1]) + " " + num(y[2]) + " " + num(y[3]);
        });
    }
    show("axpy sizes", [&] { std::vector<float> y = {1}; axpy(y, {1, 2}, 1); return num(y[0]); });
    for (int i : {-3, 0, 2, 4, 5, 9}) show("clamp", [&] { return num(clamp_index(i, 5)); });
    for (int r : {0, 1})
        for (int c : {0, 1, 2}) show("pick", [&] { return num(pick({1, 2, 3, 4, 5, 6}, 2, r, c)); });
    return 0;
}
