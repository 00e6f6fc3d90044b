// Checks for exercise 09: one transformer block's forward pass.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for any heads, widths, biases and input scales, a token moves no earlier position and no other sequence
// - tokens at any offset with any spread give the float64 block's output
// - every head count below 1, and every one that does not divide C, is refused
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/checkpoint.hpp"
#include "attn/families.hpp"
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
#include <climits>
#include <cmath>
#include <filesystem>
#include <sstream>
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

// The block in float64, written from nanoGPT's Block.forward independently of the library
// (an independent reference for the offsets checks): x (N = B·T rows of C) in, the block's
// output out, all in double from the same float weights.
using Rows = std::vector<double>;  // (N, width), row-major

Rows layernorm64(const Rows& x, std::size_t N, std::size_t C, const float* weight, const float* bias) {
    Rows y(N * C);
    for (std::size_t r = 0; r < N; ++r) {
        double mean = 0.0, var = 0.0;
        for (std::size_t c = 0; c < C; ++c) mean += x[r * C + c];
        mean /= static_cast<double>(C);
        for (std::size_t c = 0; c < C; ++c) var += (x[r * C + c] - mean) * (x[r * C + c] - mean);
        var /= static_cast<double>(C);
        const double rstd = 1.0 / std::sqrt(var + 1e-5);
        for (std::size_t c = 0; c < C; ++c)
            y[r * C + c] = (x[r * C + c] - mean) * rstd * weight[c] + (bias ? bias[c] : 0.0);
    }
    return y;
}

// y = x·Wᵀ + b with W (out, in), PyTorch's layout.
Rows linear64(const Rows& x, std::size_t N, std::size_t in, std::size_t out, const float* w, const float* b) {
    Rows y(N * out);
    for (std::size_t r = 0; r < N; ++r)
        for (std::size_t o = 0; o < out; ++o) {
            double acc = b ? b[o] : 0.0;
            for (std::size_t i = 0; i < in; ++i) acc += x[r * in + i] * w[o * in + i];
            y[r * out + o] = acc;
        }
    return y;
}

// Causal multi-head attention of qkv (N, 3C): head h reads channels h·hs … (h+1)·hs − 1 of
// each third, scores scaled by 1/√hs; the heads' outputs side by side, (N, C).
Rows attention64(const Rows& qkv, std::size_t B, std::size_t T, std::size_t C, std::size_t NH) {
    const std::size_t hs = C / NH;
    Rows y(B * T * C, 0.0);
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t h = 0; h < NH; ++h)
            for (std::size_t i = 0; i < T; ++i) {
                const double* q = &qkv[((b * T + i) * 3) * C + h * hs];
                std::vector<double> s(i + 1);
                double m = -INFINITY, z = 0.0;
                for (std::size_t j = 0; j <= i; ++j) {
                    const double* k = &qkv[((b * T + j) * 3) * C + C + h * hs];
                    double dot = 0.0;
                    for (std::size_t c = 0; c < hs; ++c) dot += q[c] * k[c];
                    s[j] = dot / std::sqrt(static_cast<double>(hs));
                    m = std::max(m, s[j]);
                }
                for (std::size_t j = 0; j <= i; ++j) z += s[j] = std::exp(s[j] - m);
                for (std::size_t j = 0; j <= i; ++j) {
                    const double* v = &qkv[((b * T + j) * 3) * C + 2 * C + h * hs];
                    for (std::size_t c = 0; c < hs; ++c) y[(b * T + i) * C + h * hs + c] += s[j] / z * v[c];
                }
            }
    return y;
}

Rows block64(const Tensor3& x, const BlockWeights& w, std::size_t NH) {
    const std::size_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2], N = B * T;
    Rows h(x.begin(), x.end());
    const Rows att = linear64(attention64(linear64(layernorm64(h, N, C, w.ln_1_weight, w.ln_1_bias), N, C,
                                                   3 * C, w.attn_c_attn_weight, w.attn_c_attn_bias),
                                          B, T, C, NH),
                              N, C, C, w.attn_c_proj_weight, w.attn_c_proj_bias);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += att[i];
    Rows fc = linear64(layernorm64(h, N, C, w.ln_2_weight, w.ln_2_bias), N, C, 4 * C, w.mlp_c_fc_weight,
                       w.mlp_c_fc_bias);
    for (double& u : fc) u = 0.5 * u * (1.0 + std::erf(u / std::sqrt(2.0)));
    const Rows mlp = linear64(fc, N, 4 * C, C, w.mlp_c_proj_weight, w.mlp_c_proj_bias);
    for (std::size_t i = 0; i < h.size(); ++i) h[i] += mlp[i];
    return h;
}

// Switches one branch off: its output projection's weight and bias set to 0, so that it adds
// exactly 0 to the residual stream (as in the first check).
void zero_projection(attn::GPT& m, bool attention_branch) {
    const attn::ParameterTensors& p = m.params();
    const std::size_t C = static_cast<std::size_t>(m.config().n_embd);
    float* w = attention_branch ? p.attprojw : p.fcprojw;
    float* b = attention_branch ? p.attprojb : p.fcprojb;
    std::fill(w, w + C * (attention_branch ? C : 4 * C), 0.0f);
    if (b) std::fill(b, b + C, 0.0f);
}

// Tokens far from 0 with a small spread: offset + d, with d ~ N(0, σ) and offset both on the
// grid of 2^-k (k the largest for which every partial sum of a row, ≤ C·(|offset| + 5σ),
// still fits float's 24 bits), so that x + offset and a two-pass mean are exact in float.
Tensor3 offset_tokens(attn::Rng& rng, std::size_t B, std::size_t T, std::size_t C, float offset, float sigma) {
    // (+ 1 per entry: room for the spread's floor of 4 grid steps, clamped at 4 spreads)
    const double largest = static_cast<double>(C) * (std::abs(offset) + 5.0 * sigma + 1.0);
    const double grid = std::ldexp(1.0, -static_cast<int>(std::floor(std::log2(std::ldexp(1.0, 24) / largest))));
    const double spread = std::max<double>(sigma, 4 * grid);
    const double centre = std::round(offset / grid) * grid;
    Tensor3 x = rng.normal_tensor<3>({B, T, C});
    for (float& e : x) {
        const double d = std::clamp(static_cast<double>(e), -4.0, 4.0) * spread;
        e = static_cast<float>(centre + std::round(d / grid) * grid);
    }
    return x;
}

// What the block added to each entry, out − x, computed in double (exact), against what the
// float64 block added. With one branch switched off, the other branch is added once: out =
// fl(x + branch) rounds by ½ulp(|out|) ≤ ulp(|the reference|), and the branch itself is computed in float from LN
// outputs that are exact (the grid above) up to the variance's γ_C: within parity_tol, as
// for the ordinary inputs above. A LayerNorm whose variance is E[x²] − mean² in float
// cancels all but noise here (x² ≈ 10^6 is stored to ±0.03, the variance is ~10^-2): NaN,
// or branches off by their own size.
std::string added_mismatch(const Tensor3& got, const Tensor3& x, const Rows& reference) {
    if (got.shape() != x.shape()) return "shape " + attn::shape_of(got) + ", expected " + attn::shape_of(x);
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double added = static_cast<double>(got.flat(i)) - x.flat(i);
        const double expected = reference[i] - x.flat(i);
        // ½ulp(|out|) ≤ ulp(|reference|): out may round into the binade above
        const double tol = std::ldexp(1.0, std::ilogb(std::max(std::abs(reference[i]), 1e-30)) - 23) + parity_tol;
        if (!(std::abs(added - expected) <= tol)) {
            std::ostringstream o;
            o << "at " << attn::check::index_string(i, {x.shape()[0], x.shape()[1], x.shape()[2]})
              << ": x = " << x.flat(i) << ", the block added " << added << ", expected " << expected
              << " (tolerance " << tol << ")";
            return o.str();
        }
    }
    return "";
}

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
    // 8 (1 a quarter of the time), inputs N(0, σ) with σ from 10^−2 to 10^3, then one token
    // (b', t') changed. A block is causal and keeps sequences apart, so each output at (b, t)
    // with b ≠ b' or t < t' must stay exactly as it was (the same numbers through the same operations; LayerNorm and
    // the MLP work on one position at a time).
    attn::check_property("block_forward is causal and keeps sequences apart", [] {
        attn::GPTConfig config;
        config.vocab_size = 5;
        config.block_size = 8;
        config.n_layer = 1;
        config.n_head = attn::draw("n_head", rc::gen::element(1, 2, 4));
        config.n_embd = config.n_head * attn::draw("hs", rc::gen::inRange(1, 5));
        config.bias = attn::draw("bias", rc::gen::arbitrary<bool>());
        attn::GPT m(config, attn::draw("model seed", rc::gen::inRange<std::uint64_t>(1, 1000)));
        const std::size_t B = attn::draw("B", attn::family::length(3)), T = attn::draw("T", attn::family::length(8)),
                          C = static_cast<std::size_t>(config.n_embd);
        const float sigma = std::abs(attn::draw("sigma", attn::family::magnitude(-2, 3)));
        attn::Rng rng(attn::draw("input seed", rc::gen::inRange<std::uint64_t>(0, 1000000)));
        Tensor3 x = rng.normal_tensor<3>({B, T, C}, 0.0f, sigma);
        const Tensor3 before = block_forward(x, layer(m, 0), config.n_head);
        const std::size_t b1 = attn::draw("changed b", rc::gen::inRange<std::size_t>(0, B)),
                          t1 = attn::draw("changed t", rc::gen::inRange<std::size_t>(0, T));
        for (std::size_t c = 0; c < C; ++c) x(b1, t1, c) += sigma * (c % 2 ? 3.0f : -2.0f);
        const Tensor3 after = block_forward(x, layer(m, 0), config.n_head);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < T; ++t)
                if (b != b1 || t < t1)
                    for (std::size_t c = 0; c < C; ++c) RC_ASSERT(after(b, t, c) == before(b, t, c));
    });
}

TEST_CASE("tokens far from zero with a small spread: LayerNorm does not cancel (against a float64 block)") {
    // The residual stream at 1000 ± 0.1 and −3000 ± 0.25 (a spread 10^4 times smaller than
    // the offset), each branch in turn switched off so that the other is checked alone:
    // nanoGPT's layer 0 (C = 32, NH = 2, biases) against the block in float64. Tolerance:
    // see added_mismatch (ulp(|out|), 6.1e-5 or 2.4e-4 here, plus parity_tol).
    struct Case {
        float offset, sigma;
    };
    attn::Rng rng(21);
    for (const Case& c : {Case{1000.0f, 0.1f}, Case{-3000.0f, 0.25f}})
        for (bool attention_off : {true, false}) {
            CAPTURE(c.offset);
            CAPTURE(c.sigma);
            CAPTURE(attention_off);
            Fixture f = load_fixture("bias");
            zero_projection(f.model, attention_off);
            const int NH = f.model.config().n_head;
            const Tensor3 x = offset_tokens(rng, 2, 5, 32, c.offset, c.sigma);
            const std::string mismatch = added_mismatch(block_forward(x, layer(f.model, 0), NH), x,
                                                        block64(x, layer(f.model, 0), static_cast<std::size_t>(NH)));
            INFO("every token is " << c.offset << " plus a spread of " << c.sigma
                 << ": LayerNorm's variance must be the mean of (x − mean)², computed after the mean; "
                    "E[x²] − mean² in float subtracts two numbers near "
                 << static_cast<double>(c.offset) * c.offset << " and keeps only rounding noise");
            CHECK_MESSAGE(mismatch.empty(), mismatch);
        }
}

TEST_CASE("property: tokens at any offset with any spread give the float64 block's output") {
    // 1, 2 or 4 heads of 1, 2 or 4 channels (C a power of two, so that the mean's division
    // is exact), with or without biases, B from 1 to 3, T from 1 to 8; every token a common
    // offset (0, ±1 … ±10^4) plus N(0, σ), σ from 10^−2 to 10^2, on the grid that keeps
    // LayerNorm's sums exact (offset_tokens); one branch switched off in turn. Against the
    // block in float64, within added_mismatch's tolerance (ulp(|out|) + parity_tol).
    attn::check_property("block_forward equals the float64 block at any offset", [] {
        attn::GPTConfig config;
        config.vocab_size = 5;
        config.block_size = 8;
        config.n_layer = 1;
        config.n_head = attn::draw("n_head", rc::gen::element(1, 2, 4));
        config.n_embd = config.n_head * attn::draw("hs", rc::gen::element(1, 2, 4));
        config.bias = attn::draw("bias", rc::gen::arbitrary<bool>());
        attn::GPT m(config, attn::draw("model seed", rc::gen::inRange<std::uint64_t>(1, 1000)));
        const std::size_t B = attn::draw("B", attn::family::length(3)), T = attn::draw("T", attn::family::length(8)),
                          C = static_cast<std::size_t>(config.n_embd);
        const float offset = attn::draw("offset", attn::family::offset());
        const float sigma = std::abs(attn::draw("sigma", attn::family::magnitude(-2, 2)));
        const bool attention_off = attn::draw("attention branch switched off (else the MLP's)", rc::gen::arbitrary<bool>());
        zero_projection(m, attention_off);
        attn::Rng rng(attn::draw("input seed", rc::gen::inRange<std::uint64_t>(0, 1000000)));
        const Tensor3 x = offset_tokens(rng, B, T, C, offset, sigma);
        const std::string mismatch = added_mismatch(block_forward(x, layer(m, 0), config.n_head), x,
                                                    block64(x, layer(m, 0), static_cast<std::size_t>(config.n_head)));
        if (!mismatch.empty()) RC_FAIL(mismatch);
    }, 100);
}

TEST_CASE("property: every head count below 1, and every one that does not divide C, is refused") {
    // C = 32 channels; n_head 0, −1, −2, −10^6 or very negative (family::below(1)), or 0, 3,
    // 5, 6, 7, 9 … 65 but for 8, 16, 32 (a count that does not divide 32).
    Fixture f = load_fixture("bias");
    attn::Rng rng(5);
    const Tensor3 x = rng.normal_tensor<3>({1, 3, 32});
    const BlockWeights w = layer(f.model, 0);
    attn::check_property("block_forward refuses every head count that is not a divisor of C", [&] {
        const bool negative = attn::draw("below 1 (else not a divisor)", rc::gen::arbitrary<bool>());
        const int n_head =
            negative ? static_cast<int>(std::max<long>(attn::draw("n_head", attn::family::below(1)), INT_MIN))
                     : static_cast<int>(attn::draw("n_head", attn::family::not_dividing(32)));
        RC_ASSERT(attn::refused([&] { (void)block_forward(x, w, n_head); }));
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
