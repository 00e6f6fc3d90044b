// Checks for exercise 18: float32 to bfloat16, and a softmax with 16-bit scores and float32
// statistics.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - every float rounds to the nearer of the two bfloat16s around it, a tie to the even one,
//   and a NaN keeps its top half with the quiet bit set
// - a sign flip and a power of two move a float's bfloat16 exactly; NaN and ±∞ keep theirs
// - rows of scores of any size and offset under masks of every kind give the float32 softmax,
//   rounded once
// - the scores in any order give the probabilities in that order
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/fixtures.hpp"
#include "attn/npy.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>

#include <algorithm>
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

// The nearest bfloat16 of a float that is not NaN, worked independently of the exercise: the
// two candidates are the float's top 16 bits and the pattern one above (for a positive float:
// the next one away from zero), their values compared with x in double, where every float
// and both candidates are exact; a tie goes to the even pattern. The pattern above the
// largest finite bfloat16 is infinity and counts as 2^128 (IEEE's rule: from half a step past
// the largest, round to infinity).
std::uint16_t nearest_bfloat16(float x) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    const std::uint16_t low = static_cast<std::uint16_t>(bits >> 16);
    const std::uint16_t high = static_cast<std::uint16_t>(low + 1);
    if (std::isinf(x) || (bits & 0xffffu) == 0) return low;
    auto value = [](std::uint16_t b) {
        if ((b & 0x7fffu) == 0x7f80u) return std::copysign(std::ldexp(1.0, 128), (b & 0x8000u) ? -1.0 : 1.0);
        return static_cast<double>(value_of(b));
    };
    const double d_low = std::abs(static_cast<double>(x) - value(low)), d_high = std::abs(value(high) - static_cast<double>(x));
    return d_high < d_low || (d_high == d_low && (low & 1u)) ? high : low;
}

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
    // The contract fixes the bits: the top half with the quiet bit (0x0040) set. A signalling
    // NaN (quiet bit 0: 0x7f80 0001, 0x7fa0 1234) must come out quiet, 0x7fc0 and 0x7fe0; a
    // quiet one keeps its top half as it is.
    INFO("a NaN comes out as its top 16 bits | 0x0040 (the quiet bit): not another bit, not the low bit");
    CHECK(float_to_bfloat16(float_of(0x7f800001u)) == 0x7fc0);
    CHECK(float_to_bfloat16(float_of(0x7fa01234u)) == 0x7fe0);
    CHECK(float_to_bfloat16(float_of(0xff800001u)) == 0xffc0);
    CHECK(float_to_bfloat16(float_of(0x7fc00000u)) == 0x7fc0);
    CHECK(float_to_bfloat16(float_of(0x7fd50000u)) == 0x7fd5);
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
    // largest, round to infinity). A NaN must keep its top half, with the quiet bit (0x0040) set.
    attn::check_property("float_to_bfloat16 of any float is its nearest bfloat16", [] {
        const auto hi = attn::draw("top half", rc::gen::oneOf(rc::gen::arbitrary<std::uint16_t>(),
                                                          rc::gen::element<std::uint16_t>(0x0000, 0x8000, 0x3f80, 0xbf80, 0x7f7f, 0xff7f,
                                                                                          0x7f80, 0xff80, 0x7f81, 0xffa0, 0x7fc0,
                                                                                          0x0001, 0x007f)));
        const auto lo = attn::draw("low half", rc::gen::oneOf(rc::gen::arbitrary<std::uint16_t>(),
                                                          rc::gen::element<std::uint16_t>(0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff)));
        const std::uint32_t bits = (static_cast<std::uint32_t>(hi) << 16) | lo;
        const float x = float_of(bits);
        const std::uint16_t got = float_to_bfloat16(x);
        if (std::isnan(x)) {
            // The contract fixes a NaN's bits: its top half with the quiet bit set, so a
            // signalling NaN (quiet bit 0) comes out quiet, its sign and payload kept.
            RC_ASSERT(got == static_cast<std::uint16_t>((bits >> 16) | 0x0040u));
            return;
        }
        RC_ASSERT(got == nearest_bfloat16(x));
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

TEST_CASE("property: a sign flip and a power of two move a float's bfloat16 exactly, and non-finite floats keep theirs") {
    // Any float whose exponent is within ±100 of 1 (normal, and normal after scaling): its
    // bfloat16 of −x is its own with the sign bit flipped, and of 2^k·x (k from −8 to 8) its
    // own with k added to the exponent field, k·0x0080 (rounding depends only on the
    // mantissa's bits; a carry into the exponent carries the same way). NaN, +∞ and −∞:
    // 0x7fc0 (NaN's top half with the quiet bit), 0x7f80 and 0xff80.
    attn::check_property("float_to_bfloat16 is odd and commutes with powers of two", [] {
        const auto mantissa = attn::draw("mantissa bits", rc::gen::inRange<std::uint32_t>(0, 1u << 23));
        const int exponent = attn::draw("exponent", rc::gen::inRange(-100, 101));
        const bool negative = attn::draw("negative", rc::gen::arbitrary<bool>());
        const int k = static_cast<int>(std::lround(std::log2(attn::draw("scale", attn::family::scale()))));
        const std::uint32_t bits = (negative ? 0x80000000u : 0u) | (static_cast<std::uint32_t>(exponent + 127) << 23) | mantissa;
        const float x = float_of(bits);
        const std::uint16_t b = float_to_bfloat16(x);
        RC_ASSERT(float_to_bfloat16(-x) == static_cast<std::uint16_t>(b ^ 0x8000u));
        RC_ASSERT(float_to_bfloat16(std::ldexp(x, k)) == static_cast<std::uint16_t>(b + k * 0x0080));
        const float special = attn::draw("a non-finite float", attn::family::non_finite());
        const std::uint16_t expected = std::isnan(special) ? std::uint16_t{0x7fc0} : (special > 0 ? std::uint16_t{0x7f80} : std::uint16_t{0xff80});
        RC_ASSERT(float_to_bfloat16(special) == expected);
    });
}

namespace {

// RC_ASSERTs that p = softmax_bfloat16(scores) is, entry by entry, what rounding a float32
// softmax to bfloat16 can give. Bound on the float32 probability p̂ against the float64 p
// (u = 2^-24, n keys not −∞, d = s − m): s − m rounds by ≤ u·|d| (exact when the exponents
// of s and m are within 16 of each other), which moves p by ≤ u/e absolutely (x·e^−x ≤ 1/e)
// and l by ≤ n·u/e relatively; e^x adds 2u, l's sum γ_n, the division u: |p̂ − p| ≤ u +
// (2n + 4)u·p; a one-pass (online) sum rescales l up to n times, 3u each, so u + (4n + 6)u·p
// is allowed, plus 2^-149 for a p̂ among float's subnormals. Rounding to nearest is
// monotonic, so the bfloat16 of p̂ lies between the nearest bfloat16s of the floats nearest
// p − err and p + err (nearest_bfloat16, worked independently). A key of −∞ gets exactly 0,
// and a row of −∞ only zeros.
void check_softmax_row(const std::vector<std::uint16_t>& scores) {
    const double u = std::ldexp(1.0, -24);
    const std::vector<std::uint16_t> got = softmax_bfloat16(scores);
    RC_ASSERT(got.size() == scores.size());
    double m = -INFINITY, l = 0.0, n = 0.0;
    for (std::uint16_t s : scores) m = std::max(m, static_cast<double>(value_of(s)));
    for (std::uint16_t s : scores)
        if (value_of(s) != -INFINITY) {
            l += std::exp(value_of(s) - m);
            n += 1;
        }
    for (std::size_t j = 0; j < scores.size(); ++j) {
        if (m == -INFINITY || value_of(scores[j]) == -INFINITY) {
            RC_ASSERT(got[j] == 0);
            continue;
        }
        const double p = std::exp(value_of(scores[j]) - m) / l;
        const double err = u + (4 * n + 6) * u * p + std::ldexp(1.0, -149);
        const double lowest = value_of(nearest_bfloat16(static_cast<float>(std::max(0.0, p - err))));
        const double highest = value_of(nearest_bfloat16(static_cast<float>(p + err)));
        RC_ASSERT(lowest <= value_of(got[j]));
        RC_ASSERT(value_of(got[j]) <= highest);
    }
}

// The bfloat16 bits of a float, truncated: any bfloat16 will do as a score.
std::uint16_t truncated(float x) {
    std::uint32_t b;
    std::memcpy(&b, &x, sizeof b);
    return static_cast<std::uint16_t>(b >> 16);
}

}  // namespace

TEST_CASE("property: rows of scores of any size and offset under masks of every kind give the float32 softmax, rounded once") {
    // Rows of 1 to 8 scores (1 a quarter of the time): a common offset (0, ±1 … ±10^4) plus
    // ±10^−6 … 10^38, truncated to bfloat16; the keys a mask hides (leading, trailing,
    // interleaved, one key, all keys, causal) set to −∞, and sometimes the whole row.
    // check_softmax_row's bound. A maximum started at 0 or at a finite sentinel, a sum kept
    // in bfloat16, or a probability rounded twice falls outside it.
    attn::check_property("softmax_bfloat16 of any row is its float32 softmax rounded to bfloat16", [] {
        const std::size_t n = attn::draw("n (scores)", attn::family::length(8));
        const float c = attn::draw("offset", attn::family::offset());
        const auto drawn = attn::draw("scores (before the offset)", rc::gen::container<std::vector<float>>(n, attn::family::magnitude(-6, 38)));
        const attn::Mask<2> mask = attn::family::mask("mask", 1, n);
        const bool all_hidden = attn::draw("every key hidden", rc::gen::weightedOneOf<bool>({{7, rc::gen::just(false)}, {1, rc::gen::just(true)}}));
        std::vector<std::uint16_t> scores(n);
        for (std::size_t j = 0; j < n; ++j) scores[j] = mask(0, j) && !all_hidden ? truncated(drawn[j] + c) : 0xff80;
        check_softmax_row(scores);
    });
}

TEST_CASE("property: the scores in any order give the probabilities in that order") {
    // Rows of 1 to 8 distinct scores (1/8 … 8·n in size, either sign, truncated to bfloat16)
    // and a drawn order of them: each row, as given and reordered, within check_softmax_row's
    // bound of the float64 softmax, which does not depend on the order (only l's sum does, by
    // γ_n at most). A probability written to another key's place, or a maximum or sum over
    // part of the row, shows.
    attn::check_property("softmax_bfloat16 permutes with its scores", [] {
        const std::size_t n = attn::draw("n (scores)", attn::family::length(8));
        const auto values = attn::draw("scores (distinct)", attn::family::distinct(n));
        const auto order = attn::draw("their order", attn::family::permutation(n));
        std::vector<std::uint16_t> scores(n), moved(n);
        for (std::size_t j = 0; j < n; ++j) {
            scores[j] = truncated(values[j]);
            moved[j] = truncated(values[order[j]]);
        }
        check_softmax_row(scores);
        check_softmax_row(moved);
    });
}

