// rule: threads of a block that add into one shared-memory word use an atomic or a reduction, not a plain +=
// refused: sum_in_shared (launched at lost_update_dynamic_shared.cpp:26): block (0,0,0): a lost update: threads (0,0,0) and (1,0,0) of the block both wrote byte 2 of the dynamic shared memory between two barriers without an atomic
#include "mistake.hpp"

#include <vector>

namespace {
__global__ void sum_in_shared(const float* x, float* out) {
    ATTN_DYNAMIC_SHARED(float, total);
    if (threadIdx.x == 0) total[0] = 0.0f;
    __syncthreads();
    total[0] += x[threadIdx.x];  // every thread at once: all but one addition lost
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = total[0];
}
}  // namespace

MISTAKE(lost_update_dynamic_shared) {
    cuda_sim::set_racecheck(true);
    float *x = nullptr, *out = nullptr;
    cudaMalloc(&x, 128 * sizeof(float));
    cudaMalloc(&out, 2 * sizeof(float));
    const std::vector<float> ones(128, 1.0f);
    cudaMemcpy(x, ones.data(), 128 * sizeof(float), cudaMemcpyHostToDevice);
    // 2 blocks of 128 threads, one float of dynamic shared memory.
    ATTN_LAUNCH(sum_in_shared, 2, 128, sizeof(float), nullptr)(x, out);
    return mistakes::said(cudaDeviceSynchronize());
}
