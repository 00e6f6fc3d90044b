// Multi-head attention on the GPU, causal or not, materialised (the (T, T) weights are
// stored), forward and backward (mirrors attn::attention_*). Batched cuBLAS products over
// the B·NH heads, a warp per row for the (causal) softmax and its backward.
//
// Row-major (T, hs) per head is column-major (hs, T); the batched products are written for
// those column-major views, as llm.c's attention does.
#include "attn/cuda/attention.hpp"
#include "kernels.cuh"

#include <cmath>
#include <initializer_list>

namespace attn::cuda {
namespace {
using detail::ceil_div;
using detail::warp_size;
constexpr int rows_per_block = 8;  // softmax: one warp per row

// qkv (B, T, 3, NH, hs) → q, k, v (B, NH, T, hs); one thread per element of q.
__global__ void split_heads_kernel(float* q, float* k, float* v, const float* qkv, int B, int T,
                                   int NH, int hs) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int C = NH * hs;
    if (i >= static_cast<std::size_t>(B) * T * C) return;
    const int d = static_cast<int>(i % hs);
    const int t = static_cast<int>((i / hs) % T);
    const int h = static_cast<int>((i / (static_cast<std::size_t>(hs) * T)) % NH);
    const int b = static_cast<int>(i / (static_cast<std::size_t>(hs) * T * NH));
    const std::size_t src = (static_cast<std::size_t>(b) * T + t) * 3 * C + h * hs + d;
    q[i] = qkv[src];
    k[i] = qkv[src + C];
    v[i] = qkv[src + 2 * C];
}

// y (B, NH, T, hs) → out (B, T, C), heads side by side; `accumulate` adds instead.
__global__ void merge_heads_kernel(float* out, int out_stride, const float* y, int B, int T,
                                   int NH, int hs, bool accumulate) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<std::size_t>(B) * T * NH * hs) return;
    const int d = static_cast<int>(i % hs);
    const int t = static_cast<int>((i / hs) % T);
    const int h = static_cast<int>((i / (static_cast<std::size_t>(hs) * T)) % NH);
    const int b = static_cast<int>(i / (static_cast<std::size_t>(hs) * T * NH));
    const std::size_t dst = (static_cast<std::size_t>(b) * T + t) * out_stride + h * hs + d;
    out[dst] = accumulate ? out[dst] + y[i] : y[i];
}

// out (B, T, C) → y (B, NH, T, hs) with the row stride of `inp` given.
__global__ void gather_heads_kernel(float* y, const float* inp, int inp_stride, int B, int T,
                                    int NH, int hs) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<std::size_t>(B) * T * NH * hs) return;
    const int d = static_cast<int>(i % hs);
    const int t = static_cast<int>((i / hs) % T);
    const int h = static_cast<int>((i / (static_cast<std::size_t>(hs) * T)) % NH);
    const int b = static_cast<int>(i / (static_cast<std::size_t>(hs) * T * NH));
    y[i] = inp[(static_cast<std::size_t>(b) * T + t) * inp_stride + h * hs + d];
}

// Launchers of the three reshapes above, one thread per element of (B, T, C).
constexpr int reshape_block = 256;
unsigned int reshape_grid(int B, int T, int NH, int hs) {
    return ceil_div(static_cast<std::size_t>(B) * T * NH * hs, reshape_block);
}
void split_heads(const AttentionScratch& s, const float* qkv, int B, int T, int NH, int hs,
                 cudaStream_t stream) {
    ATTN_LAUNCH(split_heads_kernel, reshape_grid(B, T, NH, hs), reshape_block, 0, stream)(s.q, s.k, s.v, qkv,
                                                                                B, T, NH, hs);
    CUDA_CHECK(cudaGetLastError());
}
void merge_heads(float* out, int out_stride, const float* y, int B, int T, int NH, int hs,
                 bool accumulate, cudaStream_t stream) {
    ATTN_LAUNCH(merge_heads_kernel, reshape_grid(B, T, NH, hs), reshape_block, 0, stream)(
        out, out_stride, y, B, T, NH, hs, accumulate);
    CUDA_CHECK(cudaGetLastError());
}
void gather_heads(float* y, const float* inp, int inp_stride, int B, int T, int NH, int hs,
                  cudaStream_t stream) {
    ATTN_LAUNCH(gather_heads_kernel, reshape_grid(B, T, NH, hs), reshape_block, 0, stream)(
        y, inp, inp_stride, B, T, NH, hs);
    CUDA_CHECK(cudaGetLastError());
}

// One warp per row t of one head's scores (already scaled): the causal softmax over
// columns 0..t, zeros above the diagonal (without the mask: over every column); with
// dropout, the dropped copy too.
__global__ void causal_softmax_kernel(float* att, float* att_dropped, const float* scores,
                                      int rows, int T, bool causal, float dropout_p,
                                      std::uint64_t seed) {
    const int row = blockIdx.x * rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= rows) return;
    const int t = causal ? row % T : T - 1;  // the last column the row attends to
    const std::size_t off = static_cast<std::size_t>(row) * T;
    const float* s = scores + off;
    float maxval = -INFINITY;
    for (int j = lane; j <= t; j += warp_size) maxval = fmaxf(maxval, s[j]);
    maxval = detail::warp_max(maxval);
    float sum = 0.0f;
    for (int j = lane; j <= t; j += warp_size) sum += expf(s[j] - maxval);
    const float inv = 1.0f / detail::warp_sum(sum);
    const float keep_scale = dropout_p > 0.0f ? 1.0f / (1.0f - dropout_p) : 1.0f;
    for (int j = lane; j < T; j += warp_size) {
        const float a = j <= t ? expf(s[j] - maxval) * inv : 0.0f;
        att[off + j] = a;
        if (dropout_p > 0.0f) {
            const bool drop = dropout_uniform(seed, off + j) < dropout_p;
            att_dropped[off + j] = drop ? 0.0f : a * keep_scale;
        }
    }
}

// forward: weights = att·mask; att[t, :t+1] = softmax(scores[t, :t+1])
// dscores[t, j] = att[t, j]·(datt[t, j] − Σ_k att[t, k]·datt[t, k]), in place over datt.
// With dropout, datt first goes through the mask, read back from the dropped weights as
// the CPU does (a kept weight is nonzero unless att is, where the product is zero anyway).
__global__ void causal_softmax_backward_kernel(float* datt, const float* att,
                                               const float* att_dropped, int rows, int T,
                                               bool causal, float dropout_p) {
    const int row = blockIdx.x * rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= rows) return;
    const int t = causal ? row % T : T - 1;  // the last column the row attended to
    const std::size_t off = static_cast<std::size_t>(row) * T;
    const float keep_scale = dropout_p > 0.0f ? 1.0f / (1.0f - dropout_p) : 1.0f;
    float dot = 0.0f;
    for (int j = lane; j <= t; j += warp_size) {
        float d = datt[off + j];
        if (dropout_p > 0.0f) d = att_dropped[off + j] != 0.0f ? d * keep_scale : 0.0f;
        dot += att[off + j] * d;
    }
    dot = detail::warp_sum(dot);
    for (int j = lane; j < T; j += warp_size) {
        float d = datt[off + j];
        if (dropout_p > 0.0f) d = att_dropped[off + j] != 0.0f ? d * keep_scale : 0.0f;
        // masked positions: their scores never reached the output
        datt[off + j] = j <= t ? att[off + j] * (d - dot) : 0.0f;
    }
}

// dqkv (B, T, 3C) += dq, dk, dv (each (B, NH, T, hs)), each in its third.
void add_head_gradients(float* dqkv, const float* dq, const float* dk, const float* dv, int B,
                        int T, int NH, int hs, cudaStream_t stream) {
    const int C = NH * hs;
    int third = 0;
    for (const float* d : {dq, dk, dv}) {
        merge_heads(dqkv + C * third++, 3 * C, d, B, T, NH, hs, true, stream);
    }
}

// The (B, NH, T, hs) shape of the fused kernels.
AttentionShape heads_shape(int B, int T, int NH, int hs, bool causal) {
    AttentionShape shape;
    shape.B = static_cast<std::size_t>(B);
    shape.NH = static_cast<std::size_t>(NH);
    shape.T = static_cast<std::size_t>(T);
    shape.hs = static_cast<std::size_t>(hs);
    shape.causal = causal;
    return shape;
}

// The factor on the scores: 1/√hs, or 1 for a model trained without it.
float score_scale(int hs, bool scaled) {
    return scaled ? 1.0f / std::sqrt(static_cast<float>(hs)) : 1.0f;
}

void check_sizes(int C, int NH) {
    if (NH <= 0 || C % NH != 0) {
        throw std::invalid_argument("attention: C = " + std::to_string(C) +
                                    " must be a multiple of NH = " + std::to_string(NH));
    }
}

void launch_attention_forward(float* out, float* att, float* att_dropped, const float* qkv,
                              float dropout_p, std::uint64_t seed, const AttentionScratch& s,
                              int B, int T, int C, int NH, Blas& blas, cudaStream_t stream,
                              bool causal, bool scaled) {
    check_sizes(C, NH);
    const int hs = C / NH;
    split_heads(s, qkv, B, T, NH, hs, stream);

    blas.set_stream(stream);
    const float scale = score_scale(hs, scaled), one = 1.0f, zero = 0.0f;
    const long long head = static_cast<long long>(T) * hs, square = static_cast<long long>(T) * T;
    // scores (T, T) = scale · q · kᵀ per head; column-major: scoresᵀ = scale · k'ᵀ · q'
    CUBLAS_CHECK(cublasSgemmStridedBatched(blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs,
                                           &scale, s.k, hs, head, s.q, hs, head, &zero, s.scores,
                                           T, square, B * NH));
    const int rows = B * NH * T;
    ATTN_LAUNCH(causal_softmax_kernel, ceil_div(rows, rows_per_block), rows_per_block * warp_size, 0,
                            stream)(att, att_dropped, s.scores, rows, T, causal, dropout_p, seed);
    CUDA_CHECK(cudaGetLastError());
    const float* weights = dropout_p > 0.0f ? att_dropped : att;
    // y (T, hs) = weights (T, T) · v (T, hs); column-major: y' = v' · weights'
    CUBLAS_CHECK(cublasSgemmStridedBatched(blas.handle(), CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &one,
                                           s.v, hs, head, weights, T, square, &zero, s.y, hs,
                                           head, B * NH));
    merge_heads(out, C, s.y, B, T, NH, hs, false, stream);
}

void launch_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                               const float* att_dropped, float dropout_p,
                               const AttentionScratch& s, int B, int T, int C, int NH, Blas& blas,
                               cudaStream_t stream, bool causal, bool scaled) {
    check_sizes(C, NH);
    const int hs = C / NH;
    // q, k, v of this layer again (a later layer's forward pass reused the buffers), and
    // dout split into heads: dy (B, NH, T, hs) in s.y.
    split_heads(s, qkv, B, T, NH, hs, stream);
    gather_heads(s.y, dout, C, B, T, NH, hs, stream);

    blas.set_stream(stream);
    const float scale = score_scale(hs, scaled), one = 1.0f, zero = 0.0f;
    const long long head = static_cast<long long>(T) * hs, square = static_cast<long long>(T) * T;
    const float* weights = dropout_p > 0.0f ? att_dropped : att;
    float* datt = s.scores;  // (B, NH, T, T)
    // forward: y = weights · v
    // dweights (T, T) = dy · vᵀ; column-major: dweightsᵀ = v'ᵀ · dy'
    CUBLAS_CHECK(cublasSgemmStridedBatched(blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &one,
                                           s.v, hs, head, s.y, hs, head, &zero, datt, T, square,
                                           B * NH));
    // dv (T, hs) = weightsᵀ · dy; column-major: dv' = dy' · weights'ᵀ. v is no longer
    // needed, so dv takes its buffer.
    float* dv = s.v;
    CUBLAS_CHECK(cublasSgemmStridedBatched(blas.handle(), CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &one,
                                           s.y, hs, head, weights, T, square, &zero, dv, hs, head,
                                           B * NH));
    const int rows = B * NH * T;
    ATTN_LAUNCH(causal_softmax_backward_kernel, ceil_div(rows, rows_per_block), rows_per_block * warp_size,
                                     0, stream)(datt, att, att_dropped, rows, T, causal, dropout_p);
    CUDA_CHECK(cudaGetLastError());
    // forward: scores = scale · q · kᵀ
    // dq (T, hs) = scale · dscores · k; column-major: dq' = scale · k' · dscores'. dy is no
    // longer needed: dq takes its buffer.
    float* dq = s.y;
    CUBLAS_CHECK(cublasSgemmStridedBatched(blas.handle(), CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T,
                                           &scale, s.k, hs, head, datt, T, square, &zero, dq, hs,
                                           head, B * NH));
    // dk (T, hs) = scale · dscoresᵀ · q; column-major: dk' = scale · q' · dscores'ᵀ; k was
    // last read by the product above (same stream), so dk takes its buffer.
    float* dk = s.k;
    CUBLAS_CHECK(cublasSgemmStridedBatched(blas.handle(), CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T,
                                           &scale, s.q, hs, head, datt, T, square, &zero, dk, hs,
                                           head, B * NH));
    add_head_gradients(dqkv, dq, dk, dv, B, T, NH, hs, stream);
}
}  // namespace

void fused_attention_forward(float* out, float* lse, const float* qkv, float dropout_p,
                             std::uint64_t seed, const AttentionScratch& s, int B, int T, int C,
                             int NH, stream_t stream, bool causal) {
    check_sizes(C, NH);
    const int hs = C / NH;
    split_heads(s, qkv, B, T, NH, hs, stream);
    const AttentionShape shape = heads_shape(B, T, NH, hs, causal);
    flash_attention_forward(s.y, lse, s.q, s.k, s.v, shape, stream, {dropout_p, seed});
    merge_heads(out, C, s.y, B, T, NH, hs, false, stream);
}

void fused_attention_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, float dropout_p, std::uint64_t seed,
                              const AttentionScratch& s, int B, int T, int C, int NH,
                              stream_t stream, bool causal) {
    check_sizes(C, NH);
    const int hs = C / NH;
    // This layer's q, k, v and output again (later layers reused the buffers), and dout,
    // all split into heads.
    split_heads(s, qkv, B, T, NH, hs, stream);
    gather_heads(s.y, out, C, B, T, NH, hs, stream);
    gather_heads(s.dy, dout, C, B, T, NH, hs, stream);
    const AttentionShape shape = heads_shape(B, T, NH, hs, causal);
    flash_attention_backward(s.dq, s.dk, s.dv, s.delta, s.dy, s.q, s.k, s.v, s.y, lse, shape,
                             stream, {dropout_p, seed});
    add_head_gradients(dqkv, s.dq, s.dk, s.dv, B, T, NH, hs, stream);
}

void attention_forward(float* out, float* att, float* att_dropped, const float* qkv,
                       float dropout_p, std::uint64_t seed, const AttentionScratch& scratch,
                       int B, int T, int C, int NH, Blas& blas, stream_t stream, bool causal,
                       bool scaled) {
    launch_attention_forward(out, att, att_dropped, qkv, dropout_p, seed, scratch, B, T, C, NH,
                             blas, stream, causal, scaled);
}

void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* att,
                        const float* att_dropped, float dropout_p, const AttentionScratch& scratch,
                        int B, int T, int C, int NH, Blas& blas, stream_t stream, bool causal,
                        bool scaled) {
    launch_attention_backward(dqkv, dout, qkv, att, att_dropped, dropout_p, scratch, B, T, C, NH,
                              blas, stream, causal, scaled);
}

}  // namespace attn::cuda
