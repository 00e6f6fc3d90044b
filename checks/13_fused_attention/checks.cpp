// Checks for exercise 13: the online-softmax update.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - any row of scores, at any offset and under any mask, cut into tiles anywhere, gives
//   softmax(s)·V and its log-sum-exp
// - keys in any order give the same softmax, and values scaled by a power of two scale acc exactly
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <cmath>
#include <limits>
#include <vector>

using attn::Tensor1;
using attn::Tensor2;
using exercise::online_softmax_update;
using exercise::RowState;

namespace {

RowState empty_state(std::size_t d_v) {
    RowState state;
    state.acc = xt::zeros<float>({d_v});
    return state;
}

// softmax(scores) · values, the plain way in float64: what acc / l must come to.
Tensor1 plain_attention_row(const Tensor1& scores, const Tensor2& values) {
    double m = -INFINITY, sum = 0.0;
    for (float s : scores) m = std::max(m, static_cast<double>(s));
    for (float s : scores) sum += std::exp(s - m);
    Tensor1 out = xt::zeros<float>({values.shape()[1]});
    for (std::size_t d = 0; d < values.shape()[1]; ++d) {
        double acc = 0.0;
        for (std::size_t j = 0; j < scores.size(); ++j) {
            acc += std::exp(scores(j) - m) / sum * values(j, d);
        }
        out(d) = static_cast<float>(acc);
    }
    return out;
}

}  // namespace

TEST_CASE("two tiles reproduce numbers worked by hand") {
    // Scores [1, 2 | 3]; values [1, 0], [0, 1] | [2, 2].
    RowState state = empty_state(2);
    online_softmax_update(state, Tensor1({1.0f, 2.0f}), Tensor2({{1, 0}, {0, 1}}));
    // m = 2, l = e^-1 + 1, acc = e^-1·[1, 0] + [0, 1]
    INFO("after tile [1, 2]: m = 2, l = e^-1 + 1 = 1.3678794, acc = e^-1·[1, 0] + [0, 1]");
    CHECK(state.max == 2.0f);
    // Each value here is a few float operations (e^-1 within 1–2 ulp, a product, a sum) on
    // numbers ≤ 2.4: ≲ 4u·2.4 ≈ 5.7e-7 (u = 2^-24), plus the 8-digit references' 5e-8:
    // under 1e-6 (1.7×), and under Approx's 1e-6·(1 + l) ≥ 2.4e-6. The mistakes (acc or l
    // not rescaled, e^(m_new − m), the max not kept) are off by ≥ 0.2 here.
    CHECK(state.sum == doctest::Approx(1.3678794).epsilon(1e-6));
    CHECK_CLOSE(state.acc, Tensor1({0.3678794f, 1.0f}), 1e-6);
    online_softmax_update(state, Tensor1({3.0f}), Tensor2({{2, 2}}));
    // m = 3: l = 1.3678794·e^-1 + 1, acc = e^-1·[0.3678794, 1] + [2, 2]
    INFO("after tile [3]: m = 3, l = 1.3678794·e^-1 + 1 = 1.5032147, "
         "acc = e^-1·[0.3678794, 1] + [2, 2] (both rescaled by e^(2 - 3))");
    CHECK(state.max == 3.0f);
    CHECK(state.sum == doctest::Approx(1.5032147).epsilon(1e-6));
    CHECK_CLOSE(state.acc, Tensor1({2.1353353f, 2.3678794f}), 1e-6);
    // acc / l = softmax([1, 2, 3]) · V
    CHECK_CLOSE(Tensor1(state.acc / state.sum), Tensor1({1.4205125f, 1.5752104f}), 1e-6);
}

TEST_CASE("the first tile from an empty state gives m = max and l = sum of e^(s - m)") {
    RowState state = empty_state(1);
    online_softmax_update(state, Tensor1({0.0f, std::log(3.0f)}), Tensor2({{1}, {1}}));
    // ln 3 rounded (½ulp), e^(−ln 3) within 2u, + 1 and ×1: ≲ 3u·1.33 ≈ 2.4e-7 (u = 2^-24),
    // 10× under Approx's 1e-6·(1 + 1.33); the max exact up to ln 3's own rounding.
    CHECK(state.max == doctest::Approx(std::log(3.0)));
    CHECK(state.sum == doctest::Approx(1.0 / 3.0 + 1.0).epsilon(1e-6));  // e^(0 − ln 3) + e^0
    CHECK(state.acc(0) == doctest::Approx(4.0 / 3.0).epsilon(1e-6));
}

TEST_CASE("any split into tiles gives softmax(s) · V after dividing by l") {
    attn::Rng rng(13);
    const std::size_t n = 37, d_v = 5;
    Tensor1 scores = rng.normal_tensor<1>({n}, 0.0f, 3.0f);
    Tensor2 values = rng.normal_tensor<2>({n, d_v});
    const Tensor1 expected = plain_attention_row(scores, values);
    for (std::size_t tile : {1u, 5u, 16u, 37u}) {
        CAPTURE(tile);
        RowState state = empty_state(d_v);
        for (std::size_t j0 = 0; j0 < n; j0 += tile) {
            const long begin = static_cast<long>(j0), end = static_cast<long>(std::min(n, j0 + tile));
            online_softmax_update(state, Tensor1(xt::view(scores, xt::range(begin, end))),
                                  Tensor2(xt::view(values, xt::range(begin, end), xt::all())));
        }
        // Against double (u = 2^-24): a rescale multiplies acc and l by the same rounded
        // factor, which cancels in acc/l, leaving e_j's 2u, a product's u per rescale (k ≈
        // H_37 ≈ 4 records of the max, ≤ 37) and both 37-term sums: ≤ (2γ_37 + (k + 2)u)·|v|
        // ≈ 80u·3 ≈ 1.4e-5 at worst, ≈ √37·√2 u·3 ≈ 1.5e-6 with random signs: 1e-5 rests on
        // that, 6.7× above. The mistakes (acc or l not rescaled, e^(m_new − m)) are off by
        // O(1); a maximum kept per tile only overflows.
        CHECK_CLOSE(Tensor1(state.acc / state.sum), expected, 1e-5);
        // The log-sum-exp: m + ln l = ln Σ e^s. l within ≈ (γ_37 + (k + 2)u) ≈ 43u relative,
        // ln moves by as much, 2.6e-6, plus ½ulp(lse ≈ 8) ≈ 4.8e-7: under Approx's
        // 1e-6·(1 + lse) ≈ 9e-6 even at worst (3×).
        double lse = 0.0;
        for (float s : scores) lse += std::exp(static_cast<double>(s));
        CHECK(state.max + std::log(state.sum) == doctest::Approx(std::log(lse)).epsilon(1e-6));
    }
}

TEST_CASE("a fully masked tile leaves an empty state empty, with no NaN") {
    const float inf = std::numeric_limits<float>::infinity();
    RowState state = empty_state(2);
    online_softmax_update(state, Tensor1({-inf, -inf}), Tensor2({{1, 2}, {3, 4}}));
    CHECK(state.max == -inf);
    CHECK(state.sum == 0.0f);
    CHECK_CLOSE(state.acc, Tensor1({0.0f, 0.0f}), 0.0);
    // Then a tile with one visible key and one masked one: the output is that key's value,
    // exactly (e^0 = 1, e^-inf = 0, l = 1); 1e-6 is a margin. An unguarded −inf − −inf is NaN.
    online_softmax_update(state, Tensor1({0.25f, -inf}), Tensor2({{5, 6}, {7, 8}}));
    CHECK_CLOSE(Tensor1(state.acc / state.sum), Tensor1({5.0f, 6.0f}), 1e-6);
}

TEST_CASE("large scores do not overflow") {
    RowState state = empty_state(1);
    online_softmax_update(state, Tensor1({1000.0f}), Tensor2({{0}}));
    online_softmax_update(state, Tensor1({1001.0f}), Tensor2({{1}}));
    // e^1000 overflows float; with the running max the weights are 1/(1+e) and e/(1+e).
    // e^-1, a rescale, a sum and the division ≲ 4u·0.73 ≈ 1.8e-7 plus the 7-digit reference's
    // 5e-8 (u = 2^-24): 7× under Approx's 1e-6·1.73. Without the max: inf/inf, NaN.
    CHECK(std::isfinite(state.sum));
    CHECK(state.acc(0) / state.sum == doctest::Approx(0.7310586).epsilon(1e-6));
}

TEST_CASE("scores near -1000 do not underflow: the maximum is the largest score, never 0") {
    // Tiles [-1000] then [-1001]: m = -1000, l = 1 + e^-1, acc/l = (e·v0 + v1)/(e + 1). A
    // maximum that starts at 0 subtracts 0, and e^-1000 is 0 in float: 0/0.
    INFO("every score is near -1000: the new maximum is max(m, scores), starting from the state's "
         "m (-inf at first), not from 0");
    RowState state = empty_state(1);
    online_softmax_update(state, Tensor1({-1000.0f}), Tensor2({{1}}));
    online_softmax_update(state, Tensor1({-1001.0f}), Tensor2({{0}}));
    CHECK(state.max == -1000.0f);
    // As above: ≲ 3u·1.37 ≈ 2.5e-7 on l, 1.8e-7 on the weight, under 2.4e-6 and 1.7e-6.
    CHECK(state.sum == doctest::Approx(1.3678794).epsilon(1e-6));
    CHECK(state.acc(0) / state.sum == doctest::Approx(0.7310586).epsilon(1e-6));
}

TEST_CASE("an empty tile, and a masked tile after visible keys, change nothing") {
    const float inf = std::numeric_limits<float>::infinity();
    RowState state = empty_state(3);
    online_softmax_update(state, Tensor1({0.5f, -0.25f}), Tensor2({{1, 2, 3}, {4, 5, 6}}));
    const RowState before = state;
    online_softmax_update(state, Tensor1(xt::zeros<float>({0})), Tensor2(xt::zeros<float>({0, 3})));
    online_softmax_update(state, Tensor1({-inf, -inf, -inf}), Tensor2(xt::zeros<float>({3, 3})));
    CHECK(state.max == before.max);
    CHECK(state.sum == before.sum);
    // Exact: the rescale factor is e^0 = 1 and the masked keys add e^-inf = 0.
    CHECK_CLOSE(state.acc, before.acc, 0.0);
}

TEST_CASE("values of one and of 64 channels, and tiles of one key") {
    // The other checks have d_v of 1, 2 or 5: here 1 and 64, with every tile a single key.
    attn::Rng rng(14);
    for (std::size_t d_v : {1, 64}) {
        CAPTURE(d_v);
        const std::size_t n = 9;
        const Tensor1 scores = rng.normal_tensor<1>({n}, 0.0f, 2.0f);
        const Tensor2 values = rng.normal_tensor<2>({n, d_v});
        RowState state = empty_state(d_v);
        for (std::size_t j = 0; j < n; ++j) {
            const long at = static_cast<long>(j);
            online_softmax_update(state, Tensor1(xt::view(scores, xt::range(at, at + 1))),
                                  Tensor2(xt::view(values, xt::range(at, at + 1), xt::all())));
        }
        // 9 terms, tiles of one key, so ≤ 9 rescales: (2γ_9 + 11u)·|v| ≈ 29u·3 ≈ 5.2e-6 even
        // at worst (u = 2^-24; the rescale factors cancel in acc/l), 2× under 1e-5.
        CHECK_CLOSE(Tensor1(state.acc / state.sum), plain_attention_row(scores, values), 1e-5);
    }
}

TEST_CASE("a later tile with smaller scores keeps the running maximum") {
    {
        // Tiles [100] then [-100]: m stays 100, the second key's weight e^-200 rounds to 0.
        INFO("after tiles [100] and [-100], m should still be 100 (the largest score so far), l = 1 "
             "and acc/l = the first value; a maximum over the new tile alone rescales by e^200 = inf");
        RowState state = empty_state(1);
        online_softmax_update(state, Tensor1({100.0f}), Tensor2({{1}}));
        online_softmax_update(state, Tensor1({-100.0f}), Tensor2({{0}}));
        CHECK(state.max == 100.0f);
        // Exact: e^0 = 1 and e^-200 = 0 in float32. A maximum over the new tile alone
        // rescales by e^200 = inf.
        CHECK(state.sum == doctest::Approx(1.0).epsilon(1e-6));
        CHECK(state.acc(0) / state.sum == doctest::Approx(1.0).epsilon(1e-6));
    }
    {
        // The same with a falling maximum over several keys: tiles [3, 1] then [2, 0].
        INFO("after tiles [3, 1] and [2, 0], m should be 3 and l = 1 + e^-2 + e^-1 + e^-3 = 1.5530018");
        RowState two = empty_state(1);
        online_softmax_update(two, Tensor1({3.0f, 1.0f}), Tensor2({{1}, {0}}));
        online_softmax_update(two, Tensor1({2.0f, 0.0f}), Tensor2({{0}, {0}}));
        CHECK(two.max == 3.0f);
        // l = 1 + e^-2 + e^-1 + e^-3 = 1.5530018 (calculator): 3 exps, 2 rescales, 3 sums,
        // ≲ 8u·1.55 ≈ 7.4e-7 (u = 2^-24), 3× under Approx's 1e-6·2.55.
        CHECK(two.sum == doctest::Approx(1.5530018).epsilon(1e-6));
    }
}

namespace {

// Folds row `scores` (n) with `values` (n, d_v) into an empty state, cut into tiles after
// every key j whose cuts[j] is true (the last tile ends at n whatever cuts says).
RowState fold_in_tiles(const std::vector<float>& scores, const Tensor2& values, const std::vector<bool>& cuts) {
    const std::size_t n = scores.size(), d_v = values.shape()[1];
    RowState state = empty_state(d_v);
    std::size_t start = 0;
    for (std::size_t j = 1; j <= n; ++j) {
        if (j < n && !cuts[j - 1]) continue;
        Tensor1 tile = xt::zeros<float>({j - start});
        Tensor2 rows = xt::zeros<float>({j - start, d_v});
        for (std::size_t i = start; i < j; ++i) {
            tile(i - start) = scores[i];
            for (std::size_t d = 0; d < d_v; ++d) rows(i - start, d) = values(i, d);
        }
        online_softmax_update(state, tile, rows);
        start = j;
    }
    return state;
}

// The float64 softmax of `scores` (−∞ a masked key) applied to `values`, and the bound on a
// float32 online softmax's acc / l and m + ln l derived in the property below.
struct Float64Row {
    double max = -INFINITY, lse = -INFINITY, lse_tolerance = 0.0;
    std::vector<double> out, tolerance;  // (d_v)
};

Float64Row float64_row(const std::vector<float>& scores, const Tensor2& values) {
    const double u = std::ldexp(1.0, -24), n = static_cast<double>(scores.size());
    const std::size_t d_v = values.shape()[1];
    Float64Row r;
    r.out.assign(d_v, 0.0);
    r.tolerance.assign(d_v, 0.0);
    for (float x : scores) r.max = std::max(r.max, static_cast<double>(x));
    if (r.max == -INFINITY) return r;
    double z = 0.0;
    for (float x : scores) z += std::exp(x - r.max);
    for (std::size_t j = 0; j < scores.size(); ++j) {
        const double p = std::exp(scores[j] - r.max) / z;
        for (std::size_t d = 0; d < d_v; ++d) {
            r.out[d] += p * values(j, d);
            r.tolerance[d] += (u + (4 * n + 5) * u * p) * std::abs(static_cast<double>(values(j, d)));
        }
    }
    r.lse = r.max + std::log(z);
    r.lse_tolerance = u * std::abs(r.lse) + (5 * n + 5) * u;
    return r;
}

// RC_ASSERTs that `state` after the whole row is `ref` to its bound (an empty state when every
// score is −∞).
void check_against_float64(const RowState& state, const Float64Row& ref) {
    if (ref.max == -INFINITY) {
        RC_ASSERT(state.max == -std::numeric_limits<float>::infinity());
        RC_ASSERT(state.sum == 0.0f);
        for (float a : state.acc) RC_ASSERT(a == 0.0f);
        return;
    }
    RC_ASSERT(std::isfinite(state.sum));
    for (std::size_t d = 0; d < ref.out.size(); ++d)
        RC_ASSERT(std::abs(state.acc(d) / state.sum - ref.out[d]) <= ref.tolerance[d]);
    RC_ASSERT(std::abs(state.max + std::log(static_cast<double>(state.sum)) - ref.lse) <= ref.lse_tolerance);
}

}  // namespace

TEST_CASE("property: any row of scores, cut into tiles anywhere, gives softmax(s)·V and its log-sum-exp") {
    // Rows of 1 to 8 scores (1 a quarter of the time), each a common offset c (0, ±1 … ±10^4)
    // plus ±(1 … 10)·10^e for e from −3 to 30, 0 or −∞ (masked), and the keys a mask hides
    // (leading, trailing, interleaved, one key, all keys, causal) set to −∞ too; cut into 1
    // to n tiles at drawn points, values small integers; after the last tile acc / l and
    // m + ln l against float64 on the same float scores. Bounds (u = 2^-24): a weight reaches
    // its final scale through ≤ n rescales e^(m − m_new) (one per tile, or one per key when a
    // solution folds keys one at a time), each off by ≤ u·|m − m_new| from the subtraction,
    // ≤ 2u from exp and u from the product; the subtraction's part, weighted by the weight it
    // shrinks, is ≤ u/e absolutely (x·e^−x ≤ 1/e), the rest (3n + 3)u relatively, and the sums
    // of ≤ n terms add γ_n: |out − ref| ≤ Σ_j (u + (4n + 5)u·p_j)|v_j|, and m + ln l within
    // u·|lse| + (5n + 5)u. Every score −∞: the state must stay empty.
    const auto score = attn::scores_or_masked(attn::family::magnitude(-3, 31));
    attn::check_property("online_softmax_update over any tiling equals the float64 softmax", [&] {
        const std::size_t n = attn::draw("n (scores)", attn::family::length(8));
        const float c = attn::draw("offset", attn::family::offset());
        auto s = attn::draw("scores (before the offset)", rc::gen::container<std::vector<float>>(n, score));
        const attn::Mask<2> mask = attn::family::mask("mask", 1, n);
        for (std::size_t j = 0; j < n; ++j) s[j] = mask(0, j) ? s[j] + c : -std::numeric_limits<float>::infinity();
        const auto cuts = attn::draw("cut after key j", rc::gen::container<std::vector<bool>>(n - 1, rc::gen::arbitrary<bool>()));
        Tensor2 values = xt::zeros<float>({n, std::size_t{1}});
        for (std::size_t i = 0; i < n; ++i) values(i, 0) = static_cast<float>(i % 5) - 2.0f;
        check_against_float64(fold_in_tiles(s, values, cuts), float64_row(s, values));
    });
}

TEST_CASE("property: keys in any order give the same softmax, and values scaled by a power of two scale acc exactly") {
    // Rows of 1 to 8 scores of ±10^−6 … 10 and value rows of 2 to 4 channels, every entry
    // distinct (1/8 … 8·n in size, either sign: a values(d, j) for values(j, d) or one
    // channel for another shows), folded in drawn tiles: in their order and in a drawn
    // permutation each within the float64 bound of the property above (the reference does not
    // depend on the order). The values times 2^k (k from −8 to 8) must give acc times 2^k,
    // bit for bit, and the same m and l: with |s| ≤ 10 every weight is ≥ e^−20, so no
    // product p·v comes near float's subnormals and scaling by 2^k rounds nothing.
    attn::check_property("online_softmax_update permutes with its keys and is linear in the values", [] {
        const std::size_t n = attn::draw("n (scores)", attn::family::length(8));
        const std::size_t d_v = attn::draw("d_v", rc::gen::inRange<std::size_t>(2, 5));
        const auto s = attn::draw("scores", rc::gen::container<std::vector<float>>(n, attn::family::magnitude(-6, 1)));
        const auto flat = attn::draw("values (flat, distinct)", attn::family::distinct(n * d_v));
        const auto order = attn::draw("the keys' order", attn::family::permutation(n));
        const float scale = attn::draw("scale of the values", attn::family::scale());
        const auto cuts = attn::draw("cut after key j", rc::gen::container<std::vector<bool>>(n - 1, rc::gen::arbitrary<bool>()));
        Tensor2 values = xt::zeros<float>({n, d_v}), scaled = values, moved_values = values;
        std::vector<float> moved(n);
        for (std::size_t j = 0; j < n; ++j) {
            moved[j] = s[order[j]];
            for (std::size_t d = 0; d < d_v; ++d) {
                values(j, d) = flat[j * d_v + d];
                scaled(j, d) = scale * flat[j * d_v + d];
                moved_values(j, d) = flat[order[j] * d_v + d];
            }
        }
        const Float64Row ref = float64_row(s, values);
        const RowState state = fold_in_tiles(s, values, cuts);
        check_against_float64(state, ref);
        check_against_float64(fold_in_tiles(moved, moved_values, cuts), ref);
        const RowState times = fold_in_tiles(s, scaled, cuts);
        RC_ASSERT(times.max == state.max);
        RC_ASSERT(times.sum == state.sum);
        for (std::size_t d = 0; d < d_v; ++d) RC_ASSERT(times.acc(d) == scale * state.acc(d));
    });
}

TEST_CASE("shapes that do not fit are rejected with std::invalid_argument") {
    RowState state = empty_state(2);
    SUBCASE("a value row count that differs from the number of scores") {
        CHECK_THROWS_AS(online_softmax_update(state, Tensor1({1, 2, 3}), Tensor2({{1, 2}, {3, 4}})),
                        std::invalid_argument);
    }
    SUBCASE("values whose width is not the accumulator's") {
        CHECK_THROWS_AS(online_softmax_update(state, Tensor1({1, 2}), Tensor2({{1, 2, 3}, {4, 5, 6}})),
                        std::invalid_argument);
    }
}
