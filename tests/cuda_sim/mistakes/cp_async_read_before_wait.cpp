// rule: shared memory that cp.async writes is read only after a cp.async.wait_group that covers the copy (and, for another thread's copy, a barrier after it)
// refused: tile_without_wait (launched at cp_async_read_before_wait.cpp:29): a race: the device buffer of 256 bytes differs at byte 0
#include "mistake.hpp"
#include "mma.cuh"

#include <vector>

namespace {
// A tile staged through shared memory by cp.async, with the barrier but without the wait: the
// barrier orders the threads, not the copies still on their way.
__global__ void tile_without_wait(float* out, const float* in) {
    alignas(16) __shared__ float s[64];
    const int t = static_cast<int>(threadIdx.x);
    attn::cuda::ptx::cp_async_ca<16>(&s[4 * t], &in[4 * t]);
    attn::cuda::ptx::cp_async_commit_group();
    __syncthreads();
    for (int i = 0; i < 4; ++i) out[4 * t + i] = 2.0f * s[(4 * t + 4 + i) % 64];  // the next thread's
    attn::cuda::ptx::cp_async_wait_group<0>();
}
}  // namespace

MISTAKE(cp_async_read_before_wait) {
    cuda_sim::set_racecheck(true);
    float *in = nullptr, *out = nullptr;
    cudaMalloc(&in, 64 * sizeof(float));
    cudaMalloc(&out, 64 * sizeof(float));
    const std::vector<float> ones(64, 1.0f);
    cudaMemcpy(in, ones.data(), 64 * sizeof(float), cudaMemcpyHostToDevice);
    ATTN_LAUNCH(tile_without_wait, 1, 16, 0, nullptr)(out, in);
    return mistakes::said(cudaDeviceSynchronize());
}
