// rule: static and dynamic shared memory together may not pass 48 KiB without cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)
// refused: two_tiles (launched at static_and_dynamic_without_opt_in.cpp:22): 40960 bytes of static __shared__ memory and 40960 of dynamic are over the 48 KiB
#include "mistake.hpp"

namespace {
// 40 KiB of static and 40 KiB of dynamic shared memory: each under 48 KiB, together over,
// and the kernel never opted in to more. On a GPU the launch fails.
__global__ void two_tiles(float* out) {
    __shared__ float fixed[10240];
    ATTN_DYNAMIC_SHARED(float, extra);
    fixed[threadIdx.x] = 1.0f;
    extra[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = fixed[threadIdx.x] + extra[threadIdx.x];
}
}  // namespace

MISTAKE(static_and_dynamic_without_opt_in) {
    float* out = nullptr;
    cudaMalloc(&out, 32 * sizeof(float));
    // One warp, 40 KiB of dynamic shared memory.
    ATTN_LAUNCH(two_tiles, 1, 32, 40 * 1024, nullptr)(out);
    return mistakes::said(cudaGetLastError());
}
