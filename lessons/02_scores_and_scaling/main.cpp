// Lesson 02: scores and scaling. The page that narrates this program is lesson.md beside it.
#include "attn/attention.hpp"
#include "attn/entropy.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_inspect.hpp"
#include "attn/lesson.hpp"
#include "attn/linalg.hpp"
#include "attn/linear.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"
#include "attn/trainer.hpp"

#include <xtensor/xview.hpp>

#include <cmath>
#include <cstdio>
#include <functional>
#include <iostream>
#include <stdexcept>
#include <vector>

using namespace attn;

namespace {

// The population standard deviation of every entry of t.
double standard_deviation(const Tensor3& t) {
    double sum = 0, sum2 = 0;
    for (float v : t) sum += v, sum2 += double(v) * v;
    const double n = double(t.size()), mean = sum / n;
    return std::sqrt(sum2 / n - mean * mean);
}

// The root mean square of every entry of t.
double rms(const Tensor4& t) {
    double sum2 = 0;
    for (float v : t) sum2 += double(v) * v;
    return std::sqrt(sum2 / double(t.size()));
}

// The root mean square of the raw scores q_i · k_j over the pairs a causal head uses (j ≤ i).
double rms_causal_scores(const Tensor4& q, const Tensor4& k) {
    double sum2 = 0;
    std::size_t n = 0;
    const auto& s = q.shape();  // (B, NH, T, hs)
    for (std::size_t b = 0; b < s[0]; ++b)
        for (std::size_t h = 0; h < s[1]; ++h)
            for (std::size_t i = 0; i < s[2]; ++i)
                for (std::size_t j = 0; j <= i; ++j, ++n) {
                    double dot = 0;
                    for (std::size_t c = 0; c < s[3]; ++c) dot += double(q(b, h, i, c)) * k(b, h, j, c);
                    sum2 += dot * dot;
                }
    return std::sqrt(sum2 / double(n));
}

// A probability printed so that tiny ones stay readable: 0.2447 or 1.1e-07.
std::string probability(float p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, p >= 1e-3f ? "%.4f" : "%.1e", static_cast<double>(p));
    return buf;
}

std::string distribution(const Tensor1& p) {
    std::string s = "(";
    for (std::size_t i = 0; i < p.size(); ++i) s += (i ? ", " : "") + probability(p(i));
    return s + ")";
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 02: scores and scaling", [](const LessonOptions&) {
        //! [setup]
        constexpr std::size_t B = 4, T = 8, C = 32, hs = 16;
        Rng rng(1337);
        Tensor3 x = rng.normal_tensor<3>({B, T, C});  // (B, T, C)
        Linear query(C, hs, /*bias=*/false, rng);     // W_q (hs, C)
        Linear key(C, hs, /*bias=*/false, rng);       // W_k (hs, C)
        Tensor3 q = query.forward(x);                 // (B, T, hs)
        Tensor3 k = key.forward(x);                   // (B, T, hs)
        //! [setup]

        print_heading("QKᵀ: transpose the last two axes of K, keep the batch axis first");
        //! [transpose]
        Tensor3 kt = transpose_last_two(k);         // (B, hs, T): k.transpose(-2, -1)
        Tensor3 scores = batched_matmul(q, kt);     // (B, T, T): scores[b][i][j] = q_bi · k_bj
        //! [transpose]
        std::cout << "q        " << shape_of(q) << "    (B, T, hs)\n"
                  << "kᵀ       " << shape_of(kt) << "    (B, hs, T)\n"
                  << "q · kᵀ   " << shape_of(scores) << "     (B, T, T)\n";
        Tensor2 s0 = xt::view(scores, 0, xt::range(0, 4), xt::range(0, 4));
        std::cout << "scores of sequence 0, first 4 tokens:\n" << format_tensor(s0, {2});
        const Tensor3 direct = dot_product_scores(q, k);
        std::printf("largest |q·kᵀ - dot_product_scores(q, k)| = %.2g\n",
                    static_cast<double>(xt::amax(xt::abs(scores - direct))()));

        print_heading("Swapping the batch axis in: an error if you are lucky");
        //! [wrong_transpose]
        Tensor3 k_reversed = xt::transpose(k);      // (hs, T, B): every axis reversed, like k.T
        //! [wrong_transpose]
        std::cout << "all axes reversed: " << shape_of(k_reversed) << "   (hs, T, B)\n";
        try {
            batched_matmul(q, k_reversed);
            std::cout << "no error?\n";
        } catch (const std::invalid_argument& e) {
            std::cout << "error: " << e.what() << "\n";
        }

        print_heading("... and silent mixing of sequences when the sizes happen to agree");
        //! [silent]
        constexpr std::size_t n = 4;                // B = T = hs = 4: every product fits
        Tensor3 qs = rng.normal_tensor<3>({n, n, n}), ks = rng.normal_tensor<3>({n, n, n});
        Tensor3 right = batched_matmul(qs, transpose_last_two(ks));
        Tensor3 wrong = batched_matmul(qs, Tensor3(xt::transpose(ks)));
        Tensor3 ks_changed = ks;
        xt::view(ks_changed, 3) += 1.0f;            // change the keys of sequence 3 only
        Tensor3 right_after = batched_matmul(qs, transpose_last_two(ks_changed));
        Tensor3 wrong_after = batched_matmul(qs, Tensor3(xt::transpose(ks_changed)));
        //! [silent]
        std::printf("largest |wrong - right| = %.3f   (no error, different numbers)\n",
                    static_cast<double>(xt::amax(xt::abs(wrong - right))()));
        const auto change_in_sequence_0 = [](const Tensor3& before, const Tensor3& after) {
            return static_cast<double>(
                xt::amax(xt::abs(xt::view(after, 0) - xt::view(before, 0)))());
        };
        std::printf("change the keys of sequence 3 only; sequence 0's scores move by:\n"
                    "  right transpose  %.3f   (sequences stay apart)\n"
                    "  wrong transpose  %.3f   (sequence 0 reads sequence 3's keys)\n",
                    change_in_sequence_0(right, right_after),
                    change_in_sequence_0(wrong, wrong_after));

        print_heading("Score spread grows like √hs; dividing by √hs brings it back to 1");
        std::cout << "   hs    std(q·kᵀ)    √hs    std(q·kᵀ/√hs)\n";
        for (std::size_t size : {16, 64, 256}) {
            //! [std]
            // Queries and keys with unit-variance entries, as a well-initialised layer gives.
            Tensor3 qn = rng.normal_tensor<3>({4, 64, size});  // (B, T, hs)
            Tensor3 kn = rng.normal_tensor<3>({4, 64, size});  // (B, T, hs)
            const double raw = standard_deviation(dot_product_scores(qn, kn));
            const double scaled = standard_deviation(attention_scores(qn, kn));
            //! [std]
            std::printf("%5zu    %9.3f    %5.1f    %13.3f\n", size, raw,
                        std::sqrt(static_cast<double>(size)), scaled);
        }

        print_heading("The course's own GPT at initialisation: q and k are far from unit variance");
        std::vector<std::function<void()>> claims;  // printed after the table
        std::cout << "recipe        hs   rms q_c   rms k_c   rms q·k   entropy scaled / unscaled   uniform\n";
        for (const char* recipe : {"cpu", "shakespeare"}) {
            //! [course_init]
            // The GPT of lessons 09-12 as initialised for a recipe, on random tokens: every
            // layer's q and k (after a LayerNorm and N(0, 0.02²) weights), and the attention
            // entropy with the scale and, same weights, without it.
            GPTConfig config = TrainConfig::named(recipe).model_config(65);
            const int Bq = 2, Tq = config.block_size, hs_model = config.n_embd / config.n_head;
            std::vector<int> tokens(static_cast<std::size_t>(Bq * Tq));
            for (int& t : tokens) t = static_cast<int>(rng.below(65));
            GPT model(config, 1337);
            config.scaled_attention = false;
            GPT unscaled(config, 1337);  // the same weights: only the 1/√hs is gone
            model.forward(tokens, {}, Bq, Tq);
            unscaled.forward(tokens, {}, Bq, Tq);
            double q_ms = 0, k_ms = 0, qk_ms = 0, h_scaled = 0, h_unscaled = 0;
            for (int l = 0; l < config.n_layer; ++l) {
                const Tensor4 q_l = attention_queries_or_keys(model, l, 0);  // (B, NH, T, hs)
                const Tensor4 k_l = attention_queries_or_keys(model, l, 1);  // (B, NH, T, hs)
                q_ms += rms(q_l) * rms(q_l) / config.n_layer;
                k_ms += rms(k_l) * rms(k_l) / config.n_layer;
                qk_ms += std::pow(rms_causal_scores(q_l, k_l), 2) / config.n_layer;
                h_scaled += xt::mean(mean_entropy_per_head(attention_weights(model, l)))() / config.n_layer;
                h_unscaled += xt::mean(mean_entropy_per_head(attention_weights(unscaled, l)))() / config.n_layer;
            }
            //! [course_init]
            const double uniform = uniform_causal_entropy(static_cast<std::size_t>(Tq));
            std::printf("%-12s %3d   %7.3f   %7.3f   %7.3f   %7.3f / %.3f             %.3f\n", recipe,
                        hs_model, std::sqrt(q_ms), std::sqrt(k_ms), std::sqrt(qk_ms), h_scaled,
                        h_unscaled, uniform);
            const std::string tag = std::string(recipe) == "cpu" ? "cpu" : "gpu";
            claims.push_back([=] {
                print_claim("q_rms_" + tag, std::sqrt(q_ms), 2);
                print_claim("qk_rms_" + tag, std::sqrt(qk_ms), 2);
                print_claim("entropy_scaled_" + tag, h_scaled, 2);
                print_claim("entropy_unscaled_" + tag, h_unscaled, 2);
                print_claim("entropy_uniform_" + tag, uniform, 2);
                print_claim("hs_" + tag, std::to_string(hs_model));
            });
        }
        std::cout << "\nthe numbers the page quotes:\n";
        for (const auto& print : claims) print();

        print_heading("Why it matters: large scores saturate the softmax");
        //! [saturation]
        Tensor1 logits = {1.0f, 2.0f, 3.0f};
        Tensor1 p1 = softmax(logits);               // scores with spread ≈ 1
        Tensor1 p8 = softmax(Tensor1(8.0f * logits)); // the same scores, spread ≈ 8 = √64
        //! [saturation]
        std::cout << "softmax([1, 2, 3])   = " << distribution(p1) << "\n"
                  << "softmax(8·[1, 2, 3]) = " << distribution(p8) << "\n";
        //! [gradient]
        // ∂p_i/∂z_i = p_i (1 − p_i): how much a nudge to a logit still moves its weight.
        Tensor1 g1 = p1 * (1.0f - p1), g8 = p8 * (1.0f - p8);
        //! [gradient]
        std::cout << "p(1 - p) at [1, 2, 3]   = " << distribution(g1) << "\n"
                  << "p(1 - p) at 8·[1, 2, 3] = " << distribution(g8)
                  << "   (almost no gradient left)\n";
        print_claim("saturated_first_weight", probability(p8(0)));
        print_claim("saturated_last_weight", probability(p8(2)));
    });
}
