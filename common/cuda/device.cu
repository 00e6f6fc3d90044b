#include "attn/cuda/device.hpp"
#include "check.cuh"

#include <cstdio>
#include <string>

namespace attn::cuda {

#ifndef ATTN_CUDA_ARCHITECTURES
#define ATTN_CUDA_ARCHITECTURES "the simulator's"
#endif

namespace {
// Has machine code (or PTX) for the GPU only if the build's architectures cover it.
__global__ void probe_kernel() {}
}  // namespace

bool device_available(std::string* why) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        if (why) *why = err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA device found";
        cudaGetLastError();  // clear the sticky error so later calls start clean
        return false;
    }
    cudaFuncAttributes attributes{};
    const cudaError_t image = cudaFuncGetAttributes(&attributes, probe_kernel);
    if (image != cudaSuccess) {
        cudaDeviceProp p{};
        cudaGetDeviceProperties(&p, 0);
        if (why) {
            *why = std::string(p.name) + " (compute capability " + std::to_string(p.major) + "." +
                   std::to_string(p.minor) + ") is not among the architectures this build compiled for (" +
                   ATTN_CUDA_ARCHITECTURES +
                   "): reconfigure with -DCMAKE_CUDA_ARCHITECTURES=native and rebuild (" +
                   cudaGetErrorString(image) + ")";
        }
        cudaGetLastError();
        return false;
    }
    return true;
}

std::string device_summary() {
    int count = 0;
    CUDA_CHECK(cudaGetDeviceCount(&count));
    cudaDeviceProp p{};
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    char buf[640];  // room for the longest name (256) and the numbers: no truncation
    std::snprintf(buf, sizeof buf, "%s, compute capability %d.%d, %.1f GiB, %d SMs", p.name,
                  p.major, p.minor, static_cast<double>(p.totalGlobalMem) / (1 << 30),
                  p.multiProcessorCount);
    return buf;
}

}  // namespace attn::cuda
