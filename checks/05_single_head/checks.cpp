// Checks for exercise 05: the forward pass of one head, in evaluation mode.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for any sizes, changing one token moves no earlier token's output and no other sequence's
#include "exercise.hpp"

#include "attn/attention.hpp"
#include "attn/check.hpp"
#include "attn/head_fixtures.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <cmath>
#include <utility>

using attn::Tensor2;
using attn::Tensor3;
using exercise::head_forward;

TEST_CASE("the hand-worked example gives the rows computed on paper") {
    const Tensor2 identity = xt::eye<float>(2);
    Tensor3 x = {{{1, 0}, {0, 1}, {1, 1}}};
    // Scores are q·k/√2. Row 1: (0, 1)/√2, weights 1/(1+e^s), e^s/(1+e^s) with s = 1/√2.
    // Row 2: (1, 1, 2)/√2, weights e^s, e^s, e^2s over their sum; out = (w0 + w2, w1 + w2).
    const float s = 1.0f / std::sqrt(2.0f);
    const float a = 1.0f / (1.0f + std::exp(s));
    const float sum = 2.0f * std::exp(s) + std::exp(2.0f * s);
    const float w0 = std::exp(s) / sum, w2 = std::exp(2.0f * s) / sum;
    const Tensor3 expected = {{{1, 0}, {a, 1 - a}, {w0 + w2, w0 + w2}}};
    INFO("scores q·k/√2 (masked causally): row 0 attends to itself, (1, 0); row 1's scores "
         "(0, 1/√2) give (0.3302, 0.6698); row 2's (1, 1, 2)/√2 give (0.7517, 0.7517)");
    // Identity projections are exact; 2/√2 against 2·(1/√2) and the exps, sums and divisions
    // differ by ≲ 6u ≈ 3.6e-7 on values ≤ 1 (u = 2^-24): 2.8× under 1e-6. The mistakes
    // (no mask, mask after softmax, k·qᵀ, double scaling, v from W_k) move rows by ≥ 0.05.
    CHECK_CLOSE(head_forward(x, identity, identity, identity, attn::causal_mask(3)), expected,
                1e-6);
    // The same numbers to four decimals: 1.0000 0.0000 / 0.3302 0.6698 / 0.7517 0.7517.
    // They are off by 3.8e-5 and 4.5e-5 (0.669762, 0.751745); Approx allows 2e-4·(1 + x),
    // 2.7e-4 and 3.5e-4.
    CHECK(a == doctest::Approx(0.3302).epsilon(2e-4));
    CHECK(w0 + w2 == doctest::Approx(0.7517).epsilon(2e-4));
}

TEST_CASE("agrees with PyTorch's head on the reference fixtures") {
    const auto cases = attn::check::load_head_cases();
    REQUIRE(cases.size() >= 5);
    for (const auto& c : cases) {
        CAPTURE(c.name);
        // PyTorch and BLAS sum in different orders: 2γ_n Σ|terms| per sum (u = 2^-24) through
        // the projections (n = C ≤ 32), scores (hs ≤ 16), softmax and Σ p v (T ≤ 16): worst
        // case ≤ 1.1e-4 from the fixtures, random-sign estimate ≤ 8.1e-7 but 1.3e-6 and
        // 1.7e-6 on the two C = 32 fixtures (tests/test_attention.cpp): 1e-5 is 6× that.
        // The mistakes move outputs by ≥ 0.05 (no mask: O(0.3)).
        CHECK_CLOSE(head_forward(c.x, c.w_key, c.w_query, c.w_value,
                                 attn::causal_mask(c.block_size)),
                    c.out, 1e-5);
    }
}

TEST_CASE("agrees with attn::Head on random input, and later tokens do not change earlier ones") {
    attn::Rng rng(1);
    attn::Head head(24, 8, 10, 0.0f, rng);
    Tensor3 x = rng.normal_tensor<3>({3, 7, 24});
    const Tensor3 out = head_forward(x, head.key.weight, head.query.weight, head.value.weight,
                                     head.tril);
    // The same library steps in the same order: 0. In another order (a loop for the
    // projections, n = 24, |w| ≤ 0.2, Σ|x w| ≈ 1.9): 2γ_24·1.9 ≈ 5.4e-6 worst (u = 2^-24),
    // √24 u·1.9 ≈ 5.6e-7 random-sign per projection, ~1e-6 on outputs: 1e-6 is then tight.
    CHECK_CLOSE(out, head.forward(x), 1e-6);
    xt::view(x, xt::all(), 4) += 3.0f;  // change token 4 of every sequence
    const Tensor3 changed = head_forward(x, head.key.weight, head.query.weight,
                                         head.value.weight, head.tril);
    // Exactly equal in fact: rows 0..3 never read token 4, the same inputs in the same order.
    CHECK_CLOSE(xt::view(changed, xt::all(), xt::range(0, 4)),
                xt::view(out, xt::all(), xt::range(0, 4)), 1e-6);
    CHECK(xt::amax(xt::abs(xt::view(changed, xt::all(), 4) - xt::view(out, xt::all(), 4)))() >
          1e-3f);
}

TEST_CASE("one token, one sequence, and a head wider than the input agree with attn::Head") {
    // The fixtures never have T = 1 (the first token attends to itself alone) or hs > C.
    attn::Rng rng(4);
    for (const auto& [C, hs] : {std::pair<std::size_t, std::size_t>{3, 8}, {8, 1}}) {
        attn::Head head(C, hs, 5, 0.0f, rng);
        for (std::size_t B : {1, 2}) {
            for (std::size_t T : {1, 5}) {
                CAPTURE(C);
                CAPTURE(hs);
                CAPTURE(B);
                CAPTURE(T);
                const Tensor3 x = rng.normal_tensor<3>({B, T, C});
                // The same library steps: 0; in another order n ≤ 8 sums of Σ|terms| ≲ 3,
                // 2γ_8·3 ≈ 2.9e-6 worst, √8 u·3 ≈ 5e-7 random-sign (u = 2^-24): 2× under 1e-6.
                CHECK_CLOSE(head_forward(x, head.key.weight, head.query.weight,
                                         head.value.weight, head.tril),
                            head.forward(x), 1e-6);
            }
        }
    }
}

TEST_CASE("inputs 60 times larger: each row's softmax subtracts its largest allowed score") {
    // Scores grow with the square of the input: ×60 puts them in the thousands, where e^s
    // overflows float unless each row's maximum is subtracted first, and where a maximum
    // taken over the masked (future) keys too leaves e^(s − m) = 0 for every allowed key.
    attn::Rng rng(5);
    attn::Head head(16, 8, 6, 0.0f, rng);
    const Tensor3 x = rng.normal_tensor<3>({2, 6, 16}) * 60.0f;
    const Tensor3 expected = head.forward(x);
    REQUIRE(xt::all(xt::isfinite(expected)));
    const Tensor3 got = head_forward(x, head.key.weight, head.query.weight, head.value.weight,
                                     head.tril);
    INFO("the scores are in the thousands here: subtract each row's largest score over the keys "
         "it may see (after the mask) before exp, or e^s overflows to inf (inf/inf = NaN)");
    CHECK_MESSAGE(xt::all(xt::isfinite(got)), "the output holds NaN or inf");
    // Scores of ~2e3 (Σ|qk|/√8 ≈ 2.2e3, q ≈ 35) carry 2γ_8·2.2e3 ≈ 2e-3 plus the projections'
    // 2γ_16 relative, ~1e-2 at worst, ≈ 1.2e-3 with random signs (u = 2^-24). A weight moves
    // by p(1 − p)·Δs, ≈ 0 for these near one-hot rows and ≤ ¼·2·1.2e-3 = 6e-4 of the output's
    // scale if two allowed scores tie within ~1: 1e-3 of the largest output rests on the
    // random-sign estimate. The mistakes give NaN, inf or zeros: off by the scale itself.
    const double scale = xt::amax(xt::abs(expected))();
    CHECK_CLOSE(got, expected, 1e-3 * scale);
}

TEST_CASE("bad input is rejected with std::invalid_argument") {
    attn::Rng rng(2);
    const Tensor2 w = rng.normal_tensor<2>({4, 6});
    const attn::Mask<2> tril = attn::causal_mask(5);
    SUBCASE("a sequence longer than the block size") {
        CHECK_THROWS_AS(head_forward(rng.normal_tensor<3>({1, 6, 6}), w, w, w, tril),
                        std::invalid_argument);
    }
    SUBCASE("an input whose width is not C") {
        CHECK_THROWS_AS(head_forward(rng.normal_tensor<3>({1, 3, 7}), w, w, w, tril),
                        std::invalid_argument);
    }
    SUBCASE("weights of different head sizes") {
        const Tensor2 other = rng.normal_tensor<2>({3, 6});
        Tensor3 x = rng.normal_tensor<3>({1, 3, 6});
        CHECK_THROWS_AS(head_forward(x, w, other, w, tril), std::invalid_argument);
        CHECK_THROWS_AS(head_forward(x, w, w, other, tril), std::invalid_argument);
    }
}

TEST_CASE("property: for any sizes, changing one token moves no earlier token's output and no other sequence's") {
    // B from 1 to 3, T from 1 to 8, C and hs from 1 to 8, inputs N(0, σ) with σ from 10^−3
    // to 10^2; then token (b', t') changes by a drawn amount. Causal attention reads only
    // positions ≤ t, and each sequence only itself, so every output at (b, t) with b ≠ b' or
    // t < t' must stay exactly as it was: the same numbers go through the same operations
    // (a hidden key's weight is exactly 0 whatever its score). Reading a later key, or
    // another sequence, moves them.
    attn::check_property("head_forward is causal and keeps sequences apart", [] {
        const std::size_t B = *rc::gen::inRange<std::size_t>(1, 4), T = *rc::gen::inRange<std::size_t>(1, 9),
                          C = *rc::gen::inRange<std::size_t>(1, 9), hs = *rc::gen::inRange<std::size_t>(1, 9);
        const float sigma = std::pow(10.0f, static_cast<float>(*rc::gen::inRange(-3, 3)));
        attn::Rng rng(*rc::gen::inRange<std::uint64_t>(0, 1000000));
        Tensor3 x = rng.normal_tensor<3>({B, T, C}, 0.0f, sigma);
        const Tensor2 wk = rng.normal_tensor<2>({hs, C}), wq = rng.normal_tensor<2>({hs, C}),
                      wv = rng.normal_tensor<2>({hs, C});
        const attn::Mask<2> tril = attn::causal_mask(T);
        const Tensor3 before = head_forward(x, wk, wq, wv, tril);
        const std::size_t b1 = *rc::gen::inRange<std::size_t>(0, B), t1 = *rc::gen::inRange<std::size_t>(0, T);
        const float delta = sigma * static_cast<float>(*rc::gen::inRange(1, 100));
        for (std::size_t c = 0; c < C; ++c) x(b1, t1, c) += c % 2 ? delta : -delta;
        const Tensor3 after = head_forward(x, wk, wq, wv, tril);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < T; ++t)
                if (b != b1 || t < t1)
                    for (std::size_t i = 0; i < hs; ++i) RC_ASSERT(after(b, t, i) == before(b, t, i));
    });
}

