// rule: a kernel's threads stay inside the allocations they are given (bound every index by the buffer's size)
// refused: write_one_past (launched at kernel_writes_past_allocation.cpp:18) wrote past the end of a cudaMalloc allocation of 256 bytes (0 bytes past it)
#include "mistake.hpp"

namespace {
// One thread too many writes: the bound check a kernel needs when the grid is rounded up.
__global__ void write_one_past(float* out) { out[threadIdx.x] = 1.0f; }
}  // namespace

// On a GPU the 65th thread's store is an illegal address (or lands in another buffer, which
// nothing reports). The simulator places each allocation at the end of its own pages, with an
// inaccessible page after it, so the store faults at once (the catalogue is not run in the
// sanitizer build, where AddressSanitizer reports such a store). The fault ends the program, so it runs in a child process.
MISTAKE(kernel_writes_past_allocation) {
    return mistakes::said_by_child([] {
        float* out = nullptr;
        cudaMalloc(&out, 64 * sizeof(float));
        ATTN_LAUNCH(write_one_past, 1, 65, 0, nullptr)(out);
        cudaDeviceSynchronize();
    });
}
