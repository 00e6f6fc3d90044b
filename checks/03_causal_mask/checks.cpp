// Checks for exercise 03: the causal mask and the masked fill.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for any block size, batch and scores of any value, the mask is j <= i and the fill keeps every allowed score
// - masks of every kind and any shape, over distinct scores: each allowed score kept where it is, −inf elsewhere
#include "exercise.hpp"

#include "attn/attention.hpp"
#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

using attn::Mask;
using attn::Tensor3;

namespace {
constexpr float inf = std::numeric_limits<float>::infinity();

// The same float, NaN included (NaN == NaN is false).
bool same(float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); }
}

TEST_CASE("the mask at block size 4 is lower triangular, as drawn by hand") {
    const Mask<2> expected = {{true, false, false, false},
                              {true, true, false, false},
                              {true, true, true, false},
                              {true, true, true, true}};
    const Mask<2> m = exercise::causal_mask(4);
    REQUIRE(attn::shape_of(m) == "(4, 4)");
    CHECK_CLOSE(m, expected, 0.0);
}

TEST_CASE("masked_fill of a small input writes -inf above the diagonal and keeps the rest") {
    Tensor3 scores = {{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}}, {{-1, -2, -3}, {-4, -5, -6}, {-7, -8, -9}}};
    const Mask<2> mask = {{true, false, false}, {true, true, false}, {true, true, true}};
    const Tensor3 expected = {{{1, -inf, -inf}, {4, 5, -inf}, {7, 8, 9}},
                              {{-1, -inf, -inf}, {-4, -5, -inf}, {-7, -8, -9}}};
    CHECK_CLOSE(exercise::masked_fill(scores, mask), expected, 0.0);
}

TEST_CASE("agrees with the library on random scores, masks and sizes") {
    attn::Rng rng(1);
    for (std::size_t n : {1, 2, 5, 8, 13}) {
        CAPTURE(n);
        CHECK_CLOSE(exercise::causal_mask(n), attn::causal_mask(n), 0.0);
        Tensor3 scores = rng.normal_tensor<3>({3, n, n + 1});
        Mask<2> mask({n, n + 1});
        for (auto& allowed : mask) allowed = rng.uniform() < 0.5f;  // any pattern, not only causal
        CHECK_CLOSE(exercise::masked_fill(scores, mask), attn::masked_fill(scores, mask), 0.0);
    }
}

TEST_CASE("masked_fill with more queries than keys, and with one sequence") {
    // The check above has T_k = T_q + 1 and three sequences: here T_q > T_k, and B = 1.
    attn::Rng rng(3);
    for (std::size_t B : {1, 2}) {
        for (const auto& [T_q, T_k] : {std::pair<std::size_t, std::size_t>{5, 2}, {1, 1}, {4, 1}}) {
            CAPTURE(B);
            CAPTURE(T_q);
            CAPTURE(T_k);
            const Tensor3 scores = rng.normal_tensor<3>({B, T_q, T_k});
            Mask<2> mask({T_q, T_k});
            for (auto& allowed : mask) allowed = rng.uniform() < 0.5f;
            CHECK_CLOSE(exercise::masked_fill(scores, mask), attn::masked_fill(scores, mask), 0.0);
        }
    }
}

TEST_CASE("after the mask and the softmax no token gives weight to a later token") {
    attn::Rng rng(2);
    Tensor3 scores = rng.normal_tensor<3>({2, 7, 7}, 0.0f, 3.0f);
    const Tensor3 w = attn::softmax(exercise::masked_fill(scores, exercise::causal_mask(7)));
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t i = 0; i < 7; ++i) {
            CAPTURE(b);
            CAPTURE(i);
            // The allowed weights are a distribution: Σ_j e_j/Z with Z summed from the same
            // rounded e_j leaves Z's γ_6, the divisions' u and xt::sum's γ_6, ≤ 13u ≈ 7.7e-7
            // (u = 2^-24); Approx allows 1e-6·(1 + 1) = 2e-6, 2.6× above. The mask mistakes
            // (−1e9 kept, 0 instead of −inf, a future token let through) put ≥ 1e-3 of weight
            // on j > i (scores N(0, 3)), which the exact == 0 below catches.
            CHECK(xt::sum(xt::view(w, b, i))() == doctest::Approx(1.0).epsilon(1e-6));
            for (std::size_t j = i + 1; j < 7; ++j) CHECK(w(b, i, j) == 0.0f);
        }
}

TEST_CASE("no row of a causal mask is fully masked: each token may attend to itself") {
    for (std::size_t n = 1; n <= 16; ++n) {
        const Mask<2> m = exercise::causal_mask(n);
        for (std::size_t i = 0; i < n; ++i) {
            CAPTURE(n);
            CAPTURE(i);
            CHECK(m(i, i));
        }
    }
}

TEST_CASE("property: for any block size, batch and scores of any value, the mask is j <= i and the fill keeps every allowed score") {
    // Block sizes 1 … 40, batches 1 … 3, T up to the block size (1 a quarter of the time),
    // scores drawn from ±10^−6 … 10^38, 0, −∞, NaN and +∞: causal_mask(n)(i, j) is exactly
    // j ≤ i, and masked_fill leaves every allowed score as it is (−∞ and NaN included) and
    // puts −∞ wherever the mask is false, whatever the score there was (a large one must not
    // survive as it would with a −1e9 fill). Every batch item is treated alike.
    attn::check_property("causal_mask and masked_fill for any size and any scores", [] {
        const std::size_t n = attn::draw("block_size", rc::gen::inRange<std::size_t>(1, 41));
        const Mask<2> mask = exercise::causal_mask(n);
        RC_ASSERT(mask.shape()[0] == n && mask.shape()[1] == n);
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t j = 0; j < n; ++j) RC_ASSERT(mask(i, j) == (j <= i));
        const std::size_t B = attn::draw("B", attn::family::length(3)),
                          T = std::min(n, attn::draw("T (at most block_size)", attn::family::length(40)));
        const auto value = rc::gen::oneOf(attn::scores_or_masked(attn::family::magnitude(-6, 38)),
                                          attn::family::non_finite());
        const auto drawn = attn::draw("scores (flat)", rc::gen::container<std::vector<float>>(B * T * T, value));
        Tensor3 scores = xt::zeros<float>({B, T, T});
        std::copy(drawn.begin(), drawn.end(), scores.begin());
        const Mask<2> square = exercise::causal_mask(T);
        const Tensor3 filled = exercise::masked_fill(scores, square);
        RC_ASSERT(filled.shape() == scores.shape());
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < T; ++i)
                for (std::size_t j = 0; j < T; ++j) {
                    if (j <= i)  // kept as it is, NaN included
                        RC_ASSERT(same(filled(b, i, j), scores(b, i, j)));
                    else
                        RC_ASSERT(filled(b, i, j) == -std::numeric_limits<float>::infinity());
                }
    });
}

TEST_CASE("property: masks of every kind and any shape, over distinct scores: each allowed score kept where it is, −inf elsewhere") {
    // T_q and T_k from 1 to 6 (1 a quarter of the time, T_q ≠ T_k as often as not), B from
    // 1 to 3, a mask whose rows let through the leading keys, the trailing ones, every other
    // one, one key, all keys, or the causal pattern (family::mask), and scores pairwise
    // distinct, so that a score read from another place (the mask read as mask(j, i), a
    // score from another row or batch item) is seen. masked_fill must keep score (b, i, j)
    // exactly where mask(i, j) is true and write −∞ where it is false.
    attn::check_property("masked_fill for any mask", [] {
        const std::size_t B = attn::draw("B", attn::family::length(3)), Tq = attn::draw("T_q", attn::family::length(6)),
                          Tk = attn::draw("T_k", attn::family::length(6));
        const Mask<2> mask = attn::family::mask("mask", Tq, Tk);
        const auto values = attn::draw("scores (flat, distinct)", attn::family::distinct(B * Tq * Tk));
        Tensor3 scores = xt::zeros<float>({B, Tq, Tk});
        std::copy(values.begin(), values.end(), scores.begin());
        const Tensor3 filled = exercise::masked_fill(scores, mask);
        RC_ASSERT(filled.shape() == scores.shape());
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < Tq; ++i)
                for (std::size_t j = 0; j < Tk; ++j)
                    RC_ASSERT(filled(b, i, j) == (mask(i, j) ? scores(b, i, j) : -std::numeric_limits<float>::infinity()));
    });
}

TEST_CASE("bad input is rejected with std::invalid_argument") {
    SUBCASE("a block size of 0") {
        CHECK_THROWS_AS(exercise::causal_mask(0), std::invalid_argument);
    }
    SUBCASE("a mask that does not fit the scores") {
        Tensor3 scores = xt::zeros<float>({2, 3, 3});
        CHECK_THROWS_AS(exercise::masked_fill(scores, attn::causal_mask(4)),
                        std::invalid_argument);
        CHECK_THROWS_AS(exercise::masked_fill(scores, Mask<2>(xt::ones<bool>({3, 2}))),
                        std::invalid_argument);
        // Scores (2, 3, 4) take a (3, 4) mask; a (4, 3) one has as many entries.
        INFO("the mask must have the shape of the scores' last two axes, (3, 4), not (4, 3)");
        Tensor3 wide = xt::zeros<float>({2, 3, 4});
        CHECK_THROWS_AS(exercise::masked_fill(wide, Mask<2>(xt::ones<bool>({4, 3}))),
                        std::invalid_argument);
    }
}
