// AdamW and gradient-norm clipping, as torch.optim.AdamW and torch.nn.utils.clip_grad_norm_.
#include "attn/gpt.hpp"

#include "../simd_clones.hpp"

#include <cmath>

namespace attn {

void AdamW::step(GPT& model, float lr) {
    step(model.parameters(), model.gradients(), model.parameter_table(), lr);
}

ATTN_SIMD_CLONES
void AdamW::step(std::vector<float>& params, const std::vector<float>& grads,
                 const std::vector<ParameterInfo>& table, float lr) {
    if (m.size() != params.size()) {
        m.assign(params.size(), 0.0f);
        v.assign(params.size(), 0.0f);
        step_count = 0;
    }
    ++step_count;
    // torch's single-tensor AdamW, operation for operation, so the numbers agree to rounding.
    // The scalars are Python floats (double) in torch.
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), step_count);
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), step_count);
    const float step_size = static_cast<float>(lr / bias_correction1);
    const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    for (const ParameterInfo& info : table) {
        const float decay = info.decay ? 1.0f - lr * weight_decay : 1.0f;
        for (std::size_t i = info.offset; i < info.offset + info.size; ++i) {
            const float g = grads[i];
            params[i] *= decay;
            m[i] = m[i] * beta1 + (1.0f - beta1) * g;
            v[i] = v[i] * beta2 + (1.0f - beta2) * g * g;
            const float denom = std::sqrt(v[i]) / bias_correction2_sqrt + eps;
            params[i] -= step_size * m[i] / denom;
        }
    }
}

float clip_grad_norm(GPT& model, float max_norm) { return clip_grad_norm(model.gradients(), max_norm); }

float clip_grad_norm(std::vector<float>& grads, float max_norm) {
    double sum_sq = 0.0;
    for (float g : grads) sum_sq += static_cast<double>(g) * g;
    const float norm = static_cast<float>(std::sqrt(sum_sq));
    const float coef = max_norm / (norm + 1e-6f);
    if (max_norm > 0.0f && std::isfinite(norm) && coef < 1.0f) {
        for (float& g : grads) g *= coef;
    }
    return norm;
}

}  // namespace attn
