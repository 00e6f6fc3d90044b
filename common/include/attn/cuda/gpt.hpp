/// @file gpt.hpp
/// @brief The GPT of attn/gpt.hpp on an NVIDIA GPU: the same parameter layout, forward and
/// backward pass, AdamW and clipping, with the layers of gpt_ops.hpp.
///
/// A plain header (no CUDA types), so that a trainer compiled as ordinary C++ can hold a
/// CudaGPT. The weights live on the device; checkpoints go through the CPU model:
/// `gpu.copy_parameters_to(cpu); save_checkpoint(dir, cpu)`, and back with
/// `load_checkpoint` and the CudaGPT constructor (or copy_parameters_from()), so the files
/// are the same whichever device wrote them.
#pragma once

#include "attn/gpt.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace attn::cuda {

/// Which attention implementation the model calls. Both compute the same function, dropout
/// masks included; they differ in memory and speed (lesson 13).
enum class AttentionKind {
    materialised,  ///< (T, T) weights stored per layer: attention_forward/backward in gpt_ops.hpp
    fused,         ///< lesson 13's kernels: no (T, T) buffer, a (B, NH, T) log-sum-exp per
                   ///< layer; head size 64 or 128 only (the constructor says otherwise)
};

/// How the GPU model computes.
struct CudaOptions {
    /// Let cuBLAS use TF32 tensor cores for the matmuls (fp32 storage and accumulation,
    /// inputs rounded to a 10-bit mantissa): several times faster, ~1e-3 relative error per
    /// product instead of ~1e-6. Off: plain fp32, the numbers the tests compare tightly.
    bool tf32 = false;
    AttentionKind attention = AttentionKind::materialised;  ///< which attention to call
    /// The format of the matrix products' inputs, as GPT::set_precision: fp32, or bf16 (the
    /// weights stay float32 and a bfloat16 copy is made at each forward pass; the Linear
    /// layers' inputs, q, k, v and the gradients entering the Linear layers' products are
    /// rounded to bfloat16 where the CPU model rounds them, the products go through
    /// cublasGemmEx with float32 sums; LayerNorm, softmax, cross-entropy, the attention's
    /// products and AdamW stay float32). fp16 is refused: it needs loss scaling, which the
    /// CPU trainer does. Not with `tf32` (the attention's float32 products would round P).
    Precision precision = Precision::fp32;
};

/// Why the GPU model cannot run a model with these options, or "" when it can: it has
/// learned positions and one key/value head per query head over the whole context only,
/// and its fused attention takes head sizes 64 and 128 with the 1/√hs scale.
/// @param config the model @param options the attention it would use
/// @return the reason, one sentence, or ""
std::string unsupported_on_gpu(const GPTConfig& config, const CudaOptions& options);

/// nanoGPT's GPT on device 0, a copy of a CPU attn::GPT.
///
/// A training step with no host synchronisation:
/// @code
/// gpu.forward_async(x, y, B, T);   // uploads the batch, enqueues the forward pass
/// gpu.zero_grad();
/// gpu.backward();
/// gpu.clip_grad_norm_async(1.0f);
/// gpu.adamw_step(optimizer, lr);   // optimizer: an attn::AdamW holding the hyper-parameters
/// float loss = gpu.loss();         // waits, only when the loss is wanted
/// @endcode
/// forward() is forward_async() followed by loss(). Dropout is applied in training mode
/// with the CPU model's masks (dropout_mask.hpp): the same seed drops the same elements.
/// Causal or not, with or without the attention's 1/√hs, as the CPU model; learned
/// positions and one key/value head per query head only (the constructor refuses others).
class CudaGPT {
public:
    /// Copies `model`'s config and parameters to the device; gradients and optimizer state
    /// start at zero. Throws std::runtime_error when there is no usable device.
    /// @param model the CPU model to copy
    /// @param options math mode and attention implementation
    /// @param seed seeds the dropout masks
    explicit CudaGPT(const GPT& model, const CudaOptions& options = {}, std::uint64_t seed = 1337);
    ~CudaGPT();
    CudaGPT(const CudaGPT&) = delete;             ///< owns device memory: not copyable
    CudaGPT& operator=(const CudaGPT&) = delete;  ///< owns device memory: not copyable

    /// The forward pass, then waits for the loss.
    /// @param inputs (B, T) host token ids in [0, V) @param targets (B, T) host, or nullptr
    /// @param B batch @param T time, 1 ≤ T ≤ block_size
    /// @return the mean cross-entropy, or NaN when targets is nullptr
    float forward(const int* inputs, const int* targets, int B, int T);

    /// The forward pass, enqueued: uploads the batch and returns without waiting. The ids
    /// are validated on the host first (std::invalid_argument, as GPT::forward).
    /// @param inputs (B, T) host token ids @param targets (B, T) host, or nullptr
    /// @param B batch @param T time
    void forward_async(const int* inputs, const int* targets, int B, int T);

    /// The mean loss of the last forward pass with targets; waits for the device.
    /// @return the loss, NaN when the last forward had no targets
    float loss();

    /// Sets every gradient to zero (enqueued).
    void zero_grad();
    /// The backward pass of the last forward call (enqueued); adds into the gradients.
    void backward();

    /// Clips the gradients' global norm to `max_norm`, as attn::clip_grad_norm, and waits.
    /// @param max_norm the largest allowed norm @return the norm before clipping
    float clip_grad_norm(float max_norm);
    /// clip_grad_norm() enqueued; the norm stays on the device until grad_norm() reads it.
    /// @param max_norm the largest allowed norm
    void clip_grad_norm_async(float max_norm);
    /// The norm measured by the last clip; waits for the device. @return the norm
    float grad_norm();

    /// One AdamW step on the device with `opt`'s hyper-parameters (beta1, beta2, eps,
    /// weight_decay, decay only where ParameterInfo::decay says); `opt.step_count` is
    /// advanced, its m and v are not touched (they live on the device: see
    /// copy_optimizer_to()).
    /// @param opt the hyper-parameters and step counter @param lr the learning rate
    void adamw_step(AdamW& opt, float lr);

    /// Switches dropout on (training) or off (evaluation). @param on true for training
    void train(bool on = true) { training_ = on; }
    /// Reseeds the dropout masks: the masks of the following passes depend only on `seed`
    /// and their order since this call, so a resumed run draws the same ones.
    /// @param seed the new seed
    void seed_dropout(std::uint64_t seed);
    /// Whether dropout is applied. @return the mode
    bool training() const { return training_; }

    /// Copies the parameters into a CPU model of the same config (waits).
    /// @param model receives the parameters
    void copy_parameters_to(GPT& model) const;
    /// Copies a CPU model's parameters to the device (waits).
    /// @param model a model of the same config
    void copy_parameters_from(const GPT& model);
    /// The gradients, in GPT::gradients()'s layout (waits).
    /// @param out resized to the number of parameters
    void copy_gradients_to(std::vector<float>& out) const;
    /// The AdamW moments into `opt.m` and `opt.v` (waits); the step counter is the caller's.
    /// @param opt receives the moments
    void copy_optimizer_to(AdamW& opt) const;
    /// Loads AdamW moments saved from the CPU or this class (waits); empty m and v mean
    /// "start fresh" (zeros).
    /// @param opt the moments, each empty or of the number of parameters
    void copy_optimizer_from(const AdamW& opt);
    /// The logits of the last forward call, (B, T, V) flat (waits).
    /// @param out resized to B·T·V
    void copy_logits_to(std::vector<float>& out) const;
    /// One position's logits from the last forward call (waits).
    /// @param out resized to V @param b batch row @param t position, both of that call
    void copy_logits_row_to(std::vector<float>& out, int b, int t) const;

    /// One step of generation with a key/value cache on the device (lesson 14), in
    /// evaluation mode (no dropout, whatever train() says): the token at position `pos`
    /// goes through every layer alone, its key and value are appended to the device's
    /// cache, and its query attends over positions 0..pos. The cache lives until the
    /// model does and starts again at pos = 0. Waits for the logits.
    /// @param logits resized to V: the logits for position pos
    /// @param token the token's id, in [0, V)
    /// @param pos its position: 0 (a new sequence) or the number of positions cached so far,
    ///        and below block_size
    /// @throws std::invalid_argument for a token or position outside those bounds, and for a
    ///         model without the causal mask or the 1/√hs (as the CPU's cache)
    void decode_step(std::vector<float>& logits, int token, int pos);

    /// Fills the device's key/value cache from a whole context (the "prefill"): one forward
    /// pass over `T` tokens in evaluation mode, whose keys and values are copied into the
    /// cache, which then holds positions 0..T−1. Leaves the model in evaluation mode.
    /// @param logits resized to V: the logits of the last position
    /// @param tokens (T) token ids in [0, V)
    /// @param T the context length, 1 ≤ T ≤ block_size
    /// @throws std::invalid_argument as forward() and decode_step()
    void prefill(std::vector<float>& logits, const int* tokens, int T);

    /// Waits until every enqueued operation has finished.
    void synchronize() const;

    const GPTConfig& config() const { return config_; }  ///< the model's sizes
    std::size_t num_parameters() const { return num_parameters_; }  ///< floats in the flat buffer

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
    GPTConfig config_;
    std::size_t num_parameters_ = 0;
    bool training_ = true;
};

}  // namespace attn::cuda
