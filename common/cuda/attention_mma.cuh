// Fused attention forward on the tensor cores through PTX's mma.sync m16n8k16 (mma.cuh):
// FlashAttention-2's forward (Dao 2023, Algorithm 1), with S, P and O in registers.
//
// One block per (tile of 64 queries, head): 4 warps, each owning 16 query rows, walk the
// key tiles of 64 keys:
//
//   Q's tile (16-bit) through shared memory into registers, once: each warp's A fragments
//     (16 × hs) by ldmatrix .x4, hs/16 of them
//   for each key tile (causal: tiles past the diagonal skipped)
//     K and V tiles (16-bit) into shared memory
//     S (16 × 64 per warp) = Q Kᵀ     mma.sync, K's rows through ldmatrix (not transposed):
//                                     a row of K is a column of Kᵀ, the B operand's layout
//     online softmax on S's accumulator registers, in float32 and base 2: the scale is
//       folded into log2 e, so p = 2^(s·scale·log2 e − m); each row's maximum and sum over
//       the 4 lanes of a group that hold it (__shfl_xor_sync 1 and 2); O's registers
//       rescaled by 2^(m_old − m_new); the diagonal tile and a partial last tile masked
//       element by element from the C layout
//     O (16 × hs per warp) += P V    P rounded to the inputs' format straight from S's
//                                     registers into A fragments (the C-to-A reuse below);
//                                     V through ldmatrix .trans as the B operand
//   O / l rounded to the format, lse = m·ln 2 + ln l, from the registers
//
// The register layouts are the PTX ISA's (written out in mma.cuh): lane l, g = l >> 2,
// t = l % 4, holds S[g][8j + 2t, 2t+1] and S[g+8][8j + 2t, 2t+1] of the n-tile j (keys 8j …
// 8j+7): c[0], c[1] and c[2], c[3]. The A fragment of a k16 step over keys 16c … 16c+15 wants
// P[g][2t, 2t+1], P[g+8][2t, 2t+1], P[g][2t+8, 2t+9], P[g+8][2t+8, 2t+9]: exactly n-tile 2c's
// c[0..1], c[2..3] and n-tile 2c+1's c[0..1], c[2..3], packed two to a register. So P never
// leaves the registers, and neither does O: a lane knows which rows it holds (g and g + 8),
// which WMMA's unspecified layout does not tell (attention_wmma.cuh keeps S and O in shared
// memory for that reason).
//
// Shared memory: K and V tiles of 64 rows, each row padded from hs to hs + 8 elements
// (16 bytes more): a row is then an odd number of 16-byte units long (9 for hs 64, 17 for
// hs 128), so the 8 row addresses of one ldmatrix matrix fall in 8 different 16-byte units
// of the 128 bytes the 32 banks span, and no two of them share a bank. Q's tile goes
// through K's buffer before the loop (its fragments then stay in registers): 18 KiB for
// hs 64, 34 KiB for hs 128, static.
//
// The loads overlap the products as in FlashAttention-2's kernel, with one buffer each for K
// and V: each 16-byte piece is copied by cp.async (global to shared without passing through
// registers, sm_80 on), so that V's tile arrives while S = Q Kᵀ runs, and the next K tile
// while O += P V runs; cp.async.wait_group and a barrier come before a tile is read. A row
// past T is filled with zeros by the copy itself (source size 0).
//
// MaskLayout, POrder and Mistake: template parameters only so that a test can show what wrong
// fragment indices do to the result; the library instantiates 0, 0 and MmaMistake::none alone.
#pragma once

#include "half.cuh"
#include "mma.cuh"

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace attn::cuda::detail {

enum class MmaMistake {
    none,
    row_max_over_two_lanes,  // the row maximum reduced over lanes t, t ^ 1 only
    v_not_transposed,        // V through ldmatrix without .trans
};

// Element i of permutation number k (0 … 23, in lexicographic order) of (0, 1, 2, 3).
constexpr int permutation_element(int k, int i) {
    int left[4] = {0, 1, 2, 3};
    const int factorial[4] = {6, 2, 1, 1};
    for (int position = 0; position < 4; ++position) {
        const int index = k / factorial[position];
        k %= factorial[position];
        const int chosen = left[index];
        for (int j = index; j < 3; ++j) left[j] = left[j + 1];
        if (position == i) return chosen;
    }
    return -1;
}

// MaskLayout: bits XORed into the C layout's offsets that the mask reads an element's query
// and key from: bit 0 the row offset of c[0], c[1] (0 → 8), bit 1 that of c[2], c[3] (8 → 0),
// bit 2 the key offset of c[0], c[2] (0 → 1), bit 3 that of c[1], c[3] (1 → 0); 0: the ISA's.
// POrder: the permutation (number, as above) of P's four A registers; 0: in order.
template <class E, int HS, int MaskLayout = 0, int POrder = 0, MmaMistake M = MmaMistake::none>
struct MmaAttention {
    using Elem = E;
    static constexpr int hs = HS;
    static constexpr int warps = 4;
    static constexpr int Br = 16 * warps;  // query rows per block
    static constexpr int Bc = 64;          // keys per tile
    static constexpr int threads = 32 * warps;
    static constexpr int ld = HS + 8;      // a shared row, padded (see above)
    static constexpr MmaMistake mistake = M;
    static constexpr int mask_layout = MaskLayout;
    static constexpr int p0 = permutation_element(POrder, 0), p1 = permutation_element(POrder, 1),
                         p2 = permutation_element(POrder, 2), p3 = permutation_element(POrder, 3);
    static_assert(HS == 64 || HS == 128, "head sizes 64 and 128");
    static_assert(MaskLayout >= 0 && MaskLayout < 16 && POrder >= 0 && POrder < 24, "a layout and an order");

    struct Shared {
        alignas(16) Elem K[Bc * ld];  // Q's tile first, then each K tile
        alignas(16) Elem V[Bc * ld];
    };
    static_assert(sizeof(Shared) <= 48 * 1024, "static shared memory is at most 48 KiB");
};

// Eight 16-bit elements, copied as one 16-byte access.
struct alignas(16) Chunk16 {
    std::uint32_t w[4];
};

// cp.async.cg.shared.global of 16 bytes, `src` read only when `valid` (else 16 zero bytes),
// and its group commit and wait. Under nvcc the zero fill is cp.async's own (a source size
// of 0); in the simulator a valid copy is mma.cuh's cp_async_ca, which lands only at the
// wait_group that covers it (a read before it is refused), and a row past the end is zeroed
// at once (nothing reads it before the wait either).
__device__ inline void cp_async_16(void* dst, const void* src, bool valid) {
#if defined(__CUDACC__)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const auto s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0));
#else
    Chunk16 x{};
    if (valid) x = *static_cast<const Chunk16*>(src);
    *static_cast<Chunk16*>(dst) = x;
#endif
#else
    if (valid) {
        ptx::cp_async_ca<16>(dst, src);
    } else {
        *static_cast<Chunk16*>(dst) = Chunk16{};
    }
#endif
}
__device__ inline void cp_async_commit() {
#if defined(__CUDACC__)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
#else
    ptx::cp_async_commit_group();
#endif
}
// Waits until at most `Pending` of this thread's committed groups are still in flight.
template <int Pending>
__device__ inline void cp_async_wait() {
#if defined(__CUDACC__)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending));
#endif
#else
    ptx::cp_async_wait_group<Pending>();
#endif
}

// Starts copying `valid` rows of HS 16-bit values into a padded shared tile of `rows` rows,
// zeros after them (a NaN in an unused row would survive a multiplication by zero), as one
// cp.async group of this thread's pieces.
template <int HS, int LD, int Threads, class Elem>
__device__ void load_padded_tile_async(Elem* dst, const Elem* src, int valid, int rows) {
    constexpr int chunks = HS / 8;  // per row
    for (int idx = static_cast<int>(threadIdx.x); idx < rows * chunks; idx += Threads) {
        const int r = idx / chunks, c = idx % chunks * 8;
        // A row past T reads nothing; its address stays inside the tensor (row 0).
        cp_async_16(dst + r * LD + c, src + static_cast<long long>(r < valid ? r : 0) * HS + c, r < valid);
    }
    cp_async_commit();
}

// D = A B + D in the element type's mma.sync.
template <class Elem>
__device__ inline void mma_16816(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
    if constexpr (std::is_same<Elem, __nv_bfloat16>::value) ptx::mma_m16n8k16_bf16(d, a, b, d);
    else ptx::mma_m16n8k16_f16(d, a, b, d);
}

template <class A>
__global__ void __launch_bounds__(A::threads)
    mma_attention_kernel(typename A::Elem* out, float* lse, const typename A::Elem* q,
                         const typename A::Elem* k, const typename A::Elem* v, int T, bool causal,
                         float scale_log2) {
    using Elem = typename A::Elem;
    constexpr int HS = A::hs, Br = A::Br, Bc = A::Bc, LD = A::ld, Threads = A::threads;
    constexpr MmaMistake mistake = A::mistake;
    __shared__ typename A::Shared sm;
    const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
    const int g = lane >> 2, t = lane & 3;
    // The heaviest causal tiles (the last queries) first, as in the other kernels.
    const int q_tile = static_cast<int>(gridDim.x - 1 - blockIdx.x);
    const long long head = blockIdx.y;  // b·NH + h
    const long long base = head * T * HS;
    const int q0 = q_tile * Br;
    const int q_valid = min(Br, T - q0);

    // Q's A fragments, hs/16 k16 steps: ldmatrix .x4's matrices 0…3 are rows 0-7 and 8-15
    // of columns 0-7, then of columns 8-15 (a[0…3]); lane l gives row l % 16, column 8 (l / 16).
    load_padded_tile_async<HS, LD, Threads>(sm.K, q + base + static_cast<long long>(q0) * HS, q_valid, Br);
    cp_async_wait<0>();
    __syncthreads();
    std::uint32_t q_frag[HS / 16][4];
    for (int d = 0; d < HS / 16; ++d) {
        ptx::ldmatrix_x4(q_frag[d], &sm.K[(warp * 16 + lane % 16) * LD + d * 16 + (lane / 16) * 8]);
    }
    __syncthreads();  // every warp has its Q fragments: K's first tile may replace them

    float o[HS / 8][4];  // O's n-tiles of 8 columns, C layout
    for (auto& tile : o) tile[0] = tile[1] = tile[2] = tile[3] = 0.0f;
    // Rows g and g + 8 of the warp's 16: the running maximum (base 2, scaled) and this lane's
    // part of the running sum (its 16 keys of each tile; the 4 lanes' parts added at the end).
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const int row0 = q0 + warp * 16 + g;

    const int k_tiles = (T + Bc - 1) / Bc;
    static_assert(Br == Bc, "the diagonal key tile of query tile i is key tile i");
    const int k_tile_end = causal ? min(k_tiles, q_tile + 1) : k_tiles;
    load_padded_tile_async<HS, LD, Threads>(sm.K, k + base, min(Bc, T), Bc);
    for (int kt = 0; kt < k_tile_end; ++kt) {
        const int k0 = kt * Bc;
        const int k_valid = min(Bc, T - k0);
        __syncthreads();  // every warp is done with the previous V
        load_padded_tile_async<HS, LD, Threads>(sm.V, v + base + static_cast<long long>(k0) * HS, k_valid, Bc);
        cp_async_wait<1>();  // this thread's pieces of K's tile have landed (V's may not have)
        __syncthreads();     // and every thread's

        // S (16, Bc) = Q (16, hs) · Kᵀ, two n-tiles of 8 keys a step: ldmatrix .x4's matrices
        // are keys 0-7 at columns 0-7 and 8-15 (b[0], b[1] of the first n-tile), then keys 8-15.
        float s[Bc / 8][4];
        for (auto& tile : s) tile[0] = tile[1] = tile[2] = tile[3] = 0.0f;
        for (int n = 0; n < Bc / 16; ++n) {
            for (int d = 0; d < HS / 16; ++d) {
                std::uint32_t kb[4];
                ptx::ldmatrix_x4(kb, &sm.K[(n * 16 + lane % 8 + 8 * (lane / 16)) * LD + d * 16 + 8 * ((lane / 8) & 1)]);
                const std::uint32_t b0[2] = {kb[0], kb[1]}, b1[2] = {kb[2], kb[3]};
                mma_16816<Elem>(s[2 * n], q_frag[d], b0);
                mma_16816<Elem>(s[2 * n + 1], q_frag[d], b1);
            }
        }

        // The online softmax, rows g (h = 0: c[0], c[1]) and g + 8 (h = 1: c[2], c[3]).
        const bool edge = k0 + Bc > T || (causal && kt == k_tile_end - 1);
        for (int h = 0; h < 2; ++h) {
            constexpr int ml = A::mask_layout;
            const int i = row0 + (h == 0 ? ((ml & 1) != 0 ? 8 : 0) : ((ml & 2) != 0 ? 0 : 8));
            float row_max = -INFINITY;
            for (int j = 0; j < Bc / 8; ++j) {
                for (int e = 0; e < 2; ++e) {
                    float& x = s[j][2 * h + e];
                    const int key = k0 + 8 * j + 2 * t + (e == 0 ? ((ml & 4) != 0 ? 1 : 0) : ((ml & 8) != 0 ? 0 : 1));
                    x = edge && (key >= T || (causal && key > i)) ? -INFINITY : x * scale_log2;
                    row_max = fmaxf(row_max, x);
                }
            }
            row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 1));
            if (mistake != MmaMistake::row_max_over_two_lanes) {
                row_max = fmaxf(row_max, __shfl_xor_sync(0xffffffffu, row_max, 2));
            }
            const float m_new = fmaxf(m[h], row_max);
            // A row with every key so far masked keeps m = −∞: subtract 0 instead, so that
            // 2^(−∞) = 0 rather than NaN.
            const float m_ref = m_new == -INFINITY ? 0.0f : m_new;
            const float rescale = exp2f(m[h] - m_ref);
            m[h] = m_new;
            l[h] *= rescale;
            for (auto& tile : o) {
                tile[2 * h] *= rescale;
                tile[2 * h + 1] *= rescale;
            }
            for (int j = 0; j < Bc / 8; ++j) {
                for (int e = 0; e < 2; ++e) {
                    float& x = s[j][2 * h + e];
                    x = exp2f(x - m_ref);
                    l[h] += x;  // l sums the float32 probabilities
                }
            }
        }

        cp_async_wait<0>();  // V's tile has landed
        __syncthreads();     // for every thread, and every warp is done with K's tile
        if (kt + 1 < k_tile_end) {
            load_padded_tile_async<HS, LD, Threads>(sm.K, k + base + static_cast<long long>(k0 + Bc) * HS,
                                                    min(Bc, T - k0 - Bc), Bc);
        }

        // O (16, hs) += P (16, Bc) · V (Bc, hs), a k16 step per 16 keys, P's A fragment from
        // S's n-tiles 2c and 2c + 1; ldmatrix .x4 .trans's matrices are keys 0-7 and 8-15 of
        // columns 0-7 (b[0], b[1] of O's first n-tile), then of columns 8-15.
        for (int c = 0; c < Bc / 16; ++c) {
            const std::uint32_t packed[4] = {
                ptx::pack(from_float<Elem>(s[2 * c][0]), from_float<Elem>(s[2 * c][1])),
                ptx::pack(from_float<Elem>(s[2 * c][2]), from_float<Elem>(s[2 * c][3])),
                ptx::pack(from_float<Elem>(s[2 * c + 1][0]), from_float<Elem>(s[2 * c + 1][1])),
                ptx::pack(from_float<Elem>(s[2 * c + 1][2]), from_float<Elem>(s[2 * c + 1][3])),
            };
            const std::uint32_t p[4] = {packed[A::p0], packed[A::p1], packed[A::p2], packed[A::p3]};
            for (int n = 0; n < HS / 16; ++n) {
                std::uint32_t vb[4];
                const Elem* row = &sm.V[(c * 16 + lane % 8 + 8 * ((lane / 8) & 1)) * LD + n * 16 + 8 * (lane / 16)];
                if (mistake == MmaMistake::v_not_transposed) ptx::ldmatrix_x4(vb, row);
                else ptx::ldmatrix_x4_trans(vb, row);
                const std::uint32_t b0[2] = {vb[0], vb[1]}, b1[2] = {vb[2], vb[3]};
                mma_16816<Elem>(o[2 * n], p, b0);
                mma_16816<Elem>(o[2 * n + 1], p, b1);
            }
        }
    }

    // O / l and lse = ln Σ e^(s·scale) = m·ln 2 + ln l, rows g and g + 8; each lane writes its
    // two adjacent columns of every n-tile as one 32-bit store.
    for (int h = 0; h < 2; ++h) {
        float row_sum = l[h];
        row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 1);
        row_sum += __shfl_xor_sync(0xffffffffu, row_sum, 2);
        const int i = row0 + 8 * h;
        if (i >= T) continue;
        const float inv = 1.0f / row_sum;  // ≥ 1 before the division: the row's largest term is 2^0
        Elem* out_row = out + base + static_cast<long long>(i) * HS;
        for (int n = 0; n < HS / 8; ++n) {
            *reinterpret_cast<std::uint32_t*>(out_row + 8 * n + 2 * t) =
                ptx::pack(from_float<Elem>(o[n][2 * h] * inv), from_float<Elem>(o[n][2 * h + 1] * inv));
        }
        if (t == 0) lse[head * T + i] = m[h] * 0.693147180559945309f + logf(row_sum);
    }
}

// Launches the kernel for one configuration (A = MmaAttention<Elem, hs, …>).
template <class A>
void launch_mma_attention(typename A::Elem* out, float* lse, const typename A::Elem* q,
                          const typename A::Elem* k, const typename A::Elem* v,
                          const AttentionShape& s, cudaStream_t stream) {
    const int T = static_cast<int>(s.T);
    const dim3 grid(static_cast<unsigned>((T + A::Br - 1) / A::Br), static_cast<unsigned>(s.B * s.NH));
    // log2 e / √hs: the scores' scale and the change from base e to base 2 in one product.
    const float scale_log2 = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(A::hs)));
    ATTN_LAUNCH(mma_attention_kernel<A>, grid, A::threads, 0, stream)(out, lse, q, k, v, T, s.causal,
                                                                     scale_log2);
    CUDA_CHECK(cudaGetLastError());
}

// The host function, with a mistake as a parameter (see above).
template <MmaMistake M>
void mma_attention_forward_with(HalfBuffer& out, float* lse, const HalfBuffer& q, const HalfBuffer& k,
                                const HalfBuffer& v, const AttentionShape& s, void* stream) {
    check_half_attention("mma_attention_forward", s, out, {&q, &k, &v});
    const std::string why = mma_attention_unsupported(out.format());
    require(why.empty(), "mma_attention_forward: " + why);
    const auto st = static_cast<cudaStream_t>(stream);
    const auto run = [&](auto elem) {
        using E = decltype(elem);
        auto* o = reinterpret_cast<E*>(out.data());
        const auto* qe = reinterpret_cast<const E*>(q.data());
        const auto* ke = reinterpret_cast<const E*>(k.data());
        const auto* ve = reinterpret_cast<const E*>(v.data());
        if (s.hs == 64) launch_mma_attention<MmaAttention<E, 64, 0, 0, M>>(o, lse, qe, ke, ve, s, st);
        else launch_mma_attention<MmaAttention<E, 128, 0, 0, M>>(o, lse, qe, ke, ve, s, st);
    };
    if (out.format() == Precision::bf16) run(__nv_bfloat16{});
    else run(__half{});
}

}  // namespace attn::cuda::detail
