// Exercise 06: scaled dot-product attention over any number of batch axes, with a mask.
//
// Write attention below, then run `./workbook check 06`. Stuck? `./workbook hint 06`.
// The contract (shapes, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"
#include "attn/linalg.hpp"

#include <xtensor/xview.hpp>

#include <cmath>

namespace exercise {

template <std::size_t N>
Attention<N> attention(const attn::Tensor<N>& q, const attn::Tensor<N>& k,
                       const attn::Tensor<N>& v, const attn::Mask<2>* mask) {
    // TODO: check the shapes. Axes 0..N-3 of q, k and v must be equal; q and k must have the
    //       same last axis d_k; k and v the same T_k (axis N-2); a mask, if given, must be
    //       (T_q, T_k). On a mismatch throw std::invalid_argument naming the shapes
    //       (attn::require and attn::shape_of help).

    // TODO: flatten the batch axes. In C order (…, T, d) holds the same numbers as
    //       (B, T, d) with B the product of the leading axes: copy q, k and v into
    //       attn::Tensor3 of that shape (std::copy over begin()/end()).

    // TODO: for every batch item b: scores = q_b · k_bᵀ / √d_k (attn::matmul_transposed);
    //       set the scores of hidden keys to −infinity; softmax each row (lesson 04's
    //       attn::softmax does it stably, and gives a row with no allowed key all-zero
    //       weights); out_b = weights_b · v_b (attn::matmul).
    //       Do not call attn::scaled_dot_product_attention: it is what the lesson built.

    // TODO: copy the results back into tensors of shape (…, T_q, d_v) and (…, T_q, T_k).

    (void)q, (void)k, (void)v, (void)mask;
    throw attn::NotImplemented("attention in exercises/06_general_attention/exercise.cpp: "
                               "check the shapes, then softmax(q·kᵀ/√d_k, masked)·v for "
                               "every batch index");
}

// The ranks the checks use. Leave these lines as they are.
template Attention<2> attention<2>(const attn::Tensor<2>&, const attn::Tensor<2>&,
                                   const attn::Tensor<2>&, const attn::Mask<2>*);
template Attention<3> attention<3>(const attn::Tensor<3>&, const attn::Tensor<3>&,
                                   const attn::Tensor<3>&, const attn::Mask<2>*);
template Attention<4> attention<4>(const attn::Tensor<4>&, const attn::Tensor<4>&,
                                   const attn::Tensor<4>&, const attn::Mask<2>*);
template Attention<5> attention<5>(const attn::Tensor<5>&, const attn::Tensor<5>&,
                                   const attn::Tensor<5>&, const attn::Mask<2>*);

}  // namespace exercise
