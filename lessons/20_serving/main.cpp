// Lesson 20: serving many users at once. The page that narrates this program is lesson.md
// beside it.
//
// It walks a small pool of blocks through appends, a fork and a copy on write; measures the
// memory a server holds for its keys and values when each sequence reserves its whole
// context against blocks taken as they fill; stores one prompt once for 16 continuations;
// finds the system prompt 16 clients share in the cache (automatic prefix caching);
// measures what one batched decode step costs against its rows (the matrix products apart
// from the rest, and again with two threads keeping both cores busy); runs a load of
// requests through the scheduler one at a time, in static batches and with continuous
// batching, for 1 to 32 clients; measures the step and the three policies again for a model
// whose weights do not fit in the CPU's caches (where a batch shares their reading); prints
// the serving goals against what it measured; and shows what the API's log-probabilities and
// nucleus sampling do to one distribution. Timings are printed, never checked.
// Timed: this program prints measured times, so CTest runs it with nothing beside it (RUN_SERIAL).
#include "attn/gpt_layers.hpp"
#include "attn/kv_cache.hpp"
#include "attn/lesson.hpp"
#include "attn/paged_cache.hpp"
#include "attn/plot.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"
#include "attn/scheduler.hpp"
#include "attn/threads.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace attn;
using Clock = std::chrono::steady_clock;

namespace {

// Prints as std::printf does and keeps the text, which `save` writes beside the pictures
// (--figures) for the page to show in its place: lesson20_<name>.txt.
class Section {
public:
    explicit Section(std::string name) : name_(std::move(name)) {}
    void operator()(const char* format, ...) __attribute__((format(printf, 2, 3))) {
        char buffer[1024];
        va_list args;
        va_start(args, format);
        std::vsnprintf(buffer, sizeof buffer, format, args);
        va_end(args);
        std::fputs(buffer, stdout);
        text_ += buffer;
    }
    void save(const LessonOptions& opts) const {
        if (opts.figures.empty()) return;
        std::ofstream(opts.figures / ("lesson20_" + name_ + ".txt")) << text_;
    }

private:
    std::string name_, text_;
};

std::string table_of(const PagedKVCache& cache, int seq) {
    std::string s = "[";
    for (int b : cache.block_table(seq)) s += (s.size() > 1 ? " " : "") + std::to_string(b);
    return s + "]";
}

void show_pool(Section& out, const PagedKVCache& cache, const std::vector<std::pair<std::string, int>>& seqs) {
    for (const auto& [name, seq] : seqs)
        out("  %-8s length %2d  block table %s\n", name.c_str(), cache.length(seq),
                    table_of(cache, seq).c_str());
    std::string refs;
    for (int b = 0; b < cache.num_blocks(); ++b) refs += " " + std::to_string(cache.ref_count(b));
    out("  reference counts of blocks 0..%d:%s   free blocks: %d\n", cache.num_blocks() - 1,
                refs.c_str(), cache.free_blocks());
}

// The block-table walk: a pool of 6 blocks of 4 positions, one layer, one head of 2.
void walk_the_pool(const LessonOptions& opts) {
    print_heading("One pool of blocks");
    Section out("walk");
    PagedKVCache cache(1, 1, 2, 0, 6, 4);
    const float kv[2] = {0.0f, 0.0f};
    const int a = cache.add_sequence();
    for (int p = 0; p < 6; ++p) cache.write(0, cache.append_slot(a), kv, kv);
    out("sequence a after 6 positions (blocks of 4: positions 0-3, then 4-5):\n");
    show_pool(out, cache, {{"a", a}});
    const int b = cache.fork(a);
    out("b = fork(a): the same blocks, each now read by two sequences:\n");
    show_pool(out, cache, {{"a", a}, {"b", b}});
    const BlockSlot slot = cache.append_slot(b);
    cache.write(0, slot, kv, kv);
    out("b appends position 6: its last block is shared, so it is copied first (copy on write):\n");
    show_pool(out, cache, {{"a", a}, {"b", b}});
    cache.free_sequence(a);
    out("a ends: block 0 goes back to one reader, block 1 to the pool:\n");
    show_pool(out, cache, {{"b", b}});
    out.save(opts);
    print_claim("walk_cow_block", std::to_string(slot.block));
}

// A request of the load: its prompt and how many tokens it asks for.
struct Load {
    std::vector<int> prompt;
    int max_tokens;
};

// n requests: prompts of 16-64 random tokens, each asking for `fewest` to `most` new ones.
std::vector<Load> make_load(int n, int vocab, int block, std::uint64_t seed, int fewest = 32, int most = 128) {
    Rng rng(seed);
    std::vector<Load> load;
    for (int i = 0; i < n; ++i) {
        const int prompt = 16 + static_cast<int>(rng.below(49));     // 16..64 tokens
        const int tokens = fewest + static_cast<int>(rng.below(static_cast<std::uint64_t>(most - fewest + 1)));
        Load l{std::vector<int>(static_cast<std::size_t>(prompt)), std::min(tokens, block - prompt + 1)};
        for (int& t : l.prompt) t = static_cast<int>(rng.below(static_cast<std::uint64_t>(vocab)));
        load.push_back(l);
    }
    return load;
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const std::size_t i = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size()))) - 1;
    return v[std::min(i, v.size() - 1)];
}

enum class Policy { one_at_a_time, static_batches, continuous };
const char* name_of(Policy p) {
    return p == Policy::one_at_a_time ? "one at a time" : p == Policy::static_batches ? "static" : "continuous";
}

struct Measured {
    double tokens_per_second = 0, ttft_p50 = 0, ttft_p99 = 0, tpot_p50 = 0, tpot_p99 = 0;
    long preemptions = 0;
    double mean_batch = 0;
};

// `clients` users, each sending its share of `load` one request after another (the next as
// soon as the last is answered), served by one scheduler under `policy`.
Measured serve(const GPT& model, const std::vector<Load>& load, int clients, Policy policy) {
    const GPTConfig& cfg = model.config();
    const int per_context = (cfg.block_size + 15) / 16;
    PagedKVCache cache(cfg, clients * per_context, 16);
    SchedulerOptions so;
    so.max_running = policy == Policy::one_at_a_time ? 1 : clients;
    so.max_waiting = clients;
    so.step_tokens = std::max(so.max_running, 256);
    Scheduler scheduler(model, cache, so);

    struct Client {
        std::size_t next;       // index into load of its next request
        int active = -1;        // its request in flight
        Clock::time_point sent, last;
        bool first = true;
    };
    std::vector<Client> users(static_cast<std::size_t>(clients));
    for (int c = 0; c < clients; ++c) users[static_cast<std::size_t>(c)].next = static_cast<std::size_t>(c);
    std::map<int, int> owner;  // request → client
    std::vector<double> ttft, tpot;
    long tokens = 0;
    const Clock::time_point start = Clock::now();
    //! [driver]
    while (true) {
        // Clients with nothing in flight send their next request; with static batching only
        // when the whole last batch has been answered.
        const bool may_send = policy != Policy::static_batches || scheduler.idle();
        bool pending = false;
        for (int c = 0; c < clients; ++c) {
            Client& u = users[static_cast<std::size_t>(c)];
            if (u.active < 0 && u.next < load.size() && may_send) {
                SampleOptions o;
                o.max_new_tokens = load[u.next].max_tokens;
                o.seed = u.next;
                u.active = scheduler.submit({load[u.next].prompt, o});
                owner[u.active] = c;
                u.sent = u.last = Clock::now();
                u.first = true;
                u.next += static_cast<std::size_t>(clients);
            }
            pending = pending || u.active >= 0 || u.next < load.size();
        }
        if (!pending) break;
        const std::vector<StepEvent> events = scheduler.step();
        const Clock::time_point now = Clock::now();
        for (const StepEvent& e : events) {
            Client& u = users[static_cast<std::size_t>(owner.at(e.request))];
            const double gap = std::chrono::duration<double>(now - u.last).count();
            (u.first ? ttft : tpot).push_back(gap);
            u.first = false;
            u.last = now;
            ++tokens;
            if (e.finished) u.active = -1;
        }
    }
    //! [driver]
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    Measured m;
    m.tokens_per_second = static_cast<double>(tokens) / elapsed;
    m.ttft_p50 = percentile(ttft, 50) * 1e3;
    m.ttft_p99 = percentile(ttft, 99) * 1e3;
    m.tpot_p50 = percentile(tpot, 50) * 1e3;
    m.tpot_p99 = percentile(tpot, 99) * 1e3;
    m.preemptions = scheduler.stats().preemptions;
    m.mean_batch = static_cast<double>(scheduler.stats().decode_rows) /
                   static_cast<double>(std::max<long>(1, scheduler.stats().steps));
    return m;
}

// The memory of keys and values while a load runs with continuous batching, averaged over
// the steps: the positions held, what a contiguous cache reserves (the whole context per
// running sequence) and what the paged cache has taken (whole blocks of `block_tokens`).
struct Memory {
    double held = 0, contiguous = 0, paged = 0, steps = 0;
};

Memory run_for_memory(const GPT& model, const std::vector<Load>& load, int running, int block_tokens) {
    const GPTConfig& cfg = model.config();
    const int per_context = (cfg.block_size + block_tokens - 1) / block_tokens;
    PagedKVCache cache(cfg, running * per_context, block_tokens);
    SchedulerOptions so;
    so.max_running = running;
    so.max_waiting = static_cast<int>(load.size());
    so.step_tokens = 256;
    Scheduler scheduler(model, cache, so);
    std::vector<int> ids;
    for (std::size_t i = 0; i < load.size(); ++i) {
        SampleOptions o;
        o.max_new_tokens = load[i].max_tokens;
        o.seed = i;
        ids.push_back(scheduler.submit({load[i].prompt, o}));
    }
    Memory m;
    while (!scheduler.idle()) {
        scheduler.step();
        long held = 0;
        int seqs = 0;
        for (int id : ids) {
            const int seq = scheduler.sequence_of(id);
            if (seq < 0) continue;
            held += cache.length(seq);
            ++seqs;
        }
        if (seqs == 0) continue;
        m.held += static_cast<double>(held);
        m.contiguous += static_cast<double>(seqs) * cfg.block_size;
        m.paged += static_cast<double>(cache.num_blocks() - cache.free_blocks()) * block_tokens;
        m.steps += 1;
    }
    return m;
}

void measure_memory(const GPT& model, const std::vector<Load>& load, int running, const LessonOptions& opts) {
    print_heading("Memory: the worst case reserved, or blocks as they fill");
    Section out("memory");
    const int context = model.config().block_size;
    out("%zu requests, %d running at once, context %d; positions of keys and values per step,\n"
                "averaged over the steps:\n\n", load.size(), running, context);
    std::map<int, Memory> by_block;
    for (const int bt : {4, 8, 16, 32}) by_block[bt] = run_for_memory(model, load, running, bt);
    const Memory& m16 = by_block[16];  // the held positions are the same for every block size
    const double contiguous_waste = 100.0 * (1.0 - m16.held / m16.contiguous);
    out("  %-38s %10s %10s\n", "", "positions", "wasted");
    out("  %-38s %10.1f\n", "held (what attention reads)", m16.held / m16.steps);
    out("  %-38s %10.1f %9.1f%%\n", ("contiguous, " + std::to_string(context) + " reserved per sequence").c_str(),
                m16.contiguous / m16.steps, contiguous_waste);
    for (const auto& [bt, m] : by_block) {
        out("  %-38s %10.1f %9.1f%%\n", ("paged, blocks of " + std::to_string(bt)).c_str(),
                    m.paged / m.steps, 100.0 * (1.0 - m.held / m.paged));
    }
    out.save(opts);
    print_claim("memory_requests", std::to_string(load.size()));
    print_claim("memory_running", std::to_string(running));
    print_claim("held_positions", m16.held / m16.steps, 0);
    print_claim("contiguous_waste_pct", contiguous_waste, 1);
    for (const auto& [bt, m] : by_block)
        print_claim("paged_waste_pct_bt" + std::to_string(bt), 100.0 * (1.0 - m.held / m.paged), 1);
}

// One prompt, 16 continuations: each prefilled on its own, or the prompt prefilled once and
// forked 16 times (the continuations differ only in their sampling seeds).
void measure_sharing(const GPT& model, int prompt_length, int continuations, int new_tokens,
                     const LessonOptions& opts) {
    print_heading("A common prompt, stored once");
    const GPTConfig& cfg = model.config();
    Rng rng(5);
    std::vector<int> prompt(static_cast<std::size_t>(prompt_length));
    for (int& t : prompt) t = static_cast<int>(rng.below(static_cast<std::uint64_t>(cfg.vocab_size)));
    auto run = [&](bool share, std::vector<std::vector<int>>& texts) {
        PagedKVCache cache(cfg, 2 * continuations * ((prompt_length + new_tokens + 15) / 16), 16);
        DecodeScratch scratch;
        std::vector<int> seqs;
        std::vector<PagedRow> rows;
        std::vector<float> last;
        if (share) {
            //! [fork]
            const int root = cache.add_sequence();
            for (int p = 0; p < prompt_length; ++p) rows.push_back({root, prompt[static_cast<std::size_t>(p)], p});
            const std::vector<float>& logits = forward_paged(scratch, model, cache, rows);
            last.assign(logits.end() - cfg.vocab_size, logits.end());
            for (int i = 0; i < continuations; ++i) seqs.push_back(cache.fork(root));
            cache.free_sequence(root);
            //! [fork]
        } else {
            for (int i = 0; i < continuations; ++i) {
                seqs.push_back(cache.add_sequence());
                rows.clear();
                for (int p = 0; p < prompt_length; ++p) rows.push_back({seqs.back(), prompt[static_cast<std::size_t>(p)], p});
                const std::vector<float>& logits = forward_paged(scratch, model, cache, rows);
                last.assign(logits.end() - cfg.vocab_size, logits.end());
            }
        }
        int peak = 0;
        texts.assign(static_cast<std::size_t>(continuations), {});
        std::vector<Rng> rngs;
        for (int i = 0; i < continuations; ++i) rngs.emplace_back(100 + i);
        std::vector<std::vector<float>> next(static_cast<std::size_t>(continuations), last);
        for (int k = 0; k < new_tokens; ++k) {
            rows.clear();
            for (int i = 0; i < continuations; ++i) {
                const int token = sample_token(next[static_cast<std::size_t>(i)], 1.0f, 0, rngs[static_cast<std::size_t>(i)]);
                texts[static_cast<std::size_t>(i)].push_back(token);
                rows.push_back({seqs[static_cast<std::size_t>(i)], token, prompt_length + k});
            }
            const std::vector<float>& logits = forward_paged(scratch, model, cache, rows);
            for (int i = 0; i < continuations; ++i)
                next[static_cast<std::size_t>(i)].assign(logits.begin() + static_cast<long>(i) * cfg.vocab_size,
                                                         logits.begin() + static_cast<long>(i + 1) * cfg.vocab_size);
            peak = std::max(peak, cache.num_blocks() - cache.free_blocks());
        }
        return peak;
    };
    std::vector<std::vector<int>> alone, shared;
    const int blocks_alone = run(false, alone);
    const int blocks_shared = run(true, shared);
    const double saving = 100.0 * (1.0 - static_cast<double>(blocks_shared) / blocks_alone);
    Section out("share");
    out("a prompt of %d tokens, %d continuations of %d tokens each, blocks of 16:\n",
                prompt_length, continuations, new_tokens);
    out("  each with its own copy of the prompt      %4d blocks\n", blocks_alone);
    out("  the prompt's blocks shared (fork)         %4d blocks   %.0f%% fewer\n", blocks_shared, saving);
    out("  the same 16 texts either way: %s\n", alone == shared ? "yes, token for token" : "NO");
    out.save(opts);
    print_claim("share_prompt", std::to_string(prompt_length));
    print_claim("share_blocks_alone", std::to_string(blocks_alone));
    print_claim("share_blocks_shared", std::to_string(blocks_shared));
    print_claim("share_saving_pct", saving, 0);
    print_claim("share_same_texts", alone == shared ? "yes" : "no");
}

// What the API's sampling fields do to one next-character distribution, made up for the
// example: eight likely characters and a long tail of 57 unlikely ones (65 in all, as the
// Shakespeare model has). `logprobs` reports the model's own log-probabilities; top_p keeps
// the smallest set of the most likely characters whose probability reaches p, after the
// temperature has sharpened or flattened the distribution.
void show_sampling(const LessonOptions& opts) {
    print_heading("Log-probabilities and the nucleus (top_p)");
    Section out("sampling");
    const std::string likely = " ntsfwa'";
    const std::vector<float> head = {2.0f, 1.2f, 0.9f, 0.5f, 0.1f, -0.3f, -0.8f, -1.5f};
    std::vector<float> logits(65, -4.0f);
    std::copy(head.begin(), head.end(), logits.begin());
    out("logits: ");
    for (std::size_t i = 0; i < head.size(); ++i) out("'%c' %.1f  ", likely[i], static_cast<double>(head[i]));
    out("and 57 more characters at -4.0\n\n");
    const std::vector<double> lp = log_softmax(logits);
    const TokenLogprobs top = token_logprobs(lp, 0, 5);
    out("the 5 most likely, as \"logprobs\": 5 reports them (log p, then p):\n");
    for (const auto& [id, value] : top.top)
        out("  '%c'  %7.3f  %.3f\n", likely[static_cast<std::size_t>(id)], value, std::exp(value));
    double tail = 0.0;
    for (std::size_t i = head.size(); i < lp.size(); ++i) tail += std::exp(lp[i]);
    out("  the 57 others together: %.3f\n\n", tail);
    out("%-12s %-16s %-16s %-16s\n", "temperature", "top_p 0.5", "top_p 0.9", "top_p 1");
    std::map<std::pair<float, float>, int> kept;
    for (const float temperature : {1.0f, 0.7f}) {
        out("%-12.1f", static_cast<double>(temperature));
        const std::vector<double> all = sampling_weights(logits, temperature, 0, 1.0f);
        double total = 0.0;
        for (double w : all) total += w;
        for (const float p : {0.5f, 0.9f, 1.0f}) {
            const std::vector<double> w = sampling_weights(logits, temperature, 0, p);
            int n = 0;
            double mass = 0.0;
            for (double x : w) n += x > 0.0, mass += x;
            kept[{temperature, p}] = n;
            out(" %2d kept (%.2f)  ", n, mass / total);
        }
        out("\n");
    }
    out("(characters kept, and the probability they held before the draw renormalises them)\n");
    out.save(opts);
    print_claim("sampling_tail_mass", tail, 2);
    print_claim("nucleus_t1_p09", std::to_string(kept[{1.0f, 0.9f}]));
    print_claim("nucleus_t07_p09", std::to_string(kept[{0.7f, 0.9f}]));
}

// Automatic prefix caching: `clients` users whose prompts all start with the same system
// prompt of `system` tokens, then a question of their own; each sends its next request when
// the last is answered. The time to the first token (in steps and in milliseconds) and the
// blocks held, with the scheduler's prefix caching off and on.
struct PrefixRun {
    double ttft_steps_p50 = 0, ttft_ms_p50 = 0, blocks_held = 0;
    long prefill_rows = 0, hits = 0, queries = 0, evictions = 0;
    std::vector<std::vector<int>> texts;  // per request, in the order of the load
};

PrefixRun serve_with_prefix(const GPT& model, const std::vector<std::vector<int>>& prompts, int clients,
                            int new_tokens, bool caching) {
    const GPTConfig& cfg = model.config();
    PagedKVCache cache(cfg, clients * ((cfg.block_size + 15) / 16), 16);
    SchedulerOptions so;
    so.max_running = clients;
    so.max_waiting = clients;
    so.step_tokens = 256;
    so.prefix_caching = caching;
    Scheduler scheduler(model, cache, so);
    PrefixRun run;
    run.texts.resize(prompts.size());
    std::vector<std::size_t> next(static_cast<std::size_t>(clients));
    std::vector<int> active(static_cast<std::size_t>(clients), -1);
    for (int c = 0; c < clients; ++c) next[static_cast<std::size_t>(c)] = static_cast<std::size_t>(c);
    struct Sent {
        std::size_t index;
        long step;
        Clock::time_point at;
        int client;
    };
    std::map<int, Sent> sent;  // request → what it is and when it was sent
    std::vector<double> ttft_steps, ttft_ms;
    double held = 0;
    long steps = 0;
    while (true) {
        bool pending = false;
        for (int c = 0; c < clients; ++c) {
            const std::size_t u = static_cast<std::size_t>(c);
            if (active[u] < 0 && next[u] < prompts.size()) {
                SampleOptions o;
                o.max_new_tokens = new_tokens;
                o.seed = next[u];
                active[u] = scheduler.submit({prompts[next[u]], o});
                sent[active[u]] = {next[u], steps, Clock::now(), c};
                next[u] += static_cast<std::size_t>(clients);
            }
            pending = pending || active[u] >= 0;
        }
        if (!pending) break;
        const std::vector<StepEvent> events = scheduler.step();
        ++steps;
        held += cache.num_blocks() - cache.free_blocks();
        const Clock::time_point now = Clock::now();
        for (const StepEvent& e : events) {
            const Sent& s = sent.at(e.request);
            std::vector<int>& text = run.texts[s.index];
            if (text.empty()) {
                ttft_steps.push_back(static_cast<double>(steps - s.step));
                ttft_ms.push_back(std::chrono::duration<double, std::milli>(now - s.at).count());
            }
            text.push_back(e.token);
            if (e.finished) active[static_cast<std::size_t>(s.client)] = -1;
        }
    }
    const SchedulerStats st = scheduler.stats();
    run.ttft_steps_p50 = percentile(ttft_steps, 50);
    run.ttft_ms_p50 = percentile(ttft_ms, 50);
    run.blocks_held = held / static_cast<double>(std::max<long>(1, steps));
    run.prefill_rows = st.prefill_rows;
    run.hits = st.prefix_cache_hits;
    run.queries = st.prefix_cache_queries;
    run.evictions = st.prefix_cache_evictions;
    return run;
}

double measure_prefix_caching(const GPT& model, int rounds, const LessonOptions& opts) {
    print_heading("A common system prompt, found in the cache");
    const GPTConfig& cfg = model.config();
    const int clients = 16, system = 48, new_tokens = 8;
    Rng rng(48);
    std::vector<int> system_prompt(static_cast<std::size_t>(system));
    for (int& t : system_prompt) t = static_cast<int>(rng.below(static_cast<std::uint64_t>(cfg.vocab_size)));
    // each request: the system prompt, then a question of 1 to 8 tokens; 48 + 8 + 8 − 1 = 63
    // positions fit the smallest context the lesson runs with, 64 (--quick)
    std::vector<std::vector<int>> prompts;
    for (int i = 0; i < clients * rounds; ++i) {
        std::vector<int> p = system_prompt;
        for (std::uint64_t k = 1 + rng.below(8); k > 0; --k) p.push_back(static_cast<int>(rng.below(static_cast<std::uint64_t>(cfg.vocab_size))));
        prompts.push_back(p);
    }
    // the better (lower median time to the first token) of two runs each, alternated: the
    // machine is shared
    PrefixRun off = serve_with_prefix(model, prompts, clients, new_tokens, false);
    PrefixRun on = serve_with_prefix(model, prompts, clients, new_tokens, true);
    const PrefixRun off2 = serve_with_prefix(model, prompts, clients, new_tokens, false);
    const PrefixRun on2 = serve_with_prefix(model, prompts, clients, new_tokens, true);
    if (off2.ttft_ms_p50 < off.ttft_ms_p50) off = off2;
    if (on2.ttft_ms_p50 < on.ttft_ms_p50) on = on2;
    const double hit_rate = 100.0 * static_cast<double>(on.hits) / static_cast<double>(std::max<long>(1, on.queries));
    const double faster = off.ttft_ms_p50 / on.ttft_ms_p50;
    Section out("prefix");
    out("%d clients, %d requests each: a system prompt of %d tokens, then a question of 1-8\n"
        "tokens; %d new tokens each, blocks of 16. TTFT: from a request's submission to its first\n"
        "token (the better of two runs); blocks held: referenced by a sequence, averaged over the\n"
        "steps. The longest request needs %d of the context's %d positions.\n\n", clients, rounds, system,
        new_tokens, system + 8 + new_tokens - 1, cfg.block_size);
    out("  %-15s %15s %12s %12s %13s\n", "prefix caching", "TTFT p50 steps", "TTFT p50", "blocks held", "prefill rows");
    out("  %-15s %15.0f %9.2f ms %12.1f %13ld\n", "off", off.ttft_steps_p50, off.ttft_ms_p50, off.blocks_held, off.prefill_rows);
    out("  %-15s %15.0f %9.2f ms %12.1f %13ld\n", "on", on.ttft_steps_p50, on.ttft_ms_p50, on.blocks_held, on.prefill_rows);
    out("\n  %ld of %ld full prompt blocks found in the cache (%.0f%%), %ld evicted\n", on.hits, on.queries, hit_rate, on.evictions);
    out("  the median first token %.1fx sooner with prefix caching; the same texts: %s\n", faster,
        on.texts == off.texts ? "yes, token for token" : "NO");
    out.save(opts);
    print_claim("prefix_system", std::to_string(system));
    print_claim("prefix_clients", std::to_string(clients));
    print_claim("prefix_ttft_off_ms", off.ttft_ms_p50, 2);
    print_claim("prefix_ttft_on_ms", on.ttft_ms_p50, 2);
    print_claim("prefix_ttft_off_steps", off.ttft_steps_p50, 0);
    print_claim("prefix_ttft_on_steps", on.ttft_steps_p50, 0);
    print_claim("prefix_blocks_off", off.blocks_held, 1);
    print_claim("prefix_blocks_on", on.blocks_held, 1);
    print_claim("prefix_rows_off", std::to_string(off.prefill_rows));
    print_claim("prefix_rows_on", std::to_string(on.prefill_rows));
    print_claim("prefix_hit_pct", hit_rate, 0);
    print_claim("prefix_speedup", faster, 1);
    print_claim("prefix_same_texts", on.texts == off.texts ? "yes" : "no");
    return faster;
}

// ---------------------------------------------------------------------------------------
// The cost of one decode step against its rows

// R sequences of `context` positions, each given one decode row per step. Their keys and
// values are random numbers written straight into the blocks: the time of a step depends
// on how many positions it reads, not on what they hold.
struct StepBench {
    PagedKVCache cache;
    DecodeScratch scratch;
    std::vector<PagedRow> rows;
    StepBench(const GPTConfig& cfg, int R, int context, int steps)
        : cache(cfg, R * ((context + steps + 15) / 16), 16) {
        const int kv = cfg.kv_heads() * (cfg.n_embd / cfg.n_head);
        Rng rng(static_cast<std::uint64_t>(R));
        std::vector<float> k(static_cast<std::size_t>(kv)), v(k.size());
        for (int r = 0; r < R; ++r) {
            const int seq = cache.add_sequence();
            for (int p = 0; p < context; ++p) {
                const BlockSlot slot = cache.append_slot(seq);
                for (int l = 0; l < cfg.n_layer; ++l) {
                    for (float& x : k) x = rng.normal();
                    for (float& x : v) x = rng.normal();
                    cache.write(l, slot, k.data(), v.data());
                }
            }
            rows.push_back({seq, r % cfg.vocab_size, context});
        }
    }
    // one step: every sequence's next position
    void step(const GPT& model) {
        forward_paged(scratch, model, cache, rows);
        for (PagedRow& r : rows) ++r.pos;
    }
};

// The model's matrix products alone for R rows: per layer c_attn, c_proj, c_fc and the
// MLP's c_proj, then the LM head; what a step spends reading weights.
void products(std::vector<float>& in, std::vector<float>& out, const GPT& model, int R) {
    const GPTConfig& cfg = model.config();
    const int C = cfg.n_embd, QKV = cfg.qkv_channels();
    const std::size_t uC = static_cast<std::size_t>(C);
    const ParameterTensors& p = model.params();
    for (int l = 0; l < cfg.n_layer; ++l) {
        matmul_forward(out.data(), in.data(), p.qkvw + static_cast<std::size_t>(l) * QKV * uC, nullptr, R, C, QKV);
        matmul_forward(out.data(), in.data(), p.attprojw + l * uC * uC, nullptr, R, C, C);
        matmul_forward(out.data(), in.data(), p.fcw + l * 4 * uC * uC, nullptr, R, C, 4 * C);
        matmul_forward(out.data(), in.data(), p.fcprojw + l * 4 * uC * uC, nullptr, R, 4 * C, C);
    }
    matmul_forward(out.data(), in.data(), p.wte, nullptr, R, C, cfg.vocab_size);
}

struct StepCosts {
    std::map<int, double> step_ms, products_ms;  // rows per step → median milliseconds
};

// Every step size in turn, round after round, so that whatever else the machine does falls
// on all of them alike; the median of each over the rounds. Each round moves every sequence
// two positions on.
StepCosts measure_steps(const GPT& model, const std::vector<int>& sizes, int context, int rounds) {
    const GPTConfig& cfg = model.config();
    std::map<int, StepBench> benches;
    for (int R : sizes) benches.emplace(std::piecewise_construct, std::forward_as_tuple(R),
                                        std::forward_as_tuple(cfg, R, context, 2 * rounds + 1));
    const int largest = *std::max_element(sizes.begin(), sizes.end());
    std::vector<float> in(static_cast<std::size_t>(largest) * 4 * cfg.n_embd, 0.5f);
    std::vector<float> out(static_cast<std::size_t>(largest) * 4 * cfg.n_embd);
    for (auto& [R, b] : benches) b.step(model);  // first touch of the scratch buffers
    std::map<int, std::vector<double>> step, prod;
    for (int k = 0; k < rounds; ++k) {
        for (int R : sizes) {
            // one step untimed: the rows' blocks back in the CPU's caches, as they are when a
            // server steps the same sequences again and again
            benches.at(R).step(model);
            Clock::time_point t0 = Clock::now();
            benches.at(R).step(model);
            step[R].push_back(std::chrono::duration<double>(Clock::now() - t0).count() * 1e3);
            t0 = Clock::now();
            products(in, out, model, R);
            prod[R].push_back(std::chrono::duration<double>(Clock::now() - t0).count() * 1e3);
        }
    }
    StepCosts c;
    for (int R : sizes) {
        c.step_ms[R] = percentile(step[R], 50);
        c.products_ms[R] = percentile(prod[R], 50);
    }
    return c;
}

// Two threads that keep both cores busy while they live: another program's load.
class BusyCores {
public:
    BusyCores() {
        for (int i = 0; i < 2; ++i)
            threads_.emplace_back([this] {
                volatile double x = 1.0;
                while (!stop_.load(std::memory_order_relaxed)) x = x * 1.0000001 + 1e-9;
            });
    }
    ~BusyCores() {
        stop_ = true;
        for (std::thread& t : threads_) t.join();
    }

private:
    std::atomic<bool> stop_{false};
    std::vector<std::thread> threads_;
};

// What a step of one row and a step of `big` rows cost, and the ratio again with both cores
// busy.
struct StepSummary {
    int big = 0;
    double one_ms = 0, big_ms = 0, ratio = 0, busy_ratio = 0;
};

// The step-cost table of `model`, printed into section `name`; its claims are named with
// `prefix` in front.
StepSummary measure_step_cost(const GPT& model, const LessonOptions& opts, const std::string& name,
                              const std::string& prefix, int full_rounds) {
    Section out(name);
    const int context = opts.quick ? 32 : 96, rounds = opts.quick ? 5 : full_rounds;
    const std::vector<int> sizes = opts.quick ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4, 8, 16, 32};
    const int big = opts.quick ? 4 : 16;
    const StepCosts c = measure_steps(model, sizes, context, rounds);
    out("one decode row per sequence, each sequence at %d-%d positions; the step sizes in turn,\n"
        "%d rounds, the median of each. products: the matrix products alone for the same rows\n"
        "(the weights); the rest: attention over each row's blocks, LayerNorm, GELU, RoPE.\n\n",
        context, context + 2 * rounds + 1, rounds);
    const double kv_kb = static_cast<double>(PagedKVCache(model.config(), 1, 16).bytes_per_position()) / 1024.0;
    out("weights: %.1f MB, read once per step; a row's own keys and values: %.1f KB per position of\n"
        "its sequence, %.0f KB at %d positions\n",
        static_cast<double>(model.parameters().size() * sizeof(float)) / 1e6, kv_kb, kv_kb * context, context);
    const int blas_threads = thread_config().blas_threads;
    out("threads: forward_paged has no parallel loop, and OpenBLAS runs each product on %d thread%s:\n"
        "a step runs on the thread that calls it\n\n", blas_threads, blas_threads == 1 ? "" : "s");
    out("  %9s  %9s  %10s  %11s  %9s  %14s\n", "rows/step", "ms/step", "ms per row", "products ms",
        "rest ms", "step / 1 row's");
    const double one = c.step_ms.at(1);
    for (int R : sizes) {
        const double step = c.step_ms.at(R), prod = c.products_ms.at(R);
        out("  %9d  %9.3f  %10.4f  %11.3f  %9.3f  %13.1fx\n", R, step, step / R, prod,
            std::max(0.0, step - prod), step / one);
    }
    StepSummary r;
    r.big = big;
    r.one_ms = one;
    r.big_ms = c.step_ms.at(big);
    r.ratio = r.big_ms / one;
    {
        const BusyCores busy;
        const StepCosts b = measure_steps(model, {1, big}, context, rounds);
        r.busy_ratio = b.step_ms.at(big) / b.step_ms.at(1);
    }
    out("\na step of %d rows costs %.1fx a step of one; with two threads spinning beside it (both\n"
        "cores busy) %.1fx\n", big, r.ratio, r.busy_ratio);
    out.save(opts);
    print_claim(prefix + "step_rows_big", std::to_string(big));
    print_claim(prefix + "step_context", std::to_string(context));
    print_claim(prefix + "kv_kb_per_position", kv_kb, 1);
    print_claim(prefix + "step_blas_threads", std::to_string(blas_threads));
    print_claim(prefix + "step_one_ms", one, 3);
    print_claim(prefix + "step_big_ms", c.step_ms.at(big), 3);
    print_claim(prefix + "step_ratio", r.ratio, 1);
    print_claim(prefix + "step_ratio_busy", r.busy_ratio, 1);
    print_claim(prefix + "products_one_ms", c.products_ms.at(1), 3);
    print_claim(prefix + "products_big_ms", c.products_ms.at(big), 3);
    print_claim(prefix + "products_ratio", c.products_ms.at(big) / c.products_ms.at(1), 1);
    print_claim(prefix + "rest_ratio", (c.step_ms.at(big) - c.products_ms.at(big)) /
                                           std::max(1e-9, one - c.products_ms.at(1)), 1);
    return r;
}

using Results = std::map<std::pair<int, Policy>, Measured>;

// The load served under each policy for each number of clients, a row each into `out`; the
// better of `tries` runs (on a shared machine the faster run is the one less disturbed), of
// `alone_tries` for one request at a time.
Results throughput_table(const GPT& model, const std::vector<Load>& load, const std::vector<int>& client_counts,
                         int tries, int alone_tries, Section& out) {
    out("%7s  %-13s  %9s  %10s  %10s  %10s  %10s  %6s\n", "clients", "policy", "tokens/s",
        "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "batch");
    Results results;
    for (int clients : client_counts) {
        for (Policy p : {Policy::one_at_a_time, Policy::static_batches, Policy::continuous}) {
            Measured m = serve(model, load, clients, p);
            for (int t = 1; t < (p == Policy::one_at_a_time ? alone_tries : tries); ++t) {
                const Measured again = serve(model, load, clients, p);
                if (again.tokens_per_second > m.tokens_per_second) m = again;
            }
            results[{clients, p}] = m;
            out("%7d  %-13s  %9.0f  %8.1f ms %8.1f ms %8.2f ms %8.2f ms  %6.1f\n", clients, name_of(p),
                m.tokens_per_second, m.ttft_p50, m.ttft_p99, m.tpot_p50, m.tpot_p99, m.mean_batch);
        }
        out("\n");
    }
    return results;
}

double tokens_ratio(const Results& r, int clients, Policy a, Policy b) {
    return r.at({clients, a}).tokens_per_second / r.at({clients, b}).tokens_per_second;
}

// A model whose weights do not fit in the CPU's caches: 8 layers, C 512, and the grouped keys
// and values of lesson 16 (8 query heads, 2 key/value heads), as served models have them.
// Random weights again.
struct LargeModel {
    StepSummary step;
    Results results;
    int clients = 0;
};

LargeModel measure_large_model(const LessonOptions& opts) {
    print_heading("The same, for a model larger than the CPU's caches");
    GPTConfig cfg;
    cfg.vocab_size = 65;
    cfg.block_size = opts.quick ? 64 : 256;
    cfg.n_layer = opts.quick ? 2 : 8;
    cfg.n_head = 8;
    cfg.n_kv_head = 2;
    cfg.n_embd = opts.quick ? 64 : 512;
    GPT model(cfg, 1337);
    model.train(false);
    const double weights_mb = static_cast<double>(model.parameters().size() * sizeof(float)) / 1e6;
    std::printf("\nthe model: %d layers, %d heads sharing %d key/value heads, C %d, context %d, %zu parameters,\n"
                "%.1f MB of weights (random)\n\n", cfg.n_layer, cfg.n_head, cfg.n_kv_head, cfg.n_embd,
                cfg.block_size, model.parameters().size(), weights_mb);
    print_claim("large_layers", std::to_string(cfg.n_layer));
    print_claim("large_embd", std::to_string(cfg.n_embd));
    print_claim("large_parameters_m", static_cast<double>(model.parameters().size()) / 1e6, 1);
    print_claim("large_weights_mb", weights_mb, 0);
    LargeModel r;
    r.step = measure_step_cost(model, opts, "large_step_cost", "large_", 10);

    Section out("large_throughput");
    const int requests = opts.quick ? 4 : 64;
    r.clients = opts.quick ? 2 : 16;
    const std::vector<Load> load = make_load(requests, cfg.vocab_size, cfg.block_size, 21, 8, 48);
    out("\n%d requests (prompts of 16-64 tokens, 8-48 new ones), %d clients, as above: the\n"
        "better of two runs for static and continuous batching, one run one at a time (%d\n"
        "requests one after another: it varies least)\n\n", requests, r.clients, requests);
    r.results = throughput_table(model, load, {r.clients}, opts.quick ? 1 : 2, 1, out);
    const double speedup = tokens_ratio(r.results, r.clients, Policy::continuous, Policy::one_at_a_time);
    const double over_static = tokens_ratio(r.results, r.clients, Policy::continuous, Policy::static_batches);
    out("continuous batching serves %.1fx the tokens/s of one request at a time, %.2fx those of\n"
        "static batches\n", speedup, over_static);
    out.save(opts);
    print_claim("large_continuous_speedup", speedup, 1);
    print_claim("large_continuous_over_static", over_static, 2);
    print_claim("large_one_at_a_time_tps", r.results.at({r.clients, Policy::one_at_a_time}).tokens_per_second, 0);
    print_claim("large_continuous_tps", r.results.at({r.clients, Policy::continuous}).tokens_per_second, 0);
    return r;
}

// The serving goals this lesson measures in-process, for both models, each against its aim.
void print_goals(const LessonOptions& opts, const StepSummary& small_step, const Results& small, int at,
                 const LargeModel& large, double prefix_speedup) {
    print_heading("The goals, measured");
    Section out("goals");
    int met = 0, rows = 0;
    const auto cell = [&](double value, bool ok, int decimals) {
        ++rows;
        met += ok ? 1 : 0;
        char text[32];
        std::snprintf(text, sizeof text, "%.*fx %s", decimals, value, ok ? "met" : "short");
        return std::string(text);
    };
    const auto row = [&](const char* goal, const char* aim, const std::string& a, const std::string& b) {
        out("%-36s %-9s %-12s %s\n", goal, aim, a.c_str(), b.c_str());
    };
    char step_goal[64], tokens_goal[64];
    std::snprintf(step_goal, sizeof step_goal, "%d-row step / 1-row step", small_step.big);
    std::snprintf(tokens_goal, sizeof tokens_goal, "tokens/s, continuous / one at a time");
    out("measured in this process, on this machine: the small model\n"
        "(4 layers, C 128) and the large one (8 layers, C 512) above;\n"
        "tokens/s at %d clients\n\n", at);
    row("goal", "aim", "small model", "large model");
    row(step_goal, "<= 4x", cell(small_step.ratio, small_step.ratio <= 4.0, 1),
        cell(large.step.ratio, large.step.ratio <= 4.0, 1));
    const double small_busy = small_step.busy_ratio / small_step.ratio,
                 large_busy = large.step.busy_ratio / large.step.ratio;
    row("that ratio, cores busy / idle", "0.7-1.3x", cell(small_busy, std::fabs(small_busy - 1) <= 0.3, 2),
        cell(large_busy, std::fabs(large_busy - 1) <= 0.3, 2));
    const double small_speedup = tokens_ratio(small, at, Policy::continuous, Policy::one_at_a_time),
                 large_speedup = tokens_ratio(large.results, large.clients, Policy::continuous, Policy::one_at_a_time);
    row(tokens_goal, ">= 3x", cell(small_speedup, small_speedup >= 3.0, 1), cell(large_speedup, large_speedup >= 3.0, 1));
    const double small_static = tokens_ratio(small, at, Policy::continuous, Policy::static_batches),
                 large_static = tokens_ratio(large.results, large.clients, Policy::continuous, Policy::static_batches);
    row("tokens/s, continuous / static", ">= 1.3x", cell(small_static, small_static >= 1.3, 2),
        cell(large_static, large_static >= 1.3, 2));
    row("TTFT p50, prefix caching off / on", ">= 2x", cell(prefix_speedup, prefix_speedup >= 2.0, 1),
        "not measured");
    out("\n%d of %d met\n", met, rows);
    out.save(opts);
    print_claim("goals_met", std::to_string(met));
    print_claim("goals_rows", std::to_string(rows));
    print_claim("goal_busy_small", small_busy, 2);
    print_claim("goal_busy_large", large_busy, 2);
}

void lesson(const LessonOptions& opts) {
    walk_the_pool(opts);

    // The model: the sizes of lesson 11's CPU recipe (4 layers, 4 heads, C 128, 65
    // characters) with a context of 256 for requests of a realistic length. Its weights are
    // random: the time of a step does not depend on them.
    GPTConfig cfg;
    cfg.vocab_size = 65;
    cfg.block_size = opts.quick ? 64 : 256;
    cfg.n_layer = opts.quick ? 1 : 4;
    cfg.n_head = 4;
    cfg.n_embd = opts.quick ? 32 : 128;
    GPT model(cfg, 1337);
    model.train(false);
    std::printf("\nthe model: %d layers, %d heads, C %d, V %d, context %d, %zu parameters (random weights)\n",
                cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.vocab_size, cfg.block_size, model.parameters().size());
    print_claim("model_context", std::to_string(cfg.block_size));
    print_claim("weights_mb", static_cast<double>(model.parameters().size() * sizeof(float)) / 1e6, 1);

    const int requests = opts.quick ? 8 : 48;
    const std::vector<Load> load = make_load(requests, cfg.vocab_size, cfg.block_size, 20);
    measure_memory(model, load, opts.quick ? 4 : 16, opts);
    measure_sharing(model, opts.quick ? 20 : 200, 16, opts.quick ? 8 : 40, opts);
    const double prefix_speedup = measure_prefix_caching(model, opts.quick ? 2 : 8, opts);

    print_heading("What a batched step costs");
    const StepSummary small_step = measure_step_cost(model, opts, "step_cost", "", 40);

    print_heading("Throughput and latency: one at a time, static batches, continuous batching");
    Section out("throughput");
    out("%d requests (prompts of 16-64 tokens, 32-128 new ones), each client sending its next\n"
        "request when its last is answered. tokens/s: generated tokens over the wall time (the\n"
        "better of two runs); TTFT: a request's first token after it was sent; TPOT: between two\n"
        "tokens of one request; batch: decode rows per step.\n\n",
        requests);
    const std::vector<int> client_counts = opts.quick ? std::vector<int>{1, 4} : std::vector<int>{1, 2, 4, 8, 16, 32};
    const Results results = throughput_table(model, load, client_counts, opts.quick ? 1 : 2, opts.quick ? 1 : 2, out);
    const int at = opts.quick ? 4 : 16;
    const double speedup = tokens_ratio(results, at, Policy::continuous, Policy::one_at_a_time);
    const double over_static = tokens_ratio(results, at, Policy::continuous, Policy::static_batches);
    out("at %d clients continuous batching serves %.1fx the tokens/s of one request at a time, "
        "%.2fx those of static batches\n", at, speedup, over_static);
    out.save(opts);
    print_claim("clients_compared", std::to_string(at));
    print_claim("continuous_speedup", speedup, 1);
    print_claim("continuous_over_static", over_static, 2);
    print_claim("one_at_a_time_tps", results.at({at, Policy::one_at_a_time}).tokens_per_second, 0);
    print_claim("continuous_tps", results.at({at, Policy::continuous}).tokens_per_second, 0);
    print_claim("continuous_ttft_p99", results.at({at, Policy::continuous}).ttft_p99, 0);
    print_claim("one_at_a_time_ttft_p99", results.at({at, Policy::one_at_a_time}).ttft_p99, 0);
    print_claim("static_ttft_p99", results.at({at, Policy::static_batches}).ttft_p99, 0);
    print_claim("static_over_continuous_ttft_p99",
                results.at({at, Policy::static_batches}).ttft_p99 / results.at({at, Policy::continuous}).ttft_p99, 2);
    print_claim("continuous_ttft_p50", results.at({at, Policy::continuous}).ttft_p50, 1);
    print_claim("static_ttft_p50", results.at({at, Policy::static_batches}).ttft_p50, 1);

    const LargeModel large = measure_large_model(opts);
    print_goals(opts, small_step, results, at, large, prefix_speedup);

    if (!opts.figures.empty()) {
        std::vector<PlotSeries> tps, lat;
        for (Policy p : {Policy::one_at_a_time, Policy::static_batches, Policy::continuous}) {
            PlotSeries t{name_of(p), {}, {}}, l{name_of(p), {}, {}};
            for (int clients : client_counts) {
                t.x.push_back(clients);
                t.y.push_back(results.at({clients, p}).tokens_per_second);
                l.x.push_back(clients);
                l.y.push_back(results.at({clients, p}).ttft_p99);
            }
            tps.push_back(t);
            lat.push_back(l);
        }
        line_plot_png(opts.figures / "lesson20_throughput.png", tps,
                      "Generated tokens per second against clients", "clients", "tokens/s");
        line_plot_png(opts.figures / "lesson20_ttft_p99.png", lat,
                      "Time to first token, 99th percentile", "clients", "milliseconds");
    }
    show_sampling(opts);
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 20: serving many users at once", lesson);
}
