// mistake: hidden scores are set to 0 instead of -inf
// Solution to exercise 06: scaled dot-product attention over any batch axes, with a mask.
#include "exercise.hpp"

#include "attn/attention.hpp"

#include "attn/linalg.hpp"

#include <xtensor/xview.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace exercise {

namespace {
// A copy of t with its last axis resized to `last`, e.g. (…, T_q, d_k) → (…, T_q, d_v).
template <std::size_t N>
attn::Tensor<N> with_last_axis(const attn::Tensor<N>& t, std::size_t last) {
    std::array<std::size_t, N> shape{};
    std::copy(t.shape().begin(), t.shape().end(), shape.begin());
    shape[N - 1] = last;
    return attn::Tensor<N>(shape);
}
}  // namespace

template <std::size_t N>
Attention<N> attention(const attn::Tensor<N>& q, const attn::Tensor<N>& k,
                       const attn::Tensor<N>& v, const attn::Mask<2>* mask) {
    const std::string shapes =
        "q " + attn::shape_of(q) + ", k " + attn::shape_of(k) + ", v " + attn::shape_of(v);
    const std::size_t Tq = q.shape()[N - 2], dk = q.shape()[N - 1], Tk = k.shape()[N - 2],
                      dv = v.shape()[N - 1];
    for (std::size_t d = 0; d + 2 < N; ++d) {
        attn::require(q.shape()[d] == k.shape()[d] && q.shape()[d] == v.shape()[d],
                      "attention: the batch axes differ: " + shapes);
    }
    attn::require(k.shape()[N - 1] == dk, "attention: q and k need the same d_k: " + shapes);
    attn::require(v.shape()[N - 2] == Tk, "attention: k and v need the same T_k: " + shapes);
    if (mask) attn::expect_shape("mask", *mask, {Tq, Tk});

    // Every leading axis flattened into one batch axis of B items.
    const std::size_t B = q.size() / (Tq * dk);
    attn::Tensor3 q3({B, Tq, dk}), k3({B, Tk, dk}), v3({B, Tk, dv});
    std::copy(q.begin(), q.end(), q3.begin());
    std::copy(k.begin(), k.end(), k3.begin());
    std::copy(v.begin(), v.end(), v3.begin());

    attn::Tensor3 out3({B, Tq, dv}), w3({B, Tq, Tk});
    const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
    for (std::size_t b = 0; b < B; ++b) {
        attn::Tensor2 s = attn::matmul_transposed(xt::view(q3, b), xt::view(k3, b));  // (T_q, T_k)
        s *= scale;
        if (mask) s = xt::where(*mask, s, 0.0f);
        const attn::Tensor2 w = attn::softmax(s);  // lesson 04: stable; empty rows give 0
        xt::view(w3, b) = w;
        xt::view(out3, b) = attn::matmul(w, xt::view(v3, b));  // (T_q, d_v)
    }

    Attention<N> result{with_last_axis(q, dv), with_last_axis(q, Tk)};
    std::copy(out3.begin(), out3.end(), result.out.begin());
    std::copy(w3.begin(), w3.end(), result.weights.begin());
    return result;
}

template Attention<2> attention<2>(const attn::Tensor<2>&, const attn::Tensor<2>&,
                                   const attn::Tensor<2>&, const attn::Mask<2>*);
template Attention<3> attention<3>(const attn::Tensor<3>&, const attn::Tensor<3>&,
                                   const attn::Tensor<3>&, const attn::Mask<2>*);
template Attention<4> attention<4>(const attn::Tensor<4>&, const attn::Tensor<4>&,
                                   const attn::Tensor<4>&, const attn::Mask<2>*);
template Attention<5> attention<5>(const attn::Tensor<5>&, const attn::Tensor<5>&,
                                   const attn::Tensor<5>&, const attn::Mask<2>*);

}  // namespace exercise
