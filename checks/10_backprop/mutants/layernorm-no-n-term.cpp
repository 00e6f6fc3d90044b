// mistake: LayerNorm's dx leaves out the n·mean(dn·n) term
// Solution to exercise 10: backpropagation through attention and LayerNorm.
#include "exercise.hpp"

#include "attn/linalg.hpp"

#include <xtensor/xview.hpp>

#include <cmath>

namespace exercise {

AttentionGradients attention_backward(const attn::Tensor2& dout, const attn::Tensor2& q,
                                      const attn::Tensor2& k, const attn::Tensor2& v,
                                      const attn::Tensor2& w) {
    const std::size_t T = q.shape()[0], hs = q.shape()[1];
    attn::expect_shape("k", k, {T, hs});
    attn::expect_shape("v", v, {T, hs});
    attn::expect_shape("dout", dout, {T, hs});
    attn::expect_shape("w", w, {T, T});

    // forward: out = w·v
    const attn::Tensor2 dw = attn::matmul_transposed(dout, v);  // (T, T) = dout·vᵀ
    const attn::Tensor2 wt = xt::transpose(w);
    attn::Tensor2 dv = attn::matmul(wt, dout);  // (T, hs) = wᵀ·dout

    // forward: w[i] = softmax(s[i]) with s[i][j] = −∞ for j > i (w = 0 there, so ds = 0)
    attn::Tensor2 ds({T, T});
    for (std::size_t i = 0; i < T; ++i) {
        float dot = 0.0f;  // Σ_j w[i][j] dw[i][j]
        for (std::size_t j = 0; j < T; ++j) dot += w(i, j) * dw(i, j);
        for (std::size_t j = 0; j < T; ++j) ds(i, j) = w(i, j) * (dw(i, j) - dot);
    }

    // forward: s = q·kᵀ/√hs
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const attn::Tensor2 dst = xt::transpose(ds);
    attn::Tensor2 dq = attn::matmul(ds, k) * scale;   // (T, hs)
    attn::Tensor2 dk = attn::matmul(dst, q) * scale;  // (T, hs)
    return {dq, dk, dv};
}

LayerNormGradients layernorm_backward(const attn::Tensor2& dout, const attn::Tensor2& x,
                                      const attn::Tensor1& weight) {
    const std::size_t N = x.shape()[0], C = x.shape()[1];
    attn::expect_shape("dout", dout, {N, C});
    attn::expect_shape("weight", weight, {C});
    LayerNormGradients g{attn::Tensor2({N, C}), attn::Tensor1({C}, 0.0f), attn::Tensor1({C}, 0.0f)};
    const float inv_C = 1.0f / static_cast<float>(C);
    for (std::size_t r = 0; r < N; ++r) {
        // the forward pass's statistics, recomputed
        float mean = 0.0f, var = 0.0f;
        for (std::size_t c = 0; c < C; ++c) mean += x(r, c);
        mean *= inv_C;
        for (std::size_t c = 0; c < C; ++c) var += (x(r, c) - mean) * (x(r, c) - mean);
        var *= inv_C;
        const float rstd = 1.0f / std::sqrt(var + 1e-5f);
        // forward: n = (x − mean)·rstd, y = n·weight + bias
        float dn_mean = 0.0f, dn_n_mean = 0.0f;
        for (std::size_t c = 0; c < C; ++c) {
            const float n = (x(r, c) - mean) * rstd, dn = dout(r, c) * weight(c);
            g.dbias(c) += dout(r, c);
            g.dweight(c) += dout(r, c) * n;
            dn_mean += dn;
            dn_n_mean += dn * n;
        }
        dn_mean *= inv_C;
        dn_n_mean *= inv_C;
        for (std::size_t c = 0; c < C; ++c) {
            const float n = (x(r, c) - mean) * rstd, dn = dout(r, c) * weight(c);
            g.dx(r, c) = rstd * (dn - dn_mean);
        }
    }
    return g;
}

}  // namespace exercise
