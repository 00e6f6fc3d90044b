/// @file entropy.hpp
/// @brief How spread out attention is: the entropy of each row of attention weights.
#pragma once

#include "attn/tensor.hpp"

#include <cstddef>
#include <string>

namespace attn {

/// The entropy \f$H(p) = -\sum_j p_j \ln p_j\f$ (in nats) of every row of attention weights,
/// with \f$0 \ln 0 = 0\f$ (a hidden key adds nothing).
///
/// A row that puts all its weight on one key has entropy 0; a row spread evenly over n keys
/// has the largest possible entropy, ln n.
///
/// @param weights (B, NH, T_q, T_k) attention weights, rows summing to 1
/// @return (B, NH, T_q)
/// @throws std::invalid_argument when a weight is negative or a row does not sum to 1
///         (within 1e-3)
Tensor3 attention_entropy(const Tensor4& weights);

/// Every head's entropy, averaged over the batch and the query positions.
///
/// @param weights (B, NH, T_q, T_k) attention weights
/// @return (NH)
Tensor1 mean_entropy_per_head(const Tensor4& weights);

/// The mean entropy that causal attention would have if every query spread its weight
/// evenly over all the keys it may see: the mean of ln(i + 1) over positions i = 0..T−1.
/// No causal head can have a larger mean entropy.
double uniform_causal_entropy(std::size_t T);

/// A text bar for an entropy next to its largest possible value: `width` cells, the first
/// round(width · value / maximum) of them filled (`█`), the rest dotted (`·`).
///
/// @param value    the entropy to draw, clamped to [0, maximum]
/// @param maximum  the entropy of a full bar, e.g. uniform_causal_entropy(T); positive
/// @param width    the number of cells
std::string entropy_bar(double value, double maximum, std::size_t width = 30);

}  // namespace attn
