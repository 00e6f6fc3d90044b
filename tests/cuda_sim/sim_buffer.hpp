// What the simulator's own checks (test_cuda_sim*.cpp) share: the library's launch macros
// and a device buffer of one test (under nvcc too, for the checks that also run on a GPU).
#pragma once

#include <cuda_runtime.h>  // the simulator's (cuda_sim.hpp), or CUDA's under nvcc
#include "launch.cuh"  // ATTN_LAUNCH, ATTN_DYNAMIC_SHARED: the simulator's, compiled as C++

#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

namespace {

// A device buffer of n values for one test.
template <class T>
struct Buffer {
    T* p = nullptr;
    std::size_t n;
    explicit Buffer(std::size_t n_) : n(n_) { REQUIRE(cudaMalloc(&p, n * sizeof(T)) == cudaSuccess); }
    Buffer(const std::vector<T>& host) : Buffer(host.size()) {
        REQUIRE(cudaMemcpy(p, host.data(), n * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    ~Buffer() { cudaFree(p); }
    std::vector<T> get() const {
        std::vector<T> h(n);
        REQUIRE(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
        return h;
    }
};

}  // namespace
