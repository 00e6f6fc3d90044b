// Lesson 06: scaled dot-product attention, in general. The page that narrates this program
// is lesson.md beside it.
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"
#include "attn/sdpa.hpp"

#include <xtensor/xview.hpp>

#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace attn;

namespace {

// The largest |sum of row − 1| over every row of the weights (…, T_q, T_k).
template <std::size_t N>
double worst_row_sum_error(const Tensor<N>& w) {
    const std::size_t Tk = w.shape()[N - 1];
    double worst = 0.0;
    for (std::size_t r = 0; r < w.size() / Tk; ++r) {
        double sum = 0.0;
        for (std::size_t j = 0; j < Tk; ++j) sum += w.data()[r * Tk + j];
        worst = std::max(worst, std::abs(sum - 1.0));
    }
    return worst;
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 06: scaled dot-product attention, in general",
                      [](const LessonOptions& options) {
        Rng rng(606);

        print_heading("A 3-D case: 2 sequences, 3 queries looking at 5 keys");
        //! [three_d]
        Tensor3 q = rng.normal_tensor<3>({2, 3, 4});  // (B, T_q, d_k)
        Tensor3 k = rng.normal_tensor<3>({2, 5, 4});  // (B, T_k, d_k)
        Tensor3 v = rng.normal_tensor<3>({2, 5, 3});  // (B, T_k, d_v)
        Tensor3 w;                                    // (B, T_q, T_k), filled on request
        Tensor3 out = scaled_dot_product_attention(q, k, v, {}, &w);  // (B, T_q, d_v)
        //! [three_d]
        std::cout << "q " << shape_of(q) << "  k " << shape_of(k) << "  v " << shape_of(v)
                  << "  ->  out " << shape_of(out) << ", weights " << shape_of(w) << "\n\n"
                  << "weights of sequence 0 (one row per query, one column per key):\n"
                  << format_tensor(Tensor2(xt::view(w, 0))) << "output of sequence 0:\n"
                  << format_tensor(Tensor2(xt::view(out, 0)));
        std::printf("largest |row sum - 1| = %.2g\n", worst_row_sum_error(w));

        print_heading("A 4-D case: batch and heads, with the causal mask");
        //! [four_d]
        constexpr std::size_t B = 2, NH = 4, T = 6, hs = 8;
        Tensor4 q4 = rng.normal_tensor<4>({B, NH, T, hs});
        Tensor4 k4 = rng.normal_tensor<4>({B, NH, T, hs});
        Tensor4 v4 = rng.normal_tensor<4>({B, NH, T, hs});
        Tensor4 w4;
        const Mask<2> causal = causal_mask(T);  // (T, T): one mask for all B·NH heads
        Tensor4 out4 = scaled_dot_product_attention(q4, k4, v4, causal, &w4);
        //! [four_d]
        const std::vector<std::string> tokens = {"The", "cat", "sat", "on", "a", "mat"};
        Tensor2 head0 = xt::view(w4, 0, 0);  // (T, T)
        std::cout << "q " << shape_of(q4) << " with mask " << shape_of(causal) << "  ->  out "
                  << shape_of(out4) << ", weights " << shape_of(w4) << "\n\n"
                  << "batch item 0, head 0:\n" << format_tensor(head0)
                  << heatmap_text(head0, tokens, tokens);
        std::size_t nonzero_above = 0;
        for (std::size_t i = 0; i < w4.size(); ++i) {
            const std::size_t row = (i / T) % T, col = i % T;
            nonzero_above += col > row && w4.data()[i] != 0.0f;
        }
        std::printf("weights above the diagonal that are not exactly 0, in all %zu heads: %zu\n",
                    B * NH, nonzero_above);
        std::printf("largest |row sum - 1| = %.2g\n", worst_row_sum_error(w4));
        if (!options.figures.empty()) {
            heatmap_png(options.figures / "lesson06_causal.png", head0, tokens, tokens,
                        "causal, batch 0, head 0");
        }

        print_heading("Broadcasting a mask: hide the last two keys of sequence 1 only");
        //! [padding]
        const std::size_t one = 1;
        Mask<4> padding = xt::ones<bool>({B, one, one, T});  // (B, 1, 1, T_k)
        // Sequence 1 is only 4 tokens long: hide keys 4 and 5 from all its heads and queries.
        xt::view(padding, 1, 0, 0, xt::range(T - 2, T)) = false;
        Tensor4 w_padded;
        scaled_dot_product_attention(q4, k4, v4, padding, &w_padded);
        //! [padding]
        std::cout << "mask " << shape_of(padding) << " broadcast to the weights "
                  << shape_of(w_padded) << "\n"
                  << "batch item 0, head 2 (nothing hidden):\n"
                  << format_tensor(Tensor2(xt::view(w_padded, 0, 2)))
                  << "batch item 1, head 2 (keys 4 and 5 hidden):\n"
                  << format_tensor(Tensor2(xt::view(w_padded, 1, 2)));

        print_heading("Every batch axis is just a loop: the 4-D result head by head");
        //! [loop]
        float largest = 0.0f;
        for (std::size_t b = 0; b < B; ++b) {
            for (std::size_t h = 0; h < NH; ++h) {
                Tensor2 single = scaled_dot_product_attention(
                    Tensor2(xt::view(q4, b, h)), Tensor2(xt::view(k4, b, h)),
                    Tensor2(xt::view(v4, b, h)), causal);  // (T, hs): no batch axis
                Tensor2 diff = xt::abs(single - xt::view(out4, b, h));
                largest = std::max(largest, xt::amax(diff)());
            }
        }
        //! [loop]
        std::printf("largest |4-D output - one (T, hs) head at a time| = %g\n",
                    static_cast<double>(largest));

        print_heading("Shapes that do not fit are refused, naming both");
        //! [mismatch]
        try {
            Tensor4 k_wrong = rng.normal_tensor<4>({B, NH, T, hs / 2});  // d_k 4, not 8
            scaled_dot_product_attention(q4, k_wrong, v4);
        } catch (const std::invalid_argument& e) {
            std::cout << e.what() << "\n";
        }
        //! [mismatch]
        try {
            scaled_dot_product_attention(q4, k4, v4, causal_mask(T + 1));
        } catch (const std::invalid_argument& e) {
            std::cout << e.what() << "\n";
        }
    });
}
