// The paged key/value cache: a pool of blocks, block tables with reference counts and copy
// on write, attention over a block table, and the batched forward pass of many sequences.
#include "attn/paged_cache.hpp"

#include "decode_rows.hpp"
#include "attn/error.hpp"
#include "attn/gpt_layers.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>

namespace attn {

using std::size_t;
using std::to_string;

namespace {
// require() with its message built only when the check fails: these checks run for every
// block of every head of every row of every layer, where building a string each time
// would cost more than the attention itself.
template <class Message>
void check(bool ok, Message&& message) {
    if (!ok) throw std::invalid_argument(message());
}
}  // namespace

BlockSlot slot_of(const std::vector<int>& table, int position, int block_tokens) {
    require(block_tokens > 0 && position >= 0 &&
                position / block_tokens < static_cast<int>(table.size()),
            "slot_of: position " + to_string(position) + " is outside the " +
                to_string(table.size()) + " blocks of " + to_string(block_tokens) +
                " positions in the table");
    return {table[static_cast<size_t>(position / block_tokens)], position % block_tokens};
}

// ---------------------------------------------------------------------------------------
// The pool and the tables

PagedKVCache::PagedKVCache(int n_layer, int n_head, int n_embd, int n_kv_head, int num_blocks,
                           int block_tokens)
    : L_(n_layer), NH_(n_head), G_(n_kv_head > 0 ? n_kv_head : n_head),
      hs_(n_head > 0 ? n_embd / n_head : 0), num_blocks_(num_blocks), Bt_(block_tokens) {
    require(n_layer > 0 && n_head > 0 && n_embd > 0 && n_kv_head >= 0 && num_blocks > 0 &&
                block_tokens > 0,
            "PagedKVCache: every size must be positive, got L = " + to_string(n_layer) +
                ", NH = " + to_string(n_head) + ", C = " + to_string(n_embd) + ", G = " +
                to_string(n_kv_head) + ", blocks = " + to_string(num_blocks) +
                ", block_tokens = " + to_string(block_tokens));
    require(n_embd % n_head == 0, "PagedKVCache: NH = " + to_string(n_head) +
                                      " does not divide C = " + to_string(n_embd));
    require(n_head % G_ == 0, "PagedKVCache: the key/value heads G = " + to_string(G_) +
                                  " do not divide NH = " + to_string(n_head));
    const size_t n = static_cast<size_t>(L_) * num_blocks_ * G_ * Bt_ * hs_;
    keys_.assign(n, 0.0f);
    values_.assign(n, 0.0f);
    refs_.assign(static_cast<size_t>(num_blocks_), 0);
    reg_.assign(static_cast<size_t>(num_blocks_), Registration{});
    lru_at_.assign(static_cast<size_t>(num_blocks_), lru_.end());
    // the free list is a stack: block 0 is taken first
    for (int b = num_blocks_ - 1; b >= 0; --b) free_.push_back(b);
}

PagedKVCache::PagedKVCache(const GPTConfig& config, int num_blocks, int block_tokens)
    : PagedKVCache(config.n_layer, config.n_head, config.n_embd, config.kv_heads(), num_blocks,
                   block_tokens) {}

const PagedKVCache::Sequence& PagedKVCache::sequence(int seq, const char* who) const {
    check(live(seq), [&] { return std::string(who) + ": sequence " + to_string(seq) + " is not live"; });
    return seqs_[static_cast<size_t>(seq)];
}

bool PagedKVCache::live(int seq) const {
    return seq >= 0 && seq < static_cast<int>(seqs_.size()) && seqs_[static_cast<size_t>(seq)].live;
}

int PagedKVCache::sequences() const {
    return static_cast<int>(std::count_if(seqs_.begin(), seqs_.end(),
                                          [](const Sequence& s) { return s.live; }));
}

int PagedKVCache::add_sequence() {
    for (size_t i = 0; i < seqs_.size(); ++i) {
        if (!seqs_[i].live) {
            seqs_[i] = Sequence{true, 0, {}, {}};
            return static_cast<int>(i);
        }
    }
    seqs_.push_back(Sequence{true, 0, {}, {}});
    return static_cast<int>(seqs_.size()) - 1;
}

int PagedKVCache::fork(int parent) {
    const Sequence copy = sequence(parent, "PagedKVCache::fork");
    for (int b : copy.table) ++refs_[static_cast<size_t>(b)];
    const int child = add_sequence();
    seqs_[static_cast<size_t>(child)] = copy;
    return child;
}

void PagedKVCache::free_sequence(int seq) {
    (void)sequence(seq, "PagedKVCache::free_sequence");
    Sequence& s = seqs_[static_cast<size_t>(seq)];
    // the last block first: of a registered prefix, the tail is evicted before the head,
    // which more prompts share
    for (auto b = s.table.rbegin(); b != s.table.rend(); ++b) release(*b);
    s = Sequence{};
}

int PagedKVCache::take_block() {
    int b;
    if (!free_.empty()) {
        b = free_.back();
        free_.pop_back();
    } else {
        // no never-registered block left: the least recently released registered one
        b = lru_.front();
        lru_.pop_front();
        lru_at_[static_cast<size_t>(b)] = lru_.end();
        unregister(b);
        ++evictions_;
    }
    refs_[static_cast<size_t>(b)] = 1;
    return b;
}

void PagedKVCache::release(int block) {
    int& r = refs_[static_cast<size_t>(block)];
    if (--r > 0) return;
    if (reg_[static_cast<size_t>(block)].registered)
        lru_at_[static_cast<size_t>(block)] = lru_.insert(lru_.end(), block);
    else
        free_.push_back(block);
}

void PagedKVCache::hold(int block) {
    const size_t b = static_cast<size_t>(block);
    if (refs_[b] == 0) {  // evictable: out of the eviction order
        lru_.erase(lru_at_[b]);
        lru_at_[b] = lru_.end();
    }
    ++refs_[b];
}

void PagedKVCache::unregister(int block) {
    const size_t b = static_cast<size_t>(block);
    if (!reg_[b].registered) return;
    const auto range = by_hash_.equal_range(reg_[b].hash);
    for (auto it = range.first; it != range.second; ++it) {
        if (it->second == block) {
            by_hash_.erase(it);
            break;
        }
    }
    reg_[b] = Registration{};
    if (lru_at_[b] != lru_.end()) {  // it was evictable: now plainly free
        lru_.erase(lru_at_[b]);
        lru_at_[b] = lru_.end();
        free_.push_back(block);
    }
}

// ---------------------------------------------------------------------------------------
// Automatic prefix caching

std::uint64_t chain_block_hash(std::uint64_t previous, const int* tokens, int count) {
    // splitmix64's finaliser: every input bit moves about half the output bits
    const auto mix = [](std::uint64_t x) {
        x ^= x >> 30;
        x *= 0xbf58476d1ce4e5b9ULL;
        x ^= x >> 27;
        x *= 0x94d049bb133111ebULL;
        return x ^ (x >> 31);
    };
    std::uint64_t h = mix(previous);
    for (int i = 0; i < count; ++i)
        h = mix(h ^ (static_cast<std::uint64_t>(static_cast<std::uint32_t>(tokens[i])) + 0x9e3779b97f4a7c15ULL));
    return h;
}

bool PagedKVCache::registered(int block) const {
    check(block >= 0 && block < num_blocks_,
          [&] { return "PagedKVCache::registered: block " + to_string(block) + " is outside the pool"; });
    return reg_[static_cast<size_t>(block)].registered;
}

int PagedKVCache::find_registered(std::uint64_t hash, const int* tokens, int previous) const {
    const auto range = by_hash_.equal_range(hash);
    for (auto it = range.first; it != range.second; ++it) {
        const Registration& r = reg_[static_cast<size_t>(it->second)];
        // the hash only narrows the search: the tokens and the block before decide
        const bool same_previous =
            r.previous == previous &&
            (previous < 0 || r.previous_stamp == reg_[static_cast<size_t>(previous)].stamp);
        if (same_previous && std::equal(r.tokens.begin(), r.tokens.end(), tokens)) return it->second;
    }
    return -1;
}

int PagedKVCache::prefix_length(const std::vector<int>& tokens, std::vector<int>* blocks) const {
    if (!prefix_caching_) return 0;
    const int full = static_cast<int>(tokens.size()) / Bt_;
    std::uint64_t hash = kRootBlockHash;
    int previous = -1, found = 0;
    for (int i = 0; i < full; ++i) {
        const int* t = tokens.data() + static_cast<size_t>(i) * Bt_;
        hash = hash_(hash, t, Bt_);
        const int b = find_registered(hash, t, previous);
        if (b < 0) break;
        if (blocks) blocks->push_back(b);
        previous = b;
        ++found;
    }
    return found;
}

PrefixMatch PagedKVCache::match_prefix(const std::vector<int>& tokens) const {
    std::vector<int> blocks;
    prefix_length(tokens, &blocks);
    PrefixMatch m;
    m.blocks = static_cast<int>(blocks.size());
    for (int b : blocks) m.evictable += refs_[static_cast<size_t>(b)] == 0 ? 1 : 0;
    return m;
}

// The registered blocks a new sequence holding `tokens` takes, and the length they give it:
// the positions they hold, but at most n − 1 (the last token is always computed again), and
// only the blocks that reach below that length.
struct PrefixTake {
    int blocks, length;
};
static PrefixTake prefix_take(int found, int n, int Bt) {
    const int length = std::min(found * Bt, std::max(0, n - 1));
    return {std::min(found, (length + Bt - 1) / Bt), length};
}

int PagedKVCache::blocks_to_add(const std::vector<int>& tokens) const {
    std::vector<int> blocks;
    prefix_length(tokens, &blocks);
    const int n = static_cast<int>(tokens.size());
    const PrefixTake take = prefix_take(static_cast<int>(blocks.size()), n, Bt_);
    const auto refs_of = [&](int i) { return refs_[static_cast<size_t>(blocks[static_cast<size_t>(i)])]; };
    int need = blocks_for(n) - take.blocks;
    for (int i = 0; i < take.blocks; ++i) need += refs_of(i) == 0 ? 1 : 0;
    // the last taken block one row short (the whole prompt found): the row is written into
    // a copy of it, a registered block never being written; the block itself then returns
    // to the pool if no other sequence holds it
    if (take.blocks * Bt_ > take.length && refs_of(take.blocks - 1) > 0) ++need;
    return need;
}

int PagedKVCache::add_sequence(const std::vector<int>& tokens) {
    std::vector<int> blocks;
    prefix_length(tokens, &blocks);
    const PrefixTake take = prefix_take(static_cast<int>(blocks.size()), static_cast<int>(tokens.size()), Bt_);
    const int seq = add_sequence();
    Sequence& s = seqs_[static_cast<size_t>(seq)];
    for (int i = 0; i < take.blocks; ++i) {
        const int b = blocks[static_cast<size_t>(i)];
        hold(b);
        s.table.push_back(b);
        // the hashes of whole blocks only: a block one row short is whole again once written
        if ((i + 1) * Bt_ <= take.length) s.hashes.push_back(reg_[static_cast<size_t>(b)].hash);
    }
    s.length = take.length;
    return seq;
}

void PagedKVCache::register_full_blocks(int seq, const std::vector<int>& tokens) {
    (void)sequence(seq, "PagedKVCache::register_full_blocks");
    Sequence& s = seqs_[static_cast<size_t>(seq)];
    check(static_cast<int>(tokens.size()) >= s.length, [&] {
        return "PagedKVCache::register_full_blocks: " + to_string(tokens.size()) +
               " tokens for a sequence of length " + to_string(s.length);
    });
    if (!prefix_caching_) return;
    const int full = s.length / Bt_;
    for (int i = static_cast<int>(s.hashes.size()); i < full; ++i) {
        const int* t = tokens.data() + static_cast<size_t>(i) * Bt_;
        const std::uint64_t hash = hash_(i == 0 ? kRootBlockHash : s.hashes[static_cast<size_t>(i) - 1], t, Bt_);
        s.hashes.push_back(hash);
        int& b = s.table[static_cast<size_t>(i)];
        if (reg_[static_cast<size_t>(b)].registered) continue;  // shared with a fork that did it
        const int previous = i == 0 ? -1 : s.table[static_cast<size_t>(i) - 1];
        // after an unregistered block a lookup never arrives here: no use registering
        if (previous >= 0 && !reg_[static_cast<size_t>(previous)].registered) continue;
        const int equal = find_registered(hash, t, previous);
        if (equal >= 0) {
            // computed twice (two prompts admitted before either was done): keep one
            hold(equal);
            release(b);
            b = equal;
            continue;
        }
        Registration& r = reg_[static_cast<size_t>(b)];
        r.registered = true;
        r.hash = hash;
        r.tokens.assign(t, t + Bt_);
        r.previous = previous;
        r.previous_stamp = previous < 0 ? 0 : reg_[static_cast<size_t>(previous)].stamp;
        r.stamp = next_stamp_++;
        by_hash_.emplace(hash, b);
    }
}

void PagedKVCache::set_prefix_caching(bool on) {
    if (!on) {
        for (int b = 0; b < num_blocks_; ++b) unregister(b);
    }
    prefix_caching_ = on;
}

void PagedKVCache::set_block_hash(BlockHash hash) {
    require(hash != nullptr && by_hash_.empty(),
            "PagedKVCache::set_block_hash: needs a function, and no block registered yet");
    hash_ = hash;
}

std::string PagedKVCache::consistency_error() const {
    std::vector<int> counted(static_cast<size_t>(num_blocks_), 0);
    for (size_t i = 0; i < seqs_.size(); ++i) {
        const Sequence& s = seqs_[i];
        if (!s.live) continue;
        if (static_cast<int>(s.table.size()) != blocks_for(s.length))
            return "sequence " + to_string(i) + " of length " + to_string(s.length) + " has " +
                   to_string(s.table.size()) + " blocks";
        if (static_cast<int>(s.hashes.size()) > s.length / Bt_)
            return "sequence " + to_string(i) + " has hashes for blocks it has not filled";
        for (int b : s.table) ++counted[static_cast<size_t>(b)];
    }
    std::vector<int> places(static_cast<size_t>(num_blocks_), 0);
    for (int b : free_) {
        ++places[static_cast<size_t>(b)];
        if (reg_[static_cast<size_t>(b)].registered) return "free block " + to_string(b) + " is registered";
    }
    for (int b : lru_) {
        ++places[static_cast<size_t>(b)];
        if (!reg_[static_cast<size_t>(b)].registered) return "evictable block " + to_string(b) + " is not registered";
        if (lru_at_[static_cast<size_t>(b)] == lru_.end() || *lru_at_[static_cast<size_t>(b)] != b)
            return "evictable block " + to_string(b) + " has lost its place";
    }
    for (int b = 0; b < num_blocks_; ++b) {
        const size_t u = static_cast<size_t>(b);
        if (refs_[u] != counted[u])
            return "block " + to_string(b) + " has reference count " + to_string(refs_[u]) + " but " +
                   to_string(counted[u]) + " table entries";
        if (places[u] != (refs_[u] == 0 ? 1 : 0))
            return "block " + to_string(b) + " with " + to_string(refs_[u]) + " references is in " +
                   to_string(places[u]) + " of the free list and the eviction order";
        const Registration& r = reg_[u];
        if (!r.registered) continue;
        if (static_cast<int>(r.tokens.size()) != Bt_)
            return "registered block " + to_string(b) + " holds " + to_string(r.tokens.size()) + " tokens";
        int found = 0;
        const auto range = by_hash_.equal_range(r.hash);
        for (auto it = range.first; it != range.second; ++it) found += it->second == b ? 1 : 0;
        if (found != 1) return "registered block " + to_string(b) + " is under its hash " + to_string(found) + " times";
    }
    if (by_hash_.size() != static_cast<size_t>(std::count_if(reg_.begin(), reg_.end(),
                                                            [](const Registration& r) { return r.registered; })))
        return "the hash table names blocks that are not registered";
    return "";
}

void PagedKVCache::copy_block(int from, int to) {
    const size_t rows = static_cast<size_t>(G_) * Bt_ * hs_;
    for (int l = 0; l < L_; ++l) {
        std::copy_n(keys_.begin() + static_cast<long>(block_offset(l, from)), rows,
                    keys_.begin() + static_cast<long>(block_offset(l, to)));
        std::copy_n(values_.begin() + static_cast<long>(block_offset(l, from)), rows,
                    values_.begin() + static_cast<long>(block_offset(l, to)));
    }
}

int PagedKVCache::blocks_needed(int seq, int tokens) const {
    const Sequence& s = sequence(seq, "PagedKVCache::blocks_needed");
    check(tokens >= 0, [&] { return "PagedKVCache::blocks_needed: tokens must be ≥ 0, got " + to_string(tokens); });
    if (tokens == 0) return 0;
    const int new_blocks = blocks_for(s.length + tokens) - static_cast<int>(s.table.size());
    // the next position lands in the last block, which is shared or registered: it is
    // copied first
    const size_t last = static_cast<size_t>(s.table.empty() ? 0 : s.table.back());
    const bool copy = s.length % Bt_ != 0 && (refs_[last] > 1 || reg_[last].registered);
    return new_blocks + (copy ? 1 : 0);
}

BlockSlot PagedKVCache::append_slot(int seq) {
    (void)sequence(seq, "PagedKVCache::append_slot");
    Sequence& s = seqs_[static_cast<size_t>(seq)];
    const int offset = s.length % Bt_;
    if (offset == 0) {
        // the position starts a new block
        if (free_blocks() == 0)
            throw OutOfBlocks("PagedKVCache::append_slot: no free block for position " +
                              to_string(s.length) + " of sequence " + to_string(seq) + " (" +
                              to_string(num_blocks_) + " blocks, all in use)");
        s.table.push_back(take_block());
    } else {
        int& last = s.table.back();
        if (refs_[static_cast<size_t>(last)] > 1 || reg_[static_cast<size_t>(last)].registered) {
            // another sequence still reads this block, or a lookup may find it (a whole
            // prompt found, its last row computed again): write into a copy of it
            if (free_blocks() == 0)
                throw OutOfBlocks("PagedKVCache::append_slot: no free block to copy the shared "
                                  "block " + to_string(last) + " of sequence " + to_string(seq) +
                                  " into before writing position " + to_string(s.length));
            const int copy = take_block();
            copy_block(last, copy);
            if (copy_hook_) copy_hook_(last, copy);
            release(last);
            last = copy;
        }
    }
    ++s.length;
    return {s.table.back(), offset};
}

size_t PagedKVCache::block_offset(int layer, int block) const {
    check(layer >= 0 && layer < L_ && block >= 0 && block < num_blocks_, [&] {
        return "PagedKVCache: layer " + to_string(layer) + " or block " + to_string(block) +
               " is outside [0, " + to_string(L_) + ") × [0, " + to_string(num_blocks_) + ")";
    });
    return (static_cast<size_t>(layer) * num_blocks_ + static_cast<size_t>(block)) * G_ * Bt_ * hs_;
}

void PagedKVCache::write(int layer, BlockSlot slot, const float* key, const float* value) {
    check(slot.offset >= 0 && slot.offset < Bt_, [&] {
        return "PagedKVCache::write: row " + to_string(slot.offset) + " is outside the block's " +
               to_string(Bt_);
    });
    const size_t base = block_offset(layer, slot.block);
    // key (G·hs) = G rows of hs side by side; head g's row goes to (g, offset, :)
    for (int g = 0; g < G_; ++g) {
        const size_t row = base + (static_cast<size_t>(g) * Bt_ + slot.offset) * hs_;
        std::copy(key + g * hs_, key + (g + 1) * hs_, keys_.begin() + static_cast<long>(row));
        std::copy(value + g * hs_, value + (g + 1) * hs_, values_.begin() + static_cast<long>(row));
    }
}

const float* PagedKVCache::keys(int layer, int block, int g) const {
    return keys_.data() + block_offset(layer, block) + static_cast<size_t>(g) * Bt_ * hs_;
}

const float* PagedKVCache::values(int layer, int block, int g) const {
    return values_.data() + block_offset(layer, block) + static_cast<size_t>(g) * Bt_ * hs_;
}

int PagedKVCache::length(int seq) const { return sequence(seq, "PagedKVCache::length").length; }

const std::vector<int>& PagedKVCache::block_table(int seq) const {
    return sequence(seq, "PagedKVCache::block_table").table;
}

int PagedKVCache::ref_count(int block) const {
    check(block >= 0 && block < num_blocks_,
          [&] { return "PagedKVCache::ref_count: block " + to_string(block) + " is outside the pool"; });
    return refs_[static_cast<size_t>(block)];
}

size_t PagedKVCache::bytes_per_position() const {
    return 2 * static_cast<size_t>(L_) * G_ * hs_ * sizeof(float);
}

size_t PagedKVCache::bytes_per_block() const { return bytes_per_position() * static_cast<size_t>(Bt_); }

// ---------------------------------------------------------------------------------------
// Attention over a block table

void paged_attention_step(float* out, float* att, const float* q, const PagedKVCache& cache,
                          int layer, int seq, int pos, int first, const float* alibi_slopes) {
    const int length = cache.length(seq);
    check(first >= 0 && first <= pos && pos < length, [&] {
        return "paged_attention_step: need 0 ≤ first ≤ pos < length, got first = " +
               to_string(first) + ", pos = " + to_string(pos) + ", length = " + to_string(length);
    });
    const std::vector<int>& table = cache.block_table(seq);
    const int NH = cache.n_head(), G = cache.n_kv_head(), hs = cache.head_size();
    const int Bt = cache.block_tokens(), T = pos - first + 1;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    // positions first … pos are, block by block, runs of consecutive rows: the first run
    // starts at row first mod Bt, the last ends at row pos mod Bt
    const int b0 = first / Bt, b1 = pos / Bt;
    std::vector<detail::RowRun> runs(static_cast<size_t>(b1 - b0 + 1));
    for (int h = 0; h < NH; ++h) {
        const int g = kv_head_of(h, NH, G);
        for (int b = b0; b <= b1; ++b) {
            const int start = b == b0 ? first % Bt : 0;
            const int end = b == b1 ? pos % Bt + 1 : Bt;
            const int block = table[static_cast<size_t>(b)];
            const size_t at = static_cast<size_t>(start) * hs;
            runs[static_cast<size_t>(b - b0)] = {cache.keys(layer, block, g) + at,
                                                 cache.values(layer, block, g) + at, end - start};
        }
        detail::attend_one_query(out + h * hs, att + static_cast<size_t>(h) * T, q + h * hs,
                                 runs.data(), static_cast<int>(runs.size()),
                                 static_cast<size_t>(hs), scale,
                                 alibi_slopes ? alibi_slopes[h] : 0.0f);
    }
}

// ---------------------------------------------------------------------------------------
// The batched step

void check_paged_rows(const GPTConfig& cfg, const PagedKVCache& cache,
                      const std::vector<PagedRow>& rows, const char* who) {
    const int V = cfg.vocab_size, NH = cfg.n_head, G = cfg.kv_heads(), hs = cfg.n_embd / NH;
    const std::string w(who);
    require(cfg.causal && cfg.scaled_attention,
            w + ": the model must be causal with scaled attention, as for forward_cached");
    check(cache.n_layer() == cfg.n_layer && cache.n_head() == NH && cache.n_kv_head() == G &&
              cache.head_size() == hs,
          [&] {
              return w + ": the cache is (L, NH, G, hs) = (" + to_string(cache.n_layer()) +
                     ", " + to_string(cache.n_head()) + ", " + to_string(cache.n_kv_head()) + ", " +
                     to_string(cache.head_size()) + "), the model (" + to_string(cfg.n_layer) + ", " +
                     to_string(NH) + ", " + to_string(G) + ", " + to_string(hs) + ")";
          });
    require(!rows.empty(), w + ": the batch has no rows");
    // Check every row before anything changes: the next position of its sequence, below
    // the block size, a token in the vocabulary; then the blocks they need, all together.
    std::map<int, int> added;  // sequence → rows of it so far
    for (const PagedRow& r : rows) {
        check(cache.live(r.seq), [&] { return w + ": sequence " + to_string(r.seq) + " is not live"; });
        check(r.token >= 0 && r.token < V, [&] {
            return w + ": token id " + to_string(r.token) + " is outside [0, " + to_string(V) + ")";
        });
        const int next = cache.length(r.seq) + added[r.seq];
        check(r.pos == next, [&] {
            return w + ": sequence " + to_string(r.seq) + "'s row at position " +
                   to_string(r.pos) + " must be its next one, " + to_string(next);
        });
        check(r.pos < cfg.block_size, [&] {
            return w + ": position " + to_string(r.pos) + " is past the block size " +
                   to_string(cfg.block_size);
        });
        ++added[r.seq];
    }
    int needed = 0;
    for (const auto& [seq, n] : added) needed += cache.blocks_needed(seq, n);
    if (needed > cache.free_blocks())
        throw OutOfBlocks(w + ": the batch needs " + to_string(needed) + " new blocks, " +
                          to_string(cache.free_blocks()) + " are free");
}

const std::vector<float>& forward_paged(DecodeScratch& s, const GPT& model, PagedKVCache& cache,
                                        const std::vector<PagedRow>& rows) {
    const GPTConfig& cfg = model.config();
    const int C = cfg.n_embd, NH = cfg.n_head, G = cfg.kv_heads();
    const int hs = C / NH, QKV = cfg.qkv_channels();
    check_paged_rows(cfg, cache, rows, "forward_paged");
    const int R = static_cast<int>(rows.size());
    std::vector<BlockSlot> slots;
    std::vector<int> tokens, positions;
    for (const PagedRow& r : rows) {
        slots.push_back(cache.append_slot(r.seq));
        tokens.push_back(r.token);
        positions.push_back(r.pos);
    }
    s.att.resize(static_cast<size_t>(NH) * cfg.block_size);
    if (cfg.position == Position::alibi && s.slopes.size() != static_cast<size_t>(NH)) {
        s.slopes = alibi_slopes(NH);
    }
    const float* slopes = cfg.position == Position::alibi ? s.slopes.data() : nullptr;
    return detail::decode_rows(
        s, model, R, tokens.data(), positions.data(), [&](int l, const float* qkv, float* atty) {
            // every row's key and value first: a chunk's later rows read its earlier ones
            for (int r = 0; r < R; ++r) {
                const float* row = qkv + static_cast<size_t>(r) * QKV;
                cache.write(l, slots[static_cast<size_t>(r)], row + C, row + C + G * hs);
            }
            for (int r = 0; r < R; ++r) {
                const PagedRow& row = rows[static_cast<size_t>(r)];
                const int first = cfg.window > 0 ? std::max(0, row.pos + 1 - cfg.window) : 0;
                paged_attention_step(atty + static_cast<size_t>(r) * C, s.att.data(),
                                     qkv + static_cast<size_t>(r) * QKV, cache, l, row.seq, row.pos,
                                     first, slopes);
            }
        });
}

}  // namespace attn
