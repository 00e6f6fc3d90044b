// Exercise 02: scaled attention scores.
//
// Write scaled_scores below, then run `./workbook check 02`. Stuck? `./workbook hint 02`.
// The contract (shapes, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"
#include "attn/linalg.hpp"

#include <cmath>

namespace exercise {

attn::Tensor3 scaled_scores(const attn::Tensor3& q, const attn::Tensor3& k) {
    // TODO: check the shapes. q is (B, T_q, hs); k must be (B, T_k, hs) with the same B and
    //       hs (T_k may differ). On a mismatch throw std::invalid_argument naming both shapes
    //       (attn::expect_shape(name, k, {B, attn::any, hs}) does this for you).

    // TODO: compute q · kᵀ for each batch item, transposing only the last two axes of k,
    //       then divide every score by √hs.
    //       (Not attn::attention_scores: that is what the checks compare your answer with.)

    (void)q, (void)k;
    throw attn::NotImplemented("scaled_scores in exercises/02_scores_and_scaling/exercise.cpp: "
                               "check the shapes, then compute q·kᵀ/√hs for each batch item");
}

}  // namespace exercise
