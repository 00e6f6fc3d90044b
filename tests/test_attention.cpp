#include "attn/attention.hpp"
#include "attn/check.hpp"
#include "attn/head_fixtures.hpp"
#include "attn/linalg.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <cmath>

using namespace attn;

TEST_CASE("transpose_last_two swaps the last two axes and keeps the batch axis") {
    Tensor3 x = {{{1, 2, 3}, {4, 5, 6}}, {{7, 8, 9}, {10, 11, 12}}};  // (2, 2, 3)
    CHECK_CLOSE(transpose_last_two(x),
                Tensor3({{{1, 4}, {2, 5}, {3, 6}}, {{7, 10}, {8, 11}, {9, 12}}}), 0.0);
}

TEST_CASE("attention scores are q·k over the square root of the head size") {
    Tensor3 q = {{{1, 0, 0, 0}, {1, 1, 1, 1}}};  // hs = 4, so the scale is 1/2
    Tensor3 k = {{{2, 0, 0, 0}, {1, 2, 3, 4}, {0, 0, 0, 0}}};
    CHECK_CLOSE(dot_product_scores(q, k), Tensor3({{{2, 1, 0}, {2, 10, 0}}}), 0.0);
    CHECK_CLOSE(attention_scores(q, k), Tensor3({{{1, 0.5, 0}, {1, 5, 0}}}), 0.0);
    CHECK_THROWS_AS(attention_scores(q, Tensor3(xt::zeros<float>({1, 3, 5}))),
                    std::invalid_argument);
    CHECK_THROWS_AS(attention_scores(q, Tensor3(xt::zeros<float>({2, 3, 4}))),
                    std::invalid_argument);
}

TEST_CASE("the causal mask is lower triangular and slices to shorter sequences") {
    const Mask<2> m = causal_mask(4);
    for (std::size_t i = 0; i < 4; ++i)
        for (std::size_t j = 0; j < 4; ++j) {
            CAPTURE(i);
            CAPTURE(j);
            CHECK(m(i, j) == (j <= i));
        }
    const Mask<2> m2 = mask_for_length(m, 2);
    CHECK(m2 == Mask<2>({{true, false}, {true, true}}));
    CHECK_THROWS_WITH_AS(mask_for_length(m, 5),
                         "mask_for_length: a sequence of T = 5 tokens is longer than the block "
                         "size 4 the mask was built for",
                         std::invalid_argument);
    CHECK_THROWS_AS(causal_mask(0), std::invalid_argument);
}

TEST_CASE("masked_fill writes the value where the mask is false, in every batch item") {
    Tensor3 s = {{{1, 2}, {3, 4}}, {{5, 6}, {7, 8}}};
    const Tensor3 filled = masked_fill(s, causal_mask(2));
    CHECK(filled(0, 0, 1) == minus_infinity);
    CHECK(filled(1, 0, 1) == minus_infinity);
    CHECK(filled(0, 1, 0) == 3.0f);
    CHECK(filled(1, 1, 1) == 8.0f);
    CHECK(masked_fill(s, causal_mask(2), -7.0f)(1, 0, 1) == -7.0f);
    CHECK_THROWS_AS(masked_fill(s, causal_mask(3)), std::invalid_argument);
}

TEST_CASE("softmax of [1, 2, 3] matches values worked by hand") {
    // e^0, e^1, e^2 over their sum 1 + e + e² = 11.1073...: computed with a calculator.
    // The 7-digit references are within 5e-8; float32 exp, a 3-term sum and the division,
    // ≲ 5u·0.67 ≈ 2e-7 (u = 2^-24): ≤ 2.5e-7 in all, 4× under 1e-6.
    const Tensor1 p = softmax(Tensor1{1, 2, 3});
    CHECK_CLOSE(p, Tensor1({0.0900306f, 0.2447285f, 0.6652410f}), 1e-6);
    // 8·[1, 2, 3]: e^-16 / (1 + e^-8 + e^-16) = 1.1253e-07, not 2.9e-07. The float error is
    // ≲ 4u relative (exp, sum, division), ~1e-6 of each value against epsilon 1e-4. But
    // Approx's margin is epsilon·(1 + |x|) (doctest's scale 1): here ≈ 1e-4 absolute, which
    // 2.9e-7 also meets; only .scale(0) would make these checks relative.
    const Tensor1 p8 = softmax(Tensor1{8, 16, 24});
    CHECK(p8(0) == doctest::Approx(1.12535e-7).epsilon(1e-4));
    CHECK(p8(1) == doctest::Approx(3.35350e-4).epsilon(1e-4));
}

TEST_CASE("softmax does not overflow at logits of plus or minus 1000 and rows sum to one") {
    Tensor2 logits = {{1000, 999, -1000}, {-1000, -1000, -1001}};
    const Tensor2 p = softmax(logits);
    // Row 0: the same as softmax([1, 0, -2000]) = (e/(e+1), 1/(e+1), 0). The differences from
    // the max (0, −1, −2000) are exact and e^-2000 is 0; exp, sum and division on each side
    // (the expected values are float too) ≲ 4u·1 ≈ 2.4e-7 (u = 2^-24): 4× under 1e-6.
    const float e = std::exp(1.0f);
    CHECK_CLOSE(xt::row(p, 0), Tensor1({e / (e + 1), 1 / (e + 1), 0}), 1e-6);
    // Row 1: the same as softmax([0, 0, -1]).
    CHECK_CLOSE(xt::row(p, 1),
                Tensor1({1 / (2 + 1 / e), 1 / (2 + 1 / e), (1 / e) / (2 + 1 / e)}), 1e-6);
    Rng rng(1);
    const Tensor3 r = softmax(rng.normal_tensor<3>({3, 5, 7}, 0.0f, 30.0f));
    // Σ_j e_j/Z with Z summed from the same rounded e_j: their own errors cancel, leaving Z's
    // γ_7, the divisions' u and this 7-term float sum's γ_6, ≤ 14u ≈ 8.3e-7 (u = 2^-24), 1.2×
    // under 1e-6; with random signs (√7 u + u + √6 u ≈ 3.6e-7) 2.8× under.
    CHECK_CLOSE(xt::sum(r, {2}), xt::ones<float>({3, 5}), 1e-6);
}

TEST_CASE("a fully masked row gets all-zero weights, not NaN") {
    Tensor2 logits = {{minus_infinity, minus_infinity}, {0, minus_infinity}};
    CHECK_CLOSE(softmax(logits), Tensor2({{0, 0}, {1, 0}}), 0.0);
}

TEST_CASE("softmax rejects NaN, plus infinity and an empty last axis") {
    CHECK_THROWS_AS(softmax(Tensor1{0, std::nanf("")}), std::invalid_argument);
    CHECK_THROWS_AS(softmax(Tensor1{0, -minus_infinity}), std::invalid_argument);
    CHECK_THROWS_AS(softmax(Tensor2(xt::zeros<float>({2, 0}))), std::invalid_argument);
}

TEST_CASE("dropout zeros about p of the entries and scales survivors by 1/(1-p)") {
    Rng rng(3);
    const Tensor3 x = xt::ones<float>({4, 50, 50});
    const Tensor3 y = dropout(x, 0.2f, rng);
    std::size_t zeros = 0;
    for (float v : y) {
        if (v == 0.0f) ++zeros;
        else CHECK(v == doctest::Approx(1.25));
    }
    // 10000 Bernoulli(0.2) draws: standard deviation of the fraction is 0.004 (a statistical,
    // not a rounding, tolerance). Approx's margin is epsilon·(1 + |x|) = 0.1·1.2 = 0.12
    // absolute, 30 standard deviations, not the 5 (0.02) meant. The kept values 1·1/(1 − 0.2)
    // round to 1.25 within 2u, far inside Approx's default 100·2^-23·2.25.
    CHECK(double(zeros) / double(y.size()) == doctest::Approx(0.2).epsilon(0.1));
    CHECK_CLOSE(dropout(x, 0.0f, rng), x, 0.0);
    Rng a(9), b(9);
    CHECK_CLOSE(dropout(x, 0.5f, a), dropout(x, 0.5f, b), 0.0);
    CHECK_THROWS_AS(dropout(x, 1.0f, rng), std::invalid_argument);
    CHECK_THROWS_AS(dropout(x, -0.1f, rng), std::invalid_argument);
}

TEST_CASE("Head gives the hand-worked rows 1 0 / 0.3302 0.6698 / 0.7517 0.7517") {
    const Tensor2 identity = xt::eye<float>(2);
    Head head(identity, identity, identity, 3);
    Tensor3 x = {{{1, 0}, {0, 1}, {1, 1}}};
    // Rows worked on paper to four decimals (see lesson 05): exact values 0.669762, 0.330238,
    // 0.751745, so the 4-decimal references are off by 3.8e-5 and 4.5e-5; the float32 error
    // (projections by the identity exact, then a 2..3-term softmax and Σ p v) is ≲ 6u ≈ 4e-7
    // (u = 2^-24): ≤ 4.55e-5 against 5e-5, 10× the float error to spare.
    CHECK_CLOSE(head.forward(x), Tensor3({{{1, 0}, {0.3302f, 0.6698f}, {0.7517f, 0.7517f}}}), 5e-5);
}

TEST_CASE("Head agrees with PyTorch's head on every reference fixture, within float32's bounds") {
    const auto cases = check::load_head_cases();
    REQUIRE(cases.size() >= 5);
    double largest = 0.0;
    for (const auto& c : cases) {
        CAPTURE(c.name);
        Head head(c.w_key, c.w_query, c.w_value, c.block_size, 0.2f);
        // PyTorch sums in another order than BLAS: 2γ_n Σ|terms| per sum (u = 2^-24) through
        // k, q, v (n = C ≤ 32, Σ|x w| ≤ 3.7), the scores (n = hs ≤ 16), the softmax and Σ p v
        // (T ≤ 16), computed from the fixtures: worst case ≤ 3.8e-5 on a weight and 1.1e-4
        // on an output; random-sign (√(2n) u Σ|terms| per sum, rss) ≤ 5.3e-7 on a weight, 2×
        // under 1e-6, but 1.3e-6 and 1.7e-6 on the outputs of the C = 32 fixtures (≤ 8.1e-7
        // for the others). Weights: 1e-6, 2× the estimate. Outputs: 1e-5, 6× the estimate
        // (1e-6 would pass only where the two libraries' orders happen to agree).
        const auto weights = check::compare(head.attention_weights(c.x), c.weights, 1e-6);
        const auto out = check::compare(head.forward(c.x), c.out, 1e-5);
        CHECK_MESSAGE(weights.ok, weights.report);
        CHECK_MESSAGE(out.ok, out.report);
        largest = std::max({largest, weights.max_abs_diff, out.max_abs_diff});
    }
    MESSAGE("largest |C++ - PyTorch| over ", cases.size(), " cases: ", largest);
}

TEST_CASE("Head in evaluation mode is deterministic, and in training mode dropout acts, seeded") {
    Rng rng(4);
    Head a(16, 8, 8, 0.3f, rng, 99);
    Head b = a;
    const Tensor3 x = rng.normal_tensor<3>({2, 8, 16});
    CHECK_CLOSE(a.forward(x), a.forward(x), 0.0);
    a.training = b.training = true;
    const Tensor3 ta = a.forward(x), tb = b.forward(x);
    CHECK_CLOSE(ta, tb, 0.0);  // equal seeds drop the same weights
    CHECK(xt::amax(xt::abs(ta - a.forward(x)))() > 1e-3f);  // a new draw on each call
    CHECK_THROWS_AS(Head(16, 8, 8, 1.0f, rng), std::invalid_argument);
}

TEST_CASE("Head rejects a sequence longer than its block size and a wrong width") {
    Rng rng(5);
    Head head(6, 4, 3, 0.0f, rng);
    CHECK_THROWS_AS(head.forward(Tensor3(xt::zeros<float>({1, 4, 6}))), std::invalid_argument);
    CHECK_THROWS_AS(head.forward(Tensor3(xt::zeros<float>({1, 3, 5}))), std::invalid_argument);
    CHECK_THROWS_AS(Head(rng.normal_tensor<2>({4, 6}), rng.normal_tensor<2>({3, 6}),
                         rng.normal_tensor<2>({4, 6}), 3),
                    std::invalid_argument);
}
