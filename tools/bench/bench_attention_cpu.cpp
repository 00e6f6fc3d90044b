// Times one attention problem on the CPU with one of the library's versions, the side of
// tools/bench/attention_cpu_bench.py that is ours. Prints one JSON object: the median ms of
// the timed repetitions and the peak memory the pass added (resident set, from the kernel's
// high-water mark, reset after the inputs are made).
//
//   bench_attention_cpu --impl tiled --T 1024 --hs 64 --heads 4 --causal 1 --pass forward
//   bench_attention_cpu --sgemm 64x128x64   the single-thread rate of sgemm C = A·Bᵀ with
//                                          (M, K) A, (N, K) B, as for S = Q·Kᵀ
#include "attn/flash.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

using namespace attn;

namespace {

struct Options {
    std::string impl = "tiled";     // tiled (attention_fast_*), plain, flash (the scalar tiled)
    std::string pass = "forward";   // forward or backward (forward + backward)
    AttentionShape shape{1, 4, 1024, 64, true};
    int threads = 1;
    int reps = 5;
    int warmup = 1;
    int M = 0, N = 0, K = 0;  // --sgemm MxNxK: time sgemm of this size instead
};

long parse_long(const std::string& flag, const char* text) {
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (end == text || *end != '\0' || value < 0) {
        throw std::invalid_argument(flag + " expects a whole number, got '" + text + "'");
    }
    return value;
}

Options parse(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--help" || flag == "-h") {
            std::printf("usage: bench_attention_cpu [--impl tiled|plain|flash] "
                        "[--pass forward|backward]\n"
                        "       [--B N] [--heads N] [--T N] [--hs N] [--causal 0|1] [--threads N]\n"
                        "       [--reps N] [--warmup N] | --sgemm MxNxK\n");
            std::exit(0);
        }
        if (i + 1 >= argc) throw std::invalid_argument(flag + " expects a value");
        const char* value = argv[++i];
        if (flag == "--impl") o.impl = value;
        else if (flag == "--pass") o.pass = value;
        else if (flag == "--B") o.shape.B = static_cast<std::size_t>(parse_long(flag, value));
        else if (flag == "--heads") o.shape.NH = static_cast<std::size_t>(parse_long(flag, value));
        else if (flag == "--T") o.shape.T = static_cast<std::size_t>(parse_long(flag, value));
        else if (flag == "--hs") o.shape.hs = static_cast<std::size_t>(parse_long(flag, value));
        else if (flag == "--causal") o.shape.causal = parse_long(flag, value) != 0;
        else if (flag == "--threads") o.threads = static_cast<int>(parse_long(flag, value));
        else if (flag == "--reps") o.reps = static_cast<int>(parse_long(flag, value));
        else if (flag == "--warmup") o.warmup = static_cast<int>(parse_long(flag, value));
        else if (flag == "--sgemm") {
            if (std::sscanf(value, "%dx%dx%d", &o.M, &o.N, &o.K) != 3 || o.M < 1 || o.N < 1 ||
                o.K < 1)
                throw std::invalid_argument("--sgemm expects MxNxK, got '" + std::string(value) + "'");
        }
        else throw std::invalid_argument("unknown option " + flag + " (see --help)");
    }
    if (o.impl != "tiled" && o.impl != "plain" && o.impl != "flash")
        throw std::invalid_argument("--impl must be tiled, plain or flash, got " + o.impl);
    if (o.pass != "forward" && o.pass != "backward")
        throw std::invalid_argument("--pass must be forward or backward, got " + o.pass);
    if (o.reps < 1) throw std::invalid_argument("--reps must be at least 1");
    check_attention_shape(o.shape);
    return o;
}

// The kernel's resident-set figures for this process, in KiB: "VmHWM" (peak) or "VmRSS".
long status_kib(const std::string& field) {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind(field + ":", 0) == 0) {
            return std::strtol(line.c_str() + field.size() + 1, nullptr, 10);
        }
    }
    return -1;
}

// Resets the peak to the current resident set (Linux 4.0 and later; ignored elsewhere).
void reset_peak() { std::ofstream("/proc/self/clear_refs") << "5"; }

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// The CPU time of this process (all its threads) in ms: on a machine shared with other
// work, a better measure of a single thread's cost than the wall clock.
double cpu_ms() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

// Wall-clock ms of each repetition; the CPU ms of each in `cpu` when given.
std::vector<double> time_runs(const std::function<void()>& run, int warmup, int reps,
                              std::vector<double>* cpu = nullptr) {
    for (int i = 0; i < warmup; ++i) run();
    std::vector<double> ms;
    for (int i = 0; i < reps; ++i) {
        const double c0 = cpu_ms();
        const auto t0 = std::chrono::steady_clock::now();
        run();
        ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                         .count());
        if (cpu) cpu->push_back(cpu_ms() - c0);
    }
    return ms;
}

int time_sgemm(const Options& o) {
    // C (M, N) = A (M, K) · Bᵀ, B (N, K): the rate the tile products are compared with.
    const std::size_t m = static_cast<std::size_t>(o.M), n = static_cast<std::size_t>(o.N),
                      k = static_cast<std::size_t>(o.K);
    Rng rng(1);
    std::vector<float> a(m * k), b(n * k), c(m * n);
    for (auto& x : a) x = rng.normal();
    for (auto& x : b) x = rng.normal();
    const double flops = 2.0 * static_cast<double>(m * n * k);
    const int calls = std::max(1, static_cast<int>(2e8 / flops));  // ~0.2 GFLOP per repetition
    std::vector<double> cpu;  // one thread: its CPU time, less disturbed by other work
    time_runs(
        [&] {
            for (int i = 0; i < calls; ++i) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, o.M, o.N, o.K, 1.0f, a.data(),
                            o.K, b.data(), o.K, 0.0f, c.data(), o.N);
            }
        },
        o.warmup, o.reps, &cpu);
    std::printf("{\"sgemm\": \"%dx%dx%d\", \"threads\": %d, \"gflops\": %.2f}\n", o.M, o.N,
                o.K, o.threads, flops * calls / (median(cpu) * 1e6));
    return 0;
}

int run(const Options& o) {
    set_num_threads(o.threads);
    if (o.M > 0) return time_sgemm(o);
    const AttentionShape& s = o.shape;
    const std::size_t n = s.qkv_size();
    Rng rng(7);
    std::vector<float> q(n), k(n), v(n), dout(n), out(n), lse(s.rows());
    std::vector<float> dq(n), dk(n), dv(n);
    for (auto* x : {&q, &k, &v, &dout}) {
        for (auto& e : *x) e = rng.normal();
    }
    const bool backward = o.pass == "backward";
    const auto forward = [&] {
        if (o.impl == "tiled") {
            attention_fast_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
        } else if (o.impl == "flash") {
            attention_flash_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
        } else {
            attention_plain_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
        }
    };
    const auto step = [&] {
        forward();
        if (!backward) return;
        if (o.impl == "tiled") {
            attention_fast_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                                    v.data(), out.data(), lse.data(), s);
        } else if (o.impl == "flash") {
            attention_flash_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                     k.data(), v.data(), out.data(), lse.data(), s);
        } else {
            attention_plain_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                     k.data(), v.data(), s);
        }
    };
    const long base_kib = status_kib("VmRSS");
    reset_peak();
    std::vector<double> cpu;
    const auto ms = time_runs(step, o.warmup, o.reps, &cpu);
    const long peak_kib = status_kib("VmHWM");
    std::printf("{\"impl\": \"%s\", \"pass\": \"%s\", \"B\": %zu, \"heads\": %zu, \"T\": %zu, "
                "\"hs\": %zu, \"causal\": %d, \"threads\": %d, \"ms\": %.3f, \"ms_min\": %.3f, "
                "\"cpu_ms\": %.3f, "
                "\"peak_extra_mib\": %.2f}\n",
                o.impl.c_str(), o.pass.c_str(), s.B, s.NH, s.T, s.hs, s.causal ? 1 : 0, o.threads,
                median(ms), *std::min_element(ms.begin(), ms.end()), median(cpu),
                base_kib < 0 || peak_kib < 0 ? -1.0 : static_cast<double>(peak_kib - base_kib) / 1024);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        return run(parse(argc, argv));
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bench_attention_cpu: %s\n", e.what());
        return 1;
    }
}
