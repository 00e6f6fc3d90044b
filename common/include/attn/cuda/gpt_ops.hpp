/// @file gpt_ops.hpp
/// @brief The GPT's layers on the GPU: one host function per op and pass, the mirror of
/// gpt_layers.hpp on device pointers.
///
/// A plain header (no CUDA types beyond opaque handles), so that ordinary C++ files can
/// include it. Every pointer is a device pointer; every function only enqueues work on
/// `stream` (nullptr: the default stream) and returns without waiting for it. Each function
/// has the same arguments, in the same order, as its CPU namesake in gpt_layers.hpp, plus
/// the scratch space, cuBLAS context and stream it needs; like those, every backward
/// function *adds* into its gradient buffers.
///
/// The kernels behind each function (a `static __global__` kernel, a `static` launcher
/// that picks the grid, then this host function) live in `common/cuda/<op>.cu`.
#pragma once

#include <cstddef>
#include <cstdint>

/// CUDA's stream type, declared opaquely: `cudaStream_t` is `CUstream_st*`.
struct CUstream_st;
/// cuBLAS's handle type, declared opaquely: `cublasHandle_t` is `cublasContext*`.
struct cublasContext;

namespace attn::cuda {

/// A CUDA stream as a plain pointer type; converts to and from `cudaStream_t`.
using stream_t = CUstream_st*;

/// A cuBLAS handle with its math mode: plain fp32 (the default, numbers close to the CPU's
/// OpenBLAS) or TF32 tensor cores (10-bit mantissa inputs, fp32 accumulation: several
/// times faster on Ampere and Hopper, with relative errors around 1e-3 per product).
class Blas {
public:
    /// Creates the handle. @param tf32 whether cuBLAS may use TF32 tensor cores
    explicit Blas(bool tf32 = false);
    ~Blas();
    Blas(const Blas&) = delete;             ///< owns a handle: not copyable
    Blas& operator=(const Blas&) = delete;  ///< owns a handle: not copyable
    /// The cuBLAS handle. @return the handle, bound to the stream of the last call
    cublasContext* handle() const { return handle_; }
    /// Whether TF32 tensor cores are allowed. @return the math mode chosen at construction
    bool tf32() const { return tf32_; }
    /// Points the handle at a stream (cuBLAS enqueues on it from then on).
    /// @param stream the stream
    void set_stream(stream_t stream);

private:
    cublasContext* handle_ = nullptr;
    bool tf32_ = false;
};

/// Rows per partial sum in the deterministic column reductions (bias and LayerNorm weight
/// gradients): every reduction sums in a fixed order, so two runs give the same bits.
constexpr int reduce_rows_per_chunk = 256;

/// Floats of scratch space that a column reduction over N rows of `cols` columns needs.
/// @param N rows @param cols columns @return the scratch size in floats
inline std::size_t column_reduce_scratch(int N, int cols) {
    return static_cast<std::size_t>((N + reduce_rows_per_chunk - 1) / reduce_rows_per_chunk) *
           static_cast<std::size_t>(cols);
}

/// `out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]`, as attn::encoder_forward.
/// @param out (B, T, C) @param inp (B, T) token ids in [0, V) @param wte (V, C)
/// @param wpe (block_size, C) @param B batch @param T time @param C channels
/// @param stream the stream
void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                     int C, stream_t stream);

/// Backward of encoder_forward, as attn::encoder_backward. Deterministic: each (token, channel)
/// of `dwte` is summed by one thread in position order, no atomics. Its cost grows with
/// V·B·T, which suits the course's character vocabularies (V ≈ 65), not GPT-2's 50257 (any
/// V works: the token ids run along the grid's x axis, not y, which stops at 65 535).
/// @param dwte (V, C) accumulated @param dwpe (block_size, C) accumulated @param dout (B, T, C)
/// @param inp (B, T) @param B batch @param T time @param C channels @param V vocabulary size
/// @param stream the stream
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T,
                      int C, int V, stream_t stream);

/// LayerNorm over the last axis (ε = 1e-5), as attn::layernorm_forward; one warp per row.
/// @param out (B, T, C) @param mean (B, T) @param rstd (B, T) @param inp (B, T, C)
/// @param weight (C) @param bias (C) or nullptr @param B batch @param T time @param C channels
/// @param stream the stream
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int B, int T, int C, stream_t stream);

/// Backward of layernorm_forward, as attn::layernorm_backward.
/// @param dinp (B, T, C) accumulated @param dweight (C) accumulated
/// @param dbias (C) accumulated, or nullptr @param dout (B, T, C) @param inp (B, T, C)
/// @param weight (C) @param mean (B, T) @param rstd (B, T)
/// @param scratch 2·column_reduce_scratch(B·T, C) floats
/// @param B batch @param T time @param C channels @param stream the stream
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, float* scratch, int B, int T, int C, stream_t stream);

/// `out = inp · weightᵀ + bias` with cuBLAS, as attn::matmul_forward.
/// @param out (N, OC) @param inp (N, C) @param weight (OC, C) @param bias (OC) or nullptr
/// @param N rows @param C input channels @param OC output channels
/// @param blas the cuBLAS context (its stream is set to `stream`) @param stream the stream
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, Blas& blas, stream_t stream);

/// Backward of matmul_forward with cuBLAS, as attn::matmul_backward.
/// @param dinp (N, C) accumulated @param dweight (OC, C) accumulated
/// @param dbias (OC) accumulated, or nullptr @param dout (N, OC) @param inp (N, C)
/// @param weight (OC, C) @param scratch column_reduce_scratch(N, OC) floats (for dbias)
/// @param N rows @param C input channels @param OC output channels
/// @param blas the cuBLAS context @param stream the stream
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, float* scratch, int N, int C, int OC,
                     Blas& blas, stream_t stream);

/// bfloat16 for the products of mixed-precision training, as GPT::set_precision rounds
/// them: `copy[i]` = `x[i]` rounded to bfloat16 (to nearest, ties to even), and `x[i]`
/// replaced by the same value, so that what else reads x (a bias's gradient, attention)
/// reads what the product reads. Values are held as bfloat16's 16-bit patterns.
/// @param x (n) rounded in place @param copy (n) or nullptr (x rounded only)
/// @param n elements @param stream the stream
void round_to_bf16(float* x, std::uint16_t* copy, std::size_t n, stream_t stream);

/// `copy[i]` = `x[i]` as bfloat16 (to nearest, ties to even), x unchanged: exact where x was
/// rounded by round_to_bf16 (the weights' master copy is not). @param copy (n)
/// @param x (n) @param n elements @param stream the stream
void to_bf16(std::uint16_t* copy, const float* x, std::size_t n, stream_t stream);

/// matmul_forward with bfloat16 inputs (cublasGemmEx): the products exact, summed in float32,
/// the bias added in float32. @param out (N, OC) @param inp (N, C) bfloat16
/// @param weight (OC, C) bfloat16 @param bias (OC) float32, or nullptr
/// @param N rows @param C input channels @param OC output channels
/// @param blas the cuBLAS context @param stream the stream
void matmul_forward_bf16(float* out, const std::uint16_t* inp, const std::uint16_t* weight,
                         const float* bias, int N, int C, int OC, Blas& blas, stream_t stream);

/// matmul_backward with bfloat16 inputs: dinp and dweight from the bfloat16 copies of dout,
/// inp and weight (cublasGemmEx, float32 sums), dbias from `dout` in float32 (holding the
/// copy's values: round_to_bf16). @param dinp (N, C) accumulated
/// @param dweight (OC, C) accumulated @param dbias (OC) accumulated, or nullptr
/// @param dout (N, OC) float32 @param dout16 (N, OC) bfloat16 @param inp16 (N, C) bfloat16
/// @param weight16 (OC, C) bfloat16 @param scratch column_reduce_scratch(N, OC) floats
/// @param N rows @param C input channels @param OC output channels
/// @param blas the cuBLAS context @param stream the stream
void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                          const std::uint16_t* dout16, const std::uint16_t* inp16,
                          const std::uint16_t* weight16, float* scratch, int N, int C, int OC,
                          Blas& blas, stream_t stream);

/// The device buffers that attention needs besides its inputs and outputs. The
/// materialised version uses q, k, v, y and scores; the fused one q, k, v, y and the rest.
struct AttentionScratch {
    float* q = nullptr;       ///< (B, NH, T, hs)
    float* k = nullptr;       ///< (B, NH, T, hs)
    float* v = nullptr;       ///< (B, NH, T, hs)
    float* y = nullptr;       ///< (B, NH, T, hs) heads' outputs before merging (dy in backward)
    float* scores = nullptr;  ///< (B, NH, T, T) pre-softmax scores (their gradient in backward)
    float* dy = nullptr;      ///< fused: (B, NH, T, hs) the output's gradient, split into heads
    float* dq = nullptr;      ///< fused: (B, NH, T, hs)
    float* dk = nullptr;      ///< fused: (B, NH, T, hs)
    float* dv = nullptr;      ///< fused: (B, NH, T, hs)
    float* delta = nullptr;   ///< fused: (B, NH, T) the backward's row sums dO · O
};

/// Floats in each AttentionScratch buffer: the head-major tensors and the scores.
/// @param B batch @param T time @param C channels
/// @return B·T·C (q, k, v, y each)
inline std::size_t attention_scratch_heads(int B, int T, int C) {
    return static_cast<std::size_t>(B) * T * C;
}

/// Multi-head attention, materialised, as attn::attention_forward: the heads are split
/// into (B, NH, T, hs), the scores come from one batched cuBLAS product, a warp per row
/// takes the (causal) softmax, a second batched product blends the values.
/// @param out (B, T, C) @param att (B, NH, T, T) softmax weights, zero above the diagonal
///        when causal
/// @param att_dropped (B, NH, T, T) weights after dropout; used when dropout_p > 0
/// @param qkv (B, T, 3C) @param dropout_p dropout probability (0: none)
/// @param seed the dropout mask's seed (dropout_mask.hpp: the CPU model's masks)
/// @param scratch the working buffers @param B batch @param T time @param C channels
/// @param NH heads @param blas the cuBLAS context @param stream the stream
/// @param causal false attends to every position, future ones included (no mask)
/// @param scaled false leaves out the 1/√hs (scores q·kᵀ as they are)
void attention_forward(float* out, float* att, float* att_dropped, const float* qkv,
                       float dropout_p, std::uint64_t seed, const AttentionScratch& scratch,
                       int B, int T, int C, int NH, Blas& blas, stream_t stream,
                       bool causal = true, bool scaled = true);

/// Backward of attention_forward, as attn::attention_backward.
/// @param dqkv (B, T, 3C) accumulated @param dout (B, T, C) @param qkv (B, T, 3C)
/// @param att (B, NH, T, T) @param att_dropped (B, NH, T, T) when dropout_p > 0
/// @param dropout_p the forward pass's dropout probability
/// @param scratch the working buffers (the forward pass's q, k, v must still be in it)
/// @param B batch @param T time @param C channels @param NH heads
/// @param blas the cuBLAS context @param stream the stream
/// @param causal as given to attention_forward @param scaled as given to attention_forward
void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const float* att_dropped, float dropout_p, const AttentionScratch& scratch,
                        int B, int T, int C, int NH, Blas& blas, stream_t stream,
                        bool causal = true, bool scaled = true);

/// Multi-head attention with lesson 13's fused kernels (attention.hpp): the same function
/// as attention_forward, dropout masks included (same seed, same masks), but the (T, T)
/// weights are never stored; each row's log-sum-exp is kept for the backward pass. Head
/// size 64 or 128; the scores are always scaled by 1/√hs.
/// @param out (B, T, C) @param lse (B, NH, T) written @param qkv (B, T, 3C)
/// @param dropout_p dropout probability on the weights (0: none) @param seed the masks' seed
/// @param scratch the working buffers (q, k, v, y used) @param B batch @param T time
/// @param C channels @param NH heads @param stream the stream
/// @param causal false attends to every position, future ones included (no mask)
/// @throws std::invalid_argument for a head size the kernels do not support
void fused_attention_forward(float* out, float* lse, const float* qkv, float dropout_p,
                             std::uint64_t seed, const AttentionScratch& scratch, int B, int T,
                             int C, int NH, stream_t stream, bool causal = true);

/// Backward of fused_attention_forward: recomputes the weights tile by tile from `lse`.
/// @param dqkv (B, T, 3C) accumulated @param dout (B, T, C) @param qkv (B, T, 3C)
/// @param out (B, T, C) the forward's output @param lse (B, NH, T) the forward's log-sum-exp
/// @param dropout_p the forward pass's dropout probability
/// @param seed the forward pass's mask seed (its masks are regenerated from it)
/// @param scratch the working buffers (all but scores) @param B batch @param T time
/// @param C channels @param NH heads @param stream the stream
/// @param causal as given to fused_attention_forward
void fused_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, float dropout_p, std::uint64_t seed,
                              const AttentionScratch& scratch, int B, int T, int C, int NH,
                              stream_t stream, bool causal = true);

/// One new token's attention over one layer's cached keys and values, as
/// attn::attention_step_forward (lesson 14): per head h, softmax(q_h · K_hᵀ/√hs) over the T
/// cached positions blends V_h. One block per head.
/// @param out (C) the heads' outputs side by side @param q (C) the token's query (the
/// first C values of its c_attn output) @param key_cache (NH, capacity, hs)
/// @param value_cache (NH, capacity, hs) @param T positions to attend over (the new one
/// included), 1 ≤ T ≤ capacity and T ≤ 12256 (its weights stay in 48 KiB of shared memory)
/// @param capacity rows per head in the caches @param C channels @param NH heads
/// @param stream the stream
/// @throws std::invalid_argument for sizes outside those bounds
void cached_attention_forward(float* out, const float* q, const float* key_cache,
                              const float* value_cache, int T, int capacity, int C, int NH,
                              stream_t stream);

/// Exact GELU with erff, as attn::gelu_forward.
/// @param out (N) @param inp (N) @param N elements @param stream the stream
void gelu_forward(float* out, const float* inp, std::size_t N, stream_t stream);

/// Backward of gelu_forward, as attn::gelu_backward.
/// @param dinp (N) accumulated @param inp (N) @param dout (N) @param N elements
/// @param stream the stream
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t N,
                   stream_t stream);

/// `out = inp1 + inp2`, as attn::residual_forward.
/// @param out (N) @param inp1 (N) @param inp2 (N) @param N elements @param stream the stream
void residual_forward(float* out, const float* inp1, const float* inp2, std::size_t N,
                      stream_t stream);

/// Backward of residual_forward, as attn::residual_backward.
/// @param dinp1 (N) accumulated @param dinp2 (N) accumulated @param dout (N)
/// @param N elements @param stream the stream
void residual_backward(float* dinp1, float* dinp2, const float* dout, std::size_t N,
                       stream_t stream);

/// Inverted dropout in place, the mask drawn from a counter-based hash of (seed, index), so
/// that the backward pass recomputes it instead of storing it: the CPU's dropout_forward
/// draws the same mask from the same seed (dropout_mask.hpp).
/// @param x (N) changed in place @param p probability of zeroing, in [0, 1)
/// @param seed the mask's seed @param N elements @param stream the stream
void dropout_forward(float* x, float p, std::uint64_t seed, std::size_t N, stream_t stream);

/// Backward of dropout_forward with the same seed: `dx *= mask`.
/// @param dx (N) changed in place @param p probability @param seed the forward pass's seed
/// @param N elements @param stream the stream
void dropout_backward(float* dx, float p, std::uint64_t seed, std::size_t N, stream_t stream);

/// Softmax and cross-entropy, as attn::crossentropy_forward, one block per row; the mean
/// loss is summed in a fixed order (in double) into `mean_loss` on the device.
/// @param probs (B, T, V) @param losses (B, T) @param mean_loss (1) the mean over B·T
/// @param logits (B, T, V) @param targets (B, T) @param B batch @param T time
/// @param V vocabulary @param stream the stream
void crossentropy_forward(float* probs, float* losses, float* mean_loss, const float* logits,
                          const int* targets, int B, int T, int V, stream_t stream);

/// Backward of the mean cross-entropy, as attn::crossentropy_backward.
/// @param dlogits (B, T, V) accumulated @param probs (B, T, V) @param targets (B, T)
/// @param B batch @param T time @param V vocabulary @param stream the stream
void crossentropy_backward(float* dlogits, const float* probs, const int* targets, int B, int T,
                           int V, stream_t stream);

/// One AdamW update of `n` parameters, operation for operation as attn::AdamW::step.
/// @param params (n) updated @param grads (n) @param m (n) first moment, updated
/// @param v (n) second moment, updated @param n elements
/// @param lr learning rate @param beta1 first-moment decay @param beta2 second-moment decay
/// @param eps added to √v̂ @param weight_decay decoupled decay (0 for tensors not decayed)
/// @param step the step number, counted from 1 @param stream the stream
void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, long step,
                  stream_t stream);

/// The global L2 norm of `n` gradients into `norm` on the device (summed in double, in a
/// fixed order), then, by attn::clip_grad_norm's rule, the gradients scaled by
/// max_norm / (norm + 1e-6) when that is below one, the norm is finite and max_norm > 0.
/// No host synchronisation.
/// @param grads (n) scaled in place @param norm (1) receives the norm before clipping
/// @param scratch clip_scratch_size() doubles' worth of floats
/// @param n elements @param max_norm the largest allowed norm (≤ 0: measure, do not clip)
/// @param stream the stream
void clip_grad_norm(float* grads, float* norm, float* scratch, std::size_t n, float max_norm,
                    stream_t stream);

/// Floats of scratch space that clip_grad_norm needs. @return the size in floats
std::size_t clip_scratch_size();

}  // namespace attn::cuda
