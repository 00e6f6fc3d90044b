// rule: a kernel reads and writes device memory (or cudaMallocHost memory), never ordinary host memory
// refused: scale (launched at kernel_reads_host_vector.cpp:19): pointer argument 1
#include "mistake.hpp"

#include <vector>

namespace {
__global__ void scale(float* x, float factor, int n) {
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] *= factor;
}
}  // namespace

// The data never went to the GPU: the kernel is given the vector's own storage. Here the
// CPU and the "GPU" share one address space, so it would run; on a GPU the first load is an
// illegal address.
MISTAKE(kernel_reads_host_vector) {
    std::vector<float> x(256, 1.0f);
    ATTN_LAUNCH(scale, 1, 256, 0, nullptr)(x.data(), 2.0f, 256);
    return mistakes::said(cudaGetLastError());
}
