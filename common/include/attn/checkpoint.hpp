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
///
/// `checksums.json` lists every other file of the directory with its FNV-1a 64-bit hash
/// (file_checksum()); a directory that has one is checked file by file before it is read, and
/// a file changed after it was written is refused, named (a directory without one, such as
/// nanoGPT's export, is read as it is).
///
/// A checkpoint of ranks that each keep a shard (ZeRO, attn/mpi/zero.hpp; tensor parallelism,
/// attn/mpi/tensor_parallel.hpp: a rank's slices) is written sharded:
/// `shards.json` (the layout) and one `shard-<rank>.bin` per rank, each rank's weights and AdamW
/// moments, in place of the `.npy` files. Every reader here (load_checkpoint(),
/// Trainer::load) reads both layouts; consolidate_checkpoint() turns the sharded one into the
/// one-process one.
#pragma once

#include "attn/gpt.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <utility>
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

/// Writes `config.json` alone: the model's sizes, the vocabulary and the step (the part of
/// save_checkpoint() a sharded checkpoint shares). @param dir an existing directory
/// @param model the model @param info the vocabulary and training step to record
void save_model_config(const std::filesystem::path& dir, const GPT& model, const CheckpointInfo& info = {});

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
/// A sharded checkpoint's weights are read tensor by tensor from its ranks' files.
/// @param info if not nullptr, receives the vocabulary and step
/// @param check_sums whether to check the files against `checksums.json` first (verify_checksums)
/// @return the model, in training mode, with the loaded weights
GPT load_checkpoint(const std::filesystem::path& dir, CheckpointInfo* info = nullptr, bool check_sums = true);

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

/// The FNV-1a 64-bit hash of a file's bytes, read in pieces of 64 KiB (never the whole file).
/// @param file the file @return the hash @throws CheckpointError when it cannot be read
std::uint64_t file_checksum(const std::filesystem::path& file);

/// Writes `dir/checksums.json`: every other regular file under `dir` (its path relative to
/// `dir`) with file_checksum(), or the hash given in `known` for a file already hashed as it was
/// written. @param dir the directory @param known relative path → hash, for files not re-read
void write_checksums(const std::filesystem::path& dir,
                     const std::vector<std::pair<std::string, std::uint64_t>>& known = {});

/// Checks every file `dir/checksums.json` lists against its hash; nothing when there is no
/// such file. @param dir the directory
/// @throws CheckpointError naming the first file that is missing or whose bytes changed, or
/// checksums.json itself when it is not valid
void verify_checksums(const std::filesystem::path& dir);

/// The layout of a sharded checkpoint (`shards.json`): which runs of the flat parameter buffer
/// (GPT::parameters()) each rank's file holds. A file holds, as raw little-endian float32, the
/// weights of its runs one after the other, then their first moments, then their second
/// moments; together the files' runs cover every parameter exactly once.
struct ShardLayout {
    /// One rank's file.
    struct File {
        std::string name;                       ///< e.g. "shard-00002.bin"
        std::vector<AdamW::Segment> segments;   ///< its runs, in the file's order
        std::size_t floats() const;             ///< the parameters of its runs
    };
    std::string scheme;          ///< how the ranks were sharded: "zero-1", "zero-2", "zero-3", "tensor-parallel"
    int ranks = 0;               ///< the ranks that wrote it
    std::size_t parameters = 0;  ///< P
    std::vector<File> files;     ///< one per rank, in rank order
};

/// What is in a sharded checkpoint's file: AdamW's moments or the weights.
enum class ShardPart { weights = 0, m = 1, v = 2 };

/// Whether `dir` holds a sharded checkpoint (a `shards.json`). @param dir the directory
bool is_sharded_checkpoint(const std::filesystem::path& dir);

/// Reads and checks `dir/shards.json`. @param dir the directory @param parameters the model's P
/// @return the layout @throws CheckpointError for a layout that is malformed, of another P,
/// or whose runs do not cover every parameter exactly once
ShardLayout read_shard_layout(const std::filesystem::path& dir, std::size_t parameters);

/// Writes one rank's file of a sharded checkpoint: the weights of `segments`, then m, then v.
/// @param file the file @param segments its runs
/// @param weights segment k's weights (k → its first float)
/// @param m segment k's first moments, or nullptr for zeros (no step taken yet)
/// @param v the same for the second moments
/// @return file_checksum() of what was written (computed while writing)
std::uint64_t write_shard_file(const std::filesystem::path& file, const std::vector<AdamW::Segment>& segments,
                               const std::function<const float*(std::size_t k)>& weights,
                               const std::function<const float*(std::size_t k)>& m,
                               const std::function<const float*(std::size_t k)>& v);

/// Reads one part of the runs `wanted` of the flat buffer from a sharded checkpoint, reading
/// only the ranges of the files that hold them. @param dir the directory @param layout its
/// layout @param part the weights or a moment @param wanted the runs @param out receives the
/// runs' floats one after the other (resized) @throws CheckpointError for a file cut short
void read_shard_ranges(const std::filesystem::path& dir, const ShardLayout& layout, ShardPart part,
                       const std::vector<AdamW::Segment>& wanted, std::vector<float>& out);

/// Writes the one-process checkpoint (the weights directory, `optimizer/m.npy` and `v.npy`,
/// `trainer.json`, `checksums.json`) of a sharded one, one tensor at a time: what a run in one
/// process at the same state would have written, byte for byte. @param dir the sharded
/// checkpoint (checked against its checksums first) @param out the directory to write
/// (replaced atomically)
void consolidate_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& out);

}  // namespace attn
