// Checks for exercise 06: scaled dot-product attention over any batch axes, with a mask.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - scores of any size and sign, any hidden keys: the weights are the float64 softmax of the scores
// - masks of every kind over two batch axes, T_q != T_k, and the keys in any order: the float64 attention
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/fixtures.hpp"
#include "attn/npy.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"
#include "attn/sdpa.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

using attn::Tensor2;
using attn::Tensor3;
using attn::Tensor4;
using exercise::attention;

namespace {
const std::filesystem::path fixtures = attn::fixtures_dir() / "sdpa";

// One fixture written by tools/reference/make_attention_fixtures.py from PyTorch.
template <std::size_t N>
void check_fixture(const std::string& name, bool has_mask) {
    CAPTURE(name);
    const attn::Tensor<N> q = attn::load_npy<N>(fixtures / (name + "_q.npy"));
    const attn::Tensor<N> k = attn::load_npy<N>(fixtures / (name + "_k.npy"));
    const attn::Tensor<N> v = attn::load_npy<N>(fixtures / (name + "_v.npy"));
    attn::Mask<2> mask;
    if (has_mask) mask = xt::not_equal(attn::load_npy<2>(fixtures / (name + "_mask.npy")), 0.0f);
    const auto got = attention<N>(q, k, v, has_mask ? &mask : nullptr);
    // The reference is float64 rounded to float32; d_k ≤ 8, T_k ≤ 6, |q|, |k|, |v| ≤ 3.9. One
    // float32 order is within γ_n Σ|terms| of the exact sum (u = 2^-24); through the
    // softmax and Σ p v these fixtures' worst case is ≤ 1.4e-6 on a weight and ≤ 6.4e-6 on
    // an output, the random-sign estimate ≤ 2.8e-7 and ≤ 7.7e-7 (tests/test_sdpa.cpp): 1e-6
    // rests on it, 3.6× and 1.3× above. The mistakes (√d_v or √T_k scaling, a mask after
    // the softmax or of 0, item 0's values) move weights and outputs by ≥ 0.05.
    CHECK_CLOSE(got.out, attn::load_npy<N>(fixtures / (name + "_out.npy")), 1e-6);
    CHECK_CLOSE(got.weights, attn::load_npy<N>(fixtures / (name + "_weights.npy")), 1e-6);
}
}  // namespace

TEST_CASE("a small example matches values worked by hand") {
    // Scores q·k/√4 are 1 and 0: weights e/(e+1) and 1/(e+1) blend the two values.
    INFO("scores should be q·k/√d_k = 2/√4 = 1 and 0, so the weights e/(e+1) = 0.731 and "
         "1/(e+1) = 0.269 blend the two values");
    Tensor2 q = {{2, 0, 0, 0}};
    Tensor2 k = {{1, 0, 0, 0}, {0, 1, 0, 0}};
    Tensor2 v = {{10, 0}, {0, 10}};
    const auto got = attention<2>(q, k, v);
    const double e = std::exp(1.0);
    const float w0 = static_cast<float>(e / (e + 1)), w1 = static_cast<float>(1 / (e + 1));
    CHECK_CLOSE(got.weights, Tensor2({{w0, w1}}), 1e-6);
    // Scores 1 and 0 exact; exp, sum, division ≲ 3u (u = 2^-24) plus the reference's ½ulp:
    // ≤ 2e-7 on the weights (5× under 1e-6), ×10 ≲ 3.3e-6 on the outputs (3× under 1e-5).
    CHECK_CLOSE(got.out, Tensor2({{10 * w0, 10 * w1}}), 1e-5);
}

TEST_CASE("matches PyTorch with one batch axis and T_q != T_k") {
    check_fixture<3>("d3_tq_ne_tk", false);
    check_fixture<3>("d3_causal", true);
}

TEST_CASE("matches PyTorch with no batch axis") { check_fixture<2>("d2_plain", false); }

TEST_CASE("matches PyTorch with two batch axes and a mask") {
    check_fixture<4>("d4_plain", false);
    check_fixture<4>("d4_mask", true);
}

TEST_CASE("matches PyTorch with three batch axes") {
    check_fixture<5>("d5_plain", false);
    check_fixture<5>("d5_causal", true);
}

TEST_CASE("hidden keys get exactly 0 and the allowed weights of each row sum to 1") {
    attn::Rng rng(61);
    Tensor4 q = rng.normal_tensor<4>({2, 3, 5, 8}), k = rng.normal_tensor<4>({2, 3, 7, 8}),
            v = rng.normal_tensor<4>({2, 3, 7, 4});
    attn::Mask<2> mask = rng.uniform_tensor<2>({5, 7}, 0.0f, 1.0f) < 0.5f;
    for (std::size_t i = 0; i < 5; ++i) mask(i, i) = true;  // every query may see some key
    const auto got = attention<4>(q, k, v, &mask);
    REQUIRE(attn::shape_of(got.weights) == "(2, 3, 5, 7)");
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t h = 0; h < 3; ++h)
            for (std::size_t i = 0; i < 5; ++i) {
                CAPTURE(b);
                CAPTURE(h);
                CAPTURE(i);
                double sum = 0.0;
                for (std::size_t j = 0; j < 7; ++j) {
                    if (!mask(i, j)) CHECK(got.weights(b, h, i, j) == 0.0f);
                    sum += got.weights(b, h, i, j);
                }
                // Σ_j e_j/Z, Z from the same rounded e_j: Z's γ_6 plus a division's u (2u via
                // 1/Z): ≤ 8u ≈ 4.8e-7 (u = 2^-24; summed here in double), 2× under 1e-6.
                // A mask applied after the softmax leaves rows summing to < 1 by O(0.1).
                CHECK(std::fabs(sum - 1.0) < 1e-6);
            }
}

TEST_CASE("every batch index is attended on its own") {
    attn::Rng rng(62);
    Tensor4 q = rng.normal_tensor<4>({2, 2, 4, 6}), k = rng.normal_tensor<4>({2, 2, 5, 6}),
            v = rng.normal_tensor<4>({2, 2, 5, 3});
    const auto all = attention<4>(q, k, v);
    REQUIRE(attn::shape_of(all.out) == "(2, 2, 4, 3)");
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t h = 0; h < 2; ++h) {
            CAPTURE(b);
            CAPTURE(h);
            const auto one = attention<2>(Tensor2(xt::view(q, b, h)), Tensor2(xt::view(k, b, h)),
                                          Tensor2(xt::view(v, b, h)));
            // Same sums, same order: 0 (1e-6 is a margin). Item 0's values for every item is
            // off by O(1).
            CHECK_CLOSE(xt::view(all.out, b, h), one.out, 1e-6);
        }
}

TEST_CASE("more queries than keys, values wider than keys, one key, and scores past 100") {
    // The fixtures have T_q < T_k, d_v <= d_k and scores of size ~1: here the other way
    // round, a single key, and queries ×60, whose scores pass 100, where e^s overflows float
    // unless each row's maximum is subtracted first. The reference is the library's
    // scaled_dot_product_attention.
    struct Case {
        std::size_t T_q, T_k, d_k, d_v;
        float size;  // of the queries
    };
    attn::Rng rng(64);
    for (const Case& c : {Case{6, 2, 3, 5, 1.0f}, Case{3, 1, 4, 2, 1.0f}, Case{4, 5, 8, 3, 60.0f}}) {
        for (bool masked : {false, true}) {
            CAPTURE(c.T_q);
            CAPTURE(c.T_k);
            CAPTURE(c.d_k);
            CAPTURE(c.d_v);
            CAPTURE(c.size);
            CAPTURE(masked);
            const Tensor3 q = rng.normal_tensor<3>({2, c.T_q, c.d_k}) * c.size;
            const Tensor3 k = rng.normal_tensor<3>({2, c.T_k, c.d_k});
            const Tensor3 v = rng.normal_tensor<3>({2, c.T_k, c.d_v});
            attn::Mask<2> mask = rng.uniform_tensor<2>({c.T_q, c.T_k}, 0.0f, 1.0f) < 0.6f;
            Tensor3 weights;
            const Tensor3 out = masked ? attn::scaled_dot_product_attention(q, k, v, mask, &weights)
                                       : attn::scaled_dot_product_attention(q, k, v, {}, &weights);
            const auto got = attention<3>(q, k, v, masked ? &mask : nullptr);
            INFO("with scores past 100, subtract each row's largest score before exp: e^100 "
                 "overflows float");
            // Scores up to ~200 (d_k = 8, q ×60: Σ|qk|/√8 ≲ 200): two orders differ by
            // 2γ_8·200 ≈ 1.9e-4 at worst, √8 u·200 ≈ 3.4e-5 with random signs, plus ≤ 2u·200
            // ≈ 2.4e-5 if one side scales by 1/√8 and the other divides (u = 2^-24). A weight
            // moves by ≤ 2p(1 − p)·Δs, ≲ 2e-5 (random) and ≤ 9.5e-5 (worst); an output by up
            // to 2·Δs·max|v| ≈ 1e-3 at worst, ≈ 2e-5 estimated: 1e-4 rests on the estimate,
            // 5× above. Without the max subtracted, e^s overflows: NaN, not close.
            CHECK_CLOSE(got.weights, weights, 1e-4);
            CHECK_CLOSE(got.out, out, 1e-4);
        }
    }
}

TEST_CASE("property: scores of any size and sign, any hidden keys: the weights are the float64 softmax of the scores") {
    // One query, d_k = 1, 1 to 5 keys (1 a quarter of the time): a score is then the single float product q·k (the
    // scale is 1), anything from ±10^−6 to ±10^38, and the reference is the float64 softmax
    // of those float scores over the allowed keys (zeros when none is), out = Σ w·v. Bounds
    // as lesson 04's (u = 2^-24): |w − ref| ≤ (T_k + 3)u·ref + u, and out within that times
    // |v| plus T_k·u·Σ ref·|v| for its own sum. A finite sentinel for "hidden" (−1e9 filled
    // in, a row "fully hidden" when its maximum is ≤ −1e9) zeroes rows whose scores are all
    // below it, which are ordinary rows.
    const double u = std::ldexp(1.0, -24);
    const auto factor = attn::family::magnitude(-3, 19);
    attn::check_property("attention's weights and output for one query over keys of any score", [&] {
        const std::size_t Tk = attn::draw("T_k", attn::family::length(5));
        const float qv = attn::draw("q", factor);
        const auto keys = attn::draw("k", rc::gen::container<std::vector<float>>(Tk, factor));
        const auto allowed = attn::draw("allowed keys", rc::gen::container<std::vector<bool>>(Tk, rc::gen::arbitrary<bool>()));
        Tensor2 q = {{qv}}, k = xt::zeros<float>({Tk, std::size_t{1}}), v = xt::zeros<float>({Tk, std::size_t{1}});
        attn::Mask<2> mask = xt::zeros<bool>({std::size_t{1}, Tk});
        std::vector<double> score(Tk);
        double m = -std::numeric_limits<double>::infinity();
        for (std::size_t j = 0; j < Tk; ++j) {
            k(j, 0) = keys[j];
            v(j, 0) = static_cast<float>(j) - 2.0f;
            mask(0, j) = allowed[j];
            score[j] = static_cast<double>(qv * keys[j]);  // the float product, as attention computes it
            if (allowed[j]) m = std::max(m, score[j]);
        }
        const auto a = attention<2>(q, k, v, &mask);
        double z = 0.0, out = 0.0, out_tol = 0.0;
        for (std::size_t j = 0; j < Tk; ++j)
            if (allowed[j]) z += std::exp(score[j] - m);
        for (std::size_t j = 0; j < Tk; ++j) {
            const double ref = allowed[j] && z > 0 ? std::exp(score[j] - m) / z : 0.0;
            const double tol = (static_cast<double>(Tk) + 3) * u * ref + u;
            RC_ASSERT(std::abs(a.weights(0, j) - ref) <= tol);
            out += ref * v(j, 0);
            out_tol += tol * std::abs(v(j, 0)) + static_cast<double>(Tk) * u * ref * std::abs(v(j, 0));
        }
        RC_ASSERT(std::abs(a.out(0, 0) - out) <= out_tol);
    });
}

TEST_CASE("property: masks of every kind over two batch axes, T_q != T_k, and the keys in any order: the float64 attention") {
    // q, k (…, T, d_k) of N(0, σ²), σ from 10^−3 to 10^1, values pairwise distinct (a value
    // read from another key, or k read for v, is seen), two batch axes of 1 or 2, T_q and
    // T_k from 1 to 6 (1 a quarter of the time), d_k and d_v from 1 to 4, and a mask whose
    // rows let through the leading keys, the trailing ones, every other one, one, all, or
    // the causal pattern with T_q ≠ T_k (family::mask). Reference: the float64 attention of
    // the same floats. Bounds (u = 2^-24): a score q·k/√d_k in float is within
    // e = (d_k + 4)u·Σ_c|q_c k_c|/√d_k (products, sum, scale) of its float64 value; the
    // difference of two scores moves by ≤ 2·max e, so a weight by the factor e^(±2·max e);
    // the softmax's own rounding adds (T_k + 3)u·ref + u: |w − ref| ≤ ref·(e^(2·max e) − 1)
    // + (T_k + 3)u·ref + u. The output Σ w·v then within Σ_j tol_j·|v_j| + (T_k + 1)u·Σ ref·|v|.
    // Then the same keys, values and mask columns in a drawn order (a permutation of the
    // keys): the weights are permuted with them and the output stays, within the same bounds.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("attention with any mask over batch axes, and with the keys reordered", [u] {
        const std::size_t B1 = attn::draw("batch axis 0", attn::family::length(2)),
                          B2 = attn::draw("batch axis 1", attn::family::length(2)),
                          Tq = attn::draw("T_q", attn::family::length(6)), Tk = attn::draw("T_k", attn::family::length(6)),
                          dk = attn::draw("d_k", attn::family::length(4)), dv = attn::draw("d_v", attn::family::length(4));
        const attn::Mask<2> mask = attn::family::mask("mask", Tq, Tk);
        const float sigma = std::abs(attn::draw("sigma of q and k", attn::family::magnitude(-3, 1)));
        attn::Rng rng(attn::draw("seed", rc::gen::inRange<std::uint64_t>(0, 1000000)));
        const Tensor4 q = rng.normal_tensor<4>({B1, B2, Tq, dk}, 0.0f, sigma),
                      k = rng.normal_tensor<4>({B1, B2, Tk, dk}, 0.0f, sigma);
        const auto values = attn::draw("v (flat, distinct)", attn::family::distinct(B1 * B2 * Tk * dv));
        Tensor4 v = xt::zeros<float>({B1, B2, Tk, dv});
        std::copy(values.begin(), values.end(), v.begin());
        const auto order = attn::draw("the keys' order", attn::family::permutation(Tk));
        Tensor4 k2 = k, v2 = v;
        attn::Mask<2> mask2 = mask;
        for (std::size_t j = 0; j < Tk; ++j) {
            xt::view(k2, xt::all(), xt::all(), j) = xt::view(k, xt::all(), xt::all(), order[j]);
            xt::view(v2, xt::all(), xt::all(), j) = xt::view(v, xt::all(), xt::all(), order[j]);
            xt::view(mask2, xt::all(), j) = xt::view(mask, xt::all(), order[j]);
        }
        const auto a = attention<4>(q, k, v, &mask);
        const auto moved = attention<4>(q, k2, v2, &mask2);
        RC_ASSERT(attn::shape_of(a.out) == attn::shape_of(Tensor4(xt::zeros<float>({B1, B2, Tq, dv}))));
        RC_ASSERT(attn::shape_of(a.weights) == attn::shape_of(Tensor4(xt::zeros<float>({B1, B2, Tq, Tk}))));
        RC_ASSERT(moved.out.shape() == a.out.shape() && moved.weights.shape() == a.weights.shape());
        const double own = (static_cast<double>(Tk) + 3) * u, root = std::sqrt(static_cast<double>(dk));
        for (std::size_t b1 = 0; b1 < B1; ++b1)
            for (std::size_t b2 = 0; b2 < B2; ++b2)
                for (std::size_t i = 0; i < Tq; ++i) {
                    std::vector<double> score(Tk), ref(Tk, 0.0), tol(Tk, u);
                    double m = -std::numeric_limits<double>::infinity(), z = 0.0, e = 0.0;
                    for (std::size_t j = 0; j < Tk; ++j) {
                        double dot = 0.0, size = 0.0;
                        for (std::size_t c = 0; c < dk; ++c) {
                            dot += static_cast<double>(q(b1, b2, i, c)) * k(b1, b2, j, c);
                            size += std::abs(static_cast<double>(q(b1, b2, i, c)) * k(b1, b2, j, c));
                        }
                        score[j] = dot / root;
                        if (mask(i, j)) {
                            m = std::max(m, score[j]);
                            e = std::max(e, (static_cast<double>(dk) + 4) * u * size / root);
                        }
                    }
                    for (std::size_t j = 0; j < Tk; ++j)
                        if (mask(i, j)) z += std::exp(score[j] - m);
                    for (std::size_t j = 0; j < Tk; ++j)
                        if (mask(i, j)) {
                            ref[j] = std::exp(score[j] - m) / z;
                            tol[j] = ref[j] * (std::expm1(2 * e) + own) + u;
                        }
                    for (std::size_t j = 0; j < Tk; ++j) {
                        RC_ASSERT(std::abs(a.weights(b1, b2, i, j) - ref[j]) <= tol[j]);
                        RC_ASSERT(std::abs(moved.weights(b1, b2, i, j) - ref[order[j]]) <= tol[order[j]]);
                    }
                    for (std::size_t c = 0; c < dv; ++c) {
                        double out = 0.0, out_tol = 0.0;
                        for (std::size_t j = 0; j < Tk; ++j) {
                            const double vj = std::abs(static_cast<double>(v(b1, b2, j, c)));
                            out += ref[j] * v(b1, b2, j, c);
                            out_tol += tol[j] * vj + (static_cast<double>(Tk) + 1) * u * ref[j] * vj;
                        }
                        RC_ASSERT(std::abs(a.out(b1, b2, i, c) - out) <= out_tol);
                        RC_ASSERT(std::abs(moved.out(b1, b2, i, c) - out) <= out_tol);
                    }
                }
    });
}

TEST_CASE("shapes that do not fit are rejected with std::invalid_argument") {
    attn::Rng rng(63);
    Tensor3 q = rng.normal_tensor<3>({2, 4, 8}), k = rng.normal_tensor<3>({2, 5, 8}),
            v = rng.normal_tensor<3>({2, 5, 3});
    SUBCASE("d_k of queries and keys differs") {
        CHECK_THROWS_AS(attention<3>(q, rng.normal_tensor<3>({2, 5, 6}), v), std::invalid_argument);
    }
    SUBCASE("T_k of keys and values differs") {
        CHECK_THROWS_AS(attention<3>(q, k, rng.normal_tensor<3>({2, 4, 3})), std::invalid_argument);
    }
    SUBCASE("the batch axes differ") {
        // Each of q, k and v differing alone.
        INFO("q, k and v must have the same batch axes: compare each of k and v with q");
        CHECK_THROWS_AS(attention<3>(rng.normal_tensor<3>({3, 4, 8}), k, v), std::invalid_argument);
        CHECK_THROWS_AS(attention<3>(q, rng.normal_tensor<3>({1, 5, 8}), v), std::invalid_argument);
        CHECK_THROWS_AS(attention<3>(q, k, rng.normal_tensor<3>({1, 5, 3})), std::invalid_argument);
        // A larger v too: without its comparison, copying it writes past the end of a buffer
        // (AddressSanitizer names the line: ./workbook check 06 --debug).
        CHECK_THROWS_AS(attention<3>(q, k, rng.normal_tensor<3>({3, 5, 3})), std::invalid_argument);
    }
    SUBCASE("one batch axis of four differs") {
        INFO("q, k and v must have the same batch axes: compare every one of them");
        Tensor4 q4 = rng.normal_tensor<4>({2, 3, 4, 8}), k4 = rng.normal_tensor<4>({2, 3, 5, 8}),
                v4 = rng.normal_tensor<4>({2, 3, 5, 3});
        CHECK_THROWS_AS(attention<4>(q4, rng.normal_tensor<4>({2, 1, 5, 8}), v4), std::invalid_argument);
        CHECK_THROWS_AS(attention<4>(q4, k4, rng.normal_tensor<4>({2, 1, 5, 3})), std::invalid_argument);
        CHECK_THROWS_AS(attention<4>(q4, k4, rng.normal_tensor<4>({1, 3, 5, 3})), std::invalid_argument);
        CHECK_THROWS_AS(attention<4>(q4, rng.normal_tensor<4>({1, 3, 5, 8}), v4), std::invalid_argument);
    }
    SUBCASE("a mask of the wrong shape") {
        attn::Mask<2> mask = xt::ones<bool>({4, 4});
        CHECK_THROWS_AS(attention<3>(q, k, v, &mask), std::invalid_argument);
        // (T_k, T_q) has the right number of entries but not the right shape.
        INFO("the mask must be (T_q, T_k) = (4, 5); a (5, 4) mask has as many entries");
        attn::Mask<2> transposed = xt::ones<bool>({5, 4});
        CHECK_THROWS_AS(attention<3>(q, k, v, &transposed), std::invalid_argument);
    }
}

TEST_CASE("a query the mask leaves nothing to attend to gets zero weights and a zero output") {
    attn::Rng rng(31);
    Tensor3 q = rng.normal_tensor<3>({2, 4, 8}), k = rng.normal_tensor<3>({2, 5, 8}),
            v = rng.normal_tensor<3>({2, 5, 3});
    attn::Mask<2> mask = xt::ones<bool>({4, 5});
    xt::row(mask, 2) = false;
    const auto r = attention<3>(q, k, v, &mask);
    CHECK_CLOSE(xt::view(r.weights, xt::all(), 2, xt::all()), xt::zeros<float>({2, 5}), 0.0);
    CHECK_CLOSE(xt::view(r.out, xt::all(), 2, xt::all()), xt::zeros<float>({2, 3}), 0.0);
}
