// Exercise 01: the query, key and value projections.
//
// Write project_qkv below, then run `./workbook check 01`. Stuck? `./workbook hint 01`.
// The contract (shapes, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"
#include "attn/linalg.hpp"

namespace exercise {

QKV project_qkv(const attn::Tensor3& x, const attn::Tensor2& w_query, const attn::Tensor2& w_key,
                const attn::Tensor2& w_value) {
    // TODO: check the shapes. x is (B, T, C); each weight is (out, C) with the same C as x;
    //       the query and key weights must have the same shape. On a mismatch throw
    //       std::invalid_argument naming both shapes (attn::expect_shape does this for you).

    // TODO: project every token: q[b][t] = W_q · x[b][t], and the same for k and v.
    //       Loops work; so does attn::matmul_transposed on each (T, C) slice xt::view(x, b).
    //       (Not attn::Linear: that is what the checks compare your answer with.)

    (void)x, (void)w_query, (void)w_key, (void)w_value;
    throw attn::NotImplemented("project_qkv in exercises/01_qkv_projections/exercise.cpp: "
                               "check the shapes, then compute q = x·W_qᵀ, k = x·W_kᵀ, v = x·W_vᵀ");
}

}  // namespace exercise
