// mistake: the rescale factor is e^(m_new − m) instead of e^(m − m_new)
// Solution to exercise 13: the online-softmax update.
#include "exercise.hpp"

#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>

namespace exercise {

void online_softmax_update(RowState& state, const attn::Tensor1& scores,
                           const attn::Tensor2& values) {
    attn::expect_shape("values", values, {scores.size(), state.acc.size()});
    float m_new = state.max;
    for (float s : scores) m_new = std::max(m_new, s);
    if (m_new == -std::numeric_limits<float>::infinity()) return;  // all masked so far

    const float rescale = std::exp(m_new - state.max);  // 0 on the first visible tile
    state.sum *= rescale;
    state.acc *= rescale;
    for (std::size_t j = 0; j < scores.size(); ++j) {
        const float p = std::exp(scores(j) - m_new);  // 0 for a masked key
        state.sum += p;
        state.acc += p * xt::row(values, static_cast<long>(j));
    }
    state.max = m_new;
}

}  // namespace exercise
