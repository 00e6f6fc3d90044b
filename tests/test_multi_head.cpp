#include "attn/fixtures.hpp"
#include "attn/check.hpp"
#include "attn/entropy.hpp"
#include "attn/multi_head.hpp"
#include "attn/npy.hpp"
#include "attn/sdpa.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <cmath>

using namespace attn;

namespace {
const std::filesystem::path fixtures = attn::fixtures_dir() / "multi_head";
constexpr std::size_t fixture_heads = 4;  // n_head in tests/fixtures/multi_head/versions.json
}  // namespace

TEST_CASE("split_heads then merge_heads gives back the input") {
    Rng rng(21);
    Tensor3 x = rng.normal_tensor<3>({2, 5, 12});
    const Tensor4 heads = split_heads(x, 3);
    CHECK(shape_of(heads) == "(2, 3, 5, 4)");
    CHECK_CLOSE(merge_heads(heads), x, 0.0);
    // Head 1 holds channels 4..7; a copy, so exact.
    CHECK_CLOSE(xt::view(heads, 1, 1, 2), xt::view(x, 1, 2, xt::range(4, 8)), 0.0);
    CHECK_THROWS_AS(split_heads(x, 5), std::invalid_argument);
}

TEST_CASE("multi-head attention matches PyTorch on nanoGPT's layout") {
    for (const char* tag : {"nobias", "bias"}) {
        CAPTURE(tag);
        const std::string p = std::string(tag) + "_";
        const bool bias = std::string(tag) == "bias";
        Linear c_attn = bias ? Linear(load_npy<2>(fixtures / (p + "c_attn_weight.npy")),
                                      load_npy<1>(fixtures / (p + "c_attn_bias.npy")))
                             : Linear(load_npy<2>(fixtures / (p + "c_attn_weight.npy")));
        Linear c_proj = bias ? Linear(load_npy<2>(fixtures / (p + "c_proj_weight.npy")),
                                      load_npy<1>(fixtures / (p + "c_proj_bias.npy")))
                             : Linear(load_npy<2>(fixtures / (p + "c_proj_weight.npy")));
        const MultiHeadAttention mha(c_attn, c_proj, fixture_heads);
        Tensor4 att;
        const Tensor3 y = mha.forward(load_npy<3>(fixtures / (p + "x.npy")), &att);
        // Against a float64 reference (u = 2^-24). qkv: n = C + 1 = 17, Σ|x w| ≤ 6.1, so
        // ≤ γ_17·6.1 ≈ 6.2e-6 worst, √17 u·3.2 ≈ 7.6e-7 typical with random signs. Scores
        // (hs = 4, |q|, |k| ≤ 4.8) then move by ≤ 1.2e-4 worst, ≈ 1.3e-6 random-sign, and a
        // weight by ≤ half that (2p(1 − p) ≤ 1/2): att's 1e-6 sits 2× above the random-sign
        // ≈ 4.6e-7 and far below the worst case. y = c_proj(Σ p v): worst ≳ 1e-3 through the
        // scores, γ_17·12.7 ≈ 1.3e-5 from c_proj alone; random-sign ≈ 2e-6 (Δh ≈ 2.4e-6 times
        // ‖w_proj row‖ ≈ 0.6, plus √17 u·1.6): 1e-5 rests on it, 5× above. A wrong head split
        // or missing scale moves them by O(0.1).
        CHECK_CLOSE(y, load_npy<3>(fixtures / (p + "y.npy")), 1e-5);
        CHECK_CLOSE(att, load_npy<4>(fixtures / (p + "att.npy")), 1e-6);
    }
}

TEST_CASE("a number of heads that does not divide C is rejected") {
    Rng rng(22);
    CHECK_THROWS_WITH_AS(MultiHeadAttention(10, 4, false, rng),
                         doctest::Contains("4 heads do not divide C = 10"), std::invalid_argument);
}

TEST_CASE("with the causal mask changing a later token leaves earlier outputs bit-identical") {
    Rng rng(23);
    MultiHeadAttention mha(16, 4, true, rng);
    Tensor3 x = rng.normal_tensor<3>({1, 8, 16});
    const Tensor3 before = mha.forward(x);
    xt::view(x, 0, 5) = rng.normal_tensor<1>({16});  // a different token at position 5
    const Tensor3 after = mha.forward(x);
    // Exactly equal, not "close": a hidden key's weight is exactly 0.
    CHECK_CLOSE(xt::view(after, 0, xt::range(0, 5)), xt::view(before, 0, xt::range(0, 5)), 0.0);
    CHECK(xt::amax(xt::abs(xt::view(after, 0, 5) - xt::view(before, 0, 5)))() > 0.0f);
}

TEST_CASE("without the causal mask changing a later token changes earlier outputs") {
    Rng rng(23);
    MultiHeadAttention mha(16, 4, true, rng);
    mha.causal = false;
    Tensor3 x = rng.normal_tensor<3>({1, 8, 16});
    const Tensor3 before = mha.forward(x);
    xt::view(x, 0, 5) = rng.normal_tensor<1>({16});
    const Tensor3 after = mha.forward(x);
    for (std::size_t t = 0; t < 5; ++t) {
        CAPTURE(t);
        CHECK(xt::amax(xt::abs(xt::view(after, 0, t) - xt::view(before, 0, t)))() > 0.0f);
    }
}

TEST_CASE("entropy is 0 for one-hot rows and ln n for uniform rows and 0 ln 0 counts as 0") {
    Tensor4 w = {{{{1, 0, 0, 0}, {0.25f, 0.25f, 0.25f, 0.25f}, {0.5f, 0.5f, 0, 0},
                   {0.5f, 0.25f, 0.25f, 0}}}};
    // Hand values: 0, ln 4, ln 2, 1.5 ln 2. −Σ p ln p over 4 terms: γ_4 Σ|p ln p| ≤ 4u·1.4 ≈
    // 3.3e-7 plus ln's ulp and the reference's ½ulp, ≲ 5e-7 (u = 2^-24): 2× under 1e-6; the
    // mean's epsilon(1e-6) allows 1e-6·(1 + 1.04) ≈ 2e-6 for the same ≲ 5e-7.
    CHECK_CLOSE(attention_entropy(w),
                Tensor3({{{0.0f, static_cast<float>(std::log(4.0)),
                           static_cast<float>(std::log(2.0)),
                           static_cast<float>(1.5 * std::log(2.0))}}}),
                1e-6);
    CHECK(mean_entropy_per_head(w)(0) ==
          doctest::Approx((std::log(4.0) + std::log(2.0) + 1.5 * std::log(2.0)) / 4).epsilon(1e-6));
    CHECK(uniform_causal_entropy(3) == doctest::Approx((std::log(2.0) + std::log(3.0)) / 3));
    Tensor4 bad = {{{{0.5f, 0.6f}}}};
    CHECK_THROWS_AS(attention_entropy(bad), std::invalid_argument);
}

TEST_CASE("an entropy bar is filled in proportion to the maximum") {
    CHECK(entropy_bar(1.0, 2.0, 4) == "██··");
    CHECK(entropy_bar(3.0, 2.0, 2) == "██");  // clamped
    CHECK(entropy_bar(0.0, 2.0, 2) == "··");
}
