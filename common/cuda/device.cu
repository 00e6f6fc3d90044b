#include "attn/cuda/device.hpp"
#include "check.cuh"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
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

#if ATTN_CUDA_SIMULATED
bool count_work(bool on) {
    cuda_sim::set_work_counting(on);
    return true;
}

std::vector<roofline::Launch> take_counted_work(bool* all_counted) {
    std::vector<roofline::Launch> out;
    std::vector<std::string> keys;  // out[i]'s kernel: its symbol (two instantiations of a
                                    // template print one name), or the call's name
    if (all_counted) *all_counted = true;
    for (const cuda_sim::Work& w : cuda_sim::take_work()) {
        if (!w.counted && all_counted) *all_counted = false;
        const std::string key = w.symbol.empty() ? w.name : w.symbol;
        auto it = out.begin() + (std::find(keys.begin(), keys.end(), key) - keys.begin());
        const std::size_t blocks = static_cast<std::size_t>(w.grid.x) * w.grid.y * w.grid.z;
        if (it == out.end()) {
            roofline::Launch l;
            l.name = w.name;
            l.launches = 0;
            l.blocks = 0;
            l.threads_per_block = static_cast<std::size_t>(w.block.x) * w.block.y * w.block.z;
            l.shared_bytes = w.shared_bytes;
            // Registers per thread on sm_90 by ptxas's report, where nvcc built the course.
            if (!w.symbol.empty()) l.registers_per_thread = cuda_sim::kernel_resources(w.symbol).registers;
            out.push_back(l);
            keys.push_back(key);
            it = out.end() - 1;
        }
        it->launches += 1;
        it->blocks += blocks;
        it->bytes_read += static_cast<double>(w.bytes_read);
        it->bytes_written += static_cast<double>(w.bytes_written);
        it->fp32_flops += w.fp32_flops;
        it->tf32_flops += w.tf32_flops;
        it->f16_flops += w.f16_flops;
    }
    return out;
}
#else
bool count_work(bool) { return false; }
std::vector<roofline::Launch> take_counted_work(bool* all_counted) {
    if (all_counted) *all_counted = false;
    return {};
}
#endif

}  // namespace attn::cuda
