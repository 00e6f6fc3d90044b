// rule: host code reads the pinned memory an asynchronous copy writes only after the stream is synchronised
// refused: host code touched pinned memory that cudaMemcpyAsync at read_pinned_before_stream_sync.cpp:21, queued on a non-blocking stream, has not written yet
#include "mistake.hpp"

#include <cstdio>

namespace {
__global__ void fill(float* out) { out[threadIdx.x] = 7.0f; }
}  // namespace

// The read ends the program (there is no CUDA call to return an error from), so it runs in
// a child process.
MISTAKE(read_pinned_before_stream_sync) {
    return mistakes::said_by_child([] {
        cudaStream_t stream = nullptr;
        float *device = nullptr, *host = nullptr;
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        cudaMalloc(&device, 32 * sizeof(float));
        cudaMallocHost(&host, 32 * sizeof(float));
        ATTN_LAUNCH(fill, 1, 32, 0, stream)(device);
        cudaMemcpyAsync(host, device, 32 * sizeof(float), cudaMemcpyDeviceToHost, stream);
        const volatile float first = host[0];  // the copy may not have run: no synchronisation
        std::printf("read %g\n", static_cast<double>(first));
    });
}
