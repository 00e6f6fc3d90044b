// rule: a kernel may declare at most 48 KiB of static __shared__ memory (above that, shared memory must be dynamic)
// refused: big_tile (launched at static_shared_over_48k.cpp:20): 65536 bytes of static __shared__ memory, over the 48 KiB a kernel may declare
#include "mistake.hpp"

namespace {
// A 128 × 128 float tile in shared memory: 64 KiB. nvcc's ptxas refuses to build it; the
// simulated build has no ptxas, so the launch is refused.
__global__ void big_tile(float* out) {
    __shared__ float tile[128][128];
    for (int i = static_cast<int>(threadIdx.x); i < 128 * 128; i += static_cast<int>(blockDim.x)) tile[i / 128][i % 128] = 1.0f;
    __syncthreads();
    if (threadIdx.x == 0) out[0] = tile[127][127];
}
}  // namespace

MISTAKE(static_shared_over_48k) {
    float* out = nullptr;
    cudaMalloc(&out, sizeof(float));
    // One block of 128 threads.
    ATTN_LAUNCH(big_tile, 1, 128, 0, nullptr)(out);
    return mistakes::said(cudaGetLastError());
}
