// The sampling settings an OpenAI-style server offers: nucleus sampling (top_p) against a
// brute force over every subset of small vocabularies, the presence and frequency penalties
// against their formula, and the reported log-probabilities against a float64 log-softmax;
// then the scheduler, which must apply them per request exactly as a plain loop does.
#include "attn/scheduler.hpp"

#include "attn/data.hpp"

#include "gpt_checks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <vector>

using namespace attn;
using gpt_checks::sharp_model;

namespace {

// The smallest model the refusal tests run: one layer, 12 tokens, a context of 16.
GPTConfig small_config() {
    GPTConfig cfg;
    cfg.vocab_size = 12;
    cfg.block_size = 16;
    cfg.n_layer = 1;
    cfg.n_head = 2;
    cfg.n_embd = 8;
    return cfg;
}

// Logits over every magnitude a trained model gives: a scale drawn from 0.01 to 30.
std::vector<float> random_logits(Rng& rng, int V) {
    const float scale = std::pow(10.0f, rng.uniform(-2.0f, 1.5f));
    std::vector<float> logits(static_cast<std::size_t>(V));
    for (float& x : logits) x = scale * rng.normal();
    return logits;
}

// softmax(logits / temperature) over the top_k largest, in long double, written out
// directly: the reference the sampler's float64 weights are held against.
std::vector<long double> reference_probabilities(const std::vector<float>& logits, float temperature,
                                                 int top_k) {
    std::vector<long double> z(logits.begin(), logits.end());
    for (long double& x : z) x /= temperature;
    std::vector<long double> sorted = z;
    std::sort(sorted.rbegin(), sorted.rend());
    const long double kth = top_k > 0 ? sorted[static_cast<std::size_t>(top_k - 1)]
                                      : -std::numeric_limits<long double>::infinity();
    long double total = 0;
    std::vector<long double> p(z.size(), 0.0L);
    for (std::size_t i = 0; i < z.size(); ++i) {
        if (z[i] >= kth) p[i] = std::exp(z[i] - sorted[0]);
        total += p[i];
    }
    for (long double& x : p) x /= total;
    return p;
}

std::vector<int> kept(const std::vector<double>& weights) {
    std::vector<int> ids;
    for (std::size_t i = 0; i < weights.size(); ++i)
        if (weights[i] > 0.0) ids.push_back(static_cast<int>(i));
    return ids;
}

}  // namespace

TEST_CASE("top_p keeps the smallest set of most likely tokens whose probability reaches p") {
    // The brute force looks at every subset of the vocabulary (V ≤ 10: 1024 subsets), with no
    // notion of order: the smallest size any subset reaching p has. The sampler's nucleus
    // must have that size, reach p, and hold no token less likely than one it dropped.
    Rng rng(2020);
    int checked = 0;
    for (int trial = 0; trial < 3000; ++trial) {
        const int V = 2 + static_cast<int>(rng.below(9));
        const std::vector<float> logits = random_logits(rng, V);
        const float temperature = std::pow(10.0f, rng.uniform(-0.5f, 0.5f));
        const int top_k = static_cast<int>(rng.below(static_cast<std::uint64_t>(V + 1)));
        const float top_p = rng.uniform(0.001f, 1.0f);
        const std::vector<long double> p = reference_probabilities(logits, temperature, top_k);
        // A subset whose mass lies within 1e-9 of p is a tie the two summations (float64
        // against long double, ≤ 10 terms: a relative error near 1e-15) may break either
        // way; such draws are skipped, and they are rare.
        int smallest = V + 1;
        bool ambiguous = false;
        for (unsigned mask = 1; mask < (1u << V); ++mask) {
            long double mass = 0;
            int size = 0;
            for (int i = 0; i < V; ++i)
                if (mask & (1u << i)) mass += p[static_cast<std::size_t>(i)], ++size;
            if (std::fabs(static_cast<double>(mass - top_p)) < 1e-9) ambiguous = true;
            if (mass >= top_p) smallest = std::min(smallest, size);
        }
        if (ambiguous) continue;
        ++checked;
        CAPTURE(trial);
        CAPTURE(V);
        CAPTURE(top_k);
        CAPTURE(top_p);
        const std::vector<double> w = sampling_weights(logits, temperature, top_k, top_p);
        const std::vector<int> nucleus = kept(w);
        CHECK(static_cast<int>(nucleus.size()) == smallest);
        long double mass = 0;
        for (int i : nucleus) mass += p[static_cast<std::size_t>(i)];
        CHECK(mass >= top_p);
        for (int i = 0; i < V; ++i) {
            const bool in = w[static_cast<std::size_t>(i)] > 0.0;
            if (p[static_cast<std::size_t>(i)] == 0.0L) CHECK_FALSE(in);  // top_k dropped it
            for (int j : nucleus)
                if (!in) CHECK(p[static_cast<std::size_t>(j)] >= p[static_cast<std::size_t>(i)]);
        }
        // The kept weights stay in the model's proportions: each weight is one exp in
        // float64 (relative error a few 2^-53); 1e-12 leaves a thousandfold margin.
        double total = 0.0;
        for (int i : nucleus) total += w[static_cast<std::size_t>(i)];
        for (int i : nucleus)
            CHECK(std::fabs(w[static_cast<std::size_t>(i)] / total -
                            static_cast<double>(p[static_cast<std::size_t>(i)] / mass)) < 1e-12);
    }
    MESSAGE(checked << " of 3000 generated distributions checked (the rest were ties within 1e-9)");
    CHECK(checked > 2900);
}

TEST_CASE("top_p 1 draws what the sampler drew without it, and a tiny top_p is greedy") {
    Rng gen(7);
    for (int trial = 0; trial < 300; ++trial) {
        const int V = 2 + static_cast<int>(gen.below(80));
        const std::vector<float> logits = random_logits(gen, V);
        SampleOptions o;
        o.temperature = std::pow(10.0f, gen.uniform(-0.5f, 0.5f));
        o.top_k = static_cast<int>(gen.below(static_cast<std::uint64_t>(V + 1)));
        CAPTURE(trial);
        Rng a(static_cast<std::uint64_t>(trial)), b(static_cast<std::uint64_t>(trial));
        for (int draw = 0; draw < 20; ++draw)
            CHECK(sample_token(logits, o, {}, a) == sample_token(logits, o.temperature, o.top_k, b));
        const int argmax = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        o.top_p = 1e-7f;  // below every other token's share unless two logits tie exactly
        for (int draw = 0; draw < 20; ++draw) CHECK(sample_token(logits, o, {}, a) == argmax);
    }
}

TEST_CASE("draws follow the renormalised nucleus") {
    // p = (0.5, 0.3, 0.2): top_p 0.7 keeps ids 0 and 1, drawn 5 : 3, so id 1 has 0.375.
    // Binomial standard error √(0.375 · 0.625 / 20000) ≈ 0.0034; 0.017 is five of them.
    const std::vector<float> logits{std::log(5.0f), std::log(3.0f), std::log(2.0f)};
    SampleOptions o;
    o.top_p = 0.7f;
    Rng rng(3);
    const int n = 20000;
    int ones = 0;
    for (int i = 0; i < n; ++i) {
        const int t = sample_token(logits, o, {}, rng);
        REQUIRE(t != 2);
        ones += t;
    }
    CHECK(std::fabs(ones / double(n) - 0.375) < 0.017);
}

TEST_CASE("the penalties subtract frequency × count + presence × (count > 0) from the logits") {
    // By hand: counts (2, 0, 1); presence 0.5, frequency 0.25 → 1 − 0.5 − 0.5, 1, 1 − 0.25 − 0.5.
    std::vector<float> logits{1.0f, 1.0f, 1.0f};
    apply_penalties(logits, {0, 2, 0}, 0.5f, 0.25f);
    CHECK(logits == std::vector<float>{0.0f, 1.0f, 0.25f});
    // The formula over generated logits, histories and penalties (in [−2, 2] as OpenAI allows).
    Rng rng(11);
    for (int trial = 0; trial < 500; ++trial) {
        const int V = 1 + static_cast<int>(rng.below(70));
        const std::vector<float> before = random_logits(rng, V);
        std::vector<int> generated(rng.below(60));
        for (int& t : generated) t = static_cast<int>(rng.below(static_cast<std::uint64_t>(V)));
        const float presence = rng.uniform(-2.0f, 2.0f), frequency = rng.uniform(-2.0f, 2.0f);
        std::vector<float> after = before;
        apply_penalties(after, generated, presence, frequency);
        for (int j = 0; j < V; ++j) {
            const long count = std::count(generated.begin(), generated.end(), j);
            // one rounding to float of the exact difference (the penalty is exact in double:
            // a float times a count below 2^7, plus a float)
            const double want = static_cast<double>(before[static_cast<std::size_t>(j)]) -
                                (static_cast<double>(frequency) * static_cast<double>(count) +
                                 (count > 0 ? static_cast<double>(presence) : 0.0));
            CAPTURE(j);
            CHECK(after[static_cast<std::size_t>(j)] == static_cast<float>(want));
        }
    }
    // A large presence penalty forbids repeats: with three equal logits, three draws give
    // three different tokens whatever the seed.
    for (std::uint64_t seed = 0; seed < 50; ++seed) {
        SampleOptions o;
        o.presence_penalty = 50.0f;
        Rng r(seed);
        std::vector<int> generated;
        for (int i = 0; i < 3; ++i) generated.push_back(sample_token({0.0f, 0.0f, 0.0f}, o, generated, r));
        std::sort(generated.begin(), generated.end());
        CHECK(generated == std::vector<int>{0, 1, 2});
    }
}

TEST_CASE("the log-probabilities are a float64 log-softmax of the logits, the alternatives sorted") {
    Rng rng(13);
    for (int trial = 0; trial < 500; ++trial) {
        const int V = 1 + static_cast<int>(rng.below(90));
        std::vector<float> logits = random_logits(rng, V);
        if (trial % 10 == 0) logits[rng.below(static_cast<std::uint64_t>(V))] = logits[0];  // a tie
        const std::vector<double> lp = log_softmax(logits);
        // The reference: log(exp(x_i) / Σ exp(x_j)) in long double with no shift (|x| < 300
        // here, so nothing overflows). The float64 result carries a few roundings of numbers
        // no larger than max|x| + log V: 16 · 2^-53 · (max|x| + log V + 1) bounds them.
        long double total = 0;
        float biggest = 0.0f;
        for (float x : logits) total += std::exp(static_cast<long double>(x)), biggest = std::max(biggest, std::fabs(x));
        const double bound = 16.0 * 0x1.0p-53 * (biggest + std::log(V) + 1.0);
        for (int i = 0; i < V; ++i) {
            const long double want = std::log(std::exp(static_cast<long double>(logits[static_cast<std::size_t>(i)])) / total);
            CHECK(std::fabs(lp[static_cast<std::size_t>(i)] - static_cast<double>(want)) <= bound);
        }
        const int token = static_cast<int>(rng.below(static_cast<std::uint64_t>(V)));
        const int top = static_cast<int>(rng.below(static_cast<std::uint64_t>(std::min(V, 20) + 1)));
        const TokenLogprobs t = token_logprobs(lp, token, top);
        CAPTURE(trial);
        CHECK(t.logprob == lp[static_cast<std::size_t>(token)]);
        REQUIRE(static_cast<int>(t.top.size()) == top);
        int better_than_token = 0;  // tokens strictly more likely than the sampled one
        for (double x : lp) better_than_token += x > t.logprob;
        bool has_token = false;
        for (std::size_t k = 0; k < t.top.size(); ++k) {
            const auto [id, value] = t.top[k];
            CHECK(value == lp[static_cast<std::size_t>(id)]);
            has_token = has_token || id == token;
            if (k > 0) {
                const auto [prev_id, prev] = t.top[k - 1];
                CHECK((prev > value || (prev == value && prev_id < id)));
            }
            // nothing left out is more likely than what is in
            for (int j = 0; j < V; ++j) {
                bool listed = false;
                for (const auto& alt : t.top) listed = listed || alt.first == j;
                if (!listed) CHECK(lp[static_cast<std::size_t>(j)] <= value);
            }
        }
        if (better_than_token < top) CHECK(has_token);
    }
}

// The scheduler against a plain loop over the whole forward pass, the same options, and
// the same generator: the penalties count the generated tokens only, not the prompt's, and
// each request keeps its own settings inside a shared batch. The logits differ by ~1e-6
// between the batched and the one-row passes (the tolerance of serving/test_paged_cache.cpp),
// so a draw differs only when a uniform number falls that close to a boundary; the
// log-probabilities, whose log-softmax moves at most twice as far as the logits, are held
// to test_paged_cache.cpp's 1e-4 on the logits, doubled.
TEST_CASE("the scheduler applies top_p, penalties and logprobs per request as a plain loop does") {
    const std::string chars = "\n abcdefghij";
    const CharVocab vocab = CharVocab::from_chars(chars);
    GPTConfig cfg;
    cfg.vocab_size = static_cast<int>(chars.size());
    cfg.block_size = 48;
    cfg.n_layer = 2;
    cfg.n_head = 2;
    cfg.n_embd = 16;
    GPT model = sharp_model(cfg, 81);
    model.train(false);
    PagedKVCache cache(cfg, 64, 4);
    SchedulerOptions so;
    so.max_running = 6;
    so.step_tokens = 12;
    Scheduler scheduler(model, cache, so);
    const std::vector<std::string> prompts = {"aaaa aaaa", "abc", "j j j j", "hij", "a", "bbb ccc"};
    struct Want {
        std::vector<int> tokens;
        std::vector<std::vector<double>> log_probs;  // per token, the loop's log-softmax
        int top_logprobs;
    };
    std::map<int, Want> want;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
        SampleOptions o;
        o.max_new_tokens = 20;
        o.seed = 500 + i;
        o.temperature = i % 2 == 0 ? 0.7f : 1.3f;  // the log-probabilities stay the model's
        o.top_p = i % 3 == 0 ? 1.0f : 0.6f;
        o.presence_penalty = i % 2 == 0 ? 1.5f : 0.0f;
        o.frequency_penalty = i % 4 == 1 ? 0.7f : -0.3f;
        o.top_logprobs = static_cast<int>(i) - 1;  // −1 (none) … 4
        const std::vector<int> prompt = vocab.encode(prompts[i]);
        const int id = scheduler.submit({prompt, o});
        Want w{{}, {}, o.top_logprobs};
        std::vector<int> tokens = prompt;
        Rng rng(o.seed);
        std::vector<float> row(static_cast<std::size_t>(cfg.vocab_size));
        for (int n = 0; n < o.max_new_tokens; ++n) {
            const int T = static_cast<int>(tokens.size());
            model.forward(tokens.data(), nullptr, 1, T);
            const float* l = model.logits().data() + static_cast<std::size_t>(T - 1) * cfg.vocab_size;
            row.assign(l, l + cfg.vocab_size);
            const int token = sample_token(row, o, w.tokens, rng);
            w.log_probs.push_back(log_softmax(row));
            w.tokens.push_back(token);
            tokens.push_back(token);
        }
        want[id] = w;
    }
    std::map<int, std::vector<int>> got;
    for (int step = 0; step < 1000 && !scheduler.idle(); ++step) {
        for (const StepEvent& e : scheduler.step()) {
            const Want& w = want.at(e.request);
            const std::size_t n = got[e.request].size();
            got[e.request].push_back(e.token);
            CAPTURE(e.request);
            CAPTURE(n);
            REQUIRE(e.logprobs.has_value() == (w.top_logprobs >= 0));
            if (!e.logprobs) continue;
            CHECK(std::fabs(e.logprobs->logprob - w.log_probs[n][static_cast<std::size_t>(e.token)]) < 2e-4);
            REQUIRE(static_cast<int>(e.logprobs->top.size()) == w.top_logprobs);
            for (const auto& [alt, value] : e.logprobs->top)
                CHECK(std::fabs(value - w.log_probs[n][static_cast<std::size_t>(alt)]) < 2e-4);
        }
    }
    for (const auto& [id, w] : want) {
        CAPTURE(id);
        CHECK(got[id] == w.tokens);
    }
}

TEST_CASE("the scheduler refuses a top_p, a penalty or a top_logprobs out of range, naming it") {
    const GPTConfig cfg = small_config();
    GPT model(cfg, 1);
    PagedKVCache cache(cfg, 8, 4);
    Scheduler scheduler(model, cache);
    struct Bad {
        const char* field;
        void (*set)(SampleOptions&);
    };
    const Bad bad[] = {
        {"top_p", [](SampleOptions& o) { o.top_p = 0.0f; }},
        {"top_p", [](SampleOptions& o) { o.top_p = 1.5f; }},
        {"top_p", [](SampleOptions& o) { o.top_p = std::nanf(""); }},
        {"presence_penalty", [](SampleOptions& o) { o.presence_penalty = INFINITY; }},
        {"frequency_penalty", [](SampleOptions& o) { o.frequency_penalty = std::nanf(""); }},
        {"top_logprobs", [](SampleOptions& o) { o.top_logprobs = -2; }},
        {"top_logprobs", [](SampleOptions& o) { o.top_logprobs = 13; }},
    };
    for (const Bad& b : bad) {
        SampleOptions o;
        o.max_new_tokens = 2;
        b.set(o);
        CAPTURE(b.field);
        try {
            scheduler.submit({{1}, o});
            FAIL("accepted");
        } catch (const std::invalid_argument& e) {
            CHECK(std::string(e.what()).rfind(std::string(b.field) + ":", 0) == 0);
        }
    }
    CHECK(scheduler.idle());
}

TEST_CASE("the generators outside the scheduler refuse the settings only the scheduler applies") {
    const CharVocab vocab = CharVocab::from_chars("\n abcdefghij");
    const GPTConfig cfg = small_config();
    GPT model(cfg, 1);
    for (int which = 0; which < 4; ++which) {
        SampleOptions o;
        o.max_new_tokens = 3;
        if (which == 0) o.top_p = 0.5f;
        if (which == 1) o.presence_penalty = 1.0f;
        if (which == 2) o.frequency_penalty = -1.0f;
        if (which == 3) o.top_logprobs = 0;
        CAPTURE(which);
        CHECK_THROWS_AS(generate_text(model, vocab, "ab", o), std::invalid_argument);
    }
    SampleOptions plain;
    plain.max_new_tokens = 3;
    CHECK(generate_text(model, vocab, "ab", plain).size() == 5);
}

// The forked continuations of submit(request, n) draw with seed + i, each counting its own
// tokens for the penalties: they must give the tokens of n requests submitted alone. The
// logits of the two runs differ by the batch's ~1e-6 (see above), hence 2e-4 on the
// log-probabilities.
TEST_CASE("forked continuations apply top_p, penalties and logprobs as requests alone do") {
    const CharVocab vocab = CharVocab::from_chars("\n abcdefghij");
    GPTConfig cfg;
    cfg.vocab_size = 12;
    cfg.block_size = 48;
    cfg.n_layer = 2;
    cfg.n_head = 2;
    cfg.n_embd = 16;
    GPT model = sharp_model(cfg, 83);
    model.train(false);
    SampleOptions o;
    o.max_new_tokens = 16;
    o.seed = 40;
    o.temperature = 1.2f;
    o.top_p = 0.8f;
    o.presence_penalty = 0.9f;
    o.frequency_penalty = 0.4f;
    o.top_logprobs = 3;
    const std::vector<int> prompt = vocab.encode("abc abc ab");
    auto run = [&](bool forked) {
        PagedKVCache cache(cfg, 64, 4);
        Scheduler scheduler(model, cache);
        std::vector<int> ids;
        if (forked) {
            ids = scheduler.submit({prompt, o}, 3);
        } else {
            for (int i = 0; i < 3; ++i) {
                SampleOptions alone = o;
                alone.seed = o.seed + static_cast<std::uint64_t>(i);
                ids.push_back(scheduler.submit({prompt, alone}));
            }
        }
        std::map<int, std::vector<StepEvent>> events;
        for (int step = 0; step < 1000 && !scheduler.idle(); ++step)
            for (StepEvent& e : scheduler.step()) events[e.request].push_back(std::move(e));
        std::vector<std::vector<StepEvent>> out;
        for (int id : ids) out.push_back(events[id]);
        return out;
    };
    const auto forked = run(true), alone = run(false);
    for (std::size_t i = 0; i < 3; ++i) {
        CAPTURE(i);
        REQUIRE(forked[i].size() == alone[i].size());
        for (std::size_t k = 0; k < forked[i].size(); ++k) {
            CHECK(forked[i][k].token == alone[i][k].token);
            REQUIRE(forked[i][k].logprobs.has_value());
            REQUIRE(alone[i][k].logprobs.has_value());
            CHECK(std::fabs(forked[i][k].logprobs->logprob - alone[i][k].logprobs->logprob) < 2e-4);
            CHECK(forked[i][k].logprobs->top.size() == 3);
        }
    }
    CHECK(forked[0].size() == 16);
}
