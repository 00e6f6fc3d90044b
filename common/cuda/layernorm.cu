// LayerNorm on the GPU, forward and backward (mirrors attn::layernorm_*).
#include "kernels.cuh"

namespace attn::cuda {
namespace {
using detail::ceil_div;
using detail::warp_size;
using detail::warp_sum;
constexpr float layernorm_eps = 1e-5f;
constexpr int rows_per_block = 8;  // one warp per row, 8 warps per block

// One warp per row of inp (N, C): the mean, then the variance about it (two passes, as the
// CPU does, so no cancellation), then the normalised, scaled, shifted row.
__global__ void layernorm_forward_kernel(float* out, float* mean, float* rstd, const float* inp,
                                         const float* weight, const float* bias, int N, int C) {
    const int row = blockIdx.x * rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= N) return;  // the whole warp leaves together
    const float* x = inp + static_cast<std::size_t>(row) * C;
    float* y = out + static_cast<std::size_t>(row) * C;
    float sum = 0.0f;
    for (int i = lane; i < C; i += warp_size) sum += x[i];
    const float m = warp_sum(sum) / static_cast<float>(C);
    float sq = 0.0f;
    for (int i = lane; i < C; i += warp_size) sq += (x[i] - m) * (x[i] - m);
    const float s = rsqrtf(warp_sum(sq) / static_cast<float>(C) + layernorm_eps);
    for (int i = lane; i < C; i += warp_size) {
        y[i] = (x[i] - m) * s * weight[i] + (bias ? bias[i] : 0.0f);
    }
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

// forward: n = (x - m)·s; y = n·weight + bias
// dx += s·(dn - mean(dn) - n·mean(dn·n)) with dn = dy·weight; one warp per row.
__global__ void layernorm_backward_dinp_kernel(float* dinp, const float* dout, const float* inp,
                                               const float* weight, const float* mean,
                                               const float* rstd, int N, int C) {
    const int row = blockIdx.x * rows_per_block + threadIdx.x / warp_size;
    const int lane = threadIdx.x % warp_size;
    if (row >= N) return;
    const std::size_t off = static_cast<std::size_t>(row) * C;
    const float m = mean[row], s = rstd[row];
    float dn_sum = 0.0f, dn_n_sum = 0.0f;
    for (int i = lane; i < C; i += warp_size) {
        const float n = (inp[off + i] - m) * s;
        const float dn = weight[i] * dout[off + i];
        dn_sum += dn;
        dn_n_sum += dn * n;
    }
    const float dn_mean = warp_sum(dn_sum) / static_cast<float>(C);
    const float dn_n_mean = warp_sum(dn_n_sum) / static_cast<float>(C);
    for (int i = lane; i < C; i += warp_size) {
        const float n = (inp[off + i] - m) * s;
        const float dn = weight[i] * dout[off + i];
        dinp[off + i] += s * (dn - dn_mean - n * dn_n_mean);
    }
}

// dweight[c] += Σ_rows dy·n and dbias[c] += Σ_rows dy, first pass: partial sums per chunk of
// rows. partial_w and partial_b are (chunks, C).
__global__ void layernorm_backward_params_kernel(float* partial_w, float* partial_b,
                                                 const float* dout, const float* inp,
                                                 const float* mean, const float* rstd, int N,
                                                 int C) {
    detail::column_partial(
        partial_w,
        [=](int row, int col) {
            const std::size_t i = static_cast<std::size_t>(row) * C + col;
            return dout[i] * (inp[i] - mean[row]) * rstd[row];
        },
        N, C);
    if (partial_b) {
        __syncthreads();  // column_partial's shared memory is reused
        detail::column_partial(
            partial_b,
            [=](int row, int col) { return dout[static_cast<std::size_t>(row) * C + col]; },
            N, C);
    }
}

void launch_layernorm_forward(float* out, float* mean, float* rstd, const float* inp,
                              const float* weight, const float* bias, int N, int C,
                              cudaStream_t stream) {
    ATTN_LAUNCH(layernorm_forward_kernel, ceil_div(N, rows_per_block), rows_per_block * warp_size, 0,
                               stream)(out, mean, rstd, inp, weight, bias, N, C);
    CUDA_CHECK(cudaGetLastError());
}

void launch_layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                               const float* inp, const float* weight, const float* mean,
                               const float* rstd, float* scratch, int N, int C,
                               cudaStream_t stream) {
    ATTN_LAUNCH(layernorm_backward_dinp_kernel, ceil_div(N, rows_per_block), rows_per_block * warp_size, 0,
                                     stream)(dinp, dout, inp, weight, mean, rstd, N, C);
    CUDA_CHECK(cudaGetLastError());
    const int chunks = static_cast<int>(ceil_div(N, reduce_rows_per_chunk));
    float* partial_w = scratch;
    float* partial_b = dbias ? scratch + column_reduce_scratch(N, C) : nullptr;
    const dim3 grid(ceil_div(C, warp_size), chunks), block(warp_size, detail::colsum_threads_y);
    ATTN_LAUNCH(layernorm_backward_params_kernel, grid, block, 0, stream)(partial_w, partial_b, dout, inp,
                                                                 mean, rstd, N, C);
    CUDA_CHECK(cudaGetLastError());
    ATTN_LAUNCH(detail::add_column_partials_kernel<float>, ceil_div(C, 256), 256, 0, stream)(dweight, partial_w,
                                                                             chunks, C);
    CUDA_CHECK(cudaGetLastError());
    if (dbias) {
        ATTN_LAUNCH(detail::add_column_partials_kernel<float>, ceil_div(C, 256), 256, 0, stream)(
            dbias, partial_b, chunks, C);
        CUDA_CHECK(cudaGetLastError());
    }
}
}  // namespace

void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int B, int T, int C, stream_t stream) {
    launch_layernorm_forward(out, mean, rstd, inp, weight, bias, B * T, C, stream);
}

void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean,
                        const float* rstd, float* scratch, int B, int T, int C, stream_t stream) {
    launch_layernorm_backward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, scratch, B * T,
                              C, stream);
}

}  // namespace attn::cuda
