// The CUDA simulator's 16-bit floating-point types, in place of CUDA's cuda_fp16.h and
// cuda_bf16.h: __half (IEEE binary16) and __nv_bfloat16, each a 16-bit pattern, with the
// conversions kernels use. Float to 16 bits rounds to nearest, ties to even, as the GPU's
// cvt.rn does: float16 through GCC's _Float16, bfloat16 by rounding away the low 16 bits of
// the float (what CUDA's own header does on the host). A NaN gives the canonical NaN
// 0x7fff, as CUDA's conversions do.
#pragma once

#include <cstdint>
#include <cstring>

struct __half;
struct __nv_bfloat16;
__half __float2half_rn(float f);
float __half2float(__half h);
__nv_bfloat16 __float2bfloat16_rn(float f);
float __bfloat162float(__nv_bfloat16 b);

struct __half {
    unsigned short __x;
    __half() = default;
    __half(float f) : __x(__float2half_rn(f).__x) {}  // NOLINT: CUDA's implicit conversions
    operator float() const { return __half2float(*this); }
};

struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(__float2bfloat16_rn(f).__x) {}  // NOLINT: as CUDA's
    operator float() const { return __bfloat162float(*this); }
};

inline __half __ushort_as_half(unsigned short bits) {
    __half h;
    h.__x = bits;
    return h;
}
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short bits) {
    __nv_bfloat16 b;
    b.__x = bits;
    return b;
}
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.__x; }

inline __half __float2half_rn(float f) {
    if (f != f) return __ushort_as_half(0x7fff);
    const _Float16 h = static_cast<_Float16>(f);
    unsigned short bits;
    std::memcpy(&bits, &h, sizeof bits);
    return __ushort_as_half(bits);
}
inline __half __float2half(float f) { return __float2half_rn(f); }
inline float __half2float(__half h) {
    _Float16 v;
    std::memcpy(&v, &h.__x, sizeof v);
    return static_cast<float>(v);
}

inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    std::uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return __ushort_as_bfloat16(0x7fff);
    u += 0x7fffu + ((u >> 16) & 1u);  // to nearest, a tie to the even pattern
    return __ushort_as_bfloat16(static_cast<unsigned short>(u >> 16));
}
inline __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline float __bfloat162float(__nv_bfloat16 b) {
    const std::uint32_t u = static_cast<std::uint32_t>(b.__x) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}
