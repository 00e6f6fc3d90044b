/// @file multi_head.hpp
/// @brief Multi-head causal self-attention with one fused QKV projection, laid out as
/// nanoGPT's `CausalSelfAttention` (`c_attn` (3C, C), `c_proj` (C, C)).
#pragma once

#include "attn/linear.hpp"
#include "attn/random.hpp"
#include "attn/tensor.hpp"

#include <cstddef>

namespace attn {

/// Splits the channels of every token into NH heads of hs = C / NH channels each:
/// head h gets channels [h·hs, (h+1)·hs).
///
/// @param x  (B, T, C)
/// @param NH the number of heads; must divide C
/// @return (B, NH, T, hs)
/// @throws std::invalid_argument when NH is 0 or does not divide C
Tensor4 split_heads(const Tensor3& x, std::size_t NH);

/// The inverse of split_heads(): puts the heads' channels side by side again.
///
/// @param y (B, NH, T, hs)
/// @return (B, T, NH·hs)
Tensor3 merge_heads(const Tensor4& y);

/// Multi-head self-attention: one fused projection to q, k and v for all heads, NH heads of
/// attention in parallel, the heads merged, and an output projection.
///
/// The weights have PyTorch's layout and nanoGPT's names, so a `c_attn.weight` (3C, C)
/// loaded from a nanoGPT checkpoint works as it is: its rows [0, C) make the queries,
/// [C, 2C) the keys and [2C, 3C) the values, and within each the rows of head h are
/// [h·hs, (h+1)·hs).
struct MultiHeadAttention {
    Linear c_attn;          ///< the fused projection, weight (3C, C) (+ bias (3C))
    Linear c_proj;          ///< the output projection, weight (C, C) (+ bias (C))
    std::size_t n_head = 1; ///< NH
    bool causal = true;     ///< apply the causal mask (lesson 08 turns it off to show the leak)
    bool scaled = true;     ///< multiply scores by 1/√hs (lesson 08 turns it off)

    MultiHeadAttention() = default;
    /// A layer with PyTorch's default initialisation drawn from `rng`.
    /// @throws std::invalid_argument when NH does not divide C
    MultiHeadAttention(std::size_t C, std::size_t NH, bool bias, Rng& rng);
    /// A layer with the given projections.
    /// @param attn_projection    weight (3C, C)
    /// @param output_projection  weight (C, C)
    /// @param NH                 the number of heads; must divide C
    /// @throws std::invalid_argument naming the shapes when they do not fit
    MultiHeadAttention(Linear attn_projection, Linear output_projection, std::size_t NH);

    std::size_t channels() const { return c_proj.out_features(); }  ///< C
    std::size_t head_size() const { return channels() / n_head; }   ///< hs = C / NH

    /// @param x        (B, T, C)
    /// @param weights  if not null, receives every head's attention weights (B, NH, T, T)
    /// @return (B, T, C)
    Tensor3 forward(const Tensor3& x, Tensor4* weights = nullptr) const;
};

}  // namespace attn
