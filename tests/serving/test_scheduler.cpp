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
