// Checks for exercise 04: the stable softmax over the last axis.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - rows of logits of any size and sign, and masked ones, give the softmax
// - a NaN or +inf logit anywhere is refused, and a −inf one is a masked key
// - a row moved by a common offset, or its keys reordered, gives the same weights
#include "exercise.hpp"

#include "attn/attention.hpp"
#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

using attn::Tensor3;
using exercise::softmax_last_axis;

namespace {
constexpr float inf = std::numeric_limits<float>::infinity();

// A logit of any finite size, or masked: ±(1.00 … 9.99)·10^e for e from −6 to 37, 0, or −∞.
rc::Gen<float> any_logit() { return attn::scores_or_masked(attn::family::magnitude(-6, 38)); }

// Inside a property: the softmax of one row of logits (finite or −∞) against its float64
// softmax (zeros for a row with no finite logit). Bound, u = 2^-24: z_j − m rounds by
// ≤ u·|z_j − m|, so e^(z_j − m) is off by that relatively, and u·d·e^−d ≤ u/e absolutely;
// exp's own ≤ 2u, the sum of ≤ 6 terms γ_5 and the division u: |w − ref| ≤ 9u·ref + u.
void check_row_against_float64(const std::vector<float>& row) {
    const double u = std::ldexp(1.0, -24);
    Tensor3 logits = xt::zeros<float>({std::size_t{1}, std::size_t{1}, row.size()});
    for (std::size_t j = 0; j < row.size(); ++j) logits(0, 0, j) = row[j];
    const Tensor3 w = softmax_last_axis(logits);
    double m = -inf, z = 0.0;
    for (float x : row) m = std::max(m, static_cast<double>(x));
    if (m > -inf)
        for (float x : row) z += std::exp(static_cast<double>(x) - m);
    for (std::size_t j = 0; j < row.size(); ++j) {
        const double ref = m > -inf ? std::exp(static_cast<double>(row[j]) - m) / z : 0.0;
        RC_ASSERT(std::abs(w(0, 0, j) - ref) <= 9 * u * ref + u);
    }
}
}  // namespace

TEST_CASE("softmax of small rows matches values worked by hand") {
    // Row 0: e^0, e^1, e^2 over 1 + e + e² (calculator). Row 1: e^0 and e^ln3 = 3 over 4.
    Tensor3 logits = {{{1, 2, 3}, {0, std::log(3.0f), -inf}}};
    const Tensor3 expected = {{{0.0900306f, 0.2447285f, 0.6652410f}, {0.25f, 0.75f, 0.0f}}};
    INFO("softmax([1, 2, 3]) = [1, e, e²]/(1 + e + e²); softmax([0, ln 3, -inf]) = [1/4, 3/4, 0]");
    // Float32 exponentials, a 3-term sum and one division, ≲ 5u·0.67 ≈ 2e-7 (u = 2^-24),
    // and the 7-digit references' 5e-8: 4× under 1e-6. The mistakes (last entry not divided,
    // sums or maxima carried between rows, no shift) are off by O(0.1) or give NaN.
    CHECK_CLOSE(softmax_last_axis(logits), expected, 1e-6);
}

TEST_CASE("logits of plus or minus 1000 neither overflow nor give 0/0") {
    const float e = std::exp(1.0f);
    Tensor3 logits = {{{1000, 999, -1000}, {-1000, -1000, -1001}}};
    // Shifting a row does not change its softmax: these are softmax([1, 0, -2000]) and
    // softmax([0, 0, -1]), worked by hand. The shifts 0, −1, −2000 are exact and e^-2000 = 0;
    // exp, sum and division on each side (the expected values are float too): ≲ 4u·1 ≈ 2.4e-7
    // (u = 2^-24), 4× under 1e-6. Without the shift (or shifting by the first entry) e^1000
    // overflows: NaN.
    const Tensor3 expected = {{{e / (e + 1), 1 / (e + 1), 0},
                               {1 / (2 + 1 / e), 1 / (2 + 1 / e), (1 / e) / (2 + 1 / e)}}};
    CHECK_CLOSE(softmax_last_axis(logits), expected, 1e-6);
}

TEST_CASE("the shift is the row's maximum wherever it is, even after a masked first entry") {
    const float e = std::exp(1.0f);
    // Maxima in the middle and at the end, and a first entry of -inf: shifting by the first
    // logit instead of the maximum gives e^2000 (NaN) or a row taken for fully masked (zeros).
    Tensor3 logits = {{{-1000, 1000, 999}, {-inf, 1, 2}, {-2, -1000, 1000}}};
    INFO("softmax([-1000, 1000, 999]) = [0, e/(e+1), 1/(e+1)], softmax([-inf, 1, 2]) = "
         "[0, 1/(e+1), e/(e+1)], softmax([-2, -1000, 1000]) = [0, 0, 1]: shift by the row's maximum");
    const Tensor3 expected = {{{0, e / (e + 1), 1 / (e + 1)},
                               {0, 1 / (e + 1), e / (e + 1)},
                               {0, 0, 1}}};
    CHECK_CLOSE(softmax_last_axis(logits), expected, 1e-6);
}

TEST_CASE("on random logits rows sum to one and the result agrees with attn::softmax") {
    attn::Rng rng(1);
    // Not square, so normalising the wrong axis cannot pass by accident.
    Tensor3 logits = rng.normal_tensor<3>({3, 4, 9}, 0.0f, 5.0f);
    const Tensor3 p = softmax_last_axis(logits);
    // Σ_j e_j/Z, Z summed from the same rounded e_j (their errors cancel): Z's γ_8, a
    // division's u (2u through 1/Z) and xt::sum's γ_8: ≤ 18u ≈ 1.1e-6 at worst (u = 2^-24),
    // √8 u·2 ≈ 3.4e-7 with random signs, 3× under 1e-6. Against attn::softmax: each side's
    // p_j is within (γ_8 + 3u)·p_j, so ≤ 22u ≈ 1.3e-6 apart at worst, ≈ 4.5e-7 with random
    // signs. Sums carried between rows or an undivided entry are off by O(0.1) or more.
    CHECK_CLOSE(xt::sum(p, {2}), xt::ones<float>({3, 4}), 1e-6);
    CHECK_CLOSE(p, attn::softmax(logits), 1e-6);
    SUBCASE("adding a constant to every logit of a row changes nothing") {
        Tensor3 shifted = logits;
        xt::view(shifted, 1, 2) += 300.0f;
        // z + 300 rounds by ½ulp(300) ≈ 1.5e-5 (|z| ≲ 15, so z + 300 ∈ [256, 512)); z' − m'
        // is then exact, off by δ_j − δ_m, and δ_m cancels in p_j(δ_j − Σ_k p_k δ_k): |Δp_j| ≤
        // 2p_j(1 − p_j)·1.5e-5 ≤ 7.6e-6, plus ~22u ≈ 1.3e-6 as above: ≤ 8.9e-6 under 1e-5 even
        // at worst (u = 2^-24). Without the shift e^300 overflows: NaN.
        CHECK_CLOSE(softmax_last_axis(shifted), p, 1e-5);
    }
}

TEST_CASE("one key: weight 1, or 0 when it is masked") {
    const Tensor3 p = softmax_last_axis(Tensor3({{{-1000}, {0}, {1000}, {-inf}}}));
    // Exact: e^(z − z) = 1 divided by 1; the masked row is special-cased to 0.
    CHECK_CLOSE(p, Tensor3({{{1}, {1}, {1}, {0}}}), 0.0);
}

TEST_CASE("more rows than keys, one sequence, and logits spread over thousands") {
    // The other random logits have T_q < T_k and a spread of 5: here T_q > T_k, B = 1, and
    // logits of standard deviation 1000, negative and positive, so that most weights
    // underflow to exactly 0 and every row's maximum decides the result.
    attn::Rng rng(3);
    for (const auto& [B, T_q, T_k] : {std::array<std::size_t, 3>{1, 6, 3}, {2, 5, 1}, {1, 1, 7}}) {
        CAPTURE(B);
        CAPTURE(T_q);
        CAPTURE(T_k);
        const Tensor3 logits = rng.normal_tensor<3>({B, T_q, T_k}, -500.0f, 1000.0f);
        // e^(z − m) of the same float32 differences (one rounding each, the same on both
        // sides); with σ = 1000 all but the largest term are e^-(≳ 1) or underflow to 0, so
        // Z has ≤ 6 terms: each p_j within (γ_6 + 3u)p_j per side, ≤ 18u ≈ 1.1e-6 apart at
        // worst when p ≈ 1 (then Z ≈ 1 and exact in practice). Shifting by 0 or the first
        // entry turns these rows into NaN or zeros.
        CHECK_CLOSE(softmax_last_axis(logits), attn::softmax(logits), 1e-6);
    }
}

TEST_CASE("a fully masked row becomes zeros and masked entries get exactly 0") {
    attn::Rng rng(2);
    Tensor3 scores = rng.normal_tensor<3>({2, 4, 4});
    const Tensor3 masked = attn::masked_fill(scores, attn::causal_mask(4));
    // n ≤ 4 terms: each side within (γ_3 + 3u)p_j, ≤ 12u ≈ 7e-7 apart (u = 2^-24), 1.4×.
    CHECK_CLOSE(softmax_last_axis(masked), attn::softmax(masked), 1e-6);
    Tensor3 none = masked;
    xt::view(none, 1, 2) = -inf;  // row (1, 2) may attend to nothing
    const Tensor3 p = softmax_last_axis(none);
    CHECK_CLOSE(xt::view(p, 1, 2), xt::zeros<float>({4}), 0.0);
    for (std::size_t j = 1; j < 4; ++j) CHECK(p(0, 0, j) == 0.0f);
    CHECK(p(0, 0, 0) == 1.0f);
}

TEST_CASE("property: rows of logits of any size and sign, and masked ones, give the softmax") {
    // Rows of 1 to 6 logits (1 a quarter of the time), each ±10^−6 … 10^38, 0 or −∞
    // (masked), against the softmax in float64 of the same floats (zeros for a row with no
    // finite logit), within 9u·ref + u (check_row_against_float64). A sentinel standing for
    // −∞ (a maximum started at −1e30, "fully masked" when it is still −1e30) turns rows below
    // it into zeros.
    attn::check_property("softmax_last_axis of one row equals its float64 softmax", [] {
        const std::size_t n = attn::draw("T_k", attn::family::length(6));
        const auto row = attn::draw("logits", rc::gen::container<std::vector<float>>(n, any_logit()));
        check_row_against_float64(row);
    });
}

TEST_CASE("property: a NaN or +inf logit anywhere is refused, and a −inf one is a masked key") {
    // A row of 1 to 6 logits of any size (±10^−6 … 10^38, 0 or −∞) with one of them replaced
    // by NaN, +∞ or −∞: NaN and +∞ must throw std::invalid_argument, −∞ must give that key
    // weight exactly 0 and the others their float64 softmax (bound as above).
    attn::check_property("softmax_last_axis refuses NaN and +inf wherever they are", [] {
        const std::size_t n = attn::draw("T_k", attn::family::length(6));
        auto row = attn::draw("logits", rc::gen::container<std::vector<float>>(n, any_logit()));
        const std::size_t at = attn::draw("position", rc::gen::inRange<std::size_t>(0, n));
        row[at] = attn::draw("the non-finite logit", attn::family::non_finite());
        if (row[at] == -inf) {
            check_row_against_float64(row);
            return;
        }
        Tensor3 logits = xt::zeros<float>({std::size_t{1}, std::size_t{1}, n});
        std::copy(row.begin(), row.end(), logits.begin());
        RC_ASSERT(attn::refused([&] { (void)softmax_last_axis(logits); }));
    });
}

TEST_CASE("property: a row moved by a common offset, or its keys reordered, gives the same weights") {
    // Rows of 1 to 6 logits of ±10^−6 … 10^3, moved by an offset c (0, ±1 … ±10^4) or
    // reordered. Invariances: softmax(z + c) = softmax(z), and permuting the logits permutes
    // the weights. In float, z_j + c rounds to z_j + c + δ_j (δ_j measured here, exactly), so
    // each difference z_j − z_k moves by ≤ 2·max|δ| and a weight by the factor e^(±2·max|δ|):
    // |Δp_j| ≤ p_j·(e^(2·max|δ|) − 1). Each computed row is also within the lesson's
    // (T_k + 3)u·p + u of its own softmax (u = 2^-24), once per side. A shift by the first
    // logit, a maximum carried between rows or a sum in the wrong order of keys stays within
    // these; a softmax that is not shift-invariant (no shift: e^(10^4) overflows) does not.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("softmax_last_axis is shift-invariant and permutes with its keys", [u] {
        const std::size_t n = attn::draw("T_k", attn::family::length(6));
        const auto row = attn::draw("logits", rc::gen::container<std::vector<float>>(n, attn::family::magnitude(-6, 3)));
        const float c = attn::draw("offset", attn::family::offset());
        const auto order = attn::draw("the keys' order", attn::family::permutation(n));
        Tensor3 logits = xt::zeros<float>({std::size_t{1}, std::size_t{3}, n});
        double delta = 0.0;
        for (std::size_t j = 0; j < n; ++j) {
            logits(0, 0, j) = row[j];
            logits(0, 1, j) = row[j] + c;
            logits(0, 2, j) = row[order[j]];
            delta = std::max(delta, std::abs(static_cast<double>(logits(0, 1, j)) - (static_cast<double>(row[j]) + c)));
        }
        const Tensor3 w = softmax_last_axis(logits);
        // A computed weight p is within own·ref + u of its float64 ref, and ref ≤ (p + u)(1 + 2·own).
        const double grow = std::expm1(2 * delta), own = (static_cast<double>(n) + 3) * u;
        const auto off = [&](double p) { return own * (p + u) * (1 + 2 * own) + u; };
        for (std::size_t j = 0; j < n; ++j) {
            const double p = w(0, 0, j), shifted = w(0, 1, j), moved = w(0, 2, j), q = w(0, 0, order[j]);
            RC_ASSERT(std::abs(shifted - p) <= p * grow + off(p) + off(shifted));
            RC_ASSERT(std::abs(moved - q) <= off(moved) + off(q));
        }
    });
}

TEST_CASE("NaN, plus infinity and an empty last axis are rejected with std::invalid_argument") {
    SUBCASE("NaN") {
        CHECK_THROWS_AS(softmax_last_axis(Tensor3({{{0, std::nanf("")}}})), std::invalid_argument);
    }
    SUBCASE("plus infinity") {
        CHECK_THROWS_AS(softmax_last_axis(Tensor3({{{0, inf}}})), std::invalid_argument);
    }
    SUBCASE("no keys at all") {
        CHECK_THROWS_AS(softmax_last_axis(Tensor3(xt::zeros<float>({2, 3, 0}))),
                        std::invalid_argument);
    }
}
