/// @file training_device.hpp
/// @brief The CUDA GPU as a training device for attn::Trainer (plain header: no CUDA types).
#pragma once

#include "attn/trainer.hpp"

#include <memory>

namespace attn::cuda {

/// A TrainingDevice that runs the step on CUDA device 0 with CudaGPT.
/// @param model the host model, whose config the device copy takes
/// @param tf32 whether cuBLAS may use TF32 for the matrix products (faster, about 1e-3
///   relative error in each product instead of fp32's 1e-7)
/// @throws std::runtime_error with CUDA's reason when no device can be used
std::unique_ptr<TrainingDevice> make_training_device(const GPT& model, bool tf32 = false);

}  // namespace attn::cuda
