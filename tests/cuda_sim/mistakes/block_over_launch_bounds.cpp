// rule: a kernel declared with __launch_bounds__(N) is launched with at most N threads a block
// refused: twice_each (launched at block_over_launch_bounds.cpp:44): 256 threads per block, over the kernel's __launch_bounds__ of 128
//
// nvcc compiles this file too (tests/CMakeLists.txt), into build/cuda_resources/, where the
// simulator reads the bound the way a GPU does: from the compiled kernel. nvcc sees only the
// kernel; g++ sees the whole file.
#ifndef __CUDACC__
#include "mistake.hpp"
#endif

namespace {
constexpr int kThreadsX = 32, kThreadsY = 4;

// The bound lets nvcc budget registers for blocks of at most 128 threads; a larger block
// might not fit on a multiprocessor, and a GPU refuses to launch one.
__global__ void __launch_bounds__(kThreadsX* kThreadsY) twice_each(float* x) {
    const int i = threadIdx.y * blockDim.x + threadIdx.x;
    x[i] *= 2.0f;
}
}  // namespace

#ifndef __CUDACC__
MISTAKE(block_over_launch_bounds) {
    if (cuda_sim::max_threads_per_block(reinterpret_cast<std::uintptr_t>(&twice_each)) == 1024) {
        mistakes::skip(cuda_sim::kernel_resources_found()
                           ? "build/cuda_resources has no cubin of this file: rebuild the target cuda_sim_mistakes"
                           : "no nvcc compiled this file (build/cuda_resources is missing), so its "
                             "__launch_bounds__ is unknown to the simulator");
    }
    cudaFuncAttributes attributes{};
    cudaFuncGetAttributes(&attributes, twice_each);
    if (attributes.maxThreadsPerBlock != kThreadsX * kThreadsY) {  // as a GPU reports it
        return "cudaFuncGetAttributes reports " + std::to_string(attributes.maxThreadsPerBlock) +
               " threads a block at most, not the bound";
    }
    float* x = nullptr;
    cudaMalloc(&x, 256 * sizeof(float));
    cudaMemset(x, 0, 256 * sizeof(float));
    // 32 x 4 = 128 threads: the bound, allowed.
    ATTN_LAUNCH(twice_each, 1, dim3(kThreadsX, kThreadsY), 0, nullptr)(x);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
        return std::string("the allowed launch of 128 threads failed too: ") + cudaGetErrorString(e);
    }
    ATTN_LAUNCH(twice_each, 1, dim3(kThreadsX, 2 * kThreadsY), 0, nullptr)(x);  // 256 threads
    return mistakes::said(cudaGetLastError());
}
#endif
