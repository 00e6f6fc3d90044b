#include "attn/kv_cache.hpp"

#include "attn/gpt_layers.hpp"
#include "attn/random.hpp"

#include "gpt_checks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

using namespace attn;
using gpt_checks::largest_step_gap;
using gpt_checks::sharp_model;

namespace {

const std::string kChars = "\n abcdefghij";  // V = 12

GPTConfig small_config(bool bias, int block_size = 16) {
    GPTConfig c;
    c.vocab_size = static_cast<int>(kChars.size());
    c.block_size = block_size;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.bias = bias;
    return c;
}

float max_abs_diff(const std::vector<float>& a, const float* b) {
    float d = 0.0f;
    for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
}

}  // namespace

TEST_CASE("the cache appends rows per layer and head and counts the positions every layer holds") {
    KVCache cache(2, 2, 4, 3);  // L = 2, NH = 2, C = 4 (hs = 2), capacity 3
    CHECK(cache.size() == 0);
    CHECK(cache.head_size() == 2);
    const float k[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
    cache.append(0, k, v);
    CHECK(cache.size(0) == 1);
    CHECK(cache.size() == 0);  // layer 1 has nothing yet
    cache.append(1, v, k);
    CHECK(cache.size() == 1);
    // head 1 of layer 0 holds channels 2, 3 at row 0 of its (capacity, hs) block
    CHECK(cache.keys(0)[0] == 1.0f);
    CHECK(cache.keys(0)[1] == 2.0f);
    CHECK(cache.keys(0)[3 * 2 + 0] == 3.0f);
    CHECK(cache.values(0)[3 * 2 + 1] == 8.0f);
    CHECK(cache.keys(1)[0] == 5.0f);
    cache.clear();
    CHECK(cache.size() == 0);
    CHECK(cache.size(1) == 0);
}

TEST_CASE("one step of attention over the cache matches the last row of full causal attention") {
    const int T = 5, C = 8, NH = 2, capacity = 7;
    Rng rng(3);
    std::vector<float> qkv(static_cast<std::size_t>(T) * 3 * C);
    for (float& x : qkv) x = rng.normal();
    std::vector<float> out(static_cast<std::size_t>(T) * C), att(static_cast<std::size_t>(NH) * T * T);
    attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, 1, T, C, NH);

    KVCache cache(1, NH, C, capacity);
    for (int t = 0; t < T; ++t) cache.append(0, &qkv[t * 3 * C + C], &qkv[t * 3 * C + 2 * C]);
    std::vector<float> step(C), step_att(static_cast<std::size_t>(NH) * T);
    attention_step_forward(step.data(), step_att.data(), &qkv[(T - 1) * 3 * C], cache.keys(0),
                           cache.values(0), T, capacity, C, NH);
    // Dot products of hs = 4 N(0,1) terms summed by sgemm in one order and by a loop in another.
    // Scores q·k/2 differ by ≤ 2γ_4 Σ|qk|/2 = 8u·Σ|qk|/2 ≤ 1.4e-6 (u = 2^-24, Σ|qk| ≲ 6 for 4
    // products of N(0,1) values); a weight p_j moves by ≤ 2p_j(1 − p_j) max|Δs| ≤ max|Δs|/2 ≈ 7e-7,
    // plus exp_approx's 4u and the division's u (≲ 3e-7): ≲ 1e-6 at worst, the weights'
    // tolerance, which rests on the random-sign estimate (√4 u·3 ≈ 3.6e-7 per score, ≈ 4e-7 on
    // a weight), 2.5× below it. The output Σ_j p_j v_j (T = 5, |v| ≤ 3): Σ|Δp_j||v_j| ≤ 2·1.4e-6·3
    // plus 2γ_5·3 = 1.8e-6, ≈ 1e-5 at worst, the outputs' tolerance. A wrong row is off by O(1).
    CHECK(max_abs_diff(step, &out[(T - 1) * C]) < 1e-5f);
    for (int h = 0; h < NH; ++h) {
        std::vector<float> row(step_att.begin() + h * T, step_att.begin() + (h + 1) * T);
        CHECK(max_abs_diff(row, &att[(static_cast<std::size_t>(h) * T + T - 1) * T]) < 1e-6f);
    }
}

// The step's loops run in eight lanes with a scalar tail, and a ring's rows in two runs: head
// sizes below, at and past a multiple of 8, context lengths that fill the lanes and leave a
// tail, rings that wrap at different rows, and grouped key/value heads, each against the
// softmax-weighted sum computed in double precision from the cache's rows in order.
TEST_CASE("the vectorised attention step matches double-precision attention on rings and groups") {
    struct Case { int hs, NH, G, capacity, T, first; };
    for (const Case c : {Case{4, 2, 2, 7, 5, 0}, Case{8, 2, 1, 16, 16, 0}, Case{12, 4, 2, 40, 37, 9},
                         Case{64, 2, 2, 100, 100, 63}, Case{33, 3, 1, 20, 13, 19}}) {
        CAPTURE(c.hs);
        CAPTURE(c.T);
        CAPTURE(c.first);
        const int C = c.NH * c.hs;
        Rng rng(static_cast<std::uint64_t>(17 + c.hs));
        std::vector<float> keys(static_cast<std::size_t>(c.G) * c.capacity * c.hs);
        std::vector<float> values(keys.size()), q(static_cast<std::size_t>(C));
        for (float& x : keys) x = 2.0f * rng.normal();
        for (float& x : values) x = rng.normal();
        for (float& x : q) x = 2.0f * rng.normal();
        std::vector<float> out(static_cast<std::size_t>(C)), att(static_cast<std::size_t>(c.NH) * c.T);
        attention_step_forward(out.data(), att.data(), q.data(), keys.data(), values.data(), c.T,
                               c.capacity, C, c.NH, c.G, c.first);
        double worst_out = 0.0, worst_att = 0.0;
        for (int h = 0; h < c.NH; ++h) {
            const int g = h / (c.NH / c.G);  // query heads h of a group share key/value head g
            std::vector<double> w(static_cast<std::size_t>(c.T));
            double largest = -1e300, sum = 0.0;
            for (int j = 0; j < c.T; ++j) {
                const std::size_t row = (static_cast<std::size_t>(g) * c.capacity +
                                         static_cast<std::size_t>((c.first + j) % c.capacity)) * c.hs;
                double dot = 0.0;
                for (int i = 0; i < c.hs; ++i) dot += double(q[h * c.hs + i]) * keys[row + i];
                w[j] = dot / std::sqrt(double(c.hs));
                largest = std::max(largest, w[j]);
            }
            for (double& x : w) sum += (x = std::exp(x - largest));
            for (int i = 0; i < c.hs; ++i) {
                double y = 0.0;
                for (int j = 0; j < c.T; ++j) {
                    const std::size_t row = (static_cast<std::size_t>(g) * c.capacity +
                                             static_cast<std::size_t>((c.first + j) % c.capacity)) * c.hs;
                    y += w[j] / sum * values[row + i];
                }
                worst_out = std::max(worst_out, std::abs(y - out[h * c.hs + i]));
            }
            for (int j = 0; j < c.T; ++j)
                worst_att = std::max(worst_att, std::abs(w[j] / sum - att[h * c.T + j]));
        }
        // Against float64: one float32 order of an n-term dot is within γ_n Σ|terms| (u = 2^-24).
        // Scores: n = hs ≤ 64, |q_i k_i| ≈ 4·2/π ≈ 2.5 each, Σ|qk|/√hs ≈ 20 at hs = 64, so ≤
        // γ_64·20 ≈ 7.8e-5 worst case; a weight moves by ≤ max|Δs|/2 (2p(1 − p) ≤ 1/2), 3.9e-5,
        // and an output by up to 2 max|Δs|·max|v| more. The random-sign estimate, √64 u·20 ≈
        // 9.8e-6 per score, gives ≈ 5e-6 on a weight and ~1e-5 on an output (plus γ_T max|v|,
        // T ≤ 100: ≲ 1.8e-5 worst, √100 u·3 ≈ 1.8e-6 typical, and exp_approx's 4u): 2e-5 rests on
        // it, 2..4× above. A row read from the wrong run of the ring, a dropped tail lane or
        // the wrong group moves them by O(0.1).
        MESSAGE("worst |out - float64| " << worst_out << ", worst |weight - float64| " << worst_att);
        CHECK(worst_out < 2e-5);
        CHECK(worst_att < 2e-5);
    }
}

// The step's code differs by head size (straight-line code for 16, 32 and 64, a loop with a
// tail lane for the rest) and by where a run of keys ends (four value rows per pass, then
// one at a time): every head size from 1 to 64, each with a context length, ring start,
// heads and groups drawn at random, against the same float64 attention. The tolerances are
// the previous test's, derived there for hs ≤ 64, T ≤ 100 and these distributions.
TEST_CASE("the attention step matches double-precision attention at every head size up to 64") {
    Rng rng(2024);
    for (int hs = 1; hs <= 64; ++hs) {
        const int G = 1 + static_cast<int>(rng.below(2));
        const int NH = G * (1 + static_cast<int>(rng.below(2)));
        const int T = 1 + static_cast<int>(rng.below(100));
        const int capacity = T + static_cast<int>(rng.below(static_cast<std::uint64_t>(101 - T)));
        const int first = static_cast<int>(rng.below(static_cast<std::uint64_t>(capacity)));
        CAPTURE(hs);
        CAPTURE(NH);
        CAPTURE(G);
        CAPTURE(T);
        CAPTURE(first);
        const int C = NH * hs;
        std::vector<float> keys(static_cast<std::size_t>(G) * capacity * hs);
        std::vector<float> values(keys.size()), q(static_cast<std::size_t>(C));
        for (float& x : keys) x = 2.0f * rng.normal();
        for (float& x : values) x = rng.normal();
        for (float& x : q) x = 2.0f * rng.normal();
        std::vector<float> out(static_cast<std::size_t>(C)), att(static_cast<std::size_t>(NH) * T);
        attention_step_forward(out.data(), att.data(), q.data(), keys.data(), values.data(), T,
                               capacity, C, NH, G, first);
        double worst_out = 0.0, worst_att = 0.0;
        for (int h = 0; h < NH; ++h) {
            const int g = h / (NH / G);
            const auto row = [&](int j) {
                return (static_cast<std::size_t>(g) * capacity + static_cast<std::size_t>((first + j) % capacity)) * hs;
            };
            std::vector<double> w(static_cast<std::size_t>(T));
            double largest = -1e300, sum = 0.0;
            for (int j = 0; j < T; ++j) {
                double dot = 0.0;
                for (int i = 0; i < hs; ++i) dot += double(q[h * hs + i]) * keys[row(j) + i];
                w[j] = dot / std::sqrt(double(hs));
                largest = std::max(largest, w[j]);
            }
            for (double& x : w) sum += (x = std::exp(x - largest));
            for (int i = 0; i < hs; ++i) {
                double y = 0.0;
                for (int j = 0; j < T; ++j) y += w[j] / sum * values[row(j) + i];
                worst_out = std::max(worst_out, std::abs(y - out[h * hs + i]));
            }
            for (int j = 0; j < T; ++j) worst_att = std::max(worst_att, std::abs(w[j] / sum - att[h * T + j]));
        }
        CHECK(worst_out < 2e-5);
        CHECK(worst_att < 2e-5);
    }
}

TEST_CASE("cached logits equal the uncached forward pass's logits at every position") {
    for (bool bias : {true, false}) {
        CAPTURE(bias);
        const GPTConfig cfg = small_config(bias);
        GPT model = sharp_model(cfg, 11);
        KVCache cache(cfg);
        DecodeScratch scratch;
        const float worst = largest_step_gap(model, 5, [&](int token, int pos) -> const std::vector<float>& {
            return forward_cached(scratch, model, cache, token, pos);
        });
        CHECK(cache.size() == cfg.block_size);
        // Same operations per element, summed in other orders (the attention row by loops,
        // the projections by sgemm with one row, against sgemm over T rows). With N(0, 0.3)
        // weights the logits are O(10); each of 6L + 1 = 13 products (n ≤ 4C = 64) differs by
        // ≤ 2γ_64 ≈ 7.6e-6 of Σ|terms| (u = 2^-24), ~10 carried to a logit: 13·7.6e-5 ≈ 1e-3
        // worst case, 10× the tolerance; with random signs √13·√64 u·10 ≈ 1.7e-5, and 1e-4
        // rests on that, 6× above. A wrong cache row moves the logits by O(1).
        MESSAGE("largest |cached - uncached| logit: " << worst);
        CHECK(worst < 1e-4f);
    }
}

TEST_CASE("prefill copies the forward pass's keys and values and returns its last logits exactly") {
    const GPTConfig cfg = small_config(true);
    GPT model = sharp_model(cfg, 12);
    const std::vector<int> tokens = {1, 4, 2, 9, 0, 3};
    KVCache cache(cfg);
    std::vector<float> logits;
    prefill(logits, model, cache, tokens.data(), 6);
    CHECK(cache.size() == 6);
    model.forward(tokens.data(), nullptr, 1, 6);
    // Exact: prefill runs this same forward pass on the same 6 tokens, same sums in same order.
    CHECK(max_abs_diff(logits, &model.logits()[5 * cfg.vocab_size]) == 0.0f);
    // then a cached step continues from it
    DecodeScratch scratch;
    const std::vector<float> next = forward_cached(scratch, model, cache, 7, 6);
    const std::vector<int> longer = {1, 4, 2, 9, 0, 3, 7};
    model.forward(longer.data(), nullptr, 1, 7);
    CHECK(max_abs_diff(next, &model.logits()[6 * cfg.vocab_size]) < 1e-4f);  // as above
}

// RoPE and ALiBi with the cache: a RoPE key is cached rotated by its absolute position and
// each new query rotated by its own; ALiBi adds m·(distance) to the step's scores. Both on
// every combination of grouped keys (G = 1, 2) and a window (0, 5), each position's cached
// logits against the whole forward pass's row (tolerance as above), then the text.
TEST_CASE("RoPE and ALiBi models: the cached step gives the uncached logits and text, with groups and windows") {
    const CharVocab vocab = CharVocab::from_chars(kChars);
    for (const Position position : {Position::rope, Position::alibi}) {
        for (const int groups : {2, 1}) {
            for (const int window : {0, 5}) {
                const std::string scheme = position_name(position);
                CAPTURE(scheme);
                CAPTURE(groups);
                CAPTURE(window);
                GPTConfig cfg = small_config(true);
                cfg.position = position;
                cfg.n_kv_head = groups;
                cfg.window = window;
                GPT model = sharp_model(cfg, 41);
                KVCache cache(cfg);
                DecodeScratch scratch;
                const float worst = largest_step_gap(model, 6, [&](int token, int pos) -> const std::vector<float>& {
                    return forward_cached(scratch, model, cache, token, pos);
                });
                MESSAGE(scheme << " G=" << groups << " W=" << window << ": largest |cached - uncached| logit " << worst);
                CHECK(worst < 1e-4f);

                SampleOptions o;
                o.max_new_tokens = 40;  // past the block of 16: the re-fill too
                o.top_k = 4;
                o.seed = 3;
                CHECK(generate_cached(model, vocab, "abc", o) == generate_text(model, vocab, "abc", o));
            }
        }
    }
}

// The texts are compared character for character. The two paths' logits differ by about
// 1e-5 (above), so a draw could differ only if a uniform number fell within about 1e-6 of a
// boundary of the cumulative probabilities, or a greedy choice had two logits that close:
// a chance near 1e-6 per token. The draws are seeded, so once equal, always equal.
TEST_CASE("the cached path generates exactly the uncached text, greedy and sampled") {
    const CharVocab vocab = CharVocab::from_chars(kChars);
    for (bool bias : {true, false}) {
        CAPTURE(bias);
        GPT model = sharp_model(small_config(bias, 64), 21);
        SampleOptions greedy;
        greedy.max_new_tokens = 60;
        greedy.top_k = 1;
        SampleOptions sampled;
        sampled.max_new_tokens = 60;
        sampled.top_k = 5;
        sampled.temperature = 0.9f;
        sampled.seed = 7;
        for (const SampleOptions& o : {greedy, sampled}) {
            for (const std::string prompt : {"", "a bad cab"}) {
                CAPTURE(o.top_k);
                CAPTURE(prompt);
                const std::string uncached = generate_text(model, vocab, prompt, o);
                const std::string cached = generate_cached(model, vocab, prompt, o);
                CHECK(cached == uncached);
                CHECK(cached.size() == prompt.size() + 60);
            }
        }
    }
}

TEST_CASE("past block_size the cache is re-filled from the cropped context and the text stays identical") {
    const CharVocab vocab = CharVocab::from_chars(kChars);
    GPT model = sharp_model(small_config(true, 8), 31);  // block 8: 40 tokens overflow it often
    SampleOptions o;
    o.max_new_tokens = 40;
    o.top_k = 4;
    o.seed = 99;
    SUBCASE("from a short prompt") {
        CHECK(generate_cached(model, vocab, "ab", o) == generate_text(model, vocab, "ab", o));
    }
    SUBCASE("from a prompt longer than the block") {
        const std::string prompt = "abc def ghij abc";
        CHECK(generate_cached(model, vocab, prompt, o) == generate_text(model, vocab, prompt, o));
    }
    SUBCASE("greedy") {
        o.top_k = 1;
        CHECK(generate_cached(model, vocab, "j", o) == generate_text(model, vocab, "j", o));
    }
}

// Lesson 14 times the uncached path with lesson 13's tiled attention as well: the model's
// forward pass, and so the prefill that fills the cache, may use either attention.
TEST_CASE("with the fused attention the cached and uncached paths write the materialised text") {
    const CharVocab vocab = CharVocab::from_chars(kChars);
    GPT model = sharp_model(small_config(true, 8), 31);  // block 8: prefills past the block too
    SampleOptions o;
    o.max_new_tokens = 40;
    o.top_k = 4;
    o.seed = 5;
    const std::string reference = generate_text(model, vocab, "abc def ghij abc", o);
    model.set_attention(AttentionKind::fused);
    CHECK(generate_text(model, vocab, "abc def ghij abc", o) == reference);
    CHECK(generate_cached(model, vocab, "abc def ghij abc", o) == reference);
}

TEST_CASE("the operation counts follow the formulas for a small model") {
    GPTConfig c = small_config(false);  // L 2, C 16, V 12
    CHECK(uncached_step_flops(c, 3) == doctest::Approx(2.0 * 2 * (12.0 * 3 * 256 + 2.0 * 9 * 16) + 2.0 * 3 * 16 * 12));
    CHECK(cached_step_flops(c, 3) == doctest::Approx(2.0 * 2 * (12.0 * 256 + 2.0 * 3 * 16) + 2.0 * 16 * 12));
    CHECK(uncached_step_flops(c, 1) == doctest::Approx(cached_step_flops(c, 1)));  // one token: the same work
}

TEST_CASE("bad input to the cache and the cached forward pass throws std::invalid_argument") {
    const GPTConfig cfg = small_config(true, 4);
    GPT model(cfg, 1);
    KVCache cache(cfg);
    DecodeScratch scratch;
    SUBCASE("a token outside the vocabulary") {
        CHECK_THROWS_AS(forward_cached(scratch, model, cache, cfg.vocab_size, 0), std::invalid_argument);
        CHECK_THROWS_AS(forward_cached(scratch, model, cache, -1, 0), std::invalid_argument);
    }
    SUBCASE("a position that is not the next free one") {
        CHECK_THROWS_AS(forward_cached(scratch, model, cache, 1, 1), std::invalid_argument);
    }
    SUBCASE("a position beyond the capacity") {
        for (int pos = 0; pos < 4; ++pos) forward_cached(scratch, model, cache, 1, pos);
        CHECK_THROWS_AS(forward_cached(scratch, model, cache, 1, 4), std::invalid_argument);
        const float k[16] = {}, v[16] = {};
        CHECK_THROWS_AS(cache.append(0, k, v), std::invalid_argument);
    }
    SUBCASE("a cache of other sizes") {
        KVCache other(cfg.n_layer + 1, cfg.n_head, cfg.n_embd, cfg.block_size);
        CHECK_THROWS_AS(forward_cached(scratch, model, other, 1, 0), std::invalid_argument);
    }
    SUBCASE("a layer outside the cache and impossible cache sizes") {
        CHECK_THROWS_AS(cache.keys(cfg.n_layer), std::invalid_argument);
        CHECK_THROWS_AS(KVCache(2, 3, 16, 4), std::invalid_argument);  // 3 does not divide 16
        CHECK_THROWS_AS(KVCache(2, 2, 16, 0), std::invalid_argument);
    }
    SUBCASE("prefill of an empty or too long context") {
        std::vector<float> logits;
        const int five[5] = {1, 2, 3, 4, 5};
        CHECK_THROWS_AS(prefill(logits, model, cache, five, 0), std::invalid_argument);
        CHECK_THROWS_AS(prefill(logits, model, cache, five, 5), std::invalid_argument);
    }
    SUBCASE("a prompt character outside the vocabulary, bad options, a model that is not causal") {
        const CharVocab vocab = CharVocab::from_chars(kChars);
        SampleOptions o;
        o.max_new_tokens = 3;
        CHECK_THROWS_AS(generate_cached(model, vocab, "abz", o), std::invalid_argument);
        o.top_k = cfg.vocab_size + 1;
        CHECK_THROWS_AS(generate_cached(model, vocab, "ab", o), std::invalid_argument);
        GPTConfig open = cfg;
        open.causal = false;
        GPT unmasked(open, 1);
        CHECK_THROWS_AS(generate_cached(unmasked, vocab, "ab", SampleOptions{}), std::invalid_argument);
        KVCache c2(open);
        CHECK_THROWS_AS(forward_cached(scratch, unmasked, c2, 1, 0), std::invalid_argument);
    }
}
