// Attention on 16-bit inputs: the plain version with every result stored in the format,
// and the online softmax with float32 statistics (see mixed_attention.hpp).
#include "attn/mixed_attention.hpp"

#include "attn/random.hpp"
#include "attn/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace attn {

namespace {

// Where head bh (= b·NH + h) starts in a (B, NH, T, hs) buffer.
std::size_t head_start(const AttentionShape& s, std::size_t bh) { return bh * s.T * s.hs; }

// q_i · k_j summed in float32, in order (as one lane of a tensor core's float32 sum).
float dot_fp32(const float* a, const float* b, std::size_t n) {
    float sum = 0.0f;
    for (std::size_t d = 0; d < n; ++d) sum += a[d] * b[d];
    return sum;
}

}  // namespace

void attention_plain_rounded_forward(float* out, const float* q, const float* k, const float* v,
                                     const AttentionShape& s, Precision format) {
    check_attention_shape(s);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
    const auto round = [format](float x) { return round_to_precision(x, format); };
    std::vector<float> row(s.T);  // (T) one row of S, then of P
    for (std::size_t bh = 0; bh < s.B * s.NH; ++bh) {
        const std::size_t o = head_start(s, bh);
        for (std::size_t i = 0; i < s.T; ++i) {
            const std::size_t keys = s.causal ? i + 1 : s.T;
            // S = round(q kᵀ/√hs): a 16-bit product's result
            for (std::size_t j = 0; j < keys; ++j) {
                row[j] = round(dot_fp32(q + o + i * s.hs, k + o + j * s.hs, s.hs) * scale);
            }
            // P = round(softmax(S)), computed in float32 from the stored 16-bit scores
            float m = row[0];
            for (std::size_t j = 1; j < keys; ++j) m = std::max(m, row[j]);
            float sum = 0.0f;
            for (std::size_t j = 0; j < keys; ++j) sum += std::exp(row[j] - m);
            for (std::size_t j = 0; j < keys; ++j) row[j] = round(std::exp(row[j] - m) / sum);
            // out = round(P v), summed in float32
            for (std::size_t d = 0; d < s.hs; ++d) {
                float acc = 0.0f;
                for (std::size_t j = 0; j < keys; ++j) acc += row[j] * v[o + j * s.hs + d];
                out[o + i * s.hs + d] = round(acc);
            }
        }
    }
}

void attention_flash_rounded_forward(float* out, float* lse, const float* q, const float* k,
                                     const float* v, const AttentionShape& s, Precision format,
                                     Precision statistics, const FlashBlocks& blocks) {
    check_attention_shape(s);
    require(blocks.cols > 0, "attention_flash_rounded_forward: the key tile must not be empty");
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
    const float neg_inf = -std::numeric_limits<float>::infinity();
    // Rounding to the statistics' format: the identity for float32, as FlashAttention keeps them.
    const auto keep = [statistics](float x) { return round_to_precision(x, statistics); };
    std::vector<float> scores(blocks.cols), acc(s.hs);  // (Bc) one tile of one row, (hs)
    for (std::size_t bh = 0; bh < s.B * s.NH; ++bh) {
        const std::size_t o = head_start(s, bh);
        for (std::size_t i = 0; i < s.T; ++i) {
            const float* q_i = q + o + i * s.hs;
            float m = neg_inf, l = 0.0f;
            std::fill(acc.begin(), acc.end(), 0.0f);
            const std::size_t key_end = s.causal ? i + 1 : s.T;
            for (std::size_t j0 = 0; j0 < key_end; j0 += blocks.cols) {
                const std::size_t n = std::min(blocks.cols, key_end - j0);
                float tile_max = neg_inf;
                for (std::size_t c = 0; c < n; ++c) {
                    scores[c] = dot_fp32(q_i, k + o + (j0 + c) * s.hs, s.hs) * scale;
                    tile_max = std::max(tile_max, scores[c]);
                }
                const float m_new = std::max(m, tile_max);
                const float rescale = std::exp(m - m_new);  // 0 on the first tile
                l = keep(l * rescale);
                for (float& a : acc) a = keep(a * rescale);
                for (std::size_t c = 0; c < n; ++c) {
                    const float p = std::exp(scores[c] - m_new);
                    l = keep(l + p);  // the row's sum of the unrounded probabilities
                    const float p_in = round_to_precision(p, format);  // P·V's 16-bit input
                    const float* v_j = v + o + (j0 + c) * s.hs;
                    for (std::size_t d = 0; d < s.hs; ++d) acc[d] = keep(acc[d] + p_in * v_j[d]);
                }
                m = m_new;
            }
            for (std::size_t d = 0; d < s.hs; ++d) {
                out[o + i * s.hs + d] = round_to_precision(acc[d] / l, format);
            }
            if (lse) lse[bh * s.T + i] = m + std::log(l);
        }
    }
}

RoundedAttentionInputs rounded_attention_inputs(const AttentionShape& shape, Precision format,
                                                std::uint64_t seed) {
    Rng rng(seed);
    const std::size_t n = shape.qkv_size();
    RoundedAttentionInputs in;
    for (std::vector<float>* x : {&in.q, &in.k, &in.v}) {
        x->resize(n);
        for (float& e : *x) e = rng.normal();
        round_in_place(x->data(), n, format);
    }
    in.out.resize(n);
    in.lse.resize(shape.rows());
    attention_reference_forward(in.out.data(), in.lse.data(), to_double(in.q.data(), n).data(),
                                to_double(in.k.data(), n).data(), to_double(in.v.data(), n).data(),
                                shape);
    return in;
}

}  // namespace attn
