/// @file mixed_attention.hpp
/// @brief Attention on 16-bit inputs (float16 or bfloat16), on the CPU: the plain version
/// as a framework computes it on 16-bit tensors, where every intermediate result is
/// stored in the 16-bit format, and FlashAttention's online softmax, where only the
/// inputs, the probabilities fed to P·V and the output are 16-bit and the statistics (the
/// running maximum and sum) and the accumulator stay float32.
///
/// Buffers are floats holding values of the format (round them with attn::round_in_place
/// first); the layouts are flash.hpp's: q, k, v, out (B, NH, T, hs), lse (B, NH, T),
/// scores scaled by 1/√hs, causal or not. Both are measured against the float64
/// attention_reference_forward() of the same (rounded) inputs, with FlashAttention's rule
/// (passes_flash_rule): the online version's error at most twice the plain version's.
#pragma once

#include "attn/flash.hpp"
#include "attn/precision.hpp"

#include <cstdint>
#include <vector>

namespace attn {

/// Plain attention on 16-bit tensors, as PyTorch computes it on float16 or bfloat16
/// (FlashAttention's tests' `attention_ref(..., upcast=False)`): each product summed in
/// float32 and its result stored in the format: S = round(q·kᵀ/√hs); P = round(softmax(S))
/// with the softmax computed in float32; out = round(P·v).
/// @param out    (B, NH, T, hs) written, values of the format
/// @param q      (B, NH, T, hs) values of the format
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param shape  the sizes
/// @param format bf16 or fp16 (fp32: every rounding is the identity)
void attention_plain_rounded_forward(float* out, const float* q, const float* k, const float* v,
                                     const AttentionShape& shape, Precision format);

/// The online softmax of lesson 13 on 16-bit inputs, key tiles of `blocks.cols`: scores
/// summed in float32; the running maximum m, sum l and accumulator acc in `statistics`;
/// each probability rounded to the inputs' format before it multiplies v (the tensor
/// cores' P·V takes 16-bit inputs); out = round(acc / l) at the end. FlashAttention keeps
/// the statistics in float32; `statistics` = the input format rounds l and acc after every
/// addition, to measure what that costs.
/// @param out        (B, NH, T, hs) written, values of the format
/// @param lse        (B, NH, T) written, m + ln l in float32; may be null
/// @param q          (B, NH, T, hs) values of the format
/// @param k          (B, NH, T, hs)
/// @param v          (B, NH, T, hs)
/// @param shape      the sizes
/// @param format     the inputs' and output's format
/// @param statistics where m, l and acc are kept (fp32, or the inputs' format)
/// @param blocks     the key tile size (blocks.cols); T need not be a multiple of it
void attention_flash_rounded_forward(float* out, float* lse, const float* q, const float* k,
                                     const float* v, const AttentionShape& shape,
                                     Precision format, Precision statistics,
                                     const FlashBlocks& blocks = {});

/// Random inputs of a 16-bit attention and its exact answer: what the 16-bit versions'
/// errors are measured against.
struct RoundedAttentionInputs {
    std::vector<float> q;        ///< (B, NH, T, hs), values of the format
    std::vector<float> k;        ///< (B, NH, T, hs), values of the format
    std::vector<float> v;        ///< (B, NH, T, hs), values of the format
    std::vector<double> out;     ///< (B, NH, T, hs) float64 attention of q, k, v
    std::vector<double> lse;     ///< (B, NH, T) its log-sum-exp
};

/// q, k, v of `shape` drawn from N(0, 1) by an Rng seeded with `seed` (all of q, then k,
/// then v) and rounded to `format` (round_in_place), and attention_reference_forward() of
/// the rounded values.
/// @param shape  the sizes
/// @param format bf16 or fp16 (fp32 leaves the draws as they are)
/// @param seed   the random source's seed
RoundedAttentionInputs rounded_attention_inputs(const AttentionShape& shape, Precision format,
                                                std::uint64_t seed);

}  // namespace attn
