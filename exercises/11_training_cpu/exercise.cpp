// Exercise 11: the AdamW step.
//
// Write adamw_step below, then run `./workbook check 11`. Stuck? `./workbook hint 11`.
// The contract (formulas, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

#include <cmath>
#include <stdexcept>

namespace exercise {

void adamw_step(std::vector<float>& param, const std::vector<float>& grad, std::vector<float>& m,
                std::vector<float>& v, long step, const AdamWSettings& settings, bool decay) {
    // TODO: check the input. param, grad, m and v must have the same size; step must be at
    //       least 1; lr ≥ 0, 0 ≤ beta1 < 1, 0 ≤ beta2 < 1, eps > 0, weight_decay ≥ 0.
    //       Otherwise throw std::invalid_argument saying what is wrong.

    // TODO: the bias corrections 1 − β₁ᵗ and 1 − β₂ᵗ (std::pow; double is fine).

    // TODO: for every element i: decay θ (only if `decay`), update m[i] and v[i] from the
    //       gradient, then move θ by η · m̂ / (√v̂ + ε).

    (void)param, (void)grad, (void)m, (void)v, (void)step, (void)settings, (void)decay;
    throw attn::NotImplemented("adamw_step in exercises/11_training_cpu/exercise.cpp: check the "
                               "input, then decay, update m and v, correct their bias and step");
}

}  // namespace exercise
