#include "attn/flash.hpp"

#include "attn/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace attn {

namespace {

// Offset of head (b, h)'s (T, hs) block, and of its (T) row of log-sum-exps.
std::size_t head_offset(const AttentionShape& s, std::size_t bh) { return bh * s.T * s.hs; }

template <class Real>
Real dot(const Real* a, const Real* b, std::size_t n) {
    Real sum = 0;
    for (std::size_t i = 0; i < n; ++i) sum += a[i] * b[i];
    return sum;
}

// Keys query i may see: 0..i when causal, all T otherwise.
std::size_t visible_keys(const AttentionShape& s, std::size_t i) { return s.causal ? i + 1 : s.T; }

// e^(a − b) for scores a, b. The difference of two floats is exact in double, and so is
// the argument here: rounding s − m to float would cost up to ulp(|s − m|) ≈ 5e-7 of
// relative error in each weight for |s − m| ≈ 8, more than the rest of the computation.
// The plain and the tiled versions both use it, so they differ only in their sums.
template <class Real>
Real exp_difference(Real a, Real b) {
    return static_cast<Real>(std::exp(static_cast<double>(a) - static_cast<double>(b)));
}

// One head's probabilities P (T, T) = softmax(q kᵀ · scale) with masked entries 0, and
// each row's log-sum-exp. Shared by the plain forward and backward, float and double.
template <class Real>
void head_probabilities(Real* p, Real* lse_row, const Real* q, const Real* k,
                        const AttentionShape& s) {
    const Real scale = Real(1) / std::sqrt(static_cast<Real>(s.hs));
    for (std::size_t i = 0; i < s.T; ++i) {
        Real* row = p + i * s.T;
        const std::size_t n = visible_keys(s, i);
        Real m = -std::numeric_limits<Real>::infinity();
        for (std::size_t j = 0; j < n; ++j) {
            row[j] = dot(q + i * s.hs, k + j * s.hs, s.hs) * scale;  // s_ij
            m = std::max(m, row[j]);
        }
        Real sum = 0;
        for (std::size_t j = 0; j < n; ++j) sum += (row[j] = exp_difference(row[j], m));
        for (std::size_t j = 0; j < n; ++j) row[j] /= sum;
        for (std::size_t j = n; j < s.T; ++j) row[j] = 0;  // masked: weight exactly zero
        if (lse_row) lse_row[i] = m + std::log(sum);
    }
}

template <class Real>
void plain_forward(Real* out, Real* lse, const Real* q, const Real* k, const Real* v,
                   const AttentionShape& s) {
    check_attention_shape(s);
    std::vector<Real> p(s.T * s.T);  // (T, T): the matrix the tiled version never holds
    for (std::size_t bh = 0; bh < s.B * s.NH; ++bh) {
        const std::size_t o = head_offset(s, bh);
        head_probabilities(p.data(), lse ? lse + bh * s.T : nullptr, q + o, k + o, s);
        // out = P v (T, hs)
        for (std::size_t i = 0; i < s.T; ++i) {
            Real* out_row = out + o + i * s.hs;
            std::fill(out_row, out_row + s.hs, Real(0));
            for (std::size_t j = 0; j < visible_keys(s, i); ++j) {
                const Real pij = p[i * s.T + j];
                const Real* v_row = v + o + j * s.hs;
                for (std::size_t d = 0; d < s.hs; ++d) out_row[d] += pij * v_row[d];
            }
        }
    }
}

template <class Real>
void plain_backward(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* q,
                    const Real* k, const Real* v, const AttentionShape& s) {
    check_attention_shape(s);
    const Real scale = Real(1) / std::sqrt(static_cast<Real>(s.hs));
    std::vector<Real> p(s.T * s.T), ds(s.T * s.T);  // (T, T) each
    std::fill(dq, dq + s.qkv_size(), Real(0));
    std::fill(dk, dk + s.qkv_size(), Real(0));
    std::fill(dv, dv + s.qkv_size(), Real(0));
    for (std::size_t bh = 0; bh < s.B * s.NH; ++bh) {
        const std::size_t o = head_offset(s, bh);
        head_probabilities<Real>(p.data(), nullptr, q + o, k + o, s);
        for (std::size_t i = 0; i < s.T; ++i) {
            const std::size_t n = visible_keys(s, i);
            const Real* dout_row = dout + o + i * s.hs;
            // out_i = Σ_j P_ij v_j   →   dv_j += P_ij dout_i,  dP_ij = dout_i · v_j
            Real row_dot = 0;  // Σ_j P_ij dP_ij
            for (std::size_t j = 0; j < n; ++j) {
                const Real pij = p[i * s.T + j];
                Real* dv_row = dv + o + j * s.hs;
                for (std::size_t d = 0; d < s.hs; ++d) dv_row[d] += pij * dout_row[d];
                const Real dpij = dot(dout_row, v + o + j * s.hs, s.hs);
                ds[i * s.T + j] = dpij;
                row_dot += pij * dpij;
            }
            // P_i = softmax(S_i)   →   dS_ij = P_ij (dP_ij − Σ_k P_ik dP_ik)
            for (std::size_t j = 0; j < n; ++j) {
                ds[i * s.T + j] = p[i * s.T + j] * (ds[i * s.T + j] - row_dot);
            }
            // S_ij = q_i · k_j · scale   →   dq_i += scale dS_ij k_j,  dk_j += scale dS_ij q_i
            Real* dq_row = dq + o + i * s.hs;
            const Real* q_row = q + o + i * s.hs;
            for (std::size_t j = 0; j < n; ++j) {
                const Real g = scale * ds[i * s.T + j];
                const Real* k_row = k + o + j * s.hs;
                Real* dk_row = dk + o + j * s.hs;
                for (std::size_t d = 0; d < s.hs; ++d) {
                    dq_row[d] += g * k_row[d];
                    dk_row[d] += g * q_row[d];
                }
            }
        }
    }
}

void check_blocks(const FlashBlocks& blocks) {
    require(blocks.rows > 0 && blocks.cols > 0,
            "FlashBlocks: tile sizes must be positive, got rows " + std::to_string(blocks.rows) +
                ", cols " + std::to_string(blocks.cols));
}

}  // namespace

void check_attention_shape(const AttentionShape& s) {
    require(s.B > 0 && s.NH > 0 && s.T > 0 && s.hs > 0,
            "AttentionShape: every size must be positive, got (B, NH, T, hs) = (" +
                std::to_string(s.B) + ", " + std::to_string(s.NH) + ", " + std::to_string(s.T) +
                ", " + std::to_string(s.hs) + ")");
}

void online_softmax_update(float& m, float& l, float* acc, const float* scores,
                           const float* values, std::size_t n, std::size_t hs) {
    float tile_max = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < n; ++j) tile_max = std::max(tile_max, scores[j]);
    const float m_new = std::max(m, tile_max);
    // Every score so far is −∞ (all keys masked): nothing to add, and e^(−∞ − (−∞)) would
    // be NaN.
    if (m_new == -std::numeric_limits<float>::infinity()) return;
    const float rescale = exp_difference(m, m_new);  // e^(m − m_new): 0 on the first tile
    l *= rescale;
    for (std::size_t d = 0; d < hs; ++d) acc[d] *= rescale;
    for (std::size_t j = 0; j < n; ++j) {
        const float p = exp_difference(scores[j], m_new);  // 0 for a masked key
        l += p;
        const float* v_row = values + j * hs;
        for (std::size_t d = 0; d < hs; ++d) acc[d] += p * v_row[d];
    }
    m = m_new;
}

void attention_plain_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const AttentionShape& shape) {
    plain_forward<float>(out, lse, q, k, v, shape);
}

void attention_plain_backward(float* dq, float* dk, float* dv, const float* dout,
                              const float* q, const float* k, const float* v,
                              const AttentionShape& shape) {
    plain_backward<float>(dq, dk, dv, dout, q, k, v, shape);
}

void attention_reference_forward(double* out, double* lse, const double* q, const double* k,
                                 const double* v, const AttentionShape& shape) {
    plain_forward<double>(out, lse, q, k, v, shape);
}

void attention_reference_backward(double* dq, double* dk, double* dv, const double* dout,
                                  const double* q, const double* k, const double* v,
                                  const AttentionShape& shape) {
    plain_backward<double>(dq, dk, dv, dout, q, k, v, shape);
}

void attention_flash_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const AttentionShape& s, const FlashBlocks& blocks) {
    check_attention_shape(s);
    check_blocks(blocks);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
    const float neg_inf = -std::numeric_limits<float>::infinity();
    const std::size_t Br = blocks.rows, Bc = blocks.cols;
    std::vector<float> scores(Br * Bc);  // (Br, Bc): one tile of S, all the scores held
    std::vector<float> acc(Br * s.hs);   // (Br, hs): the tile's unnormalised outputs
    std::vector<float> m(Br), l(Br);     // (Br): running max and sum per row
    for (std::size_t bh = 0; bh < s.B * s.NH; ++bh) {
        const std::size_t o = head_offset(s, bh);
        for (std::size_t i0 = 0; i0 < s.T; i0 += Br) {
            const std::size_t rows = std::min(Br, s.T - i0);
            std::fill(m.begin(), m.end(), neg_inf);
            std::fill(l.begin(), l.end(), 0.0f);
            std::fill(acc.begin(), acc.end(), 0.0f);
            // Causal: key tiles starting after this tile's last query are all masked.
            const std::size_t key_end = s.causal ? i0 + rows : s.T;
            for (std::size_t j0 = 0; j0 < key_end; j0 += Bc) {
                const std::size_t cols = std::min(Bc, s.T - j0);
                for (std::size_t r = 0; r < rows; ++r) {
                    const std::size_t i = i0 + r;
                    float* srow = scores.data() + r * Bc;
                    for (std::size_t c = 0; c < cols; ++c) {
                        const std::size_t j = j0 + c;
                        srow[c] = (s.causal && j > i)
                                      ? neg_inf
                                      : dot(q + o + i * s.hs, k + o + j * s.hs, s.hs) * scale;
                    }
                    online_softmax_update(m[r], l[r], acc.data() + r * s.hs, srow,
                                          v + o + j0 * s.hs, cols, s.hs);
                }
            }
            for (std::size_t r = 0; r < rows; ++r) {
                float* out_row = out + o + (i0 + r) * s.hs;
                for (std::size_t d = 0; d < s.hs; ++d) out_row[d] = acc[r * s.hs + d] / l[r];
                lse[bh * s.T + i0 + r] = m[r] + std::log(l[r]);
            }
        }
    }
}

void attention_flash_backward(float* dq, float* dk, float* dv, const float* dout,
                              const float* q, const float* k, const float* v, const float* out,
                              const float* lse, const AttentionShape& s,
                              const FlashBlocks& blocks) {
    check_attention_shape(s);
    check_blocks(blocks);
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.hs));
    const std::size_t Br = blocks.rows, Bc = blocks.cols;
    std::fill(dq, dq + s.qkv_size(), 0.0f);
    std::fill(dk, dk + s.qkv_size(), 0.0f);
    std::fill(dv, dv + s.qkv_size(), 0.0f);
    std::vector<float> delta(s.T);  // (T): D_i = dout_i · out_i = Σ_j P_ij dP_ij
    for (std::size_t bh = 0; bh < s.B * s.NH; ++bh) {
        const std::size_t o = head_offset(s, bh);
        for (std::size_t i = 0; i < s.T; ++i) {
            delta[i] = dot(dout + o + i * s.hs, out + o + i * s.hs, s.hs);
        }
        for (std::size_t j0 = 0; j0 < s.T; j0 += Bc) {
            const std::size_t cols = std::min(Bc, s.T - j0);
            // Causal: query tiles ending before this key tile's first key cannot see it.
            const std::size_t first_row_tile = s.causal ? (j0 / Br) * Br : 0;
            for (std::size_t i0 = first_row_tile; i0 < s.T; i0 += Br) {
                const std::size_t rows = std::min(Br, s.T - i0);
                for (std::size_t r = 0; r < rows; ++r) {
                    const std::size_t i = i0 + r;
                    const float* q_row = q + o + i * s.hs;
                    const float* dout_row = dout + o + i * s.hs;
                    float* dq_row = dq + o + i * s.hs;
                    for (std::size_t c = 0; c < cols; ++c) {
                        const std::size_t j = j0 + c;
                        if (s.causal && j > i) break;
                        const float* k_row = k + o + j * s.hs;
                        // Recompute P_ij from the saved log-sum-exp: no (T, T) matrix kept.
                        const float p = exp_difference(dot(q_row, k_row, s.hs) * scale,
                                                       lse[bh * s.T + i]);
                        const float dp = dot(dout_row, v + o + j * s.hs, s.hs);
                        const float g = scale * p * (dp - delta[i]);  // scale · dS_ij
                        float* dv_row = dv + o + j * s.hs;
                        float* dk_row = dk + o + j * s.hs;
                        for (std::size_t d = 0; d < s.hs; ++d) {
                            dv_row[d] += p * dout_row[d];
                            dq_row[d] += g * k_row[d];
                            dk_row[d] += g * q_row[d];
                        }
                    }
                }
            }
        }
    }
}

std::size_t plain_score_floats(std::size_t T) { return T * T; }

std::size_t flash_working_floats(const FlashBlocks& blocks, std::size_t hs) {
    return blocks.rows * blocks.cols + blocks.rows * hs + 2 * blocks.rows;
}

double max_abs_error(const float* a, const double* ref, std::size_t n) {
    double worst = 0.0;
    for (std::size_t i = 0; i < n; ++i) {
        const double d = std::fabs(static_cast<double>(a[i]) - ref[i]);
        if (std::isnan(d)) return std::numeric_limits<double>::infinity();
        worst = std::max(worst, d);
    }
    return worst;
}

double max_abs(const double* ref, std::size_t n) {
    double largest = 0.0;
    for (std::size_t i = 0; i < n; ++i) largest = std::max(largest, std::fabs(ref[i]));
    return largest;
}

bool passes_flash_rule(double fused_error, double plain_error, double reference_scale) {
    const double floor = 4.0 * std::numeric_limits<float>::epsilon() * reference_scale;
    return fused_error <= 2.0 * plain_error + floor;
}

std::vector<double> to_double(const float* data, std::size_t n) {
    return std::vector<double>(data, data + n);
}

}  // namespace attn
