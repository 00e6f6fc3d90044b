// Multi-head attention between two sequences with a key padding mask, forward and backward,
// over flat buffers. Shapes use the axis letters of gpt_layers.hpp; the backward quotes the
// forward lines it differentiates.
#include "attn/cross_attention.hpp"

#include "attn/tensor.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

namespace attn {

namespace {
using std::size_t;

void check_sizes(const AttentionMaskSpec& mask, int B, int T_q, int T_k, int C, int NH) {
    require(B >= 1 && T_q >= 1 && T_k >= 1 && C >= 1 && NH >= 1 && C % NH == 0,
            "masked_attention_forward: sizes B = " + std::to_string(B) + ", T_q = " +
                std::to_string(T_q) + ", T_k = " + std::to_string(T_k) + ", C = " +
                std::to_string(C) + ", NH = " + std::to_string(NH) +
                " (each at least 1, and NH must divide C)");
    if (mask.causal) {  // refuses T_q ≠ T_k without an alignment, before any work
        (void)causal_last_key(0, static_cast<size_t>(T_q), static_cast<size_t>(T_k), mask.alignment);
    }
    if (mask.key_lengths) {
        for (int b = 0; b < B; ++b) {
            require(mask.key_lengths[b] >= 0 && mask.key_lengths[b] <= T_k,
                    "masked_attention_forward: sequence " + std::to_string(b) + " has " +
                        std::to_string(mask.key_lengths[b]) + " real keys; expected 0 to T_k = " +
                        std::to_string(T_k));
        }
    }
}
}  // namespace

void masked_attention_forward(float* out, float* att, const AttentionInputs& in,
                              const AttentionMaskSpec& mask, int B, int T_q, int T_k, int C, int NH) {
    check_sizes(mask, B, T_q, T_k, C, NH);
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    for (int b = 0; b < B; ++b) {
        // keys [0, real) are this sequence's tokens, the rest its padding
        const int real = mask.key_lengths ? mask.key_lengths[b] : T_k;
        const float* qb = in.q + static_cast<size_t>(b) * T_q * in.q_stride;   // (T_q, ·)
        const float* kb = in.k + static_cast<size_t>(b) * T_k * in.kv_stride;  // (T_k, ·)
        const float* vb = in.v + static_cast<size_t>(b) * T_k * in.kv_stride;  // (T_k, ·)
        for (int h = 0; h < NH; ++h) {
            float* a = att + (static_cast<size_t>(b) * NH + h) * T_q * T_k;  // (T_q, T_k)
            // scores (T_q, T_k) = q (T_q, hs) · kᵀ (hs, T_k) / √hs
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T_q, T_k, hs, scale, qb + h * hs,
                        in.q_stride, kb + h * hs, in.kv_stride, 0.0f, a, T_k);
            for (int i = 0; i < T_q; ++i) {
                float* row = a + static_cast<size_t>(i) * T_k;
                // query i sees keys [0, last]: the real ones, up to the diagonal when causal
                long last = real - 1;
                if (mask.causal) {
                    last = std::min(last, causal_last_key(static_cast<size_t>(i), static_cast<size_t>(T_q),
                                                          static_cast<size_t>(T_k), mask.alignment));
                }
                const int seen = static_cast<int>(std::max(last + 1, 0L));
                if (seen > 0) {
                    float maxval = row[0];
                    for (int j = 1; j < seen; ++j) maxval = std::max(maxval, row[j]);
                    float sum = 0.0f;
                    for (int j = 0; j < seen; ++j) {
                        row[j] = std::exp(row[j] - maxval);
                        sum += row[j];
                    }
                    const float inv = 1.0f / sum;
                    for (int j = 0; j < seen; ++j) row[j] *= inv;
                }
                // hidden keys: weight exactly 0; a query that sees none keeps a row of zeros
                std::fill(row + seen, row + T_k, 0.0f);
            }
            // out (T_q, hs), rows of C = att (T_q, T_k) · v (T_k, hs)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T_q, hs, T_k, 1.0f, a, T_k,
                        vb + h * hs, in.kv_stride, 0.0f,
                        out + static_cast<size_t>(b) * T_q * C + h * hs, C);
        }
    }
}

void masked_attention_backward(const AttentionGrads& grads, float* scratch, const float* dout,
                               const AttentionInputs& in, const float* att, int B, int T_q,
                               int T_k, int C, int NH) {
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    for (int b = 0; b < B; ++b) {
        const size_t q_rows = static_cast<size_t>(b) * T_q * in.q_stride;
        const size_t kv_rows = static_cast<size_t>(b) * T_k * in.kv_stride;
        for (int h = 0; h < NH; ++h) {
            const size_t bh = (static_cast<size_t>(b) * NH + h) * T_q * T_k;
            const float* a = att + bh;   // (T_q, T_k)
            float* datt = scratch + bh;  // (T_q, T_k)
            const float* dout_bh = dout + static_cast<size_t>(b) * T_q * C + h * hs;  // (T_q, hs)
            const float* q = in.q + q_rows + h * hs;
            const float* k = in.k + kv_rows + h * hs;
            const float* v = in.v + kv_rows + h * hs;
            // forward: out = att · v
            // datt (T_q, T_k) = dout (T_q, hs) · vᵀ (hs, T_k)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T_q, T_k, hs, 1.0f, dout_bh, C, v,
                        in.kv_stride, 0.0f, datt, T_k);
            // dv (T_k, hs) += attᵀ (T_k, T_q) · dout (T_q, hs)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T_k, hs, T_q, 1.0f, a, T_k, dout_bh,
                        C, 1.0f, grads.dv + kv_rows + h * hs, in.kv_stride);
            // forward: att[i, :] = softmax(scores[i, visible keys]), 0 on the hidden ones
            // dscores[i, j] = att[i, j] · (datt[i, j] − Σ_k att[i, k] · datt[i, k]); a hidden
            // key has att = 0, so its score gets no gradient, and a row that saw no key none at all
            for (int i = 0; i < T_q; ++i) {
                const float* arow = a + static_cast<size_t>(i) * T_k;
                float* drow = datt + static_cast<size_t>(i) * T_k;
                float dot = 0.0f;
                for (int j = 0; j < T_k; ++j) dot += arow[j] * drow[j];
                for (int j = 0; j < T_k; ++j) drow[j] = arow[j] * (drow[j] - dot);
            }
            // forward: scores = scale · q · kᵀ
            // dq (T_q, hs) += scale · dscores (T_q, T_k) · k (T_k, hs)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T_q, hs, T_k, scale, datt, T_k, k,
                        in.kv_stride, 1.0f, grads.dq + q_rows + h * hs, in.q_stride);
            // dk (T_k, hs) += scale · dscoresᵀ (T_k, T_q) · q (T_q, hs)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T_k, hs, T_q, scale, datt, T_k, q,
                        in.q_stride, 1.0f, grads.dk + kv_rows + h * hs, in.kv_stride);
        }
    }
}

}  // namespace attn
