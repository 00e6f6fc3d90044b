// The two checks every GPT variant gets (test_gpt.cpp, test_positions.cpp, test_gqa.cpp):
//
// - check_against_torch: a fixture directory, written by tools/reference/make_gpt_fixtures.py,
//   make_position_fixtures.py or make_gqa_fixtures.py, holds weights/ (the weights format),
//   x.npy and y.npy (B, T) token ids, logits.npy, loss.npy and grad/<parameter name>.npy; one
//   forward and backward pass on its batch is checked against all of them;
// - check_gradient_numerically: every parameter's gradient against central differences of
//   the loss;
// and sharp_model, a model whose greedy choices are clear (test_kv_cache.cpp, test_gqa.cpp);
// and check_resume, a short run resumed from its checkpoint (test_positions.cpp, test_gqa.cpp).
#pragma once

#include "attn/data.hpp"
#include "attn/gpt.hpp"
#include "attn/gradcheck.hpp"
#include "attn/npy.hpp"
#include "attn/random.hpp"
#include "attn/trainer.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace attn::gpt_checks {

namespace fs = std::filesystem;

// Tolerance of the PyTorch comparisons: both sides compute in float32 with sums in a
// different order (BLAS against PyTorch's kernels), so values of size O(1) differ by a few
// ulps, ~1e-7 to 1e-6. 1e-5 on logits, loss and gradients is llm.c's bar for its CPU trainer.
constexpr double parity_tol = 1e-5;

inline std::vector<int> load_ids(const fs::path& file) {
    const NpyArray a = read_npy(file);
    return std::vector<int>(a.data.begin(), a.data.end());
}

// The largest |actual − expected| over a tensor, or infinity if the sizes differ.
inline double max_abs_diff(const float* actual, const NpyArray& expected, std::size_t size) {
    if (expected.data.size() != size) return INFINITY;
    double worst = 0.0;
    for (std::size_t i = 0; i < size; ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(actual[i]) - expected.data[i]));
    }
    return worst;
}

struct Parity {
    int B = 0, T = 0;               // the fixture's batch
    float loss = 0.0f;              // ours
    double loss_diff = 0.0, logits_diff = 0.0, worst_gradient = 0.0;
    std::string worst_name;         // the parameter whose gradient differs most
};

// One forward pass (in evaluation mode) and backward pass of `model` on the fixture's batch;
// CHECKs the loss, the logits and every parameter's gradient against PyTorch's within `tol`.
inline Parity check_against_torch(GPT& model, const fs::path& dir, double tol = parity_tol) {
    Parity r;
    model.train(false);
    const std::vector<int> x = load_ids(dir / "x.npy"), y = load_ids(dir / "y.npy");
    const NpyArray xs = read_npy(dir / "x.npy");
    r.B = static_cast<int>(xs.shape[0]);
    r.T = static_cast<int>(xs.shape[1]);
    r.loss = model.forward(x, y, r.B, r.T);
    model.zero_grad();
    model.backward();
    r.loss_diff = std::fabs(r.loss - read_npy(dir / "loss.npy").data[0]);
    r.logits_diff =
        max_abs_diff(model.logits().data(), read_npy(dir / "logits.npy"), model.logits().size());
    CHECK(r.loss_diff <= tol);
    CHECK(r.logits_diff <= tol);
    for (const ParameterInfo& p : model.parameter_table()) {
        CAPTURE(p.name);
        const NpyArray expected = read_npy(dir / "grad" / (p.name + ".npy"));
        REQUIRE(expected.shape == p.shape);
        const double d = max_abs_diff(model.gradients().data() + p.offset, expected, p.size);
        CHECK(d <= tol);
        if (d >= r.worst_gradient) {
            r.worst_gradient = d;
            r.worst_name = p.name;
        }
    }
    return r;
}

// A model whose logits are far from uniform: nanoGPT's N(0, 0.02) start gives logits within
// about 0.01 of each other, so every parameter is redrawn from N(0, 0.3) (LayerNorm weights
// around 1). Sampled texts then vary, and greedy choices are decided by clear margins.
inline GPT sharp_model(const GPTConfig& config, std::uint64_t seed) {
    GPT model(config, seed);
    Rng rng(seed + 1);
    for (float& w : model.parameters()) w = 0.3f * rng.normal();
    for (const ParameterInfo& info : model.parameter_table()) {
        const std::string& n = info.name;
        const bool layernorm_weight = n.find(".ln_") != std::string::npos &&
                                      n.size() > 7 && n.compare(n.size() - 7, 7, ".weight") == 0;
        if (!layernorm_weight) continue;
        float* w = model.parameters().data() + info.offset;
        for (std::size_t i = 0; i < info.size; ++i) w[i] += 1.0f;
    }
    return model;
}

// Every parameter's gradient of a model of `config` (seed 3, with N(0, 0.3²) added to each
// weight, so that every nonlinearity is exercised) on the batch (x, y) of B × T tokens,
// against central differences of the mean loss with step 1e-3; dropout's masks are the same
// on every evaluation. CHECKs the largest error against 5e-4 and returns it.
inline GradCheck check_gradient_numerically(const GPTConfig& config, const std::vector<int>& x,
                                            const std::vector<int>& y, int B, int T) {
    GPT model(config, 3);
    Rng rng(11);
    for (float& p : model.parameters()) p += 0.3f * rng.normal();
    auto objective = [&] {
        model.seed_dropout(42);  // the same masks on every evaluation
        model.forward(x, y, B, T);
        double s = 0.0;
        for (float l : model.activations().losses) s += l;
        return s / static_cast<double>(model.activations().losses.size());
    };
    objective();
    model.zero_grad();
    model.backward();
    const std::vector<float> analytic = model.gradients();
    // Tolerance: the float loss (~2.5) is exact to about one ulp, 2.4e-7; divided by the step
    // 2h = 2e-3 that is ~1.2e-4 per derivative, which is the error seen. 5e-4 allows 4 ulps;
    // a wrong gradient path is off by O(0.01-1). (A larger step, h = 1e-2, trades this for
    // truncation error h²/6·f''' of up to 1e-2 with weights this large.)
    const GradCheck r = finite_difference(model.parameters().data(), analytic.data(),
                                          analytic.size(), 1e-3f, objective);
    CHECK(r.max_abs_error <= 5e-4);
    return r;
}

// A model's sizes, the other settings GPTConfig's defaults.
inline GPTConfig gpt_config(int vocab_size, int block_size, int n_layer, int n_head, int n_embd) {
    GPTConfig c;
    c.vocab_size = vocab_size;
    c.block_size = block_size;
    c.n_layer = n_layer;
    c.n_head = n_head;
    c.n_embd = n_embd;
    return c;
}

// A text of two sentences repeated, 600 lines: enough for the "tiny" recipe's batches.
inline TextDataset repeated_sentences() {
    std::string corpus;
    for (int i = 0; i < 600; ++i) corpus += i % 3 ? "the cat sat. " : "a dog ran\n";
    return make_dataset(corpus);
}

// The "tiny" recipe (2 heads, block 32) cut to 20 steps, 2 of warm-up.
inline TrainConfig short_tiny_recipe() {
    TrainConfig c = TrainConfig::named("tiny");
    c.max_iters = c.lr_decay_iters = 20;
    c.warmup_iters = 2;
    return c;
}

// Runs `c` to its end, and again for 10 steps, saved to `dir` and resumed from there: the
// resumed run's losses must be the whole run's bit for bit, and its model must generate
// past its block. Returns the resumed trainer, at its end, for checks of what it kept.
inline Trainer check_resume(const TrainConfig& c, const TextDataset& data, const fs::path& dir) {
    Trainer whole(c, data);
    std::vector<float> expected;
    while (!whole.done()) expected.push_back(whole.train_step().loss);
    Trainer first(c, data);
    for (int i = 0; i < 10; ++i) first.train_step();
    fs::remove_all(dir);
    first.save(dir);
    Trainer second = Trainer::load(dir, data);
    for (std::size_t i = 10; i < expected.size(); ++i) CHECK(second.train_step().loss == expected[i]);
    SampleOptions options;
    options.max_new_tokens = 80;  // past the block of 32: the context is cropped
    CHECK(generate_text(second.model(), data.vocab, "the", options).size() == 83);
    return second;
}

}  // namespace attn::gpt_checks
