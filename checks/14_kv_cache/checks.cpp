// Checks for exercise 14: appending to the cache and attending over it.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - rows after pos may hold anything, for a query of either sign and any position
// - queries and keys of any size, values distinct, and anything in the rows not yet written
// - the cached rows in any order, q and k scaled apart, and the values scaled or moved
// - a position below 0, or at or past the capacity, is refused and nothing is written
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/kv_cache.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xadapt.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

using attn::Tensor1;
using attn::Tensor2;
using exercise::append_and_attend;

TEST_CASE("the first token attends to itself alone and its output is its own value") {
    Tensor2 keys = xt::zeros<float>({4, 2}), values = xt::zeros<float>({4, 3});
    const Tensor1 out = append_and_attend(keys, values, 0, Tensor1{5, -1}, Tensor1{1, 2},
                                          Tensor1{0.5f, -2, 7});
    // one position: its softmax weight is exactly 1, and 1·v rounds nothing (1e-6 a margin)
    CHECK_CLOSE(out, Tensor1({0.5f, -2, 7}), 1e-6);
    CHECK_CLOSE(xt::row(keys, 0), Tensor1({1, 2}), 0.0);
    CHECK_CLOSE(xt::row(values, 0), Tensor1({0.5f, -2, 7}), 0.0);
}

TEST_CASE("a second token blends two values with weights worked by hand") {
    // Row 0 already cached: k0 = (1, 0), v0 = (1, 0). The new token at pos 1 has
    // q = (1, 1), k1 = (0, 0), v1 = (0, 2). Scores: q·k0/√2 = 0.7071068, q·k1/√2 = 0.
    // Weights: e^0.7071068 = 2.0281150, so w0 = 2.0281150 / 3.0281150 = 0.6697615 and
    // w1 = 0.3302385. Output: w0·v0 + w1·v1 = (0.6697615, 0.6604769).
    INFO("scores q·k/√2 should be 0.7071068 and 0: weights 0.6697615 and 0.3302385, "
         "output w0·v0 + w1·v1 = (0.6697615, 0.6604769)");
    Tensor2 keys = {{1, 0}, {0, 0}, {0, 0}}, values = {{1, 0}, {0, 0}, {0, 0}};
    const Tensor1 out = append_and_attend(keys, values, 1, Tensor1{1, 1}, Tensor1{0, 0},
                                          Tensor1{0, 2});
    // values given to 7 digits (5e-8); q·k0 = 1 exact, then /√2, exp, sum, division and the
    // products: ≲ 6u·0.67 ≈ 2.4e-7 (u = 2^-24), 3.4× under 1e-6. The mistakes: attending
    // before the append gives (1, 0), 0.66 off; unscaled scores 0.80 instead of 0.67; weights
    // not divided by their sum, O(1).
    CHECK_CLOSE(out, Tensor1({0.6697615f, 0.6604769f}), 1e-6);
    CHECK_CLOSE(xt::row(values, 1), Tensor1({0, 2}), 0.0);
}

TEST_CASE("scores near 100 neither overflow nor give NaN") {
    // hs = 1, so the scale is 1. Scores q·k are 4·25 = 100 and 4·24.75 = 99: e^100 overflows
    // float, e^(s - 100) does not. Weights e/(e+1) = 0.7310586 and 1/(e+1) = 0.2689414.
    INFO("scores 100 and 99 should give weights e/(e+1) and 1/(e+1): subtract the largest score "
         "before exp (e^100 overflows float)");
    Tensor2 keys = {{25}, {0}}, values = {{1, 0}, {0, 0}};
    const Tensor1 out = append_and_attend(keys, values, 1, Tensor1{4}, Tensor1{24.75f},
                                          Tensor1{0, 1});
    // 4·25, 4·24.75 and their difference are exact; e^-1, sum, division ≲ 4u·0.73 ≈ 1.8e-7
    // plus the 7-digit reference's 5e-8 (u = 2^-24): 4× under 1e-6. Without the shift: NaN.
    CHECK_CLOSE(out, Tensor1({0.7310586f, 0.2689414f}), 1e-6);
}

TEST_CASE("scores near -1000 neither underflow nor give NaN") {
    // hs = 1: scores q·k are −4·250 = −1000 and −4·250.25 = −1001, weights e/(e+1) and
    // 1/(e+1). A softmax whose maximum starts at 0 (not at the first score or −∞) subtracts
    // 0, and e^−1000 is 0 in float: 0/0.
    INFO("scores -1000 and -1001 should give weights e/(e+1) and 1/(e+1): the largest score is "
         "-1000, not 0");
    Tensor2 keys = {{250}, {0}}, values = {{1, 0}, {0, 0}};
    const Tensor1 out = append_and_attend(keys, values, 1, Tensor1{-4}, Tensor1{250.25f},
                                          Tensor1{0, 1});
    // As above (exact products and shift): ≲ 2.3e-7. A maximum starting at 0 gives 0/0.
    CHECK_CLOSE(out, Tensor1({0.7310586f, 0.2689414f}), 1e-6);
}

TEST_CASE("a cache of one row, and values wider than keys, over a whole sequence") {
    // The random checks have hs_v = hs: here hs_v = 7 > hs = 2, and a capacity of 1.
    attn::Rng rng(5);
    Tensor2 one_key = xt::zeros<float>({1, 3}), one_value = xt::zeros<float>({1, 4});
    const Tensor1 v = rng.normal_tensor<1>({4});
    CHECK_CLOSE(append_and_attend(one_key, one_value, 0, rng.normal_tensor<1>({3}),
                                  rng.normal_tensor<1>({3}), v),
                v, 1e-6);
    const int capacity = 5, hs = 2, hs_v = 7;
    Tensor2 keys = xt::zeros<float>({capacity, hs}), values = xt::zeros<float>({capacity, hs_v});
    const Tensor2 all_keys = rng.normal_tensor<2>({capacity, hs});
    const Tensor2 all_values = rng.normal_tensor<2>({capacity, hs_v});
    for (int pos = 0; pos < capacity; ++pos) {
        CAPTURE(pos);
        const Tensor1 q = rng.normal_tensor<1>({hs});
        const Tensor1 out = append_and_attend(keys, values, pos, q, xt::row(all_keys, pos),
                                              xt::row(all_values, pos));
        // softmax(q·K[0..pos]ᵀ/√hs)·V[0..pos], written out in double
        double m = -1e300, sum = 0.0;
        std::vector<double> s(pos + 1);
        for (int j = 0; j <= pos; ++j) {
            s[j] = (double(q(0)) * all_keys(j, 0) + double(q(1)) * all_keys(j, 1)) / std::sqrt(2.0);
            m = std::max(m, s[j]);
        }
        for (double& x : s) sum += (x = std::exp(x - m));
        Tensor1 want = xt::zeros<float>({hs_v});
        for (int i = 0; i < hs_v; ++i) {
            double acc = 0.0;
            for (int j = 0; j <= pos; ++j) acc += s[j] / sum * all_values(j, i);
            want(i) = static_cast<float>(acc);
        }
        // Against double (u = 2^-24): a score (hs = 2, Σ|qk|/√2 ≲ 3.5) within (γ_2 + u)·3.5
        // ≈ 6e-7; a weight moves by ≤ half that, the output by ≤ 2·6e-7·max|v| (≈ 2.5) plus
        // γ_5·2.5: ≈ 4e-6 at worst; with random signs ≈ 3e-7·1.5 + √5 u·2.5 ≈ 5.6e-7 (rss):
        // 1e-6 rests on that, 1.8× above. Future rows or a missing scale move it by O(0.1).
        CHECK_CLOSE(out, want, 1e-6);
    }
}

TEST_CASE("only row pos is written and rows after pos are never read") {
    attn::Rng rng(1);
    Tensor2 keys = rng.normal_tensor<2>({6, 4}), values = rng.normal_tensor<2>({6, 4});
    const Tensor1 q = rng.normal_tensor<1>({4}), k = rng.normal_tensor<1>({4}),
                  v = rng.normal_tensor<1>({4});
    Tensor2 keys2 = keys, values2 = values;
    Tensor2 expected_keys = keys;  // what the cache must hold afterwards: row 2 replaced by k
    xt::row(expected_keys, 2) = k;
    // rows 3..5 are future tokens: fill the second copy's with huge numbers
    xt::view(keys2, xt::range(3, 6)) = 1e6f;
    xt::view(values2, xt::range(3, 6)) = -1e6f;
    const Tensor1 a = append_and_attend(keys, values, 2, q, k, v);
    const Tensor1 b = append_and_attend(keys2, values2, 2, q, k, v);
    CHECK_CLOSE(a, b, 0.0);  // the same rows 0..2, the same arithmetic: exact
    CHECK_CLOSE(keys, expected_keys, 0.0);
}

TEST_CASE("property: rows after pos may hold anything, for a query of either sign and any position") {
    // The future rows hold keys along +q or −q (scores of ±10^3·|q|²/√hs and ±10^6·…, huge
    // whatever q's sign), 10^30, +∞ or NaN, and values of NaN or 10^30: the output must be
    // exactly the output with zeros there, at every position of the cache. A maximum taken
    // over the whole capacity sees the huge future scores (e^(s − m) = 0 for every real key,
    // 0/0); a sum over it reads the NaNs. Exact: rows 0..pos and the arithmetic are the same.
    const std::size_t capacity = 6, hs = 4;
    attn::Rng rng(14);
    for (int pos = 0; pos < static_cast<int>(capacity); ++pos)
        for (float sign : {1.0f, -1.0f}) {
            const Tensor1 q = sign * rng.normal_tensor<1>({hs}), k = rng.normal_tensor<1>({hs}),
                          v = rng.normal_tensor<1>({hs});
            Tensor2 keys = rng.normal_tensor<2>({capacity, hs}), values = rng.normal_tensor<2>({capacity, hs});
            Tensor2 clean_keys = keys, clean_values = values;
            for (std::size_t j = static_cast<std::size_t>(pos) + 1; j < capacity; ++j)
                for (std::size_t i = 0; i < hs; ++i) clean_keys(j, i) = clean_values(j, i) = 0.0f;
            const Tensor1 expected = append_and_attend(clean_keys, clean_values, pos, q, k, v);
            const float nan = std::numeric_limits<float>::quiet_NaN();
            const float fills[] = {1e3f, 1e6f, -1e6f, 1e30f, std::numeric_limits<float>::infinity(), nan};
            for (float fill : fills) {
                Tensor2 kc = keys, vc = values;
                for (std::size_t j = static_cast<std::size_t>(pos) + 1; j < capacity; ++j)
                    for (std::size_t i = 0; i < hs; ++i) {
                        // 10^3 and ±10^6 along q: a huge positive (or negative) score for any q
                        kc(j, i) = std::abs(fill) < 1e7f ? fill * q(i) : fill;
                        vc(j, i) = fill == 1e30f ? 1e30f : nan;
                    }
                CAPTURE(pos);
                CAPTURE(fill);
                INFO("rows after pos are tokens not yet seen: no score, maximum or sum may read them");
                CHECK_CLOSE(append_and_attend(kc, vc, pos, q, k, v), expected, 0.0);
            }
        }
}

namespace {

// A power of two near |x| (x ≠ 0): the size of a drawn magnitude, made exact to scale by.
float power_of_two_near(float x) {
    return std::ldexp(1.0f, static_cast<int>(std::lround(std::log2(std::abs(static_cast<double>(x))))));
}

// Bit-for-bit equality, NaN payloads included: what "never read, never written" means.
bool same_bits(const Tensor2& a, const Tensor2& b) {
    return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// softmax(q·K[0..pos]ᵀ/√hs)·V[0..pos] in float64 (keys (pos + 1, hs), values (pos + 1, hs_v)),
// and the bound on a float32 step's output: with the scores exact in float (the caller's
// inputs make them so), e^(s − m) is within 2u (u = 2^-24), the sum of ≤ n = pos + 1 terms
// within γ_n, the division and the product u each, the output's sum γ_n: ≤ (2n + 4)u·p_j|v_j|
// per term; a one-pass (online) form adds ≤ n rescales of 3u each, so (4n + 6)u·p_j|v_j| is
// asked, plus 2^-147·n for the ≤ 4n results that may fall among float's subnormals, each
// rounded by ≤ 2^-150 absolutely and then divided by a sum ≥ 1.
struct Step {
    std::vector<double> out, tolerance;
};

Step float64_step(const Tensor1& q, const Tensor2& keys, const Tensor2& values) {
    const double u = std::ldexp(1.0, -24);
    const std::size_t n = keys.shape()[0], hs = keys.shape()[1], hs_v = values.shape()[1];
    std::vector<double> s(n);
    double m = -INFINITY, z = 0.0;
    for (std::size_t j = 0; j < n; ++j) {
        double dot = 0.0;
        for (std::size_t i = 0; i < hs; ++i) dot += static_cast<double>(q(i)) * keys(j, i);
        s[j] = dot / std::sqrt(static_cast<double>(hs));
        m = std::max(m, s[j]);
    }
    for (double x : s) z += std::exp(x - m);
    Step r{std::vector<double>(hs_v, 0.0), std::vector<double>(hs_v, std::ldexp(static_cast<double>(n), -147))};
    const double nn = static_cast<double>(n);
    for (std::size_t j = 0; j < n; ++j) {
        const double p = std::exp(s[j] - m) / z;
        for (std::size_t i = 0; i < hs_v; ++i) {
            r.out[i] += p * values(j, i);
            r.tolerance[i] += (4 * nn + 6) * u * p * std::abs(static_cast<double>(values(j, i)));
        }
    }
    return r;
}

// RC_ASSERTs that `out` is `ref` to its bound, channel by channel.
void check_step(const Tensor1& out, const Step& ref) {
    RC_ASSERT(out.size() == ref.out.size());
    for (std::size_t i = 0; i < out.size(); ++i) RC_ASSERT(std::abs(out(i) - ref.out[i]) <= ref.tolerance[i]);
}

}  // namespace

TEST_CASE("property: queries and keys of any size, values distinct, and anything in the rows not yet written") {
    // A cache of 1 to 8 rows (1 a quarter of the time) and a position in it; hs of 1, 4 or 16
    // (1/√hs is then exact) and hs_v from 1 to 5. q and the keys are small integers (−8 … 8)
    // times a power of two of any size (2^−20 … 2^50: scores of either sign up to ~10^32), so
    // every score q·k/√hs is exact in float and only the softmax rounds; the values are
    // distinct (a k passed for v, or a row read as a column, shows). Row pos, and every row
    // after it, holds NaN, +∞ or −∞ before the call: row pos must become k and v, the later
    // rows keep their bits and are never read, and the output is the float64 attention over
    // rows 0..pos within float64_step's bound. A maximum started at 0 or at a finite sentinel
    // (−1e9) loses every weight of a row of scores below it; a maximum over the capacity reads
    // the non-finite rows.
    attn::check_property("append_and_attend at any magnitude equals float64 attention over rows 0..pos", [] {
        const std::size_t capacity = attn::draw("capacity", attn::family::length(8));
        const std::size_t pos = attn::draw("pos", rc::gen::inRange<std::size_t>(0, capacity));
        const std::size_t hs = attn::draw("hs", rc::gen::element<std::size_t>(1, 4, 16));
        const std::size_t hs_v = attn::draw("hs_v", rc::gen::inRange<std::size_t>(1, 6));
        const float q_size = power_of_two_near(attn::draw("q magnitude", attn::family::magnitude(-6, 15)));
        const float k_size = power_of_two_near(attn::draw("k magnitude", attn::family::magnitude(-6, 15)));
        const auto q_int = attn::draw("q / its magnitude", rc::gen::container<std::vector<int>>(hs, rc::gen::inRange(-8, 9)));
        const auto k_int = attn::draw("keys 0..pos / their magnitude (flat)",
                                      rc::gen::container<std::vector<int>>((pos + 1) * hs, rc::gen::inRange(-8, 9)));
        const auto v_flat = attn::draw("values 0..pos (flat, distinct)", attn::family::distinct((pos + 1) * hs_v));
        const float unwritten = attn::draw("rows pos and after hold", attn::family::non_finite());
        Tensor1 q = xt::zeros<float>({hs}), k = xt::zeros<float>({hs}), v = xt::zeros<float>({hs_v});
        Tensor2 keys = xt::zeros<float>({pos + 1, hs}), values = xt::zeros<float>({pos + 1, hs_v});
        for (std::size_t i = 0; i < hs; ++i) q(i) = static_cast<float>(q_int[i]) * q_size;
        for (std::size_t j = 0; j <= pos; ++j) {
            for (std::size_t i = 0; i < hs; ++i) keys(j, i) = static_cast<float>(k_int[j * hs + i]) * k_size;
            for (std::size_t i = 0; i < hs_v; ++i) values(j, i) = v_flat[j * hs_v + i];
        }
        for (std::size_t i = 0; i < hs; ++i) k(i) = keys(pos, i);
        for (std::size_t i = 0; i < hs_v; ++i) v(i) = values(pos, i);
        Tensor2 key_cache = xt::full_like(xt::zeros<float>({capacity, hs}), unwritten),
                value_cache = xt::full_like(xt::zeros<float>({capacity, hs_v}), unwritten);
        xt::view(key_cache, xt::range(0, static_cast<long>(pos))) = xt::view(keys, xt::range(0, static_cast<long>(pos)));
        xt::view(value_cache, xt::range(0, static_cast<long>(pos))) = xt::view(values, xt::range(0, static_cast<long>(pos)));
        Tensor2 expected_keys = key_cache, expected_values = value_cache;
        xt::row(expected_keys, static_cast<long>(pos)) = k;
        xt::row(expected_values, static_cast<long>(pos)) = v;
        const Tensor1 out = append_and_attend(key_cache, value_cache, static_cast<int>(pos), q, k, v);
        RC_ASSERT(same_bits(key_cache, expected_keys));
        RC_ASSERT(same_bits(value_cache, expected_values));
        check_step(out, float64_step(q, keys, values));
    });
}

TEST_CASE("property: the cached rows in any order, q and k scaled apart, and the values scaled or moved") {
    // Rows 0..pos of a cache of 1 to 8 rows, hs of 1, 4 or 16, hs_v from 1 to 5, q and keys
    // small integers (−3 … 3: |s| ≤ 36, so every weight is ≥ e^−72 and no product p·v comes
    // near float's subnormals), values distinct. Invariances, with e from −8 to 8:
    //   q·2^e with every key·2^−e: the same scores, so the same output, bit for bit;
    //   values·2^e: the output·2^e, bit for bit (every product and sum scales exactly);
    //   rows 0..pos − 1 cached in a drawn order (the new token stays at pos): attention does
    //   not depend on where a key sits, so the output is the float64 one within its bound;
    //   values + c (an offset 0, ±1 … ±10^4): the float64 attention over the moved values
    //   (rounded to float as the cache holds them), within the bound, which grows with |v + c|:
    //   the weights must sum to 1 to carry c through.
    attn::check_property("append_and_attend is order-free in the cache and scales as attention does", [] {
        const std::size_t capacity = attn::draw("capacity", attn::family::length(8));
        const std::size_t pos = attn::draw("pos", rc::gen::inRange<std::size_t>(0, capacity));
        const std::size_t hs = attn::draw("hs", rc::gen::element<std::size_t>(1, 4, 16));
        const std::size_t hs_v = attn::draw("hs_v", rc::gen::inRange<std::size_t>(1, 6));
        const auto q_int = attn::draw("q", rc::gen::container<std::vector<int>>(hs, rc::gen::inRange(-3, 4)));
        const auto k_int = attn::draw("keys 0..pos (flat)", rc::gen::container<std::vector<int>>((pos + 1) * hs, rc::gen::inRange(-3, 4)));
        const auto v_flat = attn::draw("values 0..pos (flat, distinct)", attn::family::distinct((pos + 1) * hs_v));
        const float scale = attn::draw("scale", attn::family::scale());
        const auto order = attn::draw("order of rows 0..pos − 1", attn::family::permutation(pos));
        const float c = attn::draw("offset of the values", attn::family::offset());
        Tensor1 q = xt::zeros<float>({hs});
        Tensor2 keys = xt::zeros<float>({pos + 1, hs}), values = xt::zeros<float>({pos + 1, hs_v});
        for (std::size_t i = 0; i < hs; ++i) q(i) = static_cast<float>(q_int[i]);
        for (std::size_t j = 0; j <= pos; ++j) {
            for (std::size_t i = 0; i < hs; ++i) keys(j, i) = static_cast<float>(k_int[j * hs + i]);
            for (std::size_t i = 0; i < hs_v; ++i) values(j, i) = v_flat[j * hs_v + i];
        }
        // One step at pos over cached rows `k_rows`, `v_rows` (rows 0..pos; row pos is appended).
        const auto step = [&](const Tensor1& query, const Tensor2& k_rows, const Tensor2& v_rows) {
            Tensor2 key_cache = xt::zeros<float>({capacity, hs}), value_cache = xt::zeros<float>({capacity, hs_v});
            xt::view(key_cache, xt::range(0, static_cast<long>(pos))) = xt::view(k_rows, xt::range(0, static_cast<long>(pos)));
            xt::view(value_cache, xt::range(0, static_cast<long>(pos))) = xt::view(v_rows, xt::range(0, static_cast<long>(pos)));
            return append_and_attend(key_cache, value_cache, static_cast<int>(pos), query,
                                     Tensor1(xt::row(k_rows, static_cast<long>(pos))),
                                     Tensor1(xt::row(v_rows, static_cast<long>(pos))));
        };
        const Tensor1 out = step(q, keys, values);
        check_step(out, float64_step(q, keys, values));
        const Tensor1 apart = step(Tensor1(q * scale), Tensor2(keys / scale), values);
        const Tensor1 scaled = step(q, keys, Tensor2(values * scale));
        for (std::size_t i = 0; i < hs_v; ++i) {
            RC_ASSERT(apart(i) == out(i));
            RC_ASSERT(scaled(i) == out(i) * scale);
        }
        Tensor2 moved_keys = keys, moved_values = values;
        for (std::size_t j = 0; j < pos; ++j) {
            xt::row(moved_keys, static_cast<long>(j)) = xt::row(keys, static_cast<long>(order[j]));
            xt::row(moved_values, static_cast<long>(j)) = xt::row(values, static_cast<long>(order[j]));
        }
        check_step(step(q, moved_keys, moved_values), float64_step(q, keys, values));
        const Tensor2 offset_values = values + c;
        check_step(step(q, keys, offset_values), float64_step(q, keys, offset_values));
    });
}

TEST_CASE("property: a position below 0, or at or past the capacity, is refused and nothing is written") {
    // pos below 0 (−1, −2, −10^6, and a large negative int) or at or past the capacity
    // (capacity, capacity + 1, INT_MAX), for caches of 1 to 8 rows: std::invalid_argument,
    // and both caches keep every bit.
    attn::check_property("append_and_attend refuses every position outside the cache", [] {
        const std::size_t capacity = attn::draw("capacity", attn::family::length(8));
        const int cap = static_cast<int>(capacity);
        const long bad = attn::draw("pos", rc::gen::oneOf(attn::family::below(0),
                                                         rc::gen::element<long>(cap, cap + 1, std::numeric_limits<int>::max())));
        const int pos = static_cast<int>(std::max<long>(bad, std::numeric_limits<int>::min()));
        attn::Rng rng(static_cast<std::uint64_t>(capacity));
        Tensor2 keys = rng.normal_tensor<2>({capacity, 3}), values = rng.normal_tensor<2>({capacity, 2});
        const Tensor2 keys_before = keys, values_before = values;
        RC_ASSERT(attn::refused([&] { (void)append_and_attend(keys, values, pos, Tensor1{1, 2, 3}, Tensor1{4, 5, 6}, Tensor1{7, 8}); }));
        RC_ASSERT(same_bits(keys, keys_before));
        RC_ASSERT(same_bits(values, values_before));
    });
}

TEST_CASE("step by step it reproduces full causal attention of one head") {
    // T tokens appended one at a time must give the rows of ordinary causal attention
    // (attn::attention_forward with one head) over the same q, k, v.
    const int T = 7, hs = 8;
    attn::Rng rng(2);
    std::vector<float> qkv(static_cast<std::size_t>(T) * 3 * hs);  // (T, 3·hs), C = hs
    for (float& x : qkv) x = rng.normal();
    std::vector<float> expected(static_cast<std::size_t>(T) * hs), att(T * T);
    attn::attention_forward(expected.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, 1, T,
                            hs, 1);
    Tensor2 keys = xt::zeros<float>({T, hs}), values = xt::zeros<float>({T, hs});
    for (int t = 0; t < T; ++t) {
        CAPTURE(t);
        const float* row = qkv.data() + t * 3 * hs;
        const Tensor1 q = xt::adapt(row, hs, xt::no_ownership(), std::array<std::size_t, 1>{hs});
        const Tensor1 k = xt::adapt(row + hs, hs, xt::no_ownership(), std::array<std::size_t, 1>{hs});
        const Tensor1 v = xt::adapt(row + 2 * hs, hs, xt::no_ownership(), std::array<std::size_t, 1>{hs});
        const Tensor1 out = append_and_attend(keys, values, t, q, k, v);
        const Tensor1 want = xt::adapt(expected.data() + t * hs, hs, xt::no_ownership(),
                                       std::array<std::size_t, 1>{hs});
        // Sums of 8 products of N(0,1) numbers in another order: a score (Σ|qk|/√8 ≲ 3.5)
        // within 2γ_8·3.5 ≈ 3.4e-6, the output within ≈ 2·3.4e-6·2.5 + 2γ_7·2.5 ≈ 1.9e-5 at
        // worst (u = 2^-24); with random signs ≈ √2·(√8 u·3.5·1.5 + √7 u·2.5) ≈ 1.4e-6: 1e-5
        // rests on that, 7× above. The mistakes (future rows, no scale, before the append,
        // 1/√(pos + 1)) are off by O(0.1).
        CHECK_CLOSE(out, want, 1e-5);
    }
}

TEST_CASE("agrees with the library's cached attention step on random input") {
    const int capacity = 9, hs = 6;
    attn::Rng rng(3);
    attn::KVCache cache(1, 1, hs, capacity);
    Tensor2 keys = xt::zeros<float>({capacity, hs}), values = xt::zeros<float>({capacity, hs});
    for (int pos = 0; pos < capacity; ++pos) {
        CAPTURE(pos);
        const Tensor1 q = rng.normal_tensor<1>({hs}), k = rng.normal_tensor<1>({hs}),
                      v = rng.normal_tensor<1>({hs});
        const Tensor1 out = append_and_attend(keys, values, pos, q, k, v);
        cache.append(0, k.data(), v.data());
        std::vector<float> lib(hs), weights(pos + 1);
        attn::attention_step_forward(lib.data(), weights.data(), q.data(), cache.keys(0),
                                     cache.values(0), pos + 1, capacity, hs, 1);
        const Tensor1 want = xt::adapt(lib, std::array<std::size_t, 1>{hs});
        // As above with hs = 6, T ≤ 9 (and the library's exp_approx, 4u): worst ≈ 1.5e-5,
        // random-sign ≈ 1.3e-6, 7× under 1e-5.
        CHECK_CLOSE(out, want, 1e-5);
    }
}

TEST_CASE("bad shapes and positions are rejected with std::invalid_argument") {
    attn::Rng rng(4);
    Tensor2 keys = xt::zeros<float>({4, 3}), values = xt::zeros<float>({4, 2});
    const Tensor1 q = rng.normal_tensor<1>({3}), k = rng.normal_tensor<1>({3}),
                  v = rng.normal_tensor<1>({2});
    SUBCASE("a position outside the cache") {
        CHECK_THROWS_AS(append_and_attend(keys, values, 4, q, k, v), std::invalid_argument);
        CHECK_THROWS_AS(append_and_attend(keys, values, -1, q, k, v), std::invalid_argument);
    }
    SUBCASE("q, k or v of the wrong size") {
        const Tensor1 four = rng.normal_tensor<1>({4});
        CHECK_THROWS_AS(append_and_attend(keys, values, 0, four, k, v), std::invalid_argument);
        CHECK_THROWS_AS(append_and_attend(keys, values, 0, q, four, v), std::invalid_argument);
        CHECK_THROWS_AS(append_and_attend(keys, values, 0, q, k, four), std::invalid_argument);
    }
    SUBCASE("caches with different capacities") {
        Tensor2 short_values = xt::zeros<float>({3, 2});
        CHECK_THROWS_AS(append_and_attend(keys, short_values, 0, q, k, v), std::invalid_argument);
    }
    // nothing was written by the rejected calls
    INFO("a rejected call must leave both caches unchanged: validate everything before writing");
    CHECK_CLOSE(keys, xt::zeros<float>({4, 3}), 0.0);
    CHECK_CLOSE(values, xt::zeros<float>({4, 2}), 0.0);
}
