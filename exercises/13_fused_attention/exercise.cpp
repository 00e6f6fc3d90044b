// Exercise 13: the online-softmax update.
//
// Write online_softmax_update below, then run `./workbook check 13`. Stuck? `./workbook hint 13`.
// The contract (the formulas, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

namespace exercise {

void online_softmax_update(RowState& state, const attn::Tensor1& scores,
                           const attn::Tensor2& values) {
    // TODO: check the shapes: values must be (scores.size(), state.acc.size()). Throw
    //       std::invalid_argument otherwise (attn::expect_shape does it with both shapes).

    // TODO: the new maximum m_new = max(state.max, largest score of the tile). If it is
    //       still −∞ (every key so far masked), return without changing anything.

    // TODO: rescale what you have: multiply state.sum and state.acc by e^(state.max − m_new).

    // TODO: add the tile: for each key j, p = e^(scores[j] − m_new); state.sum += p;
    //       state.acc += p · values row j. Then state.max = m_new.

    (void)state, (void)scores, (void)values;
    throw attn::NotImplemented("online_softmax_update in exercises/13_fused_attention/exercise.cpp: "
                               "rescale the running sum and output by e^(m − m_new), then add "
                               "the tile's e^(s − m_new) terms");
}

}  // namespace exercise
