// rule: every lane named in a warp shuffle's mask reaches the shuffle
// refused: shuffle_in_half_the_warp (launched at partial_warp_shuffle.cpp:16): block (0,0,0): the warp shuffle at partial_warp_shuffle.cpp:8 is reached by 16 of warp 0's 32 lanes
#include "mistake.hpp"

namespace {
__global__ void shuffle_in_half_the_warp(float* out) {
    float x = static_cast<float>(threadIdx.x);
    if (threadIdx.x < 16) x += __shfl_xor_sync(0xffffffffu, x, 1);  // lanes 16-31 never arrive
    out[threadIdx.x] = x;
}
}  // namespace

MISTAKE(partial_warp_shuffle) {
    float* out = nullptr;
    cudaMalloc(&out, 32 * sizeof(float));
    ATTN_LAUNCH(shuffle_in_half_the_warp, 1, 32, 0, nullptr)(out);
    return mistakes::said(cudaDeviceSynchronize());
}
