// Exercise 12: a CUDA kernel, the row-wise causal softmax.
//
// Write the kernel and the launch below, then run `./workbook check 12`. Stuck?
// `./workbook hint 12`. The contract is in exercise.hpp beside this file. The file compiles
// as C++ against the CUDA simulator (common/cuda/sim), which runs every CUDA thread on the
// CPU with real barriers and warp shuffles; the same code is CUDA for nvcc.
#include "exercise.hpp"

#include "attn/error.hpp"
#include "launch.cuh"  // ATTN_LAUNCH(kernel, grid, block, shared_bytes, stream)(arguments...)

#include <cmath>
#include <stdexcept>
#include <string>

namespace exercise {
namespace {

constexpr int warps_per_block = 8;  // one warp (32 threads) per row, 8 rows per block

// TODO: the kernel. One warp per row: row = blockIdx.x * warps_per_block + threadIdx.x / 32,
//       lane = threadIdx.x % 32. A warp past the last row returns at once (the whole warp,
//       so that no shuffle misses a lane).
//   1. The query of the row: i = row % T. Each lane takes j = lane, lane + 32, ... ≤ i and
//      keeps the largest score; the warp's maximum from five __shfl_xor_sync butterflies
//      (offsets 16, 8, 4, 2, 1): x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset)).
//   2. The same lanes sum expf(s − max); the warp's sum by the same butterflies, with +.
//   3. Each lane writes out[j] = expf(s − max) / sum for its j ≤ i and 0 for i < j < T.
// __global__ void causal_softmax_kernel(float* out, const float* scores, int rows, int T) { }

}  // namespace

void causal_softmax(float* out, const float* scores, int rows, int T) {
    // TODO: check T ≥ 1, rows ≥ 1 and rows % T == 0; throw std::invalid_argument naming
    //       the shapes otherwise.
    // TODO: launch ceil(rows / warps_per_block) blocks of warps_per_block · 32 threads:
    //       ATTN_LAUNCH(causal_softmax_kernel, blocks, threads, 0, nullptr)(out, scores, rows, T);
    //       then cudaGetLastError(): throw std::runtime_error(cudaGetErrorString(err)) if it
    //       is not cudaSuccess.
    (void)out, (void)scores, (void)rows, (void)T;
    throw attn::NotImplemented("causal_softmax in exercises/12_training_gpu/exercise.cpp: write "
                               "the kernel (one warp per row) and its launch");
}

}  // namespace exercise
