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
#include "attn/lesson.hpp"
#include "attn/plot.hpp"
#include "attn/print.hpp"
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

        print_heading("Training, once per scheme");
        std::vector<Position> schemes = {Position::learned, Position::rope, Position::alibi};
        std::map<Position, Trainer> trained;
        std::printf("%-8s %11s %12s %10s\n", "scheme", "parameters", "train loss", "seconds");
        for (Position position : schemes) {
            //! [train]
            TrainConfig c = recipe;
            c.position = position;  // the only difference: same seed, so same batches
            Trainer trainer(c, data);
            const auto start = std::chrono::steady_clock::now();
            float loss = 0.0f;
            while (!trainer.done()) loss = trainer.train_step().loss;
            //! [train]
            std::printf("%-8s %11zu %12.4f %10.1f\n", position_name(position),
                        trainer.model().config().num_parameters(), static_cast<double>(loss),
                        seconds_since(start));
            trained.emplace(position, std::move(trainer));
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
            for (int s : {1, 8, 32, 1000}) {
                const double r = max_change(first_layer_scores(rope, ids, s), rope0);
                if (s + 32 <= recipe.block_size) {
                    const double l = max_change(first_layer_scores(learned, ids, s), learned0);
                    std::printf("%8d %28.3g %28.3g\n", s, l, r);
                } else {
                    std::printf("%8d %28s %28.3g\n", s, "(no embedding that far)", r);
                }
            }
        }

        print_heading("Loss on the same validation text, at and beyond the training context");
        std::vector<PlotSeries> lines;
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
                } catch (const std::invalid_argument& e) {  // learned: no row for position 64
                    if (learned_error.empty()) learned_error = e.what();
                    std::printf(" %9s", "-");
                }
                //! [beyond]
            }
            std::printf("\n");
            lines.push_back(line);
        }
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
