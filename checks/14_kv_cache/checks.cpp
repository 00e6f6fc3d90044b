// Checks for exercise 14: appending to the cache and attending over it.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - rows after pos may hold anything, for a query of either sign and any position
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/kv_cache.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xadapt.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
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
