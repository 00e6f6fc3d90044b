// Checks for exercise 18: float32 to bfloat16, and a softmax with 16-bit scores and float32
// statistics.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - every float rounds to the nearer of the two bfloat16s around it, a tie to the even one
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/fixtures.hpp"
#include "attn/npy.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <sstream>
#include <vector>

using exercise::float_to_bfloat16;
using exercise::softmax_bfloat16;

namespace {

float float_of(std::uint32_t bits) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

// A bfloat16's value: its bits are the top half of a float's.
float value_of(std::uint16_t b) { return float_of(static_cast<std::uint32_t>(b) << 16); }

bool is_nan(std::uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0; }

std::vector<std::uint16_t> bits_of_exact(const std::vector<float>& values) {
    std::vector<std::uint16_t> out;
    for (float v : values) {
        std::uint32_t b;
        std::memcpy(&b, &v, sizeof b);
        REQUIRE_MESSAGE((b & 0xffffu) == 0, "a test score that bfloat16 cannot hold exactly");
        out.push_back(static_cast<std::uint16_t>(b >> 16));
    }
    return out;
}

std::vector<int> fixture(const std::string& name) {
    const attn::NpyArray a = attn::read_npy(attn::fixtures_dir() / "precision" / name);
    return std::vector<int>(a.data.begin(), a.data.end());  // 16-bit values: exact in float32
}

}  // namespace

TEST_CASE("values bfloat16 holds exactly keep their bits, and their sign") {
    // Bit-exact throughout: the conversion is a fixed function of the float's bits (round to
    // nearest even), so there is exactly one right answer.
    CHECK(float_to_bfloat16(1.0f) == 0x3f80);
    CHECK(float_to_bfloat16(-2.5f) == 0xc020);
    CHECK(float_to_bfloat16(3.0f) == 0x4040);
    CHECK(float_to_bfloat16(0.0f) == 0x0000);
    CHECK(float_to_bfloat16(-0.0f) == 0x8000);
    CHECK(float_to_bfloat16(FLT_MIN) == 0x0080);  // 2^-126, the smallest normal
    CHECK(float_to_bfloat16(-std::numeric_limits<float>::infinity()) == 0xff80);
}

TEST_CASE("rounds to the nearest bfloat16, worked by hand") {
    // At 1 a bfloat16 step is 2^-7: half a step is 2^-8.
    INFO("1 + 2^-9 is a quarter step above 1: to 1 (0x3f80); 1 + 0.75·2^-7 is three quarters: "
         "up to 1 + 2^-7 (0x3f81); 1 + 2^-8 + 2^-20 is just past half: up (0x3f81)");
    CHECK(float_to_bfloat16(1.0f + 0x1p-9f) == 0x3f80);
    CHECK(float_to_bfloat16(1.0f + 0.75f * 0x1p-7f) == 0x3f81);
    CHECK(float_to_bfloat16(1.0f + 0x1p-8f + 0x1p-20f) == 0x3f81);
    CHECK(float_to_bfloat16(-(1.0f + 0.75f * 0x1p-7f)) == 0xbf81);  // the same, negative
}

TEST_CASE("a tie goes to the even pattern, up or down") {
    INFO("1 + 2^-8 is exactly halfway between 0x3f80 (even) and 0x3f81: to 0x3f80; 1 + 3·2^-8 "
         "halfway between 0x3f81 and 0x3f82 (even): to 0x3f82. Not always down (truncation), "
         "not always up (ties away from zero)");
    CHECK(float_to_bfloat16(1.0f + 0x1p-8f) == 0x3f80);
    CHECK(float_to_bfloat16(1.0f + 3.0f * 0x1p-8f) == 0x3f82);
    CHECK(float_to_bfloat16(1.0f + 5.0f * 0x1p-8f) == 0x3f82);
    CHECK(float_to_bfloat16(-(1.0f + 0x1p-8f)) == 0xbf80);
    CHECK(float_to_bfloat16(-(1.0f + 3.0f * 0x1p-8f)) == 0xbf82);
}

TEST_CASE("a carry out of the mantissa moves the exponent up") {
    INFO("0x3fffffff = 1.99999988: its top bits 0x3fff and low half 0xffff round up to 2 (0x4000)");
    CHECK(float_to_bfloat16(float_of(0x3fffffffu)) == 0x4000);
    CHECK(float_to_bfloat16(float_of(0x407fffffu)) == 0x4080);
    CHECK(float_to_bfloat16(float_of(0xbfffffffu)) == 0xc000);
}

TEST_CASE("beyond the largest bfloat16 by half a step: infinity, with the sign") {
    INFO("bfloat16's largest is 0x7f7f = 3.3895e38; FLT_MAX (0x7f7fffff) is past the midpoint to "
         "the next power of two, so it rounds to infinity (0x7f80), not to the largest");
    CHECK(float_to_bfloat16(FLT_MAX) == 0x7f80);
    CHECK(float_to_bfloat16(-FLT_MAX) == 0xff80);
    CHECK(float_to_bfloat16(std::numeric_limits<float>::infinity()) == 0x7f80);
    CHECK(float_to_bfloat16(float_of(0x7f7f7fffu)) == 0x7f7f);  // below the midpoint: the largest
}

TEST_CASE("a NaN stays a NaN, whatever its payload") {
    INFO("0x7f800001 is a NaN whose payload is in the low half only: rounded as a number it "
         "gives 0x7f80, infinity. A NaN must come out as a NaN (exponent all ones, mantissa not 0)");
    for (std::uint32_t nan : {0x7fc00000u, 0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu}) {
        CAPTURE(nan);
        CHECK(is_nan(float_to_bfloat16(float_of(nan))));
    }
    CHECK((float_to_bfloat16(float_of(0xff800001u)) & 0x8000) == 0x8000);  // its sign kept
}

TEST_CASE("subnormal floats round too: they are not flushed to zero") {
    CHECK(float_to_bfloat16(float_of(0x00010000u)) == 0x0001);  // exact
    CHECK(float_to_bfloat16(float_of(0x0000ffffu)) == 0x0001);  // past half: up
    CHECK(float_to_bfloat16(float_of(0x00018000u)) == 0x0002);  // a tie: to even
    CHECK(float_to_bfloat16(float_of(0x80010000u)) == 0x8001);
}

TEST_CASE("every conversion agrees with PyTorch's on 3700 values chosen to be hard") {
    const std::vector<int> high = fixture("input_bits_high.npy"), low = fixture("input_bits_low.npy"),
                           torch = fixture("bfloat16_bits.npy");
    REQUIRE(high.size() == torch.size());
    int wrong = 0, first_wrong = -1;
    for (std::size_t i = 0; i < high.size(); ++i) {
        const float x = float_of((static_cast<std::uint32_t>(high[i]) << 16) | static_cast<std::uint32_t>(low[i]));
        const std::uint16_t got = float_to_bfloat16(x);
        const bool ok = std::isnan(x) ? is_nan(got) : got == torch[i];
        if (!ok && first_wrong < 0) first_wrong = static_cast<int>(i);
        wrong += !ok;
    }
    if (first_wrong >= 0) {
        const std::size_t i = static_cast<std::size_t>(first_wrong);
        const float x = float_of((static_cast<std::uint32_t>(high[i]) << 16) | static_cast<std::uint32_t>(low[i]));
        const std::uint32_t bits = (static_cast<std::uint32_t>(high[i]) << 16) | static_cast<std::uint32_t>(low[i]);
        std::ostringstream where;  // doctest's message stream takes no std::hex
        where << "first difference: the float with bits 0x" << std::hex << bits << " (" << std::defaultfloat
              << x << "): PyTorch gives 0x" << torch[i] << ", yours 0x" << float_to_bfloat16(x);
        INFO(where.str());
        CHECK(wrong == 0);
    }
}

TEST_CASE("property: every float rounds to the nearer of the two bfloat16s around it, a tie to the even one") {
    // Any 32-bit pattern: its top half drawn uniformly or from the edges (0, ±1, the largest
    // finite bfloat16, infinity, a NaN's exponent), its low half uniformly or from the
    // rounding edges (0, 1, just under, at and over half a step, all ones), so that ties,
    // carries into infinity and NaNs whose payload sits in the low half come up. The reference is worked independently: the two
    // bfloat16 candidates are the float's top 16 bits and the pattern one above (for a
    // positive float: the next one away from zero), their values compared with x in double,
    // where every float and both candidates are exact. The pattern above the largest finite
    // bfloat16 is infinity and counts as 2^128 (IEEE's rule: from half a step past the
    // largest, round to infinity). A NaN must stay a NaN of the same sign.
    attn::check_property("float_to_bfloat16 of any float is its nearest bfloat16", [] {
        const auto hi = *rc::gen::oneOf(rc::gen::arbitrary<std::uint16_t>(),
                                        rc::gen::element<std::uint16_t>(0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f7f, 0xff7f,
                                                                        0x7f80, 0xff80, 0x0001, 0x007f));
        const auto lo = *rc::gen::oneOf(rc::gen::arbitrary<std::uint16_t>(),
                                        rc::gen::element<std::uint16_t>(0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff));
        const std::uint32_t bits = (static_cast<std::uint32_t>(hi) << 16) | lo;
        const float x = float_of(bits);
        const std::uint16_t got = float_to_bfloat16(x);
        if (std::isnan(x)) {
            RC_ASSERT(is_nan(got));
            RC_ASSERT((got & 0x8000u) == ((bits >> 16) & 0x8000u));
            return;
        }
        const std::uint16_t low = static_cast<std::uint16_t>(bits >> 16);
        const std::uint16_t high = static_cast<std::uint16_t>(low + 1);  // one step away from 0
        auto value = [](std::uint16_t b) {
            if ((b & 0x7fffu) == 0x7f80u) return std::copysign(std::ldexp(1.0, 128), (b & 0x8000u) ? -1.0 : 1.0);
            return static_cast<double>(value_of(b));
        };
        std::uint16_t expected = low;
        if (!std::isinf(x) && (bits & 0xffffu) != 0) {
            const double d_low = std::abs(static_cast<double>(x) - value(low)),
                         d_high = std::abs(value(high) - static_cast<double>(x));
            expected = d_high < d_low || (d_high == d_low && (low & 1u)) ? high : low;
        }
        RC_ASSERT(got == expected);
    }, 2000);
}

TEST_CASE("softmax of [1, 2, 3] and of [0, 0], worked and checked against PyTorch") {
    // torch.tensor([1., 2., 3.]).softmax(0).bfloat16(): 0.08984375, 0.2451171875, 0.6640625
    // Bit-exact is safe: the float32 probabilities are within ~5u ≈ 3e-7 relative of the
    // exact ones (u = 2^-24), and the exact ones sit ≥ 4e-4 relative from a bfloat16 midpoint
    // (0.12, 0.10 and 0.20 of a step), so both round to the same bfloat16. [0, 0] gives 0.5.
    CHECK(softmax_bfloat16(bits_of_exact({1.0f, 2.0f, 3.0f})) ==
          std::vector<std::uint16_t>{0x3db8, 0x3e7b, 0x3f2a});
    CHECK(softmax_bfloat16(bits_of_exact({0.0f, 0.0f})) == std::vector<std::uint16_t>{0x3f00, 0x3f00});
    CHECK(softmax_bfloat16({}).empty());
}

TEST_CASE("large scores do not overflow and very negative ones do not underflow") {
    INFO("e^100 is inf in float32: subtract the row's maximum first. With scores near -100, "
         "e^-100 is 3.7e-44, a float32 subnormal: a maximum that starts at 0 loses them");
    // the same probabilities as [1, 2, 3] shifted (softmax ignores a common shift); the
    // shifts s − m are exact here, so the same bits as above
    CHECK(softmax_bfloat16(bits_of_exact({100.0f, 101.0f, 99.0f})) ==
          std::vector<std::uint16_t>{0x3e7b, 0x3f2a, 0x3db8});
    CHECK(softmax_bfloat16(bits_of_exact({-100.0f, -101.0f, -99.0f})) ==
          std::vector<std::uint16_t>{0x3e7b, 0x3db8, 0x3f2a});
}

TEST_CASE("a fully masked row gives zeros, a partly masked one ignores its masked keys") {
    const std::uint16_t minus_inf = 0xff80;
    INFO("every score -inf: there is no maximum to subtract, e^(-inf - (-inf)) is NaN; the "
         "contract is zeros");
    CHECK(softmax_bfloat16({minus_inf, minus_inf, minus_inf}) == std::vector<std::uint16_t>{0, 0, 0});
    CHECK(softmax_bfloat16({minus_inf, 0x3f80, minus_inf}) == std::vector<std::uint16_t>{0, 0x3f80, 0});
}

TEST_CASE("a long row: each probability is the float64 softmax rounded to bfloat16, and they sum to 1") {
    // 4096 scores N(0, 1): the sum l is about 4096·e^(0.5 − 3.6) ≈ 190. Kept in bfloat16 it
    // would stop growing near 128-256, where a step (1 or 2) exceeds each term.
    attn::Rng rng(18);
    std::vector<float> s(4096);
    std::vector<std::uint16_t> scores(4096);
    for (std::size_t j = 0; j < scores.size(); ++j) {
        const float x = rng.normal();
        std::uint32_t b;
        std::memcpy(&b, &x, sizeof b);
        scores[j] = static_cast<std::uint16_t>(b >> 16);  // any bfloat16 will do
        s[j] = value_of(scores[j]);
    }
    const std::vector<std::uint16_t> p = softmax_bfloat16(scores);
    REQUIRE(p.size() == scores.size());
    double m = -INFINITY, l = 0.0;
    for (float x : s) m = std::max(m, static_cast<double>(x));
    for (float x : s) l += std::exp(x - m);
    double total = 0.0;
    int mismatches = 0, ties = 0;
    for (std::size_t j = 0; j < p.size(); ++j) {
        const double exact = std::exp(s[j] - m) / l;
        total += value_of(p[j]);
        // The nearest bfloat16 of the exact value, unless the exact value is so near a
        // midpoint (within 2^-18 of a step) that float32's rounding may land on either side.
        // That window is 2^-26..2^-25 ≈ 1.5e-8..3e-8 of the value, below float32's own error
        // of a probability: exp (≤ 2u), the division (u) and l's 4096-term sum, γ_4096 ≈
        // 2.4e-4 at worst and ≈ √4096 u ≈ 3.8e-6 with random signs (u = 2^-24), shared by
        // all p_j. A value within that of a midpoint (≈ 3.8e-6·2^8/1.5 ≈ 7e-4 of them, ~3 of
        // 4096) may legally round the other way: the window rests on this seed's values.
        int exponent = 0;
        std::frexp(exact, &exponent);
        const double step = std::ldexp(1.0, exponent - 8);
        const double below = std::floor(exact / step) * step, rest = exact - below;
        if (std::fabs(rest - 0.5 * step) < step * 0x1p-18) {
            ++ties;
            continue;
        }
        const double nearest = rest < 0.5 * step ? below : below + step;
        mismatches += static_cast<double>(value_of(p[j])) != nearest;
    }
    INFO("probabilities that are not the nearest bfloat16 of the float64 softmax: " << mismatches
         << " of " << p.size() << " (a sum or maximum kept in bfloat16, or a rounding that truncates, "
         "shifts them)");
    CHECK(mismatches == 0);
    CHECK(ties < 10);
    // each probability within half a step of its exact value: 2^-9 relative at the top of a
    // binade but up to 2^-8 (bfloat16's u) at its bottom, so the worst case is Σ ½step_j ≤
    // 2^-8 plus float32's γ_4096 ≈ 2.4e-4, above 2^-9. With random signs the 4096 roundings
    // add to ≈ 2^-9/√3·√(Σp²) ≈ 2e-5, 100× under 2^-9: the check rests on that. A sum or a
    // maximum kept in bfloat16 moves the total by ≥ 1e-2.
    CHECK(std::fabs(total - 1.0) <= 0x1p-9);
}
