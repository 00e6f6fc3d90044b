// Sums and dot products in eight interleaved partial sums, added pairwise at the end.
//
// A plain left-to-right sum stays scalar: the compiler may not reorder it, since that would
// change the result. Eight lanes give it an order it can vectorise, and a fixed one: both
// versions of an ATTN_SIMD_CLONES function (8 lanes of AVX2, or 2 × 4 of SSE) add the same
// numbers in the same order, so they give the same bits. Call them from such a function:
// they are inlined into each version.
#pragma once

#include <cstddef>

namespace attn {

inline float lane_total(const float (&part)[8]) {
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// x[0] + … + x[n−1]
inline float lane_sum(const float* x, std::size_t n) {
    float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    std::size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (std::size_t u = 0; u < 8; ++u) part[u] += x[j + u];
    for (std::size_t u = 0; j < n; ++j, ++u) part[u] += x[j];
    return lane_total(part);
}

// x[0]·y[0] + … + x[n−1]·y[n−1]
inline float lane_dot(const float* x, const float* y, std::size_t n) {
    float part[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    std::size_t j = 0;
    for (; j + 8 <= n; j += 8)
        for (std::size_t u = 0; u < 8; ++u) part[u] += x[j + u] * y[j + u];
    for (std::size_t u = 0; j < n; ++j, ++u) part[u] += x[j] * y[j];
    return lane_total(part);
}

}  // namespace attn
