// rule: blocks of one launch are not ordered: two blocks that add to one address use an atomic
// refused: add_per_block (launched at lost_update_two_blocks.cpp:19): block (1,0,0): a lost update: threads (0,0,0) and (0,0,0) of two blocks both wrote byte 0 of a device buffer of 4 bytes without an atomic
#include "mistake.hpp"

namespace {
// One thread per block adds the block's count to the total: within a block there is no race,
// between blocks there is (they may run at once on two SMs).
__global__ void add_per_block(int* total) {
    if (threadIdx.x == 0) *total += 1;
}
}  // namespace

MISTAKE(lost_update_two_blocks) {
    cuda_sim::set_racecheck(true);
    int* total = nullptr;
    cudaMalloc(&total, sizeof(int));
    cudaMemset(total, 0, sizeof(int));
    // 2 blocks of 32 threads.
    ATTN_LAUNCH(add_per_block, 2, 32, 0, nullptr)(total);
    return mistakes::said(cudaDeviceSynchronize());
}
