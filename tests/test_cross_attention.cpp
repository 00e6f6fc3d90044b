// Attention between two sequences: key padding masks, causal masks with T_q != T_k in both
// alignments, the general attention's backward pass, and the flat masked attention layer of
// cross_attention.hpp; against hand-worked masks, finite differences, PyTorch
// (tools/reference/make_cross_attention_fixtures.py) and each other.
#include "attn/fixtures.hpp"
#include "attn/check.hpp"
#include "attn/cross_attention.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/gradcheck.hpp"
#include "attn/npy.hpp"
#include "attn/random.hpp"
#include "attn/sdpa.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

using namespace attn;

namespace {

const std::filesystem::path fixtures = attn::fixtures_dir() / "cross_attention";

// Tolerance against PyTorch: the references are float64 from float32 inputs, rounded to
// float32 (u of each value), so only our own rounding counts: γ_n Σ|a_i b_i| per n-term sum
// against the exact value (Higham, γ_n = n u/(1 − n u), u = 2^-24). functional_*: hs = 4,
// T_k = 5, |q|, |k|, |v| ≤ 3.3. Each score is off by δ = γ_4 max_j Σ_c |q_c k_jc|/√hs
// (max over the data 4.3, so δ ≤ 1.0e-6); each weight by w (2δ + γ_5 + 4u) ≤ 2.6e-6 (w ≤ 1);
// each output by that plus γ_5 relative, times Σ_j w_j |v_j| ≤ max|v| = 2.85: ≤ 8.3e-6. The
// gradients (|dq|, |dk|, |dv| ≤ 2.4, sums of ≤ 5 terms through dP = dout·v, n = 3, and
// dS = w (dP − D)) carry the same few γ_5 relative, ~5e-6 at these sizes. mha (C = 8, N = 6
// rows; largest gradient 6.4 = dout_proj.weight, a 6-term sum: γ_6·6.4 ≈ 2.3e-6 plus the
// inputs' own error). 1e-5 sits above each of these worst cases (by 1.2× for the outputs,
// the tightest); a key not masked, or the wrong causal alignment, moves weights by O(0.1).
// 1e-5 is also llm.c's bar (and the course's) for float32 against PyTorch.
constexpr double parity_tol = 1e-5;

std::vector<std::size_t> lengths_of(const std::filesystem::path& file) {
    const NpyArray a = read_npy(file);
    return std::vector<std::size_t>(a.data.begin(), a.data.end());
}

std::string drawn(const Mask<2>& m) {
    std::string s;
    for (std::size_t i = 0; i < m.shape()[0]; ++i) {
        for (std::size_t j = 0; j < m.shape()[1]; ++j) s += m(i, j) ? 'x' : '.';
        s += '\n';
    }
    return s;
}

}  // namespace

TEST_CASE("the two causal alignments with 3 queries and 5 keys, drawn by hand") {
    // top-left: query i sees keys 0..i (PyTorch's is_causal, torch.tril(ones(3, 5)))
    CHECK(drawn(causal_mask(3, 5, CausalAlignment::top_left)) == "x....\nxx...\nxxx..\n");
    // bottom-right: query i sees keys 0..i + 2, the last query every key (FlashAttention 2.1)
    CHECK(drawn(causal_mask(3, 5, CausalAlignment::bottom_right)) == "xxx..\nxxxx.\nxxxxx\n");
    // more queries than keys: bottom-right leaves the first T_q − T_k queries with no key
    CHECK(drawn(causal_mask(4, 2, CausalAlignment::bottom_right)) == "..\n..\nx.\nxx\n");
    CHECK(drawn(causal_mask(4, 2, CausalAlignment::top_left)) == "x.\nxx\nxx\nxx\n");
    // FlashAttention's own examples (flash_attn_func's docstring, from 2.1): seqlen_q = 2,
    // seqlen_k = 5 keeps 1 1 1 1 0 / 1 1 1 1 1; seqlen_q = 5, seqlen_k = 2 keeps
    // 0 0 / 0 0 / 0 0 / 1 0 / 1 1
    CHECK(drawn(causal_mask(2, 5, CausalAlignment::bottom_right)) == "xxxx.\nxxxxx\n");
    CHECK(drawn(causal_mask(5, 2, CausalAlignment::bottom_right)) == "..\n..\n..\nx.\nxx\n");
    // PyTorch's own examples (torch.nn.attention.bias.CausalVariant's documentation), shape
    // (3, 4): upper left [[1,0,0,0],[1,1,0,0],[1,1,1,0]], lower right [[1,1,0,0],[1,1,1,0],[1,1,1,1]]
    CHECK(drawn(causal_mask(3, 4, CausalAlignment::top_left)) == "x...\nxx..\nxxx.\n");
    CHECK(drawn(causal_mask(3, 4, CausalAlignment::bottom_right)) == "xx..\nxxx.\nxxxx\n");
    // T_q = T_k: both are the lower triangle, and no alignment is needed
    CHECK(causal_mask(4, 4, CausalAlignment::top_left) == causal_mask(4));
    CHECK(causal_mask(4, 4, CausalAlignment::bottom_right) == causal_mask(4));
    CHECK(causal_mask(4, 4) == causal_mask(4));
}

TEST_CASE("a causal mask with T_q != T_k and no alignment is refused, naming both") {
    CHECK_THROWS_WITH_AS(causal_mask(3, 5), doctest::Contains("top_left"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(causal_mask(3, 5, CausalAlignment::unspecified),
                         doctest::Contains("bottom_right"), std::invalid_argument);
    CHECK_THROWS_AS(causal_last_key(0, 2, 7, CausalAlignment::unspecified), std::invalid_argument);
    CHECK_THROWS_AS(causal_mask(0, 3, CausalAlignment::top_left), std::invalid_argument);
    // the flat layer refuses it too, before computing anything
    std::vector<float> q(2 * 4), kv(3 * 8), out(2 * 4), att(2 * 3);
    CHECK_THROWS_AS(masked_attention_forward(out.data(), att.data(),
                                             {q.data(), kv.data(), kv.data() + 4, 4, 8},
                                             {nullptr, true}, 1, 2, 3, 4, 1),
                    std::invalid_argument);
}

TEST_CASE("a key padding mask is true on the real keys, shaped to broadcast over queries and heads") {
    const Mask<4> m = key_padding_mask<4>({3, 0, 5}, 5);
    REQUIRE(m.shape()[0] == 3);
    CHECK(m.shape()[1] == 1);
    CHECK(m.shape()[2] == 1);
    CHECK(m.shape()[3] == 5);
    const bool expected[3][5] = {{true, true, true, false, false},
                                 {false, false, false, false, false},
                                 {true, true, true, true, true}};
    for (std::size_t b = 0; b < 3; ++b)
        for (std::size_t j = 0; j < 5; ++j) {
            CAPTURE(b);
            CAPTURE(j);
            CHECK(m(b, 0, 0, j) == expected[b][j]);
        }
    CHECK(key_padding_mask<3>({2}, 4) == Mask<3>({{{true, true, false, false}}}));
    CHECK_THROWS_WITH_AS(key_padding_mask<3>({2, 6}, 5), doctest::Contains("6 tokens"),
                         std::invalid_argument);
    CHECK_THROWS_AS(key_padding_mask<3>({}, 5), std::invalid_argument);
}

TEST_CASE("a padded batch gives each sequence exactly what it gets alone") {
    // The rule a key padding mask exists for: sequence b's outputs at its real positions do
    // not depend on how much padding the batch added, nor on what the padding holds.
    Rng rng(170);
    const std::size_t NH = 2, T_k = 6, d = 4;
    const std::vector<std::size_t> lengths = {6, 3, 1};
    Tensor4 q = rng.normal_tensor<4>({3, NH, 4, d}), k = rng.normal_tensor<4>({3, NH, T_k, d}),
            v = rng.normal_tensor<4>({3, NH, T_k, d});
    for (std::size_t b = 0; b < 3; ++b)  // padding full of huge values: must not matter
        for (std::size_t h = 0; h < NH; ++h)
            for (std::size_t j = lengths[b]; j < T_k; ++j)
                for (std::size_t c = 0; c < d; ++c) k(b, h, j, c) = v(b, h, j, c) = 1e4f;
    const Tensor4 batched = scaled_dot_product_attention(q, k, v, key_padding_mask<4>(lengths, T_k));
    for (std::size_t b = 0; b < 3; ++b) {
        CAPTURE(b);
        const std::size_t n = lengths[b];
        Tensor3 qb = xt::view(q, b), kb = xt::view(k, b, xt::all(), xt::range(0, n)),
                vb = xt::view(v, b, xt::all(), xt::range(0, n));
        const Tensor3 alone = scaled_dot_product_attention(qb, kb, vb);  // no padding, no mask
        const Tensor3 mine = xt::view(batched, b);
        // the same sums over the same real keys: equal to float rounding (a few ulps of O(1))
        CHECK_CLOSE(mine, alone, 1e-6);
    }
}

TEST_CASE("a context that is all padding gives zero weights and a zero output, never NaN") {
    Rng rng(171);
    const Tensor4 q = rng.normal_tensor<4>({2, 2, 3, 4}), k = rng.normal_tensor<4>({2, 2, 5, 4}),
                  v = rng.normal_tensor<4>({2, 2, 5, 3});
    Tensor4 w;
    const Tensor4 out = scaled_dot_product_attention(q, k, v, key_padding_mask<4>({5, 0}, 5), &w);
    for (std::size_t h = 0; h < 2; ++h)
        for (std::size_t i = 0; i < 3; ++i) {
            for (std::size_t j = 0; j < 5; ++j) CHECK(w(1, h, i, j) == 0.0f);
            for (std::size_t c = 0; c < 3; ++c) CHECK(out(1, h, i, c) == 0.0f);
        }
    // and no gradient flows through it: a fully masked row reached no key
    const Tensor4 dout = rng.normal_tensor<4>({2, 2, 3, 3});
    const AttentionGradients<4> g = scaled_dot_product_attention_backward(dout, q, k, v, w);
    for (std::size_t h = 0; h < 2; ++h) {
        for (std::size_t i = 0; i < 3; ++i)
            for (std::size_t c = 0; c < 4; ++c) CHECK(g.dq(1, h, i, c) == 0.0f);
        for (std::size_t j = 0; j < 5; ++j)
            for (std::size_t c = 0; c < 3; ++c) CHECK(g.dv(1, h, j, c) == 0.0f);
    }
    CHECK(xt::all(xt::isfinite(g.dq)));
    CHECK(xt::all(xt::isfinite(g.dk)));
    // the flat layer: the same zeros
    const int B = 2, T_q = 3, T_k = 5, C = 4, NH = 2;
    std::vector<float> qf = normal_vector(rng, B * T_q * C), kvf = normal_vector(rng, B * T_k * 2 * C);
    std::vector<float> outf(B * T_q * C, 1.0f), att(B * NH * T_q * T_k, 1.0f);
    const int lengths[2] = {3, 0};
    masked_attention_forward(outf.data(), att.data(), {qf.data(), kvf.data(), kvf.data() + C, C, 2 * C},
                             {lengths, false}, B, T_q, T_k, C, NH);
    for (int i = T_q * C; i < B * T_q * C; ++i) CHECK(outf[static_cast<std::size_t>(i)] == 0.0f);
    for (std::size_t i = NH * T_q * T_k; i < att.size(); ++i) CHECK(att[i] == 0.0f);
}

TEST_CASE("the general attention's backward agrees with finite differences, padded and causal") {
    Rng rng(172);
    const std::size_t B = 2, NH = 2, T_q = 3, T_k = 5, d = 4, dv = 3;
    Tensor4 q = rng.normal_tensor<4>({B, NH, T_q, d}), k = rng.normal_tensor<4>({B, NH, T_k, d}),
            v = rng.normal_tensor<4>({B, NH, T_k, dv});
    const Tensor4 w_out = rng.normal_tensor<4>({B, NH, T_q, dv});
    for (CausalAlignment a : {CausalAlignment::top_left, CausalAlignment::bottom_right}) {
        CAPTURE(alignment_name(a));
        const Mask<4> mask = key_padding_mask<4>({5, 4}, T_k) && causal_mask(T_q, T_k, a);
        Tensor4 weights;
        scaled_dot_product_attention(q, k, v, mask, &weights);
        const AttentionGradients<4> g = scaled_dot_product_attention_backward(w_out, q, k, v, weights);
        auto objective = [&] {
            const Tensor4 out = scaled_dot_product_attention(q, k, v, mask);
            double s = 0.0;
            for (std::size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out.flat(i)) * w_out.flat(i);
            return s;
        };
        // step 1e-2 and 1e-3 tolerance: the reasoning of test_gpt_layers.cpp (float outputs
        // summed in double, truncation h²/6·f''')
        for (auto [name, x, grad] : {std::tuple{"dq", &q, &g.dq}, std::tuple{"dk", &k, &g.dk},
                                     std::tuple{"dv", &v, &g.dv}}) {
            CAPTURE(name);
            const GradCheck r = finite_difference(x->data(), grad->data(), x->size(), 1e-2f, objective);
            CHECK(r.max_abs_error <= 1e-3);
            CHECK(r.max_abs_grad > 1e-3);
        }
    }
}

TEST_CASE("key padding and both causal alignments match PyTorch written out, forward and gradients") {
    for (const char* name : {"padding", "top_left", "bottom_right"}) {
        CAPTURE(name);
        const std::filesystem::path dir = fixtures / (std::string("functional_") + name);
        const Tensor4 q = load_npy<4>(dir / "q.npy"), k = load_npy<4>(dir / "k.npy"),
                      v = load_npy<4>(dir / "v.npy"), dout = load_npy<4>(dir / "dout.npy");
        const std::size_t T_q = q.shape()[2], T_k = k.shape()[2];
        Mask<4> mask = key_padding_mask<4>(lengths_of(dir / "lengths.npy"), T_k);
        if (std::string(name) == "top_left") mask = mask && causal_mask(T_q, T_k, CausalAlignment::top_left);
        if (std::string(name) == "bottom_right")
            mask = mask && causal_mask(T_q, T_k, CausalAlignment::bottom_right);
        Tensor4 weights;
        const Tensor4 out = scaled_dot_product_attention(q, k, v, mask, &weights);
        CHECK_CLOSE(out, load_npy<4>(dir / "out.npy"), parity_tol);
        CHECK_CLOSE(weights, load_npy<4>(dir / "weights.npy"), parity_tol);
        const AttentionGradients<4> g = scaled_dot_product_attention_backward(dout, q, k, v, weights);
        CHECK_CLOSE(g.dq, load_npy<4>(dir / "dq.npy"), parity_tol);
        CHECK_CLOSE(g.dk, load_npy<4>(dir / "dk.npy"), parity_tol);
        CHECK_CLOSE(g.dv, load_npy<4>(dir / "dv.npy"), parity_tol);
    }
}

TEST_CASE("the flat masked attention equals the general attention on every mask it takes") {
    // Two implementations of one function: the flat layer (strided buffers, the mask from
    // lengths and an alignment) and scaled_dot_product_attention (a boolean mask built with
    // key_padding_mask and causal_mask). Every combination of the options the layer accepts.
    Rng rng(173);
    const int B = 3, C = 8, NH = 2, hs = C / NH;
    for (int T_q : {2, 4, 6}) {
        const int T_k = 4;
        for (int causal = 0; causal < 3; ++causal) {
            const CausalAlignment a = causal == 2 ? CausalAlignment::bottom_right : CausalAlignment::top_left;
            for (bool padded : {false, true}) {
                CAPTURE(T_q);
                CAPTURE(causal);
                CAPTURE(padded);
                const int lengths[3] = {4, 2, 0};
                std::vector<float> qf = normal_vector(rng, static_cast<std::size_t>(B * T_q * C));
                std::vector<float> kvf = normal_vector(rng, static_cast<std::size_t>(B * T_k * 2 * C));
                std::vector<float> out(static_cast<std::size_t>(B * T_q * C)),
                    att(static_cast<std::size_t>(B * NH * T_q * T_k));
                masked_attention_forward(out.data(), att.data(),
                                         {qf.data(), kvf.data(), kvf.data() + C, C, 2 * C},
                                         {padded ? lengths : nullptr, causal > 0, a}, B, T_q, T_k, C, NH);
                // the same numbers as (B, NH, T, hs) tensors
                Tensor4 q({std::size_t(B), std::size_t(NH), std::size_t(T_q), std::size_t(hs)}),
                    k({std::size_t(B), std::size_t(NH), std::size_t(T_k), std::size_t(hs)}), v(k.shape());
                for (int b = 0; b < B; ++b)
                    for (int h = 0; h < NH; ++h)
                        for (int c = 0; c < hs; ++c) {
                            for (int i = 0; i < T_q; ++i)
                                q(b, h, i, c) = qf[static_cast<std::size_t>((b * T_q + i) * C + h * hs + c)];
                            for (int j = 0; j < T_k; ++j) {
                                const std::size_t row = static_cast<std::size_t>((b * T_k + j) * 2 * C);
                                k(b, h, j, c) = kvf[row + static_cast<std::size_t>(h * hs + c)];
                                v(b, h, j, c) = kvf[row + static_cast<std::size_t>(C + h * hs + c)];
                            }
                        }
                Mask<4> mask = xt::ones<bool>({std::size_t(B), std::size_t(1), std::size_t(1), std::size_t(T_k)});
                if (padded) mask = key_padding_mask<4>({4, 2, 0}, static_cast<std::size_t>(T_k));
                if (causal > 0) mask = mask && causal_mask(static_cast<std::size_t>(T_q), static_cast<std::size_t>(T_k), a);
                Tensor4 w;
                const Tensor4 expected = scaled_dot_product_attention(q, k, v, mask, &w);
                // float32 both, sums in another order. Two orders of an n-term sum differ by
                // at most 2γ_n Σ|a_i b_i| (Higham, γ_n = n u/(1 − n u), u = 2^-24): each
                // score by δ = 2γ_hs max_j Σ_c |q_c k_jc|/√hs (hs = 4: ~1e-6), which moves
                // each softmax weight by at most w (2δ + 2γ_T_k + 10u) (e^(±2δ); on each side
                // an exponential of ≤ 2 ulp, the T_k-term sum and the division), and each
                // output by that plus the output sum's own 2γ_T_k, times Σ_j w_j |v_jc|.
                // Computed per row from the data: ~5e-6 for the largest values.
                // A wrong mask or alignment moves a weight by O(0.1).
                const double u = std::ldexp(1.0, -24);
                auto two_gamma = [u](int n) { return 2.0 * n * u / (1.0 - n * u); };
                double excess = 0.0;  // the largest difference over its bound (pass: ≤ 1)
                auto over = [&](double ours, double theirs, double bound) {
                    const double gap = std::fabs(ours - theirs);
                    if (gap > 0.0) excess = std::max(excess, gap / bound);
                };
                for (int b = 0; b < B; ++b)
                    for (int h = 0; h < NH; ++h)
                        for (int i = 0; i < T_q; ++i) {
                            double terms = 0.0;  // max_j Σ_c |q_c k_jc| / √hs
                            for (int j = 0; j < T_k; ++j) {
                                double sum = 0.0;
                                for (int c = 0; c < hs; ++c) sum += std::fabs(double(q(b, h, i, c)) * k(b, h, j, c));
                                terms = std::max(terms, sum / std::sqrt(double(hs)));
                            }
                            const double weight_error = 2.0 * two_gamma(hs) * terms + two_gamma(T_k) + 10.0 * u;  // relative
                            for (int c = 0; c < hs; ++c) {
                                double mix = 0.0;  // Σ_j w_j |v_jc|
                                for (int j = 0; j < T_k; ++j) mix += double(w(b, h, i, j)) * std::fabs(double(v(b, h, j, c)));
                                over(out[static_cast<std::size_t>((b * T_q + i) * C + h * hs + c)], expected(b, h, i, c),
                                     (two_gamma(T_k) + weight_error) * mix * (1.0 + 1e-3));
                            }
                            for (int j = 0; j < T_k; ++j)
                                over(att[static_cast<std::size_t>(((b * NH + h) * T_q + i) * T_k + j)], w(b, h, i, j),
                                     weight_error * double(w(b, h, i, j)) * (1.0 + 1e-3));
                        }
                CAPTURE(excess);
                CHECK(excess <= 1.0);
            }
        }
    }
}

TEST_CASE("the flat masked attention's backward agrees with finite differences") {
    // Cross-attention (T_q = 3 over T_k = 5, keys padded) and causal self-attention with
    // bottom-right alignment (T_q = 2 over T_k = 5, a chunk after a cache), fused layouts.
    const int B = 2, C = 8, NH = 2;
    Rng rng(174);
    struct Case {
        int T_q, T_k;
        AttentionMaskSpec mask;
    };
    const int lengths[2] = {5, 3};
    for (const Case& c : {Case{3, 5, {lengths, false}},
                          Case{2, 5, {nullptr, true, CausalAlignment::bottom_right}},
                          Case{5, 5, {lengths, true}}}) {
        CAPTURE(c.T_q);
        CAPTURE(c.mask.causal);
        std::vector<float> q = normal_vector(rng, static_cast<std::size_t>(B * c.T_q * C));
        std::vector<float> kv = normal_vector(rng, static_cast<std::size_t>(B * c.T_k * 2 * C));
        std::vector<float> out(static_cast<std::size_t>(B * c.T_q * C)),
            att(static_cast<std::size_t>(B * NH * c.T_q * c.T_k)), scratch(att.size());
        const std::vector<float> w = normal_vector(rng, out.size());
        const AttentionInputs in{q.data(), kv.data(), kv.data() + C, C, 2 * C};
        masked_attention_forward(out.data(), att.data(), in, c.mask, B, c.T_q, c.T_k, C, NH);
        std::vector<float> dq(q.size(), 0.0f), dkv(kv.size(), 0.0f);
        masked_attention_backward({dq.data(), dkv.data(), dkv.data() + C}, scratch.data(), w.data(), in,
                                  att.data(), B, c.T_q, c.T_k, C, NH);
        auto objective = [&] {
            masked_attention_forward(out.data(), att.data(), in, c.mask, B, c.T_q, c.T_k, C, NH);
            return weighted_sum(out, w);
        };
        for (auto [name, x, g] : {std::tuple{"dq", &q, &dq}, std::tuple{"dkv", &kv, &dkv}}) {
            CAPTURE(name);
            const GradCheck r = finite_difference(x->data(), g->data(), x->size(), 1e-2f, objective);
            CHECK(r.max_abs_error <= 1e-3);  // test_gpt_layers.cpp's step and tolerance
            CHECK(r.max_abs_grad > 1e-3);
        }
        // the padded keys of sequence 1 got no gradient: no query saw them
        if (c.mask.key_lengths) {
            for (int j = lengths[1]; j < c.T_k; ++j)
                for (int ch = 0; ch < 2 * C; ++ch)
                    CHECK(dkv[static_cast<std::size_t>((c.T_k + j) * 2 * C + ch)] == 0.0f);
        }
    }
}

TEST_CASE("cross-attention through nn.MultiheadAttention's projections with key_padding_mask matches PyTorch") {
    // The decoder's cross-attention layer as the course computes it: q = x·Wqᵀ + bq from the
    // decoder, k and v = memory·Wkvᵀ + bkv from the encoder's output, masked_attention over
    // the real keys, then out_proj. PyTorch's key_padding_mask is true on the padding; the
    // lengths say the same thing.
    const std::filesystem::path dir = fixtures / "mha";
    const NpyArray x = read_npy(dir / "x.npy"), memory = read_npy(dir / "memory.npy");
    const NpyArray dout = read_npy(dir / "dout.npy");
    const NpyArray w_in = read_npy(dir / "in_proj_weight.npy"), b_in = read_npy(dir / "in_proj_bias.npy");
    const NpyArray w_out = read_npy(dir / "out_proj.weight.npy"), b_out = read_npy(dir / "out_proj.bias.npy");
    const int B = static_cast<int>(x.shape[0]), T_q = static_cast<int>(x.shape[1]);
    const int C = static_cast<int>(x.shape[2]), T_k = static_cast<int>(memory.shape[1]);
    const NpyArray weights_ref = read_npy(dir / "weights.npy");
    const int NH = static_cast<int>(weights_ref.shape[1]);
    std::vector<int> lengths;
    for (float l : read_npy(dir / "lengths.npy").data) lengths.push_back(static_cast<int>(l));
    const std::size_t nq = static_cast<std::size_t>(B * T_q), nk = static_cast<std::size_t>(B * T_k);
    std::vector<float> q(nq * C), kv(nk * 2 * C), y(nq * C), att(static_cast<std::size_t>(B * NH * T_q * T_k)),
        out(nq * C);
    const float* Wkv = w_in.data.data() + static_cast<std::size_t>(C) * C;
    matmul_forward(q.data(), x.data.data(), w_in.data.data(), b_in.data.data(), B * T_q, C, C);
    matmul_forward(kv.data(), memory.data.data(), Wkv, b_in.data.data() + C, B * T_k, C, 2 * C);
    const AttentionInputs in{q.data(), kv.data(), kv.data() + C, C, 2 * C};
    masked_attention_forward(y.data(), att.data(), in, {lengths.data(), false}, B, T_q, T_k, C, NH);
    matmul_forward(out.data(), y.data(), w_out.data.data(), b_out.data.data(), B * T_q, C, C);
    auto diff = [](const std::vector<float>& a, const NpyArray& e) {
        REQUIRE(a.size() == e.data.size());
        double worst = 0.0;
        for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(double(a[i]) - e.data[i]));
        return worst;
    };
    CHECK(diff(out, read_npy(dir / "out.npy")) <= parity_tol);
    CHECK(diff(att, weights_ref) <= parity_tol);
    // backward, in reverse order of the forward lines above
    std::vector<float> dy(nq * C, 0.0f), dWout(w_out.data.size(), 0.0f), dbout(b_out.data.size(), 0.0f);
    matmul_backward(dy.data(), dWout.data(), dbout.data(), dout.data.data(), y.data(), w_out.data.data(),
                    B * T_q, C, C);
    std::vector<float> dq(q.size(), 0.0f), dkv(kv.size(), 0.0f), scratch(att.size());
    masked_attention_backward({dq.data(), dkv.data(), dkv.data() + C}, scratch.data(), dy.data(), in,
                              att.data(), B, T_q, T_k, C, NH);
    std::vector<float> dx(nq * C, 0.0f), dmemory(nk * C, 0.0f), dWin(w_in.data.size(), 0.0f),
        dbin(b_in.data.size(), 0.0f);
    matmul_backward(dx.data(), dWin.data(), dbin.data(), dq.data(), x.data.data(), w_in.data.data(),
                    B * T_q, C, C);
    matmul_backward(dmemory.data(), dWin.data() + static_cast<std::size_t>(C) * C, dbin.data() + C, dkv.data(),
                    memory.data.data(), Wkv, B * T_k, C, 2 * C);
    CHECK(diff(dx, read_npy(dir / "dx.npy")) <= parity_tol);
    CHECK(diff(dmemory, read_npy(dir / "dmemory.npy")) <= parity_tol);
    CHECK(diff(dWin, read_npy(dir / "din_proj_weight.npy")) <= parity_tol);
    CHECK(diff(dbin, read_npy(dir / "din_proj_bias.npy")) <= parity_tol);
    CHECK(diff(dWout, read_npy(dir / "dout_proj.weight.npy")) <= parity_tol);
    CHECK(diff(dbout, read_npy(dir / "dout_proj.bias.npy")) <= parity_tol);
    // sequence 1's padded keys: PyTorch gave them no weight and no gradient, and neither do we
    for (int j = lengths[1]; j < T_k; ++j)
        for (int c = 0; c < C; ++c) CHECK(dmemory[static_cast<std::size_t>((T_k + j) * C + c)] == 0.0f);
}
