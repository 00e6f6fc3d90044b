/// @file linear.hpp
/// @brief A linear layer with PyTorch's weight layout and initialisation.
#pragma once

#include "attn/random.hpp"
#include "attn/tensor.hpp"

namespace attn {

/// y = x · Wᵀ (+ b), the same map as PyTorch's `nn.Linear`.
///
/// The weight is stored as (out, in), as PyTorch stores it, so weights move between the
/// two without a transpose. Initialisation follows PyTorch's default: weight and bias
/// uniform in [−1/√in, 1/√in).
struct Linear {
    Tensor2 weight;        ///< (out, in)
    Tensor1 bias;          ///< (out), empty when the layer has no bias
    bool has_bias = false; ///< whether `bias` is used

    Linear() = default;
    /// A layer with PyTorch's default initialisation drawn from `rng`.
    Linear(std::size_t in_features, std::size_t out_features, bool with_bias, Rng& rng);
    /// A layer with the given weight (out, in) and no bias.
    explicit Linear(Tensor2 weight);
    /// A layer with the given weight (out, in) and bias (out).
    Linear(Tensor2 weight, Tensor1 bias);

    std::size_t in_features() const { return weight.shape()[1]; }   ///< `in`
    std::size_t out_features() const { return weight.shape()[0]; }  ///< `out`

    /// @param x (N, in) @return (N, out)
    Tensor2 forward(const Tensor2& x) const;
    /// @param x (B, T, in) @return (B, T, out)
    Tensor3 forward(const Tensor3& x) const;
};

}  // namespace attn
