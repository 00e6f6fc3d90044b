// The FP8 formats against their definition: every one of the 256 codes of each format is
// decoded here from the bit layout of the OCP 8-bit floating point specification (sign,
// exponent field, mantissa field, bias; E4M3's only NaN is S.1111.111, E5M2's exponent
// field 31 holds ±∞ and NaNs), independently of round_to_fp8(). Then every finite value
// must round to itself, every midpoint between two neighbours to the one with the even
// mantissa, a float32 step either side of it to the nearer one, and the largest finite
// values, the overflow thresholds and the underflow to zero must be as the layout says.
#include "attn/fp8.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

using namespace attn;

namespace {

struct Code {
    unsigned bits;
    double value;  // NaN for the NaN codes
};

std::vector<Code> decode_all(Fp8 f) {
    const int E = f == Fp8::e4m3 ? 4 : 5, M = 7 - E, bias = f == Fp8::e4m3 ? 7 : 15;
    std::vector<Code> codes;
    for (unsigned b = 0; b < 256; ++b) {
        const unsigned sign = b >> 7, exponent = (b >> M) & ((1u << E) - 1), mantissa = b & ((1u << M) - 1);
        double v;
        if (f == Fp8::e4m3 && exponent == 15 && mantissa == 7) {
            v = std::numeric_limits<double>::quiet_NaN();
        } else if (f == Fp8::e5m2 && exponent == 31) {
            v = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
        } else if (exponent == 0) {
            v = std::ldexp(static_cast<double>(mantissa), 1 - bias - M);  // subnormal
        } else {
            v = std::ldexp(1.0 + std::ldexp(static_cast<double>(mantissa), -M), static_cast<int>(exponent) - bias);
        }
        codes.push_back({b, sign ? -v : v});
    }
    return codes;
}

// The positive finite values in increasing order, with their codes.
std::vector<Code> positive_finite(Fp8 f) {
    std::vector<Code> out;
    for (const Code& c : decode_all(f))
        if (c.bits < 128 && std::isfinite(c.value)) out.push_back(c);
    return out;  // codes 0…127 increase with their value
}

}  // namespace

TEST_CASE("every FP8 value rounds to itself, and the limits are those of the bit layout") {
    for (Fp8 f : {Fp8::e4m3, Fp8::e5m2}) {
        const std::string name = fp8_name(f);
        CAPTURE(name);
        int finite = 0;
        for (const Code& c : decode_all(f)) {
            if (!std::isfinite(c.value)) continue;
            ++finite;
            const float v = static_cast<float>(c.value);
            REQUIRE(static_cast<double>(v) == c.value);  // every FP8 value is a float
            CHECK(round_to_fp8(v, f) == v);
            CHECK(std::signbit(round_to_fp8(v, f)) == std::signbit(v));  // −0 stays −0
        }
        CHECK(finite == (f == Fp8::e4m3 ? 254 : 248));  // 2 NaNs; 6 NaNs and 2 infinities
        const std::vector<Code> pos = positive_finite(f);
        const FormatInfo info = fp8_info(f);
        CHECK(info.max == pos.back().value);
        CHECK(info.min_subnormal == pos[1].value);
        CHECK(info.min_normal == pos[static_cast<std::size_t>(1) << info.mantissa_bits].value);
        CHECK(info.epsilon == pos[1 + (static_cast<std::size_t>(1) << info.mantissa_bits) * static_cast<std::size_t>(f == Fp8::e4m3 ? 7 : 15)].value - 1.0);
    }
}

TEST_CASE("FP8 rounding: midpoints go to the even mantissa, a float32 step either side to the nearer value") {
    for (Fp8 f : {Fp8::e4m3, Fp8::e5m2}) {
        const std::string name = fp8_name(f);
        CAPTURE(name);
        const std::vector<Code> pos = positive_finite(f);
        for (std::size_t i = 0; i + 1 < pos.size(); ++i) {
            const float a = static_cast<float>(pos[i].value), b = static_cast<float>(pos[i + 1].value);
            const float mid = static_cast<float>((pos[i].value + pos[i + 1].value) / 2);  // exact
            const float even = (pos[i].bits & 1u) == 0 ? a : b;
            CAPTURE(a);
            CAPTURE(b);
            CHECK(round_to_fp8(mid, f) == even);
            CHECK(round_to_fp8(-mid, f) == -even);
            CHECK(round_to_fp8(std::nextafter(mid, 0.0f), f) == a);
            CHECK(round_to_fp8(std::nextafter(mid, 1e9f), f) == b);
        }
    }
}

TEST_CASE("FP8 overflow and underflow: NaN in E4M3, infinity in E5M2, zero below half the smallest value") {
    // E4M3: above 448 the next step would be 480, which is the NaN code; the midpoint 464 is a
    // tie that goes to 448's even mantissa (1.110), anything above it overflows.
    CHECK(round_to_fp8(464.0f, Fp8::e4m3) == 448.0f);
    CHECK(std::isnan(round_to_fp8(std::nextafter(464.0f, 1e9f), Fp8::e4m3)));
    CHECK(std::isnan(round_to_fp8(1e6f, Fp8::e4m3)));
    CHECK(std::isnan(round_to_fp8(-std::numeric_limits<float>::infinity(), Fp8::e4m3)));
    // E5M2: 57344 = 1.11·2^15; the midpoint 61440 ties to the even 1.00·2^16, which overflows.
    CHECK(round_to_fp8(std::nextafter(61440.0f, 0.0f), Fp8::e5m2) == 57344.0f);
    CHECK(round_to_fp8(61440.0f, Fp8::e5m2) == std::numeric_limits<float>::infinity());
    CHECK(round_to_fp8(-1e9f, Fp8::e5m2) == -std::numeric_limits<float>::infinity());
    CHECK(round_to_fp8(std::numeric_limits<float>::infinity(), Fp8::e5m2) == std::numeric_limits<float>::infinity());
    CHECK(std::isnan(round_to_fp8(std::numeric_limits<float>::quiet_NaN(), Fp8::e5m2)));
    // Half the smallest subnormal is a tie between 0 (even) and it: 0; a step above: it.
    for (Fp8 f : {Fp8::e4m3, Fp8::e5m2}) {
        const float smallest = static_cast<float>(fp8_info(f).min_subnormal);
        CHECK(round_to_fp8(smallest / 2, f) == 0.0f);
        CHECK(round_to_fp8(std::nextafter(smallest / 2, 1.0f), f) == smallest);
        CHECK(std::signbit(round_to_fp8(-smallest / 4, f)));  // −0
    }
    CHECK(fp8_info(Fp8::e4m3).min_subnormal == std::ldexp(1.0, -9));
    CHECK(fp8_info(Fp8::e5m2).min_subnormal == std::ldexp(1.0, -16));
}
