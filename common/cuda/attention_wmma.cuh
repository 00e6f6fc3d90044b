// Fused attention forward on the tensor cores, through CUDA's WMMA API.
//
// One block per (tile of Br queries, head): Br/16 warps, each owning 16 query rows, walk
// the key tiles of Bc = 32 keys:
//
//   load K, V tiles (16-bit) into shared memory
//   S (16 × Bc per warp) = Q Kᵀ      mma_sync over hs/16 steps, float32 accumulators,
//                                    stored to shared memory
//   online softmax, a row at a time, a lane per key, in float32: m_new = max(m, rowmax · scale),
//     p = e^(s − m_new), l = e^(m − m_new) l + Σ p, O = e^(m − m_new) O,
//     P = p rounded to the inputs' format (the tensor cores' next input)
//   O (16 × hs per warp) += P V      mma_sync over Bc/16 steps, O loaded from and stored
//                                    back to shared memory
//
// and finally write O / l (rounded to the format) and lse = m + ln l. Causal key tiles past
// the last query are skipped. O lives in shared memory rather than in accumulator
// fragments because its rows are rescaled one by one, and which fragment element holds
// which row is unspecified (it differs between GPUs).
//
// Kᵀ as matrix_b: element (d, j) of Kᵀ is K[j][d], at K_s[j·hs + d], which is the
// column-major layout of a (hs, Bc) matrix with leading dimension hs. The layout is a
// template parameter only so that a test can show what the wrong one (row_major) does.
//
// Shared memory (static, under 48 KiB): hs = 64 takes Br = 64 (4 warps), hs = 128 Br = 32
// (2 warps): Q (Br, hs) and K, V (Bc, hs) 16-bit, S (Br, Bc) float, P (Br, Bc) 16-bit,
// O (Br, hs) float, m and l (Br). Every tile a WMMA call reads starts 32-byte aligned and
// has a leading dimension that is a multiple of 16 bytes, as WMMA requires.
#pragma once

#include "half.cuh"

#include <mma.h>

#include <cmath>
#include <type_traits>

namespace attn::cuda::detail {

template <class E, int HS, class KLayout>
struct WmmaAttention {
    using Elem = E;
    using KFragmentLayout = KLayout;
    static constexpr int hs = HS;
    static constexpr int warps = HS == 64 ? 4 : 2;
    static constexpr int Br = 16 * warps;  // query rows per block
    static constexpr int Bc = 32;          // keys per tile
    static constexpr int threads = 32 * warps;
    static_assert(HS == 64 || HS == 128, "head sizes 64 and 128");

    struct Shared {
        alignas(32) Elem Q[Br * HS];
        alignas(32) Elem K[Bc * HS];
        alignas(32) Elem V[Bc * HS];
        alignas(32) float S[Br * Bc];
        alignas(32) Elem P[Br * Bc];
        alignas(32) float O[Br * HS];
        float m[Br], l[Br];
    };
    static_assert(sizeof(Shared) <= 48 * 1024, "static shared memory is at most 48 KiB");
};

// Copies `valid` rows of HS 16-bit values into a shared tile, zeros after them (a NaN in an
// unused row would survive a multiplication by zero).
template <int HS, class Elem>
__device__ void load_16bit_tile(Elem* dst, const Elem* src, int valid, int rows, int threads) {
    for (int idx = static_cast<int>(threadIdx.x); idx < rows * HS; idx += threads) {
        const int r = idx / HS;
        dst[idx] = r < valid ? src[idx] : from_float<Elem>(0.0f);
    }
}

template <class A>
__device__ void wmma_attention_body(typename A::Elem* out, float* lse, const typename A::Elem* q,
                                    const typename A::Elem* k, const typename A::Elem* v, int T,
                                    bool causal, float scale) {
    using namespace nvcuda;
    using Elem = typename A::Elem;
    constexpr int HS = A::hs, Br = A::Br, Bc = A::Bc;
    __shared__ typename A::Shared sm;
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    // The heaviest causal tiles (the last queries) first, as in the float32 kernel.
    const int q_tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);
    const long long head = blockIdx.y;  // b·NH + h
    const long long base = head * T * HS;
    const int q0 = q_tile * Br;
    const int q_valid = min(Br, T - q0);
    load_16bit_tile<HS>(sm.Q, q + base + static_cast<long long>(q0) * HS, q_valid, Br, A::threads);
    for (int idx = static_cast<int>(threadIdx.x); idx < Br * HS; idx += A::threads) sm.O[idx] = 0.0f;
    for (int r = static_cast<int>(threadIdx.x); r < Br; r += A::threads) {
        sm.m[r] = -INFINITY;
        sm.l[r] = 0.0f;
    }
    const Elem* Q_w = sm.Q + warp * 16 * HS;  // this warp's 16 rows
    float* S_w = sm.S + warp * 16 * Bc;
    Elem* P_w = sm.P + warp * 16 * Bc;
    float* O_w = sm.O + warp * 16 * HS;

    const int k_tiles = (T + Bc - 1) / Bc;
    const int k_tile_end = causal ? min(k_tiles, (q0 + q_valid - 1) / Bc + 1) : k_tiles;
    for (int kt = 0; kt < k_tile_end; ++kt) {
        const int k0 = kt * Bc;
        const int k_valid = min(Bc, T - k0);
        __syncthreads();  // every warp is done with the previous K and V
        load_16bit_tile<HS>(sm.K, k + base + static_cast<long long>(k0) * HS, k_valid, Bc, A::threads);
        load_16bit_tile<HS>(sm.V, v + base + static_cast<long long>(k0) * HS, k_valid, Bc, A::threads);
        __syncthreads();

        // S_w (16, Bc) = Q_w (16, hs) · Kᵀ (hs, Bc), 16 keys at a time
        for (int n = 0; n < Bc / 16; ++n) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag;
            wmma::fill_fragment(s_frag, 0.0f);
            for (int d = 0; d < HS / 16; ++d) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, Elem, wmma::row_major> q_frag;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, Elem, typename A::KFragmentLayout> k_frag;
                wmma::load_matrix_sync(q_frag, Q_w + d * 16, HS);
                wmma::load_matrix_sync(k_frag, sm.K + n * 16 * HS + d * 16, HS);
                wmma::mma_sync(s_frag, q_frag, k_frag, s_frag);
            }
            wmma::store_matrix_sync(S_w + n * 16, s_frag, Bc, wmma::mem_row_major);
        }
        __syncwarp();

        // The online softmax of the warp's 16 rows in float32, one row at a time with a lane
        // per key of the tile (Bc = 32, the warp's width): the row's max and sum by shuffles,
        // O's row rescaled by all 32 lanes. Consecutive lanes touch consecutive words of a row,
        // so no two of them meet in one shared-memory bank (a lane per row, as rows are 32 or
        // 64 words apart, would put all 16 in one bank).
        static_assert(Bc == 32, "a lane per key of the tile");
        for (int r = 0; r < 16; ++r) {
            const int row = warp * 16 + r, i = q0 + row, j = k0 + lane;
            const bool visible = i < T && j < T && (!causal || j <= i);
            const float s = visible ? sm.S[row * Bc + lane] * scale : -INFINITY;
            float row_max = s;
            for (int offset = 16; offset > 0; offset /= 2) {
                row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, offset));
            }
            const float m_old = sm.m[row], m_new = fmaxf(m_old, row_max);
            // A row with every key so far masked keeps m = −∞: subtract 0 instead, so that
            // e^(−∞) = 0 rather than NaN.
            const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
            const float rescale = expf(m_old - m_ref);
            const float p = expf(s - m_ref);
            sm.P[row * Bc + lane] = from_float<Elem>(p);
            float row_sum = p;  // l sums the float32 probabilities
            for (int offset = 16; offset > 0; offset /= 2) row_sum += __shfl_xor_sync(0xffffffffu, row_sum, offset);
            for (int d = lane; d < HS; d += 32) sm.O[row * HS + d] *= rescale;
            __syncwarp();  // every lane has read m and l of the row before lane 0 changes them
            if (lane == 0) {
                sm.l[row] = sm.l[row] * rescale + row_sum;
                sm.m[row] = m_new;
            }
        }
        __syncwarp();

        // O_w (16, hs) += P_w (16, Bc) · V (Bc, hs), 16 columns at a time
        for (int n = 0; n < HS / 16; ++n) {
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_frag;
            wmma::load_matrix_sync(o_frag, O_w + n * 16, HS, wmma::mem_row_major);
            for (int c = 0; c < Bc / 16; ++c) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, Elem, wmma::row_major> p_frag;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, Elem, wmma::row_major> v_frag;
                wmma::load_matrix_sync(p_frag, P_w + c * 16, Bc);
                wmma::load_matrix_sync(v_frag, sm.V + c * 16 * HS + n * 16, HS);
                wmma::mma_sync(o_frag, p_frag, v_frag, o_frag);
            }
            wmma::store_matrix_sync(O_w + n * 16, o_frag, HS, wmma::mem_row_major);
        }
        __syncwarp();
    }

    // O / l and lse, a row at a time, the lanes along the row: coalesced writes.
    for (int r = 0; r < 16; ++r) {
        const int row = warp * 16 + r, i = q0 + row;
        if (i >= T) break;  // the same for every lane: the rows past T come last
        const float inv = 1.0f / sm.l[row];  // l ≥ 1: the row's largest term is e^0
        Elem* out_row = out + base + static_cast<long long>(i) * HS;
        for (int d = lane; d < HS; d += 32) out_row[d] = from_float<Elem>(sm.O[row * HS + d] * inv);
        if (lane == 0) lse[head * T + i] = sm.m[row] + logf(sm.l[row]);
    }
}

template <class A>
__global__ void __launch_bounds__(A::threads)
    wmma_attention_kernel(typename A::Elem* out, float* lse, const typename A::Elem* q,
                          const typename A::Elem* k, const typename A::Elem* v, int T, bool causal,
                          float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // bfloat16 fragments exist from compute capability 8.0 on; the host refuses before.
    if constexpr (std::is_same<typename A::Elem, __nv_bfloat16>::value) {
        __trap();
    } else
#endif
    {
        wmma_attention_body<A>(out, lse, q, k, v, T, causal, scale);
    }
}

// Launches the kernel for one configuration (A = WmmaAttention<Elem, hs, K's layout>).
template <class A>
void launch_wmma_attention(typename A::Elem* out, float* lse, const typename A::Elem* q,
                           const typename A::Elem* k, const typename A::Elem* v,
                           const AttentionShape& s, cudaStream_t stream) {
    const int T = static_cast<int>(s.T);
    const dim3 grid(static_cast<unsigned>((T + A::Br - 1) / A::Br), static_cast<unsigned>(s.B * s.NH));
    const float scale = 1.0f / std::sqrt(static_cast<float>(A::hs));
    ATTN_LAUNCH(wmma_attention_kernel<A>, grid, A::threads, 0, stream)(out, lse, q, k, v, T, s.causal,
                                                                      scale);
    CUDA_CHECK(cudaGetLastError());
}

// The host function, with K's fragment layout as a parameter (see above).
template <class KLayout>
void wmma_attention_forward_with(HalfBuffer& out, float* lse, const HalfBuffer& q,
                                 const HalfBuffer& k, const HalfBuffer& v, const AttentionShape& s,
                                 void* stream) {
    check_half_attention("wmma_attention_forward", s, out, {&q, &k, &v});
    const std::string why = wmma_attention_unsupported(out.format());
    require(why.empty(), "wmma_attention_forward: " + why);
    const auto st = static_cast<cudaStream_t>(stream);
    const auto run = [&](auto elem) {
        using E = decltype(elem);
        auto* o = reinterpret_cast<E*>(out.data());
        const auto* qe = reinterpret_cast<const E*>(q.data());
        const auto* ke = reinterpret_cast<const E*>(k.data());
        const auto* ve = reinterpret_cast<const E*>(v.data());
        if (s.hs == 64) launch_wmma_attention<WmmaAttention<E, 64, KLayout>>(o, lse, qe, ke, ve, s, st);
        else launch_wmma_attention<WmmaAttention<E, 128, KLayout>>(o, lse, qe, ke, ve, s, st);
    };
    if (out.format() == Precision::bf16) run(__nv_bfloat16{});
    else run(__half{});
}

}  // namespace attn::cuda::detail
