// The tiled attention made fast on a CPU: the algorithm of flash.cpp's
// attention_flash_forward/backward, with each tile product (S = Q·Kᵀ, acc += P·V and the
// four products of the backward) one small OpenBLAS sgemm, the online softmax's loops
// vectorised (exp_approx, AVX2 chosen at load time), and the (batch, head, tile) items
// spread over the library's OpenMP threads.
#include "attn/flash.hpp"
#include "attn/gpt_layers.hpp"

#include "attn/fast_math.hpp"
#include "lanes.hpp"
#include "simd_clones.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace attn {

namespace {
using std::size_t;

constexpr float neg_inf = -std::numeric_limits<float>::infinity();

// Where one attention problem's rows live. Head bh = b·NH + h of q, k, v (and dq, dk, dv)
// starts at (b·NH + h)·T·hs with rows hs apart in the (B, NH, T, hs) layout of flash.hpp,
// and at b·T·3C + h·hs with rows 3C apart in the GPT's (B, T, 3C) `qkv`; out and dout
// likewise, (B, NH, T, hs) or (B, T, C).
struct Layout {
    size_t B, NH, T, hs;
    bool causal;
    size_t in_batch, in_head, in_row;     // q, k, v, dq, dk, dv: strides of b, h, t
    size_t out_batch, out_head, out_row;  // out, dout
    size_t k_offset, v_offset;            // k and v from q's pointer (0 when separate)

    size_t in(size_t bh) const { return (bh / NH) * in_batch + (bh % NH) * in_head; }
    size_t out(size_t bh) const { return (bh / NH) * out_batch + (bh % NH) * out_head; }
};

Layout flat_layout(const AttentionShape& s) {
    return {s.B, s.NH, s.T, s.hs, s.causal, s.NH * s.T * s.hs, s.T * s.hs, s.hs,
            s.NH * s.T * s.hs, s.T * s.hs, s.hs, 0, 0};
}

Layout gpt_layout(int B, int T, int C, int NH, bool causal) {
    const size_t c = static_cast<size_t>(C), t = static_cast<size_t>(T);
    return {static_cast<size_t>(B), static_cast<size_t>(NH), t, c / NH, causal,
            t * 3 * c, c / NH, 3 * c, t * c, c / NH, c, c, 2 * c};
}

// Tiles: a query tile's scores (Br, Bc), 64 KiB, its accumulator (Br, hs) and the key and
// value tiles it meets, 32 KiB each at hs = 64 and 64 KiB at hs = 128, stay in the L2 cache
// (1 MiB per core here). Measured on one core of an AMD EPYC, forward, T = 1024 and 4096,
// hs = 64 and 128, causal and not: 128 × 128 against 256 × 128, 128 × 256, 256 × 256,
// 64 × 256, 192 × 128 and 512 × 128. Larger query tiles gain up to 8% without the mask at
// T = 4096 and lose up to 25% with it at T = 1024 (fewer, longer items, more masked work
// on the diagonal); 128 × 128 is never more than 8% from the fastest.
constexpr size_t tile_rows = 128;  // Br: queries per tile
constexpr size_t tile_cols = 128;  // Bc: keys per tile

// Keys row i of the tile may see in a key tile starting at j0 with `cols` keys.
size_t visible(const Layout& L, size_t i, size_t j0, size_t cols) {
    if (!L.causal) return cols;
    return i < j0 ? 0 : std::min(cols, i - j0 + 1);
}

// The online-softmax step for a tile's rows (see online_softmax_update): turns the scores
// s (rows, cols) into e^(s − m_new) in place, zero where masked, and rescales each row's
// l and acc (rows, hs) by e^(m − m_new). `visible_of(r)` keys of row r are unmasked.
ATTN_SIMD_CLONES
void softmax_tile(float* s, float* m, float* l, float* acc, size_t rows, size_t cols,
                  size_t hs, const Layout& L, size_t i0, size_t j0) {
    for (size_t r = 0; r < rows; ++r) {
        float* row = s + r * tile_cols;
        const size_t n = visible(L, i0 + r, j0, cols);
        float tile_max = neg_inf;
#pragma omp simd reduction(max : tile_max)
        for (size_t j = 0; j < n; ++j) tile_max = row[j] > tile_max ? row[j] : tile_max;
        const float m_new = std::max(m[r], tile_max);
        if (m_new == neg_inf) {  // every key so far masked: nothing to add, and no NaN
            std::fill(row, row + cols, 0.0f);
            continue;
        }
        const float rescale = m[r] == neg_inf ? 0.0f : exp_approx(m[r] - m_new);
        for (size_t j = 0; j < n; ++j) row[j] = exp_approx(row[j] - m_new);
        for (size_t j = n; j < cols; ++j) row[j] = 0.0f;
        l[r] = l[r] * rescale + lane_sum(row, n);
        float* a = acc + r * hs;
        for (size_t d = 0; d < hs; ++d) a[d] *= rescale;
        m[r] = m_new;
    }
}

// One query tile of one head: out rows [i0, i0 + rows) and their log-sum-exps.
struct ForwardScratch {
    std::vector<float> s, acc, m, l;  // (Br, Bc), (Br, hs), (Br), (Br)
    explicit ForwardScratch(size_t hs)
        : s(tile_rows * tile_cols), acc(tile_rows * hs), m(tile_rows), l(tile_rows) {}
};

ATTN_SIMD_CLONES
void forward_query_tile(float* out, float* lse, const float* q, const float* k, const float* v,
                        const Layout& L, size_t i0, ForwardScratch& w) {
    const size_t hs = L.hs, ld = L.in_row;
    const size_t rows = std::min(tile_rows, L.T - i0);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    std::fill(w.m.begin(), w.m.end(), neg_inf);
    std::fill(w.l.begin(), w.l.end(), 0.0f);
    std::fill(w.acc.begin(), w.acc.end(), 0.0f);
    // Causal: key tiles starting after this tile's last query are all masked, never visited.
    const size_t key_end = L.causal ? i0 + rows : L.T;
    for (size_t j0 = 0; j0 < key_end; j0 += tile_cols) {
        const size_t cols = std::min(tile_cols, key_end - j0);
        // S (rows, cols) = Q (rows, hs) · Kᵀ (hs, cols) / √hs
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                    static_cast<int>(cols), static_cast<int>(hs), scale, q + i0 * ld,
                    static_cast<int>(ld), k + j0 * ld, static_cast<int>(ld), 0.0f, w.s.data(),
                    static_cast<int>(tile_cols));
        softmax_tile(w.s.data(), w.m.data(), w.l.data(), w.acc.data(), rows, cols, hs, L, i0, j0);
        // acc (rows, hs) += P (rows, cols) · V (cols, hs)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                    static_cast<int>(hs), static_cast<int>(cols), 1.0f, w.s.data(),
                    static_cast<int>(tile_cols), v + j0 * ld, static_cast<int>(ld), 1.0f,
                    w.acc.data(), static_cast<int>(hs));
    }
    for (size_t r = 0; r < rows; ++r) {
        const float inv = 1.0f / w.l[r];
        float* out_row = out + (i0 + r) * L.out_row;
        const float* a = w.acc.data() + r * hs;
        for (size_t d = 0; d < hs; ++d) out_row[d] = a[d] * inv;
        lse[i0 + r] = w.m[r] + std::log(w.l[r]);
    }
}

void fast_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                  const Layout& L) {
    const size_t tiles = (L.T + tile_rows - 1) / tile_rows;
    const long items = static_cast<long>(L.B * L.NH * tiles);
#pragma omp parallel
    {
        ForwardScratch w(L.hs);
        // Items (head, query tile), the last query tiles first: with the causal mask they
        // are the longest, and dynamic scheduling then ends with short ones.
#pragma omp for schedule(dynamic, 1)
        for (long item = 0; item < items; ++item) {
            const size_t bh = static_cast<size_t>(item) % (L.B * L.NH);
            const size_t tile = tiles - 1 - static_cast<size_t>(item) / (L.B * L.NH);
            const size_t o = L.in(bh);
            forward_query_tile(out + L.out(bh), lse + bh * L.T, q + o, k + o + L.k_offset,
                               v + o + L.v_offset, L, tile * tile_rows, w);
        }
    }
}

// The backward's element-wise step for one (query tile, key tile) pair: from the scores
// s (rows, cols) it makes P = e^(s − lse) in p, and from dP (rows, cols) in dp it makes
// dS/√hs = P ∘ (dP − D)/√hs in place.
ATTN_SIMD_CLONES
void probabilities_tile(float* p, const float* lse, size_t rows, size_t cols, const Layout& L,
                        size_t i0, size_t j0) {
    for (size_t r = 0; r < rows; ++r) {
        float* row = p + r * tile_cols;
        const size_t n = visible(L, i0 + r, j0, cols);
        const float row_lse = lse[r];
        for (size_t j = 0; j < n; ++j) row[j] = exp_approx(row[j] - row_lse);
        for (size_t j = n; j < cols; ++j) row[j] = 0.0f;
    }
}

ATTN_SIMD_CLONES
void score_gradient_tile(float* dp, const float* p, const float* delta, float scale, size_t rows,
                         size_t cols) {
    for (size_t r = 0; r < rows; ++r) {
        float* drow = dp + r * tile_cols;
        const float* prow = p + r * tile_cols;
        const float d = delta[r];
        for (size_t j = 0; j < cols; ++j) drow[j] = scale * prow[j] * (drow[j] - d);
    }
}

struct BackwardScratch {
    std::vector<float> p, dp, dk, dv;  // (Br, Bc), (Br, Bc), (Bc, hs), (Bc, hs)
    explicit BackwardScratch(size_t hs)
        : p(tile_rows * tile_cols), dp(tile_rows * tile_cols), dk(tile_cols * hs),
          dv(tile_cols * hs) {}
};

// One key tile of one head: adds its dk, dv rows [j0, j0 + cols) and its share of every
// query row's dq (into dq, rows dq_row apart).
void backward_key_tile(float* dq, size_t dq_row, float* dk, float* dv, const float* dout,
                       const float* q, const float* k, const float* v, const float* lse,
                       const float* delta, const Layout& L, size_t j0, BackwardScratch& w) {
    const size_t hs = L.hs, ld = L.in_row, ldo = L.out_row;
    const int lt = static_cast<int>(tile_cols), ih = static_cast<int>(hs);
    const int ild = static_cast<int>(ld), ildo = static_cast<int>(ldo);
    const size_t cols = std::min(tile_cols, L.T - j0);
    const int ic = static_cast<int>(cols);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    std::fill(w.dk.begin(), w.dk.end(), 0.0f);
    std::fill(w.dv.begin(), w.dv.end(), 0.0f);
    // Causal: query tiles ending before this key tile's first key cannot see it.
    const size_t first = L.causal ? (j0 / tile_rows) * tile_rows : 0;
    for (size_t i0 = first; i0 < L.T; i0 += tile_rows) {
        const size_t rows = std::min(tile_rows, L.T - i0);
        const int ir = static_cast<int>(rows);
        const float* q_i = q + i0 * ld;
        const float* dout_i = dout + i0 * ldo;
        // S = Q Kᵀ/√hs, then P = e^(S − lse): recomputed, never stored for the whole head
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ir, ic, ih, scale, q_i, ild,
                    k + j0 * ld, ild, 0.0f, w.p.data(), lt);
        probabilities_tile(w.p.data(), lse + i0, rows, cols, L, i0, j0);
        // out = P V   →   dV (cols, hs) += Pᵀ dout,  dP (rows, cols) = dout Vᵀ
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ic, ih, ir, 1.0f, w.p.data(), lt,
                    dout_i, ildo, 1.0f, w.dv.data(), ih);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, ir, ic, ih, 1.0f, dout_i, ildo,
                    v + j0 * ld, ild, 0.0f, w.dp.data(), lt);
        // P = softmax(S)   →   dS = P ∘ (dP − D), D_i = dout_i · out_i; scaled by 1/√hs here
        score_gradient_tile(w.dp.data(), w.p.data(), delta + i0, scale, rows, cols);
        // S = Q Kᵀ/√hs   →   dK (cols, hs) += dSᵀ Q/√hs,  dQ (rows, hs) += dS K/√hs
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ic, ih, ir, 1.0f, w.dp.data(), lt,
                    q_i, ild, 1.0f, w.dk.data(), ih);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ir, ih, ic, 1.0f, w.dp.data(), lt,
                    k + j0 * ld, ild, 1.0f, dq + i0 * dq_row, static_cast<int>(dq_row));
    }
    for (size_t c = 0; c < cols; ++c) {
        float* dk_row = dk + (j0 + c) * ld;
        float* dv_row = dv + (j0 + c) * ld;
        for (size_t d = 0; d < hs; ++d) {
            dk_row[d] += w.dk[c * hs + d];
            dv_row[d] += w.dv[c * hs + d];
        }
    }
}

// Adds the backward pass into dq, dk, dv (laid out as q, k, v).
void fast_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                   const float* k, const float* v, const float* out, const float* lse,
                   const Layout& L) {
    const size_t heads = L.B * L.NH, hs = L.hs;
    // D_i = dout_i · out_i = Σ_j P_ij dP_ij, per row: (B, NH, T)
    std::vector<float> delta(heads * L.T);
    const long rows = static_cast<long>(heads * L.T);
#pragma omp parallel for schedule(static)
    for (long row = 0; row < rows; ++row) {
        const size_t bh = static_cast<size_t>(row) / L.T, t = static_cast<size_t>(row) % L.T;
        const float* a = dout + L.out(bh) + t * L.out_row;
        const float* b = out + L.out(bh) + t * L.out_row;
        float sum = 0.0f;
        for (size_t d = 0; d < hs; ++d) sum += a[d] * b[d];
        delta[static_cast<size_t>(row)] = sum;
    }
    const size_t tiles = (L.T + tile_cols - 1) / tile_cols;
    const long items = static_cast<long>(heads * tiles);
    const int threads = static_cast<int>(std::min<long>(omp_get_max_threads(), items));
    // Key tiles on different threads add into the same dq rows: with more than one thread,
    // each adds into a zeroed (B, NH, T, hs) buffer of its own, and the buffers are added
    // into dq at the end, in thread order (so the result does not depend on the timing).
    std::vector<std::vector<float>> own_dq(static_cast<size_t>(threads));
#pragma omp parallel num_threads(threads)
    {
        // The team may be smaller than asked (one thread inside another parallel region).
        const int team = omp_get_num_threads();
        const size_t id = static_cast<size_t>(omp_get_thread_num());
        BackwardScratch w(hs);
        if (team > 1) own_dq[id].assign(heads * L.T * hs, 0.0f);
#pragma omp for schedule(static, 1)
        for (long item = 0; item < items; ++item) {
            const size_t bh = static_cast<size_t>(item) / tiles;
            const size_t j0 = (static_cast<size_t>(item) % tiles) * tile_cols;
            const size_t o = L.in(bh);
            float* dq_head = team > 1 ? own_dq[id].data() + bh * L.T * hs : dq + o;
            backward_key_tile(dq_head, team > 1 ? hs : L.in_row, dk + o + L.k_offset,
                              dv + o + L.v_offset, dout + L.out(bh), q + o, k + o + L.k_offset,
                              v + o + L.v_offset, lse + bh * L.T, delta.data() + bh * L.T, L, j0,
                              w);
        }
        if (team > 1) {  // after the loop's implicit barrier: every buffer is complete
#pragma omp for schedule(static)
            for (long row = 0; row < rows; ++row) {
                const size_t bh = static_cast<size_t>(row) / L.T;
                const size_t t = static_cast<size_t>(row) % L.T;
                float* dq_row = dq + L.in(bh) + t * L.in_row;
                for (size_t s = 0; s < static_cast<size_t>(team); ++s) {
                    const float* part = own_dq[s].data() + static_cast<size_t>(row) * hs;
                    for (size_t d = 0; d < hs; ++d) dq_row[d] += part[d];
                }
            }
        }
    }
}

}  // namespace

void attention_fast_forward(float* out, float* lse, const float* q, const float* k,
                            const float* v, const AttentionShape& shape) {
    check_attention_shape(shape);
    fast_forward(out, lse, q, k, v, flat_layout(shape));
}

void attention_fast_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse,
                             const AttentionShape& shape) {
    check_attention_shape(shape);
    std::fill(dq, dq + shape.qkv_size(), 0.0f);
    std::fill(dk, dk + shape.qkv_size(), 0.0f);
    std::fill(dv, dv + shape.qkv_size(), 0.0f);
    fast_backward(dq, dk, dv, dout, q, k, v, out, lse, flat_layout(shape));
}

void attention_fused_forward(float* out, float* lse, const float* qkv, int B, int T, int C,
                             int NH, bool causal) {
    const float* q = qkv;  // k and v are found at q + C and q + 2C by the layout
    fast_forward(out, lse, q, q, q, gpt_layout(B, T, C, NH, causal));
}

void attention_fused_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH, bool causal) {
    fast_backward(dqkv, dqkv, dqkv, dout, qkv, qkv, qkv, out, lse,
                  gpt_layout(B, T, C, NH, causal));
}

}  // namespace attn
