// Activation checkpointing (GPT::set_recompute): the backward pass computes again what the
// forward pass did not keep. The recomputation repeats the forward pass's own operations on
// the same inputs, so the gradients, and every step after them, must equal the run that kept
// everything bit for bit, for every combination of the options that shape the forward pass;
// and it must keep less, by exactly the buffers it no longer holds.
#include "attn/gpt.hpp"
#include "attn/precision.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

using namespace attn;

namespace {

// Whether two buffers hold the same bits (== on floats would let 0 equal -0).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// One combination of the options that change what the forward pass computes (train_gpt's
// --attention, --dropout, --position, --kv-heads, --window, --no-causal-mask,
// --no-attention-scale, --precision and --threads).
struct Options {
    bool fused = false;
    float dropout = 0.0f;
    Position position = Position::learned;
    int kv_heads = 0;
    int window = 0;
    bool causal = true;
    bool scaled = true;
    Precision precision = Precision::fp32;
    int threads = 1;
    std::string describe() const {
        return std::string(fused ? "fused" : "materialised") + ", dropout " + std::to_string(dropout) + ", " +
               position_name(position) + ", kv heads " + std::to_string(kv_heads) + ", window " +
               std::to_string(window) + (causal ? "" : ", no causal mask") + (scaled ? "" : ", no scale") + ", " +
               precision_name(precision) + ", threads " + std::to_string(threads);
    }
};

// Every combination of the options' values: the product of the lists, generated.
std::vector<Options> every_combination() {
    std::vector<Options> all(1);
    auto times = [&all](auto values, auto set) {
        std::vector<Options> next;
        for (const Options& o : all) {
            for (const auto& v : values) {
                Options changed = o;
                set(changed, v);
                next.push_back(changed);
            }
        }
        all = next;
    };
    times(std::vector<bool>{false, true}, [](Options& o, bool v) { o.fused = v; });
    times(std::vector<float>{0.0f, 0.25f}, [](Options& o, float v) { o.dropout = v; });
    times(std::vector<Position>{Position::learned, Position::rope, Position::alibi},
          [](Options& o, Position v) { o.position = v; });
    times(std::vector<int>{0, 1, 2}, [](Options& o, int v) { o.kv_heads = v; });
    times(std::vector<int>{0, 3}, [](Options& o, int v) { o.window = v; });
    times(std::vector<bool>{true, false}, [](Options& o, bool v) { o.causal = v; });
    times(std::vector<bool>{true, false}, [](Options& o, bool v) { o.scaled = v; });
    times(std::vector<Precision>{Precision::fp32, Precision::bf16, Precision::fp16},
          [](Options& o, Precision v) { o.precision = v; });
    times(std::vector<int>{1, 2}, [](Options& o, int v) { o.threads = v; });
    return all;
}

GPTConfig config_of(const Options& o) {
    GPTConfig c;
    c.vocab_size = 11;
    c.block_size = 6;
    c.n_layer = 3;
    c.n_head = 4;
    c.n_embd = 16;  // head size 4: even, for rope
    c.dropout = o.dropout;
    c.position = o.position;
    c.n_kv_head = o.kv_heads;
    c.window = o.window;
    c.causal = o.causal;
    c.scaled_attention = o.scaled;
    return c;
}

// A model as train_gpt makes it: the refusals are the library's own, in one exception.
GPT model_of(const Options& o, Recompute mode) {
    GPT model(config_of(o), 5);
    if (o.fused) model.set_attention(AttentionKind::fused);
    model.set_precision(o.precision);
    model.set_recompute(mode);
    return model;
}

struct Run {
    std::vector<float> losses, first_gradients, weights;
};

// `steps` training steps of AdamW on random batches (B = 3, T = 6): the losses, the first
// step's gradients and the last weights.
Run train(GPT& model, int steps) {
    const int B = 3, T = 6;
    Rng rng(17);
    Run run;
    AdamW adamw;
    std::vector<int> x(B * T), y(B * T);
    for (int s = 0; s < steps; ++s) {
        for (std::size_t i = 0; i < x.size(); ++i) {
            x[i] = static_cast<int>(rng.below(11));
            y[i] = static_cast<int>(rng.below(11));
        }
        run.losses.push_back(model.forward(x, y, B, T));
        model.zero_grad();
        model.backward();
        if (s == 0) run.first_gradients = model.gradients();
        adamw.step(model, 1e-2f);
    }
    run.weights = model.parameters();
    return run;
}

}  // namespace

TEST_CASE("recomputing attention or whole blocks gives the same gradients, losses and weights, bit for bit, "
          "for every combination of the forward pass's options") {
    const int threads = num_threads();
    const std::vector<Options> all = every_combination();
    REQUIRE(all.size() == 2u * 2 * 3 * 3 * 2 * 2 * 2 * 3 * 2);
    int trained = 0, refused = 0;
    int skipped = 0;
    for (const Options& o : all) {
        const std::string options = o.describe();
        CAPTURE(options);
        // Two threads split the batch, so that a block's tensors are read from a slice that
        // starts inside the buffers. Where a slice starts depends on the buffers' shapes only,
        // which the attention, dropout, position and kv heads set; the other options are
        // crossed with one thread alone (two threads' waits on a busy machine cost seconds).
        if (o.threads == 2 && (o.precision != Precision::fp32 || o.window > 0 || !o.causal || !o.scaled)) {
            ++skipped;
            continue;
        }
        set_num_threads(o.threads, "test");
        // Combinations the model cannot run are refused in one exception, whatever the mode:
        // a window without the causal mask, and the fused attention with what it does not do.
        const bool invalid = o.window > 0 && !o.causal;
        const bool unfusable = o.fused && (o.position == Position::alibi || o.kv_heads == 1 || o.kv_heads == 2 ||
                                           o.window > 0 || !o.scaled);
        if (invalid || unfusable) {
            for (Recompute mode : {Recompute::none, Recompute::attention, Recompute::blocks}) {
                CHECK_THROWS_AS(model_of(o, mode), std::invalid_argument);
            }
            ++refused;
            continue;
        }
        GPT kept = model_of(o, Recompute::none);
        const Run reference = train(kept, 3);
        for (Recompute mode : {Recompute::attention, Recompute::blocks}) {
            const std::string recompute = recompute_name(mode);
            CAPTURE(recompute);
            GPT model = model_of(o, mode);
            const Run run = train(model, 3);
            CHECK(same_bits(run.first_gradients, reference.first_gradients));
            REQUIRE(run.losses.size() == reference.losses.size());
            for (std::size_t s = 0; s < run.losses.size(); ++s) CHECK(same_bits(run.losses[s], reference.losses[s]));
            CHECK(same_bits(run.weights, reference.weights));
            // Mixed precision's counts of what rounding lost: the forward pass's once, not
            // again for the recomputation.
            CHECK(model.forward_rounding().values == kept.forward_rounding().values);
            CHECK(model.gradient_rounding().values == kept.gradient_rounding().values);
        }
        ++trained;
    }
    set_num_threads(threads, "test");
    // One thread: materialised, every combination but a window without the mask, 2·3·3·3·2
    // (dropout, position, kv heads, window and mask, scale) · 3 (precision) = 324; fused,
    // learned or rope positions, one kv head per head, no window, scaled: 2·2·2 (dropout,
    // position, mask) · 3 = 24. Two threads: 2·3·3 = 18 materialised, 2·2 = 4 fused.
    CHECK(trained == 324 + 24 + 18 + 4);
    CHECK(refused + skipped == static_cast<int>(all.size()) - trained);
}

TEST_CASE("recomputation keeps less, by exactly the buffers it no longer holds") {
    // The bytes by hand, from the shapes of gpt.hpp's Activations: per block, with B·T = n
    // rows, C channels, G key/value heads of hs channels,
    //   ln1, atty, attproj, residual2, ln2, fcproj: n·C each; fch, fch_gelu: n·4C each;
    //   qkv: n·(C + 2·G·hs); ln1 and ln2's mean and rstd: n each; att_lse: B·NH·T;
    //   with dropout, attproj's and fcproj's masks: n·C each;
    //   att, and with dropout att_dropped: B·NH·T·T each (none with the fused attention).
    // Recompute::attention keeps one block's att and att_dropped, Recompute::blocks one block's
    // every tensor but residual3: L − 1 blocks' fewer.
    const int B = 3, T = 6;
    const int threads = num_threads();
    set_num_threads(1, "test");
    for (const Options o : {Options{}, Options{true}, Options{false, 0.25f}, Options{false, 0.0f, Position::rope, 2}}) {
        const std::string options = o.describe();
        CAPTURE(options);
        const GPTConfig c = config_of(o);
        const std::size_t n = static_cast<std::size_t>(B) * T, C = c.n_embd, NH = c.n_head, L = c.n_layer;
        const std::size_t hs = C / NH, G = c.kv_heads();
        const bool dropout = o.dropout > 0.0f;
        const std::size_t att = o.fused ? 0 : (dropout ? 2 : 1) * B * NH * T * T;
        const std::size_t block = n * C * 6 + n * 4 * C * 2 + n * (C + 2 * G * hs) + 4 * n + B * NH * T +
                                  (dropout ? 2 * n * C : 0) + att;
        std::size_t bytes[3] = {};
        for (Recompute mode : {Recompute::none, Recompute::attention, Recompute::blocks}) {
            GPT model = model_of(o, mode);
            train(model, 1);
            bytes[static_cast<int>(mode)] = model.memory_use().activations;
        }
        CHECK(bytes[0] - bytes[1] == (L - 1) * att * sizeof(float));
        CHECK(bytes[0] - bytes[2] == (L - 1) * block * sizeof(float));
    }
    set_num_threads(threads, "test");
}

TEST_CASE("a model switched to another recomputation resizes its buffers and computes the same") {
    const Options o{false, 0.25f};
    GPT kept = model_of(o, Recompute::none), switched = model_of(o, Recompute::none);
    train(kept, 1);
    train(switched, 1);
    const std::size_t whole = switched.memory_use().activations;
    switched.set_recompute(Recompute::blocks);
    CHECK(switched.recompute() == Recompute::blocks);
    const Run a = train(kept, 2), b = train(switched, 2);
    CHECK(switched.memory_use().activations < whole);  // the old buffers freed, not kept as capacity
    CHECK(same_bits(a.first_gradients, b.first_gradients));
    CHECK(same_bits(a.weights, b.weights));
}

TEST_CASE("a weight source and a gradient sink (ZeRO stages 2 and 3) recompute from the weights they hand over") {
    const Options o{false, 0.25f, Position::rope};
    const int B = 3, T = 6;
    std::vector<int> x(B * T), y(B * T);
    Rng rng(3);
    for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<int>(rng.below(11));
        y[i] = static_cast<int>(rng.below(11));
    }
    GPT kept = model_of(o, Recompute::none);
    for (Recompute mode : {Recompute::attention, Recompute::blocks}) {
        const std::string recompute = recompute_name(mode);
        CAPTURE(recompute);
        GPT sharded = model_of(o, mode);
        const std::vector<float> weights = sharded.parameters();
        std::vector<float> gathered(weights.size(), -1.0f);
        const auto ranges = [&sharded](int b) { return sharded.gradient_buckets()[static_cast<std::size_t>(b)].ranges; };
        sharded.set_gradient_sink([&](int b, float* g) {
            for (const auto& [offset, size] : ranges(b)) {
                std::copy(g, g + size, gathered.begin() + static_cast<std::ptrdiff_t>(offset));
                g += size;
            }
        });
        WeightSource source;
        source.start = [&](int b, float* w) {
            for (const auto& [offset, size] : ranges(b)) {
                std::copy(weights.begin() + static_cast<std::ptrdiff_t>(offset),
                          weights.begin() + static_cast<std::ptrdiff_t>(offset + size), w);
                w += size;
            }
        };
        sharded.set_weight_source(source);
        sharded.seed_dropout(7);
        kept.seed_dropout(7);
        CHECK(same_bits(sharded.forward(x, y, B, T), kept.forward(x, y, B, T)));
        sharded.backward();
        kept.zero_grad();
        kept.backward();
        CHECK(same_bits(gathered, kept.gradients()));
    }
}

TEST_CASE("the modes' names: what train_gpt --recompute and trainer.json spell") {
    for (Recompute mode : {Recompute::none, Recompute::attention, Recompute::blocks}) {
        CHECK(parse_recompute(recompute_name(mode)) == mode);
    }
    CHECK_THROWS_WITH_AS(parse_recompute("layers"), "unknown recomputation 'layers' (the modes are: none, attention, blocks)",
                         std::invalid_argument);
}
