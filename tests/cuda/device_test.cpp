// Checks that the CUDA part of the library links and finds the GPU. Without a device it
// prints one line starting "skipped:" and CTest reports the test as skipped.
#include "attn/cuda/device.hpp"

#include <cstdio>
#include <exception>

int main() {
    std::string why;
    if (!attn::cuda::device_available(&why)) {
        std::printf("skipped: no usable CUDA device (%s)\n", why.c_str());
        return 0;
    }
    try {
        std::printf("CUDA device 0: %s\n", attn::cuda::device_summary().c_str());
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
