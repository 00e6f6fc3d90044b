// rule: every thread of a block reaches each __syncthreads (none returns before it)
// refused: half_return_early (launched at barrier_after_early_return.cpp:16): block (0,0,0): __syncthreads at barrier_after_early_return.cpp:8 is reached by 32 of the block's 64 threads; 32 returned without reaching it
#include "mistake.hpp"

namespace {
__global__ void half_return_early(int* out) {
    if (threadIdx.x % 2 == 1) return;
    __syncthreads();  // on a GPU: a hang, or wrong results
    out[threadIdx.x] = 1;
}
}  // namespace

MISTAKE(barrier_after_early_return) {
    int* out = nullptr;
    cudaMalloc(&out, 64 * sizeof(int));
    ATTN_LAUNCH(half_return_early, 1, 64, 0, nullptr)(out);
    return mistakes::said(cudaDeviceSynchronize());
}
