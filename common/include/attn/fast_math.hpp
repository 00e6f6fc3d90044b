/// @file fast_math.hpp
/// @brief exp and erf in single precision, written so that the compiler vectorises the
/// loops that call them.
///
/// `std::exp` and `std::erf` are calls into the C library, one element at a time, and
/// they dominate the exact GELU: ~1.5 M calls per training step of the small model. These
/// two functions are branch-free arithmetic on floats and integers (no library call, no
/// table), so a loop over an array of them becomes SIMD code. Their accuracy, measured
/// against double precision by tests/test_fast_math.cpp, is close to that of the library
/// functions: a few units in the last place, far below the 1e-5 that the GPT's results are
/// compared to PyTorch with.
#pragma once

#include <cstdint>
#include <cstring>

namespace attn {

/// e^x for single-precision x, with at most 2 ulp relative error where the result is a
/// normal float. Inputs are clamped to [−87.3, 88.3], so the result never overflows to
/// infinity and, below the clamp, is about 1.2e-38 instead of a denormal or 0. A NaN
/// input gives NaN.
/// @param x the exponent
/// @return e^x
inline float exp_approx(float x) {
    // exp(x) = 2^n · e^r with n = round(x / ln 2) and r = x − n·ln 2 in [−ln2/2, ln2/2].
    x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
    // Adding and subtracting 1.5·2^23 rounds to the nearest integer without a library call.
    const float round_magic = 12582912.0f;
    const float n = (x * 1.44269504088896341f + round_magic) - round_magic;
    // ln 2 in two parts (Cody and Waite), so that n·ln2_hi is exact and r keeps its digits.
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    // e^r − 1 − r by Cephes' minimax polynomial for expf.
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const float er = p * r * r + r + 1.0f;
    // 2^n built from its bits: the biased exponent n + 127 in bits 23..30. A NaN input
    // makes n NaN, and converting NaN to an integer is undefined behaviour; 0 is used
    // instead (a select, not a branch), and er, which is NaN too, makes the result NaN.
    const float n_finite = n == n ? n : 0.0f;
    const std::int32_t bits = (static_cast<std::int32_t>(n_finite) + 127) * (1 << 23);
    float two_n;
    std::memcpy(&two_n, &bits, sizeof two_n);
    return er * two_n;
}

/// erf(x) for single-precision x, with at most ~1e-7 absolute error (a couple of ulp of
/// values near 1; tests/test_fast_math.cpp states the measured figure).
///
/// Two fits, both computed and one selected, so that the loop stays branch-free:
/// - |x| < 1: erf(x) = x·P(x²), P of degree 6 fitted to erf(x)/x in double precision
///   (error 6e-10); near 0 this keeps the relative accuracy that the other form loses to
///   the cancellation in 1 − (a number near 1).
/// - |x| ≥ 1: the form of Abramowitz and Stegun 7.1.26, erf(x) = 1 − t·R(t)·e^(−x²) with
///   t = 1/(1 + 0.47047·x) and R of degree 7 fitted in double precision (error 5e-9 on
///   [0, 4.5]); beyond ~4 the result is 1 to float precision.
///
/// erf(−x) = −erf(x) covers negative inputs.
/// @param x any float
/// @return erf(x)
inline float erf_approx(float x) {
    const float ax = x < 0.0f ? -x : x;
    // |x| < 1
    const float x2 = ax * ax;
    float p = 7.647043005698517e-05f;
    p = p * x2 - 7.942304945568884e-04f;
    p = p * x2 + 5.179739309238679e-03f;
    p = p * x2 - 2.6848582509463148e-02f;
    p = p * x2 + 1.1283429768039996e-01f;
    p = p * x2 - 3.761260592656245e-01f;
    p = p * x2 + 1.128379158382799f;
    const float small = ax * p;
    // |x| ≥ 1
    const float t = 1.0f / (1.0f + 0.47047f * ax);
    float r = 0.08520549960836082f;
    r = r * t - 0.4035478693211838f;
    r = r * t + 0.5714798307667404f;
    r = r * t - 0.08815596805395087f;
    r = r * t + 0.31412616087352396f;
    r = r * t + 0.25521237197168845f;
    r = r * t + 0.2656799794673246f;
    const float large = 1.0f - t * r * exp_approx(-x2);
    const float y = ax < 1.0f ? small : large;
    return x < 0.0f ? -y : y;
}

}  // namespace attn
