// The one checking macro every CUDA call in the course goes through.
#pragma once

#include "launch.cuh"

#include <stdexcept>
#include <string>

namespace attn::cuda {
[[noreturn]] inline void fail(cudaError_t err, const char* call, const char* file, int line) {
    throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + call +
                             ": " + cudaGetErrorString(err));
}
}  // namespace attn::cuda

/// Checks a CUDA runtime call; on failure throws std::runtime_error naming the file, the
/// line, the call and CUDA's own error text.
#define CUDA_CHECK(call)                                                          \
    do {                                                                          \
        const cudaError_t attn_err_ = (call);                                     \
        if (attn_err_ != cudaSuccess) ::attn::cuda::fail(attn_err_, #call, __FILE__, __LINE__); \
    } while (false)
