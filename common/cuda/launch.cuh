// One kernel source, two targets. Under nvcc a launch is CUDA's <<<...>>>; compiled as plain
// C++ (the CUDA simulator, sim/cuda_sim.hpp, stands in for the CUDA headers), the same line
// runs the kernel on the CPU.
//
//   ATTN_LAUNCH(kernel, grid, block, shared_bytes, stream)(arguments...);
//   ATTN_DYNAMIC_SHARED(float, smem);  // extern __shared__ float smem[];
#pragma once

#include <cuda_runtime.h>

#ifdef __CUDACC__
#define ATTN_LAUNCH(kernel, grid, block, shared_bytes, stream) \
    kernel<<<grid, block, shared_bytes, stream>>>
#define ATTN_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#else
#define ATTN_LAUNCH(kernel, grid, block, shared_bytes, stream)                                  \
    ::cuda_sim::make_launcher(                                                                \
        #kernel, &kernel, [](auto... attn_args_) { kernel(attn_args_...); }, grid, block,   \
        shared_bytes, stream)
#define ATTN_DYNAMIC_SHARED(type, name) \
    type* name = static_cast<type*>(::cuda_sim::dynamic_shared_memory())
#endif
