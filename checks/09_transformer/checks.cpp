// Checks for exercise 09: one transformer block's forward pass.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for any heads, widths, biases and input scales, a token moves no earlier position and no other sequence
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/checkpoint.hpp"
#include "attn/fixtures.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/npy.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using attn::Tensor3;
using exercise::block_forward;
using exercise::BlockWeights;

namespace {
namespace fs = std::filesystem;

// The PyTorch fixtures of tools/reference/make_gpt_fixtures.py: nanoGPT's GPT written in
// PyTorch, its weights, one batch of token ids and the logits PyTorch computed for it.
const fs::path fixtures = attn::fixtures_dir() / "gpt";

// Layer l's tensors inside the library model's parameters, laid out as ParameterTensors says.
BlockWeights layer(const attn::GPT& model, int l) {
    const attn::ParameterTensors& p = model.params();
    const std::size_t C = static_cast<std::size_t>(model.config().n_embd), L = l;
    const auto at = [](const float* base, std::size_t offset) -> const float* {
        return base ? base + offset : nullptr;
    };
    BlockWeights w;
    w.ln_1_weight = at(p.ln1w, L * C);
    w.ln_1_bias = at(p.ln1b, L * C);
    w.attn_c_attn_weight = at(p.qkvw, L * 3 * C * C);
    w.attn_c_attn_bias = at(p.qkvb, L * 3 * C);
    w.attn_c_proj_weight = at(p.attprojw, L * C * C);
    w.attn_c_proj_bias = at(p.attprojb, L * C);
    w.ln_2_weight = at(p.ln2w, L * C);
    w.ln_2_bias = at(p.ln2b, L * C);
    w.mlp_c_fc_weight = at(p.fcw, L * 4 * C * C);
    w.mlp_c_fc_bias = at(p.fcb, L * 4 * C);
    w.mlp_c_proj_weight = at(p.fcprojw, L * 4 * C * C);
    w.mlp_c_proj_bias = at(p.fcprojb, L * C);
    return w;
}

// (B, T, C) copied from a flat buffer.
Tensor3 as_tensor(const float* data, int B, int T, int C) {
    Tensor3 t({static_cast<std::size_t>(B), static_cast<std::size_t>(T),
               static_cast<std::size_t>(C)});
    std::copy(data, data + t.size(), t.data());
    return t;
}

// One PyTorch fixture: the model with PyTorch's weights, the batch and PyTorch's logits.
struct Fixture {
    attn::GPT model;
    std::vector<int> x;
    int B, T;
    attn::NpyArray logits;  // (B, T, V)
};

Fixture load_fixture(const std::string& name) {
    const fs::path dir = fixtures / name;
    const attn::NpyArray ids = attn::read_npy(dir / "x.npy");
    Fixture f{attn::load_checkpoint(dir / "weights"),
              std::vector<int>(ids.data.begin(), ids.data.end()),
              static_cast<int>(ids.shape[0]), static_cast<int>(ids.shape[1]),
              attn::read_npy(dir / "logits.npy")};
    f.model.train(false);
    return f;
}

// The whole GPT with the exercise's block in place of the library's: the library's
// embeddings, block_forward once per layer, then the final LayerNorm and the tied LM head.
// Returns the logits (B, T, V).
Tensor3 logits_with_exercise_blocks(Fixture& f) {
    attn::GPT& m = f.model;
    const attn::GPTConfig& c = m.config();
    const int B = f.B, T = f.T, C = c.n_embd, V = c.vocab_size, N = B * T;
    const attn::ParameterTensors& p = m.params();
    std::vector<float> encoded(static_cast<std::size_t>(N) * C);
    attn::encoder_forward(encoded.data(), f.x.data(), p.wte, p.wpe, B, T, C);
    Tensor3 h = as_tensor(encoded.data(), B, T, C);
    for (int l = 0; l < c.n_layer; ++l) h = block_forward(h, layer(m, l), c.n_head);
    REQUIRE_MESSAGE(h.size() == encoded.size(), "block_forward must return (B, T, C) = ("
                                                    << B << ", " << T << ", " << C << ")");
    std::vector<float> lnf(encoded.size()), mean(N), rstd(N);
    attn::layernorm_forward(lnf.data(), mean.data(), rstd.data(), h.data(), p.lnfw, p.lnfb, B, T,
                            C);
    Tensor3 logits({static_cast<std::size_t>(B), static_cast<std::size_t>(T),
                    static_cast<std::size_t>(V)});
    attn::matmul_forward(logits.data(), lnf.data(), p.wte, nullptr, N, C, V);
    return logits;
}

// PyTorch's logits as a (B, T, V) tensor.
Tensor3 expected_logits(const Fixture& f) {
    return as_tensor(f.logits.data.data(), static_cast<int>(f.logits.shape[0]),
                     static_cast<int>(f.logits.shape[1]), static_cast<int>(f.logits.shape[2]));
}

// Tolerance of the comparisons with PyTorch and with the library's model: float32 sums in a
// different order (BLAS against PyTorch's kernels, or the library's batch split over
// threads) differ by a few ulps of O(1) values, ~1e-7 to 1e-6; 1e-5 is the library's own
// bar against PyTorch (tests/test_gpt.cpp). A wrong block moves the logits by 1e-2 or more.
// Derived: the logits against PyTorch as in tests/gpt_checks.hpp (gpt/ fixtures, C = 32,
// |logits| ≤ 0.4: worst case 6.9e-6 nobias, 4.3e-5 bias, from 2γ_n Σ|terms| over 6L + 1
// products, u = 2^-24; random-sign estimate ≲ 1e-6). A block against the library's: 6
// products of n ≤ 4C = 128 terms, Σ|terms| ≲ 1 (≲ 2.6 with c_fc × 20), 2γ_128 ≈ 1.5e-5 each
// at worst, √6·√128 u·2.6 ≈ 4.4e-6 with random signs: 1e-5 rests on that, ≥ 2.3× above. The
// smallest catalogued mistake, GPT-2's tanh GELU, moves the ×20 block by 7e-5, 7× above it;
// the others (no residual, wrong LayerNorm, no bias, no c_proj, no mask) by ≥ 1e-2.
constexpr double parity_tol = 1e-5;

}  // namespace

TEST_CASE("with both branches' output projections zero, a block passes its input through") {
    // Every branch ends in a c_proj: with its weight and bias zero the branch adds exactly 0,
    // and the residual stream leaves the block as it came in, whatever the LayerNorms do.
    Fixture f = load_fixture("bias");
    const attn::GPTConfig& c = f.model.config();
    const std::size_t C = static_cast<std::size_t>(c.n_embd);
    const attn::ParameterTensors& p = f.model.params();
    std::fill(p.attprojw, p.attprojw + C * C, 0.0f);
    std::fill(p.attprojb, p.attprojb + C, 0.0f);
    std::fill(p.fcprojw, p.fcprojw + C * 4 * C, 0.0f);
    std::fill(p.fcprojb, p.fcprojb + C, 0.0f);
    attn::Rng rng(9);
    const Tensor3 x = rng.normal_tensor<3>({2, 5, C}, 0.5f, 2.0f);
    CHECK_CLOSE(block_forward(x, layer(f.model, 0), c.n_head), x, 0.0);
}

TEST_CASE("each block gives the library model's residual stream, layer after layer") {
    Fixture f = load_fixture("bias");
    attn::GPT& m = f.model;
    const attn::GPTConfig& c = m.config();
    const int B = f.B, T = f.T, C = c.n_embd;
    m.forward(f.x, {}, B, T);
    const attn::Activations& a = m.activations();
    const std::size_t per_layer = static_cast<std::size_t>(B) * T * C;
    for (int l = 0; l < c.n_layer; ++l) {
        CAPTURE(l);
        // Block l reads the embeddings (l = 0) or block l − 1's output, and writes residual3[l].
        const float* in = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * per_layer;
        const Tensor3 expected = as_tensor(a.residual3.data() + l * per_layer, B, T, C);
        CHECK_CLOSE(block_forward(as_tensor(in, B, T, C), layer(m, l), c.n_head), expected,
                    parity_tol);
    }
}

TEST_CASE("two blocks between the embeddings and the LM head give PyTorch's logits") {
    // tests/fixtures/gpt/bias: L = 2 blocks, NH = 2 heads, C = 32, every bias present.
    Fixture f = load_fixture("bias");
    CHECK_CLOSE(logits_with_exercise_blocks(f), expected_logits(f), parity_tol);
}

TEST_CASE("without biases, four heads and T shorter than the context, PyTorch's logits again") {
    // tests/fixtures/gpt/nobias: every bias is nullptr, NH = 4 heads of hs = 4, T = 11 < 16.
    Fixture f = load_fixture("nobias");
    CHECK_CLOSE(logits_with_exercise_blocks(f), expected_logits(f), parity_tol);
}

TEST_CASE("a later token cannot change an earlier position's output") {
    Fixture f = load_fixture("bias");
    const attn::GPTConfig& c = f.model.config();
    const std::size_t C = static_cast<std::size_t>(c.n_embd);
    attn::Rng rng(3);
    const Tensor3 x = rng.normal_tensor<3>({2, 8, C});
    Tensor3 x_changed = x;
    xt::view(x_changed, 0, 5) = rng.normal_tensor<1>({C});  // sequence 0, position 5
    const Tensor3 before = block_forward(x, layer(f.model, 0), c.n_head);
    const Tensor3 after = block_forward(x_changed, layer(f.model, 0), c.n_head);
    // Positions 0..4 of sequence 0 and all of sequence 1 are computed from the same numbers.
    CHECK_CLOSE(xt::view(after, 0, xt::range(0, 5)), xt::view(before, 0, xt::range(0, 5)), 0.0);
    CHECK_CLOSE(xt::view(after, 1), xt::view(before, 1), 0.0);
    // Position 6 attends to the changed token 5: it must move.
    CHECK(xt::amax(xt::abs(xt::view(after, 0, 6) - xt::view(before, 0, 6)))() > 1e-3);
}

TEST_CASE("with MLP inputs of a few units (c_fc × 20), the GELU is the exact erf GELU") {
    // The fixtures' MLP inputs are 0.1 to 0.3, where GPT-2's tanh approximation of GELU,
    // 0.5·u·(1 + tanh(√(2/π)·(u + 0.044715·u³))), is within 3e-6 of the exact
    // 0.5·u·(1 + erf(u/√2)); scaled by 20 they reach a few units, where the two differ by
    // up to 4.7e-4 (at u = −2.7). The library's GELU is the exact one: the block's output
    // then moves by 7e-5 with the tanh form, and stays within 3e-7 with the exact one.
    Fixture f = load_fixture("bias");
    attn::GPT& m = f.model;
    const attn::GPTConfig& c = m.config();
    const int B = f.B, T = f.T, C = c.n_embd;
    const attn::ParameterTensors& p = m.params();
    const std::size_t fc_size = static_cast<std::size_t>(c.n_layer) * 4 * C * C;
    for (std::size_t i = 0; i < fc_size; ++i) p.fcw[i] *= 20.0f;
    m.forward(f.x, {}, B, T);
    const attn::Activations& a = m.activations();
    const Tensor3 expected = as_tensor(a.residual3.data(), B, T, C);
    INFO("the MLP's inputs are a few units here: use the exact GELU, 0.5·u·(1 + erf(u/√2)), "
         "not GPT-2's tanh approximation");
    CHECK_CLOSE(block_forward(as_tensor(a.encoded.data(), B, T, C), layer(m, 0), c.n_head),
                expected, parity_tol);
}

TEST_CASE("one head, heads of one channel, one token and one sequence: the library's stream") {
    // The fixtures have 2 or 4 heads of 4 to 16 channels and several tokens: here C = 8 in
    // one head of 8 channels or 8 heads of 1, over B·T = 1·1 and 3·4 tokens.
    for (int n_head : {1, 8}) {
        for (const auto& [B, T] : {std::pair<int, int>{1, 1}, {3, 4}}) {
            CAPTURE(n_head);
            CAPTURE(B);
            CAPTURE(T);
            attn::GPTConfig config;
            config.vocab_size = 13;
            config.block_size = 4;
            config.n_layer = 1;
            config.n_head = n_head;
            config.n_embd = 8;
            attn::GPT m(config, 7);
            m.train(false);
            attn::Rng rng(static_cast<std::uint64_t>(n_head * 10 + B));
            std::vector<int> tokens(static_cast<std::size_t>(B * T));
            for (int& t : tokens) t = static_cast<int>(rng.below(13));
            m.forward(tokens, {}, B, T);
            const attn::Activations& a = m.activations();
            CHECK_CLOSE(block_forward(as_tensor(a.encoded.data(), B, T, 8), layer(m, 0), n_head),
                        as_tensor(a.residual3.data(), B, T, 8), parity_tol);
        }
    }
}

TEST_CASE("property: for any heads, widths, biases and input scales, a token moves no earlier position and no other sequence") {
    // 1, 2 or 4 heads of 1 to 4 channels, with or without biases, B from 1 to 3, T from 1 to
    // 8, inputs N(0, σ) with σ from 10^−2 to 10^2, then one token (b', t') changed. A block is
    // causal and keeps sequences apart, so each output at (b, t) with b ≠ b' or t < t' must
    // stay exactly as it was (the same numbers through the same operations; LayerNorm and
    // the MLP work on one position at a time).
    attn::check_property("block_forward is causal and keeps sequences apart", [] {
        attn::GPTConfig config;
        config.vocab_size = 5;
        config.block_size = 8;
        config.n_layer = 1;
        config.n_head = *rc::gen::element(1, 2, 4);
        config.n_embd = config.n_head * *rc::gen::inRange(1, 5);
        config.bias = *rc::gen::arbitrary<bool>();
        attn::GPT m(config, *rc::gen::inRange<std::uint64_t>(1, 1000));
        const std::size_t B = *rc::gen::inRange<std::size_t>(1, 4), T = *rc::gen::inRange<std::size_t>(1, 9),
                          C = static_cast<std::size_t>(config.n_embd);
        const float sigma = std::pow(10.0f, static_cast<float>(*rc::gen::inRange(-2, 3)));
        attn::Rng rng(*rc::gen::inRange<std::uint64_t>(0, 1000000));
        Tensor3 x = rng.normal_tensor<3>({B, T, C}, 0.0f, sigma);
        const Tensor3 before = block_forward(x, layer(m, 0), config.n_head);
        const std::size_t b1 = *rc::gen::inRange<std::size_t>(0, B), t1 = *rc::gen::inRange<std::size_t>(0, T);
        for (std::size_t c = 0; c < C; ++c) x(b1, t1, c) += sigma * (c % 2 ? 3.0f : -2.0f);
        const Tensor3 after = block_forward(x, layer(m, 0), config.n_head);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < T; ++t)
                if (b != b1 || t < t1)
                    for (std::size_t c = 0; c < C; ++c) RC_ASSERT(after(b, t, c) == before(b, t, c));
    });
}

TEST_CASE("a head count that does not divide the width is refused, naming both") {
    Fixture f = load_fixture("bias");  // C = 32
    attn::Rng rng(4);
    const Tensor3 x = rng.normal_tensor<3>({1, 3, 32});
    try {
        (void)block_forward(x, layer(f.model, 0), 5);
        FAIL("block_forward(n_head = 5) on C = 32 channels returned instead of throwing");
    } catch (const std::invalid_argument& e) {
        const std::string what = e.what();
        CHECK_MESSAGE(what.find("32") != std::string::npos, "the message names C = 32: " << what);
        CHECK_MESSAGE(what.find('5') != std::string::npos, "the message names n_head = 5: " << what);
    }
    CHECK_THROWS_AS((void)block_forward(x, layer(f.model, 0), 0), std::invalid_argument);
    INFO("32 % -2 == 0 in C++, but -2 is no number of heads: n_head must be at least 1");
    CHECK_THROWS_AS((void)block_forward(x, layer(f.model, 0), -2), std::invalid_argument);
}
