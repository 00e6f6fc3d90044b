// Times the raw CPU training step of the GPT: forward, backward, gradient clipping and
// AdamW on one fixed batch, the step that tools/bench/cpu_train_bench.py times in PyTorch.
// Prints one JSON object, so that the script (or a person) can read the numbers back.
//
//   bench_train_cpu --threads 2 --steps 50 --warmup 5
//                   --n_layer 4 --n_head 4 --n_embd 128 --block_size 64 --batch_size 12
#include "attn/gpt.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

struct Options {
    attn::GPTConfig config;
    int batch_size = 12;
    int threads = 0;  // 0: the library's policy (OMP_NUM_THREADS, else the CPUs)
    bool threads_info = false;
    int steps = 50;
    int warmup = 5;
    std::uint64_t seed = 1337;
    bool fused = false;  // the fused attention (GPT::set_attention)
};

int parse_int(const std::string& flag, const char* text) {
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (end == text || *end != '\0') {
        throw std::invalid_argument(flag + " expects an integer, got '" + text + "'");
    }
    return static_cast<int>(value);
}

Options parse(int argc, char** argv) {
    Options o;
    // nanoGPT's train_shakespeare_char CPU recipe
    o.config.n_layer = 4;
    o.config.n_head = 4;
    o.config.n_embd = 128;
    o.config.block_size = 64;
    o.config.vocab_size = 65;
    o.config.dropout = 0.0f;
    o.config.bias = true;
    for (int i = 1; i < argc; ++i) {
        const std::string flag = argv[i];
        if (flag == "--threads-info") {
            o.threads_info = true;
            continue;
        }
        if (flag == "--help" || flag == "-h") {
            std::printf(
                "usage: bench_train_cpu [--threads N] [--threads-info] [--steps N] [--warmup N] [--n_layer N]\n"
                "       [--n_head N] [--n_embd N] [--block_size N] [--batch_size N]\n"
                "       [--vocab_size N] [--bias 0|1] [--seed N] [--fused 0|1]\n");
            std::exit(0);
        }
        if (i + 1 >= argc) throw std::invalid_argument(flag + " expects a value");
        const int v = parse_int(flag, argv[++i]);
        if (flag == "--threads") o.threads = v;
        else if (flag == "--steps") o.steps = v;
        else if (flag == "--warmup") o.warmup = v;
        else if (flag == "--n_layer") o.config.n_layer = v;
        else if (flag == "--n_head") o.config.n_head = v;
        else if (flag == "--n_embd") o.config.n_embd = v;
        else if (flag == "--block_size") o.config.block_size = v;
        else if (flag == "--batch_size") o.batch_size = v;
        else if (flag == "--vocab_size") o.config.vocab_size = v;
        else if (flag == "--bias") o.config.bias = v != 0;
        else if (flag == "--seed") o.seed = static_cast<std::uint64_t>(v);
        else if (flag == "--fused") o.fused = v != 0;
        else throw std::invalid_argument("unknown option " + flag + " (see --help)");
    }
    if (o.threads < 0 || o.steps < 1 || o.warmup < 0 || o.batch_size < 1) {
        throw std::invalid_argument(
            "--steps and --batch_size must be positive, --threads at least 0 (0: the default)");
    }
    return o;
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) try {
    const Options o = parse(argc, argv);
    if (o.threads > 0) attn::set_num_threads(o.threads, "--threads");
    if (o.threads_info) {
        std::printf("%s\n", attn::describe_threads().c_str());
        return 0;
    }

    attn::GPT model(o.config, o.seed);
    if (o.fused) model.set_attention(attn::AttentionKind::fused);
    attn::AdamW optimizer;  // nanoGPT's betas (0.9, 0.99) and weight decay 0.1
    const float lr = 1e-3f;

    // One fixed batch of random ids: the step's cost does not depend on which ids they are.
    const int B = o.batch_size, T = o.config.block_size, V = o.config.vocab_size;
    attn::Rng rng(o.seed);
    std::vector<int> x(static_cast<std::size_t>(B) * T), y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<int>(rng.below(static_cast<std::uint64_t>(V)));
        y[i] = static_cast<int>(rng.below(static_cast<std::uint64_t>(V)));
    }

    // Each phase timed on its own as well as the whole step, to show where the time goes.
    std::vector<double> step_ms, forward_ms, backward_ms, clip_ms, adamw_ms;
    float loss = 0.0f;
    for (int s = 0; s < o.warmup + o.steps; ++s) {
        const Clock::time_point t0 = Clock::now();
        loss = model.forward(x, y, B, T);
        const double f = ms_since(t0);
        Clock::time_point t = Clock::now();
        model.zero_grad();
        model.backward();
        const double b = ms_since(t);
        t = Clock::now();
        attn::clip_grad_norm(model, 1.0f);
        const double c = ms_since(t);
        t = Clock::now();
        optimizer.step(model, lr);
        const double a = ms_since(t);
        const double total = ms_since(t0);
        if (s < o.warmup) continue;
        step_ms.push_back(total);
        forward_ms.push_back(f);
        backward_ms.push_back(b);
        clip_ms.push_back(c);
        adamw_ms.push_back(a);
    }

    const double ms = median(step_ms);
    const double tokens_per_s = static_cast<double>(B) * T / (ms / 1000.0);
    std::printf(
        "{\"impl\": \"attn\", \"attention\": \"%s\", \"threads\": %d, \"blas_threads\": %d,"
        " \"steps\": %d, \"warmup\": %d,"
        " \"n_layer\": %d, \"n_head\": %d, \"n_embd\": %d, \"block_size\": %d,"
        " \"batch_size\": %d, \"vocab_size\": %d, \"bias\": %s,"
        " \"ms_per_step\": %.3f, \"ms_min\": %.3f, \"tokens_per_s\": %.1f,"
        " \"forward_ms\": %.3f, \"backward_ms\": %.3f, \"clip_ms\": %.3f, \"adamw_ms\": %.3f,"
        " \"last_loss\": %.6f}\n",
        o.fused ? "fused" : "materialised", attn::num_threads(), attn::thread_config().blas_threads,
        o.steps, o.warmup, o.config.n_layer, o.config.n_head, o.config.n_embd,
        o.config.block_size, B, V, o.config.bias ? "true" : "false", ms,
        *std::min_element(step_ms.begin(), step_ms.end()), tokens_per_s, median(forward_ms),
        median(backward_ms), median(clip_ms), median(adamw_ms), static_cast<double>(loss));
    return 0;
} catch (const std::exception& e) {
    std::fprintf(stderr, "bench_train_cpu: %s\n", e.what());
    return 1;
}
