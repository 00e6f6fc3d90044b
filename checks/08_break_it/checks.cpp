// Checks for exercise 08: the attention-entropy measure.
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/random.hpp"
#include "attn/sdpa.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <cmath>

using attn::Tensor1;
using attn::Tensor3;
using attn::Tensor4;
using exercise::attention_entropy;
using exercise::mean_entropy_per_head;

namespace {
float ln(double x) { return static_cast<float>(std::log(x)); }
}  // namespace

TEST_CASE("entropies of small rows match values worked by hand") {
    // One-hot: 0. Uniform over 4: ln 4. Uniform over 2 of 4 keys: ln 2.
    // (1/2, 1/4, 1/4, 0): (1/2) ln 2 + 2 · (1/4) ln 4 = 1.5 ln 2.
    Tensor4 w = {{{{1, 0, 0, 0}, {0.25f, 0.25f, 0.25f, 0.25f}, {0.5f, 0.5f, 0, 0},
                   {0.5f, 0.25f, 0.25f, 0}}}};
    INFO("entropy -Σ p ln p: one-hot 0, uniform over 4 ln 4, uniform over 2 ln 2, "
         "(1/2, 1/4, 1/4, 0) 1.5 ln 2 (natural log, 0 ln 0 = 0)");
    // float32 results of double sums of a few terms: well within 1e-6.
    CHECK_CLOSE(attention_entropy(w), Tensor3({{{0.0f, ln(4), ln(2), 1.5f * ln(2)}}}), 1e-6);
}

TEST_CASE("zero weights count as 0 ln 0 = 0 and never give NaN") {
    Tensor4 w = {{{{0, 0, 1}, {0, 1, 0}}}};
    const Tensor3 h = attention_entropy(w);
    CHECK_FALSE(std::isnan(h(0, 0, 0)));
    CHECK_CLOSE(h, Tensor3({{{0, 0}}}), 0.0);
}

TEST_CASE("uniform causal attention has the largest mean entropy: the mean of ln(i + 1)") {
    // Queries attending evenly to every key they may see: row i is 1/(i+1) on keys 0..i.
    constexpr std::size_t T = 6;
    Tensor4 w = xt::zeros<float>({std::size_t{1}, std::size_t{1}, T, T});
    for (std::size_t i = 0; i < T; ++i)
        for (std::size_t j = 0; j <= i; ++j) w(0, 0, i, j) = 1.0f / static_cast<float>(i + 1);
    const double expected = (std::log(1.0) + std::log(2.0) + std::log(3.0) + std::log(4.0) +
                             std::log(5.0) + std::log(6.0)) / 6;
    CHECK_CLOSE(mean_entropy_per_head(w), Tensor1({static_cast<float>(expected)}), 1e-6);
}

TEST_CASE("the mean per head averages over batch items and positions") {
    // Two batch items, two heads, two positions of two keys each.
    // Head 0: entropies 0, ln 2 | ln 2, ln 2 → mean 0.75 ln 2. Head 1: all 0 → 0.
    Tensor4 w = {{{{1, 0}, {0.5f, 0.5f}}, {{1, 0}, {0, 1}}},
                 {{{0.5f, 0.5f}, {0.5f, 0.5f}}, {{0, 1}, {1, 0}}}};
    CHECK_CLOSE(mean_entropy_per_head(w), Tensor1({0.75f * ln(2), 0.0f}), 1e-6);
}

TEST_CASE("sharper attention has lower entropy") {
    // The same scores at three temperatures: scaled by 1/sqrt(d_k), unscaled, and ×4 more.
    attn::Rng rng(81);
    Tensor4 q = rng.normal_tensor<4>({1, 2, 8, 64}), k = rng.normal_tensor<4>({1, 2, 8, 64}),
            v = rng.normal_tensor<4>({1, 2, 8, 4});
    Tensor4 w_scaled, w_unscaled, w_sharper;
    attn::scaled_dot_product_attention(q, k, v, {}, &w_scaled);
    attn::scaled_dot_product_attention(q, k, v, {}, &w_unscaled, 1.0f);
    attn::scaled_dot_product_attention(q, k, v, {}, &w_sharper, 4.0f);
    const Tensor1 a = mean_entropy_per_head(w_scaled), b = mean_entropy_per_head(w_unscaled),
                  c = mean_entropy_per_head(w_sharper);
    REQUIRE(a.size() == 2);
    for (std::size_t h = 0; h < 2; ++h) {
        CAPTURE(h);
        CHECK(a(h) > b(h));
        CHECK(b(h) > c(h));
        CHECK(a(h) <= static_cast<float>(std::log(8.0)));
    }
}

TEST_CASE("weights that are not probabilities are rejected with std::invalid_argument") {
    SUBCASE("a negative weight") {
        CHECK_THROWS_AS(attention_entropy(Tensor4({{{{1.5f, -0.5f}}}})), std::invalid_argument);
    }
    SUBCASE("a row that does not sum to 1") {
        CHECK_THROWS_AS(attention_entropy(Tensor4({{{{0.5f, 0.6f}}}})), std::invalid_argument);
        CHECK_THROWS_AS(mean_entropy_per_head(Tensor4({{{{0.2f, 0.2f}}}})), std::invalid_argument);
    }
}
