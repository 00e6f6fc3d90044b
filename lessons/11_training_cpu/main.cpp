// Lesson 11: training on the CPU. The page that narrates this program is lesson.md beside it.
//
// It trains nanoGPT's CPU recipe on tiny shakespeare (`--data FILE`: on another text). The
// environment variable ATTN_LESSON11_MAX_ITERS shortens the run (the test suite sets it;
// the docs show the full run), and `--quick` runs every step of the lesson at its smallest.
// Timed: this program prints measured times, so CTest runs it with nothing beside it (RUN_SERIAL).
#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/entropy.hpp"
#include "attn/gpt_inspect.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/print.hpp"
#include "attn/run_control.hpp"
#include "attn/threads.hpp"
#include "attn/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>
#include <unistd.h>

using namespace attn;
namespace fs = std::filesystem;

namespace {

// The first line of the validation text that is between 30 and 60 characters long,
// with its newline: the line the trained model's attention is drawn on.
std::vector<int> probe_line(const TextDataset& data) {
    const int newline = data.vocab.can_encode("\n") ? data.vocab.encode("\n").at(0) : -1;  // -1: no lines
    std::size_t start = 0;
    for (std::size_t i = 0; i < data.val.size(); ++i) {
        if (data.val[i] != newline) continue;
        const std::size_t length = i + 1 - start;
        if (length >= 30 && length <= 60) {
            return {data.val.begin() + static_cast<std::ptrdiff_t>(start),
                    data.val.begin() + static_cast<std::ptrdiff_t>(i + 1)};
        }
        start = i + 1;
    }
    const std::size_t n = std::min<std::size_t>(48, data.val.size());  // no such line: 48 characters
    return {data.val.begin(), data.val.begin() + static_cast<std::ptrdiff_t>(n)};
}

// A character as a label a picture can print: space and newline made visible.
std::string label(const std::string& c) { return c == " " ? "_" : c == "\n" ? "nl" : c; }

// The mean loss on `count` windows of (B, T) spread evenly over the validation split:
// the same windows every call, so losses of different weights compare directly.
double fixed_val_loss(GPT& model, const std::vector<int>& val, int B, int T, int count) {
    const auto windows = static_cast<std::size_t>(B * count), length = static_cast<std::size_t>(T);
    const std::size_t stride = val.size() > length ? (val.size() - length - 1) / windows : 0;
    std::vector<int> x(static_cast<std::size_t>(B * T)), y(x.size());
    double sum = 0.0;
    for (int n = 0; n < count; ++n) {
        for (int b = 0; b < B; ++b) {
            const std::size_t start = static_cast<std::size_t>(n * B + b) * stride;
            token_window(val, start, length, x.data() + b * T, y.data() + b * T, "the validation split");
        }
        sum += model.forward(x, y, B, T);
    }
    return sum / count;
}

// An induction head (Olsson et al. 2022) completes a repeat: at a character that occurred
// before, it attends to the character that followed the earlier occurrence, and the model
// copies it. The probe: B passages of n validation characters, each followed by itself
// (T = 2n). Returns the mean loss of the first copy's predictions and of the second's, and
// for every head (L, NH) its mean weight w[t, t − n + 1] over the second copy.
struct InductionProbe {
    double loss_first = 0.0, loss_second = 0.0;
    std::vector<Tensor1> score;  // (L, NH)
};

InductionProbe probe_induction(GPT& model, const std::vector<int>& val, int B, int n) {
    const int T = 2 * n, V = model.config().vocab_size;
    std::vector<int> x(static_cast<std::size_t>(B * T)), y(x.size());
    const std::size_t stride = (val.size() - static_cast<std::size_t>(n)) / static_cast<std::size_t>(B);
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) {
            const std::size_t start = static_cast<std::size_t>(b) * stride;
            x[static_cast<std::size_t>(b * T + t)] = val[start + static_cast<std::size_t>(t % n)];
            y[static_cast<std::size_t>(b * T + t)] = val[start + static_cast<std::size_t>((t + 1) % n)];
        }
    model.train(false);
    model.forward(x, y, B, T);
    InductionProbe probe;
    const std::vector<float>& logits = model.logits();  // (B, T, V)
    for (int b = 0; b < B; ++b)
        for (int t = 0; t < T; ++t) {
            if (t == n - 1) continue;  // the seam: the first copy's last character predicts the repeat's start
            const float* z = logits.data() + static_cast<std::size_t>(b * T + t) * V;
            const double m = *std::max_element(z, z + V);
            double sum = 0.0;
            for (int v = 0; v < V; ++v) sum += std::exp(z[v] - m);
            const double nll = m + std::log(sum) - z[y[static_cast<std::size_t>(b * T + t)]];
            (t < n ? probe.loss_first : probe.loss_second) += nll / (B * (n - 1));
        }
    for (int l = 0; l < model.config().n_layer; ++l) {
        const Tensor4 w = attention_weights(model, l);  // (B, NH, T, T)
        Tensor1 score = xt::zeros<float>({w.shape()[1]});
        for (std::size_t h = 0; h < w.shape()[1]; ++h)
            for (int b = 0; b < B; ++b)
                for (int t = n; t < T; ++t) score(h) += w(b, h, t, t - n + 1) / float(B * n);
        probe.score.push_back(score);
    }
    return probe;
}

// Every layer's mean entropy per head on one line: (L, NH).
std::vector<Tensor1> entropy_per_layer(GPT& model, const std::vector<int>& line) {
    model.train(false);
    model.forward(line, {}, 1, static_cast<int>(line.size()));
    std::vector<Tensor1> out;
    for (int l = 0; l < model.config().n_layer; ++l) out.push_back(mean_entropy_per_head(attention_weights(model, l)));
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 11: training on the CPU", [](const LessonOptions& opts) {
        print_heading("The corpus");
        //! [data]
        const fs::path corpus = opts.corpus();  // tiny shakespeare, or --data FILE
        const TextDataset data = make_dataset(read_corpus(corpus));  // 90% train, 10% val
        //! [data]
        std::printf("%s: %zu characters, vocabulary of %zu, %zu train / %zu val tokens\n",
                    corpus.filename().c_str(), data.train.size() + data.val.size(),
                    data.vocab.size(), data.train.size(), data.val.size());

        print_heading("The recipe");
        //! [recipe]
        TrainConfig config = TrainConfig::named("cpu");  // nanoGPT's CPU recipe
        //! [recipe]
        if (const char* steps = std::getenv("ATTN_LESSON11_MAX_ITERS")) {
            config.max_iters = std::max(1, std::atoi(steps));
            std::printf("(ATTN_LESSON11_MAX_ITERS=%s: a shortened run; the docs show the full one)\n",
                        steps);
        }
        if (opts.quick) config.make_quick();
        std::printf("model: %d layers, %d heads, %d channels, block %d, dropout %.1f, bias %s\n",
                    config.n_layer, config.n_head, config.n_embd, config.block_size,
                    static_cast<double>(config.dropout), config.bias ? "yes" : "no");
        std::printf("steps: %lld of batch %d (%d tokens each), AdamW betas (%.2f, %.2f), "
                    "weight decay %.1f, clip %.1f\n",
                    static_cast<long long>(config.max_iters), config.batch_size,
                    config.batch_size * config.block_size, static_cast<double>(config.beta1),
                    static_cast<double>(config.beta2), static_cast<double>(config.weight_decay),
                    static_cast<double>(config.grad_clip));
        std::printf("evaluation: every %lld steps, %lld batches of each split\n",
                    static_cast<long long>(config.eval_interval),
                    static_cast<long long>(config.eval_iters));

        print_heading("The learning-rate schedule");
        Trainer trainer(config, data);
        for (std::int64_t step : {0, 9, 49, 99, 100, 500, 1000, 1500, 1999, 2000}) {
            std::printf("step %4lld: lr %.3e\n", static_cast<long long>(step),
                        trainer.learning_rate(step));
        }

        // The line the trained model's attention is drawn on at the end, and the entropy of
        // every head on it before training.
        const std::vector<int> line = probe_line(data);
        const std::vector<Tensor1> entropy_at_init = entropy_per_layer(trainer.model(), line);

        print_heading("Training");
        std::printf("%s\n", describe_threads().c_str());
        std::printf("%lld parameters; at initialisation the loss should be about ln %zu = %.4f\n",
                    static_cast<long long>(trainer.model().config().num_parameters()),
                    data.vocab.size(), std::log(static_cast<double>(data.vocab.size())));
        //! [train]
        RunOptions options;
        options.log = &std::cout;        // "step 250: train loss ..., val loss ..."
        options.progress = &std::cerr;   // step, loss, lr, tokens/s, ETA
        options.progress_is_terminal = ::isatty(2);
        const RunSummary run = run_training(trainer, options);
        //! [train]
        const EvalRecord& last = run.evals.back();
        const double tokens = static_cast<double>(run.steps.size()) * config.batch_size * config.block_size;
        std::printf("\nfinal: train loss %.4f, val loss %.4f (nanoGPT reports about 1.88 for this recipe)\n",
                    last.train_loss, last.val_loss);
        std::printf("wall time %s for %zu steps and %zu evaluations: %.0f tokens/s overall\n",
                    format_duration(run.seconds).c_str(), run.steps.size(), run.evals.size(),
                    tokens / run.seconds);
        std::printf("the training steps alone: %.1f ms/step, %.0f tokens/s on this machine\n",
                    1e3 * run.step_seconds / static_cast<double>(run.steps.size()),
                    tokens / run.step_seconds);
        print_claim("vocab", std::to_string(data.vocab.size()));
        print_claim("corpus_characters", std::to_string(data.train.size() + data.val.size()));
        print_claim("ln_vocab", std::log(static_cast<double>(data.vocab.size())), 2);
        print_claim("first_val", run.evals.front().val_loss, 2);
        print_claim("final_train", last.train_loss, 2);
        print_claim("final_val", last.val_loss, 2);
        if (!opts.figures.empty()) {
            plot_losses(opts.figures / "lesson11_loss.png", run.steps, run.evals,
                        "CPU recipe, " + corpus.stem().string());
            // The trained weights, for the attention inspector (`./workbook inspect`), with
            // the corpus they learnt from.
            const fs::path model_dir = opts.figures / "lesson11_model";
            save_checkpoint(model_dir, trainer.model(), {data.vocab.chars(), trainer.step()});
            std::ofstream(model_dir / "corpus.txt")
                << (opts.data.empty() ? std::string("tiny shakespeare") : corpus.filename().string()) << "\n";
        }

        print_heading("Resuming reproduces the losses exactly");
        //! [resume]
        const fs::path checkpoint = fs::temp_directory_path() /
                                    ("attn_lesson11_checkpoint_" + std::to_string(::getpid()));
        trainer.save(checkpoint);
        Trainer resumed = Trainer::load(checkpoint, data);
        trainer.set_max_iters(trainer.step() + 5);
        resumed.set_max_iters(resumed.step() + 5);
        //! [resume]
        bool identical = true;
        for (int i = 0; i < 5; ++i) {
            const StepRecord a = trainer.train_step(), b = resumed.train_step();
            identical = identical && a.loss == b.loss;
            std::printf("step %lld: went on %.7f   reloaded %.7f\n", static_cast<long long>(a.step),
                        static_cast<double>(a.loss), static_cast<double>(b.loss));
        }
        fs::remove_all(checkpoint);
        std::printf("bit for bit identical: %s\n", identical ? "yes" : "NO");

        print_heading("Samples");
        //! [sample]
        SampleOptions sample;
        sample.max_new_tokens = 300;
        sample.temperature = 0.8f;
        const std::string text = generate_text(resumed.model(), data.vocab, "", sample);
        //! [sample]
        const std::string prompt = fitting_prompt(data.vocab, "ROMEO:", data.val);  // any corpus
        std::cout << "temperature 0.8, all characters:\n" << text << "\n\n";
        sample.max_new_tokens = 150;
        sample.temperature = 1.0f;
        sample.top_k = 1;
        std::cout << "top-k 1 (always the most likely character):\n"
                  << generate_text(resumed.model(), data.vocab, prompt, sample) << "\n\n";
        sample.temperature = 2.0f;
        sample.top_k = 0;
        std::cout << "temperature 2.0 (flattened: nearly random characters):\n"
                  << generate_text(resumed.model(), data.vocab, prompt, sample) << "\n";

        print_heading("What did it learn: every head on one line of the validation text");
        GPT& model = resumed.model();
        const int L = model.config().n_layer, NH = model.config().n_head, T = static_cast<int>(line.size());
        std::vector<std::string> chars;
        for (int id : line) chars.push_back(label(data.vocab.at(id)));
        std::string shown;
        for (int id : line) shown += data.vocab.at(id) == "\n" ? "" : data.vocab.at(id);
        std::printf("the line (%d characters with its newline): \"%s\"\n", T, shown.c_str());
        //! [inspect]
        model.train(false);
        model.forward(line, {}, 1, T);
        std::vector<Tensor2> maps;      // L·NH weight matrices (T, T)
        std::vector<std::string> titles;
        std::vector<Tensor1> entropy_trained, previous;  // (L, NH)
        for (int l = 0; l < L; ++l) {
            const Tensor4 w = attention_weights(model, l);  // (1, NH, T, T)
            entropy_trained.push_back(mean_entropy_per_head(w));
            previous.push_back(previous_token_weight(w));  // mean w[i, i-1]
            for (int h = 0; h < NH; ++h) {
                maps.push_back(xt::view(w, 0, h));
                titles.push_back("layer " + std::to_string(l) + " head " + std::to_string(h));
            }
        }
        //! [inspect]
        if (!opts.figures.empty()) {
            heatmap_grid_png(opts.figures / "lesson11_heads.png", maps, titles, chars, chars,
                             static_cast<std::size_t>(NH));
        }

        //! [ablate]
        // Switch each head off in turn and measure the validation loss on fixed windows.
        constexpr int windows = 10;
        const double base = fixed_val_loss(model, data.val, 12, config.block_size, windows);
        const std::vector<float> weights = model.parameters();  // to put each head back
        std::vector<std::vector<double>> delta(static_cast<std::size_t>(L));
        for (int l = 0; l < L; ++l)
            for (int h = 0; h < NH; ++h) {
                zero_head(model, l, h);
                delta[l].push_back(fixed_val_loss(model, data.val, 12, config.block_size, windows) - base);
                model.parameters() = weights;
            }
        //! [ablate]

        const double uniform = uniform_causal_entropy(static_cast<std::size_t>(T));
        std::printf("entropy in nats (uniform over the visible characters: %.2f); weight on the previous\n"
                    "character; change of the validation loss (%.4f on %d batches) with the head switched off\n\n"
                    "layer head   entropy at init   trained   previous char   val loss change\n",
                    uniform, base, windows);
        int best_l = 0, best_h = 0, worst_l = 0, worst_h = 0;
        double init_mean = 0, trained_mean = 0;
        for (int l = 0; l < L; ++l)
            for (int h = 0; h < NH; ++h) {
                std::printf("%5d %4d   %15.2f   %7.2f   %13.2f   %+15.4f\n", l, h,
                            static_cast<double>(entropy_at_init[l](h)), static_cast<double>(entropy_trained[l](h)),
                            static_cast<double>(previous[l](h)), delta[l][static_cast<std::size_t>(h)]);
                init_mean += entropy_at_init[l](h) / double(L * NH);
                trained_mean += entropy_trained[l](h) / double(L * NH);
                if (previous[l](h) > previous[best_l](best_h)) best_l = l, best_h = h;
                if (delta[l][static_cast<std::size_t>(h)] > delta[worst_l][static_cast<std::size_t>(worst_h)])
                    worst_l = l, worst_h = h;
            }
        print_claim("line_length", std::to_string(T));
        print_claim("entropy_uniform", uniform, 2);
        print_claim("entropy_init_mean", init_mean, 2);
        print_claim("entropy_trained_mean", trained_mean, 2);
        print_claim("previous_token_head", "layer " + std::to_string(best_l) + ", head " + std::to_string(best_h));
        print_claim("previous_token_weight", previous[best_l](best_h), 2);
        double previous_if_uniform = 0.0;  // mean over i ≥ 1 of 1/(i+1): weights spread evenly
        for (int i = 1; i < T; ++i) previous_if_uniform += 1.0 / (i + 1) / (T - 1);
        print_claim("previous_token_uniform", previous_if_uniform, 2);
        print_claim("ablation_base", base, 3);
        print_claim("ablation_worst_head", "layer " + std::to_string(worst_l) + ", head " + std::to_string(worst_h));
        print_claim("ablation_worst_delta", delta[worst_l][static_cast<std::size_t>(worst_h)], 3);

        print_heading("Looking for induction heads: a passage and its repeat");
        //! [induction]
        // 16 passages of 32 validation characters, each followed by itself: a head that
        // completes repeats attends, in the second copy, to the character after the earlier
        // occurrence of the current one, w[t, t − 31], and the second copy's loss collapses.
        const int repeat = config.block_size / 2;
        const InductionProbe induction = probe_induction(model, data.val, 16, repeat);
        //! [induction]
        double induction_uniform = 0.0;  // even spreading over the t + 1 visible characters
        for (int t = repeat; t < 2 * repeat; ++t) induction_uniform += 1.0 / (t + 1) / repeat;
        int ind_l = 0, ind_h = 0;
        std::printf("weight on the character after the earlier occurrence, mean over the second copy\n"
                    "(even spreading: %.3f)\n", induction_uniform);
        for (int l = 0; l < L; ++l) {
            std::printf("layer %d:", l);
            for (int h = 0; h < NH; ++h) {
                std::printf("  head %d %.3f", h, static_cast<double>(induction.score[l](h)));
                if (induction.score[l](h) > induction.score[ind_l](ind_h)) ind_l = l, ind_h = h;
            }
            std::printf("\n");
        }
        std::printf("loss on the first copy %.3f, on the repeat %.3f\n", induction.loss_first,
                    induction.loss_second);
        // Called an induction head here when it puts most of its weight there and the repeat
        // is predicted far better than the first copy; the words the page prints follow.
        const bool found = induction.score[ind_l](ind_h) > 0.5 &&
                           induction.loss_second < 0.5 * induction.loss_first;
        const std::string best = "layer " + std::to_string(ind_l) + ", head " + std::to_string(ind_h);
        print_claim("induction_found", found ? "the model has one: " + best : "no head is one");
        print_claim("induction_best_head", best);
        print_claim("induction_best_score", induction.score[ind_l](ind_h), 3);
        print_claim("induction_uniform", induction_uniform, 3);
        print_claim("induction_loss_first", induction.loss_first, 2);
        print_claim("induction_loss_second", induction.loss_second, 2);
        print_claim("induction_repeat", std::to_string(repeat));
        print_claim("tokens_seen", std::to_string(static_cast<long long>(tokens)));
    }, LessonText::corpus);
}
