/// @file paged_engine.hpp
/// @brief Lesson 20's batched step on the GPU: attn::forward_paged with the weights, the
/// key/value pool and every product on the device.
///
/// A plain header (no CUDA types), so that the server, compiled as ordinary C++, can hold one.
#pragma once

#include "attn/gpt.hpp"
#include "attn/paged_cache.hpp"

#include <memory>
#include <string>
#include <vector>

namespace attn::cuda {

/// The step of attn::forward_paged on device 0, behind the attn::PagedStep interface that the
/// scheduler calls.
///
/// The model's weights are uploaded once, at construction. The keys and values live in a
/// device pool laid out as the CPU cache's, (L, num_blocks, G, Bt, hs) each, which mirrors
/// one attn::PagedKVCache: that cache stays the owner of the block tables, the reference
/// counts, the prefix cache's registrations and copy on write, and the engine writes each
/// row's key and value where the cache's append_slot puts it. A block the cache copies on
/// write is copied on the device too (the engine sets the cache's block-copy hook). The
/// cache's own rows of floats are not used; the device's are the ones attended over.
///
/// A step: the rows' token ids, positions and slots go up; per layer LayerNorm, c_attn by
/// cuBLAS, RoPE at each row's position, the keys and values stored, attention by
/// paged_attention_forward (each row a query over its own sequence's block table up to its
/// own position, so the rows of a prompt chunk read the ones before them), c_proj, the MLP;
/// then ln_f and the LM head, and the (R, V) logits come back for sampling on the CPU.
/// Every model forward_paged runs runs here: learned positions, RoPE and ALiBi, grouped
/// key/value heads, a sliding window, with or without biases.
class PagedEngine final : public attn::PagedStep {
public:
    /// Uploads `model`'s weights and makes a zeroed device pool of `cache`'s blocks.
    /// @param model a causal model with scaled attention, its parameters in memory (not a
    ///        weight source); read at construction only
    /// @param cache an empty pool of the model's sizes, which this engine mirrors until it is
    ///        destroyed
    /// @throws std::invalid_argument for a model forward_paged refuses or a cache of other
    ///         sizes; std::runtime_error without a usable device
    PagedEngine(const GPT& model, PagedKVCache& cache);
    ~PagedEngine() override;  ///< frees the device's memory and takes its hook off the cache
    PagedEngine(const PagedEngine&) = delete;             ///< owns device memory: not copyable
    PagedEngine& operator=(const PagedEngine&) = delete;  ///< owns device memory: not copyable

    /// One step, as attn::forward_paged(scratch, model, cache, rows), on the device.
    /// @param cache the cache given at construction  @param rows the batch
    /// @return (rows, V) the logits, on the host
    /// @throws as forward_paged (nothing changes), and std::invalid_argument for another cache
    const std::vector<float>& forward(PagedKVCache& cache, const std::vector<PagedRow>& rows) override;
    const GPT& model() const override { return model_; }  ///< the model whose weights it holds
    /// "gpu: " and the device's summary, or, in the simulated build, that the CUDA simulator
    /// runs the device code on the CPU (a check of the code, not a GPU's speed).
    std::string device() const override;

    /// One layer's keys of one block as the device holds them, (G, Bt, hs) (waits).
    /// @param layer in [0, L)  @param block in [0, num_blocks)
    std::vector<float> block_keys(int layer, int block) const;
    /// One layer's values of one block, (G, Bt, hs) (waits).
    std::vector<float> block_values(int layer, int block) const;

private:
    struct Impl;
    const GPT& model_;
    PagedKVCache& cache_;
    std::unique_ptr<Impl> impl_;
};

}  // namespace attn::cuda
