#include "attn/fixtures.hpp"
#include "attn/check.hpp"
#include "attn/linalg.hpp"
#include "attn/linear.hpp"
#include "attn/npy.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <cmath>

using namespace attn;

namespace {
const std::filesystem::path fixtures = attn::fixtures_dir() / "library";
}

TEST_CASE("matmul agrees with a product worked by hand") {
    Tensor2 a = {{1, 2}, {3, 4}, {5, 6}};
    Tensor2 b = {{1, 0, -1}, {2, 1, 0}};
    // Exact: small integers, every product and partial sum is an integer below 2^24.
    CHECK_CLOSE(matmul(a, b), Tensor2({{5, 2, -1}, {11, 4, -3}, {17, 6, -5}}), 0.0);
    CHECK_CLOSE(matmul_transposed(a, a), Tensor2({{5, 11, 17}, {11, 25, 39}, {17, 39, 61}}), 0.0);
    CHECK_THROWS_AS(matmul(a, a), std::invalid_argument);
}

TEST_CASE("batched products equal the 2-D product on each batch item") {
    Rng rng(5);
    Tensor3 a = rng.normal_tensor<3>({3, 4, 5});
    Tensor3 b = rng.normal_tensor<3>({3, 6, 5});
    Tensor3 c = rng.normal_tensor<3>({3, 5, 2});
    Tensor3 abt = batched_matmul_transposed(a, b);
    Tensor3 ac = batched_matmul(a, c);
    for (std::size_t i = 0; i < 3; ++i) {
        CAPTURE(i);
        Tensor2 ai = xt::view(a, i), bi = xt::view(b, i), ci = xt::view(c, i);
        // The same gemm call on the same sizes, so bit-identical with a deterministic BLAS;
        // 1e-6 allows another order: 2γ_5 Σ|ab| ≤ 10u·6 ≈ 3.6e-6 worst case (n = K = 5, N(0,1),
        // Σ|ab| ≲ 6, u = 2^-24), √5 u·6 ≈ 8e-7 with random signs: 1e-6 rests on that, 1.2×.
        CHECK_CLOSE(xt::view(abt, i), matmul_transposed(ai, bi), 1e-6);
        CHECK_CLOSE(xt::view(ac, i), matmul(ai, ci), 1e-6);
    }
    CHECK_THROWS_AS(batched_matmul(a, b), std::invalid_argument);
}

TEST_CASE("Linear matches PyTorch's nn.Linear on the same weights") {
    // Tolerance: float32 sums of 5 products (+ bias, n = 6) in PyTorch's order and BLAS's:
    // 2γ_n Σ|x w| with Σ|x w| ≤ 1.48 (bias), 1.81 (no bias) from the fixtures (u = 2^-24) is
    // ≤ 1.1e-6 worst case, a hair above 1e-6; with random signs √(2n) u Σ|x w| ≤ 3.4e-7,
    // 3× under it. A transposed weight or missing bias is off by O(0.1).
    SUBCASE("with bias") {
        Linear layer(load_npy<2>(fixtures / "linear_bias_weight.npy"),
                     load_npy<1>(fixtures / "linear_bias_bias.npy"));
        CHECK_CLOSE(layer.forward(load_npy<3>(fixtures / "linear_bias_x.npy")),
                    load_npy<3>(fixtures / "linear_bias_y.npy"), 1e-6);
    }
    SUBCASE("without bias") {
        Linear layer(load_npy<2>(fixtures / "linear_nobias_weight.npy"));
        CHECK_CLOSE(layer.forward(load_npy<3>(fixtures / "linear_nobias_x.npy")),
                    load_npy<3>(fixtures / "linear_nobias_y.npy"), 1e-6);
    }
}

TEST_CASE("Linear's default initialisation is PyTorch's range U(-1/sqrt(in), 1/sqrt(in))") {
    Rng rng(1);
    Linear layer(64, 32, true, rng);
    CHECK(layer.weight.shape() == std::array<std::size_t, 2>{32, 64});
    CHECK(layer.bias.shape() == std::array<std::size_t, 1>{32});
    const float bound = 1.0f / 8.0f;
    CHECK(xt::amax(xt::abs(layer.weight))() <= bound);
    CHECK(xt::amax(xt::abs(layer.bias))() <= bound);
    // A uniform draw over 2048 weights comes close to both ends of the range.
    CHECK(xt::amax(layer.weight)() > 0.95f * bound);
    CHECK(xt::amin(layer.weight)() < -0.95f * bound);
    Linear no_bias(64, 32, false, rng);
    CHECK_FALSE(no_bias.has_bias);
    CHECK(no_bias.bias.size() == 0);
}

TEST_CASE("Linear rejects an input of the wrong width, naming both shapes") {
    Rng rng(2);
    Linear layer(8, 4, false, rng);
    Tensor3 x = xt::zeros<float>({2, 3, 7});
    CHECK_THROWS_WITH_AS(layer.forward(x), "Linear input: expected shape (*, *, 8), got (2, 3, 7)",
                         std::invalid_argument);
}
