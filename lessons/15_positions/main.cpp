// Lesson 15: where position enters attention. The page that narrates this program is
// lesson.md beside it.
//
// It trains the same small GPT three times, once per position scheme (learned, RoPE, ALiBi),
// with the same seed, steps and batches; measures the shift property of RoPE against learned
// positions on the trained models; and evaluates every model on the same validation text at
// the training context (64) and beyond it (128, 256, 512). `--full` runs nanoGPT's CPU recipe
// (4 layers, 128 channels, 2000 steps) instead of the short default, `--quick` a few steps;
// `--data FILE` trains on another text.
#include "attn/data.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/heatmap.hpp"
#include "attn/kv_cache.hpp"
#include "attn/lesson.hpp"
#include "attn/plot.hpp"
#include "attn/print.hpp"
#include "attn/run_control.hpp"
#include "attn/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;

namespace {

// The raw scores q·kᵀ (NH, T, T) of the first layer for the tokens `ids` placed at positions
// shift, shift+1, …: learned positions read the embedding rows from `shift` on, RoPE
// rotates from pos0 = shift.
//! [scores]
std::vector<float> first_layer_scores(const GPT& model, const std::vector<int>& ids, int shift) {
    const GPTConfig& c = model.config();
    const int T = static_cast<int>(ids.size()), C = c.n_embd, NH = c.n_head, hs = C / NH;
    const ParameterTensors& p = model.params();
    std::vector<float> x(static_cast<std::size_t>(T) * C), ln(x.size()), mean(T), rstd(T);
    std::vector<float> qkv(static_cast<std::size_t>(T) * 3 * C);
    const float* wpe = p.wpe ? p.wpe + static_cast<std::size_t>(shift) * C : nullptr;
    encoder_forward(x.data(), ids.data(), p.wte, wpe, 1, T, C);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), p.ln1w, p.ln1b, 1, T, C);
    matmul_forward(qkv.data(), ln.data(), p.qkvw, p.qkvb, T, C, 3 * C);
    if (c.position == Position::rope) rope_forward(qkv.data(), 1, T, C, NH, shift);
    std::vector<float> scores(static_cast<std::size_t>(NH) * T * T);
    for (int h = 0; h < NH; ++h)
        for (int i = 0; i < T; ++i)
            for (int j = 0; j < T; ++j) {
                const float* q = qkv.data() + static_cast<std::size_t>(i) * 3 * C + h * hs;
                const float* k = qkv.data() + static_cast<std::size_t>(j) * 3 * C + C + h * hs;
                float s = 0.0f;
                for (int d = 0; d < hs; ++d) s += q[d] * k[d];
                scores[(static_cast<std::size_t>(h) * T + i) * T + j] = s;
            }
    return scores;
}
//! [scores]

double max_change(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    return worst;
}

// The mean loss over the first `n` next-token predictions of the validation split, cut into
// windows of T tokens: every T scores the same n targets, each with the context its window
// gives it.
//! [evaluate]
double loss_on_text(GPT& model, const std::vector<int>& val, int n, int T) {
    std::vector<int> x, y;  // (n/T, T) each; checked against the split's length
    consecutive_windows(val, static_cast<std::size_t>(n), static_cast<std::size_t>(T), x, y,
                        "the validation split");
    model.train(false);
    return model.forward(x, y, n / T, T);
}
//! [evaluate]

// Vaswani et al. 2017's fixed positions (section 3.5), (positions, C): channel pair i of
// position p holds sin(p·ω_i) and cos(p·ω_i), with ω_i = 10000^(−2i/C), the same frequencies
// as RoPE's angles (rope_angle with hs = C).
//! [sinusoidal]
std::vector<double> sinusoidal_positions(int positions, int C) {
    std::vector<double> pe(static_cast<std::size_t>(positions) * C);
    for (int p = 0; p < positions; ++p)
        for (int i = 0; i < C / 2; ++i) {
            const double angle = rope_angle(p, i, C);  // p · 10000^(−2i/C)
            pe[static_cast<std::size_t>(p) * C + 2 * i] = std::sin(angle);
            pe[static_cast<std::size_t>(p) * C + 2 * i + 1] = std::cos(angle);
        }
    return pe;
}

// The map that shifts every row of the table by k positions: in each channel pair, the
// rotation (sin pω, cos pω) ↦ (sin (p+k)ω, cos (p+k)ω), the same for every p.
std::vector<double> shift_by(const std::vector<double>& row, int k, int C) {
    std::vector<double> out(row.size());
    for (int i = 0; i < C / 2; ++i) {
        const double c = std::cos(rope_angle(k, i, C)), s = std::sin(rope_angle(k, i, C));
        out[2 * i] = c * row[2 * i] + s * row[2 * i + 1];       // sin(a + b)
        out[2 * i + 1] = -s * row[2 * i] + c * row[2 * i + 1];  // cos(a + b)
    }
    return out;
}
//! [sinusoidal]

// The cosine similarity of rows i and j of a (rows, C) table, mapped from [−1, 1] to [0, 1]
// for a heatmap: (n, n).
template <class T>
Tensor2 row_similarity(const T* table, int n, int C) {
    Tensor2 out({static_cast<std::size_t>(n), static_cast<std::size_t>(n)});
    for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
            double dot = 0.0, ii = 0.0, jj = 0.0;
            for (int c = 0; c < C; ++c) {
                const double a = table[static_cast<std::size_t>(i) * C + c], b = table[static_cast<std::size_t>(j) * C + c];
                dot += a * b, ii += a * a, jj += b * b;
            }
            out(i, j) = static_cast<float>((1.0 + dot / std::sqrt(ii * jj)) / 2.0);
        }
    return out;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 15: where position enters attention", [](const LessonOptions& opts) {
        const fs::path corpus = opts.corpus();  // tiny shakespeare, or --data FILE
        const TextDataset data = make_dataset(read_corpus(corpus));
        // The validation targets scored at every context length below: 4096 (64 windows of 64,
        // …, 8 of 512), fewer on a short text (a multiple of 512 that its validation split holds).
        const std::vector<int> lengths = {64, 128, 256, 512};
        const int n = static_cast<int>(targets_to_score(data.val, opts.quick ? 512 : 4096, 512,
                                                        "the validation split"));

        print_heading("One recipe, three position schemes");
        //! [recipe]
        TrainConfig recipe = TrainConfig::named("cpu");  // 4 layers, 4 heads, 128 channels, block 64
        if (!opts.full) {  // the short default: a smaller model, 300 steps
            recipe.n_layer = 2;
            recipe.n_embd = 64;  // 4 heads of 16 channels
            recipe.batch_size = 8;
            recipe.max_iters = recipe.lr_decay_iters = 300;
            recipe.warmup_iters = 30;
        }
        if (opts.quick) recipe.make_quick();
        //! [recipe]
        std::printf("%s: %zu train / %zu val tokens, vocabulary %zu\n", corpus.filename().c_str(),
                    data.train.size(), data.val.size(), data.vocab.size());
        std::printf("%s run: %d layers, %d heads, %d channels, block %d, batch %d, %lld steps, seed %llu\n",
                    opts.full ? "full" : "short", recipe.n_layer, recipe.n_head, recipe.n_embd,
                    recipe.block_size, recipe.batch_size, static_cast<long long>(recipe.max_iters),
                    static_cast<unsigned long long>(recipe.seed));
        const std::vector<float> slopes = alibi_slopes(recipe.n_head);
        std::printf("ALiBi slopes for %d heads:", recipe.n_head);
        for (float m : slopes) std::printf(" %g", static_cast<double>(m));
        const int hs = recipe.n_embd / recipe.n_head;
        std::printf("\nRoPE angle per position of the %d pairs of a %d-channel head: from %g (pair 0) "
                    "to %.3g (pair %d) radians\n",
                    hs / 2, hs, rope_angle(1, 0, hs), rope_angle(1, hs / 2 - 1, hs), hs / 2 - 1);
        char slowest[32];
        std::snprintf(slowest, sizeof slowest, "%.3g", rope_angle(1, hs / 2 - 1, hs));
        print_claim("hs", std::to_string(hs));
        print_claim("rope_slowest_angle", slowest);
        // The slowest pair turns once in 2π/angle positions: far more than the block, so
        // training never shows it more than a small arc of its circle.
        const double slowest_period = 2.0 * 3.14159265358979323846 / rope_angle(1, hs / 2 - 1, hs);
        std::printf("the slowest pair turns once every %.0f positions; the block is %d\n", slowest_period,
                    recipe.block_size);
        print_claim("rope_slowest_period", slowest_period, 0);

        print_heading("Sinusoidal positions: a shift by k is one linear map");
        const int C = recipe.n_embd, table_rows = 1024 + 100;
        const std::vector<double> pe = sinusoidal_positions(table_rows, C);  // (rows, C)
        double shift_error = 0.0;  // max |PE(p + k) − M_k PE(p)| over p and k
        for (int k : {1, 5, 100})
            for (int p = 0; p + k < table_rows; ++p) {
                const std::vector<double> row(pe.begin() + static_cast<std::ptrdiff_t>(p) * C,
                                              pe.begin() + static_cast<std::ptrdiff_t>(p + 1) * C);
                const std::vector<double> moved = shift_by(row, k, C);
                for (int c = 0; c < C; ++c)
                    shift_error = std::max(shift_error, std::fabs(moved[c] - pe[static_cast<std::size_t>(p + k) * C + c]));
            }
        std::printf("table of %d positions x %d channels; for k = 1, 5, 100 and every p:\n"
                    "max |PE(p + k) - M_k PE(p)| = %.1e (float64 rounding): M_k does not depend on p\n",
                    table_rows, C, shift_error);
        char shift_text[16];
        std::snprintf(shift_text, sizeof shift_text, "%.0e", shift_error);
        print_claim("sinusoid_channels", std::to_string(C));
        print_claim("sinusoid_shift_error", shift_text);
        if (!opts.figures.empty()) {
            std::vector<PlotSeries> curves;
            for (int i : {C / 32, 3 * C / 32, 5 * C / 32, C / 4}) {  // 2, 6, 10, 16 for C = 64
                char name[48];
                std::snprintf(name, sizeof name, "i = %d, w = %.3g", i, rope_angle(1, i, C));
                PlotSeries line{name, {}, {}};
                for (int q = 0; q <= 128; ++q) {
                    line.x.push_back(q);
                    line.y.push_back(pe[static_cast<std::size_t>(q) * C + 2 * i]);
                }
                curves.push_back(line);
            }
            line_plot_png(opts.figures / "lesson15_sinusoids.png", curves,
                          "Sinusoidal positions: channel 2i = sin(w p), four pairs i (C = " + std::to_string(C) + ")",
                          "position p", "PE(p, 2i)");
            std::printf("chart: lesson15_sinusoids.png\n");
        }

        print_heading("Training, once per scheme");
        std::vector<Position> schemes = {Position::learned, Position::rope, Position::alibi};
        std::map<Position, Trainer> trained;
        std::printf("%-8s %11s %12s %10s\n", "scheme", "parameters", "train loss", "seconds");
        double training_seconds = 0.0;
        for (Position position : schemes) {
            //! [train]
            TrainConfig c = recipe;
            c.position = position;  // the only difference: same seed, so same batches
            Trainer trainer(c, data);
            const auto start = std::chrono::steady_clock::now();
            float loss = 0.0f;
            while (!trainer.done()) loss = trainer.train_step().loss;
            //! [train]
            const double took = seconds_since(start);
            training_seconds += took;
            std::printf("%-8s %11zu %12.4f %10.1f\n", position_name(position),
                        trainer.model().config().num_parameters(), static_cast<double>(loss), took);
            trained.emplace(position, std::move(trainer));
        }

        // What the full run would take here: nanoGPT's CPU recipe, timed for a few steps on
        // this machine, times its steps for every scheme.
        TrainConfig full = TrainConfig::named("cpu");
        if (opts.quick) full.make_quick();
        Trainer timing(full, data);
        const double full_step = median_step_seconds(timing, opts.quick ? 1 : 5, opts.quick ? 0 : 2);
        const double full_estimate = full_step * static_cast<double>(full.max_iters * schemes.size());
        std::printf("\nthe full run's model (nanoGPT's CPU recipe) takes %.0f ms per training step here;\n"
                    "%zu schemes x %lld steps would take about %s\n",
                    1e3 * full_step, schemes.size(), static_cast<long long>(full.max_iters),
                    format_duration(full_estimate).c_str());
        print_claim("training_seconds", training_seconds, 0);
        print_claim("full_ms_per_step", 1e3 * full_step, 0);
        print_claim("full_run_estimate", format_duration(full_estimate));
        print_claim("wpe_parameters", std::to_string(trained.at(Position::learned).model().config().num_parameters() -
                                                     trained.at(Position::rope).model().config().num_parameters()));

        print_heading("How each scheme relates two positions");
        {
            //! [relate]
            const int P = 32;  // positions 0..31
            const GPT& learned = trained.at(Position::learned).model();
            Tensor2 sinusoidal_map = row_similarity(pe.data(), P, C);  // cos-similarity of PE rows
            Tensor2 learned_map = row_similarity(learned.params().wpe, P, C);  // of trained wpe rows
            Tensor2 rope_map({std::size_t(P), std::size_t(P)}), alibi_map({std::size_t(P), std::size_t(P)});
            for (int i = 0; i < P; ++i)
                for (int j = 0; j < P; ++j) {
                    double rotated = 0.0;  // (R_i u)·(R_j u) for u = (1, 0, 1, 0, …)/|u|: the mean
                    for (int pair = 0; pair < hs / 2; ++pair)  // of cos((i − j)·θ) over the pairs
                        rotated += std::cos(rope_angle(i - j, pair, hs)) / (hs / 2);
                    rope_map(i, j) = static_cast<float>((1.0 + rotated) / 2.0);
                    // ALiBi's bias m·(j − i) multiplies a weight by e^(m·(j − i)); head 1, m = 1/16
                    alibi_map(i, j) = j <= i ? std::exp(slopes[1] * static_cast<float>(j - i)) : 0.0f;
                }
            //! [relate]
            if (!opts.figures.empty()) {
                std::vector<std::string> labels(static_cast<std::size_t>(P));
                for (int i = 0; i < P; i += 8) labels[static_cast<std::size_t>(i)] = std::to_string(i);
                heatmap_grid_png(opts.figures / "lesson15_positions.png",
                                 {sinusoidal_map, learned_map, rope_map, alibi_map},
                                 {"sinusoidal: PE(i) vs PE(j)", "learned (trained): wpe[i] vs wpe[j]",
                                  "RoPE: (R_i u).(R_j u)", "ALiBi head 1: exp(m (j - i))"},
                                 labels, labels, 2);
                std::printf("chart: lesson15_positions.png\n");
            }
            double sinusoid_off_band = 0.0, learned_off_band = 0.0;  // how far from depending on i − j only
            for (int i = 1; i < P; ++i)
                for (int j = 1; j < P; ++j) {
                    sinusoid_off_band = std::max(sinusoid_off_band, double(std::fabs(sinusoidal_map(i, j) - sinusoidal_map(i - 1, j - 1))));
                    learned_off_band = std::max(learned_off_band, double(std::fabs(learned_map(i, j) - learned_map(i - 1, j - 1))));
                }
            std::printf("largest change along a diagonal (0: the map depends on i - j only): sinusoidal %.1e, "
                        "learned %.2f\n", sinusoid_off_band, learned_off_band);
            print_claim("learned_diagonal_change", learned_off_band, 2);
        }

        print_heading("The shift property, on the trained models");
        {
            const std::vector<int> ids(data.val.begin(), data.val.begin() + 32);
            GPT& learned = trained.at(Position::learned).model();
            GPT& rope = trained.at(Position::rope).model();
            const std::vector<float> learned0 = first_layer_scores(learned, ids, 0);
            const std::vector<float> rope0 = first_layer_scores(rope, ids, 0);
            double largest = 0.0;
            for (float s : rope0) largest = std::max(largest, std::fabs(static_cast<double>(s)));
            std::printf("32 tokens of val text, first layer's scores q.k (largest |score| %.2f with RoPE)\n",
                        largest);
            std::printf("%8s %28s %28s\n", "shift s", "max |change|, learned", "max |change|, RoPE");
            double rope_worst = 0.0, learned_least = 1e30, learned_most = 0.0;
            for (int s : {1, 8, 32, 1000}) {
                const double r = max_change(first_layer_scores(rope, ids, s), rope0);
                rope_worst = std::max(rope_worst, r);
                if (s + 32 <= recipe.block_size) {
                    const double l = max_change(first_layer_scores(learned, ids, s), learned0);
                    learned_least = std::min(learned_least, l), learned_most = std::max(learned_most, l);
                    std::printf("%8d %28.3g %28.3g\n", s, l, r);
                } else {
                    std::printf("%8d %28s %28.3g\n", s, "(no embedding that far)", r);
                }
            }
            // float32's spacing at the largest score: the size of one rounding there.
            const float big = static_cast<float>(largest);
            const double ulp = static_cast<double>(std::nextafter(big, 2 * big) - big);
            std::printf("one float32 unit in the last place at %.1f: %.1e\n", largest, ulp);
            char rope_text[16], ulp_text[16];
            std::snprintf(rope_text, sizeof rope_text, "%.1e", rope_worst);
            std::snprintf(ulp_text, sizeof ulp_text, "%.1e", ulp);
            print_claim("rope_largest_score", largest, 0);
            print_claim("rope_shift_change", rope_text);
            print_claim("score_ulp", ulp_text);
            print_claim("learned_shift_least", learned_least, 1);
            print_claim("learned_shift_most", learned_most, 1);
        }

        print_heading("Loss on the same validation text, at and beyond the training context");
        std::vector<PlotSeries> lines;
        std::map<std::pair<Position, int>, double> losses;  // (scheme, T) → val loss
        std::printf("%d validation tokens scored at every context length T\n", n);
        std::printf("%-8s", "scheme");
        for (int T : lengths) std::printf(" %9s", ("T=" + std::to_string(T)).c_str());
        std::printf("\n");
        std::string learned_error;
        for (Position position : schemes) {
            GPT& model = trained.at(position).model();
            PlotSeries line{position_name(position), {}, {}};
            std::printf("%-8s", position_name(position));
            for (int T : lengths) {
                //! [beyond]
                try {
                    const double loss = loss_on_text(model, data.val, n, T);
                    line.x.push_back(T);
                    line.y.push_back(loss);
                    std::printf(" %9.4f", loss);
                    losses[{position, T}] = loss;
                } catch (const std::invalid_argument& e) {  // learned: no row for position 64
                    if (learned_error.empty()) learned_error = e.what();
                    std::printf(" %9s", "-");
                }
                //! [beyond]
            }
            std::printf("\n");
            lines.push_back(line);
        }
        // The table of the page, and the comparisons its prose makes, from these numbers.
        std::printf("\nthe numbers the page quotes:\n");
        print_claim("scored_tokens", std::to_string(n));
        for (const auto& [key, loss] : losses)
            print_claim(std::string("loss_") + position_name(key.first) + "_" + std::to_string(key.second), loss, 3);
        Position best = Position::learned;
        for (Position position : schemes)
            if (losses.at({position, 64}) < losses.at({best, 64})) best = position;
        const auto display_name = [](Position position) {  // as the page writes the schemes
            return position == Position::rope ? "RoPE" : position == Position::alibi ? "ALiBi" : "learned";
        };
        print_claim("best_at_64", display_name(best));
        const auto trend = [&](Position position) {  // how the loss moves from 64 to 512
            const double change = losses.at({position, 512}) - losses.at({position, 64});
            char text[64];
            std::snprintf(text, sizeof text, "%s by %.3f", change > 0 ? "rises" : "falls", std::fabs(change));
            return std::string(text);
        };
        print_claim("rope_trend", trend(Position::rope));
        print_claim("alibi_trend", trend(Position::alibi));

        print_heading("Generating with a KV cache, each scheme");
        // One block of text per scheme (a newline, then block − 1 tokens: no crop), uncached
        // and cached, the fastest of three runs of each. With RoPE the cache keeps each key
        // rotated by its absolute position and rotates each new query by its own; with ALiBi
        // the step adds m·(distance) to its scores; learned positions are in the keys already.
        std::printf("%-8s %13s %11s %9s %10s\n", "scheme", "uncached ms", "cached ms", "speed-up", "same text");
        for (Position position : schemes) {
            //! [cache]
            GPT& model = trained.at(position).model();
            SampleOptions o;
            o.max_new_tokens = model.config().block_size - 1;
            o.top_k = 10;
            o.seed = 1;
            std::string uncached, cached;
            double t_uncached = 1e30, t_cached = 1e30;
            for (int run = 0; run < 3; ++run) {
                auto t0 = std::chrono::steady_clock::now();
                uncached = generate_text(model, data.vocab, "", o);
                t_uncached = std::min(t_uncached, seconds_since(t0));
                t0 = std::chrono::steady_clock::now();
                cached = generate_cached(model, data.vocab, "", o);
                t_cached = std::min(t_cached, seconds_since(t0));
            }
            //! [cache]
            const std::string name = position_name(position);
            std::printf("%-8s %13.2f %11.2f %8.1fx %10s\n", name.c_str(), 1e3 * t_uncached,
                        1e3 * t_cached, t_uncached / t_cached, cached == uncached ? "yes" : "NO");
            print_claim("cache_speedup_" + name, t_uncached / t_cached, 1);
            print_claim("cache_same_" + name, cached == uncached ? "yes" : "NO");
        }
        print_claim("cache_tokens", std::to_string(recipe.block_size - 1));

        std::printf("\nthe learned model at T=128 says: %s\n", learned_error.c_str());
        try {
            trained.at(Position::learned).model().forward(data.val.data(), nullptr, 1, 65);
        } catch (const std::invalid_argument& e) {
            std::printf("and at T=65, one token past its block: %s\n", e.what());
        }
        if (!opts.figures.empty()) {
            line_plot_png(opts.figures / "lesson15_loss_by_length.png", lines,
                          std::string("Val loss against context length (trained at 64, ") +
                              (opts.full ? "full" : "short") + " run)",
                          "context length T", "val loss");
            std::printf("chart: lesson15_loss_by_length.png\n");
        }
        if (!opts.full) {
            std::printf("\nThis was the short run; the full one (nanoGPT's CPU recipe, 2000 steps per "
                        "scheme): ./build/lesson_15 --full\n");
        }
    }, LessonText::corpus);
}
