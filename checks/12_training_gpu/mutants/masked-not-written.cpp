// mistake: the masked weights are skipped instead of written as 0 (the output keeps whatever it held)
// Solution to exercise 12: the row-wise causal softmax as a CUDA kernel, one warp per row.
#include "exercise.hpp"

#include "launch.cuh"

#include <cmath>
#include <stdexcept>
#include <string>

namespace exercise {
namespace {

constexpr int warps_per_block = 8;

__device__ float warp_max(float x) {
    for (int offset = 16; offset > 0; offset /= 2) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    }
    return x;
}

__device__ float warp_sum(float x) {
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// out[row][j] = softmax over k ≤ i of scores[row][k], 0 for j > i; i = row mod T.
__global__ void causal_softmax_kernel(float* out, const float* scores, int rows, int T) {
    const int row = static_cast<int>(blockIdx.x) * warps_per_block + static_cast<int>(threadIdx.x) / 32;
    const int lane = static_cast<int>(threadIdx.x) % 32;
    if (row >= rows) return;  // the whole warp leaves: no shuffle misses a lane
    const int i = row % T;
    const float* s = scores + static_cast<long long>(row) * T;
    float* o = out + static_cast<long long>(row) * T;

    float m = -INFINITY;
    for (int j = lane; j <= i; j += 32) m = fmaxf(m, s[j]);
    m = warp_max(m);
    float sum = 0.0f;
    for (int j = lane; j <= i; j += 32) sum += expf(s[j] - m);
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    for (int j = lane; j <= i; j += 32) o[j] = expf(s[j] - m) * inv;
}

}  // namespace

void causal_softmax(float* out, const float* scores, int rows, int T) {
    if (T < 1 || rows < 1 || rows % T != 0) {
        throw std::invalid_argument("causal_softmax: rows must be a positive multiple of T, got rows = " +
                                    std::to_string(rows) + ", T = " + std::to_string(T));
    }
    const unsigned blocks = static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block);
    ATTN_LAUNCH(causal_softmax_kernel, blocks, warps_per_block * 32, 0, nullptr)(out, scores, rows, T);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) throw std::runtime_error(std::string("causal_softmax: ") + cudaGetErrorString(err));
}

}  // namespace exercise
