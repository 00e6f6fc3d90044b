// Times the GPU model's whole training step (forward, backward, clipping, AdamW) on one
// fixed batch, as tools/bench/gpu_race.py times PyTorch's: the same model, config and
// batch, the same FLOP count. Prints one line the race script reads:
//   ours: <ms> ms/iter, <tokens/s> tokens/s, MFU <percent>%
// Usage: gpu_train_bench [--batch 64] [--block 256] [--layers 6] [--heads 6] [--embd 384]
//                        [--vocab 65] [--dropout 0.2] [--steps 50] [--warmup 10] [--tf32]
//                        [--attention materialised|fused] [--peak-tflops 989.5]
#include "attn/cuda/device.hpp"
#include "attn/cuda/gpt.hpp"
#include "attn/gpt.hpp"
#include "attn/random.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

int main(int argc, char** argv) {
    std::string why;
    if (!attn::cuda::device_available(&why)) {
        std::printf("skipped: the training benchmark needs a CUDA device (%s)\n", why.c_str());
        return 1;
    }
    try {
        attn::GPTConfig cfg;  // the recipe's sizes: 6 layers, 6 heads, 384 channels, block 256
        cfg.dropout = 0.2f;
        int B = 64, steps = 50, warmup = 10;
        bool tf32 = false;
        bool fused = false;
        double peak_tflops = 989.5;  // H100 SXM dense bf16; the H200 is the same chip
        for (int i = 1; i < argc; ++i) {
            const std::string a = argv[i];
            auto value = [&]() -> const char* {
                if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
                return argv[++i];
            };
            if (a == "--batch") B = std::atoi(value());
            else if (a == "--block") cfg.block_size = std::atoi(value());
            else if (a == "--layers") cfg.n_layer = std::atoi(value());
            else if (a == "--heads") cfg.n_head = std::atoi(value());
            else if (a == "--embd") cfg.n_embd = std::atoi(value());
            else if (a == "--vocab") cfg.vocab_size = std::atoi(value());
            else if (a == "--dropout") cfg.dropout = std::strtof(value(), nullptr);
            else if (a == "--steps") steps = std::atoi(value());
            else if (a == "--warmup") warmup = std::atoi(value());
            else if (a == "--peak-tflops") peak_tflops = std::strtod(value(), nullptr);
            else if (a == "--tf32") tf32 = true;
            else if (a == "--attention") {
                const std::string kind = value();
                if (kind != "materialised" && kind != "fused")
                    throw std::invalid_argument("--attention: materialised or fused, got " + kind);
                fused = kind == "fused";
            }
            else throw std::invalid_argument("unknown option " + a);
        }
        if (B <= 0 || steps <= 0 || warmup < 0) throw std::invalid_argument("bad sizes");
        const int T = cfg.block_size;
        attn::GPT cpu(cfg, 1337);
        attn::cuda::CudaOptions options;
        options.tf32 = tf32;
        if (fused) options.attention = attn::cuda::AttentionKind::fused;
        attn::cuda::CudaGPT gpu(cpu, options);
        attn::AdamW opt;  // the recipe's β = (0.9, 0.99), weight decay 0.1
        attn::Rng rng(42);
        std::vector<int> x(static_cast<std::size_t>(B) * T), y(x.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
            x[i] = static_cast<int>(rng.uniform() * static_cast<float>(cfg.vocab_size)) % cfg.vocab_size;
            y[i] = static_cast<int>(rng.uniform() * static_cast<float>(cfg.vocab_size)) % cfg.vocab_size;
        }
        auto step = [&] {
            gpu.forward_async(x.data(), y.data(), B, T);
            gpu.zero_grad();
            gpu.backward();
            gpu.clip_grad_norm_async(1.0f);
            gpu.adamw_step(opt, 1e-3f);
        };
        for (int i = 0; i < warmup; ++i) step();
        gpu.synchronize();
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < steps; ++i) step();
        const float loss = gpu.loss();  // the only wait: after the last step
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

        // nanoGPT's estimate_mfu: 6·N per token for the matmuls' forward and backward, N
        // without the position embedding, plus 12·L·NH·hs·T per token for attention.
        const double N = static_cast<double>(cfg.num_parameters()) -
                         static_cast<double>(cfg.block_size) * cfg.n_embd;
        const double flops_per_token =
            6.0 * N + 12.0 * cfg.n_layer * cfg.n_head * (cfg.n_embd / cfg.n_head) * T;
        const double ms = seconds / steps * 1e3;
        const double tokens_per_s = static_cast<double>(B) * T * steps / seconds;
        const double mfu = flops_per_token * tokens_per_s / (peak_tflops * 1e12);
        std::printf("%s\nconfig: B=%d T=%d L=%d NH=%d C=%d V=%d dropout=%.2f %s, %s attention, "
                    "loss after %d steps %.4f\n",
                    attn::cuda::device_summary().c_str(), B, T, cfg.n_layer, cfg.n_head,
                    cfg.n_embd, cfg.vocab_size, static_cast<double>(cfg.dropout),
                    tf32 ? "TF32" : "fp32", fused ? "fused" : "materialised", warmup + steps,
                    static_cast<double>(loss));
        std::printf("ours: %.2f ms/iter, %.0f tokens/s, MFU %.2f%%\n", ms, tokens_per_s, 100.0 * mfu);
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
