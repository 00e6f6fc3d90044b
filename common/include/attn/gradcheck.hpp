/// @file gradcheck.hpp
/// @brief Central finite differences, to check a hand-written backward pass against its
/// forward pass.
#pragma once

#include "attn/random.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace attn {

/// The outcome of comparing an analytic gradient with central differences.
struct GradCheck {
    double max_abs_error = 0.0;  ///< largest |analytic − numeric|
    double max_abs_grad = 0.0;   ///< largest |numeric|, to judge the error against
};

/// Central differences (f(x+h) − f(x−h)) / 2h of `objective` with respect to each of the n
/// floats at x, the step being the one float rounding actually takes (saved ± h).
/// @param x the inputs to perturb, n floats; restored on return
/// @param n the number of inputs
/// @param h the step
/// @param objective recomputes the scalar (a double from the float forward pass)
/// @return the n numeric derivatives
inline std::vector<double> numeric_gradient(float* x, std::size_t n, float h,
                                            const std::function<double()>& objective) {
    std::vector<double> numeric(n);
    for (std::size_t i = 0; i < n; ++i) {
        const float saved = x[i];
        x[i] = saved + h;
        const double plus = objective();
        x[i] = saved - h;
        const double minus = objective();
        x[i] = saved;
        const double step = static_cast<double>(saved + h) - static_cast<double>(saved - h);
        numeric[i] = (plus - minus) / step;
    }
    return numeric;
}

/// Compares analytic[i] with the central difference of `objective` for each of the n
/// floats at x (numeric_gradient).
/// @param x the inputs to perturb, n floats; restored on return
/// @param analytic the gradient to check, n floats
/// @param n the number of inputs
/// @param h the step
/// @param objective recomputes the scalar from the current inputs
/// @return the largest error and the largest numeric derivative
inline GradCheck finite_difference(float* x, const float* analytic, std::size_t n, float h,
                                   const std::function<double()>& objective) {
    GradCheck r;
    const std::vector<double> numeric = numeric_gradient(x, n, h, objective);
    for (std::size_t i = 0; i < n; ++i) {
        r.max_abs_error = std::max(r.max_abs_error, std::fabs(numeric[i] - analytic[i]));
        r.max_abs_grad = std::max(r.max_abs_grad, std::fabs(numeric[i]));
    }
    return r;
}

/// n normal floats N(0, std²).
/// @param rng the source @param n how many @param std their standard deviation
/// @return the numbers
inline std::vector<float> normal_vector(Rng& rng, std::size_t n, float std = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = std * rng.normal();
    return v;
}

/// Σ w·out in double: the objective whose gradient with respect to `out` is w.
/// @param out the outputs of a forward pass @param w the weights, as many as `out`
/// @return the weighted sum
inline double weighted_sum(const std::vector<float>& out, const std::vector<float>& w) {
    double s = 0.0;
    for (std::size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
    return s;
}

}  // namespace attn
