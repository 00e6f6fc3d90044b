// Exercise 19: merging two partial attentions by their log-sum-exps.
//
// Write merge_partial below, then run `./workbook check 19`. Stuck? `./workbook hint 19`.
// The contract (the formulas, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

namespace exercise {

PartialAttention merge_partial(const PartialAttention& a, const PartialAttention& b) {
    // TODO: check the shapes: a.lse must be (rows) for a.out (rows, hs); b.out must be
    //       (rows, hs) and b.lse (rows). Throw std::invalid_argument otherwise
    //       (attn::expect_shape does it with both shapes).

    // TODO: for each row i: m = max(a.lse(i), b.lse(i)). If m is −∞ neither side saw a key:
    //       the row's out stays 0 and its lse −∞.

    // TODO: otherwise the two sides' sums relative to m, e^(a.lse(i) − m) and
    //       e^(b.lse(i) − m); the merged lse is m + ln of their sum, and the merged out is
    //       each side's out weighted by its sum over the total.

    (void)a, (void)b;
    throw attn::NotImplemented("merge_partial in exercises/19_across_machines/exercise.cpp: "
                               "lse = m + ln(e^(lse_a − m) + e^(lse_b − m)), each side's out "
                               "weighted by e^(its lse − lse)");
}

}  // namespace exercise
