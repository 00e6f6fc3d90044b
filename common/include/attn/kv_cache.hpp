/// @file kv_cache.hpp
/// @brief Generation with a key/value cache: each new token costs one row of attention.
///
/// While sampling, the uncached path (generate_text) runs the whole forward pass over the
/// context for every new token, although the keys and values of the earlier positions
/// have not changed: with causal attention, position t's k and v depend on tokens 0..t
/// only. The KVCache keeps them, per layer and head, so that one step projects just the new
/// token, appends its key and value, and lets its one query attend over the cached rows.
///
/// Axis letters as in gpt_layers.hpp: `L` layers, `NH` heads, `hs` head size, `C = NH·hs`
/// channels, `V` vocabulary; `capacity` is the most positions a cache holds (the model's
/// block_size).
#pragma once

#include "attn/data.hpp"
#include "attn/gpt.hpp"
#include "attn/trainer.hpp"

#include <string>
#include <vector>

namespace attn {

/// The keys and values of every layer for the positions generated so far.
///
/// Keys and values are stored per layer and key/value head, (L, G, capacity, hs), so that
/// one head's cached keys are `size()` contiguous rows of `hs` floats: the rows a new query
/// reads. With grouped-query attention (G < NH key/value heads, lesson 16) the cache holds G
/// heads, not NH; with a sliding window of W it can be a ring of W rows.
/// Each layer appends its own row; size() counts the positions that every layer holds.
class KVCache {
public:
    /// An empty cache.
    /// @param n_layer L  @param n_head NH  @param n_embd C, a multiple of NH
    /// @param capacity the most positions it holds
    /// @param n_kv_head G, the key/value heads it stores (0: NH); grouped-query attention
    ///        stores G heads, not NH, so a position costs 2·L·G·hs floats
    /// @param ring false: append throws once `capacity` positions are held; true: a ring
    ///        buffer, position p lives in row p mod capacity and a new position overwrites
    ///        the oldest (sliding-window attention needs only its last W positions)
    /// @throws std::invalid_argument if a size is not positive, NH does not divide C or G
    ///         does not divide NH
    KVCache(int n_layer, int n_head, int n_embd, int capacity, int n_kv_head = 0,
            bool ring = false);
    /// An empty cache for `config`: G = config.kv_heads() heads; block_size positions, or
    /// with a window W < block_size a ring of W positions.
    /// @param config the model's sizes
    explicit KVCache(const GPTConfig& config);

    /// Appends one position's key and value to a layer, at row positions(layer) (mod
    /// capacity for a ring).
    /// @param layer in [0, L)
    /// @param key (G·hs) the token's key, heads side by side as `c_attn` produces it
    /// @param value (G·hs) the token's value, same layout
    /// @throws std::invalid_argument for a layer outside [0, L) or a full layer (not a ring)
    void append(int layer, const float* key, const float* value);

    /// Forgets every position (the memory is kept).
    void clear();

    /// The number of positions that every layer holds (at most capacity).
    int size() const;
    /// The number of positions that one layer holds. @param layer in [0, L)
    int size(int layer) const;
    /// The number of positions every layer has been given since clear(); a ring holds the
    /// last size() of them.
    int positions() const;
    /// Bytes of keys and values per cached position: 2·L·G·hs·sizeof(float).
    std::size_t bytes_per_position() const;
    int capacity() const { return capacity_; }  ///< the most positions a layer holds
    bool ring() const { return ring_; }         ///< whether append overwrites the oldest row
    int n_layer() const { return L_; }          ///< L
    int n_head() const { return NH_; }          ///< NH
    int n_kv_head() const { return G_; }        ///< G, the key/value heads stored
    int head_size() const { return hs_; }       ///< hs = C / NH

    /// One layer's cached keys, (G, capacity, hs); position p is row p (p mod capacity for
    /// a ring). @param layer in [0, L)
    const float* keys(int layer) const;
    /// One layer's cached values, (G, capacity, hs). @param layer in [0, L)
    const float* values(int layer) const;

private:
    std::size_t layer_offset(int layer) const;

    int L_, NH_, G_, hs_, capacity_;
    bool ring_;
    std::vector<float> keys_;    // (L, G, capacity, hs)
    std::vector<float> values_;  // (L, G, capacity, hs)
    std::vector<int> counts_;    // (L) positions appended per layer since clear()
};

/// Attention of one new query per head over the cached keys and values, the cached
/// counterpart of one row of attention_forward: per head h,
/// `att[h, :] = softmax(q_h · K_hᵀ / √hs)` over positions 0..T−1 and
/// `out_h = att[h, :] · V_h`. No mask is needed: every cached position is in the past.
/// With ALiBi the score of the j-th of the T positions (oldest first; the query is the
/// last) gets `m_h·(j − (T − 1))`, its distance to the query times the head's slope, as
/// attention_forward adds `m_h·(j − t)`.
/// @param out (C) the heads' outputs side by side, head h in channels [h·hs, (h+1)·hs)
/// @param att (NH, T) the attention weights
/// @param q (C) the new token's query, heads side by side
/// @param key_cache (G, capacity, hs) one layer's keys
/// @param value_cache (G, capacity, hs) one layer's values
/// @param T the number of positions to attend over, 1 ≤ T ≤ capacity (the new one included)
/// @param capacity the cache's rows per head
/// @param C channels  @param NH query heads
/// @param NKV G, the key/value heads (0: NH); query head h reads kv_head_of(h, NH, G)
/// @param first the row of the oldest of the T positions; they are rows first, first + 1,
///        … mod capacity (0 for a cache that is not a ring)
/// @param alibi_slopes (NH) ALiBi's slope per head, or null for no bias
void attention_step_forward(float* out, float* att, const float* q, const float* key_cache,
                            const float* value_cache, int T, int capacity, int C, int NH,
                            int NKV = 0, int first = 0, const float* alibi_slopes = nullptr);

/// Working buffers of one cached step, for R tokens at once (R = 1 for forward_cached, the
/// batch's rows for forward_paged); reused from step to step.
struct DecodeScratch {
    std::vector<float> x;         ///< (R, C) the residual stream
    std::vector<float> residual;  ///< (R, C) the stream after a branch is added
    std::vector<float> ln;        ///< (R, C) a LayerNorm's output
    std::vector<float> mean;      ///< (R) a LayerNorm's means (unused after it)
    std::vector<float> rstd;      ///< (R) a LayerNorm's reciprocal deviations (unused after it)
    std::vector<float> qkv;       ///< (R, C + 2·G·hs) the tokens' queries, keys and values
    std::vector<float> atty;      ///< (R, C) the heads' outputs
    std::vector<float> att;       ///< (NH, capacity) attention weights of one row
    std::vector<float> proj;      ///< (R, C) an output projection
    std::vector<float> fch;       ///< (R, 4C) `c_fc` output
    std::vector<float> fch_gelu;  ///< (R, 4C)
    std::vector<float> logits;    ///< (R, V) the logits of the step
    std::vector<float> slopes;    ///< (NH) ALiBi's slopes, for a model with ALiBi
};

/// The forward pass for one new token with the cache, in evaluation mode (no dropout).
///
/// Per layer: LayerNorm of the token's row, the `c_attn` projection of that row only (with
/// RoPE, its query and key rotated by the absolute position `pos`), its key and value
/// appended to the cache (a RoPE key is cached rotated, once), attention of its query over positions 0..pos, the
/// output projection, the residual, and the MLP; then the final LayerNorm and the LM head
/// for this one position. The weights are the model's own.
/// @param scratch working buffers (sized on first use); its `logits` holds the result
/// @param model a causal model
/// @param cache the keys and values of positions 0..pos−1, of the model's sizes; this
///        token's are appended
/// @param token the new token's id, in [0, V)
/// @param pos its position: must be cache.positions(), and below block_size
/// @return scratch.logits, (V) the logits for position pos
/// @throws std::invalid_argument for a token outside the vocabulary, a position that is not
/// cache.positions() or not below block_size, a cache of other sizes, or a model that is not causal
const std::vector<float>& forward_cached(DecodeScratch& scratch, const GPT& model, KVCache& cache,
                                         int token, int pos);

/// Fills the cache from a whole context at once (the "prefill"): one ordinary forward pass
/// over `T` tokens, whose keys and values are copied into the cache. Afterwards the cache
/// holds positions 0..T−1.
/// @param logits receives (V) the logits of the last position, exactly the uncached ones
/// @param model a causal model (run in evaluation mode, and left in it)
/// @param cache cleared, then filled
/// @param tokens (T) token ids in [0, V)
/// @param T the context length, 1 ≤ T ≤ block_size
/// @throws std::invalid_argument for a bad token, T outside 1…block_size, a cache of other
/// sizes, or a model that is not causal
void prefill(std::vector<float>& logits, GPT& model, KVCache& cache, const int* tokens, int T);

/// Generates text after a prompt with a KV cache: exactly the text of generate_text for the
/// same model, prompt and options.
///
/// The prompt is prefilled, then each new token costs one forward_cached step. Past
/// block_size the uncached path crops the context to the last block_size tokens, so every
/// position shifts by one and every cached key (which includes its position embedding, or
/// with RoPE its rotation) is stale. This function then does what the crop does: it re-fills the cache from the
/// cropped context, so the text stays identical, and each step past block_size costs one
/// full forward pass, as the uncached path does.
/// @param model the model (left in evaluation mode)
/// @param vocab its vocabulary
/// @param prompt the text to continue; empty starts from a newline, as generate_text
/// @param options length, temperature, top-k and seed
/// @return the prompt followed by the generated characters
/// @throws std::invalid_argument as generate_text, and for a model that is not causal
std::string generate_cached(GPT& model, const CharVocab& vocab, const std::string& prompt,
                            const SampleOptions& options);

/// Floating-point operations (multiply and add counted as two) of one uncached step: the
/// whole forward pass over a context of T tokens, as GPT::forward computes it (the
/// attention products over the full T×T square, the LM head at every position).
/// @param config the model's sizes @param T the context length
/// @return 2·L·(12·T·C² + 2·T²·C) + 2·T·C·V
double uncached_step_flops(const GPTConfig& config, int T);

/// Floating-point operations of one cached step for the token at position T−1, attending
/// over T cached positions.
/// @param config the model's sizes @param T the positions attended over
/// @return 2·L·(12·C² + 2·T·C) + 2·C·V
double cached_step_flops(const GPTConfig& config, int T);

}  // namespace attn
