// Exercise 18: float32 to bfloat16, and a softmax with 16-bit scores and float32 statistics.
//
// Write the two functions below, then run `./workbook check 18`. Stuck? `./workbook hint 18`.
// The contract (what each must do, ties, NaN, masked rows) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"
#include "attn/precision.hpp"  // attn::bfloat16_bits_to_float, to widen a score

#include <cmath>
#include <cstring>

namespace exercise {

std::uint16_t float_to_bfloat16(float x) {
    // TODO: copy x's bits into a std::uint32_t (std::memcpy).
    // TODO: a NaN (exponent all ones, mantissa not zero): return its top 16 bits with the
    //       quiet bit 0x0040 set.
    // TODO: round the low 16 bits away to nearest, ties to even: add 0x7fff plus the last
    //       kept bit ((bits >> 16) & 1), then keep the top 16 bits.
    (void)x;
    throw attn::NotImplemented("float_to_bfloat16 in exercises/18_reduced_precision/exercise.cpp: "
                               "round the float's low 16 bits away, to nearest with ties to even");
}

std::vector<std::uint16_t> softmax_bfloat16(const std::vector<std::uint16_t>& scores) {
    // TODO: widen each score to float32 (attn::bfloat16_bits_to_float).
    // TODO: the row's maximum m, in float32. If it is −∞ (every key masked), return zeros.
    // TODO: the sum l of e^(s − m), in float32.
    // TODO: each probability e^(s − m) / l, rounded with float_to_bfloat16.
    (void)scores;
    throw attn::NotImplemented("softmax_bfloat16 in exercises/18_reduced_precision/exercise.cpp: "
                               "widen the scores, subtract the maximum, sum in float32, round "
                               "each probability at the end");
}

}  // namespace exercise
