// rule: a kernel on the legacy stream does not wait for a non-blocking stream: one that reads what a non-blocking stream's kernel still writes races with it
// refused: kernel add_one (launched at legacy_kernel_during_stream_work.cpp:16) uses the device allocation of 256 bytes that kernel fill (launched at legacy_kernel_during_stream_work.cpp:15), queued on a non-blocking stream
#include "mistake.hpp"

namespace {
__global__ void fill(float* out, float value) { out[threadIdx.x] = value; }
__global__ void add_one(float* out) { out[threadIdx.x] += 1.0f; }
}  // namespace

MISTAKE(legacy_kernel_during_stream_work) {
    cudaStream_t stream = nullptr;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    float* out = nullptr;
    cudaMalloc(&out, 64 * sizeof(float));
    ATTN_LAUNCH(fill, 1, 64, 0, stream)(out, 2.0f);
    ATTN_LAUNCH(add_one, 1, 64, 0, nullptr)(out);  // the legacy stream
    return mistakes::said(cudaGetLastError());
}
