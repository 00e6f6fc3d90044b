/// @file gpt.hpp
/// @brief nanoGPT's GPT language model on the CPU: parameters in one flat buffer, activations
/// preallocated, forward and hand-written backward pass, AdamW and gradient clipping.
///
/// The model: token + learned position embeddings (or, by GPTConfig::position, rotary
/// embeddings or ALiBi inside attention instead); n_layer pre-norm blocks, each
/// `x = x + attn(ln_1(x))`, `x = x + mlp(ln_2(x))` with causal multi-head attention (fused
/// `c_attn` (3C, C), output projection `c_proj` (C, C)) and an MLP (`c_fc` (4C, C), exact
/// GELU, `c_proj` (C, 4C)); a final LayerNorm; the LM head shares its weight with `wte`.
/// The layers are the functions of gpt_layers.hpp.
#pragma once

#include "attn/dropout_mask.hpp"
#include "attn/precision.hpp"
#include "attn/random.hpp"

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace attn {

/// Where the model learns the order of its tokens.
enum class Position {
    learned,  ///< nanoGPT's learned absolute embedding `wpe` (block_size, C), added to `wte`
    rope,     ///< rotary embeddings (Su et al. 2021): q and k rotated by position; no `wpe`
    alibi,    ///< ALiBi (Press et al. 2021): a per-head bias m·(j − i) on the scores; no `wpe`
};

/// The scheme's name as `train_gpt --position` and `config.json` spell it.
/// @param p the scheme @return "learned", "rope" or "alibi"
const char* position_name(Position p);

/// The scheme of a name: "learned", "rope" or "alibi".
/// @param name the name @return the scheme
/// @throws std::invalid_argument for any other name, listing the three
Position parse_position(const std::string& name);

/// The model's sizes, with nanoGPT's names.
struct GPTConfig {
    int vocab_size = 65;   ///< V, the number of token ids
    int block_size = 256;  ///< the longest sequence the model reads (rows of `wpe`)
    int n_layer = 6;       ///< L, the number of transformer blocks
    int n_head = 6;        ///< NH, heads per attention layer; must divide n_embd
    int n_embd = 384;      ///< C, the width of the residual stream
    float dropout = 0.0f;  ///< dropout probability in training mode, in [0, 1)
    bool bias = true;      ///< whether the Linear layers and LayerNorms have biases
    bool causal = true;    ///< whether attention is causally masked (false: to see why it must be)
    /// Where position enters: learned (nanoGPT's `wpe`, T ≤ block_size) or rope / alibi (no
    /// `wpe`; any T, block_size is then only the training context)
    Position position = Position::learned;
    /// whether the attention scores are divided by √hs (false: q·kᵀ as it is, to measure
    /// what the factor does; CPU only)
    bool scaled_attention = true;
    /// G, the key/value heads: 0 (or n_head) is multi-head attention, nanoGPT's; 1 is
    /// multi-query attention (Shazeer 2019); 1 < G < n_head is grouped-query attention
    /// (Ainslie et al. 2023), query head h reading key/value head h / (n_head / G). Must
    /// divide n_head. `c_attn` then produces C + 2·G·hs channels: q, then G keys, then G values.
    int n_kv_head = 0;
    /// W, the sliding window: query i sees keys i − W + 1 … i only (Child et al. 2019,
    /// Beltagy et al. 2020, Mistral 7B); 0 is the full causal context.
    int window = 0;

    /// Throws std::invalid_argument naming the first size that is not usable.
    void validate() const;
    /// G, the key/value heads actually used: n_kv_head, or n_head when it is 0.
    int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
    /// The width of `c_attn`'s output, C + 2·G·hs (3C for multi-head attention).
    int qkv_channels() const { return n_embd + 2 * kv_heads() * (n_embd / n_head); }
    /// The number of parameters (the tied embedding counted once).
    std::size_t num_parameters() const;
};

/// Which attention the CPU model's passes call. Both compute the same function; they
/// differ in memory and speed (lesson 13).
enum class AttentionKind {
    materialised,  ///< attention_forward/backward: the (B, NH, T, T) weights kept per layer
    fused,         ///< attention_fused_forward/backward: a (B, NH, T) log-sum-exp per layer,
                   ///< the weights recomputed tile by tile; no dropout on the weights, so a
                   ///< training pass with dropout uses the materialised attention
};

/// Why the fused attention cannot run a model, or "" when it can: it has one key/value head
/// per query head, no window, no ALiBi bias and always divides the scores by √hs.
/// @param config the model @return the reason, one sentence, or ""
std::string fused_attention_unsupported(const GPTConfig& config);

/// What the forward pass keeps for the backward pass, and what the backward pass computes
/// again instead (activation checkpointing). Every mode computes the same gradients, bit for
/// bit: the recomputation repeats the forward pass's own operations on the same inputs, the
/// dropout masks included (a hash of the pass, the site and the element: dropout_mask.hpp).
enum class Recompute {
    none,       ///< every block's tensors kept, L copies of each (nanoGPT's, llm.c's)
    attention,  ///< Megatron's selective recomputation (Korthikanti et al. 2022): every block's
                ///< tensors but the attention weights and their dropout (B, NH, T, T), which
                ///< are kept for one block at a time and recomputed from the saved q, k, v
                ///< before its backward pass. The fused attention keeps no weights: the same.
    blocks,     ///< Chen et al. 2016: only each block's input (and output) kept; each block's
                ///< forward pass runs again from its input, into one block's buffers, just
                ///< before its backward pass: one more forward pass of the blocks per step
};

/// The mode's name as `train_gpt --recompute` and `trainer.json` spell it.
/// @param r the mode @return "none", "attention" or "blocks"
const char* recompute_name(Recompute r);

/// The mode of a name: "none", "attention" or "blocks".
/// @param name the name @return the mode
/// @throws std::invalid_argument for any other name, listing the three
Recompute parse_recompute(const std::string& name);

/// One named parameter tensor inside the flat parameter buffer.
struct ParameterInfo {
    std::string name;  ///< nanoGPT's state_dict key, e.g. `transformer.h.0.ln_1.weight`
    std::vector<std::size_t> shape;  ///< PyTorch's shape, e.g. (3C, C) for `c_attn.weight`
    std::size_t offset = 0;          ///< where it starts in the flat buffer (floats)
    std::size_t size = 0;            ///< the product of the shape
    bool decay = false;  ///< whether AdamW decays it (nanoGPT: tensors of 2 or more dims)
};

/// Parameter tensors whose gradients GPT::backward() completes together: one block's
/// tensors, or the embeddings with the final LayerNorm.
struct GradientBucket {
    std::string name;  ///< "transformer.h.<l>" for a block, "embeddings and ln_f" for the rest
    /// (offset, size) in the flat buffer of each tensor, in parameter_table() order
    std::vector<std::pair<std::size_t, std::size_t>> ranges;
    std::size_t size = 0;  ///< floats in all its ranges
};

/// Where a model's weights come from while it keeps no whole buffer of them (ZeRO stage 3:
/// GPT::set_weight_source). A bucket is one of GPT::gradient_buckets(), its ranges one after
/// the other in the buffer.
struct WeightSource {
    /// Begins filling `weights` with bucket `bucket`'s weights; may return before it is done.
    std::function<void(int bucket, float* weights)> start;
    /// Returns once the oldest started bucket, `bucket`, is filled (empty: start fills it
    /// before it returns).
    std::function<void(int bucket)> wait;
};

/// Pointers to the parameter tensors inside one flat buffer, grouped by kind as llm.c does:
/// the L blocks' tensors of one kind lie one after the other. A bias is nullptr when the
/// model has none (GPTConfig::bias false).
struct ParameterTensors {
    float* wte = nullptr;       ///< (V, C) token embedding, also the LM head
    float* wpe = nullptr;       ///< (block_size, C) position embedding; nullptr unless learned
    float* ln1w = nullptr;      ///< (L, C)
    float* ln1b = nullptr;      ///< (L, C)
    float* qkvw = nullptr;      ///< (L, C + 2·G·hs, C) `attn.c_attn.weight` (3C rows for G = NH)
    float* qkvb = nullptr;      ///< (L, C + 2·G·hs)
    float* attprojw = nullptr;  ///< (L, C, C) `attn.c_proj.weight`
    float* attprojb = nullptr;  ///< (L, C)
    float* ln2w = nullptr;      ///< (L, C)
    float* ln2b = nullptr;      ///< (L, C)
    float* fcw = nullptr;       ///< (L, 4C, C) `mlp.c_fc.weight`
    float* fcb = nullptr;       ///< (L, 4C)
    float* fcprojw = nullptr;   ///< (L, C, 4C) `mlp.c_proj.weight`
    float* fcprojb = nullptr;   ///< (L, C)
    float* lnfw = nullptr;      ///< (C) `transformer.ln_f.weight`
    float* lnfb = nullptr;      ///< (C)
};

/// The forward pass's saved activations, sized for one (B, T) and reused every step.
/// Per-layer tensors are stacked along a leading L axis. With recomputation
/// (GPT::set_recompute) some hold one block's only, the L of their shapes then 1: `att` and
/// `att_dropped` with Recompute::attention, every per-layer tensor but `residual3` (the
/// blocks' outputs, each the next block's input) with Recompute::blocks.
struct Activations {
    std::vector<float> encoded;       ///< (B, T, C) embeddings (after dropout)
    std::vector<float> ln1;           ///< (L, B, T, C)
    std::vector<float> ln1_mean;      ///< (L, B, T)
    std::vector<float> ln1_rstd;      ///< (L, B, T)
    std::vector<float> qkv;           ///< (L, B, T, 3C)
    std::vector<float> atty;          ///< (L, B, T, C) heads' outputs before `c_proj`
    std::vector<float> att;           ///< (L, B, NH, T, T) attention weights; empty until a
                                      ///< pass uses the materialised attention
    std::vector<float> att_lse;       ///< (L, B, NH, T) the fused attention's log-sum-exps
    std::vector<float> att_dropped;   ///< (L, B, NH, T, T) after dropout; empty without dropout
    std::vector<float> attproj;       ///< (L, B, T, C) `c_proj` output (after dropout)
    std::vector<float> residual2;     ///< (L, B, T, C) residual stream after attention
    std::vector<float> ln2;           ///< (L, B, T, C)
    std::vector<float> ln2_mean;      ///< (L, B, T)
    std::vector<float> ln2_rstd;      ///< (L, B, T)
    std::vector<float> fch;           ///< (L, B, T, 4C) `c_fc` output
    std::vector<float> fch_gelu;      ///< (L, B, T, 4C)
    std::vector<float> fcproj;        ///< (L, B, T, C) MLP output (after dropout)
    std::vector<float> residual3;     ///< (L, B, T, C) residual stream after the MLP
    std::vector<float> lnf;           ///< (B, T, C)
    std::vector<float> lnf_mean;      ///< (B, T)
    std::vector<float> lnf_rstd;      ///< (B, T)
    std::vector<float> logits;        ///< (B, T, V)
    std::vector<float> probs;         ///< (B, T, V) softmax of the logits
    std::vector<float> losses;        ///< (B, T) per-position cross-entropy
    std::vector<float> encoded_mask;  ///< (B, T, C) dropout factors; empty without dropout
    std::vector<float> attproj_mask;  ///< (L, B, T, C) dropout factors; empty without dropout
    std::vector<float> fcproj_mask;   ///< (L, B, T, C) dropout factors; empty without dropout
};

/// The backward pass's working buffers for one layer at a time, sized for one (B, T).
struct GradientScratch {
    std::vector<float> dresidual;  ///< (B, T, C) gradient of the residual stream
    std::vector<float> dln;        ///< (B, T, C) gradient of a LayerNorm output
    std::vector<float> dqkv;       ///< (B, T, 3C)
    std::vector<float> datty;      ///< (B, T, C)
    std::vector<float> dfch;       ///< (B, T, 4C) gradient of the `c_fc` output
    std::vector<float> dfch_gelu;  ///< (B, T, 4C)
    std::vector<float> dlogits;    ///< (B, T, V)
    std::vector<float> datt;       ///< (B, NH, T, T) attention backward scratch, as `att`
    std::vector<float> dinner;     ///< (B, T, C) gradient of a block's branch output
};

/// The bytes a model holds in one process, by what they hold: measured from the buffers the
/// library has allocated (their capacity), not from a formula. Lesson 21 prints them beside
/// mixed-precision AdamW's 16 bytes per parameter.
struct MemoryUse {
    std::size_t weights = 0;      ///< the float32 parameters, and their 16-bit copy in mixed precision
    std::size_t gradients = 0;    ///< the gradients, with the batch slices' own (one per extra thread)
    std::size_t optimizer = 0;    ///< AdamW's two moments (added by the caller: AdamW::bytes())
    std::size_t activations = 0;  ///< what the forward pass keeps for the backward pass, and its scratch
    /// Everything. @return the sum of the four
    std::size_t total() const { return weights + gradients + optimizer + activations; }
};

/// Which whole buffers a GPT allocates (GPT's constructor).
struct GPTBuffers {
    bool weights = true;    ///< the flat parameter buffer, initialised
    bool gradients = true;  ///< the flat gradient buffer
};

/// nanoGPT's GPT with its parameters, gradients and activations in preallocated buffers.
///
/// Typical step: `float loss = model.forward(x, y, B, T); model.zero_grad();
/// model.backward(); optimizer.step(model, lr);`. The activation buffers are allocated by
/// the first forward call and again only when (B, T) changes, so a training loop with fixed
/// sizes allocates nothing per step. Not copyable (the pointers point into its own
/// buffers); movable.
///
/// Both passes run on the threads of threads.hpp, each thread on its own slice of the
/// batch's sequences (data parallelism inside one process); a dropout mask is a hash of
/// each element's index in the whole batch (dropout_mask.hpp), so the slices draw the
/// masks the whole batch would, and the GPU model draws the same ones. The results agree
/// with a single thread's to float rounding (tests/test_threads.cpp).
class GPT {
public:
    /// A model with nanoGPT's initialisation: weights N(0, 0.02), the residual projections
    /// (`attn.c_proj`, `mlp.c_proj`) N(0, 0.02/√(2·n_layer)), biases 0, LayerNorm weights 1.
    /// @param config the sizes; validated
    /// @param seed seeds the initialisation and the dropout masks
    /// @param buffers which whole buffers to allocate: a model whose weights a group keeps in
    /// shards (ZeRO stage 3) or whose gradients go to a sink (stages 2 and 3) starts without
    /// them, so that no process ever holds the whole model (PyTorch's meta-device init); such
    /// a model runs only once the group has given it a weight source and a gradient sink
    explicit GPT(const GPTConfig& config, std::uint64_t seed = 1337, GPTBuffers buffers = {});

    /// The values the constructor gives (or gave) the parameters of `runs` of the flat
    /// buffer, computed alone, bit for bit the same: each run's place in the random stream
    /// of the initialisation is reached with Rng::advance, without drawing what comes
    /// before it. @param runs (offset, size) of each run @return their values, one run after
    /// the other
    std::vector<float> initial_values(const std::vector<std::pair<std::size_t, std::size_t>>& runs) const;
    /// Leaves weights of `runs` for the group that will keep them (a checkpoint's shard that
    /// Trainer::load read into a model made without whole weights).
    /// @param runs (offset, size) of each run @param values their weights, one run after the other
    void set_kept_weights(std::vector<std::pair<std::size_t, std::size_t>> runs, std::vector<float> values);
    /// The weights of `runs` for a model without whole weights: those set_kept_weights() left
    /// for these runs (handed over once), else the initial ones (initial_values).
    /// @param runs (offset, size) of each run @return their values, one run after the other
    std::vector<float> take_kept_weights(const std::vector<std::pair<std::size_t, std::size_t>>& runs);

    GPT(const GPT&) = delete;                  ///< not copyable
    GPT& operator=(const GPT&) = delete;       ///< not copyable
    GPT(GPT&&) noexcept = default;             ///< movable: the buffers keep their addresses
    GPT& operator=(GPT&&) noexcept = default;  ///< movable

    /// The forward pass.
    /// @param inputs (B, T) token ids in [0, V)
    /// @param targets (B, T) the next tokens, or nullptr to compute the logits only
    /// @param B batch size
    /// @param T sequence length, 1 ≤ T ≤ block_size with learned positions, any T ≥ 1 with
    ///        rope or alibi
    /// @return the mean cross-entropy over B·T positions, or NaN when targets is nullptr
    float forward(const int* inputs, const int* targets, int B, int T);

    /// Convenience overload for (B, T) ids in vectors of B·T elements.
    /// @param inputs (B, T) @param targets (B, T), or empty @param B batch @param T time
    /// @return as forward(const int*, const int*, int, int)
    float forward(const std::vector<int>& inputs, const std::vector<int>& targets, int B, int T);

    /// Sets every parameter gradient to zero.
    void zero_grad();

    /// The backward pass of the last forward call, which must have had targets: adds
    /// d(mean loss)/d(parameter) into grads (call zero_grad() first for a fresh gradient).
    void backward();

    /// The backward pass of `loss_scale` · (mean loss): every gradient comes out multiplied
    /// by `loss_scale`, which keeps small gradients above float16's underflow where the
    /// products round their inputs (set_precision); the caller divides it out again.
    /// @param loss_scale the factor, positive (1: backward())
    void backward(float loss_scale);

    /// Mixed precision: the inputs of the matrix products of the following passes are
    /// rounded to `p` and their products summed in float32, as tensor cores do, while the
    /// parameters, the optimizer and everything between the products stay float32. Rounded:
    /// the Linear layers' inputs (ln_1, the attention's output, ln_2, GELU's output, ln_f)
    /// and weights (a rounded copy, made at each forward pass), q, k and v, and in the
    /// backward pass the gradients that enter the Linear layers' products. The attention
    /// weights P and the gradients inside attention stay float32. fp32 (a new model's): no
    /// rounding at all.
    /// @param p the format of the products' inputs
    void set_precision(Precision p) { precision_ = p; }
    /// The format chosen by set_precision().
    Precision precision() const { return precision_; }
    /// What rounding lost in the forward passes since reset_rounding_counts(): the
    /// activations entering products (values flushed to zero, made subnormal, overflowed).
    const RoundingCounts& forward_rounding() const { return forward_rounding_; }
    /// What rounding lost in the backward passes since reset_rounding_counts(): the
    /// gradients entering the Linear layers' products. Gradients flushed to zero here are
    /// float16's underflow, which loss scaling prevents.
    const RoundingCounts& gradient_rounding() const { return gradient_rounding_; }
    /// Sets both counts to zero.
    void reset_rounding_counts() { forward_rounding_ = gradient_rounding_ = {}; }

    /// Switches dropout on (training) or off (evaluation), as `nn.Module.train()`.
    /// @param on true for training mode
    void train(bool on = true) { training_ = on; }
    /// Whether dropout is applied.
    bool training() const { return training_; }
    /// Chooses the attention of the next passes (materialised, as a new model, or fused).
    /// @param kind the attention to call
    /// @throws std::invalid_argument for the fused attention with ALiBi positions (the
    ///         fused path adds no bias to its scores)
    void set_attention(AttentionKind kind);
    /// The attention chosen by set_attention().
    AttentionKind attention() const { return attention_; }
    /// Chooses what the following forward passes keep and their backward passes recompute
    /// (activation checkpointing). The gradients are the same, bit for bit, in every mode;
    /// memory_use() measures what each keeps.
    /// @param mode none (a new model's), attention or blocks
    void set_recompute(Recompute mode) { recompute_ = mode; }
    /// The mode chosen by set_recompute().
    Recompute recompute() const { return recompute_; }
    /// Where this batch lies in a larger one that several processes share, each running
    /// the model on its own consecutive sequences (data parallelism, lesson 19): the dropout
    /// masks of the following passes are then those of the whole batch's sequences
    /// `first_sequence`, `first_sequence + 1`, …, so that the processes together drop what
    /// one process with the whole batch would. 0 (the default) for a batch of its own.
    /// @param first_sequence the index of this batch's first sequence in the whole batch
    void set_batch_offset(int first_sequence);
    /// The number of sequences of the whole batch whose mean loss the following backward
    /// passes differentiate: each position's gradient is divided by `sequences`·T, the
    /// positions of the whole batch, instead of this batch's B·T. Processes that share a
    /// batch (data parallelism) then hold parts of the whole batch's mean gradient whose sum
    /// is the gradient, with the values entering the products the same as one process's
    /// (under mixed precision a factor B/b applied after the pass would round them
    /// differently). 0 (the default): this batch's own mean.
    /// @param sequences the whole batch's sequences, at least this batch's B, or 0
    void set_whole_batch(int sequences);
    /// The gradient buckets in the order backward() completes them: block L−1, …, block 0,
    /// then the embeddings and ln_f (the tied `wte` collects gradient at both ends of the
    /// pass, so it is complete only at the end). Together they hold every parameter once.
    const std::vector<GradientBucket>& gradient_buckets() const { return buckets_; }
    /// Calls `ready(b)` during every following backward(), on the thread that called it, as
    /// soon as bucket b of gradient_buckets() is complete (its gradients summed over the
    /// threads' slices and final), so that data parallelism can start summing it over the
    /// processes while the pass goes on. The gradients are the same, bit for bit, as
    /// without a hook. An empty function removes the hook.
    /// @param ready called with each bucket's index, in order 0, 1, …
    /// @throws std::invalid_argument with a gradient sink set (set_gradient_sink)
    void set_gradient_ready_hook(std::function<void(int bucket)> ready);
    /// ZeRO stage 2's gradients (attn/mpi/zero.hpp, lesson 21): while a sink is set, the model
    /// keeps no whole gradient buffer. backward() writes each bucket of gradient_buckets()
    /// into a buffer of that bucket's size (its ranges one after the other, in order), sums it
    /// over the threads' slices and calls `sink(b, buffer)` as soon as bucket b is complete,
    /// on the thread that called backward(); a block's buffer is reused for the next block
    /// once the call returns. The gradients are those backward() would leave in gradients(),
    /// bit for bit. Meanwhile gradients() is empty, grads() all null, zero_grad() has nothing
    /// to clear, and memory_use() counts the buckets' buffers (one block's and the
    /// embeddings', per thread). An empty function brings back a whole buffer of zeros.
    /// @param sink takes each bucket's index, in order 0, 1, …, and its gradients
    /// @throws std::invalid_argument with a gradient hook set (set_gradient_ready_hook)
    void set_gradient_sink(std::function<void(int bucket, float* gradients)> sink);
    /// Whether a gradient sink is set. @return whether backward() hands its buckets to one
    bool has_gradient_sink() const { return static_cast<bool>(sink_); }
    /// ZeRO stage 3's weights (attn/mpi/zero.hpp, lesson 21): while a source is set, the model
    /// keeps no whole parameter buffer. Each pass asks for the weights it is about to use, a
    /// bucket of gradient_buckets() at a time, laid out as the sink's buffers are (the
    /// bucket's ranges one after the other): `source.start(b, buffer)` begins filling
    /// `buffer` and `source.wait(b)` returns once it is filled (without `wait`, start fills
    /// it before it returns). A forward pass starts the embeddings and ln_f (bucket L) and
    /// block 0 together, and waits for the embeddings; backward() starts bucket L and the
    /// last block, and waits for bucket L. Before block l each pass waits for its weights and
    /// at once starts the next block's (l + 1 going forward, l − 1 going back), so that the
    /// next block's weights arrive while this one computes (FSDP's prefetch). So the model
    /// keeps two blocks' buffers, which it alternates, and the embeddings' (memory_use()
    /// counts them as weights); a buffer is refilled only once every thread is done with the
    /// block it held. The calls come from the thread that called forward() or backward(), in
    /// the same order on every process whose passes are the same, so that a source may gather
    /// each bucket collectively, and no request is left unwaited when a pass returns.
    /// Meanwhile parameters() is empty and params() all null; the passes compute in float32
    /// only (forward() refuses another precision) and backward() needs a gradient sink. A
    /// source with no `start` brings back a whole buffer, filled by asking the old source for
    /// every bucket once.
    /// @param source starts and waits for a bucket's weights
    void set_weight_source(WeightSource source);
    /// Whether a weight source is set. @return whether the passes ask one for their weights
    bool has_weight_source() const { return static_cast<bool>(source_.start); }
    /// Every parameter, flat: a copy of parameters(), or with a weight source every bucket
    /// asked of it once (a collective call when the source gathers). @return the parameters
    std::vector<float> gather_parameters() const;
    /// Reseeds the dropout masks: the masks of the following forward passes depend only on
    /// `seed` and their order since this call (dropout_site_seed), as on the GPU model.
    /// @param seed the new seed
    void seed_dropout(std::uint64_t seed) {
        dropout_seed_ = seed;
        forward_calls_ = 0;
    }

    const GPTConfig& config() const { return config_; }  ///< the model's sizes
    /// The name, shape and place in the flat buffer of every parameter tensor, in
    /// state_dict order (the tied `lm_head.weight` is not listed: it is `transformer.wte.weight`).
    const std::vector<ParameterInfo>& parameter_table() const { return table_; }

    /// Every parameter, flat (empty while a weight source is set: set_weight_source)
    std::vector<float>& parameters() { return params_memory_; }
    const std::vector<float>& parameters() const { return params_memory_; }  ///< read-only
    std::vector<float>& gradients() { return grads_memory_; }  ///< every gradient, same layout
    const std::vector<float>& gradients() const { return grads_memory_; }  ///< read-only
    const ParameterTensors& params() const { return params_; }  ///< pointers into parameters()
    const ParameterTensors& grads() const { return grads_; }    ///< pointers into gradients()
    /// The bytes this model holds now (the activations once a forward pass has sized them).
    /// @return weights, gradients and activations; `optimizer` is 0
    MemoryUse memory_use() const;

    /// The activations of the last forward call.
    const Activations& activations() const { return acts_; }
    /// The logits of the last forward call, (B, T, V) flat.
    const std::vector<float>& logits() const { return acts_.logits; }
    int batch_size() const { return B_; }       ///< B of the last forward call (0 before any)
    int sequence_length() const { return T_; }  ///< T of the last forward call (0 before any)

private:
    void allocate_activations(int B, int T);
    // Rounds one slice's buffer of a pass to precision_, counting into `counts`.
    void round_for_product(float* x, std::size_t n, RoundingCounts& counts) const;
    // The passes over the sequences [b0, b0 + B) of the batch, run by one thread each.
    // With `layer_start`, every slice calls it before block l (set_weight_source's fetch).
    void forward_slice(int b0, int B, const std::function<void(int)>* layer_start = nullptr);
    // Block l's saved tensors at the slice that starts at sequence b0 (model.cpp).
    struct BlockTensors;
    BlockTensors block_tensors(int l, int b0);
    // Block l's forward pass over the slice [b0, b0 + B) from its input `residual`: its saved
    // tensors written where block_tensors() says, and `out` (its output) unless it is null.
    // The forward pass calls it, and the backward pass again with Recompute::blocks.
    void block_forward(int b0, int B, int l, const float* residual, float* out, RoundingCounts& rounded);
    // The seed and first element of dropout site (layer, part) in the last forward pass, for
    // the slice's first element `first` in the whole batch.
    DropoutSite dropout_site_of(int layer, int part, std::size_t first) const;
    // layer_done(l), when given, is called by every slice after block l's backward. With
    // `block`, every block's gradients go to that buffer (laid out as block_layout_), and
    // `grads` is read for the embeddings' and ln_f's only.
    void backward_slice(int b0, int B, const ParameterTensors& grads,
                        const std::function<void(int)>* layer_done = nullptr, float* block = nullptr,
                        const std::function<void(int)>* layer_start = nullptr);
    // Inside a pass's parallel region, called by every slice before block `layer`: waits for
    // the weight source to fill the block's buffer, then starts block `next`'s (none if out
    // of range) into the other buffer.
    void fetch_block(int layer, int next);
    // Before a pass: starts the embeddings' and block `first`'s weights, waits for the embeddings'.
    void start_pass_weights(int first);
    // Starts block `layer`'s weights into its buffer (layer % 2).
    void start_block(int layer);
    // The weights of block `layer` that the passes read: a slice of `t`'s stacked tensors,
    // or the weight source's block buffer.
    ParameterTensors block_weights(const ParameterTensors& t, int layer) const;
    // The tensors of a buffer laid out as parameters() (the whole model's).
    ParameterTensors whole_at(float* base) const;
    void backward_to_sink();
    // The tensors of block `layer` within stacked tensors `t` (the others as in t).
    ParameterTensors layer_view(const ParameterTensors& t, int layer) const;

    GPTConfig config_;
    std::vector<ParameterInfo> table_;
    std::vector<float> params_memory_;
    std::vector<float> grads_memory_;
    // Gradients of the second, third, ... batch slice of a backward pass, before they are
    // added into grads_memory_: same layout.
    std::vector<std::vector<float>> slice_grads_;
    ParameterTensors params_;
    ParameterTensors grads_;
    Activations acts_;
    GradientScratch scratch_;
    std::vector<int> inputs_;   // (B, T) of the last forward call
    std::vector<int> targets_;  // (B, T) of the last forward call
    std::uint64_t init_seed_;           // the constructor's seed (initial_values)
    std::vector<std::pair<std::size_t, std::size_t>> kept_runs_;  // set_kept_weights()
    std::vector<float> kept_values_;
    std::uint64_t dropout_seed_;        // seed_dropout's seed
    std::uint64_t forward_calls_ = 0;  // forward passes since it was set
    std::vector<float> alibi_slopes_;  // (NH) with Position::alibi, else empty
    std::vector<GradientBucket> buckets_;          // gradient_buckets()
    std::function<void(int)> gradient_ready_;      // set_gradient_ready_hook()
    std::function<void(int, float*)> sink_;        // set_gradient_sink()
    std::vector<std::vector<float>> sink_blocks_;  // one block's gradients per slice
    std::vector<std::vector<float>> sink_rests_;   // the embeddings' and ln_f's per slice
    // Where each tensor lies in a block's bucket buffer, and in the last bucket's.
    std::vector<std::pair<float* ParameterTensors::*, std::size_t>> block_layout_, rest_layout_;
    std::size_t block_floats_ = 0, rest_floats_ = 0;
    // Where each kind of tensor starts in parameters() (the first block's, for a block's).
    std::vector<std::pair<float* ParameterTensors::*, std::size_t>> whole_layout_;
    WeightSource source_;                         // set_weight_source()
    std::vector<float> source_blocks_[2];         // block l's weights in buffer l % 2
    std::vector<float> source_rest_;              // the embeddings' and ln_f's
    ParameterTensors source_params_[2];           // pointers into buffer i and the rest (a block's as block 0's)
    int batch_offset_ = 0;                         // set_batch_offset()
    int whole_batch_ = 0;                          // set_whole_batch()
    // The first error of a parallel region's master thread (the weight source's wait, the
    // gradient sink or hook), rethrown once the region ends: an exception may not leave an
    // OpenMP region (it would end the process), and the other threads wait at its barriers.
    std::exception_ptr master_error_;
    template <class Work> void on_master(Work work);  // runs work on the master thread, catching
    void rethrow_master_error();
    int B_ = 0, T_ = 0;
    bool training_ = true;
    bool has_targets_ = false;
    bool dropout_applied_ = false;
    AttentionKind attention_ = AttentionKind::materialised;
    Precision precision_ = Precision::fp32;
    std::vector<float> product_weights_;  // the parameters rounded to precision_, same layout
    ParameterTensors product_params_;     // pointers into product_weights_
    RoundingCounts forward_rounding_, gradient_rounding_;
    float loss_scale_ = 1.0f;             // of the running backward pass
    bool fused_applied_ = false;  // whether the last forward pass used the fused attention
    Recompute recompute_ = Recompute::none;          // set_recompute()
    Recompute recompute_applied_ = Recompute::none;  // the last forward pass's
    Recompute recompute_allocated_ = Recompute::none;  // what the activations are sized for
};

/// AdamW as `torch.optim.AdamW`: decoupled weight decay, bias-corrected moments. Weight
/// decay applies only to the tensors that ParameterInfo::decay marks, as nanoGPT's
/// `configure_optimizers` does.
struct AdamW {
    float beta1 = 0.9f;         ///< decay rate of the first moment
    float beta2 = 0.99f;        ///< decay rate of the second moment
    float eps = 1e-8f;          ///< added to √v̂
    float weight_decay = 0.1f;  ///< decoupled decay, multiplied by the learning rate
    std::vector<float> m;       ///< first moment, same layout as GPT::parameters()
    std::vector<float> v;       ///< second moment, same layout as GPT::parameters()
    long step_count = 0;        ///< steps taken so far

    /// The bytes its moments hold (allocated by the first step). @return bytes
    std::size_t bytes() const { return (m.capacity() + v.capacity()) * sizeof(float); }

    /// One update of every parameter from the gradients in `model`.
    /// @param model the model to update (its gradients are read, its parameters changed)
    /// @param lr the learning rate for this step
    void step(GPT& model, float lr);
    /// The same update for any model whose parameters lie in one flat buffer (the
    /// encoder–decoder of encoder_decoder.hpp): decay on the tensors `table` marks.
    /// @param params every parameter, changed @param grads their gradients, same layout
    /// @param table the tensors in the buffer @param lr the learning rate for this step
    void step(std::vector<float>& params, const std::vector<float>& grads,
              const std::vector<ParameterInfo>& table, float lr);
    /// The same update of the parameters [begin, end) of the flat buffer alone, with moments
    /// that hold that range only (ZeRO's sharded optimizer state, attn/mpi/zero.hpp): m[i −
    /// begin] is parameter i's. Each parameter gets the same arithmetic as in step(), so the
    /// shards of all ranks together are one whole step, bit for bit. Moments that hold the
    /// whole buffer (read from a checkpoint) are cut to the range first, keeping step_count;
    /// empty ones start at zero.
    /// @param params every parameter (only [begin, end) changed) @param grads their
    /// gradients, same layout (only [begin, end) read) @param table the tensors in the buffer
    /// @param lr the learning rate @param begin first parameter @param end one past the last
    /// @throws std::invalid_argument for a range outside the buffer, or moments of another size
    void step_range(std::vector<float>& params, const std::vector<float>& grads,
                    const std::vector<ParameterInfo>& table, float lr, std::size_t begin, std::size_t end);

    /// A run of consecutive parameters of the flat buffer: step_segments()' unit.
    struct Segment {
        std::size_t offset = 0;  ///< its first parameter's index in the flat buffer
        std::size_t size = 0;    ///< its parameters
    };
    /// The same update of the parameters in `segments` alone, whose gradients and moments lie
    /// one segment after the other (ZeRO stage 2's shard, a piece of every gradient bucket,
    /// attn/mpi/zero.hpp): segment k's parameter i has gradient and moments at
    /// (segments before it) + i. Each parameter gets the same arithmetic as in step().
    /// The moments must hold the segments' parameters in that order (the caller cuts a
    /// checkpoint's whole state to them), or be empty: they start at zero.
    /// @param params every parameter (only the segments changed) @param grads the segments'
    /// gradients, one after the other @param table the tensors in the buffer @param lr the
    /// learning rate @param segments the parameters to update, in the order of `grads`
    /// @throws std::invalid_argument for a segment outside the buffer, or moments of another size
    void step_segments(std::vector<float>& params, const float* grads, const std::vector<ParameterInfo>& table,
                       float lr, const std::vector<Segment>& segments);

    /// The same update of parameters that lie packed like their gradients, one segment after
    /// the other (ZeRO stage 3's shard: a rank keeps its piece of every bucket's parameters and
    /// no whole buffer, attn/mpi/zero.hpp): segment k's parameter i, its gradient and its
    /// moments are all at (segments before it) + i. The segments' offsets say where the
    /// parameters lie in the model's flat buffer, for `table`'s weight decay; each parameter
    /// gets the same arithmetic as in step(). The moments are as step_segments() takes them.
    /// @param params the segments' parameters, one after the other (changed) @param grads
    /// their gradients, the same layout @param table the tensors of the flat buffer @param lr
    /// the learning rate @param segments where the packed runs lie in the flat buffer
    /// @throws std::invalid_argument for moments of another size
    void step_packed(float* params, const float* grads, const std::vector<ParameterInfo>& table, float lr,
                     const std::vector<Segment>& segments);

private:
    // Where each segment's moments start when they lie one segment after the other; zero
    // moments of that size when there are none yet. Throws, naming `caller`, for moments of
    // another size.
    std::vector<std::size_t> packed_moments(const std::vector<Segment>& segments, const char* caller);
    // One step of the parameters of `segments`: segment k's parameters start at
    // params[params_at[k]], its gradients and moments at `at[k]` of `grads` and of m and v
    // (each indexed from the segment's first parameter).
    void step_segments_of(float* params, const std::vector<std::size_t>& params_at, const float* grads,
                          const std::vector<ParameterInfo>& table, float lr, const std::vector<Segment>& segments,
                          const std::vector<std::size_t>& at);
};

/// Scales the gradients so that their global L2 norm is at most `max_norm`, as
/// `torch.nn.utils.clip_grad_norm_` (which divides by norm + 1e-6): each gradient times
/// max_norm / (norm + 1e-6) when that is below one. Where torch and this differ, this rule
/// holds on the CPU and the GPU alike (attn::cuda::clip_grad_norm): `max_norm` ≤ 0 or NaN
/// measures without clipping (torch zeroes the gradients at 0 and flips them below), and a
/// NaN or infinite norm leaves the gradients as they are (torch scales them by NaN); the
/// norm returned says which happened.
/// @param model the model whose gradients are clipped
/// @param max_norm the largest allowed norm (≤ 0: measure only)
/// @return the norm before clipping
float clip_grad_norm(GPT& model, float max_norm);

/// clip_grad_norm() of gradients in a flat buffer.
/// @param grads the gradients, scaled in place @param max_norm the largest allowed norm
/// @return the norm before clipping
float clip_grad_norm(std::vector<float>& grads, float max_norm);

}  // namespace attn
