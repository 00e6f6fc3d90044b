// The two checks every GPT variant gets (test_gpt.cpp, test_positions.cpp, test_gqa.cpp):
//
// - check_against_torch: a fixture directory, written by tools/reference/make_gpt_fixtures.py,
//   make_position_fixtures.py or make_gqa_fixtures.py, holds weights/ (the weights format),
//   x.npy and y.npy (B, T) token ids, logits.npy, loss.npy and grad/<parameter name>.npy; one
//   forward and backward pass on its batch is checked against all of them;
// - check_gradient_numerically: every parameter's gradient against central differences of
//   the loss;
// and sharp_model, a model whose greedy choices are clear (test_kv_cache.cpp, test_gqa.cpp);
// check_resume, a short run resumed from its checkpoint (test_positions.cpp, test_gqa.cpp);
// and largest_step_gap, a cached decoder's logits against the whole forward pass's
// (test_kv_cache.cpp, serving/test_paged_cache.cpp).
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

// Tolerance of the PyTorch comparisons (absolute, on logits, loss and every gradient). Both
// sides are float32 with each sum in its own order (BLAS against PyTorch's kernels); two
// orders of an n-term sum differ by at most 2γ_n Σ|a_i b_i| (Higham, Thm 3.1 / eq. 3.5,
// γ_n = n u/(1 − n u), u = 2^-24), and the errors of k products in a row add to first order.
// Sizes of the fixtures (tests/fixtures/{gpt,positions,gqa}/*/weights/config.json, x.npy):
// C = 12..32, L = 1..2, V = 65, N = B·T = 16..32 rows; |logits| ≤ 0.4 (gpt/) and ≤ 3.0
// (positions/, gqa/), loss 4.2..4.6, largest gradient 0.12..0.35 (wte, wpe or c_attn).
// - Logits: the lm_head sum (n = C) has Σ_c |lnf_c wte_vc| ≤ √C ‖g_lnf ⊙ wte_v‖₂ +
//   Σ_c |b_c wte_vc| (‖x̂‖₂ = √C after LayerNorm), computed from the weights: 0.52 (nobias),
//   0.86 (bias), 3.8..4.9 (positions/, gqa/); 2γ_C times that is 1.0e-6..9.3e-6 for that one
//   product, and with the 6L earlier products adding as much again (6L + 1 = 7 or 13 terms)
//   the worst case is 6.9e-6 (nobias), 4.3e-5 (bias), 7.0e-5..1.2e-4 (positions/, gqa/).
// - Loss (mean of N values ≈ 4.2): 2γ_N·loss ≤ 1.6e-5 worst case, plus 2 max|Δlogit|.
// - Gradients: the longest sums are 4C = 128 (mlp's c_proj, bias) or V = 65 (dlnf) terms;
//   with Σ|terms| about the largest gradient (0.12..0.35) and 12L + 2 products on the path,
//   the worst case is 1.7e-5..7.1e-5.
// So the worst-case bound is above 1e-5 by up to 12×: the tolerance rests on the rounding
// errors' random signs, which grow like √n u Σ|a_i b_i| per sum and √k over k products:
// √13·√C·u·Σ|lnf wte| = 0.3e-6..4.2e-6 for the logits (with the Cauchy–Schwarz Σ above, an
// overestimate), √N·u·loss ≈ 1.4e-6 for the loss, √(12L+2)·√n·u·0.35 ≤ 8.6e-7 for the
// gradients: 1e-5 sits 2.4× to 30× above these. It is also llm.c's bar for its CPU trainer.
// A wrong term (a missing bias, mask or scale, a transposed weight) moves them by an amount
// of the order of the values themselves (logits 0.3..3, gradients 0.1..0.35).
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

// `block_size` random tokens (seeded) through the whole forward pass, then position by
// position through `step(token, pos)`, a cached decoder that returns that position's (V)
// logits: the largest |step − forward| logit over every position. The model is put in
// evaluation mode.
template <class Step>
float largest_step_gap(GPT& model, std::uint64_t seed, Step step) {
    const GPTConfig& cfg = model.config();
    model.train(false);
    Rng rng(seed);
    std::vector<int> tokens(static_cast<std::size_t>(cfg.block_size));
    for (int& t : tokens) t = static_cast<int>(rng.below(static_cast<std::uint64_t>(cfg.vocab_size)));
    model.forward(tokens.data(), nullptr, 1, cfg.block_size);
    const std::vector<float> full = model.logits();  // (T, V)
    float worst = 0.0f;
    for (int pos = 0; pos < cfg.block_size; ++pos) {
        const std::vector<float>& logits = step(tokens[static_cast<std::size_t>(pos)], pos);
        const float* row = &full[static_cast<std::size_t>(pos) * cfg.vocab_size];
        for (int v = 0; v < cfg.vocab_size; ++v)
            worst = std::max(worst, std::fabs(logits[static_cast<std::size_t>(v)] - row[v]));
    }
    return worst;
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
