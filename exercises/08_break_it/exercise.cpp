// Exercise 08: the attention-entropy measure.
//
// Write the two functions below, then run `./workbook check 08`. Stuck? `./workbook hint 08`.
// The contract (shapes, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

#include <cmath>

namespace exercise {

attn::Tensor3 attention_entropy(const attn::Tensor4& weights) {
    // TODO: for every row p of weights (the last axis): throw std::invalid_argument if an
    //       entry is negative or the row does not sum to 1 within 1e-3; otherwise
    //       H = −Σ p_j ln p_j over the entries with p_j > 0 (ln 0 is −∞, and 0 · −∞ is NaN,
    //       so skip the zeros: their limit p ln p → 0 is what the formula means).
    //       The result has one number per row: shape (B, NH, T_q).
    (void)weights;
    throw attn::NotImplemented("attention_entropy in exercises/08_break_it/exercise.cpp: "
                               "H = -sum p ln p over each row, with 0 ln 0 = 0");
}

attn::Tensor1 mean_entropy_per_head(const attn::Tensor4& weights) {
    // TODO: attention_entropy(weights), then for each head h the mean over the batch items
    //       and the query positions: shape (NH).
    (void)weights;
    throw attn::NotImplemented("mean_entropy_per_head in exercises/08_break_it/exercise.cpp: "
                               "the mean of attention_entropy over batch and positions, per head");
}

}  // namespace exercise
