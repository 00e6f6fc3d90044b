/// @file attention.hpp
/// @brief Causal (or full) attention on the GPU over device buffers in (B, NH, T, hs)
/// layout: the plain version that materialises the (T, T) matrix through cuBLAS, and the
/// fused FlashAttention-style kernels, forward and backward.
///
/// A plain header (no CUDA types), so that ordinary C++ files can include it; the kernels
/// live in common/cuda/attention_plain.cu and common/cuda/attention_flash.cu. Every
/// pointer is a device pointer to float32; `stream` is a `cudaStream_t` passed as
/// `void*` (null: the default stream). The functions enqueue work and return; errors in
/// the launch are reported through std::runtime_error. The scores are scaled by 1/√hs.
#pragma once

#include "attn/flash.hpp"

#include <cstddef>
#include <cstdint>

namespace attn::cuda {

/// Floats of the (B, NH, T, T) buffer the plain version needs, once for the forward's
/// probabilities (kept for the backward) and once more as the backward's scratch.
std::size_t plain_attention_scratch_floats(const AttentionShape& shape);

/// Plain attention forward: att = softmax(q kᵀ/√hs) with the causal mask, out = att v.
/// @param out    (B, NH, T, hs) written
/// @param att    (B, NH, T, T) the probabilities, written (the backward reads them)
/// @param q      (B, NH, T, hs)
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param shape  the sizes
/// @param stream a cudaStream_t, or null
void plain_attention_forward(float* out, float* att, const float* q, const float* k,
                             const float* v, const AttentionShape& shape,
                             void* stream = nullptr);

/// Plain attention backward: dv = attᵀ dout, datt = dout vᵀ, then the softmax's backward
/// in place, dq = dS k/√hs, dk = dSᵀ q/√hs.
/// @param dq     (B, NH, T, hs) written
/// @param dk     (B, NH, T, hs) written
/// @param dv     (B, NH, T, hs) written
/// @param datt   (B, NH, T, T) scratch, overwritten
/// @param dout   (B, NH, T, hs)
/// @param q      (B, NH, T, hs)
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param att    (B, NH, T, T) the forward's probabilities
/// @param shape  the sizes
/// @param stream a cudaStream_t, or null
void plain_attention_backward(float* dq, float* dk, float* dv, float* datt, const float* dout,
                              const float* q, const float* k, const float* v,
                              const float* att, const AttentionShape& shape,
                              void* stream = nullptr);

/// Dropout on the attention weights inside the fused kernels. Weight (i, j) of head
/// `head` (= b·NH + h) is dropped when hash(seed, (head·T + i)·T + j) < p, and the kept
/// weights are scaled by 1/(1 − p): the same masks, element for element, as the
/// materialised attention_forward of gpt_ops.hpp draws from the same seed. p = 0: none.
struct AttentionDropout {
    float p = 0.0f;          ///< probability of dropping a weight, in [0, 1)
    std::uint64_t seed = 0;  ///< the mask's seed: the same seed gives the same mask
};

/// Whether the fused kernels support this head size (64 and 128).
bool flash_attention_supports(std::size_t hs);

/// Fused attention forward: tiles of q, k, v in shared memory, online softmax, causal
/// tiles skipped; never writes the (T, T) matrix.
/// @param out    (B, NH, T, hs) written
/// @param lse    (B, NH, T) each row's log-sum-exp of the scaled scores, written
/// @param q      (B, NH, T, hs)
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param shape  the sizes; hs must be 64 or 128
/// @param stream a cudaStream_t, or null
/// @param dropout dropout on the weights (none by default); `lse` is that of the weights
///                before dropout, and `out` blends the values with the dropped weights
/// @throws std::invalid_argument for an unsupported head size
void flash_attention_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const AttentionShape& shape,
                             void* stream = nullptr, const AttentionDropout& dropout = {});

/// How the fused backward spreads its work over the GPU. Both write every gradient element
/// from one block in a fixed order (no atomics), so each gives the same bits on every run.
enum class FlashBackwardSchedule {
    automatic,  ///< two_grids when B·NH is under half the device's SMs, else key_tiles
    key_tiles,  ///< one launch per key tile, B·NH blocks each, each adding its share of dQ
    two_grids,  ///< dK, dV by (key tile, head), then dQ by (query tile, head): S and dP
                ///< computed twice, for a grid that fills the SMs when B·NH is small
};

/// The grids of the fused backward for a shape: the schedule (automatic resolved for the
/// current device), its tiles of 64 and B·NH.
struct FlashBackwardGrid {
    FlashBackwardSchedule schedule = FlashBackwardSchedule::key_tiles;  ///< the schedule (never automatic)
    unsigned key_tiles = 0;    ///< key tiles: launches (key_tiles) or blocks along x (two_grids)
    unsigned query_tiles = 0;  ///< blocks along x of two_grids' dQ launch
    unsigned heads = 0;        ///< B·NH: blocks along y of every launch
};
/// The grids flash_attention_backward launches for this shape and schedule.
FlashBackwardGrid flash_backward_grid(const AttentionShape& shape,
                                      FlashBackwardSchedule schedule = FlashBackwardSchedule::automatic);

/// Fused attention backward with recomputation of the probabilities from `lse`.
/// @param dq     (B, NH, T, hs) written (each row summed key tile by key tile, in a fixed order)
/// @param dk     (B, NH, T, hs) written
/// @param dv     (B, NH, T, hs) written
/// @param delta  (B, NH, T) scratch: D_i = dout_i · out_i
/// @param dout   (B, NH, T, hs)
/// @param q      (B, NH, T, hs)
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param out    (B, NH, T, hs) the forward's output
/// @param lse    (B, NH, T) the forward's log-sum-exp
/// @param shape  the sizes; hs must be 64 or 128
/// @param stream a cudaStream_t, or null
/// @param dropout the forward pass's dropout (the same p and seed regenerate its masks)
/// @param schedule how the work is spread over the GPU (the results agree within float32
///                 rounding: two_grids recomputes dS for dQ)
/// @throws std::invalid_argument for an unsupported head size
void flash_attention_backward(float* dq, float* dk, float* dv, float* delta, const float* dout,
                              const float* q, const float* k, const float* v, const float* out,
                              const float* lse, const AttentionShape& shape,
                              void* stream = nullptr, const AttentionDropout& dropout = {},
                              FlashBackwardSchedule schedule = FlashBackwardSchedule::automatic);

}  // namespace attn::cuda
