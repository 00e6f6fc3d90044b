// Exercise 04: the stable softmax over the last axis.
//
// Write softmax_last_axis below, then run `./workbook check 04`. Stuck? `./workbook hint 04`.
// The contract (the fully masked row, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

#include <cmath>

namespace exercise {

attn::Tensor3 softmax_last_axis(const attn::Tensor3& logits) {
    // TODO: reject an empty last axis (T_k == 0) with std::invalid_argument.
    // TODO: for every row (b, i): find the largest logit m, rejecting NaN and +inf with
    //       std::invalid_argument on the way. If m is -inf the row is fully masked: write zeros.
    // TODO: otherwise write e^(z - m) for each entry and divide the row by its sum.
    //       (Not attn::softmax: that is what the checks compare your answer with.)

    (void)logits;
    throw attn::NotImplemented("softmax_last_axis in exercises/04_softmax_and_values/exercise.cpp: "
                               "subtract each row's maximum, exponentiate, divide by the sum");
}

}  // namespace exercise
