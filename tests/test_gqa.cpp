// Fewer keys and values, and a window (lesson 16): grouped-query and multi-query attention
// and sliding-window attention in the GPT, against PyTorch (fixtures from
// tools/reference/make_gqa_fixtures.py), against finite differences, and the KV cache that
// stores G heads and, with a window, is a ring buffer.
#include "attn/fixtures.hpp"
#include "attn/checkpoint.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/kv_cache.hpp"
#include "attn/npy.hpp"
#include "attn/trainer.hpp"

#include "attn/gradcheck.hpp"
#include "gpt_checks.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace attn;
using namespace attn::gpt_checks;

namespace {
namespace fs = std::filesystem;
const fs::path fixtures = attn::fixtures_dir() / "gqa";
const std::string kChars = "\n abcdefghij";  // V = 12

GPTConfig small_config(int n_kv_head, int window, int block_size = 8) {
    GPTConfig config;
    config.vocab_size = static_cast<int>(kChars.size());
    config.block_size = block_size;
    config.n_layer = 2;
    config.n_head = 4;
    config.n_embd = 16;
    config.n_kv_head = n_kv_head;
    config.window = window;
    return config;
}

}  // namespace

TEST_CASE("grouped-query, multi-query and windowed models match PyTorch on logits, loss and "
          "every gradient") {
    for (const std::string name : {"gqa", "mqa_window", "gqa_rope_window"}) {
        CAPTURE(name);
        const fs::path dir = fixtures / name;
        GPT model = load_checkpoint(dir / "weights");
        const Parity r = check_against_torch(model, dir);
        MESSAGE(name << ": |loss - torch| = " << r.loss_diff << ", max |logits - torch| = "
                     << r.logits_diff << ", worst gradient difference " << r.worst_gradient);
    }
}

TEST_CASE("c_attn has C + 2·G·hs rows and the parameter count follows") {
    for (int G : {4, 2, 1}) {
        CAPTURE(G);
        const GPTConfig c = small_config(G, 0);
        const GPT model(c, 1);
        CHECK(c.qkv_channels() == 16 + 2 * G * 4);
        CHECK(model.parameters().size() == c.num_parameters());
        for (const ParameterInfo& p : model.parameter_table()) {
            if (p.name == "transformer.h.0.attn.c_attn.weight")
                CHECK(p.shape == std::vector<std::size_t>{static_cast<std::size_t>(16 + 8 * G), 16});
        }
    }
    // multi-head: nanoGPT's 3C, whether n_kv_head is 0 or n_head
    CHECK(small_config(0, 0).qkv_channels() == 48);
    CHECK(small_config(4, 0).num_parameters() == small_config(0, 0).num_parameters());
}

TEST_CASE("kv_head_of groups consecutive query heads") {
    CHECK(kv_head_of(0, 8, 2) == 0);
    CHECK(kv_head_of(3, 8, 2) == 0);
    CHECK(kv_head_of(4, 8, 2) == 1);
    CHECK(kv_head_of(7, 8, 2) == 1);
    CHECK(kv_head_of(5, 8, 8) == 5);
    CHECK(kv_head_of(5, 8, 1) == 0);
    CHECK(kv_head_of(5, 6, 3) == 2);
}

TEST_CASE("a window of W keeps exactly the keys t − W + 1 … t") {
    // One head of size 1 with q = k = 0: every allowed key has the same score, so row t of the
    // weights is uniform over the min(t + 1, W) keys the window lets it see.
    const int T = 6, C = 1, W = 3;
    std::vector<float> qkv(T * 3 * C, 0.0f), out(T * C), att(T * T);
    for (int t = 0; t < T; ++t) qkv[t * 3 + 2] = static_cast<float>(t);  // v = t
    attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, 1, T, C, 1,
                      true, true, nullptr, 0, W);
    for (int t = 0; t < T; ++t) {
        CAPTURE(t);
        const int seen = std::min(t + 1, W);
        for (int j = 0; j < T; ++j) {
            const bool in = j <= t && j > t - W;
            CHECK(att[t * T + j] == doctest::Approx(in ? 1.0 / seen : 0.0).epsilon(1e-6));
        }
        // the mean of the values t − seen + 1 … t
        CHECK(out[t] == doctest::Approx(t - (seen - 1) / 2.0).epsilon(1e-6));
    }
}

TEST_CASE("grouped, multi-query and windowed models' gradients agree with finite differences") {
    const int B = 2, T = 8;
    std::vector<int> x(B * T), y(B * T);
    for (int i = 0; i < B * T; ++i) {
        x[i] = (7 * i + 3) % 11;
        y[i] = (5 * i + 1) % 11;
    }
    struct Case { int G, W; Position position; };
    for (const Case& k : {Case{2, 0, Position::learned}, Case{1, 3, Position::learned},
                          Case{2, 4, Position::rope}}) {
        CAPTURE(k.G);
        CAPTURE(k.W);
        GPTConfig config = small_config(k.G, k.W);
        config.position = k.position;
        config.dropout = 0.1f;
        const GradCheck r = check_gradient_numerically(config, x, y, B, T);
        MESSAGE("G " << k.G << ", W " << k.W << ": max |analytic - numeric| = "
                     << r.max_abs_error << " (largest gradient " << r.max_abs_grad << ")");
    }
}

TEST_CASE("the KV cache stores G heads, and with a window it is a ring of W positions") {
    const GPTConfig gqa = small_config(2, 0, 16);
    const KVCache full(gqa);
    CHECK(full.n_kv_head() == 2);
    CHECK(full.capacity() == 16);
    CHECK_FALSE(full.ring());
    CHECK(full.bytes_per_position() == 2u * 2 * 2 * 4 * sizeof(float));  // 2·L·G·hs floats
    CHECK(KVCache(small_config(4, 0, 16)).bytes_per_position() == 2 * full.bytes_per_position());
    const KVCache ring(small_config(1, 5, 16));
    CHECK(ring.ring());
    CHECK(ring.capacity() == 5);
    // a window of at least the block needs no ring
    CHECK_FALSE(KVCache(small_config(1, 16, 16)).ring());

    // A ring of 3 rows: position p in row p mod 3; size stops at 3, positions counts on.
    KVCache c(1, 2, 4, 3, 1, true);  // L 1, NH 2, C 4 (hs 2), capacity 3, G 1
    for (int p = 0; p < 5; ++p) {
        const float key[2] = {static_cast<float>(p), 0.0f}, value[2] = {0.0f, static_cast<float>(p)};
        c.append(0, key, value);
    }
    CHECK(c.size() == 3);
    CHECK(c.positions() == 5);
    CHECK(c.keys(0)[0] == 3.0f);  // row 0: position 3
    CHECK(c.keys(0)[2] == 4.0f);  // row 1: position 4
    CHECK(c.keys(0)[4] == 2.0f);  // row 2: position 2
    CHECK_THROWS_AS(KVCache(1, 4, 8, 3, 3), std::invalid_argument);  // 3 does not divide 4
}

TEST_CASE("cached logits of grouped and windowed models equal the uncached ones at every position") {
    for (const GPTConfig& config : {small_config(2, 0, 16), small_config(1, 5, 16)}) {
        CAPTURE(config.kv_heads());
        CAPTURE(config.window);
        GPT model = sharp_model(config, 21);
        const int T = 16;
        std::vector<int> ids(T);
        for (int t = 0; t < T; ++t) ids[t] = (3 * t + 1) % 11;
        model.train(false);
        model.forward(ids.data(), nullptr, 1, T);
        const std::vector<float> uncached = model.logits();
        // The logits' sums, max over (position, token) of Σ_c |lnf_c wte_c|, for the bound.
        double logit_terms = 0.0;
        {
            const std::vector<float>& lnf = model.activations().lnf;
            const float* wte = model.params().wte;
            const int C = config.n_embd;
            for (int t = 0; t < T; ++t) {
                for (int v = 0; v < config.vocab_size; ++v) {
                    double sum = 0.0;
                    for (int c = 0; c < C; ++c)
                        sum += std::fabs(static_cast<double>(lnf[static_cast<std::size_t>(t * C + c)]) *
                                         wte[static_cast<std::size_t>(v * C + c)]);
                    logit_terms = std::max(logit_terms, sum);
                }
            }
        }
        KVCache cache(config);
        DecodeScratch scratch;
        double worst = 0.0;
        for (int t = 0; t < T; ++t) {
            const std::vector<float>& step = forward_cached(scratch, model, cache, ids[t], t);
            for (int v = 0; v < config.vocab_size; ++v)
                worst = std::max(worst, std::fabs(static_cast<double>(step[v]) -
                                                  uncached[static_cast<std::size_t>(t) * config.vocab_size + v]));
        }
        CHECK(cache.size() == std::min(T, cache.capacity()));
        MESSAGE("G " << config.kv_heads() << ", W " << config.window
                     << ": max |cached - uncached| logits " << worst);
        // Sums in another order: two orders of an n-term sum differ by at most
        // 2γ_n Σ|a_i b_i| (Higham, γ_n = n u/(1 − n u), u = 2^-24). The logits' own
        // product (n = C = 16) gives 2γ_16 Σ_c |lnf_c wte_c|, computed from the data; each
        // of the 6L = 12 products before it (c_attn, q·k, P·v, c_proj, c_fc, mlp's c_proj
        // per layer) can move the logits about as much again, to first order (layer norm
        // keeps their relative errors relative): 13 such terms. A wrong row of the ring, a
        // dropped window edge or the wrong group moves logits of size ~10 by O(0.1).
        const double u = std::ldexp(1.0, -24), n = config.n_embd;
        const double bound = (6.0 * config.n_layer + 1.0) * 2.0 * n * u / (1.0 - n * u) * logit_terms;
        CAPTURE(bound);
        CHECK(worst <= bound);
    }
}

TEST_CASE("the ring-buffer cache generates exactly the uncached text, past W and past the block") {
    const CharVocab vocab = CharVocab::from_chars(kChars);
    for (int G : {4, 2, 1}) {
        for (int W : {0, 3, 6}) {
            CAPTURE(G);
            CAPTURE(W);
            GPT model = sharp_model(small_config(G, W, 8), 31);  // block 8, 40 tokens
            SampleOptions o;
            o.max_new_tokens = 40;
            o.top_k = 4;
            o.seed = 99;
            for (const std::string prompt : {"ab", "abc def ghij abc"}) {
                CAPTURE(prompt);
                CHECK(generate_cached(model, vocab, prompt, o) ==
                      generate_text(model, vocab, prompt, o));
            }
            o.top_k = 1;
            CHECK(generate_cached(model, vocab, "j", o) == generate_text(model, vocab, "j", o));
        }
    }
}

TEST_CASE("checkpoints record n_kv_head and window only when they differ from nanoGPT's, and "
          "old ones load as multi-head over the whole context") {
    const fs::path dir = attn_test::scratch("attn_test_gqa");
    fs::remove_all(dir);
    struct Case { int G, W; bool keys; };
    for (const Case& k : {Case{0, 0, false}, Case{4, 0, false}, Case{2, 0, true},
                          Case{1, 3, true}}) {
        CAPTURE(k.G);
        CAPTURE(k.W);
        const GPT model(small_config(k.G, k.W), 5);
        save_checkpoint(dir, model, {});
        std::ifstream in(dir / "config.json");
        const std::string json((std::istreambuf_iterator<char>(in)), {});
        CHECK((json.find("\"n_kv_head\"") != std::string::npos) == (k.G != 0 && k.G != 4));
        CHECK((json.find("\"window\"") != std::string::npos) == (k.W != 0));
        const GPT back = load_checkpoint(dir);
        CHECK(back.config().kv_heads() == model.config().kv_heads());
        CHECK(back.config().window == k.W);
        CHECK(back.parameters() == model.parameters());
        fs::remove_all(dir);
    }
}

TEST_CASE("bad key/value head counts and windows are refused with one line") {
    CHECK_THROWS_WITH_AS(GPT{small_config(3, 0)}, doctest::Contains("must divide n_head = 4"),
                         std::invalid_argument);
    CHECK_THROWS_AS(GPT{small_config(8, 0)}, std::invalid_argument);
    CHECK_THROWS_AS(GPT{small_config(-1, 0)}, std::invalid_argument);
    CHECK_THROWS_WITH_AS(GPT{small_config(2, -1)}, doctest::Contains("window must be at least 1"),
                         std::invalid_argument);
    GPTConfig open = small_config(2, 4);
    open.causal = false;
    CHECK_THROWS_AS(GPT{open}, std::invalid_argument);
}

TEST_CASE("grouped and windowed runs resume bit for bit, keep their attention, and generate "
          "text") {
    const TextDataset data = repeated_sentences();
    const fs::path dir = attn_test::scratch("attn_test_gqa_resume");
    struct Case { int G, W; Position position; };
    for (const Case& k : {Case{1, 0, Position::learned}, Case{1, 8, Position::learned},
                          Case{1, 8, Position::rope}}) {
        CAPTURE(k.G);
        CAPTURE(k.W);
        TrainConfig c = short_tiny_recipe();  // 2 heads
        c.n_kv_head = k.G;
        c.window = k.W;
        c.position = k.position;
        Trainer second = check_resume(c, data, dir);
        CHECK(second.model().config().kv_heads() == k.G);
        CHECK(second.model().config().window == k.W);
        CHECK(second.config().n_kv_head == k.G);
        CHECK(second.config().window == k.W);
        SampleOptions options;
        options.max_new_tokens = 80;  // past the block of 32: the context is cropped
        if (k.position == Position::learned)
            CHECK(generate_cached(second.model(), data.vocab, "the", options) ==
                  generate_text(second.model(), data.vocab, "the", options));
    }
    fs::remove_all(dir);
}
