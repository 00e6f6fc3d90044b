// rule: a thread reads shared memory that another thread wrote only after a barrier between the write and the read
// refused: rotate_without_barrier (launched at race_shared_without_barrier.cpp:18): a race: the device buffer of 256 bytes differs
#include "mistake.hpp"

namespace {
__global__ void rotate_without_barrier(int* out) {
    __shared__ int s[64];
    const int t = static_cast<int>(threadIdx.x);
    s[t] = t;
    out[t] = s[(t + 1) % 64];  // thread t + 1 may not have written it yet
}
}  // namespace

MISTAKE(race_shared_without_barrier) {
    cuda_sim::set_racecheck(true);
    int* out = nullptr;
    cudaMalloc(&out, 64 * sizeof(int));
    ATTN_LAUNCH(rotate_without_barrier, 1, 64, 0, nullptr)(out);
    return mistakes::said(cudaDeviceSynchronize());
}
