/// @file random.hpp
/// @brief A seeded random source whose numbers are the same on every machine.
#pragma once

#include "attn/tensor.hpp"

#include <array>
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

    /// Everything that determines the numbers still to come, so that a checkpoint can
    /// store a random source and a resumed run can continue its stream exactly.
    struct State {
        std::array<std::uint64_t, 4> words{};  ///< xoshiro256**'s four state words
        bool has_spare = false;                ///< whether normal() holds a second draw
        float spare = 0.0f;                    ///< that second draw
    };
    /// The current state; Rng::from_state(state()) continues the same stream.
    State state() const;
    /// A source that continues from `state`.
    /// @throws std::invalid_argument if all four words are zero (xoshiro's one bad state)
    static Rng from_state(const State& state);

    std::uint64_t next_u64();          ///< 64 uniformly random bits
    /// Skips `n` draws of next_u64() at once: afterwards the stream is where n calls would
    /// have left it (normal()'s held second draw, if any, stays held). xoshiro256's step is
    /// linear over GF(2), so n steps are the n-th power of its 256 × 256 bit matrix, applied
    /// as the powers M^(2^k) of n's set bits: at most 64 matrix-vector products, whatever n.
    /// It lets a process start a stream at any place, e.g. a shard of a model's
    /// initialisation (GPT::initial_values). @param n the draws to skip
    void advance(std::uint64_t n);
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
