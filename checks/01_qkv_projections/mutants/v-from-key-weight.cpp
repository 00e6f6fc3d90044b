// mistake: the value projection uses the key weight
// Solution to exercise 01: the query, key and value projections.
#include "exercise.hpp"

#include "attn/linalg.hpp"

#include <xtensor/xview.hpp>

namespace exercise {

namespace {
// (B, T, C) · (out, C)ᵀ → (B, T, out): each batch item's (T, C) slice times Wᵀ.
attn::Tensor3 project(const attn::Tensor3& x, const attn::Tensor2& w) {
    const std::size_t B = x.shape()[0], T = x.shape()[1];
    attn::Tensor3 out({B, T, w.shape()[0]});
    for (std::size_t b = 0; b < B; ++b) {
        xt::view(out, b) = attn::matmul_transposed(xt::view(x, b), w);
    }
    return out;
}
}  // namespace

QKV project_qkv(const attn::Tensor3& x, const attn::Tensor2& w_query, const attn::Tensor2& w_key,
                const attn::Tensor2& w_value) {
    const std::size_t C = x.shape()[2];
    attn::expect_shape("w_query", w_query, {attn::any, C});
    attn::expect_shape("w_key", w_key, {w_query.shape()[0], C});
    attn::expect_shape("w_value", w_value, {attn::any, C});
    return {project(x, w_query), project(x, w_key), project(x, w_key)};
}

}  // namespace exercise
