// Exercise 14: appending to the cache and attending over it.
//
// Write append_and_attend below, then run `./workbook check 14`. Stuck? `./workbook hint 14`.
// The contract (formulas, shapes, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

#include <cmath>
#include <stdexcept>

namespace exercise {

attn::Tensor1 append_and_attend(attn::Tensor2& key_cache, attn::Tensor2& value_cache, int pos,
                                const attn::Tensor1& q, const attn::Tensor1& k,
                                const attn::Tensor1& v) {
    // TODO: check the input before writing anything. Both caches have the same number of
    //       rows (capacity); q and k have hs = key_cache.shape()[1] elements, v has
    //       hs_v = value_cache.shape()[1]; 0 <= pos < capacity. Otherwise throw
    //       std::invalid_argument saying which shape or position is wrong.

    // TODO: append: copy k into row pos of key_cache and v into row pos of value_cache.

    // TODO: attend: the scores s_j = q · key_cache[j] / sqrt(hs) for j = 0..pos only (rows
    //       after pos are future tokens), a softmax that subtracts the largest score, and
    //       out = sum over j of w_j * value_cache[j], a vector of hs_v numbers.

    (void)key_cache, (void)value_cache, (void)pos, (void)q, (void)k, (void)v;
    throw attn::NotImplemented("append_and_attend in exercises/14_kv_cache/exercise.cpp: check "
                               "the shapes and pos, write k and v into row pos of the caches, "
                               "then softmax(q·K[0..pos]ᵀ/√hs) · V[0..pos]");
}

}  // namespace exercise
