// Checks for exercise 19: merging two partial attentions by their log-sum-exps.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for log-sum-exps of any sign and size, the merge is finite, symmetric and exact to its rounding
// - any rows, log-sum-exps of any size at any offset, distinct outputs, and sides that saw no key
// - rows merged in any order give the same rows, bit for bit
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

using attn::Tensor1;
using attn::Tensor2;
using exercise::merge_partial;
using exercise::PartialAttention;

namespace {

constexpr float inf = std::numeric_limits<float>::infinity();

// The attention of each row over the keys `keys` (indices into the columns of `scores`), in
// float64 by the definition: lse = ln Σ e^s, out = Σ e^(s − lse) v. It never merges anything,
// so what merge_partial gives can be held against it.
PartialAttention attend(const Tensor2& scores, const Tensor2& values, const std::vector<std::size_t>& keys) {
    const std::size_t rows = scores.shape()[0], hs = values.shape()[1];
    PartialAttention p{xt::zeros<float>({rows, hs}), xt::zeros<float>({rows})};
    for (std::size_t i = 0; i < rows; ++i) {
        double m = -INFINITY;
        for (std::size_t j : keys) m = std::max(m, static_cast<double>(scores(i, j)));
        if (m == -INFINITY) {
            p.lse(i) = -inf;
            continue;
        }
        double sum = 0.0;
        for (std::size_t j : keys) sum += std::exp(scores(i, j) - m);
        const double lse = m + std::log(sum);
        p.lse(i) = static_cast<float>(lse);
        for (std::size_t d = 0; d < hs; ++d) {
            double acc = 0.0;
            for (std::size_t j : keys) acc += std::exp(scores(i, j) - lse) * values(j, d);
            p.out(i, d) = static_cast<float>(acc);
        }
    }
    return p;
}

std::vector<std::size_t> range(std::size_t begin, std::size_t end) {
    std::vector<std::size_t> r;
    for (std::size_t j = begin; j < end; ++j) r.push_back(j);
    return r;
}

}  // namespace

TEST_CASE("two sides worked by hand: lse ln 2 and ln 6 merge to ln 8, weighted 1/4 and 3/4") {
    // Side a: its keys' e^s sum to 2 and its output is [1, 0]; side b: 6 and [0, 1]. Together
    // e^s sums to 8: lse = ln 8, and a's keys hold 2/8 of the weight, b's 6/8.
    const PartialAttention a{Tensor2({{1, 0}}), Tensor1({std::log(2.0f)})};
    const PartialAttention b{Tensor2({{0, 1}}), Tensor1({std::log(6.0f)})};
    const PartialAttention m = merge_partial(a, b);
    INFO("lse: ln(e^ln2 + e^ln6) = ln 8 = 2.0794415 (the sums of e^s add; the log-sum-exps do not)");
    // ln 2, ln 6 rounded (≤ u·1.8), exp, sum, ln, add ≲ 6u·2.1 ≈ 7.5e-7 plus the 8-digit
    // reference's 5e-8 (u = 2^-24): 4× under Approx's 1e-6·(1 + 2.08) ≈ 3.1e-6. The weights:
    // ~4 roundings ≲ 2.2e-7, 4.5× under 1e-6. The mistakes: lse added (ln 12, 0.41 off), the
    // larger one kept (ln 6, 0.29 off), a's kept (1.39 off); outputs averaged (0.25 off).
    CHECK(m.lse(0) == doctest::Approx(2.0794415).epsilon(1e-6));
    INFO("out: 2/8 · [1, 0] + 6/8 · [0, 1] = [0.25, 0.75]");
    CHECK_CLOSE(m.out, Tensor2({{0.25f, 0.75f}}), 1e-6);
}

TEST_CASE("two sides with the same log-sum-exp: lse grows by ln 2, and the outputs are averaged") {
    const PartialAttention a{Tensor2({{2, -4, 1}}), Tensor1({0.7f})};
    const PartialAttention b{Tensor2({{0, 6, 3}}), Tensor1({0.7f})};
    const PartialAttention m = merge_partial(a, b);
    INFO("lse: 0.7 + ln 2 = 1.3931472; out: the mean [1, 1, 2]");
    // e^0 = 1 on both sides: the sum 2 and (o_a + o_b)/2 are exact (small integers); lse is
    // 0.7f + ln 2 within ½ulp of each and the sum, ≲ 2e-7 (u = 2^-24), under 1e-6·2.39.
    // Weighting by the other side's sum changes nothing here; it is caught above.
    CHECK(m.lse(0) == doctest::Approx(1.3931472).epsilon(1e-6));
    CHECK_CLOSE(m.out, Tensor2({{1, 1, 2}}), 1e-6);
}

TEST_CASE("keys split in two at random: the merge is the attention over all of them") {
    attn::Rng rng(19);
    const std::size_t rows = 5, keys = 30, hs = 4;
    const Tensor2 scores = rng.normal_tensor<2>({rows, keys}, 0.0f, 3.0f);
    const Tensor2 values = rng.normal_tensor<2>({keys, hs});
    const PartialAttention whole = attend(scores, values, range(0, keys));
    for (int split = 0; split < 5; ++split) {
        CAPTURE(split);
        std::vector<std::size_t> in_a, in_b;
        for (std::size_t j = 0; j < keys; ++j) (rng.below(2) ? in_a : in_b).push_back(j);
        const PartialAttention m = merge_partial(attend(scores, values, in_a), attend(scores, values, in_b));
        // Each side is rounded to float32 once (lse < 16: ½ulp ≤ 4.8e-7; |out| ≲ 2), the merge
        // adds ~5 float operations (u = 2^-24). out = w_a o_a + w_b o_b, w_a = σ(lse_a − lse_b),
        // σ' ≤ 1/4: the lse roundings move w by ≤ 2.4e-7, out by that × |o_a − o_b| ≤ 4; with
        // the o's and whole's rounding (2u·2) and the arithmetic (5u·2): ≤ 1.8e-6 at worst,
        // under 2e-6. lse: w_a δa + w_b δb, the final ½ulp and whole's: ≤ 1.5e-6, 2.7× under
        // 4e-6. The merge mistakes are off by O(0.1–1).
        CHECK_CLOSE(m.out, whole.out, 2e-6);
        CHECK_CLOSE(m.lse, whole.lse, 4e-6);
    }
}

TEST_CASE("three blocks merged in either order and either grouping agree") {
    attn::Rng rng(20);
    const std::size_t rows = 4, keys = 24, hs = 3;
    const Tensor2 scores = rng.normal_tensor<2>({rows, keys}, 0.0f, 2.0f);
    const Tensor2 values = rng.normal_tensor<2>({keys, hs});
    const PartialAttention a = attend(scores, values, range(0, 8)), b = attend(scores, values, range(8, 16)),
                           c = attend(scores, values, range(16, 24)), whole = attend(scores, values, range(0, 24));
    // A ring folds the blocks in as they arrive, in another order on every rank. Two merges
    // (lse < 8 here, ½ulp 2.4e-7): one merge's worst case, ≈ 1.2e-6, twice: ≈ 2.4e-6 on out,
    // just above 2e-6, and ≈ 8.5e-7 with random signs, 2.4× under it: out's tolerance rests
    // on that; lse ≲ 1.2e-6 at worst, 3× under 4e-6.
    for (const PartialAttention& m : {merge_partial(merge_partial(a, b), c), merge_partial(a, merge_partial(b, c)),
                                      merge_partial(merge_partial(c, a), b), merge_partial(b, merge_partial(c, a))}) {
        CHECK_CLOSE(m.out, whole.out, 2e-6);
        CHECK_CLOSE(m.lse, whole.lse, 4e-6);
    }
}

TEST_CASE("a side whose row saw no key (lse −∞) leaves the other side's row as it is") {
    // Causal ring attention: a query row's first block may lie wholly in its future.
    const PartialAttention a{Tensor2({{0, 0}, {3, 4}}), Tensor1({-inf, 1.5f})};
    const PartialAttention b{Tensor2({{5, 6}, {0, 0}}), Tensor1({0.25f, -inf})};
    const PartialAttention m = merge_partial(a, b);
    INFO("row 0 is b's row, row 1 is a's: the empty side adds e^−∞ = 0 of the weight");
    // Exact: e^−∞ = 0 and e^0 = 1, so (1·o + 0·o')/1 and m + ln 1 round nothing.
    CHECK_CLOSE(m.out, Tensor2({{5, 6}, {3, 4}}), 1e-6);
    CHECK_CLOSE(m.lse, Tensor1({0.25f, 1.5f}), 1e-6);
}

TEST_CASE("a row that saw no key on either side stays empty: out 0 and lse −∞, no NaN") {
    const PartialAttention a{Tensor2({{0, 0}, {1, 2}}), Tensor1({-inf, 0.5f})};
    const PartialAttention b{Tensor2({{0, 0}, {3, 4}}), Tensor1({-inf, 0.5f})};
    const PartialAttention m = merge_partial(a, b);
    INFO("e^(−∞ − (−∞)) is NaN: a row whose larger lse is −∞ must be skipped");
    CHECK(m.lse(0) == -inf);
    CHECK(m.out(0, 0) == 0.0f);
    CHECK(m.out(0, 1) == 0.0f);
    // 0.5 + ln 2 within ½ulp of ln 2 and of the sum, ≲ 1.5e-7, under 1e-6·(1 + 1.19).
    CHECK(m.lse(1) == doctest::Approx(0.5 + std::log(2.0)).epsilon(1e-6));
}

TEST_CASE("log-sum-exps near 1000 merge without overflow") {
    // e^1000 is infinite in float: ln(e^1000 + e^999) must be taken as 1000 + ln(1 + e^−1).
    const PartialAttention a{Tensor2({{1}}), Tensor1({1000.0f})};
    const PartialAttention b{Tensor2({{0}}), Tensor1({999.0f})};
    const PartialAttention m = merge_partial(a, b);
    INFO("subtract the larger log-sum-exp before exponentiating: e^(1000 − 1000) and e^(999 − 1000)");
    CHECK(std::isfinite(m.lse(0)));
    // epsilon(1e-7) on ≈ 1000 allows 1e-7·(1 + 1000.3) ≈ 1e-4; the float result has ½ulp(1000)
    // = 2^-15 ≈ 3.05e-5 from its last addition: 3.3× under. e^lse_a + e^lse_b overflows: inf.
    CHECK(m.lse(0) == doctest::Approx(1000.3132617).epsilon(1e-7));
    // The weight 0.731 = 1/(1 + e^−1). Taken as e^(lse_a − lse), as the contract writes it, it
    // inherits lse's rounding: lse_a − lse is exact (Sterbenz), so the weight is off by
    // e^δ − 1 ≈ δ ≤ 3.05e-5 relatively, 0.731·3.05e-5 ≈ 2.2e-5 absolutely, plus ~4u (u = 2^-24)
    // from exp, product and sum. epsilon(2e-5) allows 2e-5·(1 + 0.731) ≈ 3.5e-5, 1.5× over
    // that. (Weighting by e^(lse_a − m)/(…) instead avoids lse's rounding: ~4u.) A merge that
    // overflows gives inf or NaN; a wrong weight is off by 0.04 or more.
    CHECK(m.out(0, 0) == doctest::Approx(0.7310586).epsilon(2e-5));
}

TEST_CASE("rows of very different log-sum-exps are each merged with their own maximum") {
    // Row 0 near 0, row 1 near −200, row 2 near 200: one maximum over all rows would turn
    // row 1's weights into e^−400 = 0 (0/0) and row 0's into 0 as well.
    const PartialAttention a{Tensor2({{1, 0}, {1, 0}, {1, 0}}), Tensor1({0.0f, -200.0f, 200.0f})};
    const PartialAttention b{Tensor2({{0, 1}, {0, 1}, {0, 1}}), Tensor1({std::log(3.0f), -200.0f + std::log(3.0f), 200.0f + std::log(3.0f)})};
    const PartialAttention m = merge_partial(a, b);
    INFO("each row: weights 1/4 and 3/4, lse its own + ln 4");
    // ±200 + ln 3 rounded to float is off by up to half an ulp there, 8e-6, and so is the
    // weight e^(lse − m) relatively; a shared maximum gives 0/0 or 0 instead. The weight
    // σ(lse_a − lse_b) then moves by ≤ (3/16)·7.6e-6 ≈ 1.4e-6, and out by that times
    // |o_a − o_b| = 1, plus a few u: 14× under 2e-5. The lse's: ½ulp(200) ≈ 7.6e-6 from the
    // input and as much from the sum, ≲ 1.5e-5 against 1e-6·(1 + 201) ≈ 2e-4; ln 4's row
    // ≲ 3e-7 against 2.4e-6.
    CHECK_CLOSE(m.out, Tensor2({{0.25f, 0.75f}, {0.25f, 0.75f}, {0.25f, 0.75f}}), 2e-5);
    CHECK(m.lse(0) == doctest::Approx(std::log(4.0)).epsilon(1e-6));
    CHECK(m.lse(1) == doctest::Approx(-200.0 + std::log(4.0)).epsilon(1e-6));
    CHECK(m.lse(2) == doctest::Approx(200.0 + std::log(4.0)).epsilon(1e-6));
}

TEST_CASE("property: for log-sum-exps of any sign and size, the merge is finite, symmetric and exact to its rounding") {
    // Every pair of log-sum-exps from {0, ±1, ±100, ±1000, ±10^4}, each side in either order.
    // Whatever the gap, only e^(−|lse_a − lse_b|) ≤ 1 need be computed: a merge that takes
    // e^(lse_b − lse_a) (relative to one side) overflows for a gap of 89 or more, and its
    // swapped call does not. Bounds, with u = 2^-24: lse is m + ln(1 + e^−gap), the log term in
    // [0, ln 2] to ~4u, then one rounding of ≤ ½ulp(lse) ≤ u·|lse|; out is a weighted mean
    // whose weights carry lse's rounding at most (the contract's e^(lse_a − lse) form, off by
    // ≤ u·|lse| relatively) and ~8u of their own, times |o_a| + |o_b|. Float64 is the reference.
    const std::vector<double> sizes = {0, 1, -1, 100, -100, 1000, -1000, 1e4, -1e4};
    const double u = std::ldexp(1.0, -24);
    const float oa[2] = {1.0f, -2.0f}, ob[2] = {-3.0f, 0.5f};
    for (double la : sizes) {
        for (double lb : sizes) {
            const PartialAttention a{Tensor2({{oa[0], oa[1]}}), Tensor1({static_cast<float>(la)})};
            const PartialAttention b{Tensor2({{ob[0], ob[1]}}), Tensor1({static_cast<float>(lb)})};
            const double m = std::max(la, lb);
            const double lse = m + std::log(std::exp(la - m) + std::exp(lb - m));
            const double wa = std::exp(la - lse), wb = std::exp(lb - lse);
            const double tol_lse = u * std::abs(lse) + 4 * u;
            for (int order = 0; order < 2; ++order) {
                const PartialAttention merged = order == 0 ? merge_partial(a, b) : merge_partial(b, a);
                INFO("lse_a = " << (order == 0 ? la : lb) << ", lse_b = " << (order == 0 ? lb : la)
                     << ": expected lse " << lse << ", got " << merged.lse(0)
                     << "; out [" << merged.out(0, 0) << ", " << merged.out(0, 1) << "]");
                INFO("take out the larger log-sum-exp, whichever side it is on: then no exponential exceeds 1");
                REQUIRE(std::isfinite(merged.lse(0)));
                CHECK(std::abs(merged.lse(0) - lse) <= tol_lse);
                for (int d = 0; d < 2; ++d) {
                    const double expected = wa * oa[d] + wb * ob[d];
                    const double tol = (u * std::abs(lse) + 8 * u) * (std::abs(oa[d]) + std::abs(ob[d]));
                    REQUIRE(std::isfinite(merged.out(0, d)));
                    CHECK(std::abs(merged.out(0, d) - expected) <= tol);
                }
            }
        }
    }
}

namespace {

// RC_ASSERTs that `merged` is the merge of a and b, row by row, against float64 with the
// bound of the property above (u = 2^-24): lse within u·|lse| + 4u, each output within
// (u·|lse| + 8u)(|o_a| + |o_b|); a row with −∞ on both sides stays empty: lse −∞, out 0.
void check_merge(const PartialAttention& merged, const PartialAttention& a, const PartialAttention& b) {
    const double u = std::ldexp(1.0, -24);
    const std::size_t rows = a.out.shape()[0], hs = a.out.shape()[1];
    RC_ASSERT(merged.out.shape() == a.out.shape());
    RC_ASSERT(merged.lse.size() == rows);
    for (std::size_t i = 0; i < rows; ++i) {
        const double la = a.lse(i), lb = b.lse(i), m = std::max(la, lb);
        if (m == -INFINITY) {
            RC_ASSERT(merged.lse(i) == -inf);
            for (std::size_t d = 0; d < hs; ++d) RC_ASSERT(merged.out(i, d) == 0.0f);
            continue;
        }
        const double lse = m + std::log(std::exp(la - m) + std::exp(lb - m));
        const double wa = std::exp(la - lse), wb = std::exp(lb - lse);
        RC_ASSERT(std::isfinite(merged.lse(i)));
        RC_ASSERT(std::abs(merged.lse(i) - lse) <= u * std::abs(lse) + 4 * u);
        for (std::size_t d = 0; d < hs; ++d) {
            const double oa = a.out(i, d), ob = b.out(i, d);
            RC_ASSERT(std::isfinite(merged.out(i, d)));
            RC_ASSERT(std::abs(merged.out(i, d) - (wa * oa + wb * ob)) <= (u * std::abs(lse) + 8 * u) * (std::abs(oa) + std::abs(ob)));
        }
    }
}

}  // namespace

TEST_CASE("property: any rows, log-sum-exps of any size at any offset, distinct outputs, and sides that saw no key") {
    // 1 to 4 rows and 1 to 4 channels (1 a quarter of the time each); each side's lse a common
    // offset c (0, ±1 … ±10^4) plus ±10^−6 … 10^30, or −∞ (a side that saw no key, an eighth
    // of the time, on one side or both); the outputs pairwise distinct across both sides
    // (a's taken for b's, or a row for a channel, shows). Against float64 with check_merge's
    // bound; in either order of the sides. A merge that exponentiates a log-sum-exp itself
    // overflows from 89 on; one guarded by a finite sentinel (m < −1e30 taken as empty)
    // empties rows that are not.
    attn::check_property("merge_partial of any log-sum-exps equals the float64 merge", [] {
        const std::size_t rows = attn::draw("rows", attn::family::length(4)), hs = attn::draw("hs", attn::family::length(4));
        const float c = attn::draw("offset", attn::family::offset());
        const auto lse_gen = rc::gen::weightedOneOf<float>({{7, attn::family::magnitude(-6, 30)}, {1, rc::gen::just(-inf)}});
        const auto lse_a = attn::draw("lse_a (before the offset)", rc::gen::container<std::vector<float>>(rows, lse_gen));
        const auto lse_b = attn::draw("lse_b (before the offset)", rc::gen::container<std::vector<float>>(rows, lse_gen));
        const auto outs = attn::draw("out_a then out_b (flat, distinct)", attn::family::distinct(2 * rows * hs));
        PartialAttention a{xt::zeros<float>({rows, hs}), xt::zeros<float>({rows})}, b = a;
        for (std::size_t i = 0; i < rows; ++i) {
            a.lse(i) = lse_a[i] + c;
            b.lse(i) = lse_b[i] + c;
            for (std::size_t d = 0; d < hs; ++d) {
                a.out(i, d) = outs[i * hs + d];
                b.out(i, d) = outs[rows * hs + i * hs + d];
            }
        }
        check_merge(merge_partial(a, b), a, b);
        check_merge(merge_partial(b, a), b, a);
    });
}

TEST_CASE("property: rows merged in any order give the same rows, bit for bit") {
    // 1 to 6 rows of log-sum-exps ±10^−6 … 10^4 and distinct outputs, merged as given and
    // with their rows in a drawn order: each row is merged alone, so the rows come out in
    // that order, bit for bit. A maximum, sum or weight shared between rows moves them.
    attn::check_property("merge_partial treats each row alone", [] {
        const std::size_t rows = attn::draw("rows", attn::family::length(6)), hs = attn::draw("hs", attn::family::length(3));
        const auto lse = attn::draw("lse_a then lse_b", rc::gen::container<std::vector<float>>(2 * rows, attn::family::magnitude(-6, 4)));
        const auto outs = attn::draw("out_a then out_b (flat, distinct)", attn::family::distinct(2 * rows * hs));
        const auto order = attn::draw("the rows' order", attn::family::permutation(rows));
        PartialAttention a{xt::zeros<float>({rows, hs}), xt::zeros<float>({rows})}, b = a, a2 = a, b2 = a;
        for (std::size_t i = 0; i < rows; ++i) {
            a.lse(i) = lse[i];
            b.lse(i) = lse[rows + i];
            for (std::size_t d = 0; d < hs; ++d) {
                a.out(i, d) = outs[i * hs + d];
                b.out(i, d) = outs[rows * hs + i * hs + d];
            }
        }
        for (std::size_t i = 0; i < rows; ++i) {
            a2.lse(i) = a.lse(order[i]);
            b2.lse(i) = b.lse(order[i]);
            xt::row(a2.out, static_cast<long>(i)) = xt::row(a.out, static_cast<long>(order[i]));
            xt::row(b2.out, static_cast<long>(i)) = xt::row(b.out, static_cast<long>(order[i]));
        }
        const PartialAttention m = merge_partial(a, b), moved = merge_partial(a2, b2);
        for (std::size_t i = 0; i < rows; ++i) {
            RC_ASSERT(moved.lse(i) == m.lse(order[i]));
            for (std::size_t d = 0; d < hs; ++d) RC_ASSERT(moved.out(i, d) == m.out(order[i], d));
        }
    });
}

TEST_CASE("shapes that do not fit are rejected with std::invalid_argument") {
    const PartialAttention a{Tensor2({{1, 2}, {3, 4}}), Tensor1({0.0f, 1.0f})};
    SUBCASE("b has other rows") {
        CHECK_THROWS_AS(merge_partial(a, {Tensor2({{1, 2}}), Tensor1({0.0f})}), std::invalid_argument);
    }
    SUBCASE("b's outputs have another width") {
        CHECK_THROWS_AS(merge_partial(a, {Tensor2({{1, 2, 3}, {4, 5, 6}}), Tensor1({0.0f, 1.0f})}),
                        std::invalid_argument);
    }
    SUBCASE("an lse without one entry per row") {
        CHECK_THROWS_AS(merge_partial(a, {Tensor2({{1, 2}, {3, 4}}), Tensor1({0.0f})}), std::invalid_argument);
        CHECK_THROWS_AS(merge_partial({Tensor2({{1, 2}, {3, 4}}), Tensor1({0.0f, 1.0f, 2.0f})}, a),
                        std::invalid_argument);
    }
}
