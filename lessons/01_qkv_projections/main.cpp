// Lesson 01: Q, K, V projections. The page that narrates this program is lesson.md beside it.
#include "attn/lesson.hpp"
#include "attn/linalg.hpp"
#include "attn/linear.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"

#include <xtensor/xsort.hpp>
#include <xtensor/xview.hpp>

#include <cstdio>
#include <iostream>

using namespace attn;

namespace {

// The largest |S[i][j] − S[j][i]|: zero exactly when S is symmetric.
float asymmetry(const Tensor2& s) { return xt::amax(xt::abs(s - xt::transpose(s)))(); }

// How many rows of S have their largest score on the diagonal (a token preferring itself).
std::size_t rows_peaking_on_diagonal(const Tensor2& s) {
    std::size_t n = 0;
    for (std::size_t i = 0; i < s.shape()[0]; ++i) {
        n += xt::argmax(xt::row(s, static_cast<long>(i)))() == i;
    }
    return n;
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 01: Q, K, V projections", [](const LessonOptions&) {
        //! [setup]
        constexpr std::size_t B = 4, T = 8, C = 32, hs = 16;
        Rng rng(1337);
        Tensor3 x = rng.normal_tensor<3>({B, T, C});  // (B, T, C): 4 sequences of 8 tokens
        Linear query(C, hs, /*bias=*/false, rng);     // W_q (hs, C)
        Linear key(C, hs, /*bias=*/false, rng);       // W_k (hs, C)
        Linear value(C, hs, /*bias=*/false, rng);     // W_v (hs, C)
        //! [setup]

        //! [project]
        Tensor3 q = query.forward(x);  // (B, T, hs): what each token is looking for
        Tensor3 k = key.forward(x);    // (B, T, hs): what each token offers to be found by
        Tensor3 v = value.forward(x);  // (B, T, hs): what each token hands over when found
        //! [project]

        print_heading("Shapes");
        std::cout << "x        " << shape_of(x) << "   (B, T, C)\n"
                  << "W_q      " << shape_of(query.weight) << "      (hs, C), PyTorch's layout\n"
                  << "q = xWqᵀ " << shape_of(q) << "   (B, T, hs)\n"
                  << "k = xWkᵀ " << shape_of(k) << "\n"
                  << "v = xWvᵀ " << shape_of(v) << "\n";

        print_heading("The first 4 tokens of sequence 0, first 6 channels");
        PrintOptions first6;
        first6.threshold = 6;
        first6.edge_items = 6;
        for (const auto& [name, t] : {std::pair{"q[0]", &q}, {"k[0]", &k}, {"v[0]", &v}}) {
            Tensor2 corner = xt::view(*t, 0, xt::range(0, 4), xt::range(0, 6));
            std::cout << name << "\n" << format_tensor(corner, first6);
        }

        print_heading("Why three maps: scores with separate Q and K");
        //! [scores]
        Tensor2 q0 = xt::view(q, 0), k0 = xt::view(k, 0);  // (T, hs)
        Tensor2 scores = matmul_transposed(q0, k0);          // (T, T): scores[i][j] = q_i · k_j
        //! [scores]
        std::cout << format_tensor(Tensor2(xt::view(scores, xt::range(0, 5), xt::range(0, 5))),
                                   {2});
        std::printf("largest |S[i][j] - S[j][i]| = %.4f   (asymmetric: i may want j more than j wants i)\n",
                    static_cast<double>(asymmetry(scores)));
        std::printf("rows whose largest score is on the diagonal: %zu of %zu\n",
                    rows_peaking_on_diagonal(scores), T);

        print_heading("One shared map for all three: the score matrix turns symmetric");
        //! [shared]
        Tensor2 shared = xt::view(k, 0);                       // use W_k as query map too
        Tensor2 shared_scores = matmul_transposed(shared, shared);  // S = (x Wᵀ)(x Wᵀ)ᵀ
        //! [shared]
        std::cout << format_tensor(
            Tensor2(xt::view(shared_scores, xt::range(0, 5), xt::range(0, 5))), {2});
        std::printf("largest |S[i][j] - S[j][i]| = %.4f   (symmetric, exactly)\n",
                    static_cast<double>(asymmetry(shared_scores)));
        std::printf("rows whose largest score is on the diagonal: %zu of %zu"
                    "   (s_ii = |k_i|^2: each token mostly looks at itself)\n",
                    rows_peaking_on_diagonal(shared_scores), T);

        print_heading("Why no bias: a key bias shifts each row of scores by one constant");
        //! [key_bias]
        Tensor1 b_k = rng.normal_tensor<1>({hs});               // a key bias (hs)
        Tensor2 k0_biased = k0 + xt::view(b_k, xt::newaxis(), xt::all());
        Tensor2 shift = matmul_transposed(q0, k0_biased) - scores;  // = q_i · b_k, for every j
        //! [key_bias]
        std::cout << "scores with bias - scores without, first 4 rows:\n"
                  << format_tensor(Tensor2(xt::view(shift, xt::range(0, 4), xt::all())), {3});
        float spread = 0.0f;
        for (std::size_t i = 0; i < T; ++i) {
            auto r = xt::row(shift, static_cast<long>(i));
            spread = std::max(spread, xt::amax(r)() - xt::amin(r)());
        }
        std::printf("largest spread within a row: %.2g   (float rounding: each row is constant,\n"
                    "and the softmax of lesson 04 ignores a constant added to a row)\n",
                    static_cast<double>(spread));

        print_heading("Why no bias: a value bias adds itself to every output");
        //! [value_bias]
        Tensor2 weights = rng.uniform_tensor<2>({T, T}, 0.0f, 1.0f);     // any attention weights
        weights /= xt::view(xt::sum(weights, {1}), xt::all(), xt::newaxis());  // rows sum to 1
        Tensor1 b_v = rng.normal_tensor<1>({hs});
        Tensor2 v0 = xt::view(v, 0);
        Tensor2 v0_biased = v0 + xt::view(b_v, xt::newaxis(), xt::all());
        Tensor2 out_shift = matmul(weights, v0_biased) - matmul(weights, v0);  // = b_v, every row
        //! [value_bias]
        const float off = xt::amax(xt::abs(out_shift - xt::view(b_v, xt::newaxis(), xt::all())))();
        std::printf("largest |(out with b_v - out without) - b_v| = %.2g   (weights sum to 1,\n"
                    "so the bias passes straight through: a bias after the head does the same job)\n",
                    static_cast<double>(off));
    });
}
