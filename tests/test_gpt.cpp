// The GPT model against PyTorch (fixtures from tools/reference/make_gpt_fixtures.py), against
// finite differences, and its initialisation and optimizer.
#include "attn/fixtures.hpp"
#include "attn/checkpoint.hpp"
#include "attn/gpt.hpp"
#include "attn/threads.hpp"
#include "attn/trainer.hpp"
#include "attn/npy.hpp"

#include "attn/gradcheck.hpp"
#include "gpt_checks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

using namespace attn;
using namespace attn::gpt_checks;

namespace {
namespace fs = std::filesystem;
const fs::path fixtures = attn::fixtures_dir() / "gpt";

// The losses after 10 AdamW steps may differ by 1e-4, ten times gpt_checks.hpp's parity_tol.
// Each step's loss has the first pass's parity error (gpt_checks.hpp: worst case ≤ 4.3e-5,
// random-sign estimate ≤ 1.4e-6 on these two fixtures) plus what the weights' differences
// add. AdamW's update lr·m̂/(√v̂ + ε) has |m̂/√v̂| of order 1 (exactly 1 at step 1), and its
// relative change is, to first order, that of the gradient; so a gradient differing by Δg_i
// moves w_i by ≲ lr·|Δg_i|/|g_i| per step (a gradient within rounding of zero flips its
// update's sign, Δw_i ≤ 2 lr, but then |g_i| ≲ |Δg_i|), and the loss by
// Σ_i |g_i| |Δw_i| ≲ lr Σ_i |Δg_i| per step: over k = 10 steps, P ≈ 2.8e4 parameters (bias;
// 4.4e3 nobias) and |Δg_i| ≤ parity_tol each, at most lr·k·P·1e-5 ≈ 2.8e-3 worst case; with
// the typical |Δg_i| ≈ √n u |g_i| ≲ 1e-9 (n ≤ 128, |g_i| ~ 1e-3 for most parameters)
// it is ~3e-7. 1e-4 sits between, above the random-sign estimate (and the 1e-5 of one pass)
// by more than 10×; a wrong update rule (betas, bias correction, decay of the biases and
// LayerNorm weights, clipping) moves the losses, which fall by 0.03..0.05 a step, by ≥ 1e-3.
constexpr double adamw_tol = 1e-4;
}  // namespace

// PyTorch's count: the fixtures hold the state dict of PyTorch's model, one .npy per key;
// `lm_head.weight` is `transformer.wte.weight` itself (tied), so model.parameters() yields it
// once. The count from the config must be the sum of the other tensors' sizes, for the
// fixtures with and without biases, RoPE and ALiBi, grouped keys and a window.
TEST_CASE("the parameter count equals PyTorch's state dict in the fixtures, with and without biases") {
    for (const char* name : {"gpt/bias", "gpt/nobias", "positions/rope", "positions/alibi", "gqa/gqa",
                             "gqa/gqa_rope_window", "gqa/mqa_window"}) {
        CAPTURE(name);
        const fs::path weights = attn::fixtures_dir() / name / "weights";
        std::size_t torch_count = 0;
        int tensors = 0;
        for (const auto& entry : fs::directory_iterator(weights)) {
            if (entry.path().extension() != ".npy" || entry.path().stem() == "lm_head.weight") continue;
            std::size_t size = 1;
            for (std::size_t d : read_npy(entry.path()).shape) size *= d;
            torch_count += size;
            ++tensors;
        }
        REQUIRE(tensors > 0);
        const GPT model = load_checkpoint(weights);
        CAPTURE(model.config().bias);
        CHECK(model.config().num_parameters() == torch_count);
    }
}

TEST_CASE("forward, loss and every gradient match PyTorch's nanoGPT on the same weights") {
    for (const std::string name : {"bias", "nobias", "bias, fused attention"}) {
        CAPTURE(name);
        const fs::path dir = fixtures / name.substr(0, name.find(','));
        GPT model = load_checkpoint(dir / "weights");
        if (name.find("fused") != std::string::npos) model.set_attention(AttentionKind::fused);
        const Parity r = check_against_torch(model, dir);
        MESSAGE(name << ": loss " << r.loss << ", |loss - torch| = " << r.loss_diff
                     << ", max |logits - torch| = " << r.logits_diff
                     << ", worst gradient difference " << r.worst_gradient << " in "
                     << r.worst_name);
    }
}

TEST_CASE("ten AdamW steps with clipping follow PyTorch's losses") {
    for (const std::string name : {"bias", "nobias"}) {
        CAPTURE(name);
        const fs::path dir = fixtures / name;
        GPT model = load_checkpoint(dir / "weights");
        model.train(false);
        const std::vector<int> x = load_ids(dir / "x.npy"), y = load_ids(dir / "y.npy");
        const NpyArray xs = read_npy(dir / "x.npy");
        const int B = static_cast<int>(xs.shape[0]), T = static_cast<int>(xs.shape[1]);
        const NpyArray expected = read_npy(dir / "adamw_losses.npy");
        AdamW optimizer;  // nanoGPT's recipe: betas (0.9, 0.99), weight decay 0.1
        double worst = 0.0;
        for (std::size_t step = 0; step < expected.data.size(); ++step) {
            CAPTURE(step);
            const float loss = model.forward(x, y, B, T);
            const double d = std::fabs(loss - expected.data[step]);
            CHECK(d <= adamw_tol);
            worst = std::max(worst, d);
            model.zero_grad();
            model.backward();
            clip_grad_norm(model, 1.0f);
            optimizer.step(model, 1e-3f);
        }
        MESSAGE(name << ": worst |loss - torch| over 10 AdamW steps = " << worst << " (loss "
                     << expected.data.front() << " -> " << expected.data.back() << ")");
    }
}

TEST_CASE("the whole model's gradient agrees with finite differences, with dropout held fixed") {
    // A tiny model with large weights, so every nonlinearity is exercised.
    GPTConfig config = gpt_config(11, 8, 2, 2, 8);
    const int B = 2, T = 6;
    const std::vector<int> x = {1, 4, 2, 9, 0, 3, 10, 10, 5, 6, 7, 8};
    const std::vector<int> y = {4, 2, 9, 0, 3, 1, 10, 5, 6, 7, 8, 2};
    for (float dropout : {0.0f, 0.2f}) {
        for (bool bias : {true, false}) {
            CAPTURE(dropout);
            CAPTURE(bias);
            config.dropout = dropout;
            config.bias = bias;
            const GradCheck r = check_gradient_numerically(config, x, y, B, T);
            MESSAGE("dropout " << dropout << ", bias " << bias << ": " << config.num_parameters()
                               << " parameters, max |analytic - numeric| = " << r.max_abs_error
                               << " (largest gradient " << r.max_abs_grad << ")");
        }
    }
}

TEST_CASE("the parameter count is the sum of the model's tensors, with and without biases") {
    // By hand, for the course's CPU recipe (V = 65, block 64, 4 layers of C = 128, no biases):
    // wte 65·128 + wpe 64·128 + 4·(ln_1 128 + c_attn 3·128² + c_proj 128² + ln_2 128 + the
    // MLP's 8·128²) + ln_f 128 = 8 320 + 8 192 + 4·196 864 + 128 = 804 096. A count that
    // gives LayerNorm biases to a model without biases says 805 120.
    GPTConfig cpu = TrainConfig::named("cpu").model_config(65);
    REQUIRE_FALSE(cpu.bias);
    CHECK(cpu.num_parameters() == 804096);
    // Every recipe, with and without biases, every position scheme and key/value grouping:
    // the count is what the model allocates and what its state dict's tensors hold.
    for (const char* recipe : {"tiny", "cpu", "shakespeare"}) {
        for (bool bias : {false, true}) {
            for (Position position : {Position::learned, Position::rope, Position::alibi}) {
                for (int G : {0, 1, 2}) {
                    GPTConfig c = TrainConfig::named(recipe).model_config(65);
                    c.bias = bias;
                    c.position = position;
                    c.n_kv_head = G;
                    CAPTURE(recipe);
                    CAPTURE(bias);
                    CAPTURE(G);
                    const GPT model(c, 1);
                    std::size_t in_tensors = 0;
                    for (const ParameterInfo& p : model.parameter_table()) in_tensors += p.size;
                    CHECK(c.num_parameters() == in_tensors);
                    CHECK(model.parameters().size() == in_tensors);
                }
            }
        }
    }
}

TEST_CASE("the bytes a model holds are its buffers': 4 per parameter each for weights and gradients, 8 for AdamW, activations by their shapes") {
    // The CPU recipe (804 096 parameters, counted by hand above), one thread, so that no
    // batch slice keeps gradients of its own.
    const int threads = num_threads();
    set_num_threads(1);
    const GPTConfig c = TrainConfig::named("cpu").model_config(65);
    REQUIRE(c.n_kv_head == 0);
    const std::size_t P = 804096, L = c.n_layer, C = c.n_embd, V = c.vocab_size, NH = c.n_head;
    const int B = 2, T = 16;
    const std::size_t BT = B * T;
    // What each position keeps, from the shapes of llm.c's activations (floats): per layer
    // ln1 C + its mean and rstd 2, qkv 3C, the heads' output C, the attention weights NH·T
    // and their log-sum-exps NH, attn.c_proj C, residual C, ln2 C + 2, fc 4C, GELU 4C,
    // mlp.c_proj C, residual C; then the embeddings C, ln_f C + 2, logits V, probabilities V,
    // the loss 1. The backward pass's scratch, one layer at a time: the residual's and a
    // LayerNorm's gradients C + C, qkv 3C, the heads' output C, fc and GELU 4C + 4C, logits V,
    // the weights NH·T, a branch's output C.
    const std::size_t kept = L * (18 * C + 4 + NH * T + NH) + (2 * C + 2 + 2 * V + 1);
    const std::size_t scratch = 15 * C + V + NH * T;
    for (AttentionKind kind : {AttentionKind::materialised, AttentionKind::fused}) {
        CAPTURE(static_cast<int>(kind));
        GPT model(c, 1);
        model.set_attention(kind);
        MemoryUse use = model.memory_use();
        CHECK(use.weights == 4 * P);
        CHECK(use.gradients == 4 * P);
        CHECK(use.activations == 0);  // sized by the first forward pass
        const std::vector<int> x(BT, 1), y(BT, 2);
        model.forward(x, y, B, T);
        model.zero_grad();
        model.backward();
        use = model.memory_use();
        CHECK(use.weights == 4 * P);
        CHECK(use.gradients == 4 * P);
        // The fused attention keeps no (T, T) weights, in either pass.
        const std::size_t weights_TT = kind == AttentionKind::fused ? (L + 1) * NH * T : 0;
        CHECK(use.activations == 4 * BT * (kept + scratch - weights_TT));
        AdamW adamw;
        CHECK(adamw.bytes() == 0);
        adamw.step(model, 1e-3f);
        CHECK(adamw.bytes() == 8 * P);
    }
    // Two threads: the second slice of the batch sums its gradients in a buffer of its own
    // (GPT::backward), another 4 bytes per parameter.
    set_num_threads(2);
    GPT model(c, 1);
    const std::vector<int> x(BT, 1), y(BT, 2);
    model.forward(x, y, B, T);
    model.zero_grad();
    model.backward();
    CHECK(model.memory_use().gradients == 8 * P);
    set_num_threads(threads);
}

TEST_CASE("initialisation follows nanoGPT and the loss at initialisation is about ln V") {
    GPTConfig config = gpt_config(65, 64, 4, 4, 128);
    GPT model(config, 1);
    CHECK(model.parameters().size() == config.num_parameters());
    // nanoGPT's count for this config: 65·128 + 64·128 + 4·(12·128² + 13·128) + 2·128.
    CHECK(config.num_parameters() == 65 * 128 + 64 * 128 + 4 * (12 * 128 * 128 + 13 * 128) + 256);
    for (const ParameterInfo& p : model.parameter_table()) {
        CAPTURE(p.name);
        const float* w = model.parameters().data() + p.offset;
        double sum = 0.0, sum_sq = 0.0;
        for (std::size_t i = 0; i < p.size; ++i) {
            sum += w[i];
            sum_sq += static_cast<double>(w[i]) * w[i];
        }
        const double n = static_cast<double>(p.size);
        const double mean = sum / n, std = std::sqrt(sum_sq / n - mean * mean);
        const bool is_bias = p.name.find(".bias") != std::string::npos;
        if (is_bias) {
            CHECK(sum_sq == 0.0);
        } else if (p.name.find("ln_") != std::string::npos) {
            CHECK(mean == 1.0);
            CHECK(std == 0.0);
        } else {
            // The sample std of n ≥ 8192 normals is within 3% of the true one (~4 sigma).
            const bool residual = p.name.find("c_proj.weight") != std::string::npos;
            const double expected = residual ? 0.02 / std::sqrt(2.0 * config.n_layer) : 0.02;
            CHECK(std == doctest::Approx(expected).epsilon(0.03));
            CHECK(p.decay);
        }
    }
    // Near-zero logits predict every token with probability about 1/V.
    Rng rng(2);
    std::vector<int> x(8 * 64), y(8 * 64);
    for (int& t : x) t = static_cast<int>(rng.below(65));
    for (int& t : y) t = static_cast<int>(rng.below(65));
    const float loss = model.forward(x, y, 8, 64);
    MESSAGE("loss at initialisation " << loss << ", ln 65 = " << std::log(65.0));
    // Logits of std σ ≈ 0.02·√C ≈ 0.23 raise the expected loss above ln V by about σ²/2 ≈ 0.03;
    // 0.1 allows that and the sampling noise of 512 random targets.
    CHECK(std::fabs(loss - std::log(65.0)) < 0.1);
}

TEST_CASE("evaluation mode switches dropout off and training mode switches it on") {
    GPTConfig config = gpt_config(11, 8, 1, 2, 8);
    config.dropout = 0.5f;
    GPT with_dropout(config, 5);
    config.dropout = 0.0f;
    GPT without(config, 5);  // same seed: same weights
    const std::vector<int> x = {1, 2, 3, 4}, y = {2, 3, 4, 5};
    with_dropout.train(false);
    const float eval_loss = with_dropout.forward(x, y, 1, 4);
    // Exact: with dropout off both run the same code on the same weights in the same order.
    CHECK(eval_loss == without.forward(x, y, 1, 4));
    with_dropout.train(true);
    CHECK(with_dropout.forward(x, y, 1, 4) != eval_loss);
}

TEST_CASE("clip_grad_norm scales the gradient to the given norm and leaves small ones alone") {
    GPTConfig config = gpt_config(3, 2, 1, 1, 2);
    GPT model(config);
    std::vector<float>& g = model.gradients();
    std::fill(g.begin(), g.end(), 0.0f);
    g[0] = 3.0f;
    g[1] = 4.0f;  // norm 5
    // √(9 + 16) = 5 is exact in float32. The scaled values g·(1/(5 + 1e-6)) round by ≤ 2u
    // (u = 2^-24), 1.2e-7 relative; Approx's default margin, 100·2^-23·(1 + |x|) ≈ 1.9e-5
    // here, is far above that, and also above the +1e-6's own effect (2e-7 relative), which
    // these checks therefore do not resolve.
    CHECK(clip_grad_norm(model, 1.0f) == doctest::Approx(5.0f));
    // torch divides by norm + 1e-6
    CHECK(g[0] == doctest::Approx(3.0 / (5.0 + 1e-6)));
    CHECK(g[1] == doctest::Approx(4.0 / (5.0 + 1e-6)));
    CHECK(clip_grad_norm(model, 2.0f) == doctest::Approx(1.0f));
    CHECK(g[1] == doctest::Approx(4.0 / (5.0 + 1e-6)));  // unchanged
}

TEST_CASE("one AdamW step moves each weight by lr against its gradient's sign, plus decay") {
    // At step 1, m̂ = g and v̂ = g², so the update is lr·g/(|g| + eps) = lr·sign(g) for |g| ≫ eps;
    // decay multiplies the decayed tensors by (1 − lr·wd) first.
    GPTConfig config = gpt_config(3, 2, 1, 1, 2);
    GPT model(config);
    const std::vector<float> before = model.parameters();
    std::vector<float>& g = model.gradients();
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = (i % 2 ? 1.0f : -1.0f) * 0.5f;
    AdamW optimizer;
    const float lr = 0.01f;
    optimizer.step(model, lr);
    for (const ParameterInfo& p : model.parameter_table()) {
        CAPTURE(p.name);
        for (std::size_t i = p.offset; i < p.offset + p.size; ++i) {
            const double decayed = before[i] * (p.decay ? 1.0 - lr * 0.1 : 1.0);
            const double expected = decayed - lr * (g[i] > 0 ? 1.0 : -1.0);
            // Float32: the decay's product and the subtraction round by u|w| each (|w| ≲ 1,
            // u = 2^-24); m̂ = m/(1 − β1) and √v̂ carry ≲ 3u each, so lr·m̂/(√v̂ + ε) = lr within
            // ~6u·lr (ε = 1e-8 moves it by 2e-8·lr): ≲ 2.5e-7 in all, and Approx allows
            // 1e-6·(1 + |expected|) ≥ 1e-6, 4× above. A wrong sign or decay is off by ≥ 1e-3.
            CHECK(model.parameters()[i] == doctest::Approx(expected).epsilon(1e-6));
        }
    }
}

TEST_CASE("the forward pass rejects token ids outside the vocabulary and T beyond block_size") {
    GPTConfig config = gpt_config(5, 4, 1, 1, 4);
    GPT model(config);
    CHECK_THROWS_WITH_AS(model.forward({1, 5}, {}, 1, 2),
                         "GPT::forward: token id 5 at position 1 is outside [0, 5)",
                         std::invalid_argument);
    CHECK_THROWS_AS(model.forward(std::vector<int>(5, 0), {}, 1, 5), std::invalid_argument);
    config.n_embd = 6;
    config.n_head = 4;
    CHECK_THROWS_WITH_AS(GPT{config},
                         "GPT config: n_embd must be a positive multiple of n_head, got n_embd 6 "
                         "and n_head 4",
                         std::invalid_argument);
}

TEST_CASE("the fused CPU attention gives the GPT the materialised attention's loss and gradients") {
    // hs = 64 and T = 200: several query and key tiles of the fused attention, the last ones
    // partial; B = 3 sequences split between the threads.
    GPTConfig config = gpt_config(65, 200, 2, 2, 128);
    for (bool causal : {true, false}) {
        CAPTURE(causal);
        config.causal = causal;
        GPT materialised(config, 42), fused(config, 42);
        fused.set_attention(AttentionKind::fused);
        const int B = 3, T = 200;
        Rng rng(9);
        std::vector<int> x(B * T), y(B * T);
        for (int& t : x) t = static_cast<int>(rng.uniform() * 65.0f) % 65;
        for (int& t : y) t = static_cast<int>(rng.uniform() * 65.0f) % 65;
        const float loss_m = materialised.forward(x, y, B, T);
        const float loss_f = fused.forward(x, y, B, T);
        materialised.zero_grad();
        fused.zero_grad();
        materialised.backward();
        fused.backward();
        // The fused model keeps no (T, T) weights.
        CHECK(fused.activations().att.empty());
        // Both are float32 with the same products summed in other orders (and exp_approx's
        // 2 ulp); the embeddings, LayerNorms, MLPs, logits and cross-entropy are the same code
        // in the same order, so the loss (mean of ln 65 ≈ 4.2 over N = 600 rows) differs only
        // through the attention outputs. Each output's softmax denominator sums T = 200
        // positive terms and its P·v sum T terms: two orders differ by 2γ_200 ≈ 2.4e-5 of the
        // output's size at worst, plus 2γ_64 Σ|q k|/√hs ≈ 0 (scores ~1e-3 at N(0, 0.02)
        // weights) and 4u = 2.4e-7 for exp_approx; through c_proj, LayerNorm and the logits'
        // sum (Σ_c |lnf_c wte_vc| ≤ √C·0.02·√C ≈ 2.6, C = 128) in 2 layers, and |Δloss| ≤
        // 2 max|Δlogit|, the worst case is 2·2·2.4e-5·2.6 ≈ 2.5e-4, a gross overestimate
        // (it assumes each attention output carries the whole residual stream). With random
        // signs (√200 u ≈ 8.4e-7 per denominator) the same chain gives 2·√2·8.4e-7·2.6 ≈
        // 6.2e-6 at most and much less in practice, since the attention branch is a fraction of
        // the residual stream: 4e-6 is ~16 u·|loss|. (At these small weights a wrong mask or
        // tile edge moves the loss little; the gradient check below is the sharper one.)
        CHECK(std::fabs(loss_m - loss_f) <= 4e-6);
        const std::vector<float>& gm = materialised.gradients();
        const std::vector<float>& gf = fused.gradients();
        double worst = 0.0, largest = 0.0;
        for (std::size_t i = 0; i < gm.size(); ++i) {
            worst = std::max(worst, std::fabs(static_cast<double>(gm[i]) - gf[i]));
            largest = std::max(largest, std::fabs(static_cast<double>(gm[i])));
        }
        MESSAGE("causal " << causal << ": |loss difference| " << std::fabs(loss_m - loss_f)
                          << ", worst gradient difference " << worst << " of " << largest);
        // Relative to the largest gradient: the backward's sums differing in order are the
        // attention's dP = dout·v (n = hs = 64), dq and dk (n = T = 200) and dv (n = T); two
        // orders differ by 2γ_200 ≈ 2.4e-5 of Σ|terms| at worst, and with random signs by
        // √200 u ≈ 8.4e-7 of it, per sum; 2 layers × 4 such sums add √8·8.4e-7 ≈ 2.4e-6 of
        // the largest gradient (Σ|terms| of the order of the largest value). 1e-5 of the
        // largest sits 4× above that estimate, below the worst case (8·2.4e-5 ≈ 1.9e-4);
        // a wrong term in dq, dk or dv would be of the gradients' size.
        CHECK(worst <= 1e-5 * largest);
    }
}

TEST_CASE("a fused-attention model trains with dropout on the materialised attention") {
    GPTConfig config = gpt_config(65, 16, 1, 2, 16);
    config.dropout = 0.1f;
    GPT materialised(config, 5), fused(config, 5);
    fused.set_attention(AttentionKind::fused);
    std::vector<int> x(2 * 16, 3), y(2 * 16, 4);
    // Dropout on the weights needs them stored: the fused model falls back, same masks.
    CHECK(fused.forward(x, y, 2, 16) == materialised.forward(x, y, 2, 16));
    CHECK_FALSE(fused.activations().att.empty());
    fused.train(false);  // no dropout: the fused attention again
    materialised.train(false);
    // As in the test above, with T = 16: the softmax sums have 2γ_16 ≈ 1.9e-6 worst case and
    // √16 u ≈ 2.4e-7 random-sign relative error; through one layer into a loss of ≈ 4.2 whose
    // logits' Σ|lnf wte| ≤ √16·0.02·√16 = 0.32, the worst case is 2·1.9e-6·0.32 ≈ 1.2e-6
    // (plus 4u for exp_approx), below 4e-6.
    CHECK(std::fabs(fused.forward(x, y, 2, 16) - materialised.forward(x, y, 2, 16)) <= 4e-6);
}

TEST_CASE("without the attention scale the model equals a scaled one whose W_q is √hs larger") {
    // Leaving out 1/√hs is a reparametrisation: q·kᵀ = (√hs·q)·kᵀ/√hs. So an unscaled model
    // with weights W has the loss of a scaled model with W_q multiplied by √hs, and by the
    // chain rule its W_q gradient is √hs times that model's; every other gradient is the same.
    // hs = 16 makes √hs = 4 a power of two, so the rescaled weights are exact in float.
    GPTConfig config = gpt_config(11, 8, 2, 2, 32);  // hs = 16
    config.bias = false;
    const int C = config.n_embd, B = 3, T = 8;
    const float root_hs = 4.0f;
    GPTConfig unscaled_config = config;
    unscaled_config.scaled_attention = false;
    GPT unscaled(unscaled_config, 7), scaled(config, 7), same_weights(config, 7);
    REQUIRE(unscaled.parameters() == scaled.parameters());
    // W_q is the first C rows of each layer's c_attn (3C, C).
    for (int l = 0; l < config.n_layer; ++l) {
        float* wq = scaled.params().qkvw + static_cast<std::size_t>(l) * 3 * C * C;
        for (int i = 0; i < C * C; ++i) wq[i] *= root_hs;
    }
    Rng rng(3);
    std::vector<int> x(B * T), y(B * T);
    for (int& t : x) t = static_cast<int>(rng.below(11));
    for (int& t : y) t = static_cast<int>(rng.below(11));
    const float loss_unscaled = unscaled.forward(x, y, B, T);
    const float loss_scaled = scaled.forward(x, y, B, T);
    const float loss_same_weights = same_weights.forward(x, y, B, T);
    // Multiplying by √hs = 4 and by 1/√hs = 1/4 is exact in float32 (a power of two, no
    // overflow or underflow here), so the two models compute the same scores from the same
    // rounded products: the bound is 0 when both sum in the same order. The tolerance allows
    // the scale applied at another point of the same sums (q·k/4 against (q/4)·k, both exact)
    // or a kernel choosing another order: then 2γ_n Σ|terms| per sum (n ≤ 4C = 128, 2γ ≈
    // 1.5e-5 worst case, √128 u ≈ 6.7e-7 with random signs) relative, and 1e-6 of the loss
    // (≈ ln 11 ≈ 2.4) is ~17 u|loss|, above the random-sign estimate; the unscaled model on
    // the same weights differs by > 1e-4 (checked next).
    CHECK(loss_unscaled == doctest::Approx(loss_scaled).epsilon(1e-6));
    // The flag must change something: on the same weights the two models differ.
    CHECK(std::fabs(loss_unscaled - loss_same_weights) > 1e-4);

    unscaled.zero_grad();
    unscaled.backward();
    scaled.zero_grad();
    scaled.backward();
    const std::vector<float>& gu = unscaled.gradients();
    const std::vector<float>& gs = scaled.gradients();
    double largest = 0.0;
    for (float g : gs) largest = std::max(largest, static_cast<double>(std::fabs(g)));
    REQUIRE(largest > 0.0);
    const std::size_t qkvw = static_cast<std::size_t>(unscaled.params().qkvw - unscaled.parameters().data());
    for (std::size_t i = 0; i < gu.size(); ++i) {
        const std::size_t in_qkvw = i - qkvw;
        const bool is_wq = i >= qkvw && in_qkvw < static_cast<std::size_t>(config.n_layer) * 3 * C * C &&
                           (in_qkvw % (3 * static_cast<std::size_t>(C) * C)) < static_cast<std::size_t>(C) * C;
        const double expected = is_wq ? root_hs * gs[i] : gs[i];
        CAPTURE(i);
        CAPTURE(is_wq);
        // As for the loss: 0 when both sum in the same order (the ×4 is exact); otherwise the
        // backward's longest sums (4C = 128 terms, N = B·T = 24 rows) differ by 2γ_128 ≈
        // 1.5e-5 of Σ|terms| at worst and √128 u ≈ 6.7e-7 of it with random signs, over
        // 12L + 2 = 26 products √26·6.7e-7 ≈ 3.4e-6 of the largest gradient: 1e-5 of the
        // largest is 3× above that. A W_q gradient not scaled by √hs is off by a factor 4.
        CHECK(std::fabs(gu[i] - expected) <= 1e-5 * largest);
    }
}
