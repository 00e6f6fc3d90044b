#include "attn/linear.hpp"

#include "attn/linalg.hpp"

#include <cmath>

namespace attn {

Linear::Linear(std::size_t in_features, std::size_t out_features, bool with_bias, Rng& rng)
    : has_bias(with_bias) {
    require(in_features > 0 && out_features > 0, "Linear: sizes must be positive");
    // PyTorch's nn.Linear: kaiming_uniform(a=√5) on the weight, which is U(−1/√in, 1/√in),
    // and the same range for the bias.
    const float bound = 1.0f / std::sqrt(static_cast<float>(in_features));
    weight = rng.uniform_tensor<2>({out_features, in_features}, -bound, bound);
    if (with_bias) bias = rng.uniform_tensor<1>({out_features}, -bound, bound);
}

Linear::Linear(Tensor2 w) : weight(std::move(w)), has_bias(false) {}

Linear::Linear(Tensor2 w, Tensor1 b) : weight(std::move(w)), bias(std::move(b)), has_bias(true) {
    expect_shape("Linear bias", bias, {weight.shape()[0]});
}

Tensor2 Linear::forward(const Tensor2& x) const {
    expect_shape("Linear input", x, {any, in_features()});
    Tensor2 y = matmul_transposed(x, weight);
    if (has_bias) y += xt::view(bias, xt::newaxis(), xt::all());
    return y;
}

Tensor3 Linear::forward(const Tensor3& x) const {
    expect_shape("Linear input", x, {any, any, in_features()});
    const std::size_t B = x.shape()[0], T = x.shape()[1];
    // (B, T, in) in C order holds the same numbers as a (B·T, in) matrix.
    Tensor2 flat({B * T, in_features()});
    std::copy(x.begin(), x.end(), flat.begin());
    Tensor2 y = forward(flat);
    Tensor3 out({B, T, out_features()});
    std::copy(y.begin(), y.end(), out.begin());
    return out;
}

}  // namespace attn
