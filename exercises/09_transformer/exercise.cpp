// Exercise 09: one transformer block's forward pass.
//
// Write block_forward below from the library's layer functions, then run
// `./workbook check 09`. Stuck? `./workbook hint 09`. The contract (shapes, what to throw)
// is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"
#include "attn/gpt_layers.hpp"

#include <vector>

namespace exercise {

attn::Tensor3 block_forward(const attn::Tensor3& x, const BlockWeights& w, int n_head) {
    // TODO: read B, T, C from x's shape; throw std::invalid_argument naming C and n_head
    //       unless n_head ≥ 1 divides C.

    // TODO: a std::vector<float> for every intermediate, sized from B·T and C: the LayerNorm
    //       output with its mean and rstd (B·T each), qkv (B, T, 3C), the heads' outputs,
    //       the attention weights (B, NH, T, T), the MLP's hidden layer (B, T, 4C), ...

    // TODO: the attention branch, x2 = x + c_proj(attention(c_attn(ln_1(x)))):
    //       layernorm_forward, matmul_forward, attention_forward, matmul_forward,
    //       residual_forward (attn/gpt_layers.hpp says each one's arguments and shapes).

    // TODO: the MLP branch, out = x2 + c_proj(gelu(c_fc(ln_2(x2)))):
    //       layernorm_forward, matmul_forward, gelu_forward, matmul_forward, residual_forward.

    (void)x, (void)w, (void)n_head;
    throw attn::NotImplemented("block_forward in exercises/09_transformer/exercise.cpp: "
                               "x + attn(ln_1(x)), then that + mlp(ln_2(that))");
}

}  // namespace exercise
