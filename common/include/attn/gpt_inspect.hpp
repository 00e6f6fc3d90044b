/// @file gpt_inspect.hpp
/// @brief Looking inside a GPT after a forward pass: each layer's attention weights, queries
/// and keys as tensors, the weight each head puts on the previous token, and a head switched
/// off to measure what it contributes.
#pragma once

#include "attn/gpt.hpp"
#include "attn/tensor.hpp"

namespace attn {

/// One layer's attention weights from the model's last forward pass.
/// @param model a model that has run forward() @param layer in [0, n_layer)
/// @return (B, NH, T, T), rows summing to 1, zero above the diagonal when causal
/// @throws std::invalid_argument for a layer out of range or a model that has not run
Tensor4 attention_weights(const GPT& model, int layer);

/// One layer's queries (which = 0) or keys (which = 1) from the last forward pass, split
/// into heads, before any scaling.
/// @param model a model that has run forward() @param layer in [0, n_layer)
/// @param which 0 for the queries, 1 for the keys
/// @return (B, NH, T, hs)
/// @throws std::invalid_argument as attention_weights, and for `which` not 0 or 1
Tensor4 attention_queries_or_keys(const GPT& model, int layer, int which);

/// The mean weight that each head puts on the previous token: w[b, h, i, i−1] averaged over
/// the batch and the positions i ≥ 1. A "previous-token head" scores near 1; a head that
/// spreads its weight evenly scores about the mean of 1/(i+1).
/// @param weights (B, NH, T, T) with T ≥ 2
/// @return (NH)
/// @throws std::invalid_argument for T < 2 or weights that are not square in the last two axes
Tensor1 previous_token_weight(const Tensor4& weights);

/// Switches one head off: its output no longer reaches the residual stream, because the
/// columns of the layer's output projection `c_proj` (C, C) that read it are set to zero.
/// The change is to the weights: keep a copy of GPT::parameters() to put it back.
/// @param model the model @param layer in [0, n_layer) @param head in [0, n_head)
/// @throws std::invalid_argument for a layer or head out of range
void zero_head(GPT& model, int layer, int head);

}  // namespace attn
