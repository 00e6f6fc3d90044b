/// @file attention.hpp
/// @brief One head of causal self-attention, piece by piece: scores, the causal mask,
/// the softmax over the last axis, dropout on the weights, and the Head that joins them.
///
/// Lessons 02 to 05 build these pieces one at a time; later lessons call them.
#pragma once

#include "attn/linear.hpp"
#include "attn/random.hpp"
#include "attn/tensor.hpp"

#include <cstdint>
#include <limits>

namespace attn {

/// −∞ as a float: the value a masked score gets before the softmax, so that its weight
/// becomes exactly zero.
inline constexpr float minus_infinity = -std::numeric_limits<float>::infinity();

/// Swaps the last two axes and leaves the batch axis where it is: (B, M, N) → (B, N, M).
/// This is PyTorch's `k.transpose(-2, -1)`: sequence b stays sequence b.
///
/// @param x (B, M, N)
/// @return (B, N, M)
Tensor3 transpose_last_two(const Tensor3& x);

/// The raw dot-product scores of every query with every key of the same sequence:
/// s[b][i][j] = q[b][i] · k[b][j], that is Q·Kᵀ with the last two axes of K swapped.
///
/// @param q (B, T_q, hs) queries
/// @param k (B, T_k, hs) keys: same B and hs as q
/// @return (B, T_q, T_k)
/// @throws std::invalid_argument naming both shapes when B or hs differ
Tensor3 dot_product_scores(const Tensor3& q, const Tensor3& k);

/// The scaled scores Q·Kᵀ/√hs. Dividing by √hs keeps the scores' standard deviation near 1
/// whatever the head size, when the entries of q and k have unit variance.
///
/// @param q (B, T_q, hs) queries
/// @param k (B, T_k, hs) keys: same B and hs as q, hs > 0
/// @return (B, T_q, T_k)
/// @throws std::invalid_argument naming both shapes when B or hs differ, or hs is 0
Tensor3 attention_scores(const Tensor3& q, const Tensor3& k);

/// The causal mask at the block size: true on and below the diagonal ("query i may attend
/// to key j ≤ i"), false above it. Built once per head and sliced with mask_for_length().
///
/// @param block_size the longest sequence the mask serves; must be positive
/// @return (block_size, block_size)
Mask<2> causal_mask(std::size_t block_size);

/// The top-left (T, T) corner of a square mask built at the block size: the mask for a
/// sequence of T tokens.
///
/// @param mask (block_size, block_size)
/// @param T    the sequence length, at most block_size
/// @return (T, T)
/// @throws std::invalid_argument when T exceeds the block size
Mask<2> mask_for_length(const Mask<2>& mask, std::size_t T);

/// A copy of `scores` in which every entry whose mask entry is false is replaced by
/// `value` (−∞ by default), in every batch item.
///
/// @param scores (B, T_q, T_k)
/// @param mask   (T_q, T_k), true means "may attend"
/// @param value  what a masked entry becomes
/// @return (B, T_q, T_k)
/// @throws std::invalid_argument when the mask's shape is not (T_q, T_k)
Tensor3 masked_fill(const Tensor3& scores, const Mask<2>& mask, float value = minus_infinity);

/// The softmax over the last axis, computed stably: the row's largest logit is subtracted
/// before exponentiating, so logits of ±1000 neither overflow nor lose the answer.
///
/// Rows sum to 1 within float rounding. Two policies:
/// - a row whose every logit is −∞ (a fully masked row) gets all-zero weights: it attends
///   to nothing, so its output is the zero vector. The textbook formula would give
///   0/0 = NaN there, and the NaN would spread through every later layer.
/// - a logit of +∞ or NaN is an error (std::invalid_argument naming its position).
///
/// @param logits (N), any finite values or −∞
/// @return (N)
/// @throws std::invalid_argument for an empty last axis, or a NaN or +∞ logit
Tensor1 softmax(const Tensor1& logits);
/// The softmax over the last axis of a matrix: each row on its own, with the policies of
/// the vector form above (fully masked rows give zeros; NaN and +∞ throw).
/// @param logits (R, N) @return (R, N), each row a distribution
Tensor2 softmax(const Tensor2& logits);
/// The softmax over the last axis of a batch of score matrices, with the policies of the
/// vector form above (fully masked rows give zeros; NaN and +∞ throw).
/// @param logits (B, T_q, T_k) @return (B, T_q, T_k), each row a distribution
Tensor3 softmax(const Tensor3& logits);

/// Inverted dropout: each entry is zeroed with probability p, and each survivor is scaled
/// by 1/(1 − p), so the expected value of every entry is unchanged and evaluation needs no
/// rescaling. p = 0 returns x unchanged and draws nothing.
///
/// @param x   (B, T_q, T_k), usually attention weights
/// @param p   the drop probability, in [0, 1)
/// @param rng the random source (seeded: the same seed drops the same entries)
/// @return (B, T_q, T_k)
/// @throws std::invalid_argument when p is outside [0, 1)
Tensor3 dropout(const Tensor3& x, float p, Rng& rng);

/// One head of causal self-attention, the same computation as the `Head` of the "Let's build GPT"
/// lecture code (karpathy/ng-video-lecture, gpt.py):
/// out = dropout(softmax(mask(Q·Kᵀ/√hs))) · V with Q, K, V three bias-free projections of x.
struct Head {
    Linear key;               ///< W_k (hs, C), no bias
    Linear query;             ///< W_q (hs, C), no bias
    Linear value;             ///< W_v (hs, C), no bias
    Mask<2> tril;             ///< (block_size, block_size) causal mask, built once
    float dropout_p = 0.0f;   ///< probability of dropping an attention weight in training
    bool training = false;    ///< true: dropout is applied; false (evaluation): it is not
    Rng dropout_rng;          ///< the dropout's seeded random source

    /// A head with PyTorch's default initialisation, drawn from `init_rng` in the order
    /// key, query, value (nanoGPT's order).
    ///
    /// @param n_embd       C, the width of the input tokens
    /// @param head_size    hs
    /// @param block_size   the longest sequence the head accepts
    /// @param dropout      drop probability on the attention weights, in [0, 1)
    /// @param init_rng     source of the initial weights
    /// @param dropout_seed seed of the dropout's random source
    Head(std::size_t n_embd, std::size_t head_size, std::size_t block_size, float dropout,
         Rng& init_rng, std::uint64_t dropout_seed = 1337);

    /// A head with the given weights, each (hs, C) in PyTorch's layout.
    ///
    /// @param w_key        (hs, C)
    /// @param w_query      (hs, C)
    /// @param w_value      (hs, C)
    /// @param block_size   the longest sequence the head accepts
    /// @param dropout      drop probability on the attention weights, in [0, 1)
    /// @param dropout_seed seed of the dropout's random source
    /// @throws std::invalid_argument when the weights' shapes differ
    Head(Tensor2 w_key, Tensor2 w_query, Tensor2 w_value, std::size_t block_size,
         float dropout = 0.0f, std::uint64_t dropout_seed = 1337);

    std::size_t n_embd() const { return key.in_features(); }      ///< C
    std::size_t head_size() const { return key.out_features(); }  ///< hs
    std::size_t block_size() const { return tril.shape()[0]; }    ///< the mask's size

    /// The attention weights softmax(mask(Q·Kᵀ/√hs)), before dropout: what the heatmaps show.
    ///
    /// @param x (B, T, C) with T ≤ block_size
    /// @return (B, T, T), each row a distribution over the tokens up to its own
    /// @throws std::invalid_argument for a wrong C or a T beyond the block size
    Tensor3 attention_weights(const Tensor3& x) const;

    /// The head's output. In training mode the weights pass through dropout first (drawing
    /// from dropout_rng); in evaluation mode they do not, and the result is deterministic.
    ///
    /// @param x (B, T, C) with T ≤ block_size
    /// @return (B, T, hs)
    /// @throws std::invalid_argument for a wrong C or a T beyond the block size
    Tensor3 forward(const Tensor3& x);
};

}  // namespace attn
