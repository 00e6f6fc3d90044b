// mistake: the backward pass forgets pos0 and puts row t at position t
// Solution to exercise 15: RoPE's rotation and its backward.
#include "exercise.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace exercise {

namespace {

void check_input(const attn::Tensor2& x, int pos0, const char* who) {
    if (x.shape()[1] % 2 != 0)
        throw std::invalid_argument(std::string(who) + ": the head size must be even, got " +
                                    std::to_string(x.shape()[1]));
    if (pos0 < 0)
        throw std::invalid_argument(std::string(who) + ": pos0 must not be negative, got " +
                                    std::to_string(pos0));
}

// Rotates every pair (2i, 2i+1) of row t by sign * theta(pos0 + t, i).
attn::Tensor2 rotate(const attn::Tensor2& x, int pos0, double sign) {
    const std::size_t T = x.shape()[0], hs = x.shape()[1];
    attn::Tensor2 y = attn::Tensor2::from_shape({T, hs});
    for (std::size_t t = 0; t < T; ++t) {
        const double p = static_cast<double>(pos0) + static_cast<double>(t);
        for (std::size_t i = 0; i < hs / 2; ++i) {
            const double theta =
                sign * p * std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
            const float c = static_cast<float>(std::cos(theta));
            const float s = static_cast<float>(std::sin(theta));
            const float x0 = x(t, 2 * i), x1 = x(t, 2 * i + 1);
            y(t, 2 * i) = x0 * c - x1 * s;
            y(t, 2 * i + 1) = x0 * s + x1 * c;
        }
    }
    return y;
}

}  // namespace

attn::Tensor2 rope_rotate(const attn::Tensor2& x, int pos0) {
    check_input(x, pos0, "rope_rotate");
    return rotate(x, pos0, 1.0);
}

attn::Tensor2 rope_rotate_backward(const attn::Tensor2& dy, int pos0) {
    check_input(dy, pos0, "rope_rotate_backward");
    // forward: y = R(theta) x per pair, so dx = R(theta)^T dy = R(-theta) dy
    return rotate(dy, 0, -1.0);
}

}  // namespace exercise
