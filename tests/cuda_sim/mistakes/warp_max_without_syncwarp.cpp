// rule: the lanes of a warp read each other's shared-memory writes only after a __syncwarp between the write and the read (Volta and later schedule a warp's threads independently)
// refused: warp_max_without_syncwarp (launched at warp_max_without_syncwarp.cpp:42): a race: __shared__ (anonymous namespace)::warp_max_without_syncwarp(float const*, float*)::s of block (0,0,0) ends with other bytes
#include "mistake.hpp"

#include <vector>

namespace {
// A row's maximum by the last-warp reduction of pre-Volta textbooks: no __syncwarp among the
// 32 lanes, trusting them to run each line in lock-step. `volatile` keeps every read a load,
// but nothing orders lane tid + 16's write before lane tid's read of it (CUDA C++
// Programming Guide, "Independent Thread Scheduling" and "__syncwarp": a race on Volta and
// later).
__global__ void warp_max_without_syncwarp(const float* row, float* out) {
    __shared__ float s[64];
    const int tid = static_cast<int>(threadIdx.x);
    s[tid] = row[tid];
    __syncthreads();
    if (tid < 32) {
        volatile float* v = s;
        v[tid] = fmaxf(v[tid], v[tid + 32]);
        v[tid] = fmaxf(v[tid], v[tid + 16]);
        v[tid] = fmaxf(v[tid], v[tid + 8]);
        v[tid] = fmaxf(v[tid], v[tid + 4]);
        v[tid] = fmaxf(v[tid], v[tid + 2]);
        v[tid] = fmaxf(v[tid], v[tid + 1]);
    }
    if (tid == 0) out[0] = s[0];
}
}  // namespace

MISTAKE(warp_max_without_syncwarp) {
    cuda_sim::set_racecheck(true);
    // The row's largest score is its first (attention to the first token often is): lane 0
    // reads it in any order, so the maximum written to device memory comes out right in both
    // of the race check's orders; the partial maxima the other lanes leave do not.
    std::vector<float> scores(64);
    for (int i = 0; i < 64; ++i) scores[static_cast<std::size_t>(i)] = i == 0 ? 100.0f : static_cast<float>((i * 37) % 64);
    float *row = nullptr, *out = nullptr;
    cudaMalloc(&row, 64 * sizeof(float));
    cudaMalloc(&out, sizeof(float));
    cudaMemcpy(row, scores.data(), 64 * sizeof(float), cudaMemcpyHostToDevice);
    ATTN_LAUNCH(warp_max_without_syncwarp, 1, 64, 0, nullptr)(row, out);
    return mistakes::said(cudaDeviceSynchronize());
}
