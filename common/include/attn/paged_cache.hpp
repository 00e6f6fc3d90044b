/// @file paged_cache.hpp
/// @brief A key/value cache in fixed-size blocks from one pool, shared by many sequences.
///
/// Lesson 14's KVCache gives one sequence one contiguous buffer of block_size positions: a
/// server that sized every request for the worst case would hold mostly empty rows. Here
/// (the layout of vLLM's PagedAttention, Kwon et al., SOSP 2023) the keys and values live in
/// blocks of `block_tokens` positions (16 by default) taken from one pool; each sequence has
/// a block table, its i-th entry the block that holds positions i·block_tokens … (i+1)·
/// block_tokens − 1. A block is taken when a sequence's next position starts one, and
/// returned when the sequence ends, so at most block_tokens − 1 rows of a sequence are ever
/// empty. Blocks carry reference counts: fork() gives a new sequence its parent's blocks
/// (a common prompt stored once), and a sequence about to write into a block that another
/// still reads first copies it (copy on write).
///
/// Axis letters as in gpt_layers.hpp: `L` layers, `NH` heads, `G` key/value heads, `hs` head
/// size, `C = NH·hs`; `Bt` = block_tokens.
#pragma once

#include "attn/gpt.hpp"
#include "attn/kv_cache.hpp"

#include <cstddef>
#include <stdexcept>
#include <vector>

namespace attn {

/// Thrown when a position needs a block and the pool has none free.
struct OutOfBlocks : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// Where one position of a sequence lives: row `offset` of block `block`.
struct BlockSlot {
    int block;   ///< the block's index in the pool
    int offset;  ///< the row within it, in [0, block_tokens)
};

/// The block-table arithmetic of one position: position p of a sequence is row
/// p mod block_tokens of the block at table index p / block_tokens.
/// @param table the sequence's block table
/// @param position p, with p / block_tokens < table.size()
/// @param block_tokens rows per block
/// @throws std::invalid_argument for a position the table does not reach
BlockSlot slot_of(const std::vector<int>& table, int position, int block_tokens);

/// The pool of blocks and the block tables of the sequences that use it.
///
/// Storage is (L, num_blocks, G, Bt, hs) for keys and again for values: one layer's rows of
/// one key/value head in one block are Bt consecutive rows of hs floats. Every layer uses
/// the same block table. A sequence's length counts the positions whose slots append_slot
/// has handed out; the caller writes each layer's key and value there.
class PagedKVCache {
public:
    /// An empty pool. @param n_layer L  @param n_head NH  @param n_embd C, a multiple of NH
    /// @param n_kv_head G (0: NH), dividing NH  @param num_blocks blocks in the pool
    /// @param block_tokens Bt, positions per block
    /// @throws std::invalid_argument for a size that is not positive or does not divide
    PagedKVCache(int n_layer, int n_head, int n_embd, int n_kv_head, int num_blocks,
                 int block_tokens = 16);
    /// An empty pool for `config`'s layers and heads. @param config the model's sizes
    /// @param num_blocks blocks in the pool  @param block_tokens Bt
    PagedKVCache(const GPTConfig& config, int num_blocks, int block_tokens = 16);

    /// A new, empty sequence. @return its id (ids of freed sequences are reused)
    int add_sequence();
    /// A new sequence holding the same positions as `parent`, in the same blocks: their
    /// reference counts go up, nothing is copied until one of the two writes into a shared
    /// block. @param parent a live sequence @return the new sequence's id
    int fork(int parent);
    /// Ends a sequence: each of its blocks loses one reference, and a block no sequence
    /// references returns to the pool. @param seq a live sequence
    void free_sequence(int seq);

    /// Makes room for the sequence's next position, length(seq), and returns its slot: a
    /// new block when the position starts one; a private copy of the last block (every layer's
    /// rows) when that block is shared with another sequence. The length grows by one.
    /// @param seq a live sequence
    /// @throws OutOfBlocks when a block is needed and none is free (nothing changes)
    BlockSlot append_slot(int seq);
    /// Blocks that appending `tokens` more positions to `seq` would take from the pool
    /// (new blocks, and a copy of a shared last block). @param seq a live sequence
    /// @param tokens ≥ 0
    int blocks_needed(int seq, int tokens) const;
    /// Blocks a new sequence of `tokens` positions takes. @param tokens ≥ 0
    int blocks_for(int tokens) const { return (tokens + Bt_ - 1) / Bt_; }

    /// Stores one position's key and value for one layer.
    /// @param layer in [0, L)  @param slot from append_slot
    /// @param key (G·hs), heads side by side as `c_attn` produces it  @param value (G·hs)
    void write(int layer, BlockSlot slot, const float* key, const float* value);

    /// One layer's keys of one key/value head in one block, (Bt, hs).
    /// @param layer in [0, L)  @param block in [0, num_blocks)  @param g in [0, G)
    const float* keys(int layer, int block, int g) const;
    /// One layer's values of one key/value head in one block, (Bt, hs).
    const float* values(int layer, int block, int g) const;

    /// The positions a sequence holds. @param seq a live sequence
    int length(int seq) const;
    /// A sequence's block table: entry i holds positions i·Bt … (i+1)·Bt − 1.
    /// @param seq a live sequence
    const std::vector<int>& block_table(int seq) const;
    /// Whether `seq` is a live sequence id.
    bool live(int seq) const;
    /// The live sequences.
    int sequences() const;

    int free_blocks() const { return static_cast<int>(free_.size()); }  ///< blocks in the pool
    int num_blocks() const { return num_blocks_; }                     ///< the pool's size
    int block_tokens() const { return Bt_; }                           ///< Bt
    /// Sequences that reference a block (0: free). @param block in [0, num_blocks)
    int ref_count(int block) const;
    /// Bytes of keys and values in one block: 2·L·G·Bt·hs·sizeof(float).
    std::size_t bytes_per_block() const;
    /// Bytes of keys and values per position: 2·L·G·hs·sizeof(float).
    std::size_t bytes_per_position() const;
    int n_layer() const { return L_; }      ///< L
    int n_head() const { return NH_; }      ///< NH
    int n_kv_head() const { return G_; }    ///< G
    int head_size() const { return hs_; }   ///< hs

private:
    /// @cond INTERNAL
    struct Sequence {
        bool live = false;
        int length = 0;
        std::vector<int> table;
    };
    /// @endcond
    const Sequence& sequence(int seq, const char* who) const;
    std::size_t block_offset(int layer, int block) const;
    int take_block();
    void release(int block);
    void copy_block(int from, int to);

    int L_, NH_, G_, hs_, num_blocks_, Bt_;
    std::vector<float> keys_, values_;  // (L, num_blocks, G, Bt, hs)
    std::vector<int> refs_;             // (num_blocks)
    std::vector<int> free_;             // free blocks, the next one taken last
    std::vector<Sequence> seqs_;
};

/// Attention of one query per head over positions first … pos of one sequence in a paged
/// cache: the same numbers, summed in the same order, as attention_step_forward over a
/// contiguous cache holding the same rows (no mask: every position read is in the past).
/// @param out (C) the heads' outputs side by side  @param att (NH, pos − first + 1) weights
/// @param q (C) the query, heads side by side
/// @param cache the pool  @param layer in [0, L)  @param seq a live sequence
/// @param pos the query's position, < length(seq)  @param first the oldest position read
///        (0, or pos − W + 1 with a sliding window of W)
/// @param alibi_slopes (NH) ALiBi's slopes, or null
void paged_attention_step(float* out, float* att, const float* q, const PagedKVCache& cache,
                          int layer, int seq, int pos, int first = 0,
                          const float* alibi_slopes = nullptr);

/// One row of a batched step: a token of a sequence at its position.
struct PagedRow {
    int seq;    ///< a live sequence of the cache
    int token;  ///< the token id, in [0, V)
    int pos;    ///< its position: the sequence's length when the step starts, plus the
                ///< rows of the same sequence before this one in the step
};

/// The forward pass of a batch of rows over a paged cache, in evaluation mode: each row's
/// key and value are stored at its position, and each row attends over its own sequence's
/// positions 0 … pos (its window's, with a sliding window). Rows of different sequences are
/// decode steps of many users at once; consecutive rows of one sequence are a chunk of its
/// prompt (chunked prefill). The products run over all rows together, which is where
/// batching pays on a CPU: each weight is read once per step, not once per user.
/// @param scratch working buffers; its `logits` holds the result
/// @param model a causal model with scaled attention
/// @param cache a pool of the model's sizes; each row's slot is taken with append_slot
/// @param rows the batch, at least one
/// @return scratch.logits, (rows, V): row r's next-token logits
/// @throws std::invalid_argument for a dead sequence, a token outside the vocabulary, a
///         position that is not the sequence's next or not below block_size, a cache of other
///         sizes or a model that is not causal; OutOfBlocks when the rows need more blocks
///         than are free. Nothing changes when it throws.
const std::vector<float>& forward_paged(DecodeScratch& scratch, const GPT& model,
                                        PagedKVCache& cache, const std::vector<PagedRow>& rows);

}  // namespace attn
