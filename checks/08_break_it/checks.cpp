// Checks for exercise 08: the attention-entropy measure.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - any distributions, with zeros and weights down to 1e-5: each row's entropy and each head's mean
// - no weight is too small to count: one large weight and weights down to 1e-12, in any order
// - a row holding NaN or an infinite weight is refused
// - a negative weight however small is refused, even when the row sums to 1
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"
#include "attn/sdpa.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <cmath>
#include <limits>
#include <vector>

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
    // −Σ p ln p over ≤ 4 terms: in double, only the final ½ulp (≤ 6e-8); even in float32,
    // γ_4 Σ|p ln p| plus ln's and the product's rounding ≲ 6u·1.39 ≈ 5e-7 (u = 2^-24): 2×
    // under 1e-6. The mistakes (log2: ×1.44, no minus, 0 ln 0 as NaN) are off by ≥ 0.3.
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
    // Weights 1/(i + 1) rounded (u relative, so u absolute in ln), rows of ≤ 6 terms: in float
    // γ_6·ln 6 ≈ 6.4e-7 per row at worst (u = 2^-24), less in double; the mean of 6 rows and
    // ½ulp(1.1) keep it ≲ 7e-7, under 1e-6. Dividing by B·T_k or over heads is off by ≥ 0.1.
    CHECK_CLOSE(mean_entropy_per_head(w), Tensor1({static_cast<float>(expected)}), 1e-6);
}

TEST_CASE("the mean per head averages over batch items and positions") {
    // Two batch items, two heads, two positions of two keys each.
    // Head 0: entropies 0, ln 2 | ln 2, ln 2 → mean 0.75 ln 2. Head 1: all 0 → 0.
    Tensor4 w = {{{{1, 0}, {0.5f, 0.5f}}, {{1, 0}, {0, 1}}},
                 {{{0.5f, 0.5f}, {0.5f, 0.5f}}, {{0, 1}, {1, 0}}}};
    // Entropies 0 and ln 2 of exact weights, a mean of 4: ≲ 3u·0.52 ≈ 1e-7 (u = 2^-24).
    // Averaging over heads instead of batch items gives 0.35 and 0.17: off by ≥ 0.17.
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

TEST_CASE("the mean runs over the query positions, whatever the number of keys") {
    // Head 0's rows spread evenly over 4 keys (ln 4 each), head 1's are one-hot (0), for
    // T_q = 3 queries over T_k = 5 keys and T_q = 4 over T_k = 2 (two keys: ln 2 each).
    // The mean of each head's B·T_q entropies is its row entropy: dividing by B·T_k is not.
    Tensor4 wide = xt::zeros<float>({2, 2, 3, 5}), tall = xt::zeros<float>({2, 2, 4, 2});
    for (std::size_t b = 0; b < 2; ++b) {
        for (std::size_t i = 0; i < 3; ++i) {
            for (std::size_t j = 0; j < 4; ++j) wide(b, 0, i, j) = 0.25f;
            wide(b, 1, i, i) = 1.0f;
        }
        for (std::size_t i = 0; i < 4; ++i) {
            tall(b, 0, i, 0) = tall(b, 0, i, 1) = 0.5f;
            tall(b, 1, i, i % 2) = 1.0f;
        }
    }
    INFO("each head's mean is over its B·T_q rows (B = 2 batch items, T_q queries), not B·T_k");
    // Each row's entropy −Σ p ln p sums at most 4 terms of size ≤ ln 4/4 with weights 1/4,
    // 1/2 or 1 (exact), so ≤ (4 + 2)u·ln 4 ≈ 5e-7 with the logarithms' ½ulp (u = 2^-24); the
    // mean of 6 (wide) or 8 (tall) rows adds ≤ 8u·ln 4 ≈ 7e-7 at worst: 1e-6 is above both.
    // Dividing by B·T_k instead gives 0.6·ln 4 (wide, 0.55 off) and 2·ln 2 (tall, 0.69 off).
    CHECK_CLOSE(mean_entropy_per_head(wide), Tensor1({ln(4), 0.0f}), 1e-6);
    CHECK_CLOSE(mean_entropy_per_head(tall), Tensor1({ln(2), 0.0f}), 1e-6);
}

TEST_CASE("one key: every row is [1], entropy 0") {
    const Tensor4 w = xt::ones<float>({2, 3, 4, 1});
    CHECK_CLOSE(attention_entropy(w), xt::zeros<float>({2, 3, 4}), 0.0);
}

TEST_CASE("an even spread over 2048 keys has entropy ln 2048: no weight is too small to count") {
    // Every weight is 1/2048 ≈ 4.9e-4; each adds (1/2048)·ln 2048 to the entropy.
    Tensor4 w = xt::zeros<float>({1, 1, 2, 2048});
    xt::view(w, 0, 0, 0) = 1.0f / 2048.0f;
    w(0, 0, 1, 7) = 1.0f;  // and a one-hot row beside it
    INFO("an even spread over n keys has entropy ln n = 7.6246189 for n = 2048, however small "
         "each weight: only a weight of exactly 0 adds nothing");
    // 2048 terms of (1/2048)·ln 2048: summed in double the result is exact to float32
    // rounding (½ulp(7.6) ≈ 2.4e-7), but the contract does not ask for a double sum, and in
    // float32 the bound is γ_2047·7.6 ≈ 2047u·7.6 ≈ 9.3e-4 (u = 2^-24; all terms are equal and
    // positive, so the rounding errors do not cancel: a float sum is measured 1.4e-4 off).
    // 1e-3 holds for either; leaving out weights below 1e-3 gives 0, off by 7.6.
    CHECK_CLOSE(attention_entropy(w), Tensor3({{{ln(2048), 0.0f}}}), 1e-3);
}

TEST_CASE("rows are accepted within 1e-3 of 1 and refused beyond it") {
    INFO("the contract's tolerance is 1e-3: a row summing to 1.0005 or 0.9995 is accepted, "
         "1.005 or 0.995 refused");
    // Sums of two float32 numbers, computed in double: 0.5 + 0.5005 = 1.0005 up to 1e-8.
    CHECK_NOTHROW(attention_entropy(Tensor4({{{{0.5f, 0.5005f}, {0.5f, 0.4995f}}}})));
    CHECK_THROWS_AS(attention_entropy(Tensor4({{{{0.5f, 0.505f}}}})), std::invalid_argument);
    CHECK_THROWS_AS(attention_entropy(Tensor4({{{{0.5f, 0.495f}}}})), std::invalid_argument);
}

TEST_CASE("weights that are not probabilities are rejected with std::invalid_argument") {
    SUBCASE("a negative weight") {
        CHECK_THROWS_AS(attention_entropy(Tensor4({{{{1.5f, -0.5f}}}})), std::invalid_argument);
        // A tiny negative weight in a row that sums to 1 (and whose positive entries sum to
        // 1.0005, within the tolerance): refused for its sign, not for its sum.
        INFO("{0.6, 0.4005, -0.0005} sums to 1, but a weight of -0.0005 is no probability");
        CHECK_THROWS_AS(attention_entropy(Tensor4({{{{0.6f, 0.4005f, -0.0005f}}}})),
                        std::invalid_argument);
    }
    SUBCASE("a row of zeros: a query that attends to nothing") {
        INFO("a row of zeros sums to 0, not 1: the contract refuses it");
        CHECK_THROWS_AS(attention_entropy(Tensor4({{{{0.5f, 0.5f}, {0.0f, 0.0f}}}})),
                        std::invalid_argument);
        CHECK_THROWS_AS(mean_entropy_per_head(Tensor4({{{{0.0f, 0.0f, 0.0f}}}})),
                        std::invalid_argument);
    }
    SUBCASE("a row that does not sum to 1") {
        CHECK_THROWS_AS(attention_entropy(Tensor4({{{{0.5f, 0.6f}}}})), std::invalid_argument);
        CHECK_THROWS_AS(mean_entropy_per_head(Tensor4({{{{0.2f, 0.2f}}}})), std::invalid_argument);
    }
}

TEST_CASE("property: any distributions, with zeros and weights down to 1e-5: each row's entropy and each head's mean") {
    // B, NH, T_q from 1 to 3 and T_k from 1 to 40 (1 a quarter of the time); row j's weights
    // are drawn counts (0 to 5, or 10^−4) divided by their sum in float, so rows hold zeros
    // and weights down to ~10^−5 and sum to 1 within T_k·u. The reference is −Σ p ln p in
    // float64 on those floats. Bound (u = 2^-24): each term p·ln p within ~3u of itself
    // (ln's 1ulp, the product, a float conversion), the sum of ≤ T_k terms γ_(T_k):
    // ≤ (T_k + 4)u·Σ|p ln p| + 10^−12; the head's mean adds one more sum and a division:
    // (T_k + 8 + B·T_q)u on its terms.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("attention_entropy and mean_entropy_per_head equal −Σ p ln p", [u] {
        const std::size_t B = attn::draw("B", attn::family::length(3)),
                          NH = attn::draw("NH", attn::family::length(3)),
                          Tq = attn::draw("T_q", attn::family::length(3)),
                          Tk = attn::draw("T_k", attn::family::length(40));
        const auto count = rc::gen::oneOf(rc::gen::map(rc::gen::inRange(0, 6), [](int c) { return static_cast<float>(c); }),
                                          rc::gen::just(1e-4f));
        const auto counts = attn::draw("counts (flat, each row divided by its sum)",
                                       rc::gen::container<std::vector<float>>(B * NH * Tq * Tk, count));
        Tensor4 w = xt::zeros<float>({B, NH, Tq, Tk});
        for (std::size_t r = 0; r < B * NH * Tq; ++r) {
            std::vector<float> c(counts.begin() + r * Tk, counts.begin() + (r + 1) * Tk);
            float total = 0.0f;
            for (float x : c) total += x;
            if (total == 0.0f) total = c[0] = 1.0f;
            for (std::size_t j = 0; j < Tk; ++j) w.flat(r * Tk + j) = c[j] / total;
        }
        const Tensor3 H = attention_entropy(w);
        const Tensor1 mean = mean_entropy_per_head(w);
        const double n_rows = static_cast<double>(B * Tq), tk = static_cast<double>(Tk);
        for (std::size_t h = 0; h < NH; ++h) {
            double head = 0.0, head_abs = 0.0;
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t i = 0; i < Tq; ++i) {
                    double e = 0.0, e_abs = 0.0;
                    for (std::size_t j = 0; j < Tk; ++j) {
                        const double p = w(b, h, i, j);
                        if (p > 0) {
                            e -= p * std::log(p);
                            e_abs += std::abs(p * std::log(p));
                        }
                    }
                    RC_ASSERT(std::abs(H(b, h, i) - e) <= (tk + 4) * u * e_abs + 1e-12);
                    head += e;
                    head_abs += e_abs;
                }
            RC_ASSERT(std::abs(mean(h) - head / n_rows) <= (tk + 8 + n_rows) * u * head_abs / n_rows + 1e-12);
        }
    });
}

TEST_CASE("property: no weight is too small to count: one large weight and weights down to 1e-12, in any order") {
    // A row of T_k = 2 … 40 keys: T_k − 1 weights of 10^−12 … 10^−4 (each drawn, of any
    // size in that range) and one of 1 − their sum, in a drawn order. Its entropy is
    // dominated by the tiny weights (10^−8 adds 10^−8·18.4), so leaving out weights below a
    // threshold (FLT_EPSILON, 1e-6, 1e-4) loses most of it. Reference: −Σ p ln p in float64
    // on the same floats; bound (u = 2^-24) as above, (T_k + 4)u·Σ|p ln p|, relative since
    // every term is: each p·ln p is within ~3u of itself and the sum adds γ_(T_k). Then the
    // same row in another order (invariance under a permutation of the keys): within the
    // sum of both bounds, as the terms are added in another order.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("attention_entropy counts weights down to 1e-12, and the order of the keys does not matter", [u] {
        const std::size_t Tk = attn::draw("T_k", rc::gen::inRange<std::size_t>(2, 41));
        const auto tiny = attn::draw("the small weights",
                                     rc::gen::container<std::vector<float>>(Tk - 1, attn::family::magnitude(-12, -4)));
        const auto order = attn::draw("the keys' order", attn::family::permutation(Tk));
        std::vector<float> row(Tk);
        double rest = 0.0;
        for (std::size_t j = 0; j + 1 < Tk; ++j) rest += row[j + 1] = std::abs(tiny[j]);
        row[0] = static_cast<float>(1.0 - rest);
        Tensor4 w = xt::zeros<float>({std::size_t{1}, std::size_t{1}, std::size_t{2}, Tk});
        double e = 0.0, e_abs = 0.0;
        for (std::size_t j = 0; j < Tk; ++j) {
            w(0, 0, 0, j) = row[j];
            w(0, 0, 1, j) = row[order[j]];
            const double p = row[j];
            if (p > 0) {
                e -= p * std::log(p);
                e_abs += std::abs(p * std::log(p));
            }
        }
        const Tensor3 H = attention_entropy(w);
        const double tol = (static_cast<double>(Tk) + 4) * u * e_abs;
        RC_ASSERT(std::abs(H(0, 0, 0) - e) <= tol);
        RC_ASSERT(std::abs(H(0, 0, 1) - H(0, 0, 0)) <= 2 * tol);
    });
}

TEST_CASE("property: a row holding NaN or an infinite weight is refused") {
    // A valid tensor (uniform rows) with one weight replaced by NaN, +inf or −inf: a NaN
    // row does not sum to 1 (its sum is NaN), +inf neither, and −inf is negative. Checks
    // written as "refuse when |sum − 1| > 1e-3" or "when p < 0" let NaN through (every
    // comparison with NaN is false), and the row would get an entropy of 0.
    attn::check_property("attention_entropy and mean_entropy_per_head refuse NaN and ±inf", [] {
        const std::size_t B = attn::draw("B", attn::family::length(2)),
                          NH = attn::draw("NH", attn::family::length(2)),
                          Tq = attn::draw("T_q", attn::family::length(3)),
                          Tk = attn::draw("T_k", attn::family::length(6));
        Tensor4 w = xt::ones<float>({B, NH, Tq, Tk}) / static_cast<float>(Tk);
        const std::size_t at = attn::draw("position (flat)", rc::gen::inRange<std::size_t>(0, w.size()));
        w.flat(at) = attn::draw("the bad weight", attn::family::non_finite());
        RC_ASSERT(attn::refused([&] { (void)attention_entropy(w); }));
        RC_ASSERT(attn::refused([&] { (void)mean_entropy_per_head(w); }));
    });
}

TEST_CASE("property: a negative weight however small is refused, even when the row sums to 1") {
    // A uniform row of T_k = 2 … 8 keys with one weight made negative, −10^−44 (a denormal)
    // … −10^−4, or out of the range [0, ∞) (NaN, the smallest denormal below 0, −1, −∞),
    // and the same amount added to another weight so that the row still sums to 1 (as far
    // as float can say): the contract refuses any negative weight, with no tolerance.
    attn::check_property("attention_entropy refuses every negative weight", [] {
        const std::size_t Tk = attn::draw("T_k", rc::gen::inRange<std::size_t>(2, 9));
        const float bad = attn::draw(
            "the negative weight",
            rc::gen::oneOf(rc::gen::map(attn::family::magnitude(-44, -4), [](float x) { return -std::abs(x); }),
                           attn::family::out_of_range(0.0f, std::numeric_limits<float>::infinity())));
        const std::size_t at = attn::draw("its key", rc::gen::inRange<std::size_t>(0, Tk));
        Tensor4 w = xt::ones<float>({std::size_t{1}, std::size_t{1}, std::size_t{1}, Tk}) / static_cast<float>(Tk);
        w(0, 0, 0, (at + 1) % Tk) += w(0, 0, 0, at) - bad;
        w(0, 0, 0, at) = bad;
        RC_ASSERT(attn::refused([&] { (void)attention_entropy(w); }));
    });
}
