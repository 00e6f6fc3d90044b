#include "attn/multi_head.hpp"

#include "attn/sdpa.hpp"

#include <xtensor/xview.hpp>

#include <string>

namespace attn {

namespace {
void require_heads_divide(std::size_t C, std::size_t NH) {
    require(NH > 0 && C % NH == 0, "multi-head attention: " + std::to_string(NH) +
                                       " heads do not divide C = " + std::to_string(C) +
                                       " channels (hs = C / NH must be a whole number)");
}
}  // namespace

Tensor4 split_heads(const Tensor3& x, std::size_t NH) {
    const std::size_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
    require_heads_divide(C, NH);
    const std::size_t hs = C / NH;
    Tensor4 y({B, NH, T, hs});
    for (std::size_t h = 0; h < NH; ++h) {
        xt::view(y, xt::all(), h) = xt::view(x, xt::all(), xt::all(), xt::range(h * hs, (h + 1) * hs));
    }
    return y;
}

Tensor3 merge_heads(const Tensor4& y) {
    const std::size_t B = y.shape()[0], NH = y.shape()[1], T = y.shape()[2], hs = y.shape()[3];
    Tensor3 x({B, T, NH * hs});
    for (std::size_t h = 0; h < NH; ++h) {
        xt::view(x, xt::all(), xt::all(), xt::range(h * hs, (h + 1) * hs)) = xt::view(y, xt::all(), h);
    }
    return x;
}

MultiHeadAttention::MultiHeadAttention(std::size_t C, std::size_t NH, bool bias, Rng& rng)
    : n_head(NH) {
    require_heads_divide(C, NH);
    c_attn = Linear(C, 3 * C, bias, rng);
    c_proj = Linear(C, C, bias, rng);
}

MultiHeadAttention::MultiHeadAttention(Linear attn_projection, Linear output_projection,
                                       std::size_t NH)
    : c_attn(std::move(attn_projection)), c_proj(std::move(output_projection)), n_head(NH) {
    const std::size_t C = c_proj.out_features();
    expect_shape("c_proj.weight", c_proj.weight, {C, C});
    expect_shape("c_attn.weight", c_attn.weight, {3 * C, C});
    require_heads_divide(C, NH);
}

Tensor3 MultiHeadAttention::forward(const Tensor3& x, Tensor4* weights) const {
    const std::size_t C = channels(), T = x.shape()[1];
    expect_shape("multi-head attention input x", x, {any, any, C});
    // One product makes q, k and v for every head: (B, T, 3C).
    Tensor3 qkv = c_attn.forward(x);
    // Queries are channels [0, C), keys [C, 2C), values [2C, 3C); each splits into heads.
    Tensor4 q = split_heads(xt::view(qkv, xt::all(), xt::all(), xt::range(0, C)), n_head);
    Tensor4 k = split_heads(xt::view(qkv, xt::all(), xt::all(), xt::range(C, 2 * C)), n_head);
    Tensor4 v = split_heads(xt::view(qkv, xt::all(), xt::all(), xt::range(2 * C, 3 * C)), n_head);
    // Every head attends on its own: the head axis is one more batch axis. (B, NH, T, hs)
    const std::optional<float> scale =
        scaled ? std::nullopt : std::optional<float>(1.0f);
    Tensor4 y = causal ? scaled_dot_product_attention(q, k, v, causal_mask(T), weights, scale)
                       : scaled_dot_product_attention(q, k, v, {}, weights, scale);
    // The heads side by side again, then the output projection: (B, T, C).
    return c_proj.forward(merge_heads(y));
}

}  // namespace attn
