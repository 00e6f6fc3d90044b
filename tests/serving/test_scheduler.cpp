// Continuous batching: every request gets the text it would get alone, preempted or not; the
// oldest request always advances; cancelled requests give their blocks back at once; bad
// requests and a full queue are refused with the field named.
#include "attn/scheduler.hpp"

#include "attn/data.hpp"
#include "attn/kv_cache.hpp"

#include "gpt_checks.hpp"

#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

using namespace attn;
using gpt_checks::sharp_model;

namespace {

const std::string kChars = "\n abcdefghij";  // V = 12

GPTConfig small_config(int block_size = 48) {
    GPTConfig c;
    c.vocab_size = static_cast<int>(kChars.size());
    c.block_size = block_size;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    return c;
}

// Runs the scheduler until idle; returns each request's tokens in the order produced, and
// checks each request's events: one token per step at most, `finished` on the last only.
std::map<int, std::vector<int>> run_to_end(Scheduler& scheduler, int max_steps = 10000) {
    std::map<int, std::vector<int>> out;
    std::map<int, bool> finished;
    for (int step = 0; step < max_steps && !scheduler.idle(); ++step) {
        std::map<int, int> per_step;
        for (const StepEvent& e : scheduler.step()) {
            CHECK(++per_step[e.request] == 1);
            CHECK_FALSE(finished[e.request]);
            out[e.request].push_back(e.token);
            finished[e.request] = e.finished;
        }
    }
    CHECK(scheduler.idle());
    for (const auto& kv : finished) CHECK(kv.second);
    return out;
}

std::string decode(const CharVocab& vocab, const std::vector<int>& ids) {
    std::string s;
    for (int id : ids) s += vocab.at(id);
    return s;
}

}  // namespace

// The texts are compared character for character against generate_cached, one request at a
// time. The batched step's logits differ from the one-row step's by ~1e-6 (another order of
// the same sums; serving/test_paged_cache.cpp), so a draw could differ only if a uniform
// number fell that close to a boundary of the cumulative probabilities: a chance near 1e-6
// per token. The draws are seeded, so once equal, always equal.
TEST_CASE("every request gets the text it would get alone, in batches, chunks and after preemption") {
    const CharVocab vocab = CharVocab::from_chars(kChars);
    GPTConfig cfg = small_config();
    for (const Position position : {Position::learned, Position::rope}) {
        for (const int blocks : {64, 12}) {  // plenty, and too few for all: preemption
            const std::string scheme = position_name(position);
            CAPTURE(scheme);
            CAPTURE(blocks);
            cfg.position = position;
            GPT model = sharp_model(cfg, 71);
            model.train(false);
            SchedulerOptions so;
            so.max_running = 6;
            so.step_tokens = 10;  // prompts longer than a step's rows: chunked prefill
            const std::vector<std::string> prompts = {"abc", "a bad cab", "j", "hij hij hij ab",
                                                      "\n", "fed cab bad", "ghi", "aaaa bbbb cccc"};
            PagedKVCache cache(cfg, blocks, 4);
            Scheduler scheduler(model, cache, so);
            std::map<int, std::string> want;
            std::map<int, std::vector<int>> got;
            for (std::size_t i = 0; i < prompts.size(); ++i) {
                SampleOptions o;
                o.max_new_tokens = 10 + 3 * static_cast<int>(i);
                o.top_k = i % 3 == 0 ? 1 : 5;
                o.temperature = i % 2 == 0 ? 1.0f : 0.8f;
                o.seed = 100 + i;
                const int id = scheduler.submit({vocab.encode(prompts[i]), o});
                want[id] = generate_cached(model, vocab, prompts[i], o).substr(prompts[i].size());
                if (i % 3 == 1) {  // a step between some submissions: arrivals while others decode
                    for (const StepEvent& e : scheduler.step()) got[e.request].push_back(e.token);
                }
            }
            for (const auto& [id, tokens] : run_to_end(scheduler)) {
                got[id].insert(got[id].end(), tokens.begin(), tokens.end());
            }
            for (const auto& [id, text] : want) {
                CAPTURE(id);
                CHECK(decode(vocab, got[id]) == text);
            }
            const SchedulerStats& st = scheduler.stats();
            MESSAGE(scheme << ", " << blocks << " blocks: " << st.steps << " steps, " << st.decode_rows
                           << " decode rows, " << st.prefill_rows << " prefill rows, " << st.preemptions
                           << " preemptions");
            CHECK(st.finished == static_cast<long>(prompts.size()));
            if (blocks == 12) CHECK(st.preemptions > 0);  // the small pool did preempt
            if (blocks == 64) CHECK(st.preemptions == 0);
            // batching: fewer steps than tokens produced one at a time
            CHECK(st.steps < st.decode_rows);
            CHECK(cache.free_blocks() == blocks);
        }
    }
}

// New requests keep arriving, one every step, each wanting the whole pool's worth of blocks
// before long: the first request still finishes within a bounded number of steps. With
// first-come-first-served admission and preemption of the newest, the oldest running request
// is never preempted, and gets a row every step.
TEST_CASE("no request starves: the oldest finishes while new ones keep arriving") {
    const CharVocab vocab = CharVocab::from_chars(kChars);
    GPT model = sharp_model(small_config(), 72);
    PagedKVCache cache(model.config(), 12, 4);
    SchedulerOptions so;
    so.max_running = 4;
    so.max_waiting = 1000;
    so.step_tokens = 8;
    Scheduler scheduler(model, cache, so);
    SampleOptions o;
    o.max_new_tokens = 40;
    const int first = scheduler.submit({vocab.encode("abcdef"), o});
    int first_done = -1;
    for (int step = 0; step < 400 && first_done < 0; ++step) {
        o.seed = static_cast<std::uint64_t>(step);
        scheduler.submit({vocab.encode("ghij ab"), o});
        for (const StepEvent& e : scheduler.step()) {
            if (e.request == first && e.finished) first_done = step;
        }
    }
    MESSAGE("the first request finished at step " << first_done << "; "
                                                  << scheduler.stats().preemptions << " preemptions");
    CHECK(scheduler.stats().preemptions > 0);
    // 6 prompt tokens in one chunk, then one token per step: 40 steps, and admission at step 0
    CHECK(first_done >= 0);
    CHECK(first_done <= 40);
    // and everybody else gets through too once arrivals stop
    run_to_end(scheduler);
    CHECK(cache.free_blocks() == 12);
}

TEST_CASE("cancelled requests give back their own blocks at once, and after 200 the pool is whole") {
    const CharVocab vocab = CharVocab::from_chars(kChars);
    GPT model = sharp_model(small_config(), 73);
    PagedKVCache cache(model.config(), 40, 4);
    SchedulerOptions so;
    so.max_running = 8;
    so.max_waiting = 300;
    so.step_tokens = 16;
    Scheduler scheduler(model, cache, so);
    Rng rng(5);
    std::vector<int> live;
    int cancelled = 0;
    for (int step = 0; cancelled < 200; ++step) {
        SampleOptions o;
        o.max_new_tokens = 30;
        o.seed = static_cast<std::uint64_t>(step);
        live.push_back(scheduler.submit({vocab.encode("abc abc"), o}));
        live.push_back(scheduler.submit({vocab.encode("j"), o}));
        scheduler.step();
        // a client goes away mid-stream (or while queued)
        const std::size_t i = rng.below(live.size());
        const int id = live[i];
        live.erase(live.begin() + static_cast<long>(i));
        // its blocks that no other sequence reads (a prefix found in the cache is shared)
        const int seq = scheduler.sequence_of(id);
        int held = 0;
        if (seq >= 0) {
            for (int b : cache.block_table(seq)) held += cache.ref_count(b) == 1 ? 1 : 0;
        }
        const int free_before = cache.free_blocks();
        if (scheduler.cancel(id)) {
            ++cancelled;
            CHECK(cache.free_blocks() == free_before + held);  // at once, not at the next step
        }
        CHECK_FALSE(scheduler.cancel(id));  // only once
    }
    for (int id : live) scheduler.cancel(id);
    CHECK(scheduler.idle());
    CHECK(cache.free_blocks() == 40);
    CHECK(cache.sequences() == 0);
}

TEST_CASE("bad requests are refused with the field named, and a full queue with QueueFull") {
    GPT model = sharp_model(small_config(16), 74);
    PagedKVCache cache(model.config(), 4, 4);
    SchedulerOptions so;
    so.max_running = 2;
    so.max_waiting = 2;
    so.step_tokens = 4;
    Scheduler scheduler(model, cache, so);
    auto refused = [&](CompletionRequest r, const std::string& field) {
        CAPTURE(field);
        try {
            scheduler.submit(r);
            FAIL("accepted");
        } catch (const std::invalid_argument& e) {
            CHECK(std::string(e.what()).rfind(field + ":", 0) == 0);
        }
    };
    SampleOptions o;
    o.max_new_tokens = 4;
    refused({{}, o}, "prompt");
    refused({{1, 12}, o}, "prompt");
    refused({{1, -1}, o}, "prompt");
    SampleOptions bad = o;
    bad.max_new_tokens = 0;
    refused({{1}, bad}, "max_tokens");
    bad = o;
    bad.max_new_tokens = 16;  // 1 + 16 − 1 = 16 positions fit; 17 do not
    scheduler.submit({{1}, bad});
    bad.max_new_tokens = 17;
    refused({{1}, bad}, "max_tokens");
    bad = o;
    bad.temperature = 0.0f;
    refused({{1}, bad}, "temperature");
    bad.temperature = std::nanf("");
    refused({{1}, bad}, "temperature");
    bad = o;
    bad.top_k = 13;
    refused({{1}, bad}, "top_k");
    // the first went straight into the batch; one more joins it, two wait, the next is refused
    scheduler.submit({{1, 2}, o});
    CHECK(scheduler.running() == 2);
    CHECK(scheduler.waiting() == 0);
    scheduler.submit({{1, 2}, o});
    scheduler.submit({{3}, o});
    CHECK(scheduler.waiting() == 2);
    CHECK_THROWS_AS(scheduler.submit({{1, 2}, o}), QueueFull);
    CHECK(scheduler.waiting() == 2);
    run_to_end(scheduler);
    CHECK(cache.free_blocks() == 4);
    // limits that cannot work
    PagedKVCache other(model.config(), 4, 4);
    CHECK_THROWS_AS(Scheduler(model, other, SchedulerOptions{4, 1, 2}), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------
// Automatic prefix caching and n continuations by fork

namespace {

// One request of a generated load: when it arrives (a step), its prompt, its sampling, and
// after how many tokens its client goes away (0: never).
struct Arrival {
    int step;
    std::vector<int> prompt;
    SampleOptions options;
    int cancel_after;
};

// Prompts that share prefixes: one of a few random prefixes (some empty, some longer than a
// block), then a random suffix; lengths fall on both sides of block boundaries.
std::vector<Arrival> shared_prefix_load(Rng& rng, int count, int vocab, int max_positions) {
    std::vector<std::vector<int>> prefixes(1 + rng.below(3));
    for (auto& p : prefixes) {
        p.resize(rng.below(15));
        for (int& t : p) t = static_cast<int>(rng.below(static_cast<std::uint64_t>(vocab)));
    }
    std::vector<Arrival> load;
    for (int i = 0; i < count; ++i) {
        Arrival a;
        a.step = static_cast<int>(rng.below(30));
        a.prompt = prefixes[rng.below(prefixes.size())];
        for (std::uint64_t k = 1 + rng.below(8); k > 0; --k) a.prompt.push_back(static_cast<int>(rng.below(static_cast<std::uint64_t>(vocab))));
        const int room = max_positions - static_cast<int>(a.prompt.size()) + 1;
        a.options.max_new_tokens = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(std::min(12, room))));
        a.options.top_k = rng.below(3) == 0 ? 1 : 5;
        a.options.temperature = rng.below(2) == 0 ? 1.0f : 0.8f;
        a.options.seed = rng.next_u64();
        a.cancel_after = a.options.max_new_tokens > 1 && rng.below(4) == 0
                             ? 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(a.options.max_new_tokens - 1)))
                             : 0;
        load.push_back(a);
    }
    std::sort(load.begin(), load.end(), [](const Arrival& x, const Arrival& y) { return x.step < y.step; });
    return load;
}

std::uint64_t one_hash(std::uint64_t, const int*, int) { return 7; }

// Serves a load, submitting each arrival at its step and cancelling each when its client
// leaves; the cache's invariants are checked after every step. Returns each arrival's tokens.
std::vector<std::vector<int>> serve_load(Scheduler& scheduler, const PagedKVCache& cache,
                                         const std::vector<Arrival>& load) {
    std::vector<std::vector<int>> out(load.size());
    std::map<int, std::size_t> index;  // request → arrival
    std::size_t next = 0;
    for (int step = 0; step < 5000 && (next < load.size() || !scheduler.idle()); ++step) {
        for (; next < load.size() && load[next].step <= step; ++next)
            index[scheduler.submit({load[next].prompt, load[next].options})] = next;
        for (const StepEvent& e : scheduler.step()) {
            const std::size_t i = index.at(e.request);
            out[i].push_back(e.token);
            if (!e.finished && load[i].cancel_after == static_cast<int>(out[i].size())) CHECK(scheduler.cancel(e.request));
        }
        REQUIRE(cache.consistency_error() == "");
    }
    CHECK(scheduler.idle());
    return out;
}

}  // namespace

// Prefix caching changes which rows a step computes, never what a request reads: a cached
// block holds the keys and values that the same model wrote for the same tokens at the same
// positions. The bits of those rows do depend on the batch they were computed in (OpenBLAS
// takes other kernels for other row counts: a row's products are the same sums in another
// order), with caching or without it, so the two runs' logits differ by the batched step's
// ~1e-6 (serving/test_paged_cache.cpp), and a draw could differ only if a uniform number fell
// that close to a boundary of the cumulative probabilities (the first test's argument). The
// loads are generated: shared prefixes, arrivals while others decode, clients that leave, a
// pool small enough to evict and to preempt, every position scheme, windows and grouped keys,
// and a hash under which every block collides.
TEST_CASE("prefix caching changes no token: generated loads with shared prefixes, cancels, eviction and preemption") {
    Rng rng(2024);
    long hits = 0, queries = 0, evictions = 0, preemptions = 0, cancelled = 0, rounds = 0;
    for (int round = 0; round < 12; ++round) {
        CAPTURE(round);
        GPTConfig cfg = small_config(32);
        cfg.position = std::vector<Position>{Position::learned, Position::rope, Position::alibi}[rng.below(3)];
        cfg.window = rng.below(3) == 0 ? 5 : 0;
        cfg.n_kv_head = rng.below(2) == 0 ? 1 : 0;
        const std::string scheme = position_name(cfg.position);
        CAPTURE(scheme);
        CAPTURE(cfg.window);
        const GPT model = [&] {
            GPT m = sharp_model(cfg, 80 + static_cast<std::uint64_t>(round));
            m.train(false);
            return m;
        }();
        const int Bt = 2 + static_cast<int>(rng.below(3));
        const int blocks = (cfg.block_size + Bt - 1) / Bt + static_cast<int>(rng.below(8));
        const std::vector<Arrival> load = shared_prefix_load(rng, 24, cfg.vocab_size, cfg.block_size);
        SchedulerOptions so;
        so.max_running = 2 + static_cast<int>(rng.below(6));
        so.max_waiting = 1000;
        so.step_tokens = so.max_running + static_cast<int>(rng.below(12));
        std::vector<std::vector<int>> got[2];
        for (const bool caching : {false, true}) {
            so.prefix_caching = caching;
            PagedKVCache cache(cfg, blocks, Bt);
            Scheduler scheduler(model, cache, so);
            // every third load under a hash where all blocks collide: the lookup's comparison
            // of tokens and of the block before is all that keeps another prompt's keys out
            if (round % 3 == 2) cache.set_block_hash(one_hash);
            got[caching] = serve_load(scheduler, cache, load);
            CHECK(cache.free_blocks() == blocks);
            const SchedulerStats st = scheduler.stats();
            if (caching) {
                hits += st.prefix_cache_hits;
                queries += st.prefix_cache_queries;
                evictions += st.prefix_cache_evictions;
                preemptions += st.preemptions;
                cancelled += st.cancelled;
            } else {
                CHECK(st.prefix_cache_hits == 0);
                CHECK(cache.cached_blocks() == 0);
            }
        }
        for (std::size_t i = 0; i < load.size(); ++i) {
            CAPTURE(i);
            CHECK(got[1][i] == got[0][i]);
        }
        ++rounds;
    }
    MESSAGE(rounds << " loads: " << hits << " of " << queries << " prompt blocks found, " << evictions
                   << " evictions, " << preemptions << " preemptions, " << cancelled << " cancelled");
    // the loads did what they were made for
    CHECK(hits > 0);
    CHECK(evictions > 0);
    CHECK(preemptions > 0);
    CHECK(cancelled > 0);
}

// One request after another, each run to its end: the blocks a request finds are the whole
// blocks its prompt shares with the tokens an earlier request computed (its prompt and every
// token it sampled but the last, which is never fed back), counted here from the texts alone.
// The pool is large enough that nothing is evicted, and some prompts repeat an earlier one of
// a whole number of blocks (the whole prompt found: its last row computed again).
TEST_CASE("the prefix cache's hits and queries equal a count made from the requests' tokens") {
    Rng rng(31);
    for (const int Bt : {2, 3, 4}) {
        CAPTURE(Bt);
        GPT model = sharp_model(small_config(40), 90);
        model.train(false);
        PagedKVCache cache(model.config(), 200, Bt);
        Scheduler scheduler(model, cache, SchedulerOptions{});
        std::vector<std::vector<int>> computed;  // per earlier request
        std::vector<std::vector<int>> prompts;
        long want_hits = 0, want_queries = 0;
        for (const Arrival& a : shared_prefix_load(rng, 40, model.config().vocab_size, 40)) {
            std::vector<int> prompt = a.prompt;
            if (!prompts.empty() && rng.below(4) == 0) {  // an earlier prompt, cut to whole blocks
                prompt = prompts[rng.below(prompts.size())];
                const int whole = std::max(1, static_cast<int>(prompt.size()) / Bt) * Bt;
                prompt.resize(static_cast<std::size_t>(whole), 1);
            }
            const int n = static_cast<int>(prompt.size());
            int found = 0;
            for (const auto& c : computed) {
                int k = 0;
                while ((k + 1) * Bt <= std::min<int>(n, static_cast<int>(c.size())) &&
                       std::equal(prompt.begin() + k * Bt, prompt.begin() + (k + 1) * Bt, c.begin() + k * Bt))
                    ++k;
                found = std::max(found, k);
            }
            want_hits += found;
            want_queries += n / Bt;
            SampleOptions o = a.options;
            o.max_new_tokens = std::min(o.max_new_tokens, 41 - n);
            scheduler.submit({prompt, o});
            const std::map<int, std::vector<int>> out = run_to_end(scheduler);
            REQUIRE(out.size() == 1);
            std::vector<int> c = prompt;
            c.insert(c.end(), out.begin()->second.begin(), out.begin()->second.end() - 1);
            computed.push_back(c);
            prompts.push_back(prompt);
            CHECK(scheduler.stats().prefix_cache_hits == want_hits);
            CHECK(scheduler.stats().prefix_cache_queries == want_queries);
            REQUIRE(cache.consistency_error() == "");
        }
        MESSAGE("blocks of " << Bt << ": " << want_hits << " of " << want_queries << " found");
        CHECK(want_hits > 0);
        CHECK(scheduler.stats().prefix_cache_evictions == 0);
    }
}

// n continuations of one prompt by fork against n requests of seeds seed, seed + 1, …, each
// computing the prompt itself; among other traffic, with a pool small enough to preempt the
// forks (recomputed alone), with and without prefix caching; one continuation's client leaves
// mid-stream, and in some groups the first continuation's before the prompt is computed.
TEST_CASE("n continuations by fork give the tokens of n requests of seeds seed + i") {
    Rng rng(77);
    long forks = 0, preemptions = 0;
    for (int round = 0; round < 16; ++round) {
        CAPTURE(round);
        GPTConfig cfg = small_config(32);
        cfg.position = round % 2 == 0 ? Position::rope : Position::learned;
        GPT model = sharp_model(cfg, 100 + static_cast<std::uint64_t>(round));
        model.train(false);
        const int Bt = 2 + static_cast<int>(rng.below(3));
        const int blocks = round % 4 == 0 ? 64 : (32 + Bt - 1) / Bt + static_cast<int>(rng.below(4));
        SchedulerOptions so;
        so.max_running = 4 + static_cast<int>(rng.below(3));
        so.max_waiting = 100;
        so.step_tokens = 12;
        so.prefix_caching = round % 3 != 0;
        std::vector<Arrival> others = shared_prefix_load(rng, 4, cfg.vocab_size, 32);
        for (Arrival& a : others) a.cancel_after = 0;
        std::vector<int> prompt(2 + rng.below(14));
        for (int& t : prompt) t = static_cast<int>(rng.below(12));
        SampleOptions o;
        o.max_new_tokens = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(33 - static_cast<int>(prompt.size()))));
        o.top_k = 5;
        o.seed = round == 5 ? ~std::uint64_t{0} - 1 : rng.next_u64();  // one group's seeds wrap around 2⁶⁴
        const int n = 2 + static_cast<int>(rng.below(static_cast<std::uint64_t>(so.max_running - 1)));
        const int leaves = static_cast<int>(rng.below(static_cast<std::uint64_t>(n)));
        const int leaves_after = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(o.max_new_tokens)));
        const bool first_leaves_early = round % 4 == 1;
        CAPTURE(n);
        // alone: n requests of seeds seed + i
        std::vector<std::vector<int>> want(static_cast<std::size_t>(n));
        {
            PagedKVCache cache(cfg, blocks, Bt);
            Scheduler scheduler(model, cache, so);
            std::map<int, int> index;
            for (int i = 0; i < n; ++i) {
                SampleOptions oi = o;
                oi.seed = o.seed + static_cast<std::uint64_t>(i);
                index[scheduler.submit({prompt, oi})] = i;
            }
            for (const auto& [id, tokens] : run_to_end(scheduler)) want[static_cast<std::size_t>(index.at(id))] = tokens;
        }
        // forked: the other traffic first, so that the group may wait in the queue
        PagedKVCache cache(cfg, blocks, Bt);
        Scheduler scheduler(model, cache, so);
        for (const Arrival& a : others) scheduler.submit({a.prompt, a.options});
        const std::vector<int> ids = scheduler.submit({prompt, o}, n);
        REQUIRE(static_cast<int>(ids.size()) == n);
        std::map<int, std::vector<int>> got;
        bool first_gone = false;
        if (first_leaves_early && scheduler.sequence_of(ids[0]) < 0 && scheduler.generated(ids[0]).empty()) {
            CHECK(scheduler.cancel(ids[0]));  // queued: the prompt stays for the others
            first_gone = true;
        }
        for (int step = 0; step < 2000 && !scheduler.idle(); ++step) {
            for (const StepEvent& e : scheduler.step()) {
                got[e.request].push_back(e.token);
                if (e.request == ids[static_cast<std::size_t>(leaves)] && !e.finished &&
                    static_cast<int>(got[e.request].size()) == leaves_after)
                    CHECK(scheduler.cancel(e.request));
            }
            REQUIRE(cache.consistency_error() == "");
        }
        CHECK(scheduler.idle());
        CHECK(cache.free_blocks() == blocks);
        for (int i = 0; i < n; ++i) {
            CAPTURE(i);
            const std::vector<int>& g = got[ids[static_cast<std::size_t>(i)]];
            const std::vector<int>& w = want[static_cast<std::size_t>(i)];
            if (i == 0 && first_gone) {
                CHECK(g.empty());
            } else if (i == leaves && leaves_after < o.max_new_tokens) {
                CHECK(g == std::vector<int>(w.begin(), w.begin() + leaves_after));  // until it left
            } else {
                CHECK(g == w);
            }
        }
        forks += scheduler.stats().forks;
        preemptions += scheduler.stats().preemptions;
    }
    MESSAGE(forks << " continuations forked, " << preemptions << " preemptions");
    CHECK(forks > 0);
    CHECK(preemptions > 0);
}

// With nothing else running and no preemption, the group's prompt is computed once where n
// requests compute it n times (prefix caching off: nothing else shares it).
TEST_CASE("a group of n continuations computes its prompt once") {
    GPT model = sharp_model(small_config(32), 110);
    model.train(false);
    SchedulerOptions so;
    so.prefix_caching = false;
    const std::vector<int> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    SampleOptions o;
    o.max_new_tokens = 5;
    long rows[2] = {0, 0};
    for (const bool fork : {false, true}) {
        PagedKVCache cache(model.config(), 64, 4);
        Scheduler scheduler(model, cache, so);
        if (fork) {
            scheduler.submit({prompt, o}, 6);
        } else {
            for (int i = 0; i < 6; ++i) scheduler.submit({prompt, o});
        }
        run_to_end(scheduler);
        rows[fork] = scheduler.stats().prefill_rows;
        CHECK(scheduler.stats().forks == (fork ? 5 : 0));
    }
    CHECK(rows[0] == 6 * 9);
    CHECK(rows[1] == 9);
}

TEST_CASE("a group's n outside [1, max_running] is refused with n named") {
    GPT model = sharp_model(small_config(16), 111);
    PagedKVCache cache(model.config(), 8, 4);
    SchedulerOptions so;
    so.max_running = 3;
    so.step_tokens = 4;
    Scheduler scheduler(model, cache, so);
    SampleOptions o;
    o.max_new_tokens = 2;
    for (const int n : {0, -1, 4}) {
        CAPTURE(n);
        try {
            scheduler.submit({{1, 2}, o}, n);
            FAIL("accepted");
        } catch (const std::invalid_argument& e) {
            CHECK(std::string(e.what()).rfind("n:", 0) == 0);
        }
    }
    CHECK(scheduler.idle());
    CHECK(scheduler.submit({{1, 2}, o}, 3).size() == 3);
}
