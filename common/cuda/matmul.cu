// Linear layers on the GPU with cuBLAS, forward and backward (mirrors attn::matmul_*).
//
// cuBLAS is column-major and the course's buffers are row-major: a row-major (R, K) matrix
// is the column-major (K, R) matrix, its transpose. So every product below is written for
// the transposed buffers, as llm.c does.
#include "kernels.cuh"

#include <cuda_bf16.h>

namespace attn::cuda {

Blas::Blas(bool tf32) : tf32_(tf32) {
    cublasHandle_t h = nullptr;
    CUBLAS_CHECK(cublasCreate(&h));
    handle_ = h;
    // TF32 rounds the inputs of each product to a 10-bit mantissa and accumulates in fp32.
    CUBLAS_CHECK(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
}

Blas::~Blas() {
    if (handle_) cublasDestroy(handle_);  // a destructor must not throw; nothing to report to
}

void Blas::set_stream(stream_t stream) { CUBLAS_CHECK(cublasSetStream(handle_, stream)); }

namespace {
using detail::ceil_div;

// out[n, o] += bias[o]; one thread per element of out (N, OC).
__global__ void add_bias_kernel(float* out, const float* bias, int N, int OC) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<std::size_t>(N) * OC) return;
    out[i] += bias[i % OC];
}

// dbias[o] += Σ_n dout[n, o], first pass: partial sums per chunk of rows, (chunks, OC).
__global__ void bias_backward_partial_kernel(float* partial, const float* dout, int N, int OC) {
    detail::column_partial(
        partial, [=](int row, int col) { return dout[static_cast<std::size_t>(row) * OC + col]; },
        N, OC);
}

// out[n, o] += bias[o], when there is a bias.
void add_bias(float* out, const float* bias, int N, int OC, cudaStream_t stream) {
    if (!bias) return;
    const std::size_t n = static_cast<std::size_t>(N) * OC;
    ATTN_LAUNCH(add_bias_kernel, ceil_div(n, 256), 256, 0, stream)(out, bias, N, OC);
    CUDA_CHECK(cudaGetLastError());
}

// dbias[o] += Σ_n dout[n, o], when there is a bias: two deterministic passes.
void bias_backward(float* dbias, const float* dout, float* scratch, int N, int OC, cudaStream_t stream) {
    if (!dbias) return;
    const int chunks = static_cast<int>(ceil_div(N, reduce_rows_per_chunk));
    const dim3 grid(ceil_div(OC, detail::warp_size), chunks);
    const dim3 block(detail::warp_size, detail::colsum_threads_y);
    ATTN_LAUNCH(bias_backward_partial_kernel, grid, block, 0, stream)(scratch, dout, N, OC);
    CUDA_CHECK(cudaGetLastError());
    ATTN_LAUNCH(detail::add_column_partials_kernel<float>, ceil_div(OC, 256), 256, 0, stream)(dbias, scratch,
                                                                              chunks, OC);
    CUDA_CHECK(cudaGetLastError());
}

void launch_matmul_forward(float* out, const float* inp, const float* weight, const float* bias,
                           int N, int C, int OC, Blas& blas, cudaStream_t stream) {
    blas.set_stream(stream);
    const float one = 1.0f, zero = 0.0f;
    // out (N, OC) = inp (N, C) · weightᵀ; column-major: outᵀ (OC, N) = weight'ᵀ · inpᵀ, where
    // the row-major weight (OC, C) is the column-major (C, OC) matrix weight'.
    CUBLAS_CHECK(cublasSgemm(blas.handle(), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, weight, C,
                             inp, C, &zero, out, OC));
    add_bias(out, bias, N, OC, stream);
}

void launch_matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                            const float* inp, const float* weight, float* scratch, int N, int C,
                            int OC, Blas& blas, cudaStream_t stream) {
    blas.set_stream(stream);
    const float one = 1.0f;
    // forward: out = inp · weightᵀ + bias
    // dinp (N, C) += dout (N, OC) · weight (OC, C); column-major: dinpᵀ += weightᵀ' · doutᵀ
    CUBLAS_CHECK(cublasSgemm(blas.handle(), CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, weight, C,
                             dout, OC, &one, dinp, C));
    // dweight (OC, C) += doutᵀ (OC, N) · inp (N, C); column-major: dweightᵀ += inpᵀ · dout
    CUBLAS_CHECK(cublasSgemm(blas.handle(), CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C,
                             dout, OC, &one, dweight, C));
    bias_backward(dbias, dout, scratch, N, OC, stream);
}

// x[i] rounded to bfloat16 (to nearest, ties to even) in place, and into copy[i] when there
// is a copy. One thread per element.
__global__ void round_to_bf16_kernel(float* x, __nv_bfloat16* copy, std::size_t n) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
    if (copy) copy[i] = b;
    x[i] = __bfloat162float(b);
}
// copy[i] = x[i] in bfloat16, x unchanged.
__global__ void to_bf16_kernel(__nv_bfloat16* copy, const float* x, std::size_t n) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    copy[i] = __float2bfloat16_rn(x[i]);
}

// The products of launch_matmul_forward and launch_matmul_backward with bfloat16 inputs:
// cuBLAS's tensor-core path, float32 sums (CUBLAS_COMPUTE_32F) into float32 outputs.
void gemm_bf16(Blas& blas, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
               const std::uint16_t* A, int lda, const std::uint16_t* B, int ldb, float beta, float* C,
               int ldc) {
    const float one = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(blas.handle(), ta, tb, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF,
                              ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
}  // namespace

void round_to_bf16(float* x, std::uint16_t* copy, std::size_t n, stream_t stream) {
    if (n == 0) return;
    ATTN_LAUNCH(round_to_bf16_kernel, ceil_div(n, 256), 256, 0, stream)(
        x, reinterpret_cast<__nv_bfloat16*>(copy), n);
    CUDA_CHECK(cudaGetLastError());
}

void to_bf16(std::uint16_t* copy, const float* x, std::size_t n, stream_t stream) {
    if (n == 0) return;
    ATTN_LAUNCH(to_bf16_kernel, ceil_div(n, 256), 256, 0, stream)(reinterpret_cast<__nv_bfloat16*>(copy), x, n);
    CUDA_CHECK(cudaGetLastError());
}

void matmul_forward_bf16(float* out, const std::uint16_t* inp, const std::uint16_t* weight,
                         const float* bias, int N, int C, int OC, Blas& blas, stream_t stream) {
    blas.set_stream(stream);
    // as launch_matmul_forward: outᵀ (OC, N) = weight'ᵀ · inpᵀ
    gemm_bf16(blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, weight, C, inp, C, 0.0f, out, OC);
    add_bias(out, bias, N, OC, stream);
}

void matmul_backward_bf16(float* dinp, float* dweight, float* dbias, const float* dout,
                          const std::uint16_t* dout16, const std::uint16_t* inp16,
                          const std::uint16_t* weight16, float* scratch, int N, int C, int OC,
                          Blas& blas, stream_t stream) {
    blas.set_stream(stream);
    // as launch_matmul_backward: dinpᵀ += weightᵀ' · doutᵀ, dweightᵀ += inpᵀ · dout
    gemm_bf16(blas, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, weight16, C, dout16, OC, 1.0f, dinp, C);
    gemm_bf16(blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, inp16, C, dout16, OC, 1.0f, dweight, C);
    bias_backward(dbias, dout, scratch, N, OC, stream);
}

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC, Blas& blas, stream_t stream) {
    launch_matmul_forward(out, inp, weight, bias, N, C, OC, blas, stream);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                     const float* inp, const float* weight, float* scratch, int N, int C, int OC,
                     Blas& blas, stream_t stream) {
    launch_matmul_backward(dinp, dweight, dbias, dout, inp, weight, scratch, N, C, OC, blas,
                           stream);
}

}  // namespace attn::cuda
