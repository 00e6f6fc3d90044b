/// @file flash.hpp
/// @brief Attention over raw (B, NH, T, hs) buffers: the plain algorithm that holds the
/// T×T matrix, and the tiled one with an online softmax that never does (FlashAttention's
/// algorithm), forward and backward, plus a float64 reference.
///
/// Every buffer is C-ordered with the shape written beside it: `q`, `k`, `v`, `out` and
/// their gradients are (B, NH, T, hs); the per-row log-sum-exp `lse` is (B, NH, T). The
/// scores are scaled by 1/√hs, and a causal problem lets query i see keys 0..i only.
///
/// The functions write their outputs and allocate nothing that grows with T×T except
/// the plain ones, which hold one (T, T) matrix of one head at a time.
#pragma once

#include <cstddef>
#include <vector>

namespace attn {

/// The sizes of one attention problem.
struct AttentionShape {
    std::size_t B = 1;    ///< batch
    std::size_t NH = 1;   ///< heads
    std::size_t T = 1;    ///< sequence length (queries and keys)
    std::size_t hs = 1;   ///< head size
    bool causal = true;   ///< query i attends to keys 0..i only

    /// Elements of one (B, NH, T, hs) buffer.
    std::size_t qkv_size() const { return B * NH * T * hs; }
    /// Elements of one (B, NH, T) buffer (the log-sum-exp).
    std::size_t rows() const { return B * NH * T; }
};

/// Throws std::invalid_argument unless every size is positive.
void check_attention_shape(const AttentionShape& shape);

/// The tile sizes of the tiled algorithm.
struct FlashBlocks {
    std::size_t rows = 64;  ///< Br: query rows per tile
    std::size_t cols = 64;  ///< Bc: keys per tile
};

/// One step of the online softmax for one query row: folds in a tile of scores.
///
/// The row's running state is its maximum `m`, its sum `l = Σ e^(s − m)` and its
/// unnormalised output `acc = Σ e^(s − m) v`. For a tile of scores s (n) and values
/// V (n, hs):
///
///     m_new = max(m, max_j s_j)
///     l     = e^(m − m_new) · l   + Σ_j e^(s_j − m_new)
///     acc   = e^(m − m_new) · acc + Σ_j e^(s_j − m_new) · v_j
///
/// Start from m = −∞, l = 0, acc = 0; after the last tile the row's output is acc / l
/// and its log-sum-exp is m + ln l. A score of −∞ (a masked key) contributes nothing,
/// and a tile whose scores are all −∞ leaves an empty state empty (no NaN).
///
/// @param m       the running maximum, updated
/// @param l       the running sum, updated
/// @param acc     (hs) the running unnormalised output, updated
/// @param scores  (n) this tile's scores of the row, already scaled
/// @param values  (n, hs) this tile's value rows
/// @param n       keys in the tile
/// @param hs      head size
void online_softmax_update(float& m, float& l, float* acc, const float* scores,
                           const float* values, std::size_t n, std::size_t hs);

/// Plain attention forward: per head, S = q kᵀ/√hs (T, T), P = softmax(S) with the causal
/// mask, out = P v.
/// @param out    (B, NH, T, hs) written
/// @param lse    (B, NH, T) the rows' log-sum-exp of S, written; may be null
/// @param q      (B, NH, T, hs)
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param shape  the sizes
void attention_plain_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const AttentionShape& shape);

/// Plain attention backward, the reference for gradients: recomputes P per head, then
/// dv = Pᵀ dout, dP = dout vᵀ, dS = P ∘ (dP − rowsum(P ∘ dP)), dq = dS k/√hs,
/// dk = dSᵀ q/√hs.
/// @param dq    (B, NH, T, hs) written
/// @param dk    (B, NH, T, hs) written
/// @param dv    (B, NH, T, hs) written
/// @param dout  (B, NH, T, hs) the loss's gradient with respect to out
/// @param q     (B, NH, T, hs)
/// @param k     (B, NH, T, hs)
/// @param v     (B, NH, T, hs)
/// @param shape the sizes
void attention_plain_backward(float* dq, float* dk, float* dv, const float* dout,
                              const float* q, const float* k, const float* v,
                              const AttentionShape& shape);

/// The plain forward in float64 throughout: the reference that float32 versions are
/// measured against.
/// @param out    (B, NH, T, hs) written
/// @param lse    (B, NH, T) written; may be null
/// @param q      (B, NH, T, hs)
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param shape  the sizes
void attention_reference_forward(double* out, double* lse, const double* q, const double* k,
                                 const double* v, const AttentionShape& shape);

/// The plain backward in float64 throughout.
/// @param dq    (B, NH, T, hs) written
/// @param dk    (B, NH, T, hs) written
/// @param dv    (B, NH, T, hs) written
/// @param dout  (B, NH, T, hs)
/// @param q     (B, NH, T, hs)
/// @param k     (B, NH, T, hs)
/// @param v     (B, NH, T, hs)
/// @param shape the sizes
void attention_reference_backward(double* dq, double* dk, double* dv, const double* dout,
                                  const double* q, const double* k, const double* v,
                                  const AttentionShape& shape);

/// Tiled attention forward with the online softmax: for each tile of `blocks.rows`
/// queries, visits the key tiles of `blocks.cols` keys in order (skipping those wholly
/// above the diagonal when causal) and folds each in with online_softmax_update(). Holds
/// one (rows, cols) tile of scores at a time, never the (T, T) matrix.
/// @param out    (B, NH, T, hs) written
/// @param lse    (B, NH, T) the rows' log-sum-exp m + ln l, written (the backward pass
///               recomputes the probabilities from it)
/// @param q      (B, NH, T, hs)
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param shape  the sizes
/// @param blocks the tile sizes; T need not be a multiple of them
/// @throws std::invalid_argument if a size or a tile size is zero
void attention_flash_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const AttentionShape& shape,
                             const FlashBlocks& blocks = {});

/// Tiled attention backward with recomputation: for each tile of keys, visits the query
/// tiles that can see it, recomputes P = e^(S − lse) from the saved log-sum-exp, and
/// accumulates dv, dk for the key tile and dq for the query tile, using
/// D_i = Σ_d dout[i][d]·out[i][d] in place of rowsum(P ∘ dP).
/// @param dq     (B, NH, T, hs) written
/// @param dk     (B, NH, T, hs) written
/// @param dv     (B, NH, T, hs) written
/// @param dout   (B, NH, T, hs)
/// @param q      (B, NH, T, hs)
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param out    (B, NH, T, hs) the forward's output
/// @param lse    (B, NH, T) the forward's log-sum-exp
/// @param shape  the sizes
/// @param blocks the tile sizes
void attention_flash_backward(float* dq, float* dk, float* dv, const float* dout,
                              const float* q, const float* k, const float* v,
                              const float* out, const float* lse, const AttentionShape& shape,
                              const FlashBlocks& blocks = {});

/// The tiled forward made fast on a CPU: the algorithm of attention_flash_forward() with
/// each tile product (S = Q·Kᵀ, acc += P·V) an OpenBLAS sgemm, the online softmax
/// vectorised (exp_approx of fast_math.hpp, AVX2 chosen at load time) and the (batch,
/// head, query tile) items spread over the threads of threads.hpp. Tiles of 128 queries and
/// 128 keys; causal tiles wholly above the diagonal are skipped. Per thread it holds one
/// tile of scores and one accumulator, never the (T, T) matrix.
/// Its error against the float64 reference is within FlashAttention's rule (at most twice
/// the plain version's; tests/test_flash.cpp).
/// @param out    (B, NH, T, hs) written
/// @param lse    (B, NH, T) the rows' log-sum-exp, written (the backward reads it)
/// @param q      (B, NH, T, hs)
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param shape  the sizes; T need not be a multiple of the tiles
/// @throws std::invalid_argument if a size is zero
void attention_fast_forward(float* out, float* lse, const float* q, const float* k,
                            const float* v, const AttentionShape& shape);

/// The tiled backward made fast on a CPU, as attention_fast_forward(): per key tile, the
/// query tiles that see it recompute P = e^(S − lse) from the saved log-sum-exp and add
/// to dv, dk and dq with five sgemm calls per pair of tiles. Key tiles run on the threads;
/// with more than one thread each thread adds its dq into a (B, NH, T, hs) buffer of its
/// own, summed at the end: memory O(T·hs) per head, never O(T²).
/// @param dq     (B, NH, T, hs) written
/// @param dk     (B, NH, T, hs) written
/// @param dv     (B, NH, T, hs) written
/// @param dout   (B, NH, T, hs)
/// @param q      (B, NH, T, hs)
/// @param k      (B, NH, T, hs)
/// @param v      (B, NH, T, hs)
/// @param out    (B, NH, T, hs) the forward's output
/// @param lse    (B, NH, T) the forward's log-sum-exp
/// @param shape  the sizes
void attention_fast_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse,
                             const AttentionShape& shape);

/// Floats held at once for the scores of one head: T·T for the plain algorithm.
std::size_t plain_score_floats(std::size_t T);

/// Floats held at once for the scores and running state of one head by the tiled
/// forward: one (rows, cols) score tile, the (rows, hs) output accumulator and the rows'
/// m and l. Independent of T.
std::size_t flash_working_floats(const FlashBlocks& blocks, std::size_t hs);

/// The largest |a_i − ref_i| over n elements; a NaN counts as infinitely far.
double max_abs_error(const float* a, const double* ref, std::size_t n);

/// The largest |ref_i| over n elements.
double max_abs(const double* ref, std::size_t n);

/// FlashAttention's acceptance rule: a fused kernel's error against a float64 reference
/// may be at most twice that of the plain version at the same precision. Both errors are
/// maxima of a few float32 roundings, themselves noisy, so a floor of 4 float32 ulps of
/// the reference's largest value is allowed on top (it decides only when both errors are
/// that small).
/// @param fused_error     max |fused − reference|
/// @param plain_error     max |plain − reference|
/// @param reference_scale max |reference|
bool passes_flash_rule(double fused_error, double plain_error, double reference_scale);

/// Converts a float buffer to float64 (for the reference functions).
std::vector<double> to_double(const float* data, std::size_t n);

}  // namespace attn
