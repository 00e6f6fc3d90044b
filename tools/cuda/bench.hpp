// What the two attention workbenches (attention_bench.cpp, half_attention_bench.cpp) share:
// their command line, shapes and inputs, CUDA error checks and the timing loop.
#pragma once

#include "attn/flash.hpp"
#include "attn/random.hpp"

#include <cuda_runtime.h>

#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace attn::bench {

inline void check(cudaError_t err, const char* what) {
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
}

struct Options {
    std::vector<std::size_t> Ts;
    std::size_t hs = 64;
    int repeats = 20;
    int warmup = 3;
    bool validate = true;
};

// `[T ...] [--hs 64|128] [--repeats N]`, and `--no-validate` where `can_skip_validation`;
// T = 256 512 1024 2048 4096 when none is given.
inline Options parse(int argc, char** argv, const char* program, bool can_skip_validation) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        if (a == "--hs" && i + 1 < argc) o.hs = std::strtoul(argv[++i], nullptr, 10);
        else if (a == "--repeats" && i + 1 < argc) o.repeats = std::atoi(argv[++i]);
        else if (can_skip_validation && a == "--no-validate") o.validate = false;
        else if (a == "--help" || a == "-h") {
            std::printf("usage: %s [T ...] [--hs 64|128] [--repeats N]%s\n", program,
                        can_skip_validation ? " [--no-validate]" : "");
            std::exit(0);
        } else {
            const unsigned long t = std::strtoul(a.c_str(), nullptr, 10);
            if (t == 0) throw std::invalid_argument("unknown argument " + a);
            o.Ts.push_back(t);
        }
    }
    if (o.Ts.empty()) o.Ts = {256, 512, 1024, 2048, 4096};
    if (o.repeats < 1) throw std::invalid_argument("--repeats must be at least 1");
    return o;
}

// The shape at sequence length T, as FlashAttention-2's benchmark: B·T = 16384 tokens,
// NH = 2048 / hs heads, causal.
inline AttentionShape shape(std::size_t T, std::size_t hs) {
    return AttentionShape{std::max<std::size_t>(1, 16384 / T), 2048 / hs, T, hs, true};
}

// n draws of `rng`'s standard normal.
inline std::vector<float> normals(Rng& rng, std::size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = rng.normal();
    return x;
}

// Milliseconds per call of `run`, from CUDA events around `repeats` calls after warm-up.
inline double time_kernel(const std::function<void()>& run, const Options& o) {
    for (int i = 0; i < o.warmup; ++i) run();
    cudaEvent_t start, stop;
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    check(cudaEventRecord(start), "cudaEventRecord");
    for (int i = 0; i < o.repeats; ++i) run();
    check(cudaEventRecord(stop), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    check(cudaEventDestroy(start), "cudaEventDestroy");
    check(cudaEventDestroy(stop), "cudaEventDestroy");
    return static_cast<double>(ms) / o.repeats;
}

}  // namespace attn::bench
