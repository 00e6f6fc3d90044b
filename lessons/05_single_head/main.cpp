// Lesson 05: a single head. The page that narrates this program is lesson.md beside it.
#include "attn/attention.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"

#include <xtensor/xview.hpp>

#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace attn;

namespace {

// Prints the rows of a (T, n) matrix with four decimals, as the hand computation writes them.
void print_rows(const Tensor2& m) {
    for (std::size_t i = 0; i < m.shape()[0]; ++i) {
        std::printf("  ");
        for (std::size_t j = 0; j < m.shape()[1]; ++j) std::printf(" %.4f", double(m(i, j)));
        std::printf("\n");
    }
}

double largest_difference(const Tensor3& a, const Tensor3& b) {
    return static_cast<double>(xt::amax(xt::abs(a - b))());
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 05: a single head", [](const LessonOptions& options) {
        print_heading("The hand-worked example: identity projections, three tokens");
        //! [hand]
        const Tensor2 identity = xt::eye<float>(2);          // W_k = W_q = W_v = I (2, 2)
        Head hand(identity, identity, identity, /*block_size=*/3);
        Tensor3 x = {{{1, 0}, {0, 1}, {1, 1}}};              // (B, T, C) = (1, 3, 2)
        Tensor3 hand_weights = hand.attention_weights(x);    // (1, 3, 3)
        Tensor3 hand_out = hand.forward(x);                  // (1, 3, 2)
        //! [hand]
        std::cout << "attention weights:\n";
        print_rows(xt::view(hand_weights, 0));
        std::cout << "output rows:\n";
        print_rows(xt::view(hand_out, 0));
        const std::vector<std::string> xs = {"x0", "x1", "x2"};
        std::cout << heatmap_text(xt::view(hand_weights, 0), xs, xs);
        // The numbers the page works out by hand, checked against these.
        print_claim("hand_w10", hand_weights(0, 1, 0), 4);
        print_claim("hand_w11", hand_weights(0, 1, 1), 4);
        print_claim("hand_w20", hand_weights(0, 2, 0), 4);
        print_claim("hand_w22", hand_weights(0, 2, 2), 4);
        print_claim("hand_out1", hand_out(0, 1, 0), 4);
        print_claim("hand_out1b", hand_out(0, 1, 1), 4);
        print_claim("hand_out2", hand_out(0, 2, 0), 4);

        print_heading("A head with random weights, and a shorter sequence");
        //! [head]
        constexpr std::size_t C = 32, hs = 16, block_size = 8;
        Rng rng(1337);
        Head head(C, hs, block_size, /*dropout=*/0.2f, rng);  // starts in evaluation mode
        Tensor3 long_x = rng.normal_tensor<3>({2, block_size, C}, 0.0f, 2.0f);  // T = 8
        Tensor3 short_x = xt::view(long_x, xt::all(), xt::range(0, 5), xt::all());  // T = 5
        Tensor3 long_out = head.forward(long_x);    // (2, 8, hs): tril used whole
        Tensor3 short_out = head.forward(short_x);  // (2, 5, hs): tril sliced to (5, 5)
        //! [head]
        std::cout << "x " << shape_of(long_x) << " -> out " << shape_of(long_out) << "\n"
                  << "x " << shape_of(short_x) << " -> out " << shape_of(short_out) << "\n";
        Tensor3 prefix = xt::view(long_out, xt::all(), xt::range(0, 5), xt::all());
        std::printf("largest |out(first 5 tokens of 8) - out(the 5 tokens alone)| = %.2g\n"
                    "   (float rounding only: a token never sees later ones, so the prefix does\n"
                    "   not depend on what follows)\n",
                    largest_difference(prefix, short_out));
        try {
            head.forward(rng.normal_tensor<3>({1, block_size + 1, C}));
        } catch (const std::invalid_argument& e) {
            std::cout << "T = 9: error: " << e.what() << "\n";
        }
        const std::vector<std::string> words = {"I", "think", "so", "I", "am", ",", "so", "?"};
        Tensor2 w0 = xt::view(head.attention_weights(long_x), 0);
        std::cout << "\nweights of sequence 0:\n" << heatmap_text(w0, words, words);
        if (!options.figures.empty()) {
            heatmap_png(options.figures / "lesson05_weights.png", w0, words, words,
                        "One head, evaluation mode");
        }

        print_heading("Dropout on the attention weights: training against evaluation");
        //! [dropout]
        Tensor3 eval_a = head.forward(long_x), eval_b = head.forward(long_x);
        head.training = true;  // dropout now zeroes weights with probability 0.2
        Tensor3 train_a = head.forward(long_x), train_b = head.forward(long_x);
        head.training = false;
        //! [dropout]
        std::printf("evaluation, two calls:  largest difference %.2g  (deterministic)\n"
                    "training, two calls:    largest difference %.3f  (new mask each call)\n"
                    "training vs evaluation: largest difference %.3f\n",
                    largest_difference(eval_a, eval_b), largest_difference(train_a, train_b),
                    largest_difference(train_a, eval_a));
        //! [inverted]
        Rng drop_rng(7);
        Tensor3 w = head.attention_weights(long_x);   // (2, 8, 8)
        Tensor3 one_draw = dropout(w, 0.2f, drop_rng);
        Tensor3 mean = xt::zeros<float>(w.shape());
        constexpr int draws = 2000;
        for (int n = 0; n < draws; ++n) mean += dropout(w, 0.2f, drop_rng) / float(draws);
        //! [inverted]
        std::cout << "row 3 of the weights:       " << format_tensor(Tensor1(xt::view(w, 0, 3)), {3})
                  << "\none dropout draw (p = 0.2): "
                  << format_tensor(Tensor1(xt::view(one_draw, 0, 3)), {3})
                  << "   survivors × 1/(1 - 0.2) = 1.25\n"
                  << "mean of " << draws << " draws:        "
                  << format_tensor(Tensor1(xt::view(mean, 0, 3)), {3}) << "\n";
        std::printf("largest |mean of draws - weights| = %.3f   (the expectation is kept)\n",
                    largest_difference(mean, w));
    });
}
