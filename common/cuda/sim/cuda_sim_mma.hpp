// The CUDA simulator's model of PTX's warp-level matrix instructions that mma.cuh exposes:
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32 and
// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16, with the fragment layouts the
// PTX ISA documents (unlike WMMA's, these are specified, so they are fixed here, not drawn).
//
// Every call is warp-collective (cuda_sim::warp_collective): all 32 lanes must reach the
// same call, as .sync.aligned requires, or the launch fails naming the line. When the last
// lane arrives the warp's work is done at once for all of them.
//
// The layouts (PTX ISA, "Warp-level matrix multiply-accumulate instructions"; the numbers of
// the sections move between versions of the ISA, their titles do not):
//   groupID = laneid >> 2, threadID_in_group = laneid % 4.
//   "Matrix Fragments for mma.m16n8k16 with floating point type":
//     A (16×16, .row): four 32-bit registers, each two 16-bit elements a_i (i = 0..7), the
//       lower half holding the even i; row = groupID for i in {0, 1, 4, 5}, groupID + 8
//       otherwise; col = threadID_in_group·2 + (i & 1), + 8 for i ≥ 4.
//     B (16×8, .col): two registers, b_i (i = 0..3); row = threadID_in_group·2 + (i & 1),
//       + 8 for i ≥ 2; col = groupID.
//     C and D (16×8, float): four floats c_i; row = groupID for i < 2, groupID + 8
//       otherwise; col = threadID_in_group·2 + (i & 1).
//   "Warp-level matrix load instruction: ldmatrix" (.m8n8, .b16): matrix j of .x1/.x2/.x4
//     takes its 8 rows' addresses from lanes 8j … 8j + 7 (the other lanes' addresses are not
//     used); each row is 16 contiguous bytes (8 elements). Lane l receives in register j the
//     elements (row l >> 2, columns 2·(l % 4) and 2·(l % 4) + 1) of matrix j, the lower half
//     the first; with .trans, the elements (rows 2·(l % 4) and 2·(l % 4) + 1, column l >> 2).
//
// The product: each product of two 16-bit values is exact in float32, and the sum is in
// float32, from C, in order of k (a tensor core's internal order and rounding of the sum are
// not specified; they differ from this by float32 rounding), as the WMMA model does.
//
// Refused (the launch fails naming the call and the line): a lane that does not reach the
// call, a warp of fewer than 32 threads; an ldmatrix row address that is not 16-byte aligned
// (a row is read as one 16-byte access) or that lies in device (global) memory (ldmatrix
// reads .shared).
#pragma once

#include "cuda_sim.hpp"
#include "cuda_sim_half.hpp"

#include <cstdint>
#include <cstring>
#include <string>

namespace cuda_sim::ptx {

// The fragment layouts above, as functions of (lane, element).
inline int group_of(int lane) { return lane >> 2; }
inline int thread_in_group(int lane) { return lane % 4; }
inline int a_row(int lane, int i) { return group_of(lane) + ((i == 0 || i == 1 || i == 4 || i == 5) ? 0 : 8); }
inline int a_col(int lane, int i) { return thread_in_group(lane) * 2 + (i & 1) + (i >= 4 ? 8 : 0); }
inline int b_row(int lane, int i) { return thread_in_group(lane) * 2 + (i & 1) + (i >= 2 ? 8 : 0); }
inline int b_col(int lane, int) { return group_of(lane); }
inline int c_row(int lane, int i) { return group_of(lane) + (i < 2 ? 0 : 8); }
inline int c_col(int lane, int i) { return thread_in_group(lane) * 2 + (i & 1); }

// Element i of a fragment held in 32-bit registers, two 16-bit elements each (the lower half
// first).
inline std::uint16_t half_of(const std::uint32_t* registers, int i) {
    return static_cast<std::uint16_t>(registers[i / 2] >> (16 * (i % 2)));
}

struct MmaCall {
    float* d;
    const std::uint32_t* a;
    const std::uint32_t* b;
    const float* c;
};

template <class T>
float element_value(std::uint16_t bits) {
    T v;
    std::memcpy(&v, &bits, sizeof bits);
    return static_cast<float>(v);
}

// D (16×8) = A (16×16) · B (16×8) + C, gathered from and scattered to the 32 lanes.
template <class T>
std::string mma_m16n8k16(void* const* args) {
    float a[16][16], b[16][8], c[16][8];
    for (int lane = 0; lane < 32; ++lane) {
        const auto& call = *static_cast<const MmaCall*>(args[lane]);
        for (int i = 0; i < 8; ++i) a[a_row(lane, i)][a_col(lane, i)] = element_value<T>(half_of(call.a, i));
        for (int i = 0; i < 4; ++i) b[b_row(lane, i)][b_col(lane, i)] = element_value<T>(half_of(call.b, i));
        for (int i = 0; i < 4; ++i) c[c_row(lane, i)][c_col(lane, i)] = call.c[i];
    }
    float d[16][8];
    for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 8; ++n) {
            float sum = c[m][n];
            for (int k = 0; k < 16; ++k) sum += a[m][k] * b[k][n];  // each product exact
            d[m][n] = sum;
        }
    }
    ::cuda_sim::note_flops(0, 0, 2.0 * 16 * 8 * 16);  // a multiply and an add per product
    for (int lane = 0; lane < 32; ++lane) {  // D may be C: written only after every read
        const auto& call = *static_cast<const MmaCall*>(args[lane]);
        for (int i = 0; i < 4; ++i) call.d[i] = d[c_row(lane, i)][c_col(lane, i)];
    }
    return "";
}

struct LdmatrixCall {
    std::uint32_t* r;
    const void* row;  // this lane's row address
};

// ldmatrix of `matrices` 8×8 matrices of 16-bit elements, transposed or not.
template <int matrices, bool trans>
std::string ldmatrix(void* const* args) {
    std::uint16_t m[4][8][8];
    for (int lane = 0; lane < 8 * matrices; ++lane) {  // the lanes whose addresses are used
        const void* row = static_cast<const LdmatrixCall*>(args[lane])->row;
        const auto address = reinterpret_cast<std::uintptr_t>(row);
        if (address % 16 != 0) {
            return "lane " + std::to_string(lane) + "'s row address is " + std::to_string(address % 16) +
                   " bytes past a 16-byte boundary (each row of 8 16-bit elements is read as one 16-byte access)";
        }
        std::string why;
        if (::cuda_sim::in_device_memory(row, 1, &why)) {
            return "lane " + std::to_string(lane) +
                   "'s row address is in device (global) memory: ldmatrix reads shared memory";
        }
        std::memcpy(m[lane / 8][lane % 8], row, 16);
    }
    for (int lane = 0; lane < 32; ++lane) {
        std::uint32_t* r = static_cast<const LdmatrixCall*>(args[lane])->r;
        const int g = group_of(lane), t = thread_in_group(lane);
        for (int j = 0; j < matrices; ++j) {
            const std::uint16_t low = trans ? m[j][2 * t][g] : m[j][g][2 * t];
            const std::uint16_t high = trans ? m[j][2 * t + 1][g] : m[j][g][2 * t + 1];
            r[j] = static_cast<std::uint32_t>(low) | (static_cast<std::uint32_t>(high) << 16);
        }
    }
    return "";
}

}  // namespace cuda_sim::ptx
