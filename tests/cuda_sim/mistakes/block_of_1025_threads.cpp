// rule: a block has at most 1024 threads
// refused: touch (launched at block_of_1025_threads.cpp:12): grid (1,1,1) of blocks (1025,1,1): each dimension must be at least 1, blocks at most (1024,1024,64)
#include "mistake.hpp"

namespace {
__global__ void touch(float* out) { out[threadIdx.x] = 1.0f; }
}  // namespace

MISTAKE(block_of_1025_threads) {
    float* out = nullptr;
    cudaMalloc(&out, 1025 * sizeof(float));
    ATTN_LAUNCH(touch, 1, 1025, 0, nullptr)(out);
    return mistakes::said(cudaGetLastError());
}
