// AdamW and gradient-norm clipping, as torch.optim.AdamW and torch.nn.utils.clip_grad_norm_.
#include "attn/gpt.hpp"

#include "../simd_clones.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace attn {

void AdamW::step(GPT& model, float lr) {
    step(model.parameters(), model.gradients(), model.parameter_table(), lr);
}

ATTN_SIMD_CLONES
void AdamW::step(std::vector<float>& params, const std::vector<float>& grads,
                 const std::vector<ParameterInfo>& table, float lr) {
    if (grads.size() != params.size()) {  // e.g. a model whose gradients go to a sink (ZeRO stage 2)
        throw std::invalid_argument("AdamW::step: " + std::to_string(grads.size()) + " gradients for " +
                                    std::to_string(params.size()) + " parameters");
    }
    if (m.size() != params.size()) {
        m.assign(params.size(), 0.0f);
        v.assign(params.size(), 0.0f);
        step_count = 0;
    }
    step_segments_of(params.data(), {0}, grads.data(), table, lr, {{0, params.size()}}, {0});
}

void AdamW::step_range(std::vector<float>& params, const std::vector<float>& grads,
                       const std::vector<ParameterInfo>& table, float lr, std::size_t begin, std::size_t end) {
    if (begin > end || end > params.size() || grads.size() != params.size()) {
        throw std::invalid_argument("AdamW::step_range: parameters [" + std::to_string(begin) + ", " +
                                    std::to_string(end) + ") of " + std::to_string(params.size()) +
                                    " with " + std::to_string(grads.size()) + " gradients");
    }
    const std::size_t n = end - begin;
    if (m.size() == params.size() && n != params.size()) {  // the whole state: keep this range
        m = std::vector<float>(m.begin() + static_cast<std::ptrdiff_t>(begin), m.begin() + static_cast<std::ptrdiff_t>(end));
        v = std::vector<float>(v.begin() + static_cast<std::ptrdiff_t>(begin), v.begin() + static_cast<std::ptrdiff_t>(end));
    } else if (m.empty() && v.empty()) {
        m.assign(n, 0.0f);
        v.assign(n, 0.0f);
        step_count = 0;
    } else if (m.size() != n || v.size() != n) {
        throw std::invalid_argument("AdamW::step_range: moments of " + std::to_string(m.size()) +
                                    " parameters for a range of " + std::to_string(n));
    }
    step_segments_of(params.data(), {begin}, grads.data() + begin, table, lr, {{begin, n}}, {0});
}

void AdamW::step_segments(std::vector<float>& params, const float* grads, const std::vector<ParameterInfo>& table,
                          float lr, const std::vector<Segment>& segments) {
    for (const Segment& s : segments) {
        if (s.offset > params.size() || s.size > params.size() - s.offset) {
            throw std::invalid_argument("AdamW::step_segments: parameters [" + std::to_string(s.offset) + ", " +
                                        std::to_string(s.offset + s.size) + ") of " + std::to_string(params.size()));
        }
    }
    const std::vector<std::size_t> at = packed_moments(segments, "AdamW::step_segments");
    std::vector<std::size_t> offsets;
    for (const Segment& s : segments) offsets.push_back(s.offset);
    step_segments_of(params.data(), offsets, grads, table, lr, segments, at);
}

void AdamW::step_packed(float* params, const float* grads, const std::vector<ParameterInfo>& table, float lr,
                        const std::vector<Segment>& segments) {
    const std::vector<std::size_t> at = packed_moments(segments, "AdamW::step_packed");
    step_segments_of(params, at, grads, table, lr, segments, at);
}

std::vector<std::size_t> AdamW::packed_moments(const std::vector<Segment>& segments, const char* caller) {
    std::vector<std::size_t> at;
    std::size_t n = 0;
    for (const Segment& s : segments) {
        at.push_back(n);
        n += s.size;
    }
    if (m.empty() && v.empty()) {
        m.assign(n, 0.0f);
        v.assign(n, 0.0f);
        step_count = 0;
    } else if (m.size() != n || v.size() != n) {
        throw std::invalid_argument(std::string(caller) + ": moments of " + std::to_string(m.size()) +
                                    " parameters for segments of " + std::to_string(n));
    }
    return at;
}

ATTN_SIMD_CLONES
void AdamW::step_segments_of(float* params, const std::vector<std::size_t>& params_at, const float* grads,
                             const std::vector<ParameterInfo>& table, float lr, const std::vector<Segment>& segments,
                             const std::vector<std::size_t>& at) {
    ++step_count;
    // torch's single-tensor AdamW, operation for operation, so the numbers agree to rounding.
    // The scalars are Python floats (double) in torch.
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), step_count);
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), step_count);
    const float step_size = static_cast<float>(lr / bias_correction1);
    const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    for (std::size_t k = 0; k < segments.size(); ++k) {
        const std::size_t begin = segments[k].offset, end = begin + segments[k].size;
        // parameter i's gradient and moments are at i − begin of these
        float* const pb = params + params_at[k];
        const float* const gb = grads + at[k];
        float* const mb = m.data() + at[k];
        float* const vb = v.data() + at[k];
        for (const ParameterInfo& info : table) {
            const float decay = info.decay ? 1.0f - lr * weight_decay : 1.0f;
            const std::size_t lo = std::max(info.offset, begin), hi = std::min(info.offset + info.size, end);
            for (std::size_t i = lo; i < hi; ++i) {
                const float g = gb[i - begin];
                float& pi = pb[i - begin];
                pi *= decay;
                float& mi = mb[i - begin];
                float& vi = vb[i - begin];
                mi = mi * beta1 + (1.0f - beta1) * g;
                vi = vi * beta2 + (1.0f - beta2) * g * g;
                const float denom = std::sqrt(vi) / bias_correction2_sqrt + eps;
                pi -= step_size * mi / denom;
            }
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
