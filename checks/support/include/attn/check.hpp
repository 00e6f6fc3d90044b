/// @file check.hpp
/// @brief Tensor comparisons for the doctest checks, with messages that show expected
/// against actual and where they differ.
#pragma once

#include "attn/tensor.hpp"

#include <doctest/doctest.h>
#include <xtensor/xarray.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace attn::check {

/// The outcome of comparing two tensors element by element.
struct Comparison {
    bool ok = false;           ///< same shape and every |actual − expected| ≤ tolerance
    double max_abs_diff = 0.0; ///< the largest absolute difference (NaN counts as infinite)
    std::string report;        ///< a readable account of the first failure, for the learner
};

/// Converts a flat index to a multi-index string such as `[1, 0, 3]`.
std::string index_string(std::size_t flat, const std::vector<std::size_t>& shape);

/// Compares `actual` with `expected` within an absolute tolerance.
template <class A, class E>
Comparison compare(const A& actual_expr, const E& expected_expr, double tolerance) {
    const xt::xarray<double> actual = xt::cast<double>(actual_expr);
    const xt::xarray<double> expected = xt::cast<double>(expected_expr);
    Comparison c;
    const std::vector<std::size_t> sa(actual.shape().begin(), actual.shape().end());
    const std::vector<std::size_t> se(expected.shape().begin(), expected.shape().end());
    if (sa != se) {
        c.max_abs_diff = INFINITY;
        c.report = "shape " + format_shape(sa) + ", expected " + format_shape(se);
        return c;
    }
    std::size_t worst = 0;
    for (std::size_t i = 0; i < actual.size(); ++i) {
        const double a = actual.flat(i), e = expected.flat(i);
        const double d = (std::isnan(a) != std::isnan(e)) ? INFINITY
                         : (std::isnan(a) || a == e)      ? 0.0
                                                          : std::fabs(a - e);
        if (d > c.max_abs_diff || (i == 0)) {
            if (d > c.max_abs_diff) worst = i;
            c.max_abs_diff = std::max(c.max_abs_diff, d);
        }
    }
    c.ok = c.max_abs_diff <= tolerance;
    if (!c.ok) {
        char buf[256];
        std::snprintf(buf, sizeof buf,
                      "at %s: got %.7g, expected %.7g (difference %.3g, tolerance %.3g)",
                      index_string(worst, sa).c_str(), actual.flat(worst), expected.flat(worst),
                      c.max_abs_diff, tolerance);
        c.report = buf;
    }
    return c;
}

}  // namespace attn::check

/// CHECK that two tensors have the same shape and agree within `tol` (absolute), showing
/// the first worst element when they do not.
#define CHECK_CLOSE(actual, expected, tol)                                              \
    do {                                                                                \
        const auto attn_cmp_ = ::attn::check::compare((actual), (expected), (tol));     \
        CHECK_MESSAGE(attn_cmp_.ok, #actual " differs from " #expected ": ",            \
                      attn_cmp_.report);                                                \
    } while (false)

/// REQUIRE form of CHECK_CLOSE: stops the test case on a mismatch.
#define REQUIRE_CLOSE(actual, expected, tol)                                            \
    do {                                                                                \
        const auto attn_cmp_ = ::attn::check::compare((actual), (expected), (tol));     \
        REQUIRE_MESSAGE(attn_cmp_.ok, #actual " differs from " #expected ": ",          \
                        attn_cmp_.report);                                              \
    } while (false)

namespace doctest {
/// std::vector in a check's message: [a, b, c] (doctest prints {?} for containers), 16-bit
/// words as hex (they are bfloat16 or float16 bit patterns), the first 16 of a long one.
template <class T>
struct StringMaker<std::vector<T>> {
    static String convert(const std::vector<T>& v) {
        std::ostringstream o;
        o << '[';
        const std::size_t shown = v.size() > 16 ? 16 : v.size();
        for (std::size_t i = 0; i < shown; ++i) {
            if (i) o << ", ";
            if constexpr (std::is_same_v<T, std::uint16_t>)
                o << "0x" << std::hex << std::setw(4) << std::setfill('0') << v[i] << std::dec;
            else
                o << v[i];
        }
        if (shown < v.size()) o << ", … (" << v.size() << " in all)";
        o << ']';
        return String(o.str().c_str());
    }
};

}  // namespace doctest
