#include "attn/fixtures.hpp"
#include "attn/check.hpp"
#include "attn/npy.hpp"
#include "attn/random.hpp"
#include "attn/sdpa.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <cmath>
#include <string>

using namespace attn;

namespace {
const std::filesystem::path fixtures = attn::fixtures_dir() / "sdpa";

// One PyTorch fixture: inputs, optional mask, and the reference output and weights.
template <std::size_t N>
void check_against_pytorch(const std::string& name, bool has_mask, std::size_t mask_rank = 2) {
    CAPTURE(name);
    const Tensor<N> q = load_npy<N>(fixtures / (name + "_q.npy"));
    const Tensor<N> k = load_npy<N>(fixtures / (name + "_k.npy"));
    const Tensor<N> v = load_npy<N>(fixtures / (name + "_v.npy"));
    Tensor<N> w;
    Tensor<N> out;
    if (!has_mask) {
        out = scaled_dot_product_attention(q, k, v, {}, &w);
    } else if (mask_rank == 2) {
        const Mask<2> mask = xt::not_equal(load_npy<2>(fixtures / (name + "_mask.npy")), 0.0f);
        out = scaled_dot_product_attention(q, k, v, mask, &w);
    } else {
        const Mask<N> mask = xt::not_equal(load_npy<N>(fixtures / (name + "_mask.npy")), 0.0f);
        out = scaled_dot_product_attention(q, k, v, mask, &w);
    }
    // Against a float64 reference rounded to float32; d_k ≤ 8, T_k ≤ 6, |q|, |k|, |v| ≤ 3.9. One
    // float32 order is within γ_n Σ|terms| of the exact sum (u = 2^-24): each score within
    // γ_8 Σ|qk|/√d_k ≤ 6e-6·… and, carried through the softmax (|Δp_j| ≤ 2p_j(1 − p_j)max|Δs|)
    // and Σ_j p_j v_j, these fixtures' worst case is ≤ 1.4e-6 on a weight and ≤ 6.4e-6 on an
    // output (computed from the .npy files). With random signs (√n u Σ|terms| per sum, rss
    // over the keys) it is ≤ 2.8e-7 on the weights, 3.6× below 1e-6, and ≤ 7.7e-7 on the
    // outputs: 1e-6 there rests on it with only 1.3× to spare. A wrong scale, mask or axis
    // moves them by O(0.1).
    CHECK_CLOSE(out, load_npy<N>(fixtures / (name + "_out.npy")), 1e-6);
    CHECK_CLOSE(w, load_npy<N>(fixtures / (name + "_weights.npy")), 1e-6);
}
}  // namespace

TEST_CASE("attention of a small example matches values worked by hand") {
    // Two keys, d_k = 4: scores q·k/√4 are 1 and 0, so weights are e/(e+1) and 1/(e+1).
    Tensor2 q = {{2, 0, 0, 0}};
    Tensor2 k = {{1, 0, 0, 0}, {0, 1, 0, 0}};
    Tensor2 v = {{10, 0}, {0, 10}};
    Tensor2 w;
    const Tensor2 out = scaled_dot_product_attention(q, k, v, {}, &w);
    const double e = std::exp(1.0);
    // The scores 1 and 0 are exact; e^-1, the sum and the division round (≲ 3u relative,
    // u = 2^-24) and the reference by ½ulp: ≤ 2e-7 on weights ≤ 0.73 (5× under 1e-6), and
    // 10× that, ≲ 3.3e-6, on outputs of size 7.3 (3× under 1e-5).
    CHECK_CLOSE(w, Tensor2({{static_cast<float>(e / (e + 1)), static_cast<float>(1 / (e + 1))}}),
                1e-6);
    CHECK_CLOSE(out, Tensor2({{static_cast<float>(10 * e / (e + 1)),
                               static_cast<float>(10 / (e + 1))}}), 1e-5);
}

TEST_CASE("a scale can be given with nullptr for the weights, with or without a mask") {
    // Scores q·k are 2 and 0; at scale 0.5 they are 1 and 0, as in the example above.
    Tensor2 q = {{2, 0, 0, 0}};
    Tensor2 k = {{1, 0, 0, 0}, {0, 1, 0, 0}};
    Tensor2 v = {{10, 0}, {0, 10}};
    const double e = std::exp(1.0);
    const Tensor2 expected = {{static_cast<float>(10 * e / (e + 1)), static_cast<float>(10 / (e + 1))}};
    // As above (the 0.5 scale is exact): ≲ 3.3e-6 on outputs of size 7.3.
    CHECK_CLOSE(scaled_dot_product_attention(q, k, v, {}, nullptr, 0.5f), expected, 1e-5);
    const Mask<2> all = xt::ones<bool>({1, 2});
    CHECK_CLOSE(scaled_dot_product_attention(q, k, v, all, nullptr, 0.5f), expected, 1e-5);
    // The mask hides key 1: all weight goes to value 0 at any scale, exactly (e^0/1 = 1, and
    // 1·10 + 0·0 rounds nothing).
    const Mask<2> first = {{true, false}};
    CHECK_CLOSE(scaled_dot_product_attention(q, k, v, first, nullptr, 3.0f), Tensor2({{10, 0}}), 0.0);
}

TEST_CASE("attention matches PyTorch with 0 to 3 batch axes and masks and T_q != T_k") {
    check_against_pytorch<2>("d2_plain", false);
    check_against_pytorch<3>("d3_tq_ne_tk", false);
    check_against_pytorch<3>("d3_causal", true);
    check_against_pytorch<4>("d4_plain", false);
    check_against_pytorch<4>("d4_mask", true);
    check_against_pytorch<4>("d4_key_padding", true, 4);
    check_against_pytorch<5>("d5_plain", false);
    check_against_pytorch<5>("d5_mask", true, 5);
    check_against_pytorch<5>("d5_causal", true);
}

TEST_CASE("hidden keys get exactly zero weight and allowed keys sum to one") {
    Rng rng(11);
    Tensor4 q = rng.normal_tensor<4>({2, 3, 5, 8}), k = rng.normal_tensor<4>({2, 3, 7, 8}),
            v = rng.normal_tensor<4>({2, 3, 7, 4});
    Mask<2> mask = rng.uniform_tensor<2>({5, 7}, 0.0f, 1.0f) < 0.5f;
    for (std::size_t i = 0; i < 5; ++i) mask(i, i) = true;  // every row allows a key
    Tensor4 w;
    scaled_dot_product_attention(q, k, v, mask, &w);
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t h = 0; h < 3; ++h)
            for (std::size_t i = 0; i < 5; ++i) {
                double sum = 0.0;
                for (std::size_t j = 0; j < 7; ++j) {
                    CAPTURE(j);
                    if (!mask(i, j)) CHECK(w(b, h, i, j) == 0.0f);
                    sum += w(b, h, i, j);
                }
                // Each float32 weight e_j/Z shares Z's rounding (≤ γ_7 relative) and has its own
                // exp and division (≤ 3u): |Σ p_j − 1| ≤ γ_7 + 3u ≈ 10u = 6e-7 (u = 2^-24), the
                // sum itself in double; 1e-6 is 1.7× above. A hidden key's weight is 0 exactly.
                CHECK(std::fabs(sum - 1.0) < 1e-6);
            }
}

TEST_CASE("the causal mask is lower triangular") {
    const Mask<2> m = causal_mask(3);
    CHECK(m == Mask<2>({{true, false, false}, {true, true, false}, {true, true, true}}));
}

TEST_CASE("huge scores do not overflow: the softmax subtracts the row maximum") {
    Tensor2 q = {{1000, 0}}, k = {{1000, 0}, {999, 0}}, v = {{1, 0}, {0, 1}};
    Tensor2 w;
    scaled_dot_product_attention(q, k, v, {}, &w, 1.0f);
    CHECK(std::isfinite(w(0, 0)));
    CHECK(w(0, 0) == 1.0f);  // e^(−1000) underflows to 0 next to e^0
}

TEST_CASE("shapes that do not fit are rejected naming both shapes") {
    Rng rng(12);
    Tensor3 q = rng.normal_tensor<3>({2, 4, 8});
    Tensor3 k = rng.normal_tensor<3>({2, 5, 8});
    Tensor3 v = rng.normal_tensor<3>({2, 5, 3});
    SUBCASE("d_k differs") {
        Tensor3 k6 = rng.normal_tensor<3>({2, 5, 6});
        CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k6, v),
                             doctest::Contains("q (2, 4, 8), k (2, 5, 6)"), std::invalid_argument);
    }
    SUBCASE("T_k of keys and values differs") {
        Tensor3 v4 = rng.normal_tensor<3>({2, 4, 3});
        CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, v4),
                             doctest::Contains("v (2, 4, 3)"), std::invalid_argument);
    }
    SUBCASE("batch axes differ") {
        Tensor3 q3 = rng.normal_tensor<3>({3, 4, 8});
        CHECK_THROWS_AS(scaled_dot_product_attention(q3, k, v), std::invalid_argument);
    }
    SUBCASE("a mask that does not broadcast") {
        CHECK_THROWS_WITH_AS(scaled_dot_product_attention(q, k, v, causal_mask(4)),
                             doctest::Contains("(4, 4)"), std::invalid_argument);
    }
}

TEST_CASE("a query that may attend to no key gets zero weights and a zero output, as attn::softmax does") {
    Rng rng(21);
    Tensor3 q = rng.normal_tensor<3>({2, 4, 8}), k = rng.normal_tensor<3>({2, 5, 8}),
            v = rng.normal_tensor<3>({2, 5, 3});
    Mask<2> mask = xt::ones<bool>({4, 5});
    xt::row(mask, 2) = false;  // query 2 may see nothing
    Tensor3 weights;
    const Tensor3 out = scaled_dot_product_attention(q, k, v, mask, &weights);
    CHECK(xt::all(xt::equal(xt::view(weights, xt::all(), 2, xt::all()), 0.0f)));
    CHECK(xt::all(xt::equal(xt::view(out, xt::all(), 2, xt::all()), 0.0f)));
    // The other queries are untouched: their rows still sum to one.
    CHECK(xt::sum(xt::view(weights, 0, 1, xt::all()))() == doctest::Approx(1.0f));
}
