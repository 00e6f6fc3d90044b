// mistake: divided by √T_q instead of √hs
// Solution to exercise 02: scaled attention scores.
#include "exercise.hpp"

#include "attn/linalg.hpp"

#include <xtensor/xview.hpp>

#include <cmath>

namespace exercise {

attn::Tensor3 scaled_scores(const attn::Tensor3& q, const attn::Tensor3& k) {
    const std::size_t B = q.shape()[0], T_q = q.shape()[1], hs = q.shape()[2];
    attn::expect_shape("k", k, {B, attn::any, hs});
    const float scale = 1.0f / std::sqrt(static_cast<float>(T_q));
    attn::Tensor3 out({B, T_q, k.shape()[1]});
    for (std::size_t b = 0; b < B; ++b) {
        // One sequence: (T_q, hs) · (T_k, hs)ᵀ; sequence b meets only sequence b.
        const attn::Tensor2 qb = xt::view(q, b), kb = xt::view(k, b);
        xt::view(out, b) = attn::matmul_transposed(qb, kb) * scale;
    }
    return out;
}

}  // namespace exercise
