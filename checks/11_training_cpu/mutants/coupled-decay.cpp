// mistake: the weight decay is added to the gradient (L2, Adam) instead of decoupled
// Solution to exercise 11: the AdamW step.
#include "exercise.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace exercise {

void adamw_step(std::vector<float>& param, const std::vector<float>& grad, std::vector<float>& m,
                std::vector<float>& v, long step, const AdamWSettings& s, bool decay) {
    const std::size_t n = param.size();
    if (grad.size() != n || m.size() != n || v.size() != n) {
        throw std::invalid_argument("adamw_step: param, grad, m and v must have one size; got " +
                                    std::to_string(n) + ", " + std::to_string(grad.size()) + ", " +
                                    std::to_string(m.size()) + ", " + std::to_string(v.size()));
    }
    if (step < 1) throw std::invalid_argument("adamw_step: step counts from 1, got " + std::to_string(step));
    if (!(s.lr >= 0) || !(s.beta1 >= 0 && s.beta1 < 1) || !(s.beta2 >= 0 && s.beta2 < 1) ||
        !(s.eps > 0) || !(s.weight_decay >= 0)) {
        throw std::invalid_argument("adamw_step: a setting is out of range (lr >= 0, beta1 and "
                                    "beta2 in [0, 1), eps > 0, weight_decay >= 0)");
    }
    // m and v start at zero, so early on they underestimate the moments by these factors.
    const double c1 = 1.0 - std::pow(static_cast<double>(s.beta1), step);
    const double c2 = 1.0 - std::pow(static_cast<double>(s.beta2), step);
    const float shrink = decay ? 1.0f - s.lr * s.weight_decay : 1.0f;
    for (std::size_t i = 0; i < n; ++i) {
        const float g = grad[i] + (decay ? s.weight_decay * param[i] : 0.0f);
        m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * g;
        v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * g * g;
        const float m_hat = static_cast<float>(m[i] / c1);
        const float v_hat = static_cast<float>(v[i] / c2);
        param[i] -= s.lr * m_hat / (std::sqrt(v_hat) + s.eps);
    }
}

}  // namespace exercise
