// The 16-bit formats: conversions by bit rounding, ranges, spacing, loss scaling.
#include "attn/precision.hpp"

#include "attn/bits.hpp"

#include "simd_clones.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace attn {

const char* precision_name(Precision p) {
    switch (p) {
        case Precision::bf16: return "bf16";
        case Precision::fp16: return "fp16";
        case Precision::fp32: break;
    }
    return "fp32";
}

Precision parse_precision(const std::string& name) {
    if (name == "fp32") return Precision::fp32;
    if (name == "bf16") return Precision::bf16;
    if (name == "fp16") return Precision::fp16;
    throw std::invalid_argument("unknown precision '" + name +
                                "' (the precisions are: fp32, bf16, fp16)");
}

FormatInfo format_info(Precision p) {
    FormatInfo f;
    switch (p) {
        case Precision::fp32: f.exponent_bits = 8, f.mantissa_bits = 23; break;
        case Precision::bf16: f.exponent_bits = 8, f.mantissa_bits = 7; break;
        case Precision::fp16: f.exponent_bits = 5, f.mantissa_bits = 10; break;
    }
    const int bias = (1 << (f.exponent_bits - 1)) - 1;  // 127, 127, 15
    const int max_exponent = bias;                      // the all-ones field is inf and NaN
    f.epsilon = std::ldexp(1.0, -f.mantissa_bits);
    f.max = (2.0 - f.epsilon) * std::ldexp(1.0, max_exponent);
    f.min_normal = std::ldexp(1.0, 1 - bias);
    f.min_subnormal = f.min_normal * f.epsilon;
    return f;
}

//! [bfloat16]
std::uint16_t float_to_bfloat16_bits(float x) {
    std::uint32_t b = bits_of(x);
    // A NaN keeps its sign and the top of its payload, with the quiet bit set: rounding its
    // low half away could otherwise leave the all-ones exponent with a zero mantissa, ±inf.
    if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((b >> 16) | 0x0040u);
    // Round the low 16 bits away to nearest: add just under half (0x7fff), plus one more when
    // the kept part is odd, so that an exact half goes to the even pattern. A carry out of
    // the mantissa moves the exponent up, and out of the largest exponent gives infinity.
    const std::uint32_t odd = (b >> 16) & 1u;
    b += 0x7fffu + odd;
    return static_cast<std::uint16_t>(b >> 16);
}
//! [bfloat16]

float bfloat16_bits_to_float(std::uint16_t bits) {
    return float_of(static_cast<std::uint32_t>(bits) << 16);
}

std::uint16_t float_to_float16_bits(float x) {
    const std::uint32_t b = bits_of(x);
    const auto sign = static_cast<std::uint16_t>((b >> 16) & 0x8000u);
    const std::uint32_t a = b & 0x7fffffffu;  // |x|
    if (a > 0x7f800000u) {  // NaN: quiet, with the top of the payload
        return static_cast<std::uint16_t>(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    }
    // 65520 = 65504 + half of the last step (32): from there on (and for ±inf) the nearest
    // value is infinity (the tie goes up, to the even pattern 0x7c00).
    if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);
    if (a < 0x38800000u) {  // below 2^-14, float16's smallest normal: a subnormal or 0
        const std::uint32_t e = a >> 23;
        if (e < 102) return sign;  // below 2^-25, half of the smallest subnormal 2^-24
        // |x| = m · 2^(e − 150) with the 24-bit significand m; in units of 2^-24 that is
        // m / 2^(126 − e), rounded to nearest, ties to even.
        const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
        const std::uint32_t shift = 126 - e;  // 14 … 24
        std::uint32_t q = m >> shift;
        const std::uint32_t rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (q & 1u))) ++q;  // 0x400 is the smallest normal
        return static_cast<std::uint16_t>(sign | q);
    }
    // A normal float16: the exponent rebased from 127 to 15, the mantissa's low 13 bits
    // rounded away as for bfloat16 (a carry may reach the exponent).
    std::uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<std::uint16_t>(sign | (r >> 13));
}

float float16_bits_to_float(std::uint16_t bits) {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
    const std::uint32_t e = (bits >> 10) & 0x1fu, m = bits & 0x3ffu;
    if (e == 0x1f) return float_of(sign | 0x7f800000u | (m << 13));  // inf, NaN
    if (e == 0) {                                                     // 0, subnormal: m · 2^-24
        const float magnitude = std::ldexp(static_cast<float>(m), -24);
        return sign ? -magnitude : magnitude;
    }
    return float_of(sign | ((e + 112u) << 23) | (m << 13));
}

float round_to_precision(float x, Precision p) {
    switch (p) {
        case Precision::bf16: return bfloat16_bits_to_float(float_to_bfloat16_bits(x));
        case Precision::fp16: return float16_bits_to_float(float_to_float16_bits(x));
        case Precision::fp32: break;
    }
    return x;
}

double spacing(double x, Precision p) {
    const FormatInfo f = format_info(p);
    double a = std::fabs(x);
    if (a >= f.max) a = f.max;
    if (a < f.min_normal) return f.min_subnormal;
    int exponent = 0;
    std::frexp(a, &exponent);  // a = fraction · 2^exponent, fraction in [0.5, 1)
    return std::ldexp(1.0, exponent - 1 - f.mantissa_bits);
}

RoundingCounts& RoundingCounts::operator+=(const RoundingCounts& o) {
    values += o.values;
    flushed += o.flushed;
    subnormal += o.subnormal;
    overflowed += o.overflowed;
    return *this;
}

namespace {

// The rounding of a whole buffer, written without branches so that the compiler turns the
// loop into vector code (the mixed-precision model rounds millions of values per step).
// It computes what round_to_precision computes, by other means (tests/test_precision.cpp
// holds the two against each other): bfloat16 by the same bit rounding; float16 in the
// normal range by rounding the low 13 mantissa bits away, in the subnormal range by adding
// and subtracting 0.5, which leaves |x| rounded to a multiple of 2^-24, float16's smallest
// subnormal (float32's spacing in [0.5, 1) is 2^-24; the addition rounds to nearest, ties
// to even).
ATTN_SIMD_CLONES
RoundingCounts round_buffer(float* x, std::size_t n, Precision p) {
    std::uint64_t values = 0, flushed = 0, subnormal = 0, overflowed = 0;
    const bool bf16 = p == Precision::bf16;
    const float min_normal = bf16 ? 0x1p-126f : 0x1p-14f;
    for (std::size_t i = 0; i < n; ++i) {
        const float before = x[i];
        std::uint32_t b;
        std::memcpy(&b, &before, sizeof b);
        const std::uint32_t magnitude = b & 0x7fffffffu, sign = b & 0x80000000u;
        const bool finite = magnitude < 0x7f800000u;
        float after;
        if (bf16) {
            const std::uint32_t r = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
            std::memcpy(&after, &r, sizeof after);
        } else {
            const std::uint32_t r = (magnitude + 0xfffu + ((magnitude >> 13) & 1u)) & 0xffffe000u;
            float normal;
            std::memcpy(&normal, &r, sizeof normal);
            float a;
            std::memcpy(&a, &magnitude, sizeof a);
            const float small = (a + 0.5f) - 0.5f;
            float rounded = a < 0x1p-14f ? small : normal;
            rounded = rounded > 65504.0f ? std::numeric_limits<float>::infinity() : rounded;
            std::uint32_t rb;
            std::memcpy(&rb, &rounded, sizeof rb);
            rb |= sign;
            std::memcpy(&after, &rb, sizeof after);
        }
        const bool counted = finite && magnitude != 0;
        x[i] = counted ? after : before;  // zeros, infinities and NaNs stay as they are
        values += counted;
        flushed += counted && after == 0.0f;
        subnormal += counted && after != 0.0f && std::fabs(after) < min_normal;
        overflowed += counted && std::fabs(after) == std::numeric_limits<float>::infinity();
    }
    RoundingCounts c;
    c.values = values;
    c.flushed = flushed;
    c.subnormal = subnormal;
    c.overflowed = overflowed;
    return c;
}

}  // namespace

RoundingCounts round_in_place(float* x, std::size_t n, Precision p) {
    if (p == Precision::fp32) return {};
    return round_buffer(x, n, p);
}

bool LossScaler::update(bool finite) {
    if (!finite) {
        scale *= backoff_factor;
        good_steps = 0;
        ++skipped_steps;
        return false;
    }
    if (++good_steps >= growth_interval) {
        // at most 2^100: the scale multiplies a float32 loss, whose range ends at 2^128
        scale = std::min(scale * growth_factor, 0x1p100);
        good_steps = 0;
    }
    return true;
}

}  // namespace attn
