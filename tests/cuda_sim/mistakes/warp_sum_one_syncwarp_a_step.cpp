// rule: a warp's reduction through shared memory keeps each step's reads and writes apart with __syncwarp, not one __syncwarp after each step (lane tid reads v[tid + 16] while lane tid + 16 writes it)
// refused: warp_sum_one_syncwarp_a_step (launched at warp_sum_one_syncwarp_a_step.cpp:36): a race: the device buffer of 4 bytes differs
#include "mistake.hpp"

#include <vector>

namespace {
// The lock-step reduction given one __syncwarp a step: the steps are ordered, but inside a
// step lane tid's read of v[tid + offset] and lane tid + offset's write of it are not (the
// CUDA C++ Programming Guide's "__syncwarp" section keeps them apart with a second one:
// v = s[tid] + s[tid + offset]; __syncwarp(); s[tid] = v; __syncwarp();).
__global__ void warp_sum_one_syncwarp_a_step(const float* row, float* out) {
    __shared__ float s[64];
    const int tid = static_cast<int>(threadIdx.x);
    s[tid] = row[tid];
    __syncthreads();
    if (tid < 32) {
        volatile float* v = s;
        for (int offset = 32; offset > 0; offset /= 2) {
            v[tid] += v[tid + offset];
            __syncwarp();
        }
    }
    if (tid == 0) out[0] = s[0];
}
}  // namespace

MISTAKE(warp_sum_one_syncwarp_a_step) {
    cuda_sim::set_racecheck(true);
    std::vector<float> values(64);
    for (int i = 0; i < 64; ++i) values[static_cast<std::size_t>(i)] = static_cast<float>(i % 7);
    float *row = nullptr, *out = nullptr;
    cudaMalloc(&row, 64 * sizeof(float));
    cudaMalloc(&out, sizeof(float));
    cudaMemcpy(row, values.data(), 64 * sizeof(float), cudaMemcpyHostToDevice);
    ATTN_LAUNCH(warp_sum_one_syncwarp_a_step, 1, 64, 0, nullptr)(row, out);
    return mistakes::said(cudaDeviceSynchronize());
}
