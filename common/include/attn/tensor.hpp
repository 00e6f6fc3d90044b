/// @file tensor.hpp
/// @brief Tensor aliases, shape formatting and shape checks used by every lesson.
///
/// The axis letters are defined once for the whole course:
/// `B` batch, `T` time (sequence length), `C` channels, `NH` heads, `hs` head size,
/// `V` vocabulary size.
#pragma once

#include <xtensor/xtensor.hpp>

#include <array>
#include <cstddef>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace attn {

/// A tensor of float32 with its rank fixed at compile time.
template <std::size_t N>
using Tensor = xt::xtensor<float, N>;

using Tensor1 = Tensor<1>;  ///< a vector, e.g. (C)
using Tensor2 = Tensor<2>;  ///< a matrix, e.g. (T, C) or a weight (out, in)
using Tensor3 = Tensor<3>;  ///< e.g. (B, T, C)
using Tensor4 = Tensor<4>;  ///< e.g. (B, NH, T, hs)

/// A boolean tensor of rank N (masks: true means "may attend").
template <std::size_t N>
using Mask = xt::xtensor<bool, N>;

/// Formats a shape the way PyTorch prints it: `(4, 8, 32)`.
std::string format_shape(const std::vector<std::size_t>& shape);

/// Formats the shape of any xtensor expression: `(4, 8, 32)`.
template <class E>
std::string shape_of(const E& e) {
    return format_shape(std::vector<std::size_t>(e.shape().begin(), e.shape().end()));
}

/// Marks an axis whose size is not checked in expect_shape().
inline constexpr std::size_t any = static_cast<std::size_t>(-1);

/// Throws std::invalid_argument unless `t` has exactly the `expected` shape.
///
/// Use attn::any for an axis that may have any size. The message names the tensor,
/// the expected and the actual shape, for example
/// `q: expected shape (4, 8, 16), got (4, 8, 32)`.
template <class E>
void expect_shape(std::string_view name, const E& t, std::initializer_list<std::size_t> expected) {
    const auto& s = t.shape();
    bool ok = s.size() == expected.size();
    std::size_t i = 0;
    for (std::size_t want : expected) {
        if (!ok) break;
        ok = (want == any) || (s[i] == want);
        ++i;
    }
    if (!ok) {
        std::string want = "(";
        std::size_t k = 0;
        for (std::size_t w : expected) {
            if (k++) want += ", ";
            want += (w == any) ? std::string("*") : std::to_string(w);
        }
        if (expected.size() == 1) want += ",";
        want += ")";
        throw std::invalid_argument(std::string(name) + ": expected shape " + want + ", got " +
                                    shape_of(t));
    }
}

/// Throws std::invalid_argument with `what` unless `condition` holds.
inline void require(bool condition, const std::string& what) {
    if (!condition) throw std::invalid_argument(what);
}

}  // namespace attn
