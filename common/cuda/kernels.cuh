// Helpers shared by the GPT's CUDA ops: grid arithmetic, warp and block reductions, the
// cuBLAS status check and the deterministic column-sum kernels.
#pragma once

#include "attn/cuda/gpt_ops.hpp"
#include "attn/dropout_mask.hpp"
#include "check.cuh"

#include <cublas_v2.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace attn::cuda {

[[noreturn]] inline void fail_cublas(cublasStatus_t status, const char* call, const char* file,
                                     int line) {
    throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call +
                             ": " + cublasGetStatusString(status));
}

}  // namespace attn::cuda

/// Checks a cuBLAS call; on failure throws std::runtime_error with the file, line and status.
#define CUBLAS_CHECK(call)                                                                  \
    do {                                                                                    \
        const cublasStatus_t attn_status_ = (call);                                         \
        if (attn_status_ != CUBLAS_STATUS_SUCCESS)                                          \
            ::attn::cuda::fail_cublas(attn_status_, #call, __FILE__, __LINE__);             \
    } while (false)

namespace attn::cuda::detail {

// attn::require without xtensor's headers, which nvcc need not see.
inline void require(bool condition, const std::string& what) {
    if (!condition) throw std::invalid_argument(what);
}

constexpr int warp_size = 32;

inline unsigned int ceil_div(std::size_t n, std::size_t d) {
    return static_cast<unsigned int>((n + d - 1) / d);
}

// Every lane ends with the warp's sum (or maximum): xor butterflies, a fixed order.
template <typename F>
__device__ inline F warp_sum(F x) {
    for (int o = warp_size / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
__device__ inline float warp_max(float x) {
    for (int o = warp_size / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// The sum (or maximum) over a block of up to 1024 threads whose size is a multiple of 32;
// every thread gets the result. `shared` holds 32 values; all threads must call it.
template <typename F>
__device__ inline F block_sum(F x, F* shared) {
    const int lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    const int warps = blockDim.x / warp_size;
    x = warp_sum(x);
    __syncthreads();  // `shared` may still be read by a previous call
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < warps ? shared[lane] : F(0);
    return warp_sum(x);
}
__device__ inline float block_max(float x, float* shared) {
    const int lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
    const int warps = blockDim.x / warp_size;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) shared[warp] = x;
    __syncthreads();
    x = lane < warps ? shared[lane] : -INFINITY;
    return warp_max(x);
}

// Column sums in two deterministic passes. Pass 1: block (32, 8) sums rows
// [chunk·R, chunk·R + R), R = reduce_rows_per_chunk, of 32 columns; each thread strides over rows, then the
// 8 partial sums of a column are added in a fixed order. Pass 2 adds the chunks in order.
constexpr int colsum_threads_y = 8;

// partial[chunk][col] = Σ_rows value(row, col), value given as a functor.
template <typename Value>
__device__ inline void column_partial(float* partial, Value value, int N, int cols) {
    __shared__ float sums[colsum_threads_y][warp_size + 1];  // +1: no bank conflicts
    const int col = blockIdx.x * warp_size + threadIdx.x;
    const int chunk = blockIdx.y;
    const int row_end = min(N, (chunk + 1) * reduce_rows_per_chunk);
    float acc = 0.0f;
    if (col < cols) {
        for (int row = chunk * reduce_rows_per_chunk + static_cast<int>(threadIdx.y); row < row_end; row += colsum_threads_y) {
            acc += value(row, col);
        }
    }
    sums[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
        float total = 0.0f;
        for (int y = 0; y < colsum_threads_y; ++y) total += sums[y][threadIdx.x];
        partial[static_cast<std::size_t>(chunk) * cols + col] = total;
    }
}

// out[col] += Σ_chunk partial[chunk][col], chunks in order. (A template only so that the
// files that include this header without using it do not warn.)
template <typename F = float>
__global__ void add_column_partials_kernel(F* out, const F* partial, int chunks, int cols) {
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= cols) return;
    F total = 0;
    for (int k = 0; k < chunks; ++k) total += partial[static_cast<std::size_t>(k) * cols + col];
    out[col] += total;
}

}  // namespace attn::cuda::detail
