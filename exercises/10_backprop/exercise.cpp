// Exercise 10: backpropagation through attention and LayerNorm.
//
// Write the two backward passes below, then run `./workbook check 10`. Stuck?
// `./workbook hint 10`. The contract (shapes, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

namespace exercise {

AttentionGradients attention_backward(const attn::Tensor2& dout, const attn::Tensor2& q,
                                      const attn::Tensor2& k, const attn::Tensor2& v,
                                      const attn::Tensor2& w) {
    // TODO: check the shapes: q, k, v and dout are (T, hs) with the same T and hs, w is (T, T);
    //       throw std::invalid_argument otherwise (attn::expect_shape names both shapes).

    // TODO: out = w·v. Backward: dw = dout·vᵀ (T, T) and dv = wᵀ·dout (T, hs).

    // TODO: w = softmax(s) row by row. Backward, for each row i:
    //       ds[i][j] = w[i][j] · (dw[i][j] − Σ_j' w[i][j'] dw[i][j']).
    //       Masked entries have w = 0, so their ds is 0: the mask needs no code of its own.

    // TODO: s = q·kᵀ/√hs. Backward: dq = ds·k/√hs and dk = dsᵀ·q/√hs.

    (void)dout, (void)q, (void)k, (void)v, (void)w;
    throw attn::NotImplemented("attention_backward in exercises/10_backprop/exercise.cpp: "
                               "dv = wᵀ·dout, dw = dout·vᵀ, the softmax backward, then dq and dk");
}

LayerNormGradients layernorm_backward(const attn::Tensor2& dout, const attn::Tensor2& x,
                                      const attn::Tensor1& weight) {
    // TODO: check the shapes: dout has x's shape (N, C), weight is (C).

    // TODO: for each row, recompute mean, rstd and n = (x − mean)·rstd as the forward did.

    // TODO: dbias += dout, dweight += dout·n (summed over the rows), and with dn = dout·weight:
    //       dx = rstd · (dn − mean(dn) − n · mean(dn·n)).

    (void)dout, (void)x, (void)weight;
    throw attn::NotImplemented("layernorm_backward in exercises/10_backprop/exercise.cpp: "
                               "recompute n, then dbias, dweight and dx");
}

}  // namespace exercise
