// Lesson 20's step on the GPU (attn::cuda::PagedEngine) against the CPU's forward_paged: two
// implementations, one answer. Every option combination forward_paged accepts, generated; each
// case a generated run of steps over twin caches (one per device, driven by the same calls):
// rows mixing prompt chunks and decode rows of several sequences, forks whose shared last
// block is copied on write, sequences freed and their blocks taken again, prompts that start
// with registered blocks (prefix-cache hits, a whole prompt found included). Then the
// scheduler end to end on both devices: the same requests give the same tokens.
#define DOCTEST_CONFIG_IMPLEMENT
#include "attn/cuda/device.hpp"
#include "attn/cuda/paged_engine.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/paged_cache.hpp"
#include "attn/random.hpp"
#include "attn/scheduler.hpp"

#include "../gpt_checks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

using namespace attn;

namespace {

constexpr double unit_roundoff = 0x1p-24;  // u, float32
// Higham's γ_n = n·u/(1 − n·u): a sum of n float32 terms in any order is within γ_{n−1} of
// Σ|terms| of the exact sum, so two orders differ by at most 2γ_n of it; a chain of sums of
// n₁, n₂, … terms (each result a term of the next) is within γ_{n₁+n₂+…} (Lemma 3.3).
double gamma_of(double n) { return n * unit_roundoff / (1.0 - n * unit_roundoff); }

// The bound on |GPU − CPU| of every logit of a step whose queries attend over at most T
// positions. The two sides compute the same sums in other orders (cuBLAS's blocking against
// OpenBLAS's, the kernel's fmaf chains against the CPU's loops) and other transcendentals
// (CUDA's expf and erff, each within 2 ulp, and the simulator's CUDA_SIM_DEVICE_MATH=ulp moves
// them by as much; the CPU's erf_approx is within 5e-9). The chain of sums to a logit, per
// block: LayerNorm's mean and variance (2C), a q, k or v (C), a score (hs), the softmax's sum
// (T), the weighted values (T), c_proj (C), LayerNorm (2C), c_fc (C), the MLP's c_proj (4C),
// and 8 terms for the roundings of exp, erf and the LayerNorms' 1/√ on either side; then
// ln_f (2C) and the logit's own sum (C). Its magnitude: as tests/mpi/step_bounds.hpp, the
// quantity's own scale, here the LM head's Σ_c |ln_f(x)_c · wte_vc| bounded through the
// weights (‖x̂‖₂ = √C after LayerNorm): √C‖g_lnf ⊙ wte_v‖₂ + Σ_c |b_lnf,c · wte_vc|, the
// largest over v. For the models here (C = 24 to 36, L = 2, T ≤ 40, weights N(0, 0.3)) it is
// about 1e-3; a key read from the wrong block or a block not copied on write moves logits by O(0.1).
double logit_bound(const GPT& model, int T) {
    const GPTConfig& c = model.config();
    const double C = c.n_embd, hs = C / c.n_head;
    const double block = 2 * C + C + hs + T + T + C + 2 * C + C + 4 * C + 8;
    const double n = c.n_layer * block + 2 * C + C;
    const ParameterTensors& p = model.params();
    double scale = 0.0;
    for (int v = 0; v < c.vocab_size; ++v) {
        double squares = 0.0, biased = 0.0;
        for (int k = 0; k < c.n_embd; ++k) {
            const double w = p.wte[static_cast<std::size_t>(v) * c.n_embd + k];
            squares += (p.lnfw[k] * w) * (p.lnfw[k] * w);
            if (p.lnfb) biased += std::fabs(p.lnfb[k] * w);
        }
        scale = std::max(scale, std::sqrt(C * squares) + biased);
    }
    return 2 * gamma_of(n) * scale;
}

// Every GPTConfig option combination forward_paged accepts: biases or none; learned
// positions, RoPE or ALiBi; as many key/value heads as query heads, half as many, one; the
// whole context or a window of 5. (Not causal, or without the 1/√hs: refused by both.)
std::vector<GPTConfig> option_combinations() {
    std::vector<GPTConfig> out;
    for (const bool bias : {true, false})
        for (const Position position : {Position::learned, Position::rope, Position::alibi})
            for (const int G : {4, 2, 1})
                for (const int window : {0, 5}) {
                    GPTConfig c;
                    c.vocab_size = 13;
                    c.block_size = 40;
                    c.n_layer = 2;
                    c.n_head = 4;
                    c.n_embd = 32;
                    c.bias = bias;
                    c.position = position;
                    c.n_kv_head = G;
                    c.window = window;
                    out.push_back(c);
                }
    return out;
}

std::string describe(const GPTConfig& c, int Bt) {
    return std::string(c.bias ? "bias" : "no bias") + ", " + position_name(c.position) + ", hs " +
           std::to_string(c.n_embd / c.n_head) + ", G " +
           std::to_string(c.kv_heads()) + ", window " + std::to_string(c.window) + ", Bt " +
           std::to_string(Bt);
}

// A sequence of the generated run: its tokens (the prompt, then one random token per decode
// step) and how many of them the caches hold.
struct Sequence {
    int id;
    std::vector<int> tokens;
    int computed;
};

// Twin caches, one per device, driven by the same calls, and the steps over them.
struct Twins {
    const GPT& model;
    PagedKVCache cpu_cache, gpu_cache;
    CpuPagedStep cpu;
    cuda::PagedEngine gpu;
    double worst_ratio = 0.0;  // the largest |GPU − CPU| / bound seen
    long rows = 0;

    Twins(const GPT& m, int blocks, int Bt)
        : model(m), cpu_cache(m.config(), blocks, Bt), gpu_cache(m.config(), blocks, Bt), cpu(m),
          gpu(m, gpu_cache) {}

    // One step on both; every logit compared.
    void step(const std::vector<PagedRow>& rows_in) {
        const std::vector<float> on_cpu = cpu.forward(cpu_cache, rows_in);
        const std::vector<float>& on_gpu = gpu.forward(gpu_cache, rows_in);
        REQUIRE(on_gpu.size() == on_cpu.size());
        int T = 1;
        for (const PagedRow& r : rows_in) T = std::max(T, r.pos + 1);
        const double bound = logit_bound(model, T);
        double worst = 0.0;
        for (std::size_t i = 0; i < on_cpu.size(); ++i)
            worst = std::max(worst, std::fabs(static_cast<double>(on_gpu[i]) - on_cpu[i]));
        CAPTURE(worst);
        CAPTURE(bound);
        CHECK(worst <= bound);  // NaN fails too
        worst_ratio = std::max(worst_ratio, worst / bound);
        rows += static_cast<long>(rows_in.size());
        for (const PagedRow& r : rows_in) CHECK(cpu_cache.block_table(r.seq) == gpu_cache.block_table(r.seq));
    }
};

// A generated run of `steps` steps over the twins: each step may admit a sequence (a fresh
// prompt, or one that starts with another's tokens, whole registered blocks of it, then maybe
// a tail of its own), fork one, free one; then every sequence computes a chunk of what it has
// pending (a prompt's rows, or the one token a decode step appended) and the full blocks are
// registered. Returns the number of forks, hits and copies on write it made happen.
struct RunCounts {
    int forks = 0, prefix_hits = 0, copies = 0, chunks = 0;
};
RunCounts generated_run(Twins& t, Rng& rng, int steps) {
    const GPTConfig& c = t.model.config();
    const int V = c.vocab_size, Bt = t.cpu_cache.block_tokens();
    auto token = [&] { return static_cast<int>(rng.below(static_cast<std::uint64_t>(V))); };
    std::vector<Sequence> live;
    RunCounts counts;
    int copies_seen = 0;
    for (int step = 0; step < steps; ++step) {
        // admit
        if (live.size() < 5 && (live.empty() || rng.below(3) != 0)) {
            std::vector<int> prompt;
            const Sequence* source = nullptr;
            for (const Sequence& s : live)
                if (s.computed >= Bt && rng.below(2) == 0) source = &s;
            if (source) {  // the source's leading whole blocks, then 0 to 4 tokens of its own
                const int whole = (source->computed / Bt) * Bt;
                prompt.assign(source->tokens.begin(), source->tokens.begin() + whole);
                const int tail = static_cast<int>(rng.below(5));
                for (int i = 0; i < tail; ++i) prompt.push_back(token());
            } else {
                const int length = 1 + static_cast<int>(rng.below(12));
                for (int i = 0; i < length; ++i) prompt.push_back(token());
            }
            const int a = t.cpu_cache.add_sequence(prompt), b = t.gpu_cache.add_sequence(prompt);
            REQUIRE(a == b);
            if (t.cpu_cache.length(a) > 0) ++counts.prefix_hits;
            live.push_back({a, prompt, t.cpu_cache.length(a)});
        }
        // fork a sequence whose keys are all computed: it shares every block
        if (live.size() < 6 && rng.below(3) == 0) {
            for (const Sequence& s : live) {
                if (static_cast<int>(s.tokens.size()) - s.computed == 1 && s.computed % Bt != 0) {
                    const int a = t.cpu_cache.fork(s.id), b = t.gpu_cache.fork(s.id);
                    REQUIRE(a == b);
                    Sequence child{a, s.tokens, s.computed};
                    child.tokens.back() = token();  // its own next token
                    live.push_back(child);
                    ++counts.forks;
                    break;
                }
            }
        }
        // free one now and then, or any near the end of the context
        for (std::size_t i = 0; i < live.size();) {
            const bool full = static_cast<int>(live[i].tokens.size()) + 1 >= c.block_size;
            if (full || rng.below(12) == 0) {
                t.cpu_cache.free_sequence(live[i].id);
                t.gpu_cache.free_sequence(live[i].id);
                live.erase(live.begin() + static_cast<long>(i));
            } else {
                ++i;
            }
        }
        if (live.empty()) continue;
        // the rows: a chunk of each sequence's pending tokens, in a shuffled order of sequences
        std::vector<std::size_t> order(live.size());
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
        for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
        std::vector<PagedRow> rows;
        std::map<int, int> planned;
        for (const std::size_t i : order) {
            const Sequence& s = live[i];
            const int pending = static_cast<int>(s.tokens.size()) - s.computed;
            const int n = pending <= 1 ? pending : 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(pending)));
            if (n > 1) ++counts.chunks;
            for (int k = 0; k < n; ++k) rows.push_back({s.id, s.tokens[static_cast<std::size_t>(s.computed + k)], s.computed + k});
            planned[s.id] = n;
        }
        if (rows.empty()) continue;
        // the copies on write this step makes, counted through the CPU cache's hook (the GPU
        // cache's is the engine's)
        t.cpu_cache.set_block_copy_hook([&copies_seen](int, int) { ++copies_seen; });
        t.step(rows);
        t.cpu_cache.set_block_copy_hook({});
        for (Sequence& s : live) {
            s.computed += planned[s.id];
            t.cpu_cache.register_full_blocks(s.id, s.tokens);
            t.gpu_cache.register_full_blocks(s.id, s.tokens);
            if (s.computed == static_cast<int>(s.tokens.size())) s.tokens.push_back(token());  // decode next
        }
        CHECK(t.cpu_cache.consistency_error() == "");
    }
    counts.copies = copies_seen;
    return counts;
}

GPT sharp(const GPTConfig& c, std::uint64_t seed) {
    GPT model = gpt_checks::sharp_model(c, seed);
    model.train(false);
    return model;
}

}  // namespace

TEST_CASE("the GPU step's logits equal the CPU's within the bound for every model option, with chunks, forks, copies on write and prefix-cache hits") {
    int index = 0;
    RunCounts total;
    double worst = 0.0;
    long rows = 0;
    for (GPTConfig config : option_combinations()) {
        Rng rng(1000 + static_cast<std::uint64_t>(index++));
        const int Bt = std::vector<int>{1, 3, 4, 8}[rng.below(4)];
        // head sizes 8, 6 and (without RoPE, which rotates pairs) the odd 9
        const int hs = std::vector<int>{8, 6, 9}[rng.below(config.position == Position::rope ? 2 : 3)];
        config.n_embd = config.n_head * hs;
        const std::string what = describe(config, Bt);
        CAPTURE(what);
        const GPT model = sharp(config, 50 + static_cast<std::uint64_t>(index));
        const int blocks = 6 * ((config.block_size + Bt - 1) / Bt) + 6;
        Twins twins(model, blocks, Bt);
        const RunCounts counts = generated_run(twins, rng, 14);
        total.forks += counts.forks;
        total.prefix_hits += counts.prefix_hits;
        total.copies += counts.copies;
        total.chunks += counts.chunks;
        worst = std::max(worst, twins.worst_ratio);
        rows += twins.rows;
    }
    std::printf("%d option combinations, %ld rows: %d prompt chunks, %d forks, %d copies on write, "
                "%d prefix-cache hits; largest |GPU - CPU| / bound %.2e\n",
                index, rows, total.chunks, total.forks, total.copies, total.prefix_hits, worst);
    // the runs did make what they are meant to check happen
    CHECK(total.forks > 0);
    CHECK(total.copies > 0);
    CHECK(total.prefix_hits > 0);
    CHECK(total.chunks > 0);
}

TEST_CASE("the GPU step refuses what forward_paged refuses, before anything changes") {
    GPTConfig c = option_combinations().front();
    const GPT model = sharp(c, 7);
    PagedKVCache cache(c, 8, 4), other(c, 8, 4);
    cuda::PagedEngine gpu(model, cache);
    const int seq = cache.add_sequence();
    gpu.forward(cache, {{seq, 1, 0}, {seq, 2, 1}});
    const std::vector<int> table = cache.block_table(seq);
    const int free_before = cache.free_blocks();
    const std::vector<std::vector<PagedRow>> bad = {
        {},                          // no rows
        {{seq + 1, 1, 0}},           // a sequence that is not live
        {{seq, 13, 2}},              // a token outside the vocabulary
        {{seq, 1, 3}},               // not the sequence's next position
        {{seq, 1, 2}, {seq, 1, 2}},  // the second row not the next either
    };
    for (const std::vector<PagedRow>& rows : bad) {
        CHECK_THROWS_AS(gpu.forward(cache, rows), std::invalid_argument);
        CHECK(cache.length(seq) == 2);
        CHECK(cache.block_table(seq) == table);
        CHECK(cache.free_blocks() == free_before);
    }
    // more blocks than the pool has: OutOfBlocks, nothing taken
    std::vector<PagedRow> long_chunk;
    for (int p = 2; p < 2 + 8 * 4; ++p) long_chunk.push_back({seq, 1, p});
    CHECK_THROWS_AS(gpu.forward(cache, long_chunk), OutOfBlocks);
    CHECK(cache.length(seq) == 2);
    // another cache than the one its pool mirrors, a cache of other sizes, a model it cannot run
    const int o = other.add_sequence();
    CHECK_THROWS_AS(gpu.forward(other, {{o, 1, 0}}), std::invalid_argument);
    GPTConfig wider = c;
    wider.n_embd = 48;
    PagedKVCache mismatched(wider, 8, 4);
    CHECK_THROWS_AS(cuda::PagedEngine(model, mismatched), std::invalid_argument);
    GPTConfig not_causal = c;
    not_causal.causal = false;
    const GPT peeking = sharp(not_causal, 7);
    PagedKVCache for_peeking(not_causal, 8, 4);
    CHECK_THROWS_AS(cuda::PagedEngine(peeking, for_peeking), std::invalid_argument);
    DecodeScratch scratch;  // as the CPU's step does
    const int p = for_peeking.add_sequence();
    CHECK_THROWS_AS(forward_paged(scratch, peeking, for_peeking, {{p, 1, 0}}), std::invalid_argument);
}

namespace {

// Every event of a run, per request, in order.
std::map<int, std::vector<StepEvent>> run_scheduler(Scheduler& scheduler) {
    std::map<int, std::vector<StepEvent>> out;
    for (int step = 0; step < 100000 && !scheduler.idle(); ++step)
        for (StepEvent& e : scheduler.step()) out[e.request].push_back(std::move(e));
    CHECK(scheduler.idle());
    return out;
}

}  // namespace

TEST_CASE("the scheduler gives the same tokens on both devices where the margins allow: batches, chunks, preemption, forks and prefix caching") {
    int compared = 0, events = 0, cases = 0;
    long preemptions = 0, hits = 0, forks = 0;
    double worst = 0.0;
    for (const GPTConfig& config : option_combinations()) {
        // one of each position scheme, with grouped heads, and with a window
        if (config.bias != (config.position != Position::rope) || config.kv_heads() != 2) continue;
        for (const int blocks : {40, 10}) {  // plenty, and too few for all: preemption
            Rng rng(300 + static_cast<std::uint64_t>(cases++));
            const std::string what = describe(config, 4) + ", " + std::to_string(blocks) + " blocks";
            CAPTURE(what);
            const GPT model = sharp(config, 90 + static_cast<std::uint64_t>(cases));
            // generated prompts, every other one starting with the first one's 8 tokens
            std::vector<CompletionRequest> requests;
            std::vector<int> shared;
            for (int i = 0; i < 8; ++i) shared.push_back(static_cast<int>(rng.below(13)));
            for (int i = 0; i < 7; ++i) {
                CompletionRequest r;
                if (i % 2 == 0) r.prompt = shared;
                const int tail = 1 + static_cast<int>(rng.below(10));
                for (int k = 0; k < tail; ++k) r.prompt.push_back(static_cast<int>(rng.below(13)));
                r.options.max_new_tokens = 6 + static_cast<int>(rng.below(12));
                r.options.top_k = 1;  // greedy: the largest logit, whose margin is known
                r.options.top_logprobs = 2;
                requests.push_back(r);
            }
            SchedulerOptions so;
            so.max_running = 5;
            so.step_tokens = 9;  // prompts longer than a step's rows: chunked prefill
            auto run = [&](PagedStep& step, PagedKVCache& cache, SchedulerStats& stats) {
                Scheduler scheduler(step, cache, so);
                for (std::size_t i = 0; i < requests.size(); ++i) {
                    if (i == 3) scheduler.submit(requests[i], 3);  // three continuations, forked
                    else scheduler.submit(requests[i]);
                    if (i % 3 == 1) scheduler.step();  // arrivals while others decode (events dropped
                                                       // on both sides alike)
                }
                std::map<int, std::vector<StepEvent>> out = run_scheduler(scheduler);
                stats = scheduler.stats();
                CHECK(cache.free_blocks() == blocks);
                return out;
            };
            PagedKVCache cpu_cache(config, blocks, 4), gpu_cache(config, blocks, 4);
            CpuPagedStep cpu(model);
            cuda::PagedEngine gpu(model, gpu_cache);
            SchedulerStats cpu_stats, gpu_stats;
            const auto on_cpu = run(cpu, cpu_cache, cpu_stats);
            const auto on_gpu = run(gpu, gpu_cache, gpu_stats);
            preemptions += cpu_stats.preemptions;
            hits += cpu_stats.prefix_cache_hits;
            forks += cpu_stats.forks;
            if (blocks == 10) CHECK(cpu_stats.preemptions > 0);
            // A token is the largest logit: while the CPU's margin over the runner-up exceeds
            // twice the step's bound (each side's logits within the bound of the exact ones,
            // their difference within it of the CPU's), the GPU picks the same one. Past the
            // first token decided by less, the two texts may part, so the comparison stops.
            const double bound = logit_bound(model, config.block_size);
            REQUIRE(on_cpu.size() == on_gpu.size());
            for (const auto& [id, cpu_events] : on_cpu) {
                CAPTURE(id);
                const std::vector<StepEvent>& gpu_events = on_gpu.at(id);
                for (std::size_t k = 0; k < cpu_events.size(); ++k) {
                    ++events;
                    const TokenLogprobs& lp = *cpu_events[k].logprobs;
                    REQUIRE(lp.top.size() == 2);
                    if (lp.top[0].second - lp.top[1].second <= 2 * bound) break;
                    REQUIRE(k < gpu_events.size());
                    CHECK(gpu_events[k].token == cpu_events[k].token);
                    // a log-probability is a logit less log Σ exp(logits): within 2 bounds
                    const double gap = std::fabs(gpu_events[k].logprobs->logprob - lp.logprob);
                    CHECK(gap <= 2 * bound);
                    worst = std::max(worst, gap / (2 * bound));
                    ++compared;
                }
            }
        }
    }
    std::printf("scheduler on both devices: %d of %d tokens decided by more than the margin, compared; "
                "%ld preemptions, %ld prefix-cache hits, %ld forks; largest log-probability "
                "gap / bound %.2e\n",
                compared, events, preemptions, hits, forks, worst);
    CHECK(compared >= events * 9 / 10);  // the margins let almost every token be compared
    CHECK(hits > 0);
    CHECK(forks > 0);
}

// Without a usable device: one line starting "skipped:" and exit status 0.
int main(int argc, char** argv) {
    std::string why;
    if (!cuda::device_available(&why)) {
        std::printf("skipped: no usable CUDA device (%s)\n", why.c_str());
        return 0;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
