// Plain attention on the GPU: the (B, NH, T, T) matrix is written to device memory.
//
//   forward:  att = scale · q kᵀ           cuBLAS, one strided batch over B·NH heads
//             att = softmax(att), masked   softmax_forward_kernel, one warp per row
//             out = att v                  cuBLAS
//   backward: dv   = attᵀ dout             cuBLAS
//             datt = dout vᵀ               cuBLAS
//             datt = scale · att ∘ (datt − rowsum(att ∘ datt))   softmax_backward_kernel
//             dq   = datt k,  dk = dattᵀ q cuBLAS
//
// cuBLAS is column-major; a row-major (m, n) buffer is a column-major (n, m) matrix, so
// row-major C = A Bᵀ is computed as column-major Cᵀ = B Aᵀ. Each gemm below says which
// row-major product it is. cuBLAS's default math mode is full float32 (no TF32), which the
// comparisons against float64 rely on.
#include "attn/cuda/attention.hpp"
#include "kernels.cuh"

#include <cmath>
#include <string>

namespace attn::cuda {

namespace {

using detail::require;
using detail::warp_max;
using detail::warp_sum;

// One cuBLAS handle for the process, made on first use (it lives until exit).
cublasHandle_t cublas_handle() {
    static cublasHandle_t handle = [] {
        cublasHandle_t h = nullptr;
        CUBLAS_CHECK(cublasCreate(&h));
        return h;
    }();
    return handle;
}

constexpr int kWarpsPerBlock = 8;

// att (rows, T), rows = B·NH·T, in place: each row's softmax over its visible keys (0..i
// for query i when causal), masked entries set to exactly 0. One warp per row.
static __global__ void softmax_forward_kernel(float* att, long long rows, int T, bool causal) {
    const long long row = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = static_cast<int>(threadIdx.x % 32);
    if (row >= rows) return;  // a whole warp leaves together: the shuffles stay full
    float* x = att + row * T;
    const int visible = causal ? static_cast<int>(row % T) + 1 : T;
    float m = -INFINITY;
    for (int j = lane; j < visible; j += 32) m = fmaxf(m, x[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j < visible; j += 32) sum += expf(x[j] - m);
    const float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += 32) x[j] = j < visible ? expf(x[j] - m) * inv : 0.0f;
}

// datt (rows, T) holds dP on entry and scale · dS on exit:
// P = softmax(S)  →  dS_ij = P_ij (dP_ij − Σ_k P_ik dP_ik). One warp per row.
static __global__ void softmax_backward_kernel(float* datt, const float* att, long long rows,
                                               int T, bool causal, float scale) {
    const long long row = static_cast<long long>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = static_cast<int>(threadIdx.x % 32);
    if (row >= rows) return;
    float* dx = datt + row * T;
    const float* p = att + row * T;
    const int visible = causal ? static_cast<int>(row % T) + 1 : T;
    float dot = 0.0f;
    for (int j = lane; j < visible; j += 32) dot += p[j] * dx[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32) dx[j] = j < visible ? scale * p[j] * (dx[j] - dot) : 0.0f;
}

void launch_softmax_forward(float* att, const AttentionShape& s, cudaStream_t stream) {
    const long long rows = static_cast<long long>(s.B * s.NH * s.T);
    const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    ATTN_LAUNCH(softmax_forward_kernel, blocks, kWarpsPerBlock * 32, 0, stream)(
        att, rows, static_cast<int>(s.T), s.causal);
    CUDA_CHECK(cudaGetLastError());
}

void launch_softmax_backward(float* datt, const float* att, const AttentionShape& s,
                             float scale, cudaStream_t stream) {
    const long long rows = static_cast<long long>(s.B * s.NH * s.T);
    const unsigned blocks = static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
    ATTN_LAUNCH(softmax_backward_kernel, blocks, kWarpsPerBlock * 32, 0, stream)(
        datt, att, rows, static_cast<int>(s.T), s.causal, scale);
    CUDA_CHECK(cudaGetLastError());
}

// Row-major, per head: C (T, T) = alpha · A (T, hs) · B (T, hs)ᵀ.
void gemm_abt(float* c, const float* a, const float* b, float alpha, const AttentionShape& s,
              cudaStream_t stream) {
    const int T = static_cast<int>(s.T), hs = static_cast<int>(s.hs);
    const float beta = 0.0f;
    CUBLAS_CHECK(cublasSetStream(cublas_handle(), stream));
    // C_cm(j, i) = Σ_d b[j][d] a[i][d]: B read as column-major (hs, T), transposed; A as (hs, T)
    CUBLAS_CHECK(cublasSgemmStridedBatched(
        cublas_handle(), CUBLAS_OP_T, CUBLAS_OP_N, T, T, hs, &alpha, b, hs,
        static_cast<long long>(s.T * s.hs), a, hs, static_cast<long long>(s.T * s.hs), &beta, c,
        T, static_cast<long long>(s.T * s.T), static_cast<int>(s.B * s.NH)));
}

// Row-major, per head: C (T, hs) = A (T, T) · B (T, hs).
void gemm_ab(float* c, const float* a, const float* b, const AttentionShape& s,
             cudaStream_t stream) {
    const int T = static_cast<int>(s.T), hs = static_cast<int>(s.hs);
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasSetStream(cublas_handle(), stream));
    // C_cm(d, i) = Σ_j b[j][d] a[i][j]: B as column-major (hs, T), A as column-major (T, T)
    CUBLAS_CHECK(cublasSgemmStridedBatched(
        cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_N, hs, T, T, &alpha, b, hs,
        static_cast<long long>(s.T * s.hs), a, T, static_cast<long long>(s.T * s.T), &beta, c, hs,
        static_cast<long long>(s.T * s.hs), static_cast<int>(s.B * s.NH)));
}

// Row-major, per head: C (T, hs) = A (T, T)ᵀ · B (T, hs).
void gemm_atb(float* c, const float* a, const float* b, const AttentionShape& s,
              cudaStream_t stream) {
    const int T = static_cast<int>(s.T), hs = static_cast<int>(s.hs);
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasSetStream(cublas_handle(), stream));
    // C_cm(d, j) = Σ_i b[i][d] a[i][j]: A read as column-major (T, T) is Aᵀ, so transpose it
    CUBLAS_CHECK(cublasSgemmStridedBatched(
        cublas_handle(), CUBLAS_OP_N, CUBLAS_OP_T, hs, T, T, &alpha, b, hs,
        static_cast<long long>(s.T * s.hs), a, T, static_cast<long long>(s.T * s.T), &beta, c, hs,
        static_cast<long long>(s.T * s.hs), static_cast<int>(s.B * s.NH)));
}

void check_shape_for_gpu(const AttentionShape& s) {
    check_attention_shape(s);
    require(s.B * s.NH <= 65535 && s.T <= (1u << 30) && s.hs <= 4096,
            "attention on the GPU: B·NH must be at most 65535 and T, hs of int size");
}

}  // namespace

std::size_t plain_attention_scratch_floats(const AttentionShape& s) {
    return s.B * s.NH * s.T * s.T;
}

void plain_attention_forward(float* out, float* att, const float* q, const float* k,
                             const float* v, const AttentionShape& s, void* stream) {
    check_shape_for_gpu(s);
    const auto st = static_cast<cudaStream_t>(stream);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
    gemm_abt(att, q, k, scale, s, st);  // att = scale · q kᵀ   (T, T) per head
    launch_softmax_forward(att, s, st); // att = softmax(att), masked
    gemm_ab(out, att, v, s, st);        // out = att v          (T, hs) per head
}

void plain_attention_backward(float* dq, float* dk, float* dv, float* datt, const float* dout,
                              const float* q, const float* k, const float* v, const float* att,
                              const AttentionShape& s, void* stream) {
    check_shape_for_gpu(s);
    const auto st = static_cast<cudaStream_t>(stream);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
    gemm_atb(dv, att, dout, s, st);              // out = att v      →  dv = attᵀ dout
    gemm_abt(datt, dout, v, 1.0f, s, st);        //                   datt = dout vᵀ
    launch_softmax_backward(datt, att, s, scale, st);  // datt = scale · dS
    gemm_ab(dq, datt, k, s, st);                 // S = scale q kᵀ   →  dq = scale dS k
    gemm_atb(dk, datt, q, s, st);                //                   dk = scale dSᵀ q
}

}  // namespace attn::cuda
