// The GPT's layers, forward and backward, over flat float buffers. Shapes use the axis
// letters of tensor.hpp; each backward quotes the forward line it differentiates.
#include "attn/gpt_layers.hpp"

#include "attn/fast_math.hpp"
#include "attn/tensor.hpp"
#include "../simd_clones.hpp"

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>

namespace attn {

namespace {
using std::size_t;
constexpr float layernorm_eps = 1e-5f;
}  // namespace

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                     int C) {
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
            float* out_bt = out + (static_cast<size_t>(b) * T + t) * C;  // (C)
            const float* wte_ix = wte + static_cast<size_t>(inp[b * T + t]) * C;
            if (!wpe) {  // no position embedding (rope, alibi)
                std::copy(wte_ix, wte_ix + C, out_bt);
                continue;
            }
            const float* wpe_t = wpe + static_cast<size_t>(t) * C;
            for (int i = 0; i < C; ++i) out_bt[i] = wte_ix[i] + wpe_t[i];
        }
    }
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T,
                      int C) {
    for (int b = 0; b < B; ++b) {
        for (int t = 0; t < T; ++t) {
            const float* dout_bt = dout + (static_cast<size_t>(b) * T + t) * C;
            float* dwte_ix = dwte + static_cast<size_t>(inp[b * T + t]) * C;
            // forward: out_bt[i] = wte_ix[i] + wpe_t[i]
            for (int i = 0; i < C; ++i) dwte_ix[i] += dout_bt[i];
            if (!dwpe) continue;
            float* dwpe_t = dwpe + static_cast<size_t>(t) * C;
            for (int i = 0; i < C; ++i) dwpe_t[i] += dout_bt[i];
        }
    }
}

ATTN_SIMD_CLONES
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int B, int T, int C) {
    for (size_t row = 0; row < static_cast<size_t>(B) * T; ++row) {
        const float* x = inp + row * C;  // (C)
        float* y = out + row * C;        // (C)
        float m = 0.0f;
        for (int i = 0; i < C; ++i) m += x[i];
        m /= static_cast<float>(C);
        float v = 0.0f;
        for (int i = 0; i < C; ++i) v += (x[i] - m) * (x[i] - m);
        v /= static_cast<float>(C);
        const float s = 1.0f / std::sqrt(v + layernorm_eps);
        for (int i = 0; i < C; ++i) {
            const float n = (x[i] - m) * s;
            y[i] = n * weight[i] + (bias ? bias[i] : 0.0f);
        }
        mean[row] = m;
        rstd[row] = s;
    }
}

ATTN_SIMD_CLONES
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int B, int T, int C) {
    for (size_t row = 0; row < static_cast<size_t>(B) * T; ++row) {
        const float* x = inp + row * C;
        const float* dy = dout + row * C;
        float* dx = dinp + row * C;
        const float m = mean[row], s = rstd[row];
        // forward: n = (x - m) * s; y = n * weight + bias. With dn = dy * weight, the
        // gradient through the mean and the variance is
        // dx = s * (dn - mean(dn) - n * mean(dn * n)).
        float dn_mean = 0.0f, dn_n_mean = 0.0f;
        for (int i = 0; i < C; ++i) {
            const float n = (x[i] - m) * s;
            const float dn = weight[i] * dy[i];
            dn_mean += dn;
            dn_n_mean += dn * n;
        }
        dn_mean /= static_cast<float>(C);
        dn_n_mean /= static_cast<float>(C);
        for (int i = 0; i < C; ++i) {
            const float n = (x[i] - m) * s;
            const float dn = weight[i] * dy[i];
            if (dbias) dbias[i] += dy[i];
            dweight[i] += n * dy[i];
            dx[i] += s * (dn - dn_mean - n * dn_n_mean);
        }
    }
}

namespace {
std::atomic<int> inner_chunk{0};

// C (M, N) = beta·C + alpha·op(A) (M, K) · op(B) (K, N), row-major, with the inner sum over K in
// runs of matmul_inner_chunk() terms, one sgemm call each (see set_matmul_inner_chunk).
// op(A) is A (M, K) or, when a_trans, Aᵀ of A (K, M); op(B) is B (K, N) or, when b_trans,
// Bᵀ of B (N, K).
void sgemm_chunked(bool a_trans, bool b_trans, int M, int N, int K, float alpha, const float* A,
                   int lda, const float* B, int ldb, float beta, float* C, int ldc) {
    const int chunk = inner_chunk.load(std::memory_order_relaxed);
    const int step = chunk > 0 ? chunk : K;
    for (int k0 = 0; k0 < K; k0 += step) {
        const int k = std::min(step, K - k0);
        const float* a = A + (a_trans ? static_cast<size_t>(k0) * lda : static_cast<size_t>(k0));
        const float* b = B + (b_trans ? static_cast<size_t>(k0) : static_cast<size_t>(k0) * ldb);
        cblas_sgemm(CblasRowMajor, a_trans ? CblasTrans : CblasNoTrans,
                    b_trans ? CblasTrans : CblasNoTrans, M, N, k, alpha, a, lda, b, ldb,
                    k0 == 0 ? beta : 1.0f, C, ldc);
    }
}
}  // namespace

void set_matmul_inner_chunk(int chunk) {
    require(chunk >= 0, "set_matmul_inner_chunk: the chunk must be 0 or positive, got " +
                            std::to_string(chunk));
    inner_chunk.store(chunk, std::memory_order_relaxed);
}

int matmul_inner_chunk() { return inner_chunk.load(std::memory_order_relaxed); }

void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC) {
    // The bias is written first and the product added to it (beta = 1): sgemm with beta = 0
    // would spend a pass zeroing out, and a second loop would add the bias.
    if (bias) {
        for (size_t n = 0; n < static_cast<size_t>(N); ++n) {
            std::memcpy(out + n * OC, bias, static_cast<size_t>(OC) * sizeof(float));
        }
    }
    // out (N, OC) = inp (N, C) · weightᵀ (C, OC) (+ bias)
    sgemm_chunked(false, true, N, OC, C, 1.0f, inp, C, weight, C, bias ? 1.0f : 0.0f, out, OC);
}

void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC) {
    // forward: out = inp · weightᵀ + bias
    // dinp (N, C) += dout (N, OC) · weight (OC, C)
    sgemm_chunked(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f, dinp, C);
    // dweight (OC, C) += doutᵀ (OC, N) · inp (N, C)
    sgemm_chunked(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f, dweight, C);
    if (dbias) {
        for (size_t n = 0; n < static_cast<size_t>(N); ++n) {
            const float* row = dout + n * OC;
            for (int o = 0; o < OC; ++o) dbias[o] += row[o];
        }
    }
}

int kv_head_of(int h, int NH, int G) {
    // NH/G consecutive query heads form a group; the group's index is its key/value head
    return h / (NH / G);
}

ATTN_SIMD_CLONES
void attention_forward(float* out, float* att, float* att_dropped, const float* qkv,
                       float dropout_p, const DropoutSite* dropout_site, int B, int T, int C,
                       int NH, bool causal, bool scaled, const float* alibi_slopes, int NKV,
                       int window) {
    const int G = NKV > 0 ? NKV : NH;
    require(NH % G == 0, "attention_forward: the key/value heads G = " + std::to_string(G) +
                             " must divide NH = " + std::to_string(NH));
    const int hs = C / NH;
    const int C3 = C + 2 * G * hs;  // the row of qkv: q (C), G keys, G values
    const float scale = scaled ? 1.0f / std::sqrt(static_cast<float>(hs)) : 1.0f;
    const bool dropout = dropout_p > 0.0f;
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            // q, k, v (T, hs) are column blocks of qkv (T, C + 2·G·hs); query head h reads
            // key/value head h / (NH/G), the one its group shares
            const int kvh = kv_head_of(h, NH, G);
            const float* rows = qkv + static_cast<size_t>(b) * T * C3;  // this sequence's
            const float* q = rows + h * hs;
            const float* k = rows + C + kvh * hs;
            const float* v = rows + C + (G + kvh) * hs;
            const size_t bh = (static_cast<size_t>(b) * NH + h) * T * T;
            float* a = att + bh;  // (T, T)
            // scores (T, T) = q · kᵀ / √hs (or · 1 unscaled); the entries above the diagonal are overwritten below
            sgemm_chunked(false, true, T, T, hs, scale, q, C3, k, C3, 0.0f, a, T);
            // ALiBi: scores[t, j] += m·(j − t), a penalty growing with the distance
            if (alibi_slopes) {
                const float m = alibi_slopes[h];
                for (int t = 0; t < T; ++t) {
                    float* row = a + static_cast<size_t>(t) * T;
                    for (int j = 0; j < T; ++j) row[j] += m * static_cast<float>(j - t);
                }
            }
            // causal mask and softmax: row t attends to positions first..t only (first = 0,
            // or t − W + 1 with a window)
            for (int t = 0; t < T; ++t) {
                float* row = a + static_cast<size_t>(t) * T;
                const int last = causal ? t : T - 1;  // without the mask: every position
                const int first = window > 0 ? std::max(0, t - window + 1) : 0;
                float maxval = row[first];
                for (int j = first + 1; j <= last; ++j) maxval = std::max(maxval, row[j]);
                // exp_approx in a loop of its own vectorises; the sum stays in order
                for (int j = first; j <= last; ++j) row[j] = exp_approx(row[j] - maxval);
                float sum = 0.0f;
                for (int j = first; j <= last; ++j) sum += row[j];
                const float inv = 1.0f / sum;
                for (int j = first; j <= last; ++j) row[j] *= inv;
                for (int j = 0; j < first; ++j) row[j] = 0.0f;
                for (int j = last + 1; j < T; ++j) row[j] = 0.0f;
            }
            const float* weights = a;
            if (dropout) {
                float* ad = att_dropped + bh;
                const float keep_scale = 1.0f / (1.0f - dropout_p);
                // weight (b, h, i, j) is element bh + i·T + j of the call's (B, NH, T, T)
                const std::uint64_t first = dropout_site->first_index + bh;
                for (size_t i = 0; i < static_cast<size_t>(T) * T; ++i) {
                    const bool drop = dropout_uniform(dropout_site->seed, first + i) < dropout_p;
                    ad[i] = drop ? 0.0f : a[i] * keep_scale;
                }
                weights = ad;
            }
            // out (T, hs), leading dimension C = weights (T, T) · v (T, hs)
            float* o = out + static_cast<size_t>(b) * T * C + h * hs;
            sgemm_chunked(false, false, T, hs, T, 1.0f, weights, T, v, C3, 0.0f, o, C);
        }
    }
}

void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, const float* att_dropped, float dropout_p, int B,
                        int T, int C, int NH, bool causal, bool scaled, int NKV, int window) {
    const int G = NKV > 0 ? NKV : NH;
    require(NH % G == 0, "attention_backward: the key/value heads G = " + std::to_string(G) +
                             " must divide NH = " + std::to_string(NH));
    const int hs = C / NH;
    const int C3 = C + 2 * G * hs;
    const float scale = scaled ? 1.0f / std::sqrt(static_cast<float>(hs)) : 1.0f;
    const bool dropout = dropout_p > 0.0f;
    const float keep_scale = dropout ? 1.0f / (1.0f - dropout_p) : 1.0f;
    for (int b = 0; b < B; ++b) {
        for (int h = 0; h < NH; ++h) {
            // a shared key/value head's gradient is the sum over the query heads of its group:
            // each of them adds its part into the same dk and dv columns (beta = 1 below)
            const int kvh = kv_head_of(h, NH, G);
            const size_t rows = static_cast<size_t>(b) * T * C3;  // this sequence's
            const size_t q_off = rows + h * hs;
            const size_t k_off = rows + C + kvh * hs;
            const size_t v_off = rows + C + (G + kvh) * hs;
            const float* q = qkv + q_off;
            const float* k = qkv + k_off;
            const float* v = qkv + v_off;
            float* dq = dqkv + q_off;
            float* dk = dqkv + k_off;
            float* dv = dqkv + v_off;
            const size_t bh = (static_cast<size_t>(b) * NH + h) * T * T;
            const float* a = att + bh;                                              // (T, T)
            const float* weights = dropout ? att_dropped + bh : a;                  // (T, T)
            const float* dout_bh = dout + static_cast<size_t>(b) * T * C + h * hs;  // (T, hs)
            float* datt = scratch + bh;  // (T, T), this pair's own part of the scratch

            // forward: out = weights · v
            // dweights (T, T) = dout (T, hs) · vᵀ (hs, T)
            sgemm_chunked(false, true, T, T, hs, 1.0f, dout_bh, C, v, C3, 0.0f, datt, T);
            // dv (T, hs) += weightsᵀ (T, T) · dout (T, hs)
            sgemm_chunked(true, false, T, hs, T, 1.0f, weights, T, dout_bh, C, 1.0f, dv, C3);
            // forward: weights = att * mask, mask = 0 or 1/(1-p). A kept weight is nonzero
            // unless att itself is zero, where the softmax backward below multiplies by att = 0
            // anyway, so the mask is read back from the dropped weights.
            if (dropout) {
                for (size_t i = 0; i < static_cast<size_t>(T) * T; ++i) {
                    datt[i] = weights[i] != 0.0f ? datt[i] * keep_scale : 0.0f;
                }
            }
            // forward: att[t, :t+1] = softmax(scores[t, :t+1]), att[t, t+1:] = 0
            // dscores[t, j] = att[t, j] * (datt[t, j] - Σ_k att[t, k] datt[t, k]), in place
            for (int t = 0; t < T; ++t) {
                const float* arow = a + static_cast<size_t>(t) * T;
                float* drow = datt + static_cast<size_t>(t) * T;
                const int last = causal ? t : T - 1;
                const int first = window > 0 ? std::max(0, t - window + 1) : 0;
                float dot = 0.0f;
                for (int j = first; j <= last; ++j) dot += arow[j] * drow[j];
                for (int j = first; j <= last; ++j) drow[j] = arow[j] * (drow[j] - dot);
                // masked positions: their scores never reached the output
                for (int j = 0; j < first; ++j) drow[j] = 0.0f;
                for (int j = last + 1; j < T; ++j) drow[j] = 0.0f;
            }
            // forward: scores = scale · q · kᵀ
            // dq (T, hs) += scale · dscores (T, T) · k (T, hs)
            sgemm_chunked(false, false, T, hs, T, scale, datt, T, k, C3, 1.0f, dq, C3);
            // dk (T, hs) += scale · dscoresᵀ (T, T) · q (T, hs)
            sgemm_chunked(true, false, T, hs, T, scale, datt, T, q, C3, 1.0f, dk, C3);
        }
    }
}

std::vector<float> alibi_slopes(int NH) {
    require(NH >= 1, "alibi_slopes: NH must be at least 1, got " + std::to_string(NH));
    // the slopes of n heads, n a power of two: start^1, start^2, …, start = 2^(−8/n)
    auto power_of_two = [](int n) {
        std::vector<float> m(static_cast<size_t>(n));
        for (int h = 0; h < n; ++h) m[h] = static_cast<float>(std::exp2(-8.0 * (h + 1) / n));
        return m;
    };
    int n = 1;
    while (2 * n <= NH) n *= 2;
    std::vector<float> m = power_of_two(n);
    const std::vector<float> twice = power_of_two(2 * n);
    for (int h = 0; static_cast<int>(m.size()) < NH; h += 2) m.push_back(twice[h]);
    return m;
}

double rope_angle(int pos, int i, int hs, double base) {
    return static_cast<double>(pos) * std::pow(base, -2.0 * i / hs);
}

namespace {
// Rotates every pair (2i, 2i+1) of q and k by sign·angle(pos0 + t, i), in place.
void rope_rotate(float* qkv, int B, int T, int C, int NH, int pos0, float sign, int NKV) {
    require(NH > 0 && C % NH == 0 && (C / NH) % 2 == 0,
            "rope: the head size C/NH must be even, got C " + std::to_string(C) + " and NH " +
                std::to_string(NH));
    const int hs = C / NH;
    const int G = NKV > 0 ? NKV : NH;
    const size_t C3 = static_cast<size_t>(C) + 2 * static_cast<size_t>(G) * hs;
    for (int t = 0; t < T; ++t) {
        for (int i = 0; i < hs / 2; ++i) {
            const double angle = rope_angle(pos0 + t, i, hs);
            const float c = static_cast<float>(std::cos(angle));
            const float s = sign * static_cast<float>(std::sin(angle));
            for (int b = 0; b < B; ++b) {
                float* row = qkv + (static_cast<size_t>(b) * T + t) * C3;  // (3C)
                // q is channels [0, C) (NH heads), k is [C, C + G·hs) (G heads); head h's
                // pair i at h·hs + 2i
                for (int part = 0; part < 2; ++part) {
                    for (int h = 0; h < (part == 0 ? NH : G); ++h) {
                        float* x = row + part * C + h * hs + 2 * i;
                        const float x0 = x[0], x1 = x[1];
                        x[0] = x0 * c - x1 * s;
                        x[1] = x0 * s + x1 * c;
                    }
                }
            }
        }
    }
}
}  // namespace

void rope_forward(float* qkv, int B, int T, int C, int NH, int pos0, int NKV) {
    rope_rotate(qkv, B, T, C, NH, pos0, 1.0f, NKV);
}

void rope_backward(float* dqkv, int B, int T, int C, int NH, int pos0, int NKV) {
    // forward: y = R(angle)·x, so dx = R(angle)ᵀ·dy = R(−angle)·dy
    rope_rotate(dqkv, B, T, C, NH, pos0, -1.0f, NKV);
}

// GELU's erf and exp are the branch-free ones of fast_math.hpp, so these loops vectorise:
// with std::erf and std::exp (one library call per element) GELU took a quarter of the
// training step.
ATTN_SIMD_CLONES
void gelu_forward(float* out, const float* inp, int N) {
    const float inv_sqrt2 = 0.70710678118654752f;
    for (int i = 0; i < N; ++i) {
        const float x = inp[i];
        out[i] = 0.5f * x * (1.0f + erf_approx(x * inv_sqrt2));
    }
}

ATTN_SIMD_CLONES
void gelu_backward(float* dinp, const float* inp, const float* dout, int N) {
    const float inv_sqrt2 = 0.70710678118654752f;
    const float inv_sqrt_2pi = 0.39894228040143268f;
    for (int i = 0; i < N; ++i) {
        const float x = inp[i];
        // forward: out = ½ x (1 + erf(x/√2)) = x Φ(x); d/dx = Φ(x) + x φ(x)
        const float cdf = 0.5f * (1.0f + erf_approx(x * inv_sqrt2));
        const float pdf = inv_sqrt_2pi * exp_approx(-0.5f * x * x);
        dinp[i] += dout[i] * (cdf + x * pdf);
    }
}

void residual_forward(float* out, const float* inp1, const float* inp2, int N) {
    for (int i = 0; i < N; ++i) out[i] = inp1[i] + inp2[i];
}

void residual_backward(float* dinp1, float* dinp2, const float* dout, int N) {
    // forward: out = inp1 + inp2
    for (int i = 0; i < N; ++i) {
        dinp1[i] += dout[i];
        dinp2[i] += dout[i];
    }
}

void dropout_forward(float* x, float* mask, float p, const DropoutSite& site, int N) {
    const float keep_scale = 1.0f / (1.0f - p);
    for (int i = 0; i < N; ++i) {
        const std::uint64_t index = site.first_index + static_cast<std::uint64_t>(i);
        mask[i] = dropout_uniform(site.seed, index) < p ? 0.0f : keep_scale;
        x[i] *= mask[i];
    }
}

void dropout_backward(float* dx, const float* mask, int N) {
    // forward: x *= mask
    for (int i = 0; i < N; ++i) dx[i] *= mask[i];
}

float crossentropy_forward(float* probs, float* losses, const float* logits, const int* targets,
                           int B, int T, int V) {
    double total = 0.0;
    const size_t BT = static_cast<size_t>(B) * T;
    for (size_t row = 0; row < BT; ++row) {
        const float* z = logits + row * V;  // (V)
        float* p = probs + row * V;         // (V)
        float maxval = z[0];
        for (int i = 1; i < V; ++i) maxval = std::max(maxval, z[i]);
        float sum = 0.0f;
        for (int i = 0; i < V; ++i) {
            p[i] = std::exp(z[i] - maxval);
            sum += p[i];
        }
        // −log p[target] from the log-sum-exp, not from log(p), which underflows first
        losses[row] = std::log(sum) - (z[targets[row]] - maxval);
        const float inv = 1.0f / sum;
        for (int i = 0; i < V; ++i) p[i] *= inv;
        total += losses[row];
    }
    return static_cast<float>(total / static_cast<double>(BT));
}

void crossentropy_backward(float* dlogits, const float* probs, const int* targets, int B, int T,
                           int V, int positions) {
    const size_t BT = static_cast<size_t>(B) * T;
    // d(mean)/d(loss of one position)
    const size_t mean_over = positions > 0 ? static_cast<size_t>(positions) : BT;
    const float dloss = 1.0f / static_cast<float>(mean_over);
    for (size_t row = 0; row < BT; ++row) {
        const float* p = probs + row * V;
        float* dz = dlogits + row * V;
        // forward: loss = log Σ exp(z) − z[target]; d/dz = softmax(z) − onehot(target)
        for (int i = 0; i < V; ++i) dz[i] += dloss * (p[i] - (i == targets[row] ? 1.0f : 0.0f));
    }
}

}  // namespace attn
