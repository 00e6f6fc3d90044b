// Exercise 15: RoPE's rotation and its backward.
//
// Write rope_rotate and rope_rotate_backward below, then run `./workbook check 15`. Stuck?
// `./workbook hint 15`. The contract (formulas, shapes, what to throw) is in exercise.hpp
// beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

#include <cmath>
#include <stdexcept>

namespace exercise {

attn::Tensor2 rope_rotate(const attn::Tensor2& x, int pos0) {
    // TODO: check the input: the head size hs = x.shape()[1] must be even and pos0 >= 0;
    //       otherwise throw std::invalid_argument saying which.

    // TODO: for every row t and pair i: the position p = pos0 + t, the angle
    //       theta = p * 10000^(-2i/hs) (compute it in double), then rotate the pair
    //       (x(t, 2i), x(t, 2i+1)) by theta into the output. Read both old values before
    //       writing either new one.

    (void)x, (void)pos0;
    throw attn::NotImplemented("rope_rotate in exercises/15_positions/exercise.cpp: rotate each "
                               "pair (2i, 2i+1) of row t by (pos0 + t) * 10000^(-2i/hs)");
}

attn::Tensor2 rope_rotate_backward(const attn::Tensor2& dy, int pos0) {
    // TODO: the same checks as rope_rotate.

    // TODO: the same angles; rotate each pair of dy by -theta (the transpose of the
    //       rotation): the sine terms change sign, the cosine terms do not.

    (void)dy, (void)pos0;
    throw attn::NotImplemented("rope_rotate_backward in exercises/15_positions/exercise.cpp: "
                               "rotate each pair of dy by -theta, the transpose of rope_rotate");
}

}  // namespace exercise
