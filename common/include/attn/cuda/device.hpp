/// @file device.hpp
/// @brief Finding out which CUDA device, if any, the GPU lessons can use.
///
/// A plain header (no CUDA types), so that ordinary C++ files can include it; the
/// implementation is compiled by nvcc only when the CUDA toolkit is present.
#pragma once

#include <string>

namespace attn::cuda {

/// Whether a CUDA device can be used: false without a driver or a GPU.
/// @param why set to a one-line reason when the answer is false
bool device_available(std::string* why = nullptr);

/// One line describing device 0: its name, compute capability and memory.
/// @throws std::runtime_error with CUDA's error text if there is no usable device
std::string device_summary();

}  // namespace attn::cuda
