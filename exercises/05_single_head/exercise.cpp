// Exercise 05: the forward pass of one head, in evaluation mode.
//
// Write head_forward below, then run `./workbook check 05`. Stuck? `./workbook hint 05`.
// The contract (shapes, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/attention.hpp"
#include "attn/error.hpp"
#include "attn/linalg.hpp"
#include "attn/linear.hpp"

namespace exercise {

attn::Tensor3 head_forward(const attn::Tensor3& x, const attn::Tensor2& w_key,
                           const attn::Tensor2& w_query, const attn::Tensor2& w_value,
                           const attn::Mask<2>& tril) {
    // TODO: check the shapes: every weight (hs, C) with C from x and hs from w_key, and
    //       T = x.shape()[1] no longer than the block size. Throw std::invalid_argument
    //       (attn::expect_shape, attn::mask_for_length) on a mismatch.
    // TODO: project x to q, k, v (lesson 01; attn::Linear may help).
    // TODO: scaled scores (lesson 02), the mask sliced to (T, T) and filled in with -inf
    //       (lesson 03), the softmax over the last axis (lesson 04), then weights · v.
    //       The library functions of lessons 02-04 are yours to call; not attn::Head:
    //       that is what the checks compare your answer with.

    (void)x, (void)w_key, (void)w_query, (void)w_value, (void)tril;
    throw attn::NotImplemented("head_forward in exercises/05_single_head/exercise.cpp: "
                               "project x to q, k, v, then softmax(mask(q·kᵀ/√hs)) · v");
}

}  // namespace exercise
