// rule: host code changes the pinned memory an asynchronous copy reads only after the stream is synchronised
// refused: host code wrote pinned memory that cudaMemcpyAsync at write_pinned_during_copy.cpp:17, queued on a non-blocking stream, has not read yet
#include "mistake.hpp"

// The next batch written into the pinned staging buffer while the copy of the last one may
// still be reading it: the GPU gets a mix of both. (Two buffers, or an event recorded after
// the copy and waited on before the write, fix it.) The write ends the program, so it runs
// in a child process.
MISTAKE(write_pinned_during_copy) {
    return mistakes::said_by_child([] {
        cudaStream_t stream = nullptr;
        float *device = nullptr, *host = nullptr;
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
        cudaMalloc(&device, 32 * sizeof(float));
        cudaMallocHost(&host, 32 * sizeof(float));
        for (int i = 0; i < 32; ++i) host[i] = 1.0f;
        cudaMemcpyAsync(device, host, 32 * sizeof(float), cudaMemcpyHostToDevice, stream);
        for (int i = 0; i < 32; ++i) host[i] = 2.0f;  // the next batch, before the copy ran
        cudaStreamSynchronize(stream);
    });
}
