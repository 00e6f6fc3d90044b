// Exercise 07: splitting into heads, merging them, and the multi-head forward pass.
//
// Write the three functions below, then run `./workbook check 07`. Stuck? `./workbook hint 07`.
// The contract (shapes, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"
#include "attn/linalg.hpp"
#include "attn/sdpa.hpp"

#include <xtensor/xview.hpp>

namespace exercise {

attn::Tensor4 split_heads(const attn::Tensor3& x, std::size_t n_head) {
    // TODO: throw std::invalid_argument unless n_head > 0 and C = x.shape()[2] is a multiple
    //       of n_head. Then copy channels [h·hs, (h+1)·hs) of every token into head h of a
    //       (B, NH, T, hs) tensor. (Not attn::split_heads: the checks compare with it.)
    (void)x, (void)n_head;
    throw attn::NotImplemented("split_heads in exercises/07_multi_head_attention/exercise.cpp: "
                               "(B, T, C) → (B, NH, T, hs), head h = channels [h·hs, (h+1)·hs)");
}

attn::Tensor3 merge_heads(const attn::Tensor4& y) {
    // TODO: the inverse of split_heads: head h's (T, hs) block goes back to channels
    //       [h·hs, (h+1)·hs) of a (B, T, NH·hs) tensor.
    (void)y;
    throw attn::NotImplemented("merge_heads in exercises/07_multi_head_attention/exercise.cpp: "
                               "(B, NH, T, hs) → (B, T, NH·hs)");
}

attn::Tensor3 multi_head_attention(const attn::Tensor3& x, const attn::Tensor2& c_attn,
                                   const attn::Tensor2& c_proj, std::size_t n_head) {
    // TODO: check the shapes: x (B, T, C), c_attn (3C, C), c_proj (C, C) (attn::expect_shape).
    // TODO: qkv = x·c_attnᵀ, (B, T, 3C): attn::matmul_transposed on each batch item's (T, C).
    // TODO: q, k, v = channels [0, C), [C, 2C), [2C, 3C) of qkv, each through your split_heads.
    // TODO: y = attn::scaled_dot_product_attention(q, k, v, attn::causal_mask(T)), (B, NH, T, hs).
    // TODO: return merge_heads(y)·c_projᵀ, (B, T, C).
    (void)x, (void)c_attn, (void)c_proj, (void)n_head;
    throw attn::NotImplemented("multi_head_attention in exercises/07_multi_head_attention/"
                               "exercise.cpp: fused projection, split, causal attention, merge, "
                               "output projection");
}

}  // namespace exercise
