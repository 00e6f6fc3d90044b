// The main of the GPU test programs (device_test.cpp, test_attention_gpu.cpp,
// test_half_attention_gpu.cpp): without a usable device, one line starting "skipped:" and
// exit status 0, which CTest reports as a skip; otherwise the device's line, then the
// checks' exit status, or 1 with the message on stderr when they throw.
#pragma once

#include "attn/cuda/device.hpp"

#include <cstdio>
#include <exception>
#include <string>

template <class Checks>
int run_on_device(Checks&& checks) {
    std::string why;
    if (!attn::cuda::device_available(&why)) {
        std::printf("skipped: no usable CUDA device (%s)\n", why.c_str());
        return 0;
    }
    try {
        std::printf("CUDA device 0: %s\n", attn::cuda::device_summary().c_str());
        return checks();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
