// mistake: the causal mask is not applied
// Solution to exercise 05: the forward pass of one head, in evaluation mode.
#include "exercise.hpp"

#include "attn/attention.hpp"
#include "attn/linalg.hpp"
#include "attn/linear.hpp"

namespace exercise {

attn::Tensor3 head_forward(const attn::Tensor3& x, const attn::Tensor2& w_key,
                           const attn::Tensor2& w_query, const attn::Tensor2& w_value,
                           const attn::Mask<2>& tril) {
    const std::size_t T = x.shape()[1], C = x.shape()[2], hs = w_key.shape()[0];
    attn::expect_shape("w_key", w_key, {hs, C});
    attn::expect_shape("w_query", w_query, {hs, C});
    attn::expect_shape("w_value", w_value, {hs, C});
    const attn::Mask<2> mask = attn::mask_for_length(tril, T);  // (T, T), throws if T > block

    const attn::Tensor3 q = attn::Linear(w_query).forward(x);   // (B, T, hs)
    const attn::Tensor3 k = attn::Linear(w_key).forward(x);     // (B, T, hs)
    const attn::Tensor3 v = attn::Linear(w_value).forward(x);   // (B, T, hs)
    const attn::Tensor3 scores = attn::attention_scores(q, k);  // (B, T, T), q·kᵀ/√hs
    const attn::Tensor3 weights = attn::softmax(scores);
    return attn::batched_matmul(weights, v);                    // (B, T, hs)
}

}  // namespace exercise
