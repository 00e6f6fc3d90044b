/// @file
/// The two 8-bit floating-point formats of FP8 training (Micikevicius et al. 2022, "FP8
/// Formats for Deep Learning", arXiv:2209.05433; the OCP 8-bit floating point specification):
/// E4M3, 4 exponent and 3 mantissa bits, no infinity, largest 448; E5M2, 5 and 2, IEEE-like
/// with infinities, largest 57344. Values are kept in float32 and rounded to the format's
/// grid, as round_to_precision() does for the 16-bit formats (lesson 18).
#pragma once

#include "attn/precision.hpp"

namespace attn {

/// An 8-bit format.
enum class Fp8 {
    e4m3,  ///< bias 7, subnormals, no infinity: S.1111.111 is NaN, 448 the largest value
    e5m2,  ///< bias 15, subnormals, infinities and NaNs as IEEE 754's, 57344 the largest
};

/// "e4m3" or "e5m2".
const char* fp8_name(Fp8 f);

/// The format's widths and limits, as format_info() gives them for the 16-bit formats.
FormatInfo fp8_info(Fp8 f);

/// x rounded to the nearest value of the format, ties to the even mantissa. A result beyond
/// the largest finite value is an overflow: NaN in E4M3 (it has no infinity), ±∞ in E5M2,
/// as a conversion without saturation gives. NaN stays NaN, ±∞ gives NaN (E4M3) or ±∞.
/// @param x a float32 value @param f the format @return the rounded value, as a float
float round_to_fp8(float x, Fp8 f);

}  // namespace attn
