// Fused attention on the GPU in the FlashAttention manner, float32 on the CUDA cores.
//
// Forward (flash_forward_kernel): one block of 16×16 threads per (query tile of kBr rows,
// head). The block keeps its queries in shared memory and walks the key tiles of kBc keys:
// load K, V tiles → S = scale · Q Kᵀ (each thread a 4×4 piece in registers) → online
// softmax per row (running max m and sum l, the output rescaled by e^(m − m_new)) →
// P to shared memory → O += P V. Causal: key tiles wholly after the last query are never
// visited. It writes O and each row's log-sum-exp, never the (T, T) matrix.
//
// Backward: FlashAttention-2's order, on one of two schedules (FlashBackwardSchedule).
// flash_backward_dkdv_kernel: one block per (key tile, head) keeps K, V and its dK, dV
// accumulators and walks the query tiles that can see it: recompute P = e^(S − lse) from
// the saved log-sum-exp, dP = dO Vᵀ, dS = P ∘ (dP − D) with D_i = dO_i · O_i
// (flash_delta_kernel), then dV += Pᵀ dO and dK += dSᵀ Q.
//   key_tiles: the block also adds dQ += dS K for its key tile to dQ's rows; every key tile
//   adds to the same rows, so the tiles run one launch each, in order, B·NH blocks a launch.
//   two_grids: one launch of (key tiles × B·NH) blocks for dK, dV, then
//   flash_backward_dq_kernel, one block per (query tile, head), which walks the key tiles
//   its queries see and recomputes P and dS for dQ += dS K: seven tile products instead of
//   five, the order of the Triton tutorial's fused attention (triton-lang.org, "Fused
//   Attention": _attn_bwd_dkdv, _attn_bwd_dq), for a grid that fills the SMs when B·NH
//   alone leaves most of them idle.
// Either way every output element is written by one block, summed in a fixed order: no
// atomics, the same bits on every run. Measured on an H200 (132 SMs; the logs are in
// tools/cuda/measured/2026-11-26-h200-second/): at hs 128, T = 4096, B·NH = 64, fwd+bwd
// 54.4 ms with two_grids against 69.7 ms with key_tiles; at B·NH ≥ 128, two_grids was
// slower (hs 128, T = 2048: 28.0 against 21.1 ms; the recipe's training step 19.8 against
// 18.8 ms), hence automatic: two_grids only when B·NH is under half the SMs.
//
// Dropout on the weights (training): the forward blends V with the dropped, rescaled
// weights while l sums the undropped ones, so lse stays that of the softmax; the backward
// regenerates each mask from its seed and index (nothing stored), uses the dropped weights
// for dV and passes dP through the mask before dS = P ∘ (dP − D). D = dO · O still holds,
// O being the dropped blend. The mask of weight (i, j) is that of the materialised path.
//
// 16-bit storage (flash_attention_forward_16bit): the forward kernel loads float16 or
// bfloat16 tiles, converting each element to float32 as it goes into shared memory, and
// rounds the output as it stores it; everything between runs in float32, as above.
//
// Thread layout, shared by both kernels: thread (tx, ty) owns rows ty + 16r (r < 4) and
// columns tx + 16c of each tile; the 16 threads of a row group are one half-warp, so row
// reductions are four __shfl_xor_sync steps. Rows of shared memory are padded by one
// float so that the column-strided reads hit 32 different banks.
#include "attn/cuda/attention.hpp"
#include "half.cuh"
#include "kernels.cuh"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace attn::cuda {

namespace {

using detail::require;

constexpr int kBr = 64;               // query rows per tile
constexpr int kBc = 64;               // keys per tile
constexpr int kThreads = 16;          // threads per block along x and along y: 256 in all
constexpr int kRows = kBr / kThreads; // rows per thread (4)
constexpr int kCols = kBc / kThreads; // score columns per thread (4)
static_assert(kBr == kBc, "the causal tile bounds below assume square tiles");

// Shared-memory sizes in floats; every leading dimension is padded by one (see above).
template <int HS>
constexpr int forward_smem_floats() {
    return kBr * (HS + 1) + 2 * kBc * (HS + 1) + kBr * (kBc + 1);  // Q, K, V, P
}
template <int HS>
constexpr int backward_smem_floats() {
    return 2 * kBc * (HS + 1) + 2 * kBr * (HS + 1) + 2 * kBr * (kBc + 1) + 2 * kBr;
    // K, V, Q, dO, P, dS, lse, D
}
template <int HS>
constexpr int backward_dq_smem_floats() {
    return 2 * kBc * (HS + 1) + 2 * kBr * (HS + 1) + kBr * (kBc + 1) + 2 * kBr;
    // K, V, Q, dO, dS, lse, D
}

// Copies `valid` rows of HS values (row-major, contiguous) from global memory into a
// shared (rows, ld) float tile and zero-fills the rows after them: a stray NaN in an unused
// row would otherwise survive a multiplication by zero. Floats go as float4 (src must be
// 16-byte aligned); 16-bit values one by one, converted to float32.
template <int HS, class Elem>
__device__ void load_tile(float* dst, int ld, const Elem* src, int valid, int rows) {
    const int tid = threadIdx.y * kThreads + threadIdx.x;
    if constexpr (std::is_same<Elem, float>::value) {
        constexpr int vectors_per_row = HS / 4;
        for (int idx = tid; idx < rows * vectors_per_row; idx += kThreads * kThreads) {
            const int r = idx / vectors_per_row, c = (idx % vectors_per_row) * 4;
            float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < valid) x = *reinterpret_cast<const float4*>(src + static_cast<long long>(r) * HS + c);
            float* d = dst + r * ld + c;
            d[0] = x.x;
            d[1] = x.y;
            d[2] = x.z;
            d[3] = x.w;
        }
    } else {
        for (int idx = tid; idx < rows * HS; idx += kThreads * kThreads) {
            const int r = idx / HS, c = idx % HS;
            dst[r * ld + c] = r < valid ? detail::to_float(src[static_cast<long long>(r) * HS + c]) : 0.0f;
        }
    }
}

// What the forward kernel stores: its head size, and the type of q, k, v and out (float,
// __half or __nv_bfloat16). One type, so that a launch names one template argument.
template <int HS, class E>
struct Storage {
    static constexpr int hs = HS;
    using Elem = E;
};

// Dropout's factor for weight (i, j) of head `head`: 0 if dropped, 1/(1 − p) if kept, 1
// without dropout. The index is the weight's place in a (B·NH, T, T) matrix, as in the
// materialised softmax kernel.
__device__ inline float keep_factor(float p, float keep_scale, std::uint64_t seed,
                                    long long head, int T, int i, int j) {
    if (p <= 0.0f) return 1.0f;
    const auto index = static_cast<std::uint64_t>((head * T + i) * static_cast<long long>(T) + j);
    return dropout_uniform(seed, index) < p ? 0.0f : keep_scale;
}

// Reductions over the 16 lanes of a half-warp (one row group).
__device__ float row_group_max(float x) {
    for (int offset = 8; offset > 0; offset /= 2) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
    }
    return x;
}
__device__ float row_group_sum(float x) {
    for (int offset = 8; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

template <class S>
static __global__ void __launch_bounds__(kThreads* kThreads)
    flash_forward_kernel(typename S::Elem* out, float* lse, const typename S::Elem* q,
                         const typename S::Elem* k, const typename S::Elem* v, int T, bool causal,
                         float scale, float drop_p, std::uint64_t seed) {
    constexpr int HS = S::hs;
    using Elem = typename S::Elem;
    constexpr int D = HS / kThreads;  // output columns per thread
    constexpr int ldq = HS + 1, ldk = HS + 1, ldv = HS + 1, ldp = kBc + 1;
    ATTN_DYNAMIC_SHARED(float, smem);
    float* Q_s = smem;               // (kBr, ldq)
    float* K_s = Q_s + kBr * ldq;    // (kBc, ldk)
    float* V_s = K_s + kBc * ldk;    // (kBc, ldv)
    float* P_s = V_s + kBc * ldv;    // (kBr, ldp)

    const int tx = threadIdx.x, ty = threadIdx.y;
    const float keep_scale = drop_p > 0.0f ? 1.0f / (1.0f - drop_p) : 1.0f;
    // The heaviest causal tiles (the last queries) are started first, so the short ones
    // fill in the tail.
    const int q_tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);
    const long long head = blockIdx.y;  // b·NH + h
    const long long base = head * T * HS;
    const int q0 = q_tile * kBr;
    const int q_valid = min(kBr, T - q0);
    load_tile<HS>(Q_s, ldq, q + base + static_cast<long long>(q0) * HS, q_valid, kBr);

    float m[kRows], l[kRows], acc[kRows][D];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int c = 0; c < D; ++c) acc[r][c] = 0.0f;
    }

    const int k_tiles = (T + kBc - 1) / kBc;
    // Causal: tiles starting after this tile's last query are all masked; skip them.
    const int k_tile_end = causal ? min(k_tiles, (q0 + q_valid - 1) / kBc + 1) : k_tiles;
    for (int kt = 0; kt < k_tile_end; ++kt) {
        const int k0 = kt * kBc;
        const int k_valid = min(kBc, T - k0);
        __syncthreads();  // everyone is done reading the previous K, V and P tiles
        load_tile<HS>(K_s, ldk, k + base + static_cast<long long>(k0) * HS, k_valid, kBc);
        load_tile<HS>(V_s, ldv, v + base + static_cast<long long>(k0) * HS, k_valid, kBc);
        __syncthreads();

        // s[r][c] = q_(q0+ty+16r) · k_(k0+tx+16c)
        float s[kRows][kCols];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int c = 0; c < kCols; ++c) s[r][c] = 0.0f;
#pragma unroll 8
        for (int d = 0; d < HS; ++d) {
            float qd[kRows], kd[kCols];
#pragma unroll
            for (int r = 0; r < kRows; ++r) qd[r] = Q_s[(ty + kThreads * r) * ldq + d];
#pragma unroll
            for (int c = 0; c < kCols; ++c) kd[c] = K_s[(tx + kThreads * c) * ldk + d];
#pragma unroll
            for (int r = 0; r < kRows; ++r)
#pragma unroll
                for (int c = 0; c < kCols; ++c) s[r][c] = fmaf(qd[r], kd[c], s[r][c]);
        }

        // The online softmax, row by row: m_new = max(m, rowmax), l = e^(m − m_new) l + Σ p,
        // acc = e^(m − m_new) acc (+ P V below).
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const int i = q0 + ty + kThreads * r;
            float row_max = -INFINITY;
#pragma unroll
            for (int c = 0; c < kCols; ++c) {
                const int j = k0 + tx + kThreads * c;
                const bool visible = j < T && (!causal || j <= i);
                s[r][c] = visible ? s[r][c] * scale : -INFINITY;
                row_max = fmaxf(row_max, s[r][c]);
            }
            row_max = row_group_max(row_max);
            const float m_new = fmaxf(m[r], row_max);
            // A row with every key so far masked keeps m = −∞; subtracting 0 instead keeps
            // e^(−∞ − m) = 0 rather than NaN.
            const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
            const float rescale = expf(m[r] - m_ref);
            float row_sum = 0.0f;
#pragma unroll
            for (int c = 0; c < kCols; ++c) {
                s[r][c] = expf(s[r][c] - m_ref);
                row_sum += s[r][c];
            }
            row_sum = row_group_sum(row_sum);
            l[r] = l[r] * rescale + row_sum;
            m[r] = m_new;
#pragma unroll
            for (int c = 0; c < D; ++c) acc[r][c] *= rescale;
            // l has the undropped weights; V is blended with the dropped ones.
#pragma unroll
            for (int c = 0; c < kCols; ++c) {
                const int j = k0 + tx + kThreads * c;
                P_s[(ty + kThreads * r) * ldp + tx + kThreads * c] =
                    s[r][c] * keep_factor(drop_p, keep_scale, seed, head, T, i, j);
            }
        }
        __syncthreads();  // P complete

        // acc[r][c] += Σ_j P[ty+16r][j] · V[j][tx+16c]
#pragma unroll 4
        for (int j = 0; j < kBc; ++j) {
            float pj[kRows], vj[D];
#pragma unroll
            for (int r = 0; r < kRows; ++r) pj[r] = P_s[(ty + kThreads * r) * ldp + j];
#pragma unroll
            for (int c = 0; c < D; ++c) vj[c] = V_s[j * ldv + tx + kThreads * c];
#pragma unroll
            for (int r = 0; r < kRows; ++r)
#pragma unroll
                for (int c = 0; c < D; ++c) acc[r][c] = fmaf(pj[r], vj[c], acc[r][c]);
        }
    }

#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const int i = q0 + ty + kThreads * r;
        if (i >= T) continue;
        const float inv = 1.0f / l[r];  // l ≥ 1: the row's largest term is e^0
        Elem* out_row = out + base + static_cast<long long>(i) * HS;
#pragma unroll
        for (int c = 0; c < D; ++c) out_row[tx + kThreads * c] = detail::from_float<Elem>(acc[r][c] * inv);
        if (tx == 0) lse[head * T + i] = m[r] + logf(l[r]);
    }
}

// delta (rows) = Σ_d dout[row][d] · out[row][d], rows = B·NH·T. One warp per row.
static __global__ void flash_delta_kernel(float* delta, const float* dout, const float* out,
                                          long long rows, int hs) {
    const long long row = static_cast<long long>(blockIdx.x) * 8 + threadIdx.x / 32;
    const int lane = static_cast<int>(threadIdx.x % 32);
    if (row >= rows) return;
    float sum = 0.0f;
    for (int d = lane; d < hs; d += 32) sum += dout[row * hs + d] * out[row * hs + d];
    for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) delta[row] = sum;
}

// This key tile's share of dQ for the thread's rows: dq_part[r][c] = Σ_j dS[i][j] K[j][d] for
// queries i = ty+16r and columns d = tx+16c, from scale · dS in dS_s and the key tile in K_s;
// summed over j in order, the same bits in both backward schedules.
template <int HS>
__device__ __forceinline__ void dq_tile_share(float (&dq_part)[kRows][HS / kThreads],
                                              const float* dS_s, const float* K_s) {
    constexpr int D = HS / kThreads, ld = HS + 1, ldp = kBc + 1;
    const int tx = threadIdx.x, ty = threadIdx.y;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int c = 0; c < D; ++c) dq_part[r][c] = 0.0f;
#pragma unroll 4
    for (int j = 0; j < kBc; ++j) {
        float dsj[kRows], kj[D];
#pragma unroll
        for (int r = 0; r < kRows; ++r) dsj[r] = dS_s[(ty + kThreads * r) * ldp + j];
#pragma unroll
        for (int c = 0; c < D; ++c) kj[c] = K_s[j * ld + tx + kThreads * c];
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int c = 0; c < D; ++c) dq_part[r][c] = fmaf(dsj[r], kj[c], dq_part[r][c]);
    }
}

// One (query tile, key tile) pair of the backward pass, from the tiles in shared memory:
// s = q_i · k_j and dp = dO_i · v_j for queries i = q0+ty+16r, keys j = k0+tx+16c;
// P = e^(scale·s − lse) (recomputed, masked entries 0); with dropout's factor z the blend
// used P ∘ z, so dV takes P ∘ z and dP is dO Vᵀ ∘ z; scale · dS = scale · P (dP − D).
// Writes P ∘ z to P_s (when P_s is not null) and scale · dS to dS_s.
template <int HS>
__device__ void backward_tile_scores(float* P_s, float* dS_s, const float* Q_s, const float* dO_s,
                                     const float* K_s, const float* V_s, const float* lse_s,
                                     const float* D_s, int q0, int k0, int T, bool causal,
                                     float scale, float drop_p, float keep_scale,
                                     std::uint64_t seed, long long head) {
    constexpr int ld = HS + 1, ldp = kBc + 1;
    const int tx = threadIdx.x, ty = threadIdx.y;
    float s[kRows][kCols], dp[kRows][kCols];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int c = 0; c < kCols; ++c) s[r][c] = dp[r][c] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < HS; ++d) {
        float qd[kRows], od[kRows], kd[kCols], vd[kCols];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            qd[r] = Q_s[(ty + kThreads * r) * ld + d];
            od[r] = dO_s[(ty + kThreads * r) * ld + d];
        }
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
            kd[c] = K_s[(tx + kThreads * c) * ld + d];
            vd[c] = V_s[(tx + kThreads * c) * ld + d];
        }
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int c = 0; c < kCols; ++c) {
                s[r][c] = fmaf(qd[r], kd[c], s[r][c]);
                dp[r][c] = fmaf(od[r], vd[c], dp[r][c]);
            }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const int row = ty + kThreads * r, i = q0 + row;
#pragma unroll
        for (int c = 0; c < kCols; ++c) {
            const int col = tx + kThreads * c, j = k0 + col;
            const bool visible = i < T && j < T && (!causal || j <= i);
            const float p = visible ? expf(s[r][c] * scale - lse_s[row]) : 0.0f;
            const float z = visible ? keep_factor(drop_p, keep_scale, seed, head, T, i, j) : 0.0f;
            if (P_s) P_s[row * ldp + col] = p * z;
            dS_s[row * ldp + col] = scale * p * (dp[r][c] * z - D_s[row]);
        }
    }
}

// Loads the query-side tiles of query tile q0: Q, dO, and each row's lse and D.
template <int HS>
__device__ void load_query_side(float* Q_s, float* dO_s, float* lse_s, float* D_s, const float* q,
                                const float* dout, const float* lse, const float* delta,
                                long long head, long long base, int T, int q0) {
    constexpr int ld = HS + 1;
    const int tid = threadIdx.y * kThreads + threadIdx.x;
    const int q_valid = min(kBr, T - q0);
    load_tile<HS>(Q_s, ld, q + base + static_cast<long long>(q0) * HS, q_valid, kBr);
    load_tile<HS>(dO_s, ld, dout + base + static_cast<long long>(q0) * HS, q_valid, kBr);
    for (int r = tid; r < kBr; r += kThreads * kThreads) {
        lse_s[r] = r < q_valid ? lse[head * T + q0 + r] : 0.0f;
        D_s[r] = r < q_valid ? delta[head * T + q0 + r] : 0.0f;
    }
}

// dK and dV: one block per (key tile, head), blockIdx = (key tile, b·NH + h). The block
// keeps K, V and its dK, dV accumulators and walks the query tiles that can see it.
// kAddDq (the key-tile schedule): the block also adds its key tile's share of dQ to the rows
// in global memory; one launch per key tile (key_tile), in order, so the shares add up in
// the same order on every run. Otherwise blockIdx.x is the key tile and dQ is left alone.
template <int HS, bool kAddDq>
static __global__ void __launch_bounds__(kThreads* kThreads)
    flash_backward_dkdv_kernel(float* dq, float* dk, float* dv, const float* dout, const float* q,
                               const float* k, const float* v, const float* lse,
                               const float* delta, int T, bool causal, float scale,
                               float drop_p, std::uint64_t seed, int key_tile) {
    constexpr int D = HS / kThreads;
    constexpr int ld = HS + 1, ldp = kBc + 1;
    ATTN_DYNAMIC_SHARED(float, smem);
    float* K_s = smem;                // (kBc, ld)
    float* V_s = K_s + kBc * ld;      // (kBc, ld)
    float* Q_s = V_s + kBc * ld;      // (kBr, ld)
    float* dO_s = Q_s + kBr * ld;     // (kBr, ld)
    float* P_s = dO_s + kBr * ld;     // (kBr, ldp)
    float* dS_s = P_s + kBr * ldp;    // (kBr, ldp), holds scale · dS
    float* lse_s = dS_s + kBr * ldp;  // (kBr)
    float* D_s = lse_s + kBr;         // (kBr)

    const int tx = threadIdx.x, ty = threadIdx.y;
    const float keep_scale = drop_p > 0.0f ? 1.0f / (1.0f - drop_p) : 1.0f;
    // Key tile 0 is seen by every query tile (the heaviest under a causal mask): it starts first.
    const int kt = kAddDq ? key_tile : static_cast<int>(blockIdx.x);
    const long long head = blockIdx.y;
    const long long base = head * T * HS;
    const int k0 = kt * kBc;
    const int k_valid = min(kBc, T - k0);
    load_tile<HS>(K_s, ld, k + base + static_cast<long long>(k0) * HS, k_valid, kBc);
    load_tile<HS>(V_s, ld, v + base + static_cast<long long>(k0) * HS, k_valid, kBc);

    // dK, dV for keys k0 + ty + 16r, columns tx + 16c.
    float dk_acc[kRows][D], dv_acc[kRows][D];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int c = 0; c < D; ++c) dk_acc[r][c] = dv_acc[r][c] = 0.0f;

    const int q_tiles = (T + kBr - 1) / kBr;
    // Causal: query tiles that end before this key tile's first key cannot see it.
    for (int qt = causal ? k0 / kBr : 0; qt < q_tiles; ++qt) {
        const int q0 = qt * kBr;
        __syncthreads();  // everyone is done with the previous Q, dO, P, dS (and K, V loaded)
        load_query_side<HS>(Q_s, dO_s, lse_s, D_s, q, dout, lse, delta, head, base, T, q0);
        __syncthreads();
        backward_tile_scores<HS>(P_s, dS_s, Q_s, dO_s, K_s, V_s, lse_s, D_s, q0, k0, T, causal,
                                 scale, drop_p, keep_scale, seed, head);
        __syncthreads();  // P and dS complete

        // dV[j][d] += Σ_i P[i][j] dO[i][d],  dK[j][d] += Σ_i dS[i][j] Q[i][d]
#pragma unroll 4
        for (int i = 0; i < kBr; ++i) {
            float pi[kRows], dsi[kRows], oi[D], qi[D];
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                pi[r] = P_s[i * ldp + ty + kThreads * r];
                dsi[r] = dS_s[i * ldp + ty + kThreads * r];
            }
#pragma unroll
            for (int c = 0; c < D; ++c) {
                oi[c] = dO_s[i * ld + tx + kThreads * c];
                qi[c] = Q_s[i * ld + tx + kThreads * c];
            }
#pragma unroll
            for (int r = 0; r < kRows; ++r)
#pragma unroll
                for (int c = 0; c < D; ++c) {
                    dv_acc[r][c] = fmaf(pi[r], oi[c], dv_acc[r][c]);
                    dk_acc[r][c] = fmaf(dsi[r], qi[c], dk_acc[r][c]);
                }
        }
        if constexpr (kAddDq) {
            // dQ[i][d] += Σ_j dS[i][j] K[j][d], this key tile's share, added to the rows
            // that the launches of the key tiles before it added to.
            float dq_part[kRows][D];
            dq_tile_share<HS>(dq_part, dS_s, K_s);
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
                const int i = q0 + ty + kThreads * r;
                if (i >= T) continue;
                float* dq_row = dq + base + static_cast<long long>(i) * HS;
#pragma unroll
                for (int c = 0; c < D; ++c) dq_row[tx + kThreads * c] += dq_part[r][c];
            }
        }
    }

#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const int j = k0 + ty + kThreads * r;
        if (j >= T) continue;
        float* dk_row = dk + base + static_cast<long long>(j) * HS;
        float* dv_row = dv + base + static_cast<long long>(j) * HS;
#pragma unroll
        for (int c = 0; c < D; ++c) {
            dk_row[tx + kThreads * c] = dk_acc[r][c];
            dv_row[tx + kThreads * c] = dv_acc[r][c];
        }
    }
}

// dQ: one block per (query tile, head). The block keeps Q, dO and its dQ accumulator and
// walks the key tiles its queries see, recomputing P and dS (the dK/dV kernel computed them
// too: two of the five tile products are done twice, the price of never adding to one
// row from two blocks). Each key tile's share is summed on its own and added to the
// accumulator in key-tile order, so dQ has the same bits on every run.
template <int HS>
static __global__ void __launch_bounds__(kThreads* kThreads)
    flash_backward_dq_kernel(float* dq, const float* dout, const float* q, const float* k,
                             const float* v, const float* lse, const float* delta, int T,
                             bool causal, float scale, float drop_p, std::uint64_t seed) {
    constexpr int D = HS / kThreads;
    constexpr int ld = HS + 1, ldp = kBc + 1;
    ATTN_DYNAMIC_SHARED(float, smem);
    float* K_s = smem;                // (kBc, ld)
    float* V_s = K_s + kBc * ld;      // (kBc, ld)
    float* Q_s = V_s + kBc * ld;      // (kBr, ld)
    float* dO_s = Q_s + kBr * ld;     // (kBr, ld)
    float* dS_s = dO_s + kBr * ld;    // (kBr, ldp), holds scale · dS
    float* lse_s = dS_s + kBr * ldp;  // (kBr)
    float* D_s = lse_s + kBr;         // (kBr)

    const int tx = threadIdx.x, ty = threadIdx.y;
    const float keep_scale = drop_p > 0.0f ? 1.0f / (1.0f - drop_p) : 1.0f;
    // The last query tiles see the most keys under a causal mask: they start first.
    const int qt = static_cast<int>(gridDim.x - 1 - blockIdx.x);
    const long long head = blockIdx.y;
    const long long base = head * T * HS;
    const int q0 = qt * kBr;
    load_query_side<HS>(Q_s, dO_s, lse_s, D_s, q, dout, lse, delta, head, base, T, q0);

    float dq_acc[kRows][D];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
        for (int c = 0; c < D; ++c) dq_acc[r][c] = 0.0f;

    const int k_tiles = (T + kBc - 1) / kBc;
    // Causal: key tiles that start after this tile's last query are all masked.
    const int k_tile_end = causal ? min(k_tiles, qt + 1) : k_tiles;
    for (int kt = 0; kt < k_tile_end; ++kt) {
        const int k0 = kt * kBc;
        const int k_valid = min(kBc, T - k0);
        __syncthreads();  // everyone is done with the previous K, V and dS (and Q, dO loaded)
        load_tile<HS>(K_s, ld, k + base + static_cast<long long>(k0) * HS, k_valid, kBc);
        load_tile<HS>(V_s, ld, v + base + static_cast<long long>(k0) * HS, k_valid, kBc);
        __syncthreads();
        backward_tile_scores<HS>(nullptr, dS_s, Q_s, dO_s, K_s, V_s, lse_s, D_s, q0, k0, T,
                                 causal, scale, drop_p, keep_scale, seed, head);
        __syncthreads();  // dS complete

        // dQ[i][d] += Σ_j dS[i][j] K[j][d], this key tile's share summed first.
        float dq_part[kRows][D];
        dq_tile_share<HS>(dq_part, dS_s, K_s);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int c = 0; c < D; ++c) dq_acc[r][c] += dq_part[r][c];
    }

#pragma unroll
    for (int r = 0; r < kRows; ++r) {
        const int i = q0 + ty + kThreads * r;
        if (i >= T) continue;
        float* dq_row = dq + base + static_cast<long long>(i) * HS;
#pragma unroll
        for (int c = 0; c < D; ++c) dq_row[tx + kThreads * c] = dq_acc[r][c];
    }
}

void check_flash_arguments(const AttentionShape& s, std::initializer_list<const void*> vectors,
                           const AttentionDropout& dropout) {
    check_attention_shape(s);
    require(dropout.p >= 0.0f && dropout.p < 1.0f,
            "flash attention on the GPU: dropout must be in [0, 1), got " +
                std::to_string(dropout.p));
    require(flash_attention_supports(s.hs),
            "flash attention on the GPU: head size must be 64 or 128, got " + std::to_string(s.hs));
    require(s.B * s.NH <= 65535 && s.T <= (1u << 24),
            "flash attention on the GPU: B·NH must be at most 65535 and T at most 2^24");
    for (const void* p : vectors) {
        require(reinterpret_cast<std::uintptr_t>(p) % 16 == 0,
                "flash attention on the GPU: q, k, v and dout must be 16-byte aligned "
                "(whole float4 loads)");
    }
}

// Raises a kernel's dynamic shared-memory limit to what it needs (above the default 48 KiB),
// after checking that the device has that much per block.
template <class Kernel>
void allow_shared_memory(Kernel kernel, std::size_t bytes) {
    int device = 0, optin = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    if (bytes > static_cast<std::size_t>(optin)) {
        throw std::runtime_error("flash attention: needs " + std::to_string(bytes) +
                                 " bytes of shared memory per block, the device allows " +
                                 std::to_string(optin));
    }
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(bytes)));
}

template <class S>
void launch_flash_forward(typename S::Elem* out, float* lse, const typename S::Elem* q,
                          const typename S::Elem* k, const typename S::Elem* v,
                          const AttentionShape& s, cudaStream_t stream, const AttentionDropout& drop) {
    constexpr int HS = S::hs;
    constexpr std::size_t bytes = forward_smem_floats<HS>() * sizeof(float);
    static const bool ready = (allow_shared_memory(flash_forward_kernel<S>, bytes), true);
    (void)ready;
    const int T = static_cast<int>(s.T);
    const dim3 grid(static_cast<unsigned>((T + kBr - 1) / kBr), static_cast<unsigned>(s.B * s.NH));
    const dim3 block(kThreads, kThreads);
    const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
    ATTN_LAUNCH(flash_forward_kernel<S>, grid, block, bytes, stream)(out, lse, q, k, v, T, s.causal, scale,
                                                            drop.p, drop.seed);
    CUDA_CHECK(cudaGetLastError());
}

template <int HS>
void launch_flash_backward(float* dq, float* dk, float* dv, float* delta, const float* dout,
                           const float* q, const float* k, const float* v, const float* out,
                           const float* lse, const AttentionShape& s, cudaStream_t stream,
                           const AttentionDropout& drop, FlashBackwardSchedule schedule) {
    constexpr std::size_t bytes = backward_smem_floats<HS>() * sizeof(float);
    constexpr std::size_t dq_bytes = backward_dq_smem_floats<HS>() * sizeof(float);
    const FlashBackwardGrid g = flash_backward_grid(s, schedule);
    const int T = static_cast<int>(s.T);
    const long long rows = static_cast<long long>(s.rows());
    ATTN_LAUNCH(flash_delta_kernel, static_cast<unsigned>((rows + 7) / 8), 256, 0, stream)(delta, dout, out,
                                                                                  rows, HS);
    CUDA_CHECK(cudaGetLastError());
    const dim3 block(kThreads, kThreads);
    const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
// One name each for the launch macro (a template argument list's comma would split it).
#define flash_backward_key_tiles_kernel flash_backward_dkdv_kernel<HS, true>
#define flash_backward_two_grids_kernel flash_backward_dkdv_kernel<HS, false>
    if (g.schedule == FlashBackwardSchedule::key_tiles) {
        static const bool ready = (allow_shared_memory(flash_backward_dkdv_kernel<HS, true>, bytes), true);
        (void)ready;
        CUDA_CHECK(cudaMemsetAsync(dq, 0, s.qkv_size() * sizeof(float), stream));
        for (unsigned kt = 0; kt < g.key_tiles; ++kt) {
            ATTN_LAUNCH(flash_backward_key_tiles_kernel, dim3(1, g.heads), block, bytes, stream)(
                dq, dk, dv, dout, q, k, v, lse, delta, T, s.causal, scale, drop.p, drop.seed,
                static_cast<int>(kt));
            CUDA_CHECK(cudaGetLastError());
        }
        return;
    }
    static const bool ready = (allow_shared_memory(flash_backward_dkdv_kernel<HS, false>, bytes),
                               allow_shared_memory(flash_backward_dq_kernel<HS>, dq_bytes), true);
    (void)ready;
    ATTN_LAUNCH(flash_backward_two_grids_kernel, dim3(g.key_tiles, g.heads), block, bytes, stream)(
        nullptr, dk, dv, dout, q, k, v, lse, delta, T, s.causal, scale, drop.p, drop.seed, 0);
    CUDA_CHECK(cudaGetLastError());
    ATTN_LAUNCH(flash_backward_dq_kernel<HS>, dim3(g.query_tiles, g.heads), block, dq_bytes, stream)(
        dq, dout, q, k, v, lse, delta, T, s.causal, scale, drop.p, drop.seed);
    CUDA_CHECK(cudaGetLastError());
#undef flash_backward_key_tiles_kernel
#undef flash_backward_two_grids_kernel
}

}  // namespace

FlashBackwardGrid flash_backward_grid(const AttentionShape& s, FlashBackwardSchedule schedule) {
    FlashBackwardGrid g;
    g.key_tiles = static_cast<unsigned>((s.T + kBc - 1) / kBc);
    g.query_tiles = static_cast<unsigned>((s.T + kBr - 1) / kBr);
    g.heads = static_cast<unsigned>(s.B * s.NH);
    if (schedule == FlashBackwardSchedule::automatic) {
        int device = 0, sms = 0;
        CUDA_CHECK(cudaGetDevice(&device));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
        schedule = 2 * static_cast<long long>(g.heads) < sms ? FlashBackwardSchedule::two_grids
                                                              : FlashBackwardSchedule::key_tiles;
    }
    g.schedule = schedule;
    return g;
}

bool flash_attention_supports(std::size_t hs) { return hs == 64 || hs == 128; }

void flash_attention_forward(float* out, float* lse, const float* q, const float* k,
                             const float* v, const AttentionShape& s, void* stream,
                             const AttentionDropout& dropout) {
    check_flash_arguments(s, {q, k, v}, dropout);
    const auto st = static_cast<cudaStream_t>(stream);
    if (s.hs == 64) launch_flash_forward<Storage<64, float>>(out, lse, q, k, v, s, st, dropout);
    else launch_flash_forward<Storage<128, float>>(out, lse, q, k, v, s, st, dropout);
}

bool half_attention_supports(std::size_t hs) { return flash_attention_supports(hs); }

void flash_attention_forward_16bit(HalfBuffer& out, float* lse, const HalfBuffer& q,
                                   const HalfBuffer& k, const HalfBuffer& v,
                                   const AttentionShape& s, void* stream) {
    detail::check_half_attention("flash_attention_forward_16bit", s, out, {&q, &k, &v});
    const auto st = static_cast<cudaStream_t>(stream);
    const auto run = [&](auto elem) {
        using E = decltype(elem);
        auto* o = reinterpret_cast<E*>(out.data());
        const auto* qe = reinterpret_cast<const E*>(q.data());
        const auto* ke = reinterpret_cast<const E*>(k.data());
        const auto* ve = reinterpret_cast<const E*>(v.data());
        if (s.hs == 64) launch_flash_forward<Storage<64, E>>(o, lse, qe, ke, ve, s, st, {});
        else launch_flash_forward<Storage<128, E>>(o, lse, qe, ke, ve, s, st, {});
    };
    if (out.format() == Precision::bf16) run(__nv_bfloat16{});
    else run(__half{});
}

void flash_attention_backward(float* dq, float* dk, float* dv, float* delta, const float* dout,
                              const float* q, const float* k, const float* v, const float* out,
                              const float* lse, const AttentionShape& s, void* stream,
                              const AttentionDropout& dropout, FlashBackwardSchedule schedule) {
    check_flash_arguments(s, {q, k, v, dout}, dropout);
    const auto st = static_cast<cudaStream_t>(stream);
    if (s.hs == 64) launch_flash_backward<64>(dq, dk, dv, delta, dout, q, k, v, out, lse, s, st, dropout, schedule);
    else launch_flash_backward<128>(dq, dk, dv, delta, dout, q, k, v, out, lse, s, st, dropout, schedule);
}

}  // namespace attn::cuda
