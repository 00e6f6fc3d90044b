// The paged key/value cache: the block-table arithmetic, the pool's reference counts and
// copy on write against a plain model of what each sequence holds, attention over a block
// table against the contiguous cache's, and the batched forward pass against lesson 14's
// one-token step and the whole forward pass.
#include "attn/paged_cache.hpp"

#include "attn/gpt_layers.hpp"
#include "attn/kv_cache.hpp"
#include "attn/random.hpp"

#include "gpt_checks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

using namespace attn;
using gpt_checks::largest_step_gap;
using gpt_checks::sharp_model;

namespace {

GPTConfig small_config(int block_size = 40) {
    GPTConfig c;
    c.vocab_size = 12;
    c.block_size = block_size;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    return c;
}

}  // namespace

TEST_CASE("the block table maps a position to its block and row") {
    const std::vector<int> table = {7, 3, 9};
    for (int p = 0; p < 12; ++p) {
        CAPTURE(p);
        const BlockSlot s = slot_of(table, p, 4);
        CHECK(s.block == table[static_cast<std::size_t>(p / 4)]);
        CHECK(s.offset == p % 4);
    }
    // the boundaries a learner gets wrong: the last row of a block, the first of the next
    CHECK(slot_of(table, 3, 4).block == 7);
    CHECK(slot_of(table, 4, 4).block == 3);
    CHECK(slot_of(table, 4, 4).offset == 0);
    CHECK_THROWS_AS(slot_of(table, 12, 4), std::invalid_argument);
    CHECK_THROWS_AS(slot_of(table, -1, 4), std::invalid_argument);
}

TEST_CASE("a sequence takes a block when a position starts one and returns them all when it ends") {
    PagedKVCache cache(1, 1, 2, 0, 4, 3);  // L 1, one head of hs 2, 4 blocks of 3 positions
    const int s = cache.add_sequence();
    CHECK(cache.free_blocks() == 4);
    CHECK(cache.blocks_needed(s, 1) == 1);
    CHECK(cache.blocks_needed(s, 3) == 1);
    CHECK(cache.blocks_needed(s, 4) == 2);
    for (int p = 0; p < 7; ++p) {
        const BlockSlot slot = cache.append_slot(s);
        CHECK(slot.offset == p % 3);
        CHECK(cache.length(s) == p + 1);
        CHECK(static_cast<int>(cache.block_table(s).size()) == p / 3 + 1);  // ⌈(p + 1)/3⌉
    }
    CHECK(cache.free_blocks() == 1);
    const std::vector<int> table = cache.block_table(s);
    CHECK(std::set<int>(table.begin(), table.end()).size() == 3);  // three distinct blocks
    cache.free_sequence(s);
    CHECK(cache.free_blocks() == 4);
    for (int b = 0; b < 4; ++b) CHECK(cache.ref_count(b) == 0);
    CHECK_THROWS_AS(cache.length(s), std::invalid_argument);  // no longer live
}

TEST_CASE("out of blocks: append_slot throws OutOfBlocks and changes nothing") {
    PagedKVCache cache(1, 1, 2, 0, 2, 2);
    const int a = cache.add_sequence(), b = cache.add_sequence();
    for (int i = 0; i < 3; ++i) cache.append_slot(a);  // blocks 1 and 2 of a's
    CHECK_THROWS_AS(cache.append_slot(b), OutOfBlocks);  // needs a third: none
    CHECK(cache.free_blocks() == 0);
    CHECK(cache.length(b) == 0);
}

// Random operations (new sequences, forks, appends with written rows, frees) on a small pool,
// against a plain model: each live sequence's list of rows. After every operation every
// sequence must read back exactly its own rows through its block table, every block's
// reference count must equal the tables that hold it, and the free blocks plus the blocks in
// use must make up the pool. A fork that wrote into its parent's block without copying, a
// block freed while still referenced, or a lost reference each break one of these.
TEST_CASE("forks share blocks, a write into a shared block copies it first (through the copy hook too), and the pool stays whole") {
    for (const int Bt : {1, 3, 4}) {
        CAPTURE(Bt);
        const int L = 2, G = 2, hs = 3, blocks = 12;
        PagedKVCache cache(L, 2, 2 * hs, G, blocks, Bt);
        std::map<int, std::vector<float>> model;  // sequence → its rows' first key element
        Rng rng(static_cast<std::uint64_t>(40 + Bt));
        float next_value = 1.0f;
        long copies = 0, shared_appends = 0;
        // the hook a device's pool copies through: called once per copy on write, (from, to)
        std::vector<std::pair<int, int>> hooked;
        cache.set_block_copy_hook([&hooked](int from, int to) { hooked.emplace_back(from, to); });
        for (int op = 0; op < 600; ++op) {
            const int kind = static_cast<int>(rng.below(10));
            std::vector<int> live;
            for (const auto& kv : model) live.push_back(kv.first);
            const int pick = live.empty() ? -1 : live[rng.below(live.size())];
            if (kind == 0 || live.empty()) {
                model[cache.add_sequence()] = {};
            } else if (kind == 1) {
                const int child = cache.fork(pick);
                model[child] = model[pick];
            } else if (kind == 2) {
                cache.free_sequence(pick);
                model.erase(pick);
            } else {
                const int len = cache.length(pick);
                const bool shared = len % Bt != 0 && cache.ref_count(cache.block_table(pick).back()) > 1;
                const int need = cache.blocks_needed(pick, 1);
                CHECK(need == (len % Bt == 0 ? 1 : 0) + (shared ? 1 : 0));
                if (need > cache.free_blocks()) {
                    CHECK_THROWS_AS(cache.append_slot(pick), OutOfBlocks);
                    CHECK(cache.length(pick) == len);
                    continue;
                }
                const int free_before = cache.free_blocks();
                const int last_before = len % Bt != 0 ? cache.block_table(pick).back() : -1;
                hooked.clear();
                const BlockSlot slot = cache.append_slot(pick);
                CHECK(cache.free_blocks() == free_before - need);
                if (shared) {
                    REQUIRE(hooked.size() == 1);
                    CHECK(hooked[0] == std::make_pair(last_before, slot.block));
                } else {
                    CHECK(hooked.empty());
                }
                copies += shared ? 1 : 0;
                shared_appends += shared ? 1 : 0;
                // each layer and head gets its own value, so that a mixed-up layer shows
                std::vector<float> key(static_cast<std::size_t>(G * hs)), value(key.size());
                for (int l = 0; l < L; ++l) {
                    for (std::size_t i = 0; i < key.size(); ++i) {
                        key[i] = next_value + 1000.0f * static_cast<float>(l) + 0.01f * static_cast<float>(i);
                        value[i] = -key[i];
                    }
                    cache.write(l, slot, key.data(), value.data());
                }
                model[pick].push_back(next_value);
                next_value += 1.0f;
            }
            // every sequence reads back its own rows, in every layer and head
            std::map<int, int> refs;
            for (const auto& [seq, rows] : model) {
                REQUIRE(cache.length(seq) == static_cast<int>(rows.size()));
                const std::vector<int>& table = cache.block_table(seq);
                for (int b : table) ++refs[b];
                for (int p = 0; p < static_cast<int>(rows.size()); ++p) {
                    const BlockSlot s = slot_of(table, p, Bt);
                    for (int l = 0; l < L; ++l) {
                        for (int g = 0; g < G; ++g) {
                            const float* k = cache.keys(l, s.block, g) + s.offset * hs;
                            const float* v = cache.values(l, s.block, g) + s.offset * hs;
                            const float want = rows[static_cast<std::size_t>(p)] + 1000.0f * static_cast<float>(l) +
                                               0.01f * static_cast<float>(g * hs);
                            REQUIRE(k[0] == want);
                            REQUIRE(v[0] == -want);
                        }
                    }
                }
            }
            int used = 0;
            for (int b = 0; b < blocks; ++b) {
                CHECK(cache.ref_count(b) == refs[b]);
                used += cache.ref_count(b) > 0 ? 1 : 0;
            }
            REQUIRE(used + cache.free_blocks() == blocks);
        }
        MESSAGE("Bt " << Bt << ": " << copies << " copies on write");
        if (Bt > 1) CHECK(copies > 0);  // the run did exercise copy on write
        for (const auto& kv : model) cache.free_sequence(kv.first);
        CHECK(cache.free_blocks() == blocks);
    }
}

// Attention over a block table reads the same rows in the same order as the contiguous
// cache, and adds them in the same order: the same bits, for block sizes that split the
// positions every way (1, 3, 16), windows that start inside a block, grouped key/value heads
// and ALiBi.
TEST_CASE("attention over a block table gives the contiguous cache's bits") {
    struct Case { int Bt, NH, G, hs, T, first; bool alibi; };
    for (const Case c : {Case{16, 2, 2, 8, 37, 0, false}, Case{1, 2, 1, 4, 9, 0, false},
                         Case{3, 4, 2, 12, 20, 7, true}, Case{16, 3, 1, 33, 40, 17, true},
                         Case{4, 2, 2, 8, 8, 0, false}}) {
        CAPTURE(c.Bt);
        CAPTURE(c.first);
        const int C = c.NH * c.hs;
        Rng rng(static_cast<std::uint64_t>(c.Bt * 100 + c.T));
        KVCache contiguous(1, c.NH, C, c.T, c.G);
        PagedKVCache paged(1, c.NH, C, c.G, (c.T + c.Bt - 1) / c.Bt + 3, c.Bt);
        // another sequence first, so that this one's blocks are not 0, 1, 2, …
        const int other = paged.add_sequence();
        paged.write(0, paged.append_slot(other), std::vector<float>(static_cast<std::size_t>(c.G * c.hs), 9.0f).data(),
                    std::vector<float>(static_cast<std::size_t>(c.G * c.hs), 9.0f).data());
        const int seq = paged.add_sequence();
        std::vector<float> k(static_cast<std::size_t>(c.G * c.hs)), v(k.size());
        for (int t = 0; t < c.T; ++t) {
            for (float& x : k) x = 2.0f * rng.normal();
            for (float& x : v) x = rng.normal();
            contiguous.append(0, k.data(), v.data());
            paged.write(0, paged.append_slot(seq), k.data(), v.data());
        }
        std::vector<float> q(static_cast<std::size_t>(C));
        for (float& x : q) x = 2.0f * rng.normal();
        const std::vector<float> slopes = alibi_slopes(c.NH);
        const float* s = c.alibi ? slopes.data() : nullptr;
        const int T = c.T - c.first;
        std::vector<float> out_c(static_cast<std::size_t>(C)), out_p(out_c.size());
        std::vector<float> att_c(static_cast<std::size_t>(c.NH * T)), att_p(att_c.size());
        attention_step_forward(out_c.data(), att_c.data(), q.data(), contiguous.keys(0),
                               contiguous.values(0), T, c.T, C, c.NH, c.G, c.first, s);
        paged_attention_step(out_p.data(), att_p.data(), q.data(), paged, 0, seq, c.T - 1, c.first, s);
        CHECK(out_p == out_c);
        CHECK(att_p == att_c);
    }
}

// One row per step through forward_paged is forward_cached with its rows in blocks: the
// same products (one row each), the same attention sums: the same bits. Checked on every
// position scheme, grouped keys and a window, and against the whole forward pass (the
// tolerance of test_kv_cache.cpp's same comparison, derived there).
TEST_CASE("one sequence through the paged cache gives the contiguous cache's logits, on every position scheme") {
    for (const Position position : {Position::learned, Position::rope, Position::alibi}) {
        for (const int groups : {0, 1}) {
            for (const int window : {0, 7}) {
                const std::string scheme = position_name(position);
                CAPTURE(scheme);
                CAPTURE(groups);
                CAPTURE(window);
                GPTConfig cfg = small_config(24);
                cfg.position = position;
                cfg.n_kv_head = groups;
                cfg.window = window;
                GPT model = sharp_model(cfg, 51);
                KVCache contiguous(cfg);
                PagedKVCache paged(cfg, 8, 5);  // 24 positions in blocks of 5: 5 blocks
                const int seq = paged.add_sequence();
                DecodeScratch a, b;
                bool same_bits = true;
                const float worst = largest_step_gap(model, 8, [&](int token, int pos) -> const std::vector<float>& {
                    const std::vector<float>& want = forward_cached(a, model, contiguous, token, pos);
                    const std::vector<float>& got = forward_paged(b, model, paged, {PagedRow{seq, token, pos}});
                    same_bits = same_bits && got == want;
                    return got;
                });
                CHECK(same_bits);
                MESSAGE(scheme << " G=" << groups << " W=" << window << ": largest |paged - uncached| logit " << worst);
                CHECK(worst < 1e-4f);
                CHECK(paged.free_blocks() == 3);
            }
        }
    }
}

// Several sequences in one batch, each at its own length, with whole prompts as chunks of
// consecutive rows (chunked prefill) and single decode rows, against each sequence decoded
// alone by forward_cached. The products now run over all the batch's rows at once, where
// forward_cached runs them over one: another order of the same sums, so the logits agree
// to the tolerance of test_kv_cache.cpp's cached-against-uncached comparison (derived
// there for this model's sizes), not bit for bit. A row attending over another sequence's
// blocks, or a chunk's row reading positions after its own, moves them by O(1).
TEST_CASE("a batch of sequences with prompt chunks and decode rows gives each sequence's own logits") {
    GPTConfig cfg = small_config(40);
    cfg.position = Position::rope;
    GPT model = sharp_model(cfg, 61);
    model.train(false);
    const int n_seq = 4;
    Rng rng(9);
    std::vector<std::vector<int>> texts(n_seq);
    for (auto& t : texts) {
        t.resize(30);
        for (int& x : t) x = static_cast<int>(rng.below(static_cast<std::uint64_t>(cfg.vocab_size)));
    }
    // each alone: its logits at every position
    std::vector<std::vector<float>> alone(n_seq);
    for (int s = 0; s < n_seq; ++s) {
        KVCache cache(cfg);
        DecodeScratch scratch;
        for (int p = 0; p < 30; ++p) {
            const std::vector<float>& l = forward_cached(scratch, model, cache, texts[s][static_cast<std::size_t>(p)], p);
            alone[s].insert(alone[s].end(), l.begin(), l.end());
        }
    }
    // batched: sequence s starts at step s with a prompt of 5 + 3s tokens in chunks of 4,
    // then one row per step
    PagedKVCache paged(cfg, 40, 4);
    std::vector<int> seq(n_seq, -1), done(n_seq, 0);
    DecodeScratch scratch;
    float worst = 0.0f;
    int batches_mixed = 0;
    for (int step = 0; step < 60; ++step) {
        std::vector<PagedRow> rows;
        bool prefill = false, decode = false;
        for (int s = 0; s < n_seq; ++s) {
            if (step < s || done[s] == 30) continue;
            if (seq[s] < 0) seq[s] = paged.add_sequence();
            const int prompt = 5 + 3 * s;
            const int n = done[s] < prompt ? std::min(4, prompt - done[s]) : 1;
            (done[s] < prompt ? prefill : decode) = true;
            for (int k = 0; k < n; ++k)
                rows.push_back({seq[s], texts[s][static_cast<std::size_t>(done[s] + k)], done[s] + k});
        }
        if (rows.empty()) break;
        batches_mixed += prefill && decode ? 1 : 0;
        const std::vector<float>& logits = forward_paged(scratch, model, paged, rows);
        for (std::size_t r = 0; r < rows.size(); ++r) {
            const int s = static_cast<int>(std::find(seq.begin(), seq.end(), rows[r].seq) - seq.begin());
            const float* want = &alone[s][static_cast<std::size_t>(rows[r].pos) * cfg.vocab_size];
            for (int v = 0; v < cfg.vocab_size; ++v)
                worst = std::max(worst, std::fabs(logits[r * cfg.vocab_size + v] - want[v]));
            done[s] = rows[r].pos + 1;
        }
    }
    for (int s = 0; s < n_seq; ++s) CHECK(done[s] == 30);
    CHECK(batches_mixed > 0);
    MESSAGE("largest |batched - alone| logit " << worst);
    CHECK(worst < 1e-4f);
    for (int s : seq) paged.free_sequence(s);
    CHECK(paged.free_blocks() == 40);
}

// The same comparison over drawn batches: any number of sequences joining at any step, prompt
// chunks of any size beside decode rows, every position scheme, one or two heads (head sizes
// 16 and 8: the attention's fixed-size and run-time paths), grouped keys and windows; each
// row's logits against its sequence's own steps of one row through forward_paged. The
// tolerance is the one above, derived in test_kv_cache.cpp for this C = 16, L = 2 model.
TEST_CASE("drawn batches give every row the logits of its sequence's own single-row steps") {
    Rng draw(77);
    float worst = 0.0f;
    for (int trial = 0; trial < 24; ++trial) {
        GPTConfig cfg = small_config(32);
        cfg.position = static_cast<Position>(trial % 3);
        cfg.n_head = 1 + static_cast<int>(draw.below(2));
        cfg.n_kv_head = cfg.n_head == 2 && draw.below(2) == 1 ? 1 : 0;
        cfg.window = draw.below(3) == 0 ? 3 + static_cast<int>(draw.below(8)) : 0;
        CAPTURE(trial);
        CAPTURE(cfg.n_head);
        CAPTURE(cfg.n_kv_head);
        CAPTURE(cfg.window);
        GPT model = sharp_model(cfg, 100 + static_cast<std::uint64_t>(trial));
        model.train(false);
        const int n_seq = 1 + static_cast<int>(draw.below(6));
        std::vector<std::vector<int>> texts(static_cast<std::size_t>(n_seq));
        std::vector<int> start(static_cast<std::size_t>(n_seq)), prompt(start.size());
        for (int s = 0; s < n_seq; ++s) {
            texts[s].resize(8 + draw.below(25));
            for (int& x : texts[s]) x = static_cast<int>(draw.below(static_cast<std::uint64_t>(cfg.vocab_size)));
            start[s] = static_cast<int>(draw.below(6));
            prompt[s] = 1 + static_cast<int>(draw.below(texts[s].size()));
        }
        // each sequence alone, one row per step
        std::vector<std::vector<float>> alone(static_cast<std::size_t>(n_seq));
        for (int s = 0; s < n_seq; ++s) {
            PagedKVCache cache(cfg, 8, 4);
            DecodeScratch scratch;
            const int seq = cache.add_sequence();
            for (int p = 0; p < static_cast<int>(texts[s].size()); ++p) {
                const std::vector<float>& l = forward_paged(scratch, model, cache, {PagedRow{seq, texts[s][p], p}});
                alone[s].insert(alone[s].end(), l.begin(), l.end());
            }
        }
        // together: sequence s joins at step start[s], reads its prompt in chunks of drawn
        // sizes, then decodes one row per step
        PagedKVCache paged(cfg, 8 * n_seq, 4);
        DecodeScratch scratch;
        std::vector<int> seq(static_cast<std::size_t>(n_seq), -1), done(seq.size(), 0);
        for (int step = 0; step < 200; ++step) {
            std::vector<PagedRow> rows;
            for (int s = 0; s < n_seq; ++s) {
                const int length = static_cast<int>(texts[s].size());
                if (step < start[s] || done[s] == length) continue;
                if (seq[s] < 0) seq[s] = paged.add_sequence();
                const int n = done[s] < prompt[s] ? 1 + static_cast<int>(draw.below(static_cast<std::uint64_t>(prompt[s] - done[s])))
                                                  : 1;
                for (int k = 0; k < n; ++k) rows.push_back({seq[s], texts[s][done[s] + k], done[s] + k});
                done[s] += n;
            }
            if (rows.empty() && step > 6) break;
            if (rows.empty()) continue;
            const std::vector<float>& logits = forward_paged(scratch, model, paged, rows);
            for (std::size_t r = 0; r < rows.size(); ++r) {
                const int s = static_cast<int>(std::find(seq.begin(), seq.end(), rows[r].seq) - seq.begin());
                const float* want = &alone[s][static_cast<std::size_t>(rows[r].pos) * cfg.vocab_size];
                for (int v = 0; v < cfg.vocab_size; ++v)
                    worst = std::max(worst, std::fabs(logits[r * cfg.vocab_size + v] - want[v]));
            }
        }
        for (int s = 0; s < n_seq; ++s) CHECK(done[s] == static_cast<int>(texts[s].size()));
        CHECK(worst < 1e-4f);
    }
    MESSAGE("largest |batched - single-row steps| logit over the drawn batches: " << worst);
}

TEST_CASE("bad rows are refused in one line and change nothing") {
    const GPTConfig cfg = small_config(8);
    GPT model(cfg, 1);
    PagedKVCache paged(cfg, 2, 4);
    const int s = paged.add_sequence();
    DecodeScratch scratch;
    CHECK_THROWS_AS(forward_paged(scratch, model, paged, {}), std::invalid_argument);
    CHECK_THROWS_AS(forward_paged(scratch, model, paged, {{s, cfg.vocab_size, 0}}), std::invalid_argument);
    CHECK_THROWS_AS(forward_paged(scratch, model, paged, {{s, 1, 1}}), std::invalid_argument);  // not the next
    CHECK_THROWS_AS(forward_paged(scratch, model, paged, {{s, 1, 0}, {s, 1, 0}}), std::invalid_argument);
    CHECK_THROWS_AS(forward_paged(scratch, model, paged, {{s + 1, 1, 0}}), std::invalid_argument);  // not live
    CHECK(paged.length(s) == 0);
    // 9 positions need 3 blocks of 4; the pool has 2
    std::vector<PagedRow> rows;
    for (int p = 0; p < 8; ++p) rows.push_back({s, 1, p});
    forward_paged(scratch, model, paged, rows);
    CHECK_THROWS_AS(forward_paged(scratch, model, paged, {{s, 1, 8}}), std::invalid_argument);  // past block_size
    const int t = paged.add_sequence();
    CHECK_THROWS_AS(forward_paged(scratch, model, paged, {{t, 1, 0}}), OutOfBlocks);
    CHECK(paged.length(t) == 0);
    PagedKVCache wrong(1, 2, 16, 0, 2, 4);  // one layer: another model's sizes
    CHECK_THROWS_AS(forward_paged(scratch, model, wrong, {{wrong.add_sequence(), 1, 0}}), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------
// Automatic prefix caching

namespace {

// The key and value written at position p: a digest of tokens 0 … p (an integer below 2²¹,
// exact in a float), so that a block handed to a sequence whose prefix differs from the one
// that wrote it shows in the rows it reads.
float prefix_digest(const std::vector<int>& tokens, int p) {
    std::uint32_t d = 0;
    for (int i = 0; i <= p; ++i) d = (d * 31u + static_cast<std::uint32_t>(tokens[static_cast<std::size_t>(i)]) + 1u) % (1u << 21);
    return static_cast<float>(d);
}

// Hashes a test can put in place of chain_block_hash: every block under one hash, and a hash
// of the block's own tokens that forgets the chain. Either must cost misses only.
std::uint64_t one_hash(std::uint64_t, const int*, int) { return 7; }
std::uint64_t own_tokens_only(std::uint64_t, const int* tokens, int count) {
    return chain_block_hash(kRootBlockHash, tokens, count);
}

// Writes positions length(seq) … upto − 1 of `tokens` (one layer, one head of 2).
void write_digests(PagedKVCache& cache, int seq, const std::vector<int>& tokens, int upto) {
    while (cache.length(seq) < upto) {
        const float d[2] = {prefix_digest(tokens, cache.length(seq)), 0.5f};
        cache.write(0, cache.append_slot(seq), d, d);
    }
}

// The rows a sequence reads hold its own prefix's digests.
bool reads_its_prefix(const PagedKVCache& cache, int seq, const std::vector<int>& tokens) {
    for (int p = 0; p < cache.length(seq); ++p) {
        const BlockSlot s = slot_of(cache.block_table(seq), p, cache.block_tokens());
        if (cache.keys(0, s.block, 0)[s.offset * 2] != prefix_digest(tokens, p)) return false;
    }
    return true;
}

}  // namespace

// Sequences come and go in random order, their prompts made of a few shared pieces over a
// two-token alphabet, so that one block's tokens often follow different prefixes; some
// register their blocks while half written. The test keeps its own record of every prefix
// registered (the tokens of whole blocks written), and the longest prefix a new prompt shares
// with one of them, in whole blocks, is what the lookup must find: no more (a block after
// another prefix, a half-written block) and no less (the pool never evicts here). The rows
// each sequence reads must hold its own prefix's digests, under the default hash, a hash
// that forgets the chain and a hash under which every block collides.
TEST_CASE("a lookup takes exactly the longest registered prefix, and its rows are that prefix's, under any hash") {
    const std::vector<std::pair<const char*, BlockHash>> hashes = {
        {"chain", chain_block_hash}, {"own tokens only", own_tokens_only}, {"one hash", one_hash}};
    for (const auto& [hash_name, hash] : hashes) {
        for (const int Bt : {1, 3, 4}) {
            const std::string name = hash_name;
            CAPTURE(name);
            CAPTURE(Bt);
            PagedKVCache cache(1, 1, 2, 0, 600, Bt);
            cache.set_block_hash(hash);
            Rng rng(static_cast<std::uint64_t>(Bt) * 7 + name.size());
            std::vector<std::vector<int>> pieces(3);
            for (auto& piece : pieces) {
                piece.resize(rng.below(9));
                for (int& t : piece) t = static_cast<int>(rng.below(2));
            }
            struct Live {
                int seq;
                std::vector<int> tokens;
            };
            std::vector<Live> live;
            std::vector<std::vector<int>> registered;  // whole blocks written, per registration
            long hits = 0, lookups = 0;
            auto register_blocks = [&](const Live& l) {
                cache.register_full_blocks(l.seq, l.tokens);
                const int whole = cache.length(l.seq) / Bt * Bt;
                registered.emplace_back(l.tokens.begin(), l.tokens.begin() + whole);
            };
            for (int op = 0; op < 400; ++op) {
                const std::uint64_t kind = rng.below(3);
                if (kind == 0 || live.empty()) {
                    // a new prompt: a piece, another piece, a few random tokens
                    std::vector<int> prompt = pieces[rng.below(3)];
                    const std::vector<int>& second = pieces[rng.below(3)];
                    prompt.insert(prompt.end(), second.begin(), second.end());
                    for (std::uint64_t i = rng.below(4); i > 0; --i) prompt.push_back(static_cast<int>(rng.below(2)));
                    if (prompt.empty()) prompt.push_back(1);
                    const int n = static_cast<int>(prompt.size());
                    int want = 0;  // the longest registered prefix, in whole blocks
                    for (const auto& r : registered) {
                        int k = 0;
                        while ((k + 1) * Bt <= std::min<int>(n, static_cast<int>(r.size())) &&
                               std::equal(prompt.begin() + k * Bt, prompt.begin() + (k + 1) * Bt, r.begin() + k * Bt))
                            ++k;
                        want = std::max(want, k);
                    }
                    CHECK(cache.match_prefix(prompt).blocks == want);
                    const int predicted = cache.blocks_to_add(prompt);
                    const int free_before = cache.free_blocks();
                    const int seq = cache.add_sequence(prompt);
                    CHECK(cache.length(seq) == std::min(want * Bt, n - 1));
                    CHECK(reads_its_prefix(cache, seq, prompt));
                    hits += want;
                    lookups += n / Bt;
                    // half of the rest now, registered; the rest later
                    const Live l{seq, prompt};
                    const int rest = n - cache.length(seq);
                    write_digests(cache, seq, prompt,
                                  cache.length(seq) + static_cast<int>(rng.below(static_cast<std::uint64_t>(rest + 1))));
                    // what the lookup predicted, once the prompt is written and before its
                    // blocks are registered (a block found equal to a registered one then
                    // returns to the pool; nothing is evicted while the pool is this large)
                    if (cache.length(seq) == n) CHECK(free_before - cache.free_blocks() == predicted);
                    register_blocks(l);
                    live.push_back(l);
                } else if (kind == 1) {
                    // a live sequence grows: the rest of its prompt, then a few tokens more
                    Live& l = live[rng.below(live.size())];
                    for (std::uint64_t i = rng.below(5); i > 0; --i) l.tokens.push_back(static_cast<int>(rng.below(2)));
                    write_digests(cache, l.seq, l.tokens, static_cast<int>(l.tokens.size()));
                    register_blocks(l);
                    CHECK(reads_its_prefix(cache, l.seq, l.tokens));
                } else {
                    const std::size_t i = rng.below(live.size());
                    CHECK(reads_its_prefix(cache, live[i].seq, live[i].tokens));
                    cache.free_sequence(live[i].seq);
                    live.erase(live.begin() + static_cast<long>(i));
                }
                REQUIRE(cache.consistency_error() == "");
            }
            MESSAGE(name << ", Bt " << Bt << ": " << hits << " of " << lookups << " blocks found");
            CHECK(hits > lookups / 4);  // the pieces made prefixes worth finding
            for (const Live& l : live) cache.free_sequence(l.seq);
            CHECK(cache.free_blocks() == 600);
            CHECK(cache.evictions() == 0);
            REQUIRE(cache.consistency_error() == "");
        }
    }
}

// Sequences of two whole blocks each, with prompts of their own, are freed in a random order:
// their blocks join the eviction order last block first, sequence by sequence. A prompt found
// again takes its blocks out of the order; new blocks come from the never-registered ones
// first, then from the front of the order, and a prompt whose tail was evicted is found up to
// the block before it.
TEST_CASE("evictable blocks are evicted least recently released first, after the never-registered ones") {
    Rng rng(17);
    for (int round = 0; round < 30; ++round) {
        CAPTURE(round);
        const int Bt = 2, n_seq = 4 + static_cast<int>(rng.below(3)), spare = static_cast<int>(rng.below(4));
        PagedKVCache cache(1, 1, 2, 0, 2 * n_seq + spare, Bt);
        std::vector<std::vector<int>> prompts;
        std::vector<int> seqs;
        for (int i = 0; i < n_seq; ++i) {
            prompts.push_back({i, 1, 2, 3});  // two blocks; the first token tells them apart
            seqs.push_back(cache.add_sequence(prompts.back()));
            write_digests(cache, seqs.back(), prompts.back(), 4);
            cache.register_full_blocks(seqs.back(), prompts.back());
        }
        std::vector<int> order(static_cast<std::size_t>(n_seq));
        for (int i = 0; i < n_seq; ++i) order[static_cast<std::size_t>(i)] = i;
        for (int i = n_seq - 1; i > 0; --i) std::swap(order[static_cast<std::size_t>(i)], order[rng.below(static_cast<std::uint64_t>(i + 1))]);
        std::vector<int> want;  // the eviction order, built by hand
        std::vector<std::vector<int>> tables(static_cast<std::size_t>(n_seq));
        for (int i : order) {
            const std::vector<int> table = cache.block_table(seqs[static_cast<std::size_t>(i)]);
            tables[static_cast<std::size_t>(i)] = table;
            want.push_back(table[1]);
            want.push_back(table[0]);
            cache.free_sequence(seqs[static_cast<std::size_t>(i)]);
        }
        CHECK(cache.eviction_order() == want);
        CHECK(cache.free_blocks() == 2 * n_seq + spare);
        // one prompt found again: its two blocks leave the order
        const int again = static_cast<int>(rng.below(static_cast<std::uint64_t>(n_seq)));
        const int held = cache.add_sequence(prompts[static_cast<std::size_t>(again)]);
        const std::vector<int> kept = cache.block_table(held);
        REQUIRE(kept.size() == 2);
        want.erase(std::remove_if(want.begin(), want.end(), [&](int b) { return b == kept[0] || b == kept[1]; }), want.end());
        CHECK(cache.eviction_order() == want);
        // a new sequence takes m blocks: the spare ones first, then the order's front
        const int m = static_cast<int>(rng.below(static_cast<std::uint64_t>(cache.free_blocks() + 1)));
        const int fresh = cache.add_sequence();
        const std::vector<int> other(static_cast<std::size_t>(m * Bt), 9);
        write_digests(cache, fresh, other, m * Bt);
        const int evicted = std::max(0, m - spare);
        CHECK(cache.evictions() == evicted);
        for (std::size_t k = 0; k < want.size(); ++k) CHECK(cache.registered(want[k]) == (static_cast<int>(k) >= evicted));
        const std::set<int> gone(want.begin(), want.begin() + evicted);
        for (int i = 0; i < n_seq; ++i) {
            if (i == again) continue;
            CAPTURE(i);
            const std::vector<int>& t = tables[static_cast<std::size_t>(i)];
            const int found = gone.count(t[0]) ? 0 : gone.count(t[1]) ? 1 : 2;
            CHECK(cache.match_prefix(prompts[static_cast<std::size_t>(i)]).blocks == found);
        }
        REQUIRE(cache.consistency_error() == "");
    }
}
