/// @file training_device.hpp
/// @brief The CUDA GPU as a training device for attn::Trainer (plain header: no CUDA types).
#pragma once

#include "attn/cuda/gpt.hpp"
#include "attn/trainer.hpp"

#include <memory>

namespace attn::cuda {

/// A TrainingDevice that runs the step on CUDA device 0 with CudaGPT.
/// @param model the host model, whose config the device copy takes
/// @param options TF32 for the matrix products (faster, about 1e-3 relative error in each
///   product instead of fp32's 1e-7) and which attention to use (materialised or fused)
/// @throws std::runtime_error with CUDA's reason when no device can be used
/// @throws std::invalid_argument when the fused attention cannot take the model's head size
std::unique_ptr<TrainingDevice> make_training_device(const GPT& model,
                                                     const CudaOptions& options = {});

}  // namespace attn::cuda
