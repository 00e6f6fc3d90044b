/// @file checkpoint.hpp
/// @brief The weights format, which is also the checkpoint format: a directory with
/// `config.json` and one float32 `.npy` file per parameter, named by nanoGPT's state_dict key.
///
/// `config.json` holds the GPTConfig fields under nanoGPT's names (`vocab_size`,
/// `block_size`, `n_layer`, `n_head`, `n_embd`, `dropout`, `bias`), the vocabulary as a
/// string of characters in id order (`vocab`) and the training step (`step`). Each
/// parameter is `<key>.npy` with PyTorch's shape, e.g. `transformer.h.0.attn.c_attn.weight.npy`
/// (3C, C); `lm_head.weight.npy` is written too, equal to `transformer.wte.weight.npy`, so
/// the directory loads into nanoGPT's `state_dict` with numpy alone.
#pragma once

#include "attn/gpt.hpp"

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace attn {

/// Thrown for a weights directory that cannot be used: a missing or malformed file, a
/// tensor of the wrong shape, a config that is incomplete or inconsistent. The message names
/// the file and what was expected against what was found.
class CheckpointError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// What a checkpoint holds besides the model's sizes and weights.
struct CheckpointInfo {
    std::string vocab;      ///< the characters of the vocabulary in id order (may be empty)
    std::int64_t step = 0;  ///< the training step at which it was written
};

/// Writes `model` as a weights directory (created if needed; existing files overwritten).
/// @param dir the directory
/// @param model the model whose config and parameters are written
/// @param info the vocabulary and training step to record
void save_checkpoint(const std::filesystem::path& dir, const GPT& model,
                     const CheckpointInfo& info = {});

/// Writes a model's sizes with the given weights (a model whose weights come from a source,
/// ZeRO stage 3, holds none itself: GPT::gather_parameters()).
/// @param dir the directory
/// @param model the model whose config and parameter table are written
/// @param parameters every parameter, flat, as GPT::parameters() lays them out
/// @param info the vocabulary and training step to record
/// @throws CheckpointError when `parameters` is not the model's size
void save_checkpoint_weights(const std::filesystem::path& dir, const GPT& model, const std::vector<float>& parameters,
                             const CheckpointInfo& info = {});

/// Reads `config.json` of a weights directory.
/// @param dir the directory
/// @param info if not nullptr, receives the vocabulary and step
/// @return the model's sizes, validated
GPTConfig load_config(const std::filesystem::path& dir, CheckpointInfo* info = nullptr);

/// The weights directory a learner names: a `train_gpt` run folder (its `checkpoint/`) or a
/// weights directory itself.
/// @param dir the folder given
/// @return `dir/checkpoint` when it holds `config.json`, else `dir`
/// @throws std::runtime_error naming `dir` when it does not exist or neither holds `config.json`
std::filesystem::path weights_dir_of(const std::filesystem::path& dir);

/// Loads a weights directory written by save_checkpoint() or exported from nanoGPT.
/// @param dir the directory
/// @param info if not nullptr, receives the vocabulary and step
/// @return the model, in training mode, with the loaded weights
GPT load_checkpoint(const std::filesystem::path& dir, CheckpointInfo* info = nullptr);

/// Writes AdamW's state into a weights directory, so that training can resume exactly:
/// `adamw.m.npy` and `adamw.v.npy` (P,), the moments in the layout of GPT::parameters(), and
/// `adamw.json` with the step count and the hyperparameters.
/// @param dir the weights directory (created if needed)
/// @param optimizer the state to write
void save_optimizer(const std::filesystem::path& dir, const AdamW& optimizer);

/// Reads the AdamW state that save_optimizer() wrote.
/// @param dir the weights directory
/// @param model the model it belongs to: the moments must hold one value per parameter
/// @return the optimizer, ready to take the next step
AdamW load_optimizer(const std::filesystem::path& dir, const GPT& model);

}  // namespace attn
