/// @file precision.hpp
/// @brief The 16-bit floating-point formats (IEEE float16 and bfloat16) beside float32:
/// conversions that round to nearest with ties to even, the formats' ranges and spacing,
/// counts of what rounding lost, and the dynamic loss scaling that float16 training needs.
///
/// A value is kept in a `float` throughout the library; "rounded to bfloat16" means the
/// float holds the bfloat16 value nearest to it (every bfloat16 and float16 value is
/// exactly a float). The 16-bit patterns themselves, as GPUs store them, come from
/// float_to_bfloat16_bits() and float_to_float16_bits().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace attn {

/// A floating-point format for computation.
enum class Precision {
    fp32,  ///< IEEE binary32: 8 exponent bits, 23 stored mantissa bits
    bf16,  ///< bfloat16: float32's 8 exponent bits, 7 stored mantissa bits (float32's top half)
    fp16,  ///< IEEE binary16: 5 exponent bits, 10 stored mantissa bits, largest value 65504
};

/// The format's name as `train_gpt --precision` spells it: "fp32", "bf16" or "fp16".
/// @param p the format @return its name
const char* precision_name(Precision p);

/// The format of a name: "fp32", "bf16" or "fp16".
/// @param name the name @return the format
/// @throws std::invalid_argument for any other name, listing the three
Precision parse_precision(const std::string& name);

/// What a format can represent.
struct FormatInfo {
    int exponent_bits = 0;       ///< width of the exponent field
    int mantissa_bits = 0;       ///< stored mantissa bits (one more is implicit)
    double max = 0.0;            ///< the largest finite value
    double min_normal = 0.0;     ///< the smallest positive normal value, 2^(1 − bias)
    double min_subnormal = 0.0;  ///< the smallest positive value, min_normal · 2^-mantissa_bits
    double epsilon = 0.0;        ///< the gap between 1 and the next value, 2^-mantissa_bits
};

/// The ranges of a format, computed from its bit widths.
/// @param p the format @return its exponent and mantissa widths and its limits
FormatInfo format_info(Precision p);

/// The bfloat16 nearest to x, as its 16 bits: the top half of x's bits, rounded to nearest
/// with ties to the even pattern. Values at or beyond the largest bfloat16 plus half a step
/// become ±infinity; a NaN stays a NaN (quiet, its sign kept), never an infinity.
/// @param x any float @return the bfloat16's bits
std::uint16_t float_to_bfloat16_bits(float x);

/// The value of a bfloat16 (exact: its bits are the top half of a float's).
/// @param bits a bfloat16's bits @return its value
float bfloat16_bits_to_float(std::uint16_t bits);

/// The IEEE float16 nearest to x, as its 16 bits, rounded to nearest with ties to even,
/// subnormals included: values below 2^-25 in magnitude become ±0, values of 65520 and
/// beyond (65504 plus half a step) become ±infinity; a NaN stays a (quiet) NaN.
/// @param x any float @return the float16's bits
std::uint16_t float_to_float16_bits(float x);

/// The value of a float16 (exact in float32).
/// @param bits a float16's bits @return its value
float float16_bits_to_float(std::uint16_t bits);

/// x rounded to the format (float32: x itself).
/// @param x any float @param p the format @return the nearest value of the format
float round_to_precision(float x, Precision p);

/// The gap between |x| and the next larger value of the format at |x|'s binade (the
/// format's spacing there; at or above the largest finite value, the spacing just below it).
/// @param x a finite float @param p the format @return the spacing, > 0
double spacing(double x, Precision p);

/// What rounding a buffer lost.
struct RoundingCounts {
    std::uint64_t values = 0;     ///< finite non-zero values rounded
    std::uint64_t flushed = 0;    ///< of which became ±0 (underflow)
    std::uint64_t subnormal = 0;  ///< of which became subnormal (fewer mantissa bits)
    std::uint64_t overflowed = 0; ///< of which became ±infinity (overflow)

    /// Adds another buffer's counts.
    /// @param other the counts to add @return *this
    RoundingCounts& operator+=(const RoundingCounts& other);
};

/// Rounds n floats in place to the format (float32: leaves them, counts nothing).
/// @param x (n) the values, rounded in place
/// @param n how many
/// @param p the format
/// @return how many were rounded, flushed to zero, made subnormal or made infinite
RoundingCounts round_in_place(float* x, std::size_t n, Precision p);

/// Dynamic loss scaling (Micikevicius et al. 2018; PyTorch's GradScaler): the loss is
/// multiplied by `scale` before the backward pass so that small gradients stay above
/// float16's smallest subnormal, and the gradients are divided by it again in float32
/// before the optimizer. A step whose gradients hold an infinity or a NaN (the scale was
/// too large) is skipped and the scale is halved; after `growth_interval` steps in a row
/// without one, the scale doubles.
struct LossScaler {
    double scale = 65536.0;     ///< the current factor (PyTorch's initial 2^16)
    double growth_factor = 2.0; ///< multiplies the scale after growth_interval good steps
    double backoff_factor = 0.5;///< multiplies the scale after a step with non-finite gradients
    long growth_interval = 200; ///< good steps in a row before the scale grows
    long good_steps = 0;        ///< good steps since the scale last changed
    long skipped_steps = 0;     ///< steps skipped so far

    /// Records one step's outcome and adjusts the scale.
    /// @param finite whether every unscaled gradient was finite
    /// @return true if the optimizer should take the step, false if it must be skipped
    bool update(bool finite);
};

}  // namespace attn
