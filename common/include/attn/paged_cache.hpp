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
/// Automatic prefix caching (vLLM's APC; Kwon et al. 2023): a full block whose keys and
/// values are computed can be registered under a chain hash of its tokens and of the hash
/// of the block before it, so that equal hashes stand for equal whole prefixes. A new
/// sequence whose prompt starts with registered blocks takes them (reference count + 1)
/// and computes only the positions after them. Keys and values at position p of a causal
/// model depend on tokens 0 … p and on p alone, so a block computed for one sequence holds
/// what any other sequence with the same prefix would compute. A hash is never trusted on
/// its own: a hit also compares the block's token ids and the block it follows, so a
/// collision costs a miss, never another prompt's keys. A registered block that no sequence
/// references stays registered, evictable: allocation takes never-registered free blocks
/// first, then evicts the least recently released registered one.
///
/// Axis letters as in gpt_layers.hpp: `L` layers, `NH` heads, `G` key/value heads, `hs` head
/// size, `C = NH·hs`; `Bt` = block_tokens.
#pragma once

#include "attn/gpt.hpp"
#include "attn/kv_cache.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
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

/// The chain hash of one full block: a function of the hash of the block before it (for
/// the first block, kRootBlockHash) and of the block's `count` token ids.
using BlockHash = std::uint64_t (*)(std::uint64_t previous, const int* tokens, int count);
/// The `previous` hash of a sequence's first block.
inline constexpr std::uint64_t kRootBlockHash = 0x243f6a8885a308d3ULL;
/// The default chain hash: splitmix64's finaliser applied after folding in each token.
std::uint64_t chain_block_hash(std::uint64_t previous, const int* tokens, int count);

/// What a prompt's lookup found among the registered blocks.
struct PrefixMatch {
    int blocks = 0;     ///< leading full blocks of the prompt that are registered
    int evictable = 0;  ///< of those, the ones no sequence references now (taking them
                        ///< takes them out of the pool)
};

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
    /// A new sequence that starts with the registered blocks of `tokens`' longest cached
    /// prefix (lookup from the first block on, stopping at the first miss): their reference
    /// counts go up and the sequence's length is the positions they hold, but at most
    /// tokens.size() − 1, so that the last token is always computed again (its logits give
    /// the next token). When that leaves the last taken block one row short, the row is
    /// written into a copy of the block: a registered block is never written (copy on
    /// write), so that the blocks registered after it stay reachable.
    /// Nothing is looked up when prefix caching is off. @param tokens the sequence's tokens
    /// @return the new sequence's id
    int add_sequence(const std::vector<int>& tokens);
    /// The lookup add_sequence(tokens) would make, changing nothing. @param tokens token ids
    PrefixMatch match_prefix(const std::vector<int>& tokens) const;
    /// Blocks that add_sequence(tokens) and computing the rest of `tokens` take from the pool:
    /// new blocks, the evictable registered blocks it takes, and a copy of the last block
    /// when the whole of `tokens` is found.
    int blocks_to_add(const std::vector<int>& tokens) const;
    /// Registers the sequence's full blocks whose keys and values are now written (those
    /// below length(seq)) under their chain hashes. A block equal to one already registered
    /// (same tokens after the same registered block) is replaced in the sequence's table by
    /// that one, and returns to the pool. Nothing happens when prefix caching is off.
    /// @param seq a live sequence @param tokens its tokens, at least length(seq) of them: the
    ///        ones whose keys and values were written at positions 0, 1, …
    void register_full_blocks(int seq, const std::vector<int>& tokens);
    /// Turns prefix caching on or off (on by default). Turning it off forgets every
    /// registered block. @param on whether full blocks are registered and looked up
    void set_prefix_caching(bool on);
    bool prefix_caching() const { return prefix_caching_; }  ///< whether it is on
    /// Replaces the chain hash (the default is chain_block_hash); only while no block is
    /// registered. A hash that collides often costs misses, never wrong keys: a lookup also
    /// compares the tokens and the block before. @param hash the function
    void set_block_hash(BlockHash hash);
    /// Registered blocks taken out of the pool to be reused for other positions.
    long evictions() const { return evictions_; }
    /// Registered blocks, referenced or evictable.
    int cached_blocks() const { return static_cast<int>(by_hash_.size()); }
    /// Whether `block` is registered under a chain hash. @param block in [0, num_blocks)
    bool registered(int block) const;
    /// The evictable blocks, the next one evicted first.
    std::vector<int> eviction_order() const { return {lru_.begin(), lru_.end()}; }
    /// The first broken invariant of the pool, or "" when all hold: every block's reference
    /// count is the number of table entries naming it; a block is free, evictable or
    /// referenced, exactly one of them; the evictable blocks are the registered ones with no
    /// reference; every registered block is found under its hash with a full block's tokens;
    /// no sequence's table is longer than its length needs.
    std::string consistency_error() const;

    /// A new sequence holding the same positions as `parent`, in the same blocks: their
    /// reference counts go up, nothing is copied until one of the two writes into a shared
    /// block. @param parent a live sequence @return the new sequence's id
    int fork(int parent);
    /// Ends a sequence: each of its blocks loses one reference, and a block no sequence
    /// references returns to the pool: at the end of the eviction order when it is
    /// registered, last block first (a prefix's tail is evicted before its head).
    /// @param seq a live sequence
    void free_sequence(int seq);

    /// Makes room for the sequence's next position, length(seq), and returns its slot: a
    /// new block when the position starts one; a private copy of the last block (every layer's
    /// rows) when that block is shared with another sequence or registered. The length grows
    /// by one.
    /// @param seq a live sequence
    /// @throws OutOfBlocks when a block is needed and none is free (nothing changes)
    BlockSlot append_slot(int seq);
    /// Blocks that appending `tokens` more positions to `seq` would take from the pool
    /// (new blocks, and a copy of a shared or registered last block). @param seq a live sequence
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

    /// What is called after append_slot copies a block (every layer's rows of `from` into
    /// `to`: copy on write), so that a copy of the pool kept elsewhere (a GPU's) copies the
    /// same rows before anything is written into `to`. Empty: none (the default).
    /// @param hook called with (from, to)
    void set_block_copy_hook(std::function<void(int from, int to)> hook) { copy_hook_ = std::move(hook); }

    /// The positions a sequence holds. @param seq a live sequence
    int length(int seq) const;
    /// A sequence's block table: entry i holds positions i·Bt … (i+1)·Bt − 1.
    /// @param seq a live sequence
    const std::vector<int>& block_table(int seq) const;
    /// Whether `seq` is a live sequence id.
    bool live(int seq) const;
    /// The live sequences.
    int sequences() const;

    /// Blocks in the pool: never registered ones and evictable registered ones.
    int free_blocks() const { return static_cast<int>(free_.size() + lru_.size()); }
    int num_blocks() const { return num_blocks_; }                     ///< the pool's size
    int block_tokens() const { return Bt_; }                           ///< Bt
    /// Sequences that reference a block (0: free or evictable). @param block in [0, num_blocks)
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
        std::vector<std::uint64_t> hashes;  // chain hashes of the leading full blocks written
    };
    // A registered block: its chain hash, tokens, and the registered block before it, named
    // by index and stamp (a block registered again gets a new stamp, so an entry that
    // followed its old contents never matches).
    struct Registration {
        bool registered = false;
        std::uint64_t hash = 0;
        std::vector<int> tokens;
        int previous = -1;  // -1: the first block of a sequence
        long previous_stamp = 0;
        long stamp = 0;
    };
    /// @endcond
    const Sequence& sequence(int seq, const char* who) const;
    std::size_t block_offset(int layer, int block) const;
    int take_block();
    void release(int block);
    void copy_block(int from, int to);
    int find_registered(std::uint64_t hash, const int* tokens, int previous) const;
    void unregister(int block);
    void hold(int block);  // one more reference, out of the eviction order if it was there
    int prefix_length(const std::vector<int>& tokens, std::vector<int>* blocks) const;

    int L_, NH_, G_, hs_, num_blocks_, Bt_;
    std::vector<float> keys_, values_;  // (L, num_blocks, G, Bt, hs)
    std::vector<int> refs_;             // (num_blocks)
    std::vector<int> free_;             // never-registered free blocks, the next one taken last
    std::vector<Sequence> seqs_;
    bool prefix_caching_ = true;
    BlockHash hash_ = chain_block_hash;
    std::vector<Registration> reg_;                     // (num_blocks)
    std::unordered_multimap<std::uint64_t, int> by_hash_;  // chain hash → registered block
    std::list<int> lru_;                                // evictable blocks, oldest first
    std::vector<std::list<int>::iterator> lru_at_;      // (num_blocks) a block's place in lru_
    long next_stamp_ = 1;
    long evictions_ = 0;
    std::function<void(int, int)> copy_hook_;
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

/// The checks forward_paged makes before anything changes, for another device's step of the
/// same rows: a causal model with scaled attention, a cache of its sizes, at least one row,
/// each a live sequence's next position below the block size with a token in the vocabulary,
/// and blocks enough for them all.
/// @param config the model's configuration
/// @param cache the pool the rows' slots will be taken from
/// @param rows the batch
/// @param who the name the messages start with
/// @throws std::invalid_argument, or OutOfBlocks, as forward_paged
void check_paged_rows(const GPTConfig& config, const PagedKVCache& cache,
                      const std::vector<PagedRow>& rows, const char* who);

/// The batched step of forward_paged on some device: the scheduler calls one of these, so
/// that continuous batching, preemption, prefix caching and sampling are the same code on
/// the CPU (CpuPagedStep) and on a GPU (attn::cuda::PagedEngine). The cache stays the owner
/// of the block tables; a step stores each row's key and value where append_slot says.
class PagedStep {
public:
    virtual ~PagedStep() = default;  ///< a step is owned through this interface
    /// One step, as forward_paged. @param cache the pool the rows' sequences live in
    /// @param rows the batch @return (rows, V) each row's next-token logits, valid until the
    /// next call
    virtual const std::vector<float>& forward(PagedKVCache& cache, const std::vector<PagedRow>& rows) = 0;
    /// The model it runs (its sizes; its weights as they were when the step was made).
    virtual const GPT& model() const = 0;
    /// Where it runs, in one line (for a server's startup line).
    virtual std::string device() const = 0;
};

/// forward_paged behind the PagedStep interface: the CPU's step.
class CpuPagedStep final : public PagedStep {
public:
    /// @param model a causal model with scaled attention, read at every step
    explicit CpuPagedStep(const GPT& model) : model_(model) {}
    /// forward_paged(scratch, model, cache, rows) with this step's scratch buffers.
    const std::vector<float>& forward(PagedKVCache& cache, const std::vector<PagedRow>& rows) override {
        return forward_paged(scratch_, model_, cache, rows);
    }
    const GPT& model() const override { return model_; }  ///< the model it runs
    std::string device() const override { return "cpu"; }  ///< "cpu"

private:
    const GPT& model_;
    DecodeScratch scratch_;
};

}  // namespace attn
