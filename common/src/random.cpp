#include "attn/random.hpp"

#include <array>
#include <cmath>
#include <vector>

namespace attn {

namespace {
std::uint64_t splitmix64(std::uint64_t& x) {
    std::uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(std::uint64_t seed) {
    for (auto& s : s_) s = splitmix64(seed);
}

Rng::State Rng::state() const {
    State st;
    for (int i = 0; i < 4; ++i) st.words[static_cast<std::size_t>(i)] = s_[i];
    st.has_spare = has_spare_;
    st.spare = spare_;
    return st;
}

Rng Rng::from_state(const State& st) {
    require(st.words[0] | st.words[1] | st.words[2] | st.words[3],
            "Rng::from_state: the all-zero state would only ever give zeros");
    Rng rng;
    for (int i = 0; i < 4; ++i) rng.s_[i] = st.words[static_cast<std::size_t>(i)];
    rng.has_spare_ = st.has_spare;
    rng.spare_ = st.spare;
    return rng;
}

std::uint64_t Rng::next_u64() {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
}

namespace {
using Words = std::array<std::uint64_t, 4>;
// xoshiro256's state update (next_u64 without its output): linear over GF(2).
Words step_of(Words s) {
    const std::uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return s;
}
// A 256 × 256 bit matrix as its columns: column j is the image of state bit j.
using BitMatrix = std::vector<Words>;
Words times(const BitMatrix& m, const Words& v) {
    Words r{};
    for (std::size_t j = 0; j < 256; ++j) {
        if ((v[j / 64] >> (j % 64)) & 1u) {
            for (std::size_t w = 0; w < 4; ++w) r[w] ^= m[j][w];
        }
    }
    return r;
}
// M^(2^k) for k = 0 … 63, made once.
const std::vector<BitMatrix>& step_powers() {
    static const std::vector<BitMatrix> powers = [] {
        std::vector<BitMatrix> p(64, BitMatrix(256));
        for (std::size_t j = 0; j < 256; ++j) {
            Words e{};
            e[j / 64] = std::uint64_t{1} << (j % 64);
            p[0][j] = step_of(e);
        }
        for (std::size_t k = 1; k < 64; ++k) {
            for (std::size_t j = 0; j < 256; ++j) p[k][j] = times(p[k - 1], p[k - 1][j]);
        }
        return p;
    }();
    return powers;
}
}  // namespace

void Rng::advance(std::uint64_t n) {
    Words s = {s_[0], s_[1], s_[2], s_[3]};
    const std::vector<BitMatrix>& powers = step_powers();
    for (std::size_t k = 0; k < 64; ++k) {
        if ((n >> k) & 1u) s = times(powers[k], s);  // the powers commute: any order
    }
    for (int i = 0; i < 4; ++i) s_[i] = s[static_cast<std::size_t>(i)];
}

float Rng::uniform() { return static_cast<float>(next_u64() >> 40) * 0x1.0p-24f; }

float Rng::uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }

float Rng::normal() {
    if (has_spare_) {
        has_spare_ = false;
        return spare_;
    }
    // Box-Muller in double, so the tails are right; u1 is in (0, 1] so log(u1) is finite.
    const double u1 = (static_cast<double>(next_u64() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double two_pi = 6.283185307179586;
    spare_ = static_cast<float>(r * std::sin(two_pi * u2));
    has_spare_ = true;
    return static_cast<float>(r * std::cos(two_pi * u2));
}

std::uint64_t Rng::below(std::uint64_t n) {
    require(n > 0, "Rng::below: n must be positive");
    // Rejection sampling removes the modulo bias.
    const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    std::uint64_t x;
    do x = next_u64(); while (x >= limit);
    return x % n;
}

}  // namespace attn
