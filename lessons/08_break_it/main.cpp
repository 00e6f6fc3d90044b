// Lesson 08: break it. The page that narrates this program is lesson.md beside it.
#include "attn/data.hpp"
#include "attn/entropy.hpp"
#include "attn/gpt_inspect.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/multi_head.hpp"
#include "attn/print.hpp"
#include "attn/run_control.hpp"
#include "attn/random.hpp"
#include "attn/sdpa.hpp"
#include "attn/trainer.hpp"

#include <xtensor/xview.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

using namespace attn;

namespace {

// The standard deviation and the largest magnitude of all the numbers in t.
template <std::size_t N>
std::pair<double, double> spread(const Tensor<N>& t) {
    const double mean = xt::mean(t)();
    double sq = 0.0, largest = 0.0;
    for (float x : t) {
        sq += (x - mean) * (x - mean);
        largest = std::max(largest, static_cast<double>(std::fabs(x)));
    }
    return {std::sqrt(sq / static_cast<double>(t.size())), largest};
}

// The raw scores q·kᵀ of every head, before any scaling: (B, NH, T, T).
Tensor4 raw_scores(const Tensor4& q, const Tensor4& k) {
    // Summed in double: these are the numbers to look at, not the ones attention uses.
    Tensor4 s({q.shape()[0], q.shape()[1], q.shape()[2], k.shape()[2]});
    for (std::size_t b = 0; b < q.shape()[0]; ++b)
        for (std::size_t h = 0; h < q.shape()[1]; ++h)
            for (std::size_t i = 0; i < q.shape()[2]; ++i)
                for (std::size_t j = 0; j < k.shape()[2]; ++j) {
                    double dot = 0.0;
                    for (std::size_t c = 0; c < q.shape()[3]; ++c) dot += q(b, h, i, c) * k(b, h, j, c);
                    s(b, h, i, j) = static_cast<float>(dot);
                }
    return s;
}

// A whole number from the environment, or `fallback` when the variable is not set.
int from_environment(const char* name, int fallback, int smallest) {
    const char* value = std::getenv(name);
    if (!value) return fallback;
    const int n = std::atoi(value);
    if (n < smallest) {
        throw std::invalid_argument(std::string(name) + " must be a whole number of at least " +
                                    std::to_string(smallest) + ", got '" + value + "'");
    }
    std::printf("(%s=%d)\n", name, n);
    return n;
}

// What a trained model's attention looks like on one batch: the root mean square of the
// scores that enter the softmax (q·kᵀ/√hs, or q·kᵀ without the scale) and the mean entropy,
// over every layer and head.
std::pair<double, double> score_rms_and_entropy(GPT& model, const std::vector<int>& x, int B, int T) {
    model.train(false);
    model.forward(x, {}, B, T);
    const GPTConfig& c = model.config();
    const double scale = c.scaled_attention ? 1.0 / std::sqrt(double(c.n_embd / c.n_head)) : 1.0;
    double sum2 = 0.0, entropy = 0.0;
    std::size_t n = 0;
    for (int l = 0; l < c.n_layer; ++l) {
        const Tensor4 q = attention_queries_or_keys(model, l, 0), k = attention_queries_or_keys(model, l, 1);
        const Tensor4 s = raw_scores(q, k);  // (B, NH, T, T)
        for (std::size_t b = 0; b < s.shape()[0]; ++b)
            for (std::size_t h = 0; h < s.shape()[1]; ++h)
                for (std::size_t i = 0; i < s.shape()[2]; ++i)
                    for (std::size_t j = 0; j <= i; ++j, ++n) sum2 += std::pow(scale * s(b, h, i, j), 2);
        entropy += xt::mean(mean_entropy_per_head(attention_weights(model, l)))() / c.n_layer;
    }
    return {std::sqrt(sum2 / double(n)), entropy};
}

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Whether two tensors hold the same bits (not merely equal values).
template <class A, class B>
bool bit_identical(const A& a, const B& b) {
    const Tensor2 x = a, y = b;
    return x.shape() == y.shape() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 08: break it", [](const LessonOptions& options) {
        Rng rng(808);
        const std::vector<std::string> tokens = {"the", "cat", "sat", "on", "the", "mat", "and", "slept"};
        constexpr std::size_t T = 8;
        const double uniform = uniform_causal_entropy(T);

        print_heading("(a) Remove the scaling: 4 heads of size 64");
        //! [unscaled]
        constexpr std::size_t NH = 4, hs = 64;
        Tensor4 q = rng.normal_tensor<4>({1, NH, T, hs});  // unit-variance entries
        Tensor4 k = rng.normal_tensor<4>({1, NH, T, hs});
        Tensor4 v = rng.normal_tensor<4>({1, NH, T, hs});
        Tensor4 w_scaled, w_unscaled;  // (1, NH, T, T)
        scaled_dot_product_attention(q, k, v, causal_mask(T), &w_scaled);  // × 1/√64
        scaled_dot_product_attention(q, k, v, causal_mask(T), &w_unscaled, 1.0f);  // × 1
        //! [unscaled]
        const Tensor4 scores = raw_scores(q, k);
        const auto [raw_std, raw_max] = spread(scores);
        std::printf("raw scores q.k:       std %6.2f   largest |score| %6.2f   (std about sqrt(64) = 8)\n",
                    raw_std, raw_max);
        std::printf("scaled scores q.k/8:  std %6.2f   largest |score| %6.2f\n", raw_std / 8,
                    raw_max / 8);
        print_claim("raw_score_std", raw_std, 1);

        Tensor2 head0_scaled = xt::view(w_scaled, 0, 0), head0_unscaled = xt::view(w_unscaled, 0, 0);
        std::cout << "\nhead 0 weights, scaled:\n" << format_tensor(head0_scaled, {3})
                  << "\nhead 0 weights, unscaled:\n" << format_tensor(head0_unscaled, {3}) << "\n"
                  << "scaled\n" << heatmap_text(head0_scaled, tokens, tokens)
                  << "unscaled\n" << heatmap_text(head0_unscaled, tokens, tokens);
        if (!options.figures.empty()) {
            heatmap_grid_png(options.figures / "lesson08_scaling.png", {head0_scaled, head0_unscaled},
                             {"head 0, scores / sqrt(64)", "head 0, raw scores"}, tokens, tokens, 2);
        }

        int saturated_rows = 0;  // rows of head 0 with 0.98 or more on one token, unscaled
        for (std::size_t i = 0; i < T; ++i) saturated_rows += xt::amax(xt::view(head0_unscaled, i))() >= 0.98f;
        print_claim("saturated_rows", std::to_string(saturated_rows));
        //! [entropy]
        const Tensor1 h_scaled = mean_entropy_per_head(w_scaled);      // (NH), nats
        const Tensor1 h_unscaled = mean_entropy_per_head(w_unscaled);  // (NH)
        //! [entropy]
        std::printf("\nmean entropy per head (nats); uniform attention would give %.3f\n", uniform);
        for (std::size_t h = 0; h < NH; ++h) {
            std::printf("head %zu  scaled   %.3f  %s\n", h, static_cast<double>(h_scaled(h)),
                        entropy_bar(h_scaled(h), uniform).c_str());
            std::printf("        unscaled %.3f  %s\n", static_cast<double>(h_unscaled(h)),
                        entropy_bar(h_unscaled(h), uniform).c_str());
        }

        print_claim("entropy_scaled_mean", xt::mean(h_scaled)(), 2);
        print_claim("entropy_unscaled_mean", xt::mean(h_unscaled)(), 2);
        print_claim("entropy_uniform", uniform, 2);
        std::printf("\nthe larger the head, the worse (mean over 4 heads, fresh q, k, v each):\n"
                    "   hs   raw score std   entropy scaled   entropy unscaled\n");
        //! [sizes]
        for (std::size_t size : {4, 16, 64, 256}) {
            Tensor4 qs = rng.normal_tensor<4>({1, NH, T, size});
            Tensor4 ks = rng.normal_tensor<4>({1, NH, T, size});
            Tensor4 vs = rng.normal_tensor<4>({1, NH, T, size});
            Tensor4 ws, wu;
            scaled_dot_product_attention(qs, ks, vs, causal_mask(T), &ws);
            scaled_dot_product_attention(qs, ks, vs, causal_mask(T), &wu, 1.0f);
            const double h_s = xt::mean(mean_entropy_per_head(ws))();
            const double h_u = xt::mean(mean_entropy_per_head(wu))();
            std::printf("  %3zu   %13.2f   %14.3f   %16.3f\n", size,
                        spread(raw_scores(qs, ks)).first, h_s, h_u);
        }
        //! [sizes]

        print_heading("(b) Remove the causal mask: the future leaks into the past");
        //! [setup_mask]
        constexpr std::size_t C = 32;
        Tensor3 x = rng.normal_tensor<3>({1, T, C});  // (B, T, C)
        const float std_w = 1.0f / std::sqrt(static_cast<float>(C));
        Linear c_attn(rng.normal_tensor<2>({3 * C, C}, 0.0f, std_w));  // (3C, C)
        Linear c_proj(rng.normal_tensor<2>({C, C}, 0.0f, std_w));      // (C, C)
        MultiHeadAttention masked(c_attn, c_proj, 4);
        MultiHeadAttention unmasked = masked;  // the same weights
        unmasked.causal = false;               // the only difference
        //! [setup_mask]
        Tensor4 w_masked, w_unmasked;
        const Tensor3 y_masked = masked.forward(x, &w_masked);
        const Tensor3 y_unmasked = unmasked.forward(x, &w_unmasked);
        std::printf("share of each row's weight that lands on future tokens (mean over rows):\n");
        double future_min = 1.0, future_max = 0.0;
        for (std::size_t h = 0; h < 4; ++h) {
            double masked_future = 0.0, unmasked_future = 0.0;
            for (std::size_t i = 0; i < T; ++i)
                for (std::size_t j = i + 1; j < T; ++j) {
                    masked_future += w_masked(0, h, i, j);
                    unmasked_future += w_unmasked(0, h, i, j);
                }
            std::printf("head %zu   with mask %.3f   without mask %.3f\n", h, masked_future / T,
                        unmasked_future / T);
            future_min = std::min(future_min, unmasked_future / T);
            future_max = std::max(future_max, unmasked_future / T);
        }
        print_claim("future_share_min", future_min, 2);
        print_claim("future_share_max", future_max, 2);
        Tensor2 head0_unmasked = xt::view(w_unmasked, 0, 0);
        std::cout << "\nhead 0 without the mask: weight above the diagonal\n"
                  << heatmap_text(head0_unmasked, tokens, tokens);
        if (!options.figures.empty()) {
            heatmap_grid_png(options.figures / "lesson08_mask.png",
                             {Tensor2(xt::view(w_masked, 0, 0)), head0_unmasked},
                             {"head 0, causal mask", "head 0, no mask"}, tokens, tokens, 2);
        }

        std::printf("\nthe experiment: replace token 5 and compare the outputs at positions 0..4\n");
        //! [leak]
        Tensor3 x_changed = x;
        xt::view(x_changed, 0, 5) = rng.normal_tensor<1>({C});  // a different token 5
        const Tensor3 y_masked_changed = masked.forward(x_changed);
        const Tensor3 y_unmasked_changed = unmasked.forward(x_changed);
        const auto earlier = [](const Tensor3& y) {  // positions 0..4: (5, C)
            return Tensor2(xt::view(y, 0, xt::range(0, 5)));
        };
        //! [leak]
        std::printf("with the mask:    largest change at positions 0..4 = %g, bit-identical: %s\n",
                    static_cast<double>(xt::amax(xt::abs(earlier(y_masked_changed) - earlier(y_masked)))()),
                    bit_identical(earlier(y_masked_changed), earlier(y_masked)) ? "yes" : "no");
        std::printf("without the mask: largest change at positions 0..4 = %.4f, bit-identical: %s\n",
                    static_cast<double>(xt::amax(xt::abs(earlier(y_unmasked_changed) - earlier(y_unmasked)))()),
                    bit_identical(earlier(y_unmasked_changed), earlier(y_unmasked)) ? "yes" : "no");
        for (std::size_t t = 0; t < 5; ++t) {
            std::printf("  position %zu (%-3s)  change without the mask: %.4f\n", t, tokens[t].c_str(),
                        static_cast<double>(xt::amax(xt::abs(xt::view(y_unmasked_changed, 0, t) -
                                                             xt::view(y_unmasked, 0, t)))()));
        }

        print_heading("(c) Train a model without the mask: it learns to cheat");
        // Lesson 11's CPU recipe for 300 steps, once with the causal mask and once without:
        // same seed, same batches, same everything else.
        const TextDataset data = make_dataset(read_corpus(options.corpus()));  // or --data FILE
        //! [cheat]
        TrainConfig recipe = TrainConfig::named("cpu");
        recipe.shorten_to(300);
        if (options.quick) recipe.make_quick();
        SampleOptions sample;
        sample.max_new_tokens = 160;
        sample.top_k = 10;
        const std::string prompt = fitting_prompt(data.vocab, "\n", data.val);  // a newline, if the text has one
        double val_loss[2] = {0.0, 0.0};  // with the mask, without it
        for (const bool causal : {true, false}) {
            recipe.causal = causal;
            Trainer trainer(recipe, data);
            while (!trainer.done()) trainer.train_step();
            const EvalRecord e = trainer.evaluate();  // teacher-forced: the future is in the batch
            trainer.model().train(false);
            const std::string text = generate_text(trainer.model(), data.vocab, prompt, sample);
            std::printf("%s: train loss %.3f, val loss %.3f after %lld steps\n",
                        causal ? "with the causal mask   " : "WITHOUT the causal mask", e.train_loss,
                        e.val_loss, static_cast<long long>(trainer.step()));
            std::cout << "  generated:" << text << "\n\n";
            print_claim(causal ? "honest_val" : "cheater_val", e.val_loss, 2);
            val_loss[causal ? 0 : 1] = e.val_loss;
        }
        //! [cheat]
        std::printf("the cheater's val loss is %.2f nats lower; knowing nothing would score ln %zu = %.2f\n",
                    val_loss[0] - val_loss[1], data.vocab.size(), std::log(static_cast<double>(data.vocab.size())));
        print_claim("cheat_steps", std::to_string(recipe.max_iters));
        print_claim("cheater_advantage", val_loss[0] - val_loss[1], 2);
        print_claim("vocab", std::to_string(data.vocab.size()));
        print_claim("ln_vocab", std::log(static_cast<double>(data.vocab.size())), 2);

        print_heading("(d) Train a model without the scaling");
        // Lesson 11's CPU recipe (hs = 32), with and without the 1/√hs, several seeds: same
        // seed, same initial weights and batches within a pair. The environment variables make
        // the run longer, e.g. ATTN_LESSON08_STEPS=1000 ATTN_LESSON08_SEEDS=3.
        const int steps = from_environment("ATTN_LESSON08_STEPS", options.quick ? 3 : 150, 1);
        const int seeds = from_environment("ATTN_LESSON08_SEEDS", options.quick ? 1 : 2, 1);
        std::vector<int> probe(4 * 64), targets(probe.size());  // 4 validation windows
        for (std::size_t b = 0; b < 4; ++b) {  // spread over the split (the trainer made sure it holds 65)
            const std::size_t start = b * ((data.val.size() - 65) / 4);
            token_window(data.val, start, 64, probe.data() + b * 64, targets.data() + b * 64,
                         "the validation split");
        }
        std::printf("%d steps each; val loss, and on 4 validation windows the rms of the scores that\n"
                    "enter the softmax and the mean attention entropy (uniform: %.2f nats)\n\n"
                    "seed   with 1/sqrt(hs): val   score rms   entropy   without: val   score rms   entropy\n",
                    steps, uniform_causal_entropy(64));
        double init_rms[2] = {0.0, 0.0};  // the scores' spread at step 0, with and without
        int unscaled_better = 0;
        double sum_difference = 0.0, mean_rms[2] = {0.0, 0.0}, mean_entropy[2] = {0.0, 0.0};
        double step_seconds = 0.0, other_seconds = 0.0;  // the training steps; the rest of each run
        for (int s = 0; s < seeds; ++s) {
            double val[2], rms[2], entropy[2];
            for (const bool scaled : {true, false}) {
                //! [unscaled_training]
                TrainConfig config = TrainConfig::named("cpu");
                config.shorten_to(steps);
                config.seed = 1337 + static_cast<std::uint64_t>(s);
                config.scaled_attention = scaled;  // false: scores q·kᵀ, no 1/√hs
                if (options.quick) config.make_quick();
                const auto run_start = std::chrono::steady_clock::now();
                Trainer trainer(config, data);
                if (s == 0) init_rms[scaled ? 0 : 1] = score_rms_and_entropy(trainer.model(), probe, 4, 64).first;
                trainer.model().train(true);
                const auto steps_start = std::chrono::steady_clock::now();
                while (!trainer.done()) trainer.train_step();
                const double steps_took = seconds_since(steps_start);
                const EvalRecord e = trainer.evaluate();
                //! [unscaled_training]
                step_seconds += steps_took;
                other_seconds += seconds_since(run_start) - steps_took;
                val[scaled ? 0 : 1] = e.val_loss;
                std::tie(rms[scaled ? 0 : 1], entropy[scaled ? 0 : 1]) =
                    score_rms_and_entropy(trainer.model(), probe, 4, 64);
            }
            std::printf("%4d   %20.3f   %9.2f   %7.2f   %12.3f   %9.2f   %7.2f\n", 1337 + s, val[0], rms[0],
                        entropy[0], val[1], rms[1], entropy[1]);
            for (int i = 0; i < 2; ++i) {
                mean_rms[i] += rms[i] / seeds;
                mean_entropy[i] += entropy[i] / seeds;
            }
            unscaled_better += val[1] < val[0];
            sum_difference += val[1] - val[0];
        }
        const double mean_difference = sum_difference / seeds;
        std::printf("\nat step 0 (seed 1337) the scores that enter the softmax have rms %.3f with the\n"
                    "scale and %.3f without it\n", init_rms[0], init_rms[1]);
        print_claim("init_score_rms_scaled", init_rms[0], 2);
        print_claim("init_score_rms_unscaled", init_rms[1], 2);
        std::printf("\nwithout the scale the val loss is lower in %d of %d seeds; mean difference %+.3f\n",
                    unscaled_better, seeds, mean_difference);
        print_claim("unscaled_steps", std::to_string(steps));
        print_claim("unscaled_seeds", std::to_string(seeds));
        print_claim("unscaled_lower_in", std::to_string(unscaled_better) + " of " + std::to_string(seeds));
        print_claim("unscaled_mean_difference", mean_difference, 3);
        print_claim("trained_rms_scaled", mean_rms[0], 2);
        print_claim("trained_rms_unscaled", mean_rms[1], 2);
        print_claim("trained_entropy_scaled", mean_entropy[0], 2);
        print_claim("trained_entropy_unscaled", mean_entropy[1], 2);
        print_claim("trained_entropy_uniform", uniform_causal_entropy(64), 2);

        // What the longer experiment the page suggests would take here, from these runs: each
        // of its runs takes 1000 steps at the measured time per step, plus the rest of a run
        // (building the trainer, the evaluation) as measured.
        const int runs = 2 * seeds;
        const double per_step = step_seconds / (runs * steps), per_run_rest = other_seconds / runs;
        const double longer = 6 * (1000 * per_step + per_run_rest);  // 2 × 3 seeds of 1000 steps
        std::printf("\nthese %d runs took %.1f ms per training step and %.1f s each besides; at that\n"
                    "speed the longer experiment (3 seeds, 1000 steps) would take %s\n",
                    runs, 1e3 * per_step, per_run_rest, format_duration(longer).c_str());
        print_claim("ms_per_step", 1e3 * per_step, 1);
        print_claim("longer_experiment", format_duration(longer));
    }, LessonText::corpus);
}
