// The tensor cores through PTX's own warp-level instructions, as FlashAttention-2 uses them:
// mma.sync m16n8k16 (bfloat16 or float16 inputs, float32 accumulators), ldmatrix (8×8
// tiles of 16-bit elements from shared memory into the fragments mma.sync takes), and
// cp.async (global to shared memory in the background, in groups a thread waits for). Unlike
// WMMA's fragments, these registers' layouts are documented (PTX ISA, "Matrix Fragments for
// mma.m16n8k16 with floating point type" and "Warp-level matrix load instruction: ldmatrix";
// the formulas are written out in sim/cuda_sim_mma.hpp), so a kernel may compute which
// element a lane holds: lane l, groupID g = l >> 2, t = l % 4, holds
//   A (16×16, row-major):  a[0] = A[g][2t, 2t+1],     a[1] = A[g+8][2t, 2t+1],
//                          a[2] = A[g][2t+8, 2t+9],   a[3] = A[g+8][2t+8, 2t+9]
//   B (16×8, k × n):       b[0] = B[2t, 2t+1][g],     b[1] = B[2t+8, 2t+9][g]
//   C, D (16×8, float):    c[0], c[1] = C[g][2t, 2t+1],  c[2], c[3] = C[g+8][2t, 2t+1]
// (two 16-bit elements a register, the first in the lower half).
//
// One call site, two targets: under nvcc each function is one inline PTX instruction;
// compiled as C++ against the CUDA simulator, the same call is a warp-collective operation
// of the simulator's model (sim/cuda_sim_mma.hpp), which also refuses a call that part of the
// warp does not reach. Every lane of the warp calls each function at the same place.
//
// mma.sync m16n8k16 and cp.async need compute capability 8.0 or later (a kernel built for
// 7.5 traps); ldmatrix 7.5 or later. In the simulator a cp.async copy reads its source at
// the call and lands at the wait that covers it; till then its destination holds NaN bytes
// (other garbage in the race check's second run, so a read before the wait changes a result
// between the runs and is refused as a race), and a thread that ends with copies it never
// waited for is refused.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#ifndef __CUDACC__
#include "sim/cuda_sim_mma.hpp"
#endif

namespace attn::cuda::ptx {

/// Two 16-bit values in one 32-bit register, `low` in the lower half (as a fragment holds them).
__device__ inline std::uint32_t pack(__nv_bfloat16 low, __nv_bfloat16 high) {
    return static_cast<std::uint32_t>(__bfloat16_as_ushort(low)) |
           (static_cast<std::uint32_t>(__bfloat16_as_ushort(high)) << 16);
}
__device__ inline std::uint32_t pack(__half low, __half high) {
    return static_cast<std::uint32_t>(__half_as_ushort(low)) | (static_cast<std::uint32_t>(__half_as_ushort(high)) << 16);
}

#ifdef __CUDACC__

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
#define ATTN_MMA_M16N8K16(type) __trap()
#else
#define ATTN_MMA_M16N8K16(type)                                                                  \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type ".f32 "                \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"      \
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]),            \
                   "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]))
#endif

/// D (16×8) = A (16×16) · B (16×8) + C over the warp, A and B bfloat16, C and D float32.
__device__ inline void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4],
                                         const std::uint32_t (&b)[2], const float (&c)[4]) {
    ATTN_MMA_M16N8K16("bf16");
}
/// The same with float16 A and B.
__device__ inline void mma_m16n8k16_f16(float (&d)[4], const std::uint32_t (&a)[4],
                                        const std::uint32_t (&b)[2], const float (&c)[4]) {
    ATTN_MMA_M16N8K16("f16");
}
#undef ATTN_MMA_M16N8K16

/// ldmatrix .x1 / .x2 / .x4, plain or .trans: `row` is this lane's row address in shared
/// memory (16-byte aligned; lanes 8j … 8j + 7 give matrix j's eight rows).
__device__ inline void ldmatrix_x1(std::uint32_t (&r)[1], const void* row) {
    const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s));
}
__device__ inline void ldmatrix_x2(std::uint32_t (&r)[2], const void* row) {
    const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}
__device__ inline void ldmatrix_x4(std::uint32_t (&r)[4], const void* row) {
    const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
__device__ inline void ldmatrix_x1_trans(std::uint32_t (&r)[1], const void* row) {
    const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s));
}
__device__ inline void ldmatrix_x2_trans(std::uint32_t (&r)[2], const void* row) {
    const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(s));
}
__device__ inline void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* row) {
    const auto s = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

/// cp.async.ca.shared.global: `Bytes` (4, 8 or 16) from global memory at `src` to shared
/// memory at `dst`, both aligned to `Bytes`, without passing through registers. The copy
/// lands only once a cp_async_wait_group covers it; until then `dst` must not be read.
template <int Bytes>
__device__ inline void cp_async_ca(void* dst, const void* src) {
    static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();
#else
    const auto s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(src), "n"(Bytes) : "memory");
#endif
}
/// cp.async.commit_group: this thread's copies since the last commit become one group.
__device__ inline void cp_async_commit_group() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/// cp.async.wait_group N: waits until at most the N newest committed groups are pending.
template <int N>
__device__ inline void cp_async_wait_group() {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#else  // the CUDA simulator

inline void mma_m16n8k16_bf16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                              const float (&c)[4], const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    ::cuda_sim::ptx::MmaCall call{d, a, b, c};
    ::cuda_sim::warp_collective("mma.sync.m16n8k16 (bf16)", &call,
                                ::cuda_sim::ptx::mma_m16n8k16<__nv_bfloat16>, file, line);
}
inline void mma_m16n8k16_f16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2],
                             const float (&c)[4], const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
    ::cuda_sim::ptx::MmaCall call{d, a, b, c};
    ::cuda_sim::warp_collective("mma.sync.m16n8k16 (f16)", &call, ::cuda_sim::ptx::mma_m16n8k16<__half>,
                                file, line);
}

#define ATTN_SIM_LDMATRIX(name, matrices, trans, what)                                          \
    inline void name(std::uint32_t (&r)[matrices], const void* row,                             \
                     const char* file = __builtin_FILE(), int line = __builtin_LINE()) {        \
        ::cuda_sim::ptx::LdmatrixCall call{r, row};                                             \
        ::cuda_sim::warp_collective(what, &call, ::cuda_sim::ptx::ldmatrix<matrices, trans>,     \
                                    file, line);                                                \
    }
ATTN_SIM_LDMATRIX(ldmatrix_x1, 1, false, "ldmatrix.m8n8.x1")
ATTN_SIM_LDMATRIX(ldmatrix_x2, 2, false, "ldmatrix.m8n8.x2")
ATTN_SIM_LDMATRIX(ldmatrix_x4, 4, false, "ldmatrix.m8n8.x4")
ATTN_SIM_LDMATRIX(ldmatrix_x1_trans, 1, true, "ldmatrix.m8n8.x1.trans")
ATTN_SIM_LDMATRIX(ldmatrix_x2_trans, 2, true, "ldmatrix.m8n8.x2.trans")
ATTN_SIM_LDMATRIX(ldmatrix_x4_trans, 4, true, "ldmatrix.m8n8.x4.trans")
#undef ATTN_SIM_LDMATRIX

template <int Bytes>
inline void cp_async_ca(void* dst, const void* src, const char* file = __builtin_FILE(),
                        int line = __builtin_LINE()) {
    static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async.ca copies 4, 8 or 16 bytes");
    ::cuda_sim::cp_async(dst, src, Bytes, file, line);
}
inline void cp_async_commit_group() { ::cuda_sim::cp_async_commit_group(); }
template <int N>
inline void cp_async_wait_group() {
    ::cuda_sim::cp_async_wait_group(N);
}

#endif

}  // namespace attn::cuda::ptx
