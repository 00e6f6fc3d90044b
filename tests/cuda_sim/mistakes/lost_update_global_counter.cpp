// rule: threads that add to one address without an order between them use an atomic (atomicAdd)
// refused: count_threads (launched at lost_update_global_counter.cpp:18): block (0,0,0): a lost update: threads (0,0,0) and (1,0,0) of the block both wrote byte 0 of a device buffer of 4 bytes between two barriers without an atomic
#include "mistake.hpp"

namespace {
// Every thread adds one to the counter with a plain read-modify-write: on a GPU many threads
// read the same old value at once, and the count comes out short. Run one thread after
// another, it comes out exact, so the two-order race check alone does not see it.
__global__ void count_threads(int* counter) { *counter += 1; }
}  // namespace

MISTAKE(lost_update_global_counter) {
    cuda_sim::set_racecheck(true);
    int* counter = nullptr;
    cudaMalloc(&counter, sizeof(int));
    cudaMemset(counter, 0, sizeof(int));
    // 4 blocks of 256 threads.
    ATTN_LAUNCH(count_threads, 4, 256, 0, nullptr)(counter);
    return mistakes::said(cudaDeviceSynchronize());
}
