// rule: more than 48 KiB of dynamic shared memory needs cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize)
// refused: use_shared (launched at dynamic_shared_without_opt_in.cpp:16): 65536 bytes of dynamic shared memory, the kernel may use 49152 (above 48 KiB a kernel needs cudaFuncSetAttribute
#include "mistake.hpp"

namespace {
__global__ void use_shared(float* out) {
    ATTN_DYNAMIC_SHARED(float, buffer);
    buffer[threadIdx.x] = 1.0f;
    out[threadIdx.x] = buffer[threadIdx.x];
}
}  // namespace

MISTAKE(dynamic_shared_without_opt_in) {
    float* out = nullptr;
    cudaMalloc(&out, 32 * sizeof(float));
    ATTN_LAUNCH(use_shared, 1, 32, 64 * 1024, nullptr)(out);
    return mistakes::said(cudaGetLastError());
}
