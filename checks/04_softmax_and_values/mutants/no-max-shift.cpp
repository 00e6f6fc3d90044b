// mistake: the maximum is not subtracted before exp
// Solution to exercise 04: the stable softmax over the last axis.
#include "exercise.hpp"

#include <cmath>
#include <limits>

namespace exercise {

attn::Tensor3 softmax_last_axis(const attn::Tensor3& logits) {
    constexpr float inf = std::numeric_limits<float>::infinity();
    const std::size_t B = logits.shape()[0], Tq = logits.shape()[1], Tk = logits.shape()[2];
    attn::require(Tk > 0, "softmax_last_axis: the last axis is empty, shape " +
                              attn::shape_of(logits));
    attn::Tensor3 out(logits.shape());
    for (std::size_t b = 0; b < B; ++b) {
        for (std::size_t i = 0; i < Tq; ++i) {
            float m = -inf;
            for (std::size_t j = 0; j < Tk; ++j) {
                const float z = logits(b, i, j);
                attn::require(!std::isnan(z) && z != inf,
                              "softmax_last_axis: a NaN or +inf logit in row (" +
                                  std::to_string(b) + ", " + std::to_string(i) + ")");
                m = std::max(m, z);
            }
            if (m == -inf) {  // fully masked: attend to nothing
                for (std::size_t j = 0; j < Tk; ++j) out(b, i, j) = 0.0f;
                continue;
            }
            float sum = 0.0f;  // at least e⁰ = 1, from the largest logit
            for (std::size_t j = 0; j < Tk; ++j) sum += out(b, i, j) = std::exp(logits(b, i, j));
            for (std::size_t j = 0; j < Tk; ++j) out(b, i, j) /= sum;
        }
    }
    return out;
}

}  // namespace exercise
