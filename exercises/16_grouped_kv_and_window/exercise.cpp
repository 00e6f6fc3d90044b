// Exercise 16: grouped-query attention's head mapping and its backward.
//
// Write kv_head, expand_kv and expand_kv_backward below, then run `./workbook check 16`.
// Stuck? `./workbook hint 16`. The contract (formulas, shapes, what to throw) is in
// exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

#include <stdexcept>

namespace exercise {

int kv_head(int h, int n_head, int n_kv_head) {
    // TODO: check the input: n_head >= 1, n_kv_head >= 1, n_head % n_kv_head == 0 and
    //       0 <= h < n_head; otherwise throw std::invalid_argument saying which.

    // TODO: the group size is n_head / n_kv_head; head h is in group h / (group size).

    (void)h, (void)n_head, (void)n_kv_head;
    throw attn::NotImplemented("kv_head in exercises/16_grouped_kv_and_window/exercise.cpp: "
                               "query head h reads key/value head h / (n_head / n_kv_head)");
}

attn::Tensor3 expand_kv(const attn::Tensor3& kv, int n_head) {
    // TODO: G = kv.shape()[0]; the output is (n_head, T, hs); head h of the output is a copy
    //       of kv head kv_head(h, n_head, G).

    (void)kv, (void)n_head;
    throw attn::NotImplemented("expand_kv in exercises/16_grouped_kv_and_window/exercise.cpp: "
                               "copy kv head kv_head(h) to query head h");
}

attn::Tensor3 expand_kv_backward(const attn::Tensor3& dexpanded, int n_kv_head) {
    // TODO: NH = dexpanded.shape()[0]; start from zeros (n_kv_head, T, hs) and ADD every
    //       query head's gradient into the key/value head it read.

    (void)dexpanded, (void)n_kv_head;
    throw attn::NotImplemented("expand_kv_backward in exercises/16_grouped_kv_and_window/"
                               "exercise.cpp: sum the gradients of each group's query heads");
}

}  // namespace exercise
