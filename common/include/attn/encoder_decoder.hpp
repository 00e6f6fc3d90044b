/// @file encoder_decoder.hpp
/// @brief A small pre-norm encoder–decoder transformer (Vaswani et al. 2017, with the
/// LayerNorm before each sublayer) on the course's own layers: the encoder's bidirectional
/// self-attention and the decoder's cross-attention with the source's key padding mask, the
/// decoder's causal self-attention, hand-written backward pass, greedy decoding that
/// computes the encoder's keys and values once, and checkpoints.
///
/// The model, for a batch of B source sequences of S tokens (right-padded; `source_lengths`
/// says how many are real) and B decoder inputs of T tokens:
///
///     m = x_src = emb[src] + source_position[0..S)
///     encoder layer ×Le:  m = m + self_attn(norm1(m), keys masked by source_lengths)
///                         m = m + linear2(gelu(linear1(norm2(m))))
///     memory = encoder.norm(m)                                      (B, S, C)
///     y = emb[tgt_in] + target_position[0..T)
///     decoder layer ×Ld:  y = y + self_attn(norm1(y), causal)
///                         y = y + multihead_attn(q = norm2(y), k = v = memory,
///                                                keys masked by source_lengths)
///                         y = y + linear2(gelu(linear1(norm3(y))))
///     logits = decoder.norm(y) · embᵀ                               (B, T, V)
///
/// The parameters are named as in PyTorch's `nn.Transformer(norm_first=True,
/// batch_first=True, activation="gelu")` state_dict under `transformer.` (for example
/// `transformer.decoder.layers.0.multihead_attn.in_proj_weight` (3C, C)), plus
/// `embedding.weight` (V, C), tied to the output, and the two learned position embeddings.
#pragma once

#include "attn/cross_attention.hpp"
#include "attn/data.hpp"
#include "attn/gpt.hpp"  // ParameterInfo, AdamW

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace attn {

/// The token ids of an encoder–decoder over characters: three special tokens, then one id
/// per character of a CharVocab.
class Seq2SeqVocab {
public:
    static constexpr int pad = 0;  ///< fills the padded positions; masked, so its value never matters
    static constexpr int bos = 1;  ///< the decoder's first input ("begin")
    static constexpr int eos = 2;  ///< what the decoder predicts after the last character ("end")
    static constexpr int first_char = 3;  ///< the id of the vocabulary's first character

    Seq2SeqVocab() = default;
    /// @param chars the characters, ids first_char, first_char + 1, … in their order
    explicit Seq2SeqVocab(CharVocab chars) : chars_(std::move(chars)) {}
    /// V: the three special tokens and the characters.
    int size() const { return first_char + static_cast<int>(chars_.size()); }
    /// The characters (without the special tokens).
    const CharVocab& chars() const { return chars_; }
    /// The ids of a text's characters (no special tokens added).
    /// @throws std::invalid_argument naming a character outside the vocabulary
    std::vector<int> encode(const std::string& text) const;
    /// The text of character ids, stopping at eos; pad and bos are skipped.
    /// @throws std::invalid_argument for an id outside [0, V)
    std::string decode(const std::vector<int>& ids) const;
    /// One id as the course prints it: its character, or `<pad>`, `<bos>`, `<eos>`.
    std::string token(int id) const;

private:
    CharVocab chars_;
};

/// The model's sizes.
struct EncoderDecoderConfig {
    int vocab_size = 0;       ///< V, shared by source and target (Seq2SeqVocab::size())
    int max_source = 32;      ///< the longest source, rows of `source_position`
    int max_target = 16;      ///< the longest decoder input, rows of `target_position`
    int n_encoder_layer = 2;  ///< Le
    int n_decoder_layer = 2;  ///< Ld
    int n_head = 4;           ///< NH, heads of every attention; must divide n_embd
    int n_embd = 64;          ///< C; the MLPs have 4C hidden channels

    /// Throws std::invalid_argument naming the first size that is not usable.
    void validate() const;
    /// The number of parameters (the tied embedding counted once).
    std::size_t num_parameters() const;
};

/// A batch for EncoderDecoder::forward(): sources and decoder inputs, right-padded, with
/// their real lengths. Build it with make_batch() from unpadded sequences.
struct Seq2SeqBatch {
    int B = 0;                        ///< sequences
    int S = 0;                        ///< padded source length (T_k of cross-attention)
    int T = 0;                        ///< padded decoder length (T_q of cross-attention)
    std::vector<int> source;          ///< (B, S) ids, pad after source_lengths[b]
    std::vector<int> source_lengths;  ///< (B) real source tokens, 0 … S
    std::vector<int> target_in;       ///< (B, T) bos, then the target shifted right
    std::vector<int> target_out;      ///< (B, T) the target, then eos; pad after target_lengths[b]
    std::vector<int> target_lengths;  ///< (B) real decoder positions (the target's length + 1)
};

/// Pads B sources and targets into one batch: source b is `sources[b]` then pad up to the
/// longest; the decoder reads bos + target and predicts target + eos, padded likewise.
/// @param sources B id sequences (empty allowed: a context that is all padding)
/// @param targets B id sequences of characters, or empty for a batch to decode (T = 1)
/// @throws std::invalid_argument when the counts differ or the batch is empty
Seq2SeqBatch make_batch(const std::vector<std::vector<int>>& sources,
                        const std::vector<std::vector<int>>& targets);

/// One encoder layer's parameters (pointers into the flat buffer), PyTorch's names.
struct EncoderLayerParams {
    float* norm1_w = nullptr;    ///< (C)
    float* norm1_b = nullptr;    ///< (C)
    float* in_proj_w = nullptr;  ///< (3C, C) self_attn.in_proj_weight: q, k, v
    float* in_proj_b = nullptr;  ///< (3C)
    float* out_proj_w = nullptr; ///< (C, C)
    float* out_proj_b = nullptr; ///< (C)
    float* norm2_w = nullptr;    ///< (C)
    float* norm2_b = nullptr;    ///< (C)
    float* linear1_w = nullptr;  ///< (4C, C)
    float* linear1_b = nullptr;  ///< (4C)
    float* linear2_w = nullptr;  ///< (C, 4C)
    float* linear2_b = nullptr;  ///< (C)
};

/// One decoder layer's parameters: an encoder layer's, plus cross-attention and a third norm.
struct DecoderLayerParams {
    EncoderLayerParams self;           ///< norm1, self_attn, norm2 (before cross-attention), MLP
    float* norm3_w = nullptr;          ///< (C) before the MLP
    float* norm3_b = nullptr;          ///< (C)
    float* cross_in_proj_w = nullptr;  ///< (3C, C) multihead_attn.in_proj_weight: rows [0, C)
                                       ///< make q from the decoder, rows [C, 3C) k and v from memory
    float* cross_in_proj_b = nullptr;  ///< (3C)
    float* cross_out_proj_w = nullptr; ///< (C, C)
    float* cross_out_proj_b = nullptr; ///< (C)
};

/// Every parameter tensor, as pointers into one flat buffer (parameters or gradients).
struct EncoderDecoderParams {
    float* embedding = nullptr;        ///< (V, C) token embedding, also the output layer
    float* source_position = nullptr;  ///< (max_source, C)
    float* target_position = nullptr;  ///< (max_target, C)
    std::vector<EncoderLayerParams> encoder;  ///< Le layers
    float* encoder_norm_w = nullptr;   ///< (C)
    float* encoder_norm_b = nullptr;   ///< (C)
    std::vector<DecoderLayerParams> decoder;  ///< Ld layers
    float* decoder_norm_w = nullptr;   ///< (C)
    float* decoder_norm_b = nullptr;   ///< (C)
};

/// The encoder–decoder with its parameters, gradients and activations.
///
/// Typical step: `float loss = model.forward(batch); model.zero_grad(); model.backward();
/// clip_grad_norm(model.gradients(), 1); optimizer.step(model.parameters(),
/// model.gradients(), model.parameter_table(), lr);`. Both passes run on the threads of
/// threads.hpp, each on its own slice of the batch's sequences.
class EncoderDecoder {
public:
    /// A model initialised as the GPT of gpt.hpp: weights N(0, 0.02), the projections into
    /// the residual stream N(0, 0.02/√(2·(Le + Ld))), biases 0, norms 1.
    /// @param config the sizes; validated @param seed seeds the initialisation
    explicit EncoderDecoder(const EncoderDecoderConfig& config, std::uint64_t seed = 1337);

    EncoderDecoder(const EncoderDecoder&) = delete;             ///< not copyable
    EncoderDecoder& operator=(const EncoderDecoder&) = delete;  ///< not copyable
    EncoderDecoder(EncoderDecoder&&) noexcept = default;        ///< movable
    EncoderDecoder& operator=(EncoderDecoder&&) noexcept = default;  ///< movable

    /// The forward pass over a padded batch. The loss is the mean cross-entropy over the
    /// real target positions only (t < target_lengths[b]): the outputs at padded decoder
    /// positions are computed, as every row of a batch is, but never reach the loss.
    /// @param batch sources and decoder inputs; S ≤ max_source, T ≤ max_target
    /// @param with_loss false computes the logits only (target_out unused)
    /// @return the mean loss, or NaN without it
    /// @throws std::invalid_argument for sizes, lengths or ids out of range
    float forward(const Seq2SeqBatch& batch, bool with_loss = true);

    /// Sets every gradient to zero.
    void zero_grad();
    /// The backward pass of the last forward() with a loss: adds d(loss)/d(parameter) into
    /// gradients().
    void backward();

    /// Greedy decoding: the encoder runs once, every decoder layer's cross-attention keys and
    /// values are computed once from its output, and each step feeds the last token through
    /// the decoder with a cache of its self-attention keys and values (one query against
    /// the t + 1 cached keys: a causal mask with T_q = 1 ≠ T_k, whose alignment is `step`).
    /// @param sources B id sequences (unpadded) @param max_length tokens to produce at most
    /// @param step the alignment of the step's causal mask: bottom_right is right; top_left
    ///        lets each new query see only the first cached key (to show what it breaks)
    /// @return B id sequences, each ending before its eos (or at max_length)
    /// @throws std::invalid_argument for max_length outside [1, max_target] or a bad source
    std::vector<std::vector<int>> greedy_decode(const std::vector<std::vector<int>>& sources,
                                                int max_length,
                                                CausalAlignment step = CausalAlignment::bottom_right);

    /// Greedy decoding without any cache: every step runs forward() on the whole prefix
    /// (encoder included). Slow; the reference that greedy_decode() must agree with.
    /// @param sources B id sequences @param max_length tokens to produce at most
    /// @return as greedy_decode()
    std::vector<std::vector<int>> greedy_decode_uncached(const std::vector<std::vector<int>>& sources,
                                                         int max_length);

    const EncoderDecoderConfig& config() const { return config_; }  ///< the sizes
    /// Every parameter tensor with its PyTorch name, shape and place in the flat buffer.
    const std::vector<ParameterInfo>& parameter_table() const { return table_; }
    std::vector<float>& parameters() { return params_; }  ///< every parameter, flat
    const std::vector<float>& parameters() const { return params_; }  ///< read-only
    std::vector<float>& gradients() { return grads_; }  ///< every gradient, same layout
    const std::vector<float>& gradients() const { return grads_; }  ///< read-only
    const EncoderDecoderParams& params() const { return p_; }  ///< pointers into parameters()

    /// The logits of the last forward(), (B, T, V) flat.
    const std::vector<float>& logits() const { return logits_; }
    /// The per-position losses of the last forward() with a loss, (B, T); 0 at padded positions.
    const std::vector<float>& losses() const { return losses_; }
    /// The encoder's output of the last forward(), (B, S, C): the memory cross-attention reads.
    const std::vector<float>& memory() const { return memory_; }
    /// One layer's attention weights from the last forward():
    /// which = 0 the encoder's self-attention (B, NH, S, S),
    /// which = 1 the decoder's self-attention (B, NH, T, T),
    /// which = 2 the decoder's cross-attention (B, NH, T, S).
    /// @param which as above @param layer 0 … Le − 1 or Ld − 1
    /// @throws std::invalid_argument for an unknown kind, a layer out of range, or no forward yet
    const std::vector<float>& attention_weights(int which, int layer) const;
    int batch_size() const { return B_; }       ///< B of the last forward()
    int source_length() const { return S_; }    ///< S of the last forward()
    int target_length() const { return T_; }    ///< T of the last forward()

private:
    /// @cond INTERNAL
    // One encoder layer's saved activations, (B, S, …) each; the decoder layer's are (B, T, …)
    // except ckv (B, S, 2C) and catt (B, NH, T, S).
    struct BlockActs {
        std::vector<float> ln1, ln1_mean, ln1_rstd, qkv, atty, att, attproj, res2;
        std::vector<float> ln2, ln2_mean, ln2_rstd, fch, fch_gelu, fcproj, res3;
        // the decoder's cross-attention and third norm (empty in the encoder)
        std::vector<float> cq, ckv, catty, catt, cproj, res4, ln3, ln3_mean, ln3_rstd;
    };
    // The backward pass's working buffers, for the whole batch; each slice uses its rows.
    struct Scratch {
        std::vector<float> dlogits, dfinal, ddec, denc, dmemory, dln, dqkv, datty, dfch,
            dfch_gelu, datt, dcq, dckv;
    };
    /// @endcond
    void allocate(int B, int S, int T);
    void forward_slice(int b0, int nb);
    void backward_slice(int b0, int nb, const EncoderDecoderParams& g);
    void check_batch(const Seq2SeqBatch& batch, bool with_loss) const;

    EncoderDecoderConfig config_;
    std::vector<ParameterInfo> table_;
    std::vector<float> params_, grads_;
    std::vector<std::vector<float>> slice_grads_;  // the second, third, … slice's gradients
    EncoderDecoderParams p_, g_;
    // The batch of the last forward().
    int B_ = 0, S_ = 0, T_ = 0;
    bool has_loss_ = false;
    Seq2SeqBatch batch_;
    int real_targets_ = 0;
    // Activations, (B, …) each.
    std::vector<float> src_embedded_, memory_, memory_mean_, memory_rstd_;
    std::vector<float> tgt_embedded_, final_, final_mean_, final_rstd_;
    std::vector<float> logits_, probs_, losses_;
    std::vector<BlockActs> enc_, dec_;
    Scratch scratch_;
};

/// Writes the model as a weights directory: `config.json` ("model": "encoder_decoder", the
/// sizes, the vocabulary's characters, the step) and one float32 `.npy` per parameter,
/// named by parameter_table().
/// @param dir the directory (created) @param model the model @param vocab its vocabulary
/// @param step the training step to record
void save_encoder_decoder(const std::filesystem::path& dir, const EncoderDecoder& model,
                          const Seq2SeqVocab& vocab, std::int64_t step);

/// Whether `dir` holds an encoder–decoder checkpoint (its config.json says so).
/// @param dir a weights directory @return true for one written by save_encoder_decoder()
bool is_encoder_decoder_checkpoint(const std::filesystem::path& dir);

/// Reads a directory written by save_encoder_decoder().
/// @param dir the directory @param vocab receives the vocabulary @param step receives the
///        step, if not nullptr
/// @return the model with the loaded weights
/// @throws CheckpointError (checkpoint.hpp) naming the file for anything missing or malformed
EncoderDecoder load_encoder_decoder(const std::filesystem::path& dir, Seq2SeqVocab& vocab,
                                    std::int64_t* step = nullptr);

}  // namespace attn
