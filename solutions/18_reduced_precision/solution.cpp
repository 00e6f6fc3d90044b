// Solution to exercise 18: float32 to bfloat16, and a softmax with 16-bit scores and float32
// statistics.
#include "exercise.hpp"

#include "attn/precision.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace exercise {

std::uint16_t float_to_bfloat16(float x) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {  // a NaN: keep it one, quiet
        return static_cast<std::uint16_t>((bits >> 16) | 0x0040u);
    }
    const std::uint32_t odd = (bits >> 16) & 1u;  // the last bit kept
    bits += 0x7fffu + odd;  // past half a step, or exactly half when the kept part is odd
    return static_cast<std::uint16_t>(bits >> 16);
}

std::vector<std::uint16_t> softmax_bfloat16(const std::vector<std::uint16_t>& scores) {
    std::vector<float> s(scores.size());
    float m = -std::numeric_limits<float>::infinity();
    for (std::size_t j = 0; j < scores.size(); ++j) {
        s[j] = attn::bfloat16_bits_to_float(scores[j]);
        m = std::max(m, s[j]);
    }
    std::vector<std::uint16_t> out(scores.size(), 0);
    if (m == -std::numeric_limits<float>::infinity()) return out;  // every key masked
    float l = 0.0f;  // the statistics stay float32
    for (float x : s) l += std::exp(x - m);
    for (std::size_t j = 0; j < s.size(); ++j) out[j] = float_to_bfloat16(std::exp(s[j] - m) / l);
    return out;
}

}  // namespace exercise
