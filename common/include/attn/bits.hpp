/// @file bits.hpp
/// @brief A float's 32 bits and back, by memcpy (C++17's way to read an object's
/// representation as another type; compilers turn it into a single move).
#pragma once

#include <cstdint>
#include <cstring>

namespace attn {

/// The IEEE 754 binary32 bits of `x`: sign, 8 exponent bits, 23 mantissa bits.
inline std::uint32_t bits_of(float x) {
    std::uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return b;
}

/// The float whose binary32 bits are `b`.
inline float float_of(std::uint32_t b) {
    float x;
    std::memcpy(&x, &b, sizeof x);
    return x;
}

}  // namespace attn
