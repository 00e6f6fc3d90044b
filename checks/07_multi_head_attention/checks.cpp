// Checks for exercise 07: splitting into heads, merging them, and the multi-head forward pass.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for any B, T, NH and hs, head h holds channels h·hs … (h+1)·hs − 1 and merge_heads undoes split_heads
// - for any B, T, NH and hs, multi-head attention equals NH single heads, and c_proj times 2^e scales it exactly
// - every head count that does not divide C, 0 included, is refused
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/fixtures.hpp"
#include "attn/linalg.hpp"
#include "attn/npy.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"
#include "attn/sdpa.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

using attn::Tensor2;
using attn::Tensor3;
using attn::Tensor4;
using exercise::merge_heads;
using exercise::multi_head_attention;
using exercise::split_heads;

TEST_CASE("split_heads gives head h the channels h*hs to (h+1)*hs") {
    // One sequence of two tokens, C = 4, two heads of hs = 2.
    Tensor3 x = {{{1, 2, 3, 4}, {5, 6, 7, 8}}};
    CHECK_CLOSE(split_heads(x, 2), Tensor4({{{{1, 2}, {5, 6}}, {{3, 4}, {7, 8}}}}), 0.0);
    CHECK_CLOSE(split_heads(x, 1), Tensor4({{{{1, 2, 3, 4}, {5, 6, 7, 8}}}}), 0.0);
}

TEST_CASE("merge_heads undoes split_heads") {
    attn::Rng rng(71);
    Tensor3 x = rng.normal_tensor<3>({2, 5, 12});
    const Tensor4 heads = split_heads(x, 3);
    REQUIRE(attn::shape_of(heads) == "(2, 3, 5, 4)");
    CHECK_CLOSE(merge_heads(heads), x, 0.0);  // only copies: exactly equal
    CHECK_CLOSE(merge_heads(Tensor4({{{{1, 2}, {5, 6}}, {{3, 4}, {7, 8}}}})),
                Tensor3({{{1, 2, 3, 4}, {5, 6, 7, 8}}}), 0.0);
}

namespace {
// The usual mistakes in the forward pass, each a way of computing it wrongly that
// heads_one_by_one can reproduce, so that a failing check can say which one the learner's
// output matches (the outputs differ at a location, which alone does not tell them apart).
enum class Mistake {
    none,
    no_output_projection,  // the merged heads returned without c_proj
    c_proj_not_transposed, // merged · c_proj instead of merged · c_projᵀ
    q_and_k_swapped,       // q from the key third of c_attn, k from the query third
    v_from_k,              // v from the key third
    thirds_interleaved,    // row 3j, 3j+1, 3j+2 of c_attn taken as q, k and v's row j
    no_mask,               // every token sees the whole sequence
    scale_by_C,            // scores scaled by 1/√C instead of 1/√hs
};

const char* describe(Mistake m) {
    switch (m) {
        case Mistake::none: return "";
        case Mistake::no_output_projection:
            return "the heads merged but not projected: the last step is merged · c_projᵀ";
        case Mistake::c_proj_not_transposed:
            return "merged · c_proj: nn.Linear's weight is (out, in), so the product is merged · c_projᵀ";
        case Mistake::q_and_k_swapped:
            return "q and k swapped: the rows of c_attn are q's C rows, then k's, then v's";
        case Mistake::v_from_k:
            return "v taken from k's third of c_attn: v's rows are rows 2C … 3C − 1";
        case Mistake::thirds_interleaved:
            return "c_attn read as interleaved rows (q, k, v, q, k, v, …): it holds q's C rows, "
                   "then k's, then v's";
        case Mistake::no_mask:
            return "no causal mask: token t must not see tokens after t";
        case Mistake::scale_by_C:
            return "the scores scaled by 1/√C: each head's scores are scaled by 1/√hs, hs = C / NH";
    }
    return "";
}

// Multi-head attention written as NH separate heads: head h projects x with its own rows of
// c_attn (its slices of the query, key and value thirds), attends causally, and the heads'
// outputs side by side go through c_proj. (B, T, C) in, (B, T, C) out. Given a Mistake, it
// makes that one.
Tensor3 heads_one_by_one(const Tensor3& x, const Tensor2& c_attn, const Tensor2& c_proj,
                         std::size_t NH, Mistake mistake = Mistake::none) {
    const std::size_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2], hs = C / NH;
    Tensor3 out({B, T, C});
    for (std::size_t b = 0; b < B; ++b) {
        const Tensor2 xb = xt::view(x, b);
        Tensor2 concatenated({T, C});
        for (std::size_t h = 0; h < NH; ++h) {
            auto rows = [&](std::size_t part) {
                if (mistake == Mistake::thirds_interleaved)
                    return Tensor2(xt::view(c_attn, xt::range(3 * h * hs + part, 3 * (h + 1) * hs, 3),
                                            xt::all()));
                return Tensor2(xt::view(c_attn, xt::range(part * C + h * hs, part * C + (h + 1) * hs),
                                        xt::all()));
            };
            const bool swap = mistake == Mistake::q_and_k_swapped;
            const std::size_t v_part = mistake == Mistake::v_from_k ? 1 : 2;
            const Tensor2 mask_all = xt::ones<float>({T, T});
            std::optional<float> scale;
            if (mistake == Mistake::scale_by_C) scale = 1.0f / std::sqrt(static_cast<float>(C));
            const Tensor2 q = attn::matmul_transposed(xb, rows(swap ? 1 : 0));
            const Tensor2 k = attn::matmul_transposed(xb, rows(swap ? 0 : 1));
            const Tensor2 v = attn::matmul_transposed(xb, rows(v_part));
            xt::view(concatenated, xt::all(), xt::range(h * hs, (h + 1) * hs)) =
                mistake == Mistake::no_mask
                    ? attn::scaled_dot_product_attention(q, k, v, {}, nullptr, scale)
                    : attn::scaled_dot_product_attention(q, k, v, attn::causal_mask(T), nullptr, scale);
        }
        if (mistake == Mistake::no_output_projection)
            xt::view(out, b) = concatenated;
        else if (mistake == Mistake::c_proj_not_transposed)
            xt::view(out, b) = attn::matmul(concatenated, c_proj);
        else
            xt::view(out, b) = attn::matmul_transposed(concatenated, c_proj);
    }
    return out;
}

// What a forward pass that differs from heads_one_by_one got wrong, when its output is one
// of the usual mistakes' (within `tol`); otherwise where to look.
std::string diagnose(const Tensor3& got, const Tensor3& x, const Tensor2& c_attn,
                     const Tensor2& c_proj, std::size_t NH, double tol) {
    for (Mistake m : {Mistake::no_output_projection, Mistake::c_proj_not_transposed,
                      Mistake::q_and_k_swapped, Mistake::v_from_k, Mistake::thirds_interleaved,
                      Mistake::no_mask, Mistake::scale_by_C})
        if (attn::check::compare(got, heads_one_by_one(x, c_attn, c_proj, NH, m), tol).ok)
            return std::string("your output is what this mistake gives: ") + describe(m);
    return "your output matches none of the usual mistakes (no output projection, c_proj not "
           "transposed, q and k swapped, v from k's rows, interleaved thirds, no mask, 1/√C): "
           "compare each stage (qkv = x · c_attnᵀ, its thirds, split_heads, attention with the "
           "causal mask, merge_heads, · c_projᵀ) with the lesson's steps";
}
}  // namespace

TEST_CASE("multi-head attention equals NH single heads on slices of the weights") {
    constexpr std::size_t B = 2, T = 6, C = 12, NH = 3;
    attn::Rng rng(72);
    Tensor3 x = rng.normal_tensor<3>({B, T, C});
    Tensor2 c_attn = rng.normal_tensor<2>({3 * C, C}, 0.0f, 0.3f);
    Tensor2 c_proj = rng.normal_tensor<2>({C, C}, 0.0f, 0.3f);
    // The same products in the same order up to BLAS blocking (0 then). In other orders:
    // qkv (n = C = 12, weights N(0, 0.3), Σ|x w| ≈ 2.3, ≲ 4) within 2γ_12·4 ≈ 5.7e-6 worst,
    // √12 u·2.3 ≈ 4.8e-7 random-sign (u = 2^-24); through the scores (hs = 4), Σ p v and
    // c_proj (n = 12) the worst case is ~1e-4, the random-sign estimate ≈ 1e-6: 1e-5 rests
    // on it, 10× above. The mistakes (x·W for c_proj, reversed or strided heads, q and k
    // swapped, 1/√C, v from k's third, no mask) move outputs by O(0.1–1).
    const Tensor3 got = multi_head_attention(x, c_attn, c_proj, NH);
    const Tensor3 want = heads_one_by_one(x, c_attn, c_proj, NH);
    INFO(diagnose(got, x, c_attn, c_proj, NH, 1e-5));  // evaluated only when the check fails
    CHECK_CLOSE(got, want, 1e-5);
}

TEST_CASE("one head, heads of one channel, one token and one sequence") {
    // The checks above have 2 to 4 heads of 2 to 4 channels over several tokens: here NH = 1
    // (one head of all C channels) and NH = C (heads of one channel), T = 1 and B = 1.
    constexpr std::size_t C = 6;
    attn::Rng rng(76);
    const Tensor2 c_attn = rng.normal_tensor<2>({3 * C, C}, 0.0f, 0.3f);
    const Tensor2 c_proj = rng.normal_tensor<2>({C, C}, 0.0f, 0.3f);
    for (std::size_t NH : {1, 6})
        for (std::size_t B : {1, 2})
            for (std::size_t T : {1, 5}) {
                CAPTURE(NH);
                CAPTURE(B);
                CAPTURE(T);
                const Tensor3 x = rng.normal_tensor<3>({B, T, C});
                // As above (C = 6: n ≤ 6, less): random-sign ≲ 1e-6, 10× under 1e-5.
                const Tensor3 got = multi_head_attention(x, c_attn, c_proj, NH);
                const Tensor3 want = heads_one_by_one(x, c_attn, c_proj, NH);
                INFO(diagnose(got, x, c_attn, c_proj, NH, 1e-5));
                CHECK_CLOSE(got, want, 1e-5);
            }
}

TEST_CASE("multi-head attention matches PyTorch on nanoGPT's layout") {
    const auto dir = attn::fixtures_dir() / "multi_head";
    const Tensor3 x = attn::load_npy<3>(dir / "nobias_x.npy");
    const Tensor2 c_attn = attn::load_npy<2>(dir / "nobias_c_attn_weight.npy");
    const Tensor2 c_proj = attn::load_npy<2>(dir / "nobias_c_proj_weight.npy");
    const std::size_t NH = 4;  // n_head in tests/fixtures/multi_head/versions.json
    const Tensor3 got = multi_head_attention(x, c_attn, c_proj, NH);
    // float32 against a float64 reference through two projections over C = 16 channels and
    // a softmax (tests/test_multi_head.cpp): qkv within γ_17·6.1 ≈ 6.2e-6 at worst and the
    // output ≳ 1e-3 worst through the scores; random-sign ≈ 2e-6 (u = 2^-24): 1e-5 rests on
    // it, 5× above. The mistakes move y (|y| ≤ 1.6) by O(0.1–1).
    INFO(diagnose(got, x, c_attn, c_proj, NH, 1e-4));
    CHECK_CLOSE(got, attn::load_npy<3>(dir / "nobias_y.npy"), 1e-5);
}

TEST_CASE("a later token cannot change an earlier output") {
    attn::Rng rng(73);
    Tensor3 x = rng.normal_tensor<3>({1, 6, 8});
    Tensor2 c_attn = rng.normal_tensor<2>({24, 8}, 0.0f, 0.3f), c_proj = rng.normal_tensor<2>({8, 8});
    const Tensor3 before = multi_head_attention(x, c_attn, c_proj, 2);
    xt::view(x, 0, 4) += 3.0f;  // change token 4
    const Tensor3 after = multi_head_attention(x, c_attn, c_proj, 2);
    CHECK_CLOSE(xt::view(after, 0, xt::range(0, 4)), xt::view(before, 0, xt::range(0, 4)), 0.0);
    CHECK(xt::amax(xt::abs(xt::view(after, 0, 4) - xt::view(before, 0, 4)))() > 0.0f);
}

TEST_CASE("property: for any B, T, NH and hs, head h holds channels h·hs … (h+1)·hs − 1 and merge_heads undoes split_heads") {
    // B and T from 1 to 4 (1 a quarter of the time), NH from 1 to 6, hs from 1 to 5, entries
    // distinct (their flat
    // index), so a channel in the wrong place is seen: split_heads(x, NH)(b, h, t, i) must be
    // x(b, t, h·hs + i), and merge_heads(split_heads(x)) must be x exactly (a copy, no
    // arithmetic).
    attn::check_property("split_heads and merge_heads for any shape", [] {
        const std::size_t B = attn::draw("B", attn::family::length(4)), T = attn::draw("T", attn::family::length(4)),
                          NH = attn::draw("NH", rc::gen::inRange<std::size_t>(1, 7)),
                          hs = attn::draw("hs", rc::gen::inRange<std::size_t>(1, 6));
        Tensor3 x = xt::zeros<float>({B, T, NH * hs});
        for (std::size_t i = 0; i < x.size(); ++i) x.flat(i) = static_cast<float>(i);
        const Tensor4 y = split_heads(x, NH);
        RC_ASSERT(y.shape()[0] == B && y.shape()[1] == NH && y.shape()[2] == T && y.shape()[3] == hs);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t h = 0; h < NH; ++h)
                for (std::size_t t = 0; t < T; ++t)
                    for (std::size_t i = 0; i < hs; ++i) RC_ASSERT(y(b, h, t, i) == x(b, t, h * hs + i));
        RC_ASSERT(merge_heads(y) == x);
    });
}

TEST_CASE("property: for any B, T, NH and hs, multi-head attention equals NH single heads, and c_proj times 2^e scales it exactly") {
    // NH from 1 to 3 heads of 1 to 4 channels, B from 1 to 2 and T from 1 to 6 (1 a quarter
    // of the time), x ~ N(0, 1) and weights N(0, 0.3²) as in the first check, against the
    // heads computed one by one, within its 1e-5 (derived there for C = 12; C ≤ 12 here).
    // Then c_proj times 2^e (e from −8 to 8): the last product's every term and partial sum
    // scales exactly, so the output must be 2^e times the first, bit for bit.
    attn::check_property("multi_head_attention for any shape, and linear in c_proj", [] {
        const std::size_t NH = attn::draw("NH", rc::gen::inRange<std::size_t>(1, 4)),
                          hs = attn::draw("hs", rc::gen::inRange<std::size_t>(1, 5)), C = NH * hs,
                          B = attn::draw("B", attn::family::length(2)), T = attn::draw("T", attn::family::length(6));
        attn::Rng rng(attn::draw("seed", rc::gen::inRange<std::uint64_t>(0, 1000000)));
        const Tensor3 x = rng.normal_tensor<3>({B, T, C});
        const Tensor2 c_attn = rng.normal_tensor<2>({3 * C, C}, 0.0f, 0.3f), c_proj = rng.normal_tensor<2>({C, C}, 0.0f, 0.3f);
        const Tensor3 got = multi_head_attention(x, c_attn, c_proj, NH);
        const auto cmp = attn::check::compare(got, heads_one_by_one(x, c_attn, c_proj, NH), 1e-5);
        if (!cmp.ok) RC_FAIL(cmp.report + "; " + diagnose(got, x, c_attn, c_proj, NH, 1e-5));
        const float scale = attn::draw("scale of c_proj", attn::family::scale());
        const Tensor3 scaled = multi_head_attention(x, c_attn, Tensor2(c_proj * scale), NH);
        for (std::size_t i = 0; i < got.size(); ++i) RC_ASSERT(scaled.flat(i) == got.flat(i) * scale);
    });
}

TEST_CASE("property: every head count that does not divide C, 0 included, is refused") {
    // C from 1 to 12 and NH = 0 or any of 2 … 2C + 1 that does not divide C: split_heads and
    // multi_head_attention must throw std::invalid_argument (heads of C / NH channels would
    // leave channels out, or divide by zero).
    attn::check_property("split_heads and multi_head_attention refuse every head count that does not divide C", [] {
        const std::size_t C = attn::draw("C", rc::gen::inRange<std::size_t>(1, 13));
        const std::size_t NH = attn::draw("NH", attn::family::not_dividing(C));
        attn::Rng rng(3);
        const Tensor3 x = rng.normal_tensor<3>({1, 2, C});
        RC_ASSERT(attn::refused([&] { (void)split_heads(x, NH); }));
        RC_ASSERT(attn::refused([&] {
            (void)multi_head_attention(x, rng.normal_tensor<2>({3 * C, C}), rng.normal_tensor<2>({C, C}), NH);
        }));
    });
}

TEST_CASE("a number of heads that does not divide C is a clear error") {
    attn::Rng rng(74);
    Tensor3 x = rng.normal_tensor<3>({1, 3, 10});
    CHECK_THROWS_AS(split_heads(x, 4), std::invalid_argument);
    CHECK_THROWS_AS(split_heads(x, 0), std::invalid_argument);
    CHECK_THROWS_AS(multi_head_attention(x, rng.normal_tensor<2>({30, 10}),
                                         rng.normal_tensor<2>({10, 10}), 4),
                    std::invalid_argument);
}

TEST_CASE("weights of the wrong shape are rejected with std::invalid_argument") {
    attn::Rng rng(75);
    Tensor3 x = rng.normal_tensor<3>({1, 3, 8});
    CHECK_THROWS_AS(multi_head_attention(x, rng.normal_tensor<2>({16, 8}),
                                         rng.normal_tensor<2>({8, 8}), 2),
                    std::invalid_argument);
    CHECK_THROWS_AS(multi_head_attention(x, rng.normal_tensor<2>({24, 8}),
                                         rng.normal_tensor<2>({8, 6}), 2),
                    std::invalid_argument);
    // Shapes the products accept without a word: a c_attn taller than 3C (its extra rows
    // never reach q, k or v) and a c_proj with an extra output row (the output would be
    // (B, T, C + 1)). Only the check of each weight's shape refuses them.
    INFO("c_attn must be (3C, C) and c_proj (C, C): check each weight's shape, since the "
         "products would take these without complaint");
    CHECK_THROWS_AS(multi_head_attention(x, rng.normal_tensor<2>({27, 8}),
                                         rng.normal_tensor<2>({8, 8}), 2),
                    std::invalid_argument);
    CHECK_THROWS_AS(multi_head_attention(x, rng.normal_tensor<2>({24, 8}),
                                         rng.normal_tensor<2>({9, 8}), 2),
                    std::invalid_argument);
}
