// mistake: merge_heads puts the heads back in reverse order
// Solution to exercise 07: splitting into heads, merging them, and the multi-head forward pass.
#include "exercise.hpp"

#include "attn/linalg.hpp"
#include "attn/sdpa.hpp"

#include <xtensor/xview.hpp>

#include <string>

namespace exercise {

namespace {
// (B, T, in) · (out, in)ᵀ → (B, T, out), one batch item at a time.
attn::Tensor3 project(const attn::Tensor3& x, const attn::Tensor2& w) {
    const std::size_t B = x.shape()[0], T = x.shape()[1];
    attn::Tensor3 out({B, T, w.shape()[0]});
    for (std::size_t b = 0; b < B; ++b) xt::view(out, b) = attn::matmul_transposed(xt::view(x, b), w);
    return out;
}

// Channels [from, to) of every token: (B, T, to − from).
attn::Tensor3 channels(const attn::Tensor3& x, std::size_t from, std::size_t to) {
    return xt::view(x, xt::all(), xt::all(), xt::range(from, to));
}
}  // namespace

attn::Tensor4 split_heads(const attn::Tensor3& x, std::size_t n_head) {
    const std::size_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2];
    attn::require(n_head > 0 && C % n_head == 0,
                  "split_heads: " + std::to_string(n_head) + " heads do not divide C = " +
                      std::to_string(C));
    const std::size_t hs = C / n_head;
    attn::Tensor4 out({B, n_head, T, hs});
    for (std::size_t h = 0; h < n_head; ++h) xt::view(out, xt::all(), h) = channels(x, h * hs, (h + 1) * hs);
    return out;
}

attn::Tensor3 merge_heads(const attn::Tensor4& y) {
    const std::size_t B = y.shape()[0], NH = y.shape()[1], T = y.shape()[2], hs = y.shape()[3];
    attn::Tensor3 out({B, T, NH * hs});
    for (std::size_t h = 0; h < NH; ++h)
        xt::view(out, xt::all(), xt::all(), xt::range((NH - 1 - h) * hs, (NH - h) * hs)) = xt::view(y, xt::all(), h);
    return out;
}

attn::Tensor3 multi_head_attention(const attn::Tensor3& x, const attn::Tensor2& c_attn,
                                   const attn::Tensor2& c_proj, std::size_t n_head) {
    const std::size_t T = x.shape()[1], C = x.shape()[2];
    attn::expect_shape("c_attn", c_attn, {3 * C, C});
    attn::expect_shape("c_proj", c_proj, {C, C});
    const attn::Tensor3 qkv = project(x, c_attn);                   // (B, T, 3C)
    const attn::Tensor4 q = split_heads(channels(qkv, 0, C), n_head);  // (B, NH, T, hs)
    const attn::Tensor4 k = split_heads(channels(qkv, C, 2 * C), n_head);
    const attn::Tensor4 v = split_heads(channels(qkv, 2 * C, 3 * C), n_head);
    const attn::Tensor4 y = attn::scaled_dot_product_attention(q, k, v, attn::causal_mask(T));
    return project(merge_heads(y), c_proj);                         // (B, T, C)
}

}  // namespace exercise
