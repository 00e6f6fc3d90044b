/// @file generate.hpp
/// @brief Text generation on the GPU (lesson 14), uncached and with the device's key/value
/// cache, following generate_text and generate_cached step for step (plain header).
#pragma once

#include "attn/cuda/gpt.hpp"
#include "attn/data.hpp"
#include "attn/trainer.hpp"

#include <string>

namespace attn::cuda {

/// Generates text after a prompt with the GPU model, in evaluation mode.
///
/// Uncached (`cached` false): every new token runs the whole forward pass over the
/// context, cropped to block_size, and reads the last position's logits, as
/// attn::generate_text. Cached: the prompt is prefilled, then each token costs one
/// CudaGPT::decode_step; past block_size the cropped context is prefilled again, as
/// attn::generate_cached does. The draws are the CPU's (sample_token with the same seed),
/// so the text equals the CPU's wherever the logits are close enough not to move a draw
/// across a boundary between tokens.
/// @param gpu the model on the device (left in evaluation mode)
/// @param vocab its vocabulary
/// @param prompt the text to continue; empty starts from a newline
/// @param options length, temperature, top-k and seed
/// @param cached whether to use the key/value cache
/// @return the prompt followed by the generated characters
/// @throws std::invalid_argument as attn::generate_text
std::string generate_text(CudaGPT& gpu, const CharVocab& vocab, const std::string& prompt,
                          const SampleOptions& options, bool cached);

}  // namespace attn::cuda
