// Checks for exercise 01: the query, key and value projections.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for any B, T, C, hs and hs_v, each token's q, k and v are its own x times the weights
// - inputs of any magnitude, every entry distinct: x·Wᵀ within its rounding, and 2^e·x gives 2^e times each projection
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/linear.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

using attn::Tensor2;
using attn::Tensor3;
using exercise::project_qkv;

TEST_CASE("projections of a small input match values worked by hand") {
    // x: one sequence of two tokens with C = 3 channels.
    Tensor3 x = {{{1, 0, 2}, {0, 1, -1}}};
    Tensor2 w_query = {{1, 0, 0}, {0, 1, 0}};  // keeps the first two channels
    Tensor2 w_key = {{1, 1, 1}, {0, 0, 1}};    // sum of channels, last channel
    Tensor2 w_value = {{2, 0, 0}};             // twice the first channel (hs_v = 1)
    INFO("q = x·W_qᵀ keeps channels 0 and 1: [1, 0], [0, 1]; k = x·W_kᵀ is (sum, last): "
         "[3, 2], [0, -1]; v = x·W_vᵀ is twice channel 0: [2], [0]");
    const auto qkv = project_qkv(x, w_query, w_key, w_value);
    // Small integers: every product and sum is exact in float32; 1e-6 is only a margin. The
    // catalogued mistakes (x·W, a swapped or reused weight) are off by ≥ 1.
    CHECK_CLOSE(qkv.q, Tensor3({{{1, 0}, {0, 1}}}), 1e-6);
    CHECK_CLOSE(qkv.k, Tensor3({{{3, 2}, {0, -1}}}), 1e-6);
    CHECK_CLOSE(qkv.v, Tensor3({{{2}, {0}}}), 1e-6);
}

TEST_CASE("outputs have shape (B, T, hs) and the value size may differ") {
    attn::Rng rng(1);
    Tensor3 x = rng.normal_tensor<3>({4, 8, 32});
    const auto qkv = project_qkv(x, rng.normal_tensor<2>({16, 32}), rng.normal_tensor<2>({16, 32}),
                                 rng.normal_tensor<2>({8, 32}));
    CHECK(attn::shape_of(qkv.q) == "(4, 8, 16)");
    CHECK(attn::shape_of(qkv.k) == "(4, 8, 16)");
    CHECK(attn::shape_of(qkv.v) == "(4, 8, 8)");
}

TEST_CASE("the projections are linear with no bias") {
    attn::Rng rng(2);
    Tensor2 wq = rng.normal_tensor<2>({5, 6}), wk = rng.normal_tensor<2>({5, 6}),
            wv = rng.normal_tensor<2>({3, 6});
    Tensor3 a = rng.normal_tensor<3>({2, 4, 6}), b = rng.normal_tensor<3>({2, 4, 6});
    SUBCASE("zero in, zero out: there is no bias") {
        const auto zero = project_qkv(Tensor3(xt::zeros<float>({2, 4, 6})), wq, wk, wv);
        CHECK_CLOSE(zero.q, xt::zeros<float>({2, 4, 5}), 0.0);
        CHECK_CLOSE(zero.k, xt::zeros<float>({2, 4, 5}), 0.0);
        CHECK_CLOSE(zero.v, xt::zeros<float>({2, 4, 3}), 0.0);
    }
    SUBCASE("f(2a + b) = 2 f(a) + f(b)") {
        const auto fa = project_qkv(a, wq, wk, wv), fb = project_qkv(b, wq, wk, wv);
        const auto fab = project_qkv(Tensor3(2.0f * a + b), wq, wk, wv);
        // Sums of n = 6 products of N(0,1) numbers (u = 2^-24): f(2a + b) is within
        // γ_6 Σ|(2a + b)w| + u of it, 2f(a) + f(b) within γ_6(2Σ|aw| + Σ|bw|) + 2u; with
        // Σ|aw| ≈ 3.8 and Σ|(2a + b)w| ≈ 8.6 typical that is ≈ 7u·20 ≈ 8e-6, worst ~1.6e-5
        // for the largest sums; with random signs √6 u·20 ≈ 2.9e-6, 3.4× under 1e-5. A bias
        // or wrong weight is off by O(1), 1e5× the tolerance.
        CHECK_CLOSE(fab.q, 2.0f * fa.q + fb.q, 1e-5);
        CHECK_CLOSE(fab.k, 2.0f * fa.k + fb.k, 1e-5);
        CHECK_CLOSE(fab.v, 2.0f * fa.v + fb.v, 1e-5);
    }
}

TEST_CASE("each token is projected on its own") {
    attn::Rng rng(3);
    Tensor2 wq = rng.normal_tensor<2>({4, 6}), wk = rng.normal_tensor<2>({4, 6}),
            wv = rng.normal_tensor<2>({4, 6});
    Tensor3 x = rng.normal_tensor<3>({2, 5, 6});
    const auto before = project_qkv(x, wq, wk, wv);
    xt::view(x, 1, 3) += 10.0f;  // change one token: sequence 1, position 3
    const auto after = project_qkv(x, wq, wk, wv);
    for (std::size_t b = 0; b < 2; ++b) {
        for (std::size_t t = 0; t < 5; ++t) {
            CAPTURE(b);
            CAPTURE(t);
            const bool changed = b == 1 && t == 3;
            const auto diff = xt::amax(xt::abs(xt::view(after.q, b, t) - xt::view(before.q, b, t)))();
            if (changed) {
                INFO("token (1, 3) was changed by +10 in every channel, but its q did not move: "
                     "is q computed from x at all, and is each token's row written?");
                CHECK(diff > 0.0f);
            } else {
                INFO("only token (1, 3) was changed, yet the q of token (" << b << ", " << t << ") moved by " << diff
                     << ": each token's q must depend on that token's x alone (a loop over the wrong axis, "
                        "or one token's row written into another's)");
                CHECK(diff == 0.0f);
            }
        }
    }
}

TEST_CASE("agrees with attn::Linear on random input") {
    attn::Rng rng(4);
    attn::Linear query(32, 16, false, rng), key(32, 16, false, rng), value(32, 16, false, rng);
    Tensor3 x = rng.normal_tensor<3>({4, 8, 32});
    const auto qkv = project_qkv(x, query.weight, key.weight, value.weight);
    // Same products, possibly summed in another order: n = 32, |w| ≤ 1/√32 (PyTorch's
    // init), Σ|x w| ≈ 2.3 typical, ≲ 3.5: 2γ_32·3.5 ≈ 1.3e-5 worst (u = 2^-24), √32 u·3.5 ≈
    // 1.2e-6 with random signs, 8× under 1e-5. The mistakes (x·W, wrong weight, swapped q
    // and k, a batch item skipped or taken from item 0) are off by O(0.1–1), ≥ 1e4× it.
    CHECK_CLOSE(qkv.q, query.forward(x), 1e-5);
    CHECK_CLOSE(qkv.k, key.forward(x), 1e-5);
    CHECK_CLOSE(qkv.v, value.forward(x), 1e-5);
}

TEST_CASE("one or several of everything: every B, T, C, hs and hs_v of 1 or more") {
    // Sizes of 1 (one sequence, one token, one channel, one output) beside larger ones, and
    // outputs wider than the input (hs, hs_v > C) as well as narrower.
    attn::Rng rng(6);
    for (std::size_t B : {1, 3})
        for (std::size_t T : {1, 4})
            for (std::size_t C : {1, 5})
                for (std::size_t hs : {1, 7})
                    for (std::size_t hs_v : {2, 9}) {
                        CAPTURE(B);
                        CAPTURE(T);
                        CAPTURE(C);
                        CAPTURE(hs);
                        CAPTURE(hs_v);
                        const Tensor3 x = rng.normal_tensor<3>({B, T, C});
                        const Tensor2 wq = rng.normal_tensor<2>({hs, C}),
                                      wk = rng.normal_tensor<2>({hs, C}),
                                      wv = rng.normal_tensor<2>({hs_v, C});
                        const auto qkv = project_qkv(x, wq, wk, wv);
                        // Sums of n ≤ 5 products of N(0,1) numbers, Σ|x w| ≲ 10: 2γ_5·10 ≈
                        // 6e-6 (u = 2^-24) even at worst, under 1e-5; mistakes are O(1).
                        CHECK_CLOSE(qkv.q, attn::Linear(wq).forward(x), 1e-5);
                        CHECK_CLOSE(qkv.k, attn::Linear(wk).forward(x), 1e-5);
                        CHECK_CLOSE(qkv.v, attn::Linear(wv).forward(x), 1e-5);
                    }
}

TEST_CASE("shapes that do not fit are rejected with std::invalid_argument") {
    attn::Rng rng(5);
    Tensor3 x = rng.normal_tensor<3>({2, 3, 6});
    Tensor2 w = rng.normal_tensor<2>({4, 6});
    SUBCASE("a weight whose input size is not C") {
        Tensor2 wrong = rng.normal_tensor<2>({4, 7});
        CHECK_THROWS_AS(project_qkv(x, wrong, w, w), std::invalid_argument);
        CHECK_THROWS_AS(project_qkv(x, w, wrong, w), std::invalid_argument);
        CHECK_THROWS_AS(project_qkv(x, w, w, wrong), std::invalid_argument);
    }
    SUBCASE("query and key weights of different sizes") {
        CHECK_THROWS_AS(project_qkv(x, w, rng.normal_tensor<2>({5, 6}), w), std::invalid_argument);
    }
}

TEST_CASE("property: for any B, T, C, hs and hs_v, each token's q, k and v are its own x times the weights") {
    // B, T from 1 to 4 (1 a quarter of the time), C, hs and hs_v from 1 to 8, entries small
    // integers: every product and sum is exact in float, so q(b, t, i) must equal Σ_c x(b, t, c)·W_q(i, c) exactly, and
    // likewise k with W_k and v with W_v. A transposed weight, a weight used for the wrong
    // projection, another token's x or another sequence's gives other numbers.
    attn::check_property("project_qkv equals x·Wᵀ for any shapes", [] {
        const std::size_t B = attn::draw("B", attn::family::length(4)), T = attn::draw("T", attn::family::length(4)),
                          C = attn::draw("C", rc::gen::inRange<std::size_t>(1, 9)),
                          hs = attn::draw("hs", rc::gen::inRange<std::size_t>(1, 9)),
                          hs_v = attn::draw("hs_v", rc::gen::inRange<std::size_t>(1, 9));
        const auto small = rc::gen::map(rc::gen::inRange(-3, 4), [](int i) { return static_cast<float>(i); });
        const auto entries = [&](const std::string& name, std::size_t n) {
            return attn::draw(name, rc::gen::container<std::vector<float>>(n, small));
        };
        Tensor3 x = xt::zeros<float>({B, T, C});
        Tensor2 wq = xt::zeros<float>({hs, C}), wk = xt::zeros<float>({hs, C}), wv = xt::zeros<float>({hs_v, C});
        for (auto [t, name] : {std::pair<Tensor2*, const char*>{&wq, "w_query"}, {&wk, "w_key"}, {&wv, "w_value"}}) {
            const auto e = entries(std::string(name) + " (flat)", t->size());
            std::copy(e.begin(), e.end(), t->begin());
        }
        const auto xe = entries("x (flat)", x.size());
        std::copy(xe.begin(), xe.end(), x.begin());
        const auto qkv = project_qkv(x, wq, wk, wv);
        RC_ASSERT(qkv.v.shape()[2] == hs_v);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < T; ++t) {
                for (std::size_t i = 0; i < hs; ++i) {
                    float q = 0.0f, k = 0.0f;
                    for (std::size_t c = 0; c < C; ++c) {
                        q += x(b, t, c) * wq(i, c);
                        k += x(b, t, c) * wk(i, c);
                    }
                    RC_ASSERT(qkv.q(b, t, i) == q);
                    RC_ASSERT(qkv.k(b, t, i) == k);
                }
                for (std::size_t i = 0; i < hs_v; ++i) {
                    float v = 0.0f;
                    for (std::size_t c = 0; c < C; ++c) v += x(b, t, c) * wv(i, c);
                    RC_ASSERT(qkv.v(b, t, i) == v);
                }
            }
    });
}


TEST_CASE("property: inputs of any magnitude, every entry distinct: x·Wᵀ within its rounding, and 2^e·x gives 2^e times each projection") {
    // Entries pairwise distinct (1/8 … 8 in size, either sign, so that a weight used for the
    // wrong projection, a transposed weight or another token's x gives other numbers) times
    // one magnitude per tensor, x's from 10^-6 to 10^15 and the weights' from 10^-6 to
    // 10^15, so a product is anything from ~10^-14 to ~10^32 and a sum stays finite. Against
    // x·Wᵀ in float64 on the same floats: each of the C products rounds once (≤ u) and the
    // sum of C terms adds γ_C, so within (C + 1)u·Σ_c |x_c w_c| (u = 2^-24; an FMA only
    // rounds less). Then x times 2^e (e from −8 to 8): every product and partial sum is the
    // same number times 2^e, exactly at these sizes, so q, k and v must be 2^e times the
    // first ones bit for bit.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("project_qkv at any magnitude, and linear in x exactly under a power of two", [u] {
        const std::size_t B = attn::draw("B", attn::family::length(3)), T = attn::draw("T", attn::family::length(3)),
                          C = attn::draw("C", attn::family::length(6)), hs = attn::draw("hs", attn::family::length(4)),
                          hs_v = attn::draw("hs_v", attn::family::length(4));
        const float x_size = std::abs(attn::draw("x magnitude", attn::family::magnitude(-6, 15)));
        const float w_size = std::abs(attn::draw("weights' magnitude", attn::family::magnitude(-6, 15)));
        const auto values = attn::draw("x, w_query, w_key, w_value (flat, distinct)",
                                       attn::family::distinct(B * T * C + (2 * hs + hs_v) * C));
        Tensor3 x = xt::zeros<float>({B, T, C});
        Tensor2 wq = xt::zeros<float>({hs, C}), wk = xt::zeros<float>({hs, C}), wv = xt::zeros<float>({hs_v, C});
        std::size_t next = 0;
        for (float& e : x) e = values[next++] * x_size;
        for (Tensor2* w : {&wq, &wk, &wv})
            for (float& e : *w) e = values[next++] * w_size;
        const auto qkv = project_qkv(x, wq, wk, wv);
        const auto check = [&](const Tensor3& got, const Tensor2& w) {
            RC_ASSERT(got.shape()[0] == B && got.shape()[1] == T && got.shape()[2] == w.shape()[0]);
            for (std::size_t b = 0; b < B; ++b)
                for (std::size_t t = 0; t < T; ++t)
                    for (std::size_t i = 0; i < w.shape()[0]; ++i) {
                        double ref = 0.0, size = 0.0;
                        for (std::size_t c = 0; c < C; ++c) {
                            ref += static_cast<double>(x(b, t, c)) * w(i, c);
                            size += std::abs(static_cast<double>(x(b, t, c)) * w(i, c));
                        }
                        RC_ASSERT(std::abs(got(b, t, i) - ref) <= (static_cast<double>(C) + 1) * u * size);
                    }
        };
        check(qkv.q, wq);
        check(qkv.k, wk);
        check(qkv.v, wv);
        const float scale = attn::draw("scale of x", attn::family::scale());
        const auto scaled = project_qkv(Tensor3(x * scale), wq, wk, wv);
        for (std::size_t i = 0; i < qkv.q.size(); ++i) {
            RC_ASSERT(scaled.q.flat(i) == qkv.q.flat(i) * scale);
            RC_ASSERT(scaled.k.flat(i) == qkv.k.flat(i) * scale);
        }
        for (std::size_t i = 0; i < qkv.v.size(); ++i) RC_ASSERT(scaled.v.flat(i) == qkv.v.flat(i) * scale);
    });
}
