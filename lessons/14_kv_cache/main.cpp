// Lesson 14: generation with a KV cache. The page that narrates this program is lesson.md
// beside it.
//
// It trains a tiny model for 400 steps (to have text worth reading), checks that the
// cached and the uncached sampling loops write the same text, then times both on a
// random-initialised model with a block of 1024 tokens. Timings are printed, never checked.
// Timed: this program prints measured times, so CTest runs it with nothing beside it (RUN_SERIAL).
#include "attn/data.hpp"
#include "attn/kv_cache.hpp"
#include "attn/lesson.hpp"
#include "attn/plot.hpp"
#include "attn/print.hpp"
#include "attn/threads.hpp"
#include "attn/trainer.hpp"

#ifdef ATTN_HAVE_CUDA
#include "attn/cuda/device.hpp"
#include "attn/cuda/generate.hpp"
#include "attn/cuda/gpt.hpp"
#endif

#include <cblas.h>  // openblas_set_num_threads

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>

using namespace attn;
namespace fs = std::filesystem;

namespace {

// Wall-clock seconds of one call.
template <class F>
double seconds(F&& f) {
    const auto start = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

const char* yes_no(bool b) { return b ? "yes" : "NO"; }

// The same race on the GPU, when there is one: the uncached path (a whole forward pass per
// token) against the device's key/value cache, both on the same copy of the model.
void measure_on_gpu(const GPT& model, const CharVocab& vocab) {
#ifdef ATTN_HAVE_CUDA
    std::string why;
    if (!cuda::device_available(&why)) {
        std::printf("On the GPU: no usable CUDA device here (%s).\n", why.c_str());
        return;
    }
    cuda::CudaGPT gpu(model);
#if ATTN_CUDA_SIMULATED
    // Built without a GPU: the device's cache runs in the CUDA simulator, which checks the
    // text but whose times say nothing about a GPU.
    SampleOptions short_run;
    short_run.max_new_tokens = 80;
    short_run.top_k = 10;
    const bool same = cuda::generate_text(gpu, vocab, "", short_run, false) ==
                      cuda::generate_text(gpu, vocab, "", short_run, true);
    std::printf("On the GPU, 80 tokens, top-k 10: uncached and cached give the same text: %s"
                "  [simulated on the CPU: results checked, no timing]\n",
                yes_no(same));
    return;
#endif
    std::printf("On the GPU (%s), top-k 10\n", cuda::device_summary().c_str());
    std::printf("%8s %12s %12s %10s %10s\n", "tokens", "uncached", "cached", "speed-up", "same text");
    //! [measure_gpu]
    for (int n : {256, 1024}) {
        SampleOptions o;
        o.max_new_tokens = n;
        o.top_k = 10;
        std::string slow, fast;
        (void)cuda::generate_text(gpu, vocab, "", SampleOptions{8, 1.0f, 10, 1}, true);  // warm-up
        const double t_uncached = seconds([&] { slow = cuda::generate_text(gpu, vocab, "", o, false); });
        const double t_cached = seconds([&] { fast = cuda::generate_text(gpu, vocab, "", o, true); });
        std::printf("%8d %10.3f s %10.3f s %9.1fx %10s\n", n, t_uncached, t_cached,
                    t_uncached / t_cached, yes_no(slow == fast));
    }
    //! [measure_gpu]
#else
    (void)model;
    (void)vocab;
    std::printf("On the GPU: this build has no CUDA (nvcc was not found when it was configured).\n");
#endif
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 14: generation with a KV cache", [](const LessonOptions& opts) {
        print_heading("A small model to generate with");
        const fs::path corpus = opts.corpus();  // tiny shakespeare, or --data FILE
        const TextDataset data = make_dataset(read_corpus(corpus));
        //! [train]
        TrainConfig recipe = TrainConfig::named("tiny");  // 2 layers, 2 heads, 32 channels
        recipe.block_size = 64;
        recipe.shorten_to(400);                            // enough for text like the corpus's
        if (opts.quick) recipe.make_quick();
        Trainer trainer(recipe, data);
        const double train_seconds = seconds([&] {
            while (!trainer.done()) trainer.train_step();
        });
        GPT& model = trainer.model();
        //! [train]
        std::printf("%s: vocabulary of %zu; model: %d layers, %d heads, %d channels, block %d\n",
                    corpus.filename().c_str(), data.vocab.size(), recipe.n_layer, recipe.n_head,
                    recipe.n_embd, recipe.block_size);
        std::printf("after %lld steps (%.1f s here): val loss %.3f (ln %zu = %.3f at the start)\n",
                    static_cast<long long>(trainer.step()), train_seconds, trainer.evaluate().val_loss,
                    data.vocab.size(), std::log(static_cast<double>(data.vocab.size())));
        print_claim("train_steps", std::to_string(trainer.step()));
        print_claim("train_seconds", train_seconds, 1);

        print_heading("The same text from both paths");
        //! [same_text]
        SampleOptions options;
        options.max_new_tokens = 200;  // past the block of 64: the context is cropped
        options.temperature = 0.8f;
        options.top_k = 10;
        const std::string uncached = generate_text(model, data.vocab, "", options);
        const std::string cached = generate_cached(model, data.vocab, "", options);
        //! [same_text]
        std::cout << "uncached (generate_text), top-k 10, temperature 0.8:\n" << uncached << "\n\n"
                  << "cached (generate_cached), same seed:\n" << cached << "\n\n";
        std::printf("identical: %s\n", yes_no(cached == uncached));
        options.top_k = 1;
        const std::string prompt = fitting_prompt(data.vocab, "The ", data.val);
        const bool greedy_same = generate_cached(model, data.vocab, prompt, options) ==
                                 generate_text(model, data.vocab, prompt, options);
        std::printf("greedy (top-k 1) from \"%s\", 200 tokens: identical: %s\n", prompt.c_str(),
                    yes_no(greedy_same));

        print_heading("Cached logits against the full forward pass");
        //! [logits]
        std::vector<int> ids = data.vocab.encode(cached);  // 200 characters
        ids.resize(64);
        model.forward(ids.data(), nullptr, 1, 64);  // the uncached pass: (1, 64, V) logits
        KVCache cache(model.config());
        DecodeScratch scratch;
        float worst = 0.0f, largest = 0.0f;
        for (int pos = 0; pos < 64; ++pos) {
            const std::vector<float>& row = forward_cached(scratch, model, cache, ids[pos], pos);
            for (std::size_t i = 0; i < row.size(); ++i) {
                const float full = model.logits()[static_cast<std::size_t>(pos) * row.size() + i];
                worst = std::max(worst, std::fabs(row[i] - full));
                largest = std::max(largest, std::fabs(full));
            }
        }
        //! [logits]
        std::printf("64 positions: largest |cached - uncached| logit %.2e, largest |logit| %.2f\n",
                    static_cast<double>(worst), static_cast<double>(largest));
        char worst_text[16];
        std::snprintf(worst_text, sizeof worst_text, "%.1e", static_cast<double>(worst));
        print_claim("logit_difference", worst_text);
        print_claim("logit_largest", largest, 1);

        print_heading("The work per token");
        //! [timing_model]
        GPTConfig big;  // random weights: the time per token does not depend on their values
        big.vocab_size = static_cast<int>(data.vocab.size());
        big.block_size = 1024;
        big.n_layer = 2;
        big.n_head = 2;
        big.n_embd = 64;
        big.bias = false;
        GPT timing_model(big, 1337);
        //! [timing_model]
        std::printf("timing model: %d layers, %d heads, %d channels, block %d, V %d, %zu parameters\n",
                    big.n_layer, big.n_head, big.n_embd, big.block_size, big.vocab_size,
                    big.num_parameters());
        std::printf("%10s %22s %20s %8s\n", "context T", "uncached FLOP/token", "cached FLOP/token",
                    "ratio");
        for (int T : {1, 64, 256, 1024}) {
            std::printf("%10d %22.3e %20.3e %7.0fx\n", T, uncached_step_flops(big, T),
                        cached_step_flops(big, T), uncached_step_flops(big, T) / cached_step_flops(big, T));
        }

        print_heading("Prefill against decode: FLOPs per byte of memory read");
        {
            //! [intensity]
            // This course's GPT at Llama 2 7B's widths (L 32, C 4096, V 32000), 16-bit numbers:
            // the weights are read once per forward pass whatever its number of rows.
            GPTConfig served;
            served.n_layer = 32;
            served.n_embd = 4096;
            served.vocab_size = 32000;
            const double L = 32, C = 4096, V = 32000, T = 1024, bytes = 2;
            const double weight_bytes = bytes * (12 * L * C * C + C * V);
            const double cache_bytes = bytes * 2 * L * T * C;  // the keys and values of T positions
            // decode: one new token over a cache of T positions; reads every weight and the cache
            const double decode = cached_step_flops(served, static_cast<int>(T)) / (weight_bytes + cache_bytes);
            // prefill: the T positions of a prompt in one pass; reads the weights, writes the cache
            const double prefill = uncached_step_flops(served, static_cast<int>(T)) / (weight_bytes + cache_bytes);
            // an H100 SXM: 989.4 TFLOP/s on 16-bit tensor cores, 3.35 TB/s of memory
            const double balance = 989.4e12 / 3.35e12;
            //! [intensity]
            std::printf("decode, 1 token at context %.0f:  %8.1f FLOP per byte\n", T, decode);
            std::printf("prefill, a prompt of %.0f tokens:  %8.1f FLOP per byte\n", T, prefill);
            std::printf("H100 SXM, 16-bit: %.1f FLOP per byte to keep its tensor cores busy\n", balance);
            print_claim("intensity_decode", decode, 1);
            print_claim("intensity_prefill", prefill, 0);
            print_claim("intensity_balance", balance, 0);
        }

        print_heading("Measured on the CPU");
        // One thread for every path: the comparison is then about the work per token, not
        // about how many cores happen to be free (the docs build runs lessons side by side).
        set_num_threads(1, "lesson 14: one core for the timings");
        openblas_set_num_threads(1);
        std::printf("every path on one core (one thread, OpenBLAS too), top-k 10; \"fused\": the\n"
                    "uncached path with lesson 13's tiled attention (GPT::set_attention)\n");
        std::printf("%8s %12s %12s %12s %10s %10s\n", "tokens", "uncached", "fused", "cached",
                    "speed-up", "same text");
        //! [measure]
        const int longest = opts.quick ? 128 : 1024;  // tokens in the longest run (--quick: 128)
        std::vector<int> generated;  // that run's text, replayed below position by position
        for (int n : {longest / 4, longest}) {
            SampleOptions o;
            o.max_new_tokens = n;  // from a one-token prompt: the context never exceeds 1024
            o.top_k = 10;
            std::string slow, tiled, fast;
            const double t_uncached = seconds([&] { slow = generate_text(timing_model, data.vocab, "", o); });
            timing_model.set_attention(AttentionKind::fused);
            const double t_fused = seconds([&] { tiled = generate_text(timing_model, data.vocab, "", o); });
            timing_model.set_attention(AttentionKind::materialised);
            const double t_cached = seconds([&] { fast = generate_cached(timing_model, data.vocab, "", o); });
            std::printf("%8d %10.3f s %10.3f s %10.3f s %9.1fx %10s\n", n, t_uncached, t_fused,
                        t_cached, t_uncached / t_cached, yes_no(slow == fast && slow == tiled));
            if (n == longest) generated = data.vocab.encode(fast);
            if (n == longest) print_claim("uncached_longest_seconds", t_uncached, 1);
        }
        //! [measure]
        measure_on_gpu(timing_model, data.vocab);

        print_heading("Milliseconds per token, position by position");
        // Every cached step is timed; uncached steps (one forward pass over the context) at the
        // middle of every bin of 32 positions, the cached ones averaged over the bin.
        const int bin = 32;
        PlotSeries slow_line{"uncached (forward over the whole context)", {}, {}};
        PlotSeries fast_line{"cached (one row of attention)", {}, {}};
        KVCache timing_cache(big);
        DecodeScratch timing_scratch;
        std::vector<double> cached_ms(static_cast<std::size_t>(longest));
        for (int pos = 0; pos < longest; ++pos) {
            cached_ms[pos] = 1e3 * seconds([&] {
                forward_cached(timing_scratch, timing_model, timing_cache, generated[pos], pos);
            });
        }
        std::printf("%10s %14s %14s\n", "position", "uncached ms", "cached ms");
        for (int start = 0; start < longest; start += bin) {
            const int mid = start + bin / 2;
            const double slow_ms = 1e3 * seconds([&] { timing_model.forward(generated.data(), nullptr, 1, mid + 1); });
            double fast_sum = 0.0;
            for (int pos = start; pos < start + bin; ++pos) fast_sum += cached_ms[pos];
            slow_line.x.push_back(mid);
            slow_line.y.push_back(slow_ms);
            fast_line.x.push_back(mid);
            fast_line.y.push_back(fast_sum / bin);
            if (start % 256 == 0 || start + bin >= longest) {
                std::printf("%10d %14.3f %14.4f\n", mid, slow_ms, fast_sum / bin);
            }
        }
        if (!opts.figures.empty()) {
            line_plot_png(opts.figures / "lesson14_ms_per_token.png", {slow_line, fast_line},
                          "Time per generated token (2 layers, 64 channels, CPU)",
                          "position of the new token", "ms per token");
            line_plot_png(opts.figures / "lesson14_cached_ms_per_token.png", {fast_line},
                          "The cached path alone", "position of the new token", "ms per token");
            std::printf("charts: lesson14_ms_per_token.png, lesson14_cached_ms_per_token.png\n");
        }
    }, LessonText::corpus);
}
