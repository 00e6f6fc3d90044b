// Checks for exercise 05: the forward pass of one head, in evaluation mode.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for any sizes and magnitudes, changing one token moves no earlier token's output and no other
//   sequence's; W_v times 2^e scales the output by 2^e, and 2^e moved from W_k to W_q changes nothing
#include "exercise.hpp"

#include "attn/attention.hpp"
#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/head_fixtures.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <algorithm>
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
         "it may see (after the mask) before exp, or e^s overflows to inf (inf/inf = NaN); and do "
         "not exponentiate the masked scores: a masked score above that maximum gives e^(s - m) = "
         "inf, and inf·0 is NaN, so set a masked key's weight to 0 without computing it");
    CHECK_MESSAGE(xt::all(xt::isfinite(got)), "the output holds NaN or inf");
    // Scores of ~2e3 (Σ|qk|/√8 ≈ 2.2e3, q ≈ 35) carry 2γ_8·2.2e3 ≈ 2e-3 plus the projections'
    // 2γ_16 relative, ~1e-2 at worst, ≈ 1.2e-3 with random signs (u = 2^-24). A weight moves
    // by p(1 − p)·Δs, ≈ 0 for these near one-hot rows and ≤ ¼·2·1.2e-3 = 6e-4 of the output's
    // scale if two allowed scores tie within ~1: 1e-3 of the largest output rests on the
    // random-sign estimate. The mistakes give NaN, inf or zeros: off by the scale itself.
    const double scale = xt::amax(xt::abs(expected))();
    CHECK_CLOSE(got, expected, 1e-3 * scale);
}

TEST_CASE("an allowed score far below any finite fill value: the first token still sees only itself") {
    // C = hs = 1, W_q = 1, W_k = −1, W_v = 1 and x = (a, −a): q = x, k = −x, v = x, and the
    // score of query i with key j is −x_i·x_j. Row 0 may see only key 0, score −a²; row 1
    // sees both, scores (a², −a²). So out = (a, a) exactly: row 0 has one weight, 1, and
    // row 1's second weight is e^(−2a²) = 0 in float. A mask that fills with a finite value
    // (−1e9, −1e30, −FLT_MAX/2) instead of −∞ leaves row 0's masked score above −a² once
    // a² passes it, and row 0 then reads the future token: out[0] = −a. a = 1.5e19 gives
    // a² = 2.25e38, still finite (FLT_MAX ≈ 3.4e38), and below −FLT_MAX/2 ≈ −1.7e38.
    const Tensor2 one = {{1.0f}}, minus_one = {{-1.0f}};
    for (float a : {1e5f, 1e16f, 1.5e19f}) {
        CAPTURE(a);
        const Tensor3 x = {{{a}, {-a}}};
        INFO("row 0 may attend only to itself, whose score is -a² = " << -static_cast<double>(a) * a
             << ": the masked key must get weight 0 however low the allowed score is; fill the "
                "masked scores with -infinity, not a large negative number");
        // Exact: every weight is exactly 0 or 1 here (e^0 = 1, e^(−2a²) = 0, e^−∞ = 0).
        CHECK_CLOSE(head_forward(x, minus_one, one, one, attn::causal_mask(2)),
                    Tensor3({{{a}, {a}}}), 0.0);
    }
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

TEST_CASE("property: for any sizes and magnitudes, changing one token moves no earlier token's output and no other sequence's") {
    // B from 1 to 3, T from 1 to 8 (1 a quarter of the time), C and hs from 1 to 8, inputs
    // N(0, σ) with σ from 10^−3 to 10^18 (capped so that no score passes 10^37 in size:
    // scores reach ~10^36, far below any finite fill value such as −1e9 or −1e30, and stay
    // finite), weights N(0, 1/C); then token (b', t') changes by a drawn amount. Causal
    // attention reads only positions ≤ t, and each sequence only itself, so every output at
    // (b, t) with b ≠ b' or t < t' must stay exactly as it was: the same numbers go through
    // the same operations (a hidden key's weight is exactly 0 whatever its score). Reading a
    // later key (unmasked, or masked with a finite value that an allowed score falls below),
    // or another sequence, moves them.
    // Then two exact invariances (powers of two 2^e, e from −8 to 8, scale floats exactly):
    // W_v times 2^e multiplies every output by 2^e, and W_q times 2^e with W_k divided by
    // it leaves every score, so every output, as it was, bit for bit.
    attn::check_property("head_forward is causal, keeps sequences apart, and scales with W_v", [] {
        const std::size_t B = attn::draw("B", attn::family::length(3)),
                          T = attn::draw("T", attn::family::length(8)),
                          C = attn::draw("C", rc::gen::inRange<std::size_t>(1, 9)),
                          hs = attn::draw("hs", rc::gen::inRange<std::size_t>(1, 9));
        const float drawn_sigma = std::abs(attn::draw("sigma", attn::family::magnitude(-3, 18)));
        attn::Rng rng(attn::draw("seed", rc::gen::inRange<std::uint64_t>(0, 1000000)));
        const float spread = 1.0f / std::sqrt(static_cast<float>(C));
        const Tensor2 wk = rng.normal_tensor<2>({hs, C}, 0.0f, spread),
                      wq = rng.normal_tensor<2>({hs, C}, 0.0f, spread),
                      wv = rng.normal_tensor<2>({hs, C}, 0.0f, spread);
        const Tensor3 unit = rng.normal_tensor<3>({B, T, C});
        // The largest score at σ = 1, bounded in float64: max|q|·max|k|·hs/√hs.
        double q_max = 0.0, k_max = 0.0;
        for (std::size_t r = 0; r < B * T; ++r)
            for (std::size_t o = 0; o < hs; ++o) {
                double qo = 0.0, ko = 0.0;
                for (std::size_t c = 0; c < C; ++c) {
                    qo += static_cast<double>(unit.flat(r * C + c)) * wq(o, c);
                    ko += static_cast<double>(unit.flat(r * C + c)) * wk(o, c);
                }
                q_max = std::max(q_max, std::abs(qo));
                k_max = std::max(k_max, std::abs(ko));
            }
        const double largest = q_max * k_max * std::sqrt(static_cast<double>(hs)) + 1e-30;
        const float sigma = static_cast<float>(std::min<double>(drawn_sigma, std::sqrt(1e37 / largest)));
        Tensor3 x = unit * sigma;
        const attn::Mask<2> tril = attn::causal_mask(T);
        const Tensor3 before = head_forward(x, wk, wq, wv, tril);
        const float scale = attn::draw("scale", attn::family::scale());
        const Tensor3 v_scaled = head_forward(x, wk, wq, Tensor2(wv * scale), tril);
        const Tensor3 qk_moved = head_forward(x, Tensor2(wk / scale), Tensor2(wq * scale), wv, tril);
        for (std::size_t i = 0; i < before.size(); ++i) {
            RC_ASSERT(v_scaled.flat(i) == before.flat(i) * scale);
            RC_ASSERT(qk_moved.flat(i) == before.flat(i));
        }
        const std::size_t b1 = attn::draw("changed b", rc::gen::inRange<std::size_t>(0, B)),
                          t1 = attn::draw("changed t", rc::gen::inRange<std::size_t>(0, T));
        const float delta = sigma * static_cast<float>(attn::draw("change (times sigma)", rc::gen::inRange(1, 4)));
        for (std::size_t c = 0; c < C; ++c) x(b1, t1, c) += c % 2 ? delta : -delta;
        const Tensor3 after = head_forward(x, wk, wq, wv, tril);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < T; ++t)
                if (b != b1 || t < t1)
                    for (std::size_t i = 0; i < hs; ++i) RC_ASSERT(after(b, t, i) == before(b, t, i));
    });
}
