/// @file cross_attention.hpp
/// @brief Multi-head attention between two sequences, as a flat forward/backward pair in the
/// style of gpt_layers.hpp: T_q queries from one sequence, T_k keys and values from another
/// (or the same), a key padding mask for batches of different lengths, and an optional
/// causal mask whose alignment is stated when T_q ≠ T_k.
///
/// One function serves the three attentions of an encoder–decoder transformer (Vaswani et
/// al. 2017): the encoder's bidirectional self-attention (q, k, v from the encoder, keys
/// masked by the source lengths), the decoder's causal self-attention (q, k, v from the
/// decoder), and cross-attention (q from the decoder, k and v from the encoder's output,
/// keys masked by the *source* lengths).
///
/// Axis letters as in gpt_layers.hpp: `B` batch, `T_q` queries, `T_k` keys, `C` channels,
/// `NH` heads, `hs = C / NH`.
#pragma once

#include "attn/sdpa.hpp"  // CausalAlignment, causal_last_key

namespace attn {

/// Where the queries, keys and values of masked_attention_forward() lie in memory: each is
/// (B, T, C) inside rows of a wider buffer, so that the fused projections (q, k and v side
/// by side, or k and v side by side) are read in place.
struct AttentionInputs {
    const float* q = nullptr;  ///< the first query channel; rows of q_stride floats, (B, T_q, ·)
    const float* k = nullptr;  ///< the first key channel; rows of kv_stride floats, (B, T_k, ·)
    const float* v = nullptr;  ///< the first value channel; rows of kv_stride floats, (B, T_k, ·)
    int q_stride = 0;          ///< floats from one query row to the next (C, or 3C when fused)
    int kv_stride = 0;         ///< floats from one key (and value) row to the next (2C, 3C, …)
};

/// The same layout for the gradients: dq, dk and dv, accumulated (`+=`) with the strides of
/// the inputs they belong to.
struct AttentionGrads {
    float* dq = nullptr;  ///< as AttentionInputs::q
    float* dk = nullptr;  ///< as AttentionInputs::k
    float* dv = nullptr;  ///< as AttentionInputs::v
};

/// What each query may see besides the real keys: nothing more (bidirectional) or the keys
/// up to the causal diagonal placed by its alignment.
struct AttentionMaskSpec {
    /// (B) the number of real keys of each sequence: keys j ≥ key_lengths[b] are padding and
    /// hidden from every query of sequence b; nullptr for none (every key is real). A length
    /// of 0 hides every key: each query of that sequence gets zero weights and a zero output.
    const int* key_lengths = nullptr;
    bool causal = false;  ///< also hide keys after causal_last_key(i, T_q, T_k, alignment)
    /// Where the diagonal sits; required when causal and T_q ≠ T_k (the call is refused).
    CausalAlignment alignment = CausalAlignment::unspecified;
};

/// Multi-head attention with a key padding mask: per sequence b and head h (channels
/// [h·hs, (h+1)·hs) of q, k and v),
///
///     att = softmax(q·kᵀ / √hs) over the keys query i may see,  out = att · v,
///
/// with the hidden keys' weights exactly 0 (their scores are never exponentiated, so no
/// −∞ or −1e9 stands in for them). A query that may see no key gets an all-zero row of
/// weights and a zero output, never NaN (lesson 04's rule).
/// @param out (B, T_q, C) the heads' outputs side by side
/// @param att (B, NH, T_q, T_k) the weights, kept for the backward pass
/// @param in the queries, keys and values and their strides
/// @param mask the key padding and the causal mask
/// @param B batch  @param T_q queries  @param T_k keys  @param C channels  @param NH heads
/// @throws std::invalid_argument when NH does not divide C, a size is below 1, a key length
///         is outside [0, T_k], or causal with T_q ≠ T_k and no alignment
void masked_attention_forward(float* out, float* att, const AttentionInputs& in,
                              const AttentionMaskSpec& mask, int B, int T_q, int T_k, int C, int NH);

/// Backward of masked_attention_forward(): adds into dq, dk and dv.
/// @param grads dq (B, T_q, ·), dk and dv (B, T_k, ·), accumulated, strides as `in`
/// @param scratch (B, NH, T_q, T_k) working space
/// @param dout (B, T_q, C)
/// @param in as given to the forward pass
/// @param att (B, NH, T_q, T_k) from the forward pass
/// @param B batch  @param T_q queries  @param T_k keys  @param C channels  @param NH heads
void masked_attention_backward(const AttentionGrads& grads, float* scratch, const float* dout,
                               const AttentionInputs& in, const float* att, int B, int T_q,
                               int T_k, int C, int NH);

}  // namespace attn
