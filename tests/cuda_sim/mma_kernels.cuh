// Kernels that drive mma.cuh's PTX primitives one warp at a time, for the checks of their
// fragment layouts (test_cuda_sim_mma.cpp). They compile under nvcc and as C++ against the
// CUDA simulator alike. Each lane puts its registers together, or takes them apart, by the
// PTX ISA's figures written independently of mma.cuh's model: lane l, g = l / 4, t = l % 4,
//   A register j (j = 0..3):  A[g + 8·(j % 2)][2t + 8·(j / 2) + {0, 1}]
//   B register j (j = 0..1):  B[2t + 8·j + {0, 1}][g]
//   C, D float i (i = 0..3):  C[g + 8·(i / 2)][2t + i % 2]
#pragma once

#include "launch.cuh"
#include "mma.cuh"

#include <cstdint>
#include <type_traits>

namespace mma_probe {

// D (16×8, row-major) = A (16×16, row-major) · B (16×8, row-major, k × n) + C (16×8), each
// lane's registers gathered from global memory by the formulas above.
template <class T>
__global__ void mma_from_memory(float* d, const T* a, const T* b, const float* c) {
    const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, t = lane % 4;
    std::uint32_t ra[4], rb[2];
    float rc[4], rd[4];
    for (int j = 0; j < 4; ++j) {
        const int row = g + 8 * (j % 2), col = 2 * t + 8 * (j / 2);
        ra[j] = attn::cuda::ptx::pack(a[row * 16 + col], a[row * 16 + col + 1]);
    }
    for (int j = 0; j < 2; ++j) {
        const int k = 2 * t + 8 * j;
        rb[j] = attn::cuda::ptx::pack(b[k * 8 + g], b[(k + 1) * 8 + g]);
    }
    for (int i = 0; i < 4; ++i) rc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
    if constexpr (std::is_same<T, __half>::value) {
        attn::cuda::ptx::mma_m16n8k16_f16(rd, ra, rb, rc);
    } else {
        attn::cuda::ptx::mma_m16n8k16_bf16(rd, ra, rb, rc);
    }
    for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = rd[i];
}

// ldmatrix of `matrices` (1, 2 or 4) 8×8 matrices of 16-bit codes, plain or transposed. The
// rows lie in shared memory in the order `slot` gives (row r of matrix j at slot[8j + r],
// 8 elements a slot), not one after another: each lane passes its row's own address. Lane
// l's register j goes to out[4l + j].
__global__ void ldmatrix_rows(std::uint32_t* out, const std::uint16_t* codes, const int* slot, int matrices,
                              int trans) {
    alignas(16) __shared__ std::uint16_t s[32 * 8];
    const int lane = static_cast<int>(threadIdx.x % 32);
    for (int i = 0; i < 8; ++i) s[slot[lane] * 8 + i] = codes[lane * 8 + i];  // row lane / 8, lane % 8
    __syncwarp();
    // Lanes 8j … 8j + 7 address matrix j; the lanes past the last matrix pass matrix 0's rows
    // (their addresses are not used, but sm_75 and older require them valid).
    const int row = lane < 8 * matrices ? lane : lane % 8;
    const void* p = &s[slot[row] * 8];
    std::uint32_t r[4] = {0, 0, 0, 0};
    if (matrices == 1) {
        std::uint32_t (&r1)[1] = *reinterpret_cast<std::uint32_t(*)[1]>(r);
        trans ? attn::cuda::ptx::ldmatrix_x1_trans(r1, p) : attn::cuda::ptx::ldmatrix_x1(r1, p);
    } else if (matrices == 2) {
        std::uint32_t (&r2)[2] = *reinterpret_cast<std::uint32_t(*)[2]>(r);
        trans ? attn::cuda::ptx::ldmatrix_x2_trans(r2, p) : attn::cuda::ptx::ldmatrix_x2(r2, p);
    } else {
        trans ? attn::cuda::ptx::ldmatrix_x4_trans(r, p) : attn::cuda::ptx::ldmatrix_x4(r, p);
    }
    for (int j = 0; j < 4; ++j) out[lane * 4 + j] = r[j];
}

// FlashAttention-2's way in: A (16×16) and B (16×8, k × n), row-major in shared memory,
// loaded by ldmatrix .x4 (A's four 8×8 quarters) and .x2.trans (B's two 8×8 halves, turned
// into the k-major pairs mma.sync takes), then D = A·B + C as in mma_from_memory.
template <class T>
__global__ void mma_through_ldmatrix(float* d, const T* a, const T* b, const float* c) {
    alignas(16) __shared__ T sa[16 * 16];
    alignas(16) __shared__ T sb[16 * 8];
    const int lane = static_cast<int>(threadIdx.x % 32), g = lane / 4, t = lane % 4;
    for (int i = lane; i < 256; i += 32) sa[i] = a[i];
    for (int i = lane; i < 128; i += 32) sb[i] = b[i];
    __syncwarp();
    std::uint32_t ra[4], rb[2];
    attn::cuda::ptx::ldmatrix_x4(ra, &sa[(lane % 16) * 16 + (lane / 16) * 8]);
    attn::cuda::ptx::ldmatrix_x2_trans(rb, &sb[(lane % 16) * 8]);
    float rc[4], rd[4];
    for (int i = 0; i < 4; ++i) rc[i] = c[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2];
    if constexpr (std::is_same<T, __half>::value) {
        attn::cuda::ptx::mma_m16n8k16_f16(rd, ra, rb, rc);
    } else {
        attn::cuda::ptx::mma_m16n8k16_bf16(rd, ra, rb, rc);
    }
    for (int i = 0; i < 4; ++i) d[(g + 8 * (i / 2)) * 8 + 2 * t + i % 2] = rd[i];
}

// cp.async of `Bytes` a copy: a tile of 2·32 chunks of Bytes / 4 floats from `in` into
// shared memory, lane l copying chunk l of each half, the halves two groups. After
// wait_group<1> the lane's chunk of the first half has landed and goes to `first`; its chunk
// of the second half is read before its wait into `second_early` (what the simulator's model
// holds there: on a GPU the bytes may or may not have landed); after wait_group<0> and a
// barrier every lane's chunks go to `out`.
template <int Bytes>
__global__ void cp_async_two_groups(float* out, float* first, float* second_early, const float* in) {
    constexpr int chunk = Bytes / 4, half = 32 * chunk;
    alignas(16) __shared__ float s[2 * 32 * 4];
    const int lane = static_cast<int>(threadIdx.x % 32);
    attn::cuda::ptx::cp_async_ca<Bytes>(&s[lane * chunk], &in[lane * chunk]);
    attn::cuda::ptx::cp_async_commit_group();
    attn::cuda::ptx::cp_async_ca<Bytes>(&s[half + lane * chunk], &in[half + lane * chunk]);
    attn::cuda::ptx::cp_async_commit_group();
    attn::cuda::ptx::cp_async_wait_group<1>();
    for (int i = 0; i < chunk; ++i) first[lane * chunk + i] = s[lane * chunk + i];
    for (int i = 0; i < chunk; ++i) second_early[lane * chunk + i] = s[half + lane * chunk + i];
    attn::cuda::ptx::cp_async_wait_group<0>();
    __syncthreads();
    for (int i = lane; i < 2 * half; i += 32) out[i] = s[(i + 7 * chunk) % (2 * half)];  // other lanes' chunks too
}

}  // namespace mma_probe
