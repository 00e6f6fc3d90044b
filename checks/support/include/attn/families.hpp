#pragma once
/// @file
/// Property families: the kinds of input every exercise's properties draw from, shared so
/// that each exercise is tried on the same ground as the others.
///
/// A wrong solution usually holds on "ordinary" inputs (values near 1, every key visible,
/// several tokens) and breaks at an edge that nobody thought to try for that exercise: a
/// score below a finite sentinel, a row of weights with a NaN, a mean of 1000 with a spread
/// of 0.01, one token, a count past 2³². The families name those edges once:
///
/// | family | generators | what it catches |
/// |---|---|---|
/// | magnitudes | `magnitude` | sentinels (`-1e9f`), overflow, thresholds (`p > FLT_EPSILON`) |
/// | offsets | `offset` | cancellation (a one-pass variance E[x²] − mean²) |
/// | non-finite | `non_finite` | NaN or ±inf let through where the contract refuses them |
/// | out of range | `out_of_range`, `below`, `not_dividing` | `x < 0` written where `!(x >= 0)` is meant (NaN passes), a bound off by one |
/// | masks | `mask` | a mask leading, trailing, interleaved, of one key, of every key |
/// | T = 1 | `length` | the first token, one key, one row |
/// | argument order | `distinct` | two same-typed arguments swapped, an index transposed |
/// | invariances | `shift`, `scale`, `permutation` | what must not move when the input shifts, scales or is reordered |
/// | wide sizes | `wide_count` | a count or an offset computed in 32 bits |
///
/// `checks/README.md` has the table of which exercise's checks use which family, generated
/// from the `family::` calls in each `checks/NN_slug/checks.cpp` (tools/families_table.py);
/// an exercise whose contract leaves a family no input says why in its `families.txt`.
/// Draw with `attn::draw("name", gen)` so that a counterexample names its values.

#include "attn/property.hpp"
#include "attn/tensor.hpp"

#include <rapidcheck.h>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xoperation.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace attn::family {

/// Floats of either sign and of any magnitude: ±(m/100)·10^e with m in [100, 1000) and e in
/// [lowest, highest), 10^-6 … 10^30 by default (attn::magnitudes, drawn at full range from the
/// first case).
inline rc::Gen<float> magnitude(int lowest = -6, int highest = 30) {
    return attn::magnitudes(lowest, highest);
}

/// A common offset to add to every input of a row or a tensor: 0, or ±10^e with e in [0, 4]
/// and a mantissa: ±1 … ±1e4. Catches what cancels: E[x²] − mean² at mean 1000 and spread
/// 0.01 is rounding noise in float.
inline rc::Gen<float> offset(float largest = 1e4f) {
    const int top = static_cast<int>(std::floor(std::log10(largest)));
    return rc::gen::resize(rc::kNominalSize,
                           rc::gen::oneOf(rc::gen::just(0.0f), attn::magnitudes(0, top, 10),
                                          rc::gen::element(largest, -largest)));
}

/// NaN, +inf or −inf.
inline rc::Gen<float> non_finite() {
    return rc::gen::element(std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity());
}

/// A value outside [lowest, highest] (for floats: NaN too), for a setting the contract
/// refuses. `open_low`/`open_high`: the bound itself is outside as well (ε > 0: lowest = 0,
/// open_low = true draws 0 among others).
inline rc::Gen<float> out_of_range(float lowest, float highest, bool open_low = false,
                                   bool open_high = false) {
    std::vector<float> bad = {std::numeric_limits<float>::quiet_NaN()};
    if (std::isfinite(lowest)) {
        bad.push_back(std::nextafter(lowest, -INFINITY));
        bad.push_back(lowest - 1.0f);
        bad.push_back(-std::numeric_limits<float>::infinity());
        if (open_low) bad.push_back(lowest);
    }
    if (std::isfinite(highest)) {
        bad.push_back(std::nextafter(highest, INFINITY));
        bad.push_back(highest + 1.0f);
        bad.push_back(std::numeric_limits<float>::infinity());
        if (open_high) bad.push_back(highest);
    }
    return rc::gen::elementOf(bad);
}

/// An integer below `lowest`: lowest − 1, lowest − 2, a large negative one.
inline rc::Gen<long> below(long lowest) {
    return rc::gen::element(lowest - 1, lowest - 2, std::min(lowest - 3, -1000000L),
                            std::numeric_limits<long>::min() / 2);
}

/// A size from 1 to `highest`, 1 drawn a quarter of the time (the first token, one key).
inline rc::Gen<std::size_t> length(std::size_t highest) {
    return rc::gen::resize(rc::kNominalSize,
                           rc::gen::weightedOneOf<std::size_t>(
                               {{1, rc::gen::just<std::size_t>(1)},
                                {3, rc::gen::inRange<std::size_t>(1, highest + 1)}}));
}

/// The kinds of mask `mask` draws.
enum class MaskKind { leading, trailing, interleaved, one_key, all_keys, causal };

inline const char* mask_kind_name(MaskKind k) {
    switch (k) {
        case MaskKind::leading: return "leading";
        case MaskKind::trailing: return "trailing";
        case MaskKind::interleaved: return "interleaved";
        case MaskKind::one_key: return "one key";
        case MaskKind::all_keys: return "all keys";
        case MaskKind::causal: return "causal";
    }
    return "?";
}

/// How a counterexample shows a mask's kind.
inline void showValue(MaskKind k, std::ostream& os) { os << mask_kind_name(k); }

/// A (T_q, T_k) mask, true = may attend, of one kind for every row: the first keys visible
/// (leading) or the last (trailing), every other key (interleaved, from a drawn phase), a
/// single key, all keys, or causal (key j ≤ i + T_k − T_q). Each row's count is drawn too
/// (at least one key visible: a fully masked row is its own case).
inline Mask<2> mask_of_kind(MaskKind kind, std::size_t T_q, std::size_t T_k,
                            const std::vector<std::size_t>& counts, std::size_t phase) {
    Mask<2> m = xt::zeros<bool>({T_q, T_k});
    for (std::size_t i = 0; i < T_q; ++i) {
        const std::size_t n = std::max<std::size_t>(1, std::min(counts[i], T_k));
        for (std::size_t j = 0; j < T_k; ++j) {
            bool on = false;
            switch (kind) {
                case MaskKind::leading: on = j < n; break;
                case MaskKind::trailing: on = j >= T_k - n; break;
                case MaskKind::interleaved: on = (j + phase + i) % 2 == 0 || (T_k == 1); break;
                case MaskKind::one_key: on = j == (counts[i] + phase) % T_k; break;
                case MaskKind::all_keys: on = true; break;
                case MaskKind::causal: on = j + T_q <= i + T_k; break;
            }
            m(i, j) = on;
        }
        if (kind == MaskKind::interleaved && !xt::any(xt::view(m, i, xt::all()))) m(i, 0) = true;
    }
    return m;
}

/// A drawn (T_q, T_k) mask of a drawn kind (see mask_of_kind), named `name` in a counterexample.
inline Mask<2> mask(const std::string& name, std::size_t T_q, std::size_t T_k) {
    const auto kind = attn::draw(name + " kind",
                                 rc::gen::element(MaskKind::leading, MaskKind::trailing,
                                                  MaskKind::interleaved, MaskKind::one_key,
                                                  MaskKind::all_keys, MaskKind::causal));
    const auto counts = attn::draw(name + " keys per row",
                                   rc::gen::container<std::vector<std::size_t>>(
                                       T_q, rc::gen::inRange<std::size_t>(1, T_k + 1)));
    const auto phase = attn::draw(name + " phase", rc::gen::inRange<std::size_t>(0, 2 * T_k));
    return mask_of_kind(kind, T_q, T_k, counts, phase);
}

/// n values, pairwise distinct and of varied sign and size (1/8 … 8), so that swapping two
/// arguments or transposing two indices changes the result.
inline rc::Gen<std::vector<float>> distinct(std::size_t n) {
    return rc::gen::map(rc::gen::arbitrary<std::uint32_t>(), [n](std::uint32_t seed) {
        std::vector<float> v(n);
        std::uint32_t s = seed | 1u;
        for (std::size_t i = 0; i < n; ++i) {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            // i + 1 in the value keeps them distinct whatever the draw
            const float sign = (s & 1u) ? -1.0f : 1.0f;
            v[i] = sign * (static_cast<float>(i + 1) + static_cast<float>(s % 1000u) / 1000.0f) *
                   std::ldexp(1.0f, static_cast<int>((s >> 10) % 7u) - 3);
        }
        return v;
    });
}

/// A shift to add to every score of a row (a softmax must not move): ±(0 … 1e4).
inline rc::Gen<float> shift() { return offset(1e4f); }

/// A positive power of two from 2^-8 to 2^8: scaling by it is exact in float, so a function
/// that is homogeneous must scale exactly.
inline rc::Gen<float> scale() {
    return rc::gen::map(rc::gen::inRange(-8, 9), [](int e) { return std::ldexp(1.0f, e); });
}

/// A permutation of 0 … n − 1.
inline rc::Gen<std::vector<std::size_t>> permutation(std::size_t n) {
    std::vector<std::size_t> identity(n);
    std::iota(identity.begin(), identity.end(), std::size_t{0});
    return rc::gen::map(rc::gen::arbitrary<std::uint64_t>(), [identity](std::uint64_t seed) {
        std::vector<std::size_t> p = identity;
        for (std::size_t i = p.size(); i > 1; --i) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            std::swap(p[i - 1], p[(seed >> 33) % i]);
        }
        return p;
    });
}

/// A count of elements past what 32 bits hold: 2^31 − 1 … 2^44 and a few exact edges
/// (2^32 − 1, 2^32, 2^32 + 1, 7·10^9), for arithmetic on sizes that needs no memory.
inline rc::Gen<std::size_t> wide_count() {
    return rc::gen::oneOf(
        rc::gen::element<std::size_t>((std::size_t{1} << 31) - 1, std::size_t{1} << 31,
                                      (std::size_t{1} << 32) - 1, std::size_t{1} << 32,
                                      (std::size_t{1} << 32) + 1, 7000000001ULL),
        rc::gen::inRange<std::size_t>(std::size_t{1} << 31, std::size_t{1} << 44));
}

/// A count that does not divide `n`, for a number of heads (or groups, or shards) that must
/// divide a width: 0, or one of 2 … 2n + 1 that is not a divisor of n (family: out of range).
inline rc::Gen<std::size_t> not_dividing(std::size_t n) {
    std::vector<std::size_t> bad = {0};
    for (std::size_t c = 2; c <= 2 * n + 1; ++c)
        if (n % c != 0) bad.push_back(c);
    return rc::gen::elementOf(bad);
}

}  // namespace attn::family
