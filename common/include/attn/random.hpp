/// @file random.hpp
/// @brief A seeded random source whose numbers are the same on every machine.
#pragma once

#include "attn/tensor.hpp"

#include <cstdint>

namespace attn {

/// Seeded pseudo-random numbers (xoshiro256** seeded through splitmix64).
///
/// The standard library's distributions may differ between implementations, so the course
/// draws its own: the same seed gives the same numbers with any compiler, and the lessons'
/// printed output is reproducible.
class Rng {
public:
    /// @param seed any 64-bit value; equal seeds give equal streams
    explicit Rng(std::uint64_t seed = 1337);

    std::uint64_t next_u64();          ///< 64 uniformly random bits
    float uniform();                   ///< uniform in [0, 1), 24 random bits
    float uniform(float lo, float hi); ///< uniform in [lo, hi)
    float normal();                    ///< standard normal (Box-Muller)
    /// A uniform integer in [0, n); n must be positive.
    std::uint64_t below(std::uint64_t n);

    /// A tensor of the given shape filled with uniform numbers in [lo, hi).
    template <std::size_t N>
    Tensor<N> uniform_tensor(const std::array<std::size_t, N>& shape, float lo, float hi) {
        Tensor<N> t(shape);
        for (auto& v : t) v = uniform(lo, hi);
        return t;
    }

    /// A tensor of the given shape filled with normal numbers N(mean, std²).
    template <std::size_t N>
    Tensor<N> normal_tensor(const std::array<std::size_t, N>& shape, float mean = 0.0f,
                            float std = 1.0f) {
        Tensor<N> t(shape);
        for (auto& v : t) v = mean + std * normal();
        return t;
    }

private:
    std::uint64_t s_[4];
    bool has_spare_ = false;
    float spare_ = 0.0f;
};

}  // namespace attn
