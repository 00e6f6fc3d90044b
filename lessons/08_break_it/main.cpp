// Lesson 08: break it. The page that narrates this program is lesson.md beside it.
#include "attn/data.hpp"
#include "attn/entropy.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/multi_head.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"
#include "attn/sdpa.hpp"
#include "attn/trainer.hpp"

#include <xtensor/xview.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
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

        Tensor2 head0_scaled = xt::view(w_scaled, 0, 0), head0_unscaled = xt::view(w_unscaled, 0, 0);
        std::cout << "\nhead 0 weights, scaled:\n" << format_tensor(head0_scaled, {3})
                  << "\nhead 0 weights, unscaled:\n" << format_tensor(head0_unscaled, {3}) << "\n"
                  << "scaled\n" << heatmap_text(head0_scaled, tokens, tokens)
                  << "unscaled\n" << heatmap_text(head0_unscaled, tokens, tokens);
        if (!options.figures.empty()) {
            heatmap_grid_png(options.figures / "lesson08_scaling.png", {head0_scaled, head0_unscaled},
                             {"head 0, scores / sqrt(64)", "head 0, raw scores"}, tokens, tokens, 2);
        }

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
        for (std::size_t h = 0; h < 4; ++h) {
            double masked_future = 0.0, unmasked_future = 0.0;
            for (std::size_t i = 0; i < T; ++i)
                for (std::size_t j = i + 1; j < T; ++j) {
                    masked_future += w_masked(0, h, i, j);
                    unmasked_future += w_unmasked(0, h, i, j);
                }
            std::printf("head %zu   with mask %.3f   without mask %.3f\n", h, masked_future / T,
                        unmasked_future / T);
        }
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
        const TextDataset data = make_dataset(read_corpus(find_corpus(&std::cout)));
        //! [cheat]
        TrainConfig recipe = TrainConfig::named("cpu");
        recipe.max_iters = 300;
        recipe.lr_decay_iters = 300;
        SampleOptions sample;
        sample.max_new_tokens = 160;
        sample.top_k = 10;
        for (const bool causal : {true, false}) {
            recipe.causal = causal;
            Trainer trainer(recipe, data);
            while (!trainer.done()) trainer.train_step();
            const EvalRecord e = trainer.evaluate();  // teacher-forced: the future is in the batch
            trainer.model().train(false);
            const std::string text = generate_text(trainer.model(), data.vocab, "\n", sample);
            std::printf("%s: train loss %.3f, val loss %.3f after %lld steps\n",
                        causal ? "with the causal mask   " : "WITHOUT the causal mask", e.train_loss,
                        e.val_loss, static_cast<long long>(trainer.step()));
            std::cout << "  generated:" << text << "\n\n";
        }
        //! [cheat]
    });
}
