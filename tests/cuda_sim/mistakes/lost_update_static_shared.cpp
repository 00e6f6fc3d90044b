// rule: threads of a block that add to one __shared__ variable use an atomic
// refused: count_threads (launched at lost_update_static_shared.cpp:24): block (0,0,0): a lost update: threads (0,0,0) and (1,0,0) of the block both wrote byte 0 of __shared__ (anonymous namespace)::count_threads(int*)::count between two barriers without an atomic
#include "mistake.hpp"

namespace {
// Every thread adds one to a shared counter: on a GPU the read-add-write of 64 threads
// overlap and most additions are lost (atomicAdd is the fix). One thread at a time gives
// exactly 64.
__global__ void count_threads(int* out) {
    __shared__ int count;
    if (threadIdx.x == 0) count = 0;
    __syncthreads();
    count += 1;
    __syncthreads();
    if (threadIdx.x == 0) *out = count;
}
}  // namespace

MISTAKE(lost_update_static_shared) {
    cuda_sim::set_racecheck(true);
    int* out = nullptr;
    cudaMalloc(&out, sizeof(int));
    // One block of 64 threads.
    ATTN_LAUNCH(count_threads, 1, 64, 0, nullptr)(out);
    return mistakes::said(cudaDeviceSynchronize());
}
