// rule: the legacy stream does not wait for a non-blocking stream: synchronise it before a cudaMemcpy reads what its kernels write
// refused: cudaMemcpy at legacy_copy_before_stream_sync.cpp:19 uses the device allocation of 256 bytes that kernel fill (launched at legacy_copy_before_stream_sync.cpp:16), queued on a non-blocking stream
#include "mistake.hpp"

#include <vector>

namespace {
__global__ void fill(float* out, float value) { out[threadIdx.x] = value; }
}  // namespace

MISTAKE(legacy_copy_before_stream_sync) {
    cudaStream_t stream = nullptr;
    cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    float* out = nullptr;
    cudaMalloc(&out, 64 * sizeof(float));
    ATTN_LAUNCH(fill, 1, 64, 0, stream)(out, 2.0f);
    std::vector<float> host(64);
    // missing: cudaStreamSynchronize(stream)
    return mistakes::said(cudaMemcpy(host.data(), out, 64 * sizeof(float), cudaMemcpyDeviceToHost));
}
