// Exercise 03: the causal mask and the masked fill.
//
// Write causal_mask and masked_fill below, then run `./workbook check 03`.
// Stuck? `./workbook hint 03`. The contract is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

#include <limits>

namespace exercise {

attn::Mask<2> causal_mask(std::size_t block_size) {
    // TODO: reject block_size == 0 with std::invalid_argument.
    // TODO: make a (block_size, block_size) boolean tensor that is true where j <= i
    //       (on and below the diagonal) and false above it.
    //       (Not attn::causal_mask: that is what the checks compare your answer with.)

    (void)block_size;
    throw attn::NotImplemented("causal_mask in exercises/03_causal_mask/exercise.cpp: "
                               "true on and below the diagonal, false above");
}

attn::Tensor3 masked_fill(const attn::Tensor3& scores, const attn::Mask<2>& mask) {
    // TODO: check that mask is (T_q, T_k) for scores of shape (B, T_q, T_k); on a mismatch
    //       throw std::invalid_argument naming both shapes (attn::expect_shape does this).
    // TODO: copy scores and write -infinity (std::numeric_limits<float>::infinity(), negated)
    //       wherever mask(i, j) is false, in every batch item.

    (void)scores, (void)mask;
    throw attn::NotImplemented("masked_fill in exercises/03_causal_mask/exercise.cpp: "
                               "check the mask's shape, then set the masked scores to -inf");
}

}  // namespace exercise
