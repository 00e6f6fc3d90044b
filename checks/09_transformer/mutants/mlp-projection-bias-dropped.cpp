// mistake: the MLP's output projection is called without its bias
// Solution to exercise 09: one transformer block's forward pass.
#include "exercise.hpp"

#include "attn/gpt_layers.hpp"

#include <stdexcept>
#include <string>
#include <vector>

namespace exercise {

attn::Tensor3 block_forward(const attn::Tensor3& x, const BlockWeights& w, int n_head) {
    const int B = static_cast<int>(x.shape()[0]), T = static_cast<int>(x.shape()[1]),
              C = static_cast<int>(x.shape()[2]);
    if (n_head < 1 || C % n_head != 0) {
        throw std::invalid_argument("block_forward: n_head = " + std::to_string(n_head) +
                                    " heads do not divide C = " + std::to_string(C) +
                                    " channels");
    }
    const int N = B * T;
    const std::size_t NC = static_cast<std::size_t>(N) * C;
    std::vector<float> ln(NC), mean(N), rstd(N), qkv(3 * NC), atty(NC),
        att(static_cast<std::size_t>(B) * n_head * T * T), proj(NC), fch(4 * NC),
        fch_gelu(4 * NC);
    attn::Tensor3 x2(x.shape()), out(x.shape());

    // x2 = x + c_proj(attention(c_attn(ln_1(x))))
    attn::layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), w.ln_1_weight,
                            w.ln_1_bias, B, T, C);
    attn::matmul_forward(qkv.data(), ln.data(), w.attn_c_attn_weight, w.attn_c_attn_bias, N, C,
                         3 * C);
    attn::attention_forward(atty.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, B, T, C,
                            n_head);
    attn::matmul_forward(proj.data(), atty.data(), w.attn_c_proj_weight, w.attn_c_proj_bias, N, C,
                         C);
    attn::residual_forward(x2.data(), x.data(), proj.data(), N * C);

    // out = x2 + c_proj(gelu(c_fc(ln_2(x2))))
    attn::layernorm_forward(ln.data(), mean.data(), rstd.data(), x2.data(), w.ln_2_weight,
                            w.ln_2_bias, B, T, C);
    attn::matmul_forward(fch.data(), ln.data(), w.mlp_c_fc_weight, w.mlp_c_fc_bias, N, C, 4 * C);
    attn::gelu_forward(fch_gelu.data(), fch.data(), 4 * N * C);
    attn::matmul_forward(proj.data(), fch_gelu.data(), w.mlp_c_proj_weight, nullptr, N,
                         4 * C, C);
    attn::residual_forward(out.data(), x2.data(), proj.data(), N * C);
    return out;
}

}  // namespace exercise
