// What attention alone knows about the order of its inputs (lesson 09): without position
// embeddings, shuffling the tokens shuffles an unmasked layer's outputs the same way, while
// the causal mask lets each position count its predecessors but not order them.
#include "attn/gpt_layers.hpp"

#include "attn/gradcheck.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace attn;

namespace {

constexpr int B = 1, T = 6, C = 8, NH = 2;

// Row t of the result is row perm[t] of x (T, width): token perm[t] moved to position t.
std::vector<float> permute_rows(const std::vector<float>& x, const std::vector<int>& perm, int width) {
    std::vector<float> y(x.size());
    for (int t = 0; t < T; ++t)
        std::copy_n(x.begin() + perm[t] * width, width, y.begin() + t * width);
    return y;
}

// attention_forward's output (T, C) for qkv (T, 3C), one batch item, no dropout.
std::vector<float> attend(const std::vector<float>& qkv, bool causal) {
    std::vector<float> out(B * T * C), att(B * NH * T * T);  // (B, T, C), (B, NH, T, T)
    attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, B, T, C, NH, causal);
    return out;
}

// The largest difference between row a of x and row b of y, both (T, C).
float row_difference(const std::vector<float>& x, int a, const std::vector<float>& y, int b) {
    float d = 0.0f;
    for (int c = 0; c < C; ++c) d = std::max(d, std::abs(x[a * C + c] - y[b * C + c]));
    return d;
}

}  // namespace

// The tolerance: both sides add the same T = 6 terms in another order (softmax denominator,
// Σ_j p_j v_j), and the 4-term scores may differ by sgemm's blocking. Two orders differ by
// ≤ 2γ_n Σ|terms| (u = 2^-24): 2γ_6 on the denominator and on Σ p|v| ≤ max|v| ≈ 2.5 give
// 24u·2.5 ≈ 3.6e-6, the scores (2γ_4 Σ|qk|/2 ≲ 1.4e-6, moving out by ≤ 2·max|Δs|·max|v|)
// as much again: ~1e-5 worst case. With random signs (√6 u ≈ 1.5e-7 relative per sum,
// √4 u·1.25 per score, |out| ≲ 1.5) the rss is ≈ 3.3e-7; 1e-6 rests on it, 3× above. A real
// dependence on order moves outputs by about 0.1 (random scores of size 1).
TEST_CASE("without positions, unmasked attention is permutation-equivariant and causal attention is not") {
    // q, k and v are per-position maps of the tokens: shuffling the tokens shuffles the rows of
    // qkv the same way, and so does every other layer of the GPT except attention.
    Rng rng(9);
    const std::vector<float> qkv = normal_vector(rng, B * T * 3 * C);  // (B, T, 3C)
    const std::vector<int> perm = {3, 0, 5, 1, 4, 2};
    const std::vector<float> shuffled = permute_rows(qkv, perm, 3 * C);

    SUBCASE("unmasked: the outputs of the shuffled tokens are the shuffled outputs") {
        const std::vector<float> out = attend(qkv, false), out_shuffled = attend(shuffled, false);
        for (int t = 0; t < T; ++t) {
            CAPTURE(t);
            CHECK(row_difference(out_shuffled, t, out, perm[t]) <= 1e-6f);
        }
    }
    SUBCASE("causal: some token's output changes when only the order changes") {
        const std::vector<float> out = attend(qkv, true), out_shuffled = attend(shuffled, true);
        float largest = 0.0f;
        for (int t = 0; t < T; ++t) largest = std::max(largest, row_difference(out_shuffled, t, out, perm[t]));
        CHECK(largest > 1e-2f);
    }
}

TEST_CASE("causal attention sees its past as a set: shuffling earlier tokens leaves a position's output unchanged") {
    Rng rng(10);
    const std::vector<float> qkv = normal_vector(rng, B * T * 3 * C);  // (B, T, 3C)
    const std::vector<float> out = attend(qkv, true);
    // Tokens 0..4 in another order, the last token kept in place: position 5 reads the same
    // five keys and values, so it computes the same weighted average.
    const std::vector<int> perm = {2, 4, 0, 3, 1, 5};
    const std::vector<float> out_shuffled = attend(permute_rows(qkv, perm, 3 * C), true);
    CHECK(row_difference(out_shuffled, T - 1, out, T - 1) <= 1e-6f);
    // Position 0 sees only itself, so its output is its own value vector, wherever it came from:
    // the mask tells each position how many tokens precede it, which unmasked attention cannot.
    // Exact in fact: its weights are e^0/1 = 1 and zeros, and 1·v + 0·v' + … rounds nothing.
    for (int c = 0; c < C; ++c) CHECK(out_shuffled[c] == doctest::Approx(qkv[perm[0] * 3 * C + 2 * C + c]).epsilon(1e-6));
}
