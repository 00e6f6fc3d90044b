// Lesson 03: the causal mask. The page that narrates this program is lesson.md beside it.
#include "attn/attention.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/linear.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"

#include <xtensor/xview.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

using namespace attn;

namespace {

// A mask as rows of 1 (may attend) and . (masked), so its shape is visible at a glance.
std::string format_mask(const Mask<2>& m) {
    std::string s;
    for (std::size_t i = 0; i < m.shape()[0]; ++i) {
        for (std::size_t j = 0; j < m.shape()[1]; ++j) s += m(i, j) ? " 1" : " .";
        s += "\n";
    }
    return s;
}

// The softmax exactly as the textbook writes it, e^z_i / Σ e^z_j, with no safeguards.
Tensor1 textbook_softmax(const Tensor1& z) {
    Tensor1 e = xt::exp(z);
    return e / xt::sum(e)();
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 03: the causal mask", [](const LessonOptions& options) {
        //! [setup]
        constexpr std::size_t block_size = 8, C = 32, hs = 16;
        const std::vector<std::string> tokens = {"the", "cat", "sat", "on", "a", "mat"};
        const std::size_t T = tokens.size();           // 6 tokens, fewer than block_size
        Rng rng(1337);
        Tensor3 x = rng.normal_tensor<3>({1, T, C}, 0.0f, 2.0f);  // (B, T, C), one sequence
        Linear query(C, hs, /*bias=*/false, rng), key(C, hs, /*bias=*/false, rng);
        Tensor3 scores = attention_scores(query.forward(x), key.forward(x));  // (1, T, T)
        //! [setup]

        print_heading("The mask, built once at the block size");
        //! [build_mask]
        const Mask<2> tril = causal_mask(block_size);  // (block_size, block_size)
        const Mask<2> mask = mask_for_length(tril, T);  // (T, T): its top-left corner
        //! [build_mask]
        std::cout << "causal_mask(" << block_size << "), 1 = may attend:\n" << format_mask(tril)
                  << "sliced to T = " << T << ":\n" << format_mask(mask);

        print_heading("Scores with the future set to -inf");
        //! [fill]
        Tensor3 masked = masked_fill(scores, mask);     // −∞ above the diagonal
        //! [fill]
        std::cout << "scores (T, T) before the mask:\n"
                  << format_tensor(Tensor2(xt::view(scores, 0)), {2})
                  << "after masked_fill:\n" << format_tensor(Tensor2(xt::view(masked, 0)), {2});

        print_heading("The softmax turns -inf into a weight of exactly 0");
        //! [weights]
        Tensor2 weights = xt::view(softmax(masked), 0);  // (T, T), each row sums to 1
        //! [weights]
        std::cout << format_tensor(weights, {3});
        float above = 0.0f;
        for (std::size_t i = 0; i < T; ++i)
            for (std::size_t j = i + 1; j < T; ++j) above = std::max(above, weights(i, j));
        std::printf("largest weight above the diagonal: %g\n", static_cast<double>(above));
        std::cout << "\nEach row is a token, each column a token it may look at"
                     " (darker = more weight):\n"
                  << heatmap_text(weights, tokens, tokens);
        if (!options.figures.empty()) {
            heatmap_png(options.figures / "lesson03_weights.png", weights, tokens, tokens,
                        "Causal attention weights");
        }

        print_heading("Why not zero instead of -inf?");
        //! [zero_fill]
        Tensor2 zero_filled = xt::view(softmax(masked_fill(scores, mask, 0.0f)), 0);
        //! [zero_fill]
        std::printf("first token, masked with 0:    weights %s\n",
                    format_tensor(Tensor1(xt::row(zero_filled, 0)), {3}).c_str());
        std::printf("first token, masked with -inf: weights %s\n",
                    format_tensor(Tensor1(xt::row(weights, 0)), {3}).c_str());

        print_heading("A fully masked row");
        //! [fully_masked]
        Tensor1 nothing_allowed = {minus_infinity, minus_infinity, minus_infinity};
        Tensor1 textbook = textbook_softmax(nothing_allowed);  // e^−∞ / Σ = 0 / 0
        Tensor1 library = softmax(nothing_allowed);            // the course's choice
        //! [fully_masked]
        std::cout << "textbook softmax of [-inf, -inf, -inf]: " << format_tensor(textbook, {4})
                  << "\nattn::softmax of [-inf, -inf, -inf]:   " << format_tensor(library, {4})
                  << "   (attends to nothing)\n";
        std::size_t fewest = T;
        for (std::size_t i = 0; i < T; ++i) {
            std::size_t allowed = 0;
            for (std::size_t j = 0; j < T; ++j) allowed += mask(i, j);
            fewest = std::min(fewest, allowed);
        }
        std::printf("fewest keys any row of the causal mask allows: %zu (row 0: itself)\n",
                    fewest);
    });
}
