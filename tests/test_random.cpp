#include "attn/random.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <random>

using namespace attn;

TEST_CASE("equal seeds give equal streams, different seeds differ") {
    Rng a(42), b(42), c(43);
    for (int i = 0; i < 100; ++i) {
        const auto x = a.next_u64();
        CHECK(x == b.next_u64());
        (void)x;
    }
    CHECK(Rng(42).next_u64() != c.next_u64());
}

TEST_CASE("the first outputs match xoshiro256** seeded by splitmix64") {
    // Independent reference: the algorithm's published C code (Blackman & Vigna), run by
    // hand in Python for seed 0: splitmix64 states, then one xoshiro256** step.
    Rng r(0);
    CHECK(r.next_u64() == 0x99EC5F36CB75F2B4ull);
}

TEST_CASE("uniform numbers stay in range and have the right mean and variance") {
    Rng r(7);
    double sum = 0, sum2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const float u = r.uniform(-2.0f, 2.0f);
        REQUIRE(u >= -2.0f);
        REQUIRE(u < 2.0f);
        sum += u;
        sum2 += double(u) * u;
    }
    // Mean 0 and variance 4²/12 = 4/3; the standard error of the mean is √(4/3 / n) ≈ 0.0026.
    CHECK(std::fabs(sum / n) < 0.013);
    CHECK(sum2 / n == doctest::Approx(4.0 / 3.0).epsilon(0.02));
}

TEST_CASE("normal numbers have mean 0 and standard deviation 1") {
    Rng r(11);
    double sum = 0, sum2 = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
        const double z = r.normal();
        sum += z;
        sum2 += z * z;
    }
    // Standard error of the mean is 1/√n ≈ 0.0022; five of them is a safe bound.
    CHECK(std::fabs(sum / n) < 0.012);
    CHECK(sum2 / n == doctest::Approx(1.0).epsilon(0.02));
}

TEST_CASE("below(n) covers 0..n-1 and rejects n = 0") {
    Rng r(3);
    int seen[5] = {};
    for (int i = 0; i < 5000; ++i) seen[r.below(5)]++;
    for (int k = 0; k < 5; ++k) CHECK(seen[k] > 800);
    CHECK_THROWS_AS(r.below(0), std::invalid_argument);
}

TEST_CASE("a source restored from its state continues the same stream, spare normal included") {
    attn::Rng rng(99);
    rng.next_u64();
    rng.normal();  // leaves the second Box-Muller draw pending
    attn::Rng copy = attn::Rng::from_state(rng.state());
    for (int i = 0; i < 5; ++i) {
        CAPTURE(i);
        CHECK(copy.normal() == rng.normal());
        CHECK(copy.next_u64() == rng.next_u64());
    }
    CHECK_THROWS_AS(attn::Rng::from_state(attn::Rng::State{}), std::invalid_argument);
}

TEST_CASE("advance(n) leaves the stream where n draws would, for generated n") {
    std::mt19937_64 draw(19);
    for (int trial = 0; trial < 20; ++trial) {
        const std::uint64_t seed = draw(), n = draw() % 5000;
        Rng stepped(seed), jumped(seed);
        for (std::uint64_t i = 0; i < n; ++i) stepped.next_u64();
        jumped.advance(n);
        CHECK(jumped.state().words == stepped.state().words);
        CHECK(jumped.next_u64() == stepped.next_u64());
    }
    // Far jumps compose: a + b at once is a, then b (and the two orders agree).
    for (int trial = 0; trial < 5; ++trial) {
        const std::uint64_t seed = draw(), a = draw(), b = draw() >> 1;
        Rng once(seed), twice(seed), other(seed);
        once.advance(a + b);
        twice.advance(a);
        twice.advance(b);
        other.advance(b);
        other.advance(a);
        CHECK(once.state().words == twice.state().words);
        CHECK(once.state().words == other.state().words);
    }
}
