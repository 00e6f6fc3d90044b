// Lesson 02: scores and scaling. The page that narrates this program is lesson.md beside it.
#include "attn/attention.hpp"
#include "attn/lesson.hpp"
#include "attn/linalg.hpp"
#include "attn/linear.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"

#include <xtensor/xview.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <stdexcept>

using namespace attn;

namespace {

// The population standard deviation of every entry of t.
double standard_deviation(const Tensor3& t) {
    double sum = 0, sum2 = 0;
    for (float v : t) sum += v, sum2 += double(v) * v;
    const double n = double(t.size()), mean = sum / n;
    return std::sqrt(sum2 / n - mean * mean);
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
