// Lesson 04: softmax, then blend the values. The page that narrates this program is lesson.md
// beside it.
#include "attn/attention.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/linalg.hpp"
#include "attn/linear.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"

#include <xtensor/xview.hpp>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

using namespace attn;

namespace {

// The softmax exactly as the textbook writes it, e^z_i / Σ e^z_j, with no safeguards.
Tensor1 textbook_softmax(const Tensor1& z) {
    Tensor1 e = xt::exp(z);
    return e / xt::sum(e)();
}

// Two printed matrices next to each other, under their titles.
std::string side_by_side(const std::string& left_title, const std::string& left,
                         const std::string& right_title, const std::string& right) {
    std::istringstream l(left), r(right);
    std::string a, b;
    std::getline(l, a);
    const std::size_t width = a.size() + 4;
    l.seekg(0);
    std::string out = left_title + std::string(width - left_title.size(), ' ') + right_title + "\n";
    while (std::getline(l, a) && std::getline(r, b)) out += a + "    " + b + "\n";
    return out;
}

// The largest |sum − 1| over the rows (axis 1) or the columns (axis 0) of w.
double worst_sum(const Tensor2& w, std::size_t axis) {
    const Tensor1 sums = xt::sum(w, {axis});
    return static_cast<double>(xt::amax(xt::abs(sums - 1.0f))());
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 04: softmax, then blend the values",
                      [](const LessonOptions& options) {
        print_heading("Softmax with and without subtracting the maximum");
        //! [overflow]
        Tensor1 large = {1000.0f, 999.0f, -1000.0f};     // e^1000 overflows float (max ≈ e^88.7)
        Tensor1 small = {-1000.0f, -1000.0f, -1001.0f};  // e^−1000 underflows to 0
        //! [overflow]
        for (const auto& [name, z] : {std::pair{"[1000, 999, -1000]  ", &large},
                                      std::pair{"[-1000, -1000, -1001]", &small}}) {
            std::cout << name << "  textbook " << format_tensor(textbook_softmax(*z)) << "\n"
                      << "                       stable   " << format_tensor(softmax(*z)) << "\n";
        }

        print_heading("Causal weights: the softmax along the right axis and the wrong one");
        //! [setup]
        constexpr std::size_t T = 5, C = 32, hs = 16;
        const std::vector<std::string> tokens = {"to", "be", "or", "not", "to"};
        Rng rng(1337);
        Tensor3 x = rng.normal_tensor<3>({1, T, C}, 0.0f, 2.0f);  // (B, T, C), spread 2
        Linear query(C, hs, false, rng), key(C, hs, false, rng), value(C, hs, false, rng);
        Tensor3 v = value.forward(x);                                          // (B, T, hs)
        Tensor3 masked = masked_fill(attention_scores(query.forward(x), key.forward(x)),
                                     causal_mask(T));                          // (B, T, T)
        //! [setup]
        //! [axes]
        Tensor3 right = softmax(masked);  // over the last axis: each query's row sums to 1
        // The bug: normalising over the queries (axis 1) instead of the keys (axis 2).
        Tensor3 wrong = transpose_last_two(softmax(transpose_last_two(masked)));
        //! [axes]
        const Tensor2 w_right = xt::view(right, 0), w_wrong = xt::view(wrong, 0);
        std::cout << side_by_side("softmax over keys (last axis)", format_tensor(w_right, {3}),
                                  "softmax over queries (axis 1)", format_tensor(w_wrong, {3}));
        std::printf("largest |row sum - 1|:    right %.1e    wrong %.3f\n"
                    "largest |column sum - 1|: right %.3f      wrong %.1e\n",
                    worst_sum(w_right, 1), worst_sum(w_wrong, 1), worst_sum(w_right, 0),
                    worst_sum(w_wrong, 0));
        std::cout << "\nright axis:\n" << heatmap_text(w_right, tokens, tokens)
                  << "wrong axis (columns sum to 1: the last key, seen only by the last query, gets weight 1 from it):\n"
                  << heatmap_text(w_wrong, tokens, tokens);
        if (!options.figures.empty()) {
            heatmap_grid_png(options.figures / "lesson04_axes.png", {w_right, w_wrong},
                             {"softmax over keys", "over queries (bug)"}, tokens, tokens, 2);
        }

        print_heading("Blending the values: out = weights · V");
        //! [blend]
        Tensor3 out = batched_matmul(right, v);  // (B, T, T) · (B, T, hs) → (B, T, hs)
        //! [blend]
        std::cout << "weights " << shape_of(right) << " · v " << shape_of(v) << " = out "
                  << shape_of(out) << "\n";
        PrintOptions first6;
        first6.threshold = 6;
        first6.edge_items = 6;
        std::cout << "v, first 6 channels:\n"
                  << format_tensor(Tensor2(xt::view(v, 0, xt::all(), xt::range(0, 6))), first6)
                  << "out, first 6 channels:\n"
                  << format_tensor(Tensor2(xt::view(out, 0, xt::all(), xt::range(0, 6))), first6);
        std::printf("largest |out[0] - v[0]| = %g   (the first token can only attend to itself)\n",
                    static_cast<double>(
                        xt::amax(xt::abs(xt::view(out, 0, 0) - xt::view(v, 0, 0)))()));
        // Each output is a weighted average, so it stays inside the range of the values it mixes.
        float outside = 0.0f;
        for (std::size_t i = 0; i < T; ++i)
            for (std::size_t c = 0; c < hs; ++c) {
                const auto seen = xt::view(v, 0, xt::range(0, i + 1), c);
                outside = std::max({outside, xt::amin(seen)() - out(0, i, c),
                                    out(0, i, c) - xt::amax(seen)()});
            }
        std::printf("largest step of an output outside the range of the values it mixes: %.1g\n",
                    static_cast<double>(std::max(outside, 0.0f)));
    });
}
