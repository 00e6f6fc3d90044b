/// @file device.hpp
/// @brief Finding out which CUDA device, if any, the GPU lessons can use.
///
/// A plain header (no CUDA types), so that ordinary C++ files can include it; the
/// implementation is compiled by nvcc only when the CUDA toolkit is present.
#pragma once

#include "attn/roofline.hpp"

#include <string>
#include <vector>

namespace attn::cuda {

/// Whether a CUDA device can be used: false without a driver or a GPU.
/// @param why set to a one-line reason when the answer is false
bool device_available(std::string* why = nullptr);

/// One line describing device 0: its name, compute capability and memory.
/// @throws std::runtime_error with CUDA's error text if there is no usable device
std::string device_summary();

/// Turns the CUDA simulator's work counting on or off: what each launch and cuBLAS call
/// reads, writes and computes (see cuda_sim::Work), for the performance model of
/// attn/roofline.hpp. Only the simulator counts: on a GPU this returns false and nothing is
/// counted (time the kernels there instead).
bool count_work(bool on);

/// The launches counted since the last call, one entry per kernel (or cuBLAS call) name in
/// the order each first ran, their bytes, operations, blocks and launches summed.
/// @param all_counted set to false when some launch's bytes were not counted (race-checked
///        launches, the sanitizer build)
std::vector<roofline::Launch> take_counted_work(bool* all_counted = nullptr);

}  // namespace attn::cuda
