// rule: cudaEventElapsedTime needs both events reached by their stream (cudaEventSynchronize the later one first)
// refused: an event its stream has not reached yet
#include "mistake.hpp"

namespace {
__global__ void fill(float* out, float value) { out[threadIdx.x] = value; }
}  // namespace

MISTAKE(elapsed_time_before_event_sync) {
    cudaStream_t stream = nullptr;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    cudaEvent_t start = nullptr, stop = nullptr;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    float* out = nullptr;
    cudaMalloc(&out, 64 * sizeof(float));
    cudaEventRecord(start, stream);
    ATTN_LAUNCH(fill, 1, 64, 0, stream)(out, 2.0f);
    cudaEventRecord(stop, stream);
    float ms = 0.0f;
    // missing: cudaEventSynchronize(stop)
    return mistakes::said(cudaEventElapsedTime(&ms, start, stop));
}
