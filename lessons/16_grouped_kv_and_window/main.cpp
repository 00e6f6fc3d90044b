// Lesson 16: fewer keys and values, and a window. The page that narrates this program is
// lesson.md beside it.
//
// It trains the same small GPT (4 query heads) nine times: with G = 4, 2 and 1 key/value
// heads (multi-head, grouped-query, multi-query attention), each with attention over the
// whole context and with sliding windows of 32 and 16 positions. For each it reports the
// validation loss, the parameters, the KV cache's bytes per token and its size after 1024
// tokens, and the decode speed with the cache at 256 and 1024 tokens (a random-initialised
// copy with a block of 1024, lesson 14's method). `--full` runs nanoGPT's CPU recipe
// (4 layers, 128 channels, 2000 steps) instead of the short default, `--quick` a few steps
// and short generations; `--data FILE` trains on another text. Timings are printed, never
// checked.
// Timed: this program prints measured times, so CTest runs it with nothing beside it (RUN_SERIAL).
#include "attn/data.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/kv_cache.hpp"
#include "attn/lesson.hpp"
#include "attn/plot.hpp"
#include "attn/print.hpp"
#include "attn/run_control.hpp"
#include "attn/trainer.hpp"

#include <cblas.h>  // openblas_set_num_threads

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

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

// The mean loss over the first `n` next-token predictions of the validation split, in
// windows of T.
double loss_on_text(GPT& model, const std::vector<int>& val, int n, int T) {
    std::vector<int> x, y;  // (n/T, T) each; checked against the split's length
    consecutive_windows(val, static_cast<std::size_t>(n), static_cast<std::size_t>(T), x, y,
                        "the validation split");
    model.train(false);
    return model.forward(x, y, n / T, T);
}

std::string window_name(int W) { return W == 0 ? "full" : std::to_string(W); }

// One configuration's row of the table.
struct Row {
    std::size_t parameters = 0, bytes_per_token = 0, bytes_at_1024 = 0;
    double val_loss = 0.0, rate_short = 0.0, rate_long = 0.0, train_seconds = 0.0;
};

// The cache at the size of a served model: Llama 2's 7B and 70B configurations (Touvron et
// al. 2023, Table 1 and section 2.2: 70B uses grouped-query attention with 8 key/value
// heads), 16-bit numbers, a batch of sequences of the 4096-token context.
void cache_at_scale() {
    print_heading("The cache at real scale: Llama 2's sizes, 16-bit numbers");
    struct Model { const char* name; const char* key; double L, NH, G, hs, params; };
    const Model models[] = {
        {"Llama 2 7B  (L 32, 32 heads, G 32)", "llama7b", 32, 32, 32, 128, 7e9},
        {"Llama 2 70B (L 80, 64 heads, G 8)", "llama70b", 80, 64, 8, 128, 70e9},
        // no grouping: every layer's key and value projections grow from G = 8 to 64 heads
        // of hs outputs each, over C = 64·128 inputs
        {"70B with G = 64 (no grouping)", "llama70b_mha", 80, 64, 64, 128,
         70e9 + 80.0 * 2 * (64 - 8) * 128 * (64 * 128)},
    };
    const double T = 4096, batch = 16, bytes = 2, gib = 1024.0 * 1024 * 1024;
    // params: the nominal sizes the models are named by (7e9, 70e9), not their exact counts
    std::printf("%-36s %14s %18s %14s\n", "model", "KiB per token", "batch 16 x 4096", "weights");
    for (const Model& m : models) {
        //! [scale]
        const double per_token = 2 * m.L * m.G * m.hs * bytes;  // a key and a value per layer and kv head
        const double batch_bytes = per_token * T * batch;
        const double weights = m.params * bytes;
        //! [scale]
        std::printf("%-36s %14.0f %14.1f GiB %10.1f GiB\n", m.name, per_token / 1024, batch_bytes / gib,
                    weights / gib);
        print_claim(std::string(m.key) + "_kib_per_token", per_token / 1024, 0);
        print_claim(std::string(m.key) + "_batch_gib", batch_bytes / gib, 1);
        print_claim(std::string(m.key) + "_weights_gib", weights / gib, 1);
        print_claim(std::string(m.key) + "_params_billion", m.params / 1e9, 1);
    }

    // Beyond grouping: fewer bytes per number, or a smaller thing to cache.
    std::printf("\nsmaller caches:\n");
    //! [compressed]
    // 70B's grouped cache with each number in 8 bits (int8 or FP8) instead of 16
    const double int8_per_token = 2 * 80.0 * 8 * 128 * 1;
    // DeepSeek-V2's multi-head latent attention: 60 layers, 128 heads of 128; each layer caches
    // one latent vector of 512 numbers and one shared RoPE key of 64, from which every head's
    // keys and values are rebuilt, instead of 2 · 128 · 128 numbers
    const double mla_per_token = 60.0 * (512 + 64) * bytes;
    const double mla_mha_per_token = 2 * 60.0 * 128 * 128 * bytes;
    //! [compressed]
    std::printf("%-36s %14.1f %14.1f GiB\n", "70B, keys and values in 8 bits", int8_per_token / 1024,
                int8_per_token * T * batch / gib);
    std::printf("%-36s %14.1f %14.1f GiB\n", "DeepSeek-V2, latent (MLA)", mla_per_token / 1024,
                mla_per_token * T * batch / gib);
    std::printf("%-36s %14.1f %14.1f GiB\n", "the same heads, no latent", mla_mha_per_token / 1024,
                mla_mha_per_token * T * batch / gib);
    print_claim("llama70b_int8_kib_per_token", int8_per_token / 1024, 0);
    print_claim("llama70b_int8_batch_gib", int8_per_token * T * batch / gib, 1);
    print_claim("mla_kib_per_token", mla_per_token / 1024, 1);
    print_claim("mla_mha_kib_per_token", mla_mha_per_token / 1024, 0);
    print_claim("mla_factor", mla_mha_per_token / mla_per_token, 1);
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 16: fewer keys and values, and a window", [](const LessonOptions& opts) {
        const fs::path corpus = opts.corpus();  // tiny shakespeare, or --data FILE
        const TextDataset data = make_dataset(read_corpus(corpus));

        print_heading("One recipe, nine attentions");
        //! [recipe]
        TrainConfig recipe = TrainConfig::named("cpu");  // 4 layers, 4 heads, 128 channels, block 64
        if (!opts.full) {  // the short default: a smaller model, 600 steps
            recipe.n_layer = 2;
            recipe.n_embd = 64;  // 4 heads of 16 channels
            recipe.batch_size = 8;
            recipe.max_iters = recipe.lr_decay_iters = 600;
            recipe.warmup_iters = 60;
        }
        if (opts.quick) recipe.make_quick();
        //! [recipe]
        std::printf("%s: %zu train / %zu val tokens, vocabulary %zu\n", corpus.filename().c_str(),
                    data.train.size(), data.val.size(), data.vocab.size());
        std::printf("%s run: %d layers, %d heads, %d channels, block %d, batch %d, %lld steps, seed %llu\n",
                    opts.full ? "full" : "short", recipe.n_layer, recipe.n_head, recipe.n_embd,
                    recipe.block_size, recipe.batch_size, static_cast<long long>(recipe.max_iters),
                    static_cast<unsigned long long>(recipe.seed));

        cache_at_scale();

        print_heading("Which key/value head serves each query head");
        const int NH = recipe.n_head;
        for (int G : {4, 2, 1}) {
            std::printf("G = %d:", G);
            for (int h = 0; h < NH; ++h) std::printf("  q%d -> kv%d", h, kv_head_of(h, NH, G));
            std::printf("   (c_attn: %d outputs = C + 2*G*hs = %d + 2*%d*%d)\n",
                        recipe.n_embd + 2 * G * (recipe.n_embd / NH), recipe.n_embd, G,
                        recipe.n_embd / NH);
        }

        print_heading("Training, and the cost of the cache");
        // One BLAS thread for the decode timings: the comparison is then about the work per
        // token, not about how many cores happen to be free.
        openblas_set_num_threads(1);  // the library's default too; training splits the batch
        const int V = static_cast<int>(data.vocab.size());
        // Validation targets scored, in windows of the block (64): 4096, fewer on a short text.
        const int n_val = static_cast<int>(targets_to_score(data.val, opts.quick ? 512 : 4096,
                                                            static_cast<std::size_t>(recipe.block_size),
                                                            "the validation split"));
        const int decoded = opts.quick ? 64 : 1024;  // tokens in the longer decode run
        std::printf("val loss: the mean over %d validation tokens in windows of %d; decode: "
                    "tokens per second\nwith the KV cache from a one-token prompt (the fastest of five runs), "
                    "a random-initialised copy\nwith block 1024, top-k 10, one core; same text: "
                    "the cached %d tokens equal the uncached ones\n",
                    n_val, recipe.block_size, decoded / 4);
        std::printf("%3s %5s %11s %9s %11s %16s %11s %11s %12s %8s\n", "G", "W", "parameters",
                    "val loss", "KV B/token", "KV at 1024 tok",
                    ("tok/s@" + std::to_string(decoded / 4)).c_str(),
                    ("tok/s@" + std::to_string(decoded)).c_str(), "same text", "train s");
        std::vector<PlotSeries> memory;  // the cache's size against the tokens generated
        std::map<std::pair<int, int>, Row> rows;  // (G, W) → its row
        for (int G : {4, 2, 1}) {
            for (int W : {0, 32, 16}) {
                //! [train]
                TrainConfig c = recipe;
                c.n_kv_head = G;  // the only differences: same seed, same batches
                c.window = W;
                Trainer trainer(c, data);
                const double train_s = seconds([&] {
                    while (!trainer.done()) trainer.train_step();
                });
                const double val = loss_on_text(trainer.model(), data.val, n_val, c.block_size);
                //! [train]
                //! [decode]
                GPTConfig big = c.model_config(V);  // random weights: the time per token does
                big.block_size = 1024;              // not depend on their values
                GPT timing_model(big, 1337);
                const KVCache cache(big);  // G heads; a ring of W positions with a window
                const std::size_t per_token = cache.bytes_per_position();
                const std::size_t at_1024 = per_token * static_cast<std::size_t>(cache.capacity());
                double rate[2] = {0.0, 0.0};
                bool same = false;
                for (int i = 0; i < 2; ++i) {
                    SampleOptions o;
                    o.max_new_tokens = i == 0 ? decoded / 4 : decoded;
                    o.top_k = 10;
                    std::string text;
                    double s = 1e30;  // the fastest of five runs: other programs share the cores
                    for (int round = 0; round < 5; ++round)
                        s = std::min(s, seconds([&] { text = generate_cached(timing_model, data.vocab, "", o); }));
                    rate[i] = o.max_new_tokens / s;
                    if (i == 0) same = text == generate_text(timing_model, data.vocab, "", o);
                }
                //! [decode]
                if (W == 0 || (G == 4 && W == 32) || (G == 1 && W == 16)) {
                    PlotSeries line{"G=" + std::to_string(G) + ", W=" + window_name(W), {}, {}};
                    for (int n = 0; n <= 1024; n += 16) {  // a ring holds at most W positions
                        line.x.push_back(n);
                        line.y.push_back(static_cast<double>(per_token) *
                                         std::min(n, cache.capacity()) / 1024.0);
                    }
                    memory.push_back(line);
                }
                std::printf("%3d %5s %11zu %9.4f %11zu %13.1f KiB %11.0f %11.0f %12s %8.1f\n", G,
                            window_name(W).c_str(), c.model_config(V).num_parameters(), val,
                            per_token, static_cast<double>(at_1024) / 1024.0, rate[0], rate[1],
                            same ? "yes" : "NO", train_s);
                rows[{G, W}] = {c.model_config(V).num_parameters(), per_token, at_1024, val, rate[0], rate[1], train_s};
            }
        }
        if (!opts.figures.empty()) {
            line_plot_png(opts.figures / "lesson16_cache_memory.png", memory,
                          "KV cache held while generating (" + std::to_string(recipe.n_layer) +
                              " layers, " + std::to_string(NH) + " query heads of " +
                              std::to_string(recipe.n_embd / NH) + ")",
                          "tokens generated", "KiB");
            std::printf("\nchart: lesson16_cache_memory.png\n");
        }

        // The page's table and the comparisons its prose makes, from these numbers.
        std::printf("\nthe numbers the page quotes:\n");
        const auto name = [](int G, int W) { return "g" + std::to_string(G) + "_w" + window_name(W); };
        double training_seconds = 0.0;
        for (const auto& [key, r] : rows) {
            const std::string n = name(key.first, key.second);
            print_claim(n + "_params", std::to_string(r.parameters));
            print_claim(n + "_val", r.val_loss, 3);
            print_claim(n + "_bytes", std::to_string(r.bytes_per_token));
            print_claim(n + "_kib", std::to_string(r.bytes_at_1024 / 1024));
            print_claim(n + "_rate_short", r.rate_short, 0);
            print_claim(n + "_rate_long", r.rate_long, 0);
            training_seconds += r.train_seconds;
        }
        print_claim("training_seconds", training_seconds, 0);
        print_claim("decoded_short", std::to_string(decoded / 4));
        print_claim("decoded_long", std::to_string(decoded));
        const Row &mha = rows.at({4, 0}), &mqa16 = rows.at({1, 16});
        print_claim("params_saved_g2", std::to_string(mha.parameters - rows.at({2, 0}).parameters));
        print_claim("params_saved_g1", std::to_string(mha.parameters - rows.at({1, 0}).parameters));
        print_claim("kib_ratio", std::to_string(mha.bytes_at_1024 / mqa16.bytes_at_1024));
        // Speed: the mean over G of each window's rates, and how the long run compares.
        const auto mean_rate = [&](int W, bool long_run) {
            double sum = 0.0;
            for (int G : {4, 2, 1}) sum += long_run ? rows.at({G, W}).rate_long : rows.at({G, W}).rate_short;
            return sum / 3.0;
        };
        for (int W : {0, 32, 16}) {
            const std::string w = "w" + window_name(W);
            print_claim(w + "_rate_short_mean", mean_rate(W, false), 0);
            print_claim(w + "_rate_long_mean", mean_rate(W, true), 0);
            print_claim(w + "_rate_ratio", mean_rate(W, true) / mean_rate(W, false), 2);
        }
        // The work of one cached step per layer, in multiply-adds: the projections
        // (c_attn with G key/value heads, c_proj, the MLP) and the attention row over T keys.
        const int C = recipe.n_embd, hs = C / NH;
        const auto projections = [&](int G) { return C * (C + 2 * G * hs) + C * C + 8 * C * C; };
        // The mean work per generated token of a run of n tokens from a one-token prompt:
        // every layer's projections and its row over min(context, W) keys, and the LM head.
        const auto mean_work = [&](int G, int W, int n) {
            double sum = 0.0;
            for (int t = 1; t <= n; ++t) {
                const int keys = W == 0 ? t : std::min(t, W);
                sum += recipe.n_layer * (double(projections(G)) + 2.0 * keys * C) + double(C) * V;
            }
            return sum / n;
        };
        for (int W : {0, 32, 16}) {  // the rate at the long run over the short, if work set it
            double predicted = 0.0;
            for (int G : {4, 2, 1}) predicted += mean_work(G, W, decoded / 4) / mean_work(G, W, decoded) / 3.0;
            print_claim("w" + window_name(W) + "_predicted_ratio", predicted, 2);
        }
        double predicted_g1_over_g4 = 0.0;
        for (int W : {0, 32, 16}) predicted_g1_over_g4 += mean_work(4, W, decoded) / mean_work(1, W, decoded) / 3.0;
        print_claim("g1_over_g4_predicted", predicted_g1_over_g4, 2);
        print_claim("projections_g4", std::to_string(projections(4)));
        print_claim("projections_g1", std::to_string(projections(1)));
        print_claim("projections_saving_g1", 100.0 * (1.0 - double(projections(1)) / projections(4)), 1);
        print_claim("attention_row_long", std::to_string(2 * decoded * C));
        double g1_over_g4 = 0.0;  // the measured rate with one key/value head over four, mean over W
        for (int W : {0, 32, 16}) g1_over_g4 += rows.at({1, W}).rate_long / rows.at({4, W}).rate_long / 3.0;
        print_claim("g1_over_g4_rate", g1_over_g4, 2);
        // Loss: in how many rows of G the window of 16 is best, and what the heads cost.
        int w16_best = 0;
        double w16_gain = 0.0, kv_cost = 0.0;
        for (int G : {4, 2, 1}) {
            const double full_ctx = rows.at({G, 0}).val_loss, w32 = rows.at({G, 32}).val_loss,
                         w16 = rows.at({G, 16}).val_loss;
            w16_best += w16 < full_ctx && w16 < w32;
            w16_gain += (full_ctx - w16) / 3.0;
            kv_cost = std::max(kv_cost, rows.at({G, 0}).val_loss - mha.val_loss);
        }
        print_claim("w16_best_rows", std::to_string(w16_best) + " of 3");
        print_claim("w16_gain", w16_gain, 3);
        print_claim("kv_cost", kv_cost, 3);

        // What the full run would take here: nanoGPT's CPU recipe, timed for a few steps on
        // this machine, times its steps for all nine models (the training alone).
        TrainConfig full = TrainConfig::named("cpu");
        if (opts.quick) full.make_quick();
        Trainer timing(full, data);
        const double full_step = median_step_seconds(timing, opts.quick ? 1 : 5, opts.quick ? 0 : 2);
        const double full_estimate = full_step * static_cast<double>(9 * full.max_iters);
        std::printf("\nthe full run's model (nanoGPT's CPU recipe) takes %.0f ms per training step here;\n"
                    "9 models x %lld steps would take about %s of training\n", 1e3 * full_step,
                    static_cast<long long>(full.max_iters), format_duration(full_estimate).c_str());
        print_claim("full_ms_per_step", 1e3 * full_step, 0);
        print_claim("full_run_estimate", format_duration(full_estimate));
        if (!opts.full) {
            std::printf("\nThis was the short run; the full one (nanoGPT's CPU recipe, 2000 steps per "
                        "model): ./build/lesson_16 --full\n");
        }
    }, LessonText::corpus);
}
