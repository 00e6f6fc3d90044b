// Rounding to the FP8 formats: the nearest multiple of the spacing at x's binade (the
// subnormal spacing below the smallest normal), ties to even, then the overflow rule.
#include "attn/fp8.hpp"

#include <cmath>
#include <limits>

namespace attn {

namespace {

struct Layout {
    int mantissa_bits;
    int min_exponent;  // the exponent of the smallest normal value, 1 − bias
    double max;
    bool has_infinity;
};

Layout layout(Fp8 f) {
    // E4M3: bias 7, its top binade [256, 512) keeps 1.000…1.110 (1.111 is NaN): 448.
    // E5M2: bias 15, exponent field 31 is ∞/NaN, so the top binade is [32768, 65536): 57344.
    return f == Fp8::e4m3 ? Layout{3, -6, 448.0, false} : Layout{2, -14, 57344.0, true};
}

}  // namespace

const char* fp8_name(Fp8 f) { return f == Fp8::e4m3 ? "e4m3" : "e5m2"; }

FormatInfo fp8_info(Fp8 f) {
    const Layout l = layout(f);
    FormatInfo i;
    i.exponent_bits = f == Fp8::e4m3 ? 4 : 5;
    i.mantissa_bits = l.mantissa_bits;
    i.max = l.max;
    i.min_normal = std::ldexp(1.0, l.min_exponent);
    i.min_subnormal = std::ldexp(1.0, l.min_exponent - l.mantissa_bits);
    i.epsilon = std::ldexp(1.0, -l.mantissa_bits);
    return i;
}

float round_to_fp8(float x, Fp8 f) {
    const Layout l = layout(f);
    const float overflow = l.has_infinity ? std::copysign(std::numeric_limits<float>::infinity(), x)
                                          : std::numeric_limits<float>::quiet_NaN();
    if (std::isnan(x)) return x;
    if (std::isinf(x)) return overflow;
    if (x == 0.0f) return x;
    int e = 0;
    (void)std::frexp(static_cast<double>(x), &e);  // |x| = m·2^e, m in [0.5, 1): leading bit 2^(e−1)
    const int lead = e - 1 > l.min_exponent ? e - 1 : l.min_exponent;
    const double spacing = std::ldexp(1.0, lead - l.mantissa_bits);
    // x / spacing is exact (a power of two); nearbyint rounds half to even in the default mode
    const double r = std::nearbyint(static_cast<double>(x) / spacing) * spacing;
    if (std::fabs(r) > l.max) return overflow;
    return static_cast<float>(r);
}

}  // namespace attn
