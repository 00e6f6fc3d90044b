/// @file sdpa.hpp
/// @brief Scaled dot-product attention over any number of leading batch axes, with an
/// optional boolean mask (true means "may attend"), its backward pass, key padding masks,
/// and the causal mask between T_q queries and T_k keys with its alignment stated.
#pragma once

#include "attn/tensor.hpp"

#include <cstddef>
#include <optional>
#include <vector>

#include "attn/attention.hpp"  // causal_mask, softmax

namespace attn {

/// @cond INTERNAL
namespace detail {
// T in a context where template arguments are not deduced: the rank N of
// scaled_dot_product_attention comes from q, k and v alone, so `nullptr` can be passed for
// the weights (which cannot deduce N) when only a scale is given.
template <class T>
struct non_deduced {
    using type = T;
};
}  // namespace detail
/// @endcond

/// A read-only view of a boolean mask of any rank, as scaled_dot_product_attention() takes
/// it. True means "may attend".
///
/// The mask is broadcast against the attention weights (…, T_q, T_k) the NumPy way: its
/// axes line up from the right, and each of its axes is either 1 or the size of the
/// matching axis. A (T_q, T_k) mask applies to every batch item; a (B, 1, 1, T_k) mask
/// hides the same keys from every query of batch item b.
///
/// The view does not own the mask: the mask must outlive the call it is passed to (a
/// temporary mask passed straight into the call does).
class AttentionMask {
public:
    /// No mask: every query may attend to every key.
    AttentionMask() = default;

    /// Views `mask`. Implicit, so a `Mask<M>` can be passed where an AttentionMask is taken.
    /// @param mask (…, T_q or 1, T_k or 1) true where the query may attend to the key
    template <std::size_t M>
    AttentionMask(const Mask<M>& mask)  // NOLINT(google-explicit-constructor)
        : shape_(mask.shape().begin(), mask.shape().end()), data_(mask.data()) {}

    /// Whether this is "no mask".
    bool empty() const { return data_ == nullptr; }
    /// The mask's shape; empty for "no mask".
    const std::vector<std::size_t>& shape() const { return shape_; }
    /// The mask's values in C order; null for "no mask".
    const bool* data() const { return data_; }

private:
    std::vector<std::size_t> shape_;
    const bool* data_ = nullptr;
};

/// Scaled dot-product attention: softmax(q·kᵀ · scale, masked) · v over the last two axes,
/// for every index of the leading (batch) axes.
///
/// \f[ \mathrm{out} = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V \f]
///
/// The softmax subtracts each row's maximum before exponentiating, so large scores never
/// overflow. Keys the mask hides get a weight of exactly 0, and the weights over the
/// allowed keys sum to 1. The leading axes of q, k and v must be equal (they are not
/// broadcast against each other); N = 2 means no batch axis at all.
///
/// @tparam N        the rank, 2 to 5 (explicitly instantiated in sdpa.cpp)
/// @param q         (…, T_q, d_k) queries
/// @param k         (…, T_k, d_k) keys
/// @param v         (…, T_k, d_v) values
/// @param mask      broadcastable to (…, T_q, T_k); true means "may attend"; default: none
/// @param weights   if not null, receives the attention weights (…, T_q, T_k); pass
///                  `nullptr` to give a scale without asking for the weights
/// @param scale     the factor on the scores; default 1/√d_k (lesson 08 passes 1 to
///                  remove the scaling), e.g. `scaled_dot_product_attention(q, k, v, mask,
///                  nullptr, 1.0f)` or `(q, k, v, {}, nullptr, 1.0f)` without a mask
/// @return (…, T_q, d_v)
/// A query that the mask lets attend to no key at all gets all-zero weights and a zero
/// output, as attn::softmax gives a fully masked row (lesson 03), never NaN.
/// @throws std::invalid_argument naming the shapes when they do not fit together or when
///         the mask does not broadcast
template <std::size_t N>
Tensor<N> scaled_dot_product_attention(const Tensor<N>& q, const Tensor<N>& k, const Tensor<N>& v,
                                       const AttentionMask& mask = {},
                                       typename detail::non_deduced<Tensor<N>>::type* weights = nullptr,
                                       std::optional<float> scale = std::nullopt);

/// @cond INTERNAL
extern template Tensor<2> scaled_dot_product_attention<2>(const Tensor<2>&, const Tensor<2>&,
                                                          const Tensor<2>&, const AttentionMask&,
                                                          Tensor<2>*, std::optional<float>);
extern template Tensor<3> scaled_dot_product_attention<3>(const Tensor<3>&, const Tensor<3>&,
                                                          const Tensor<3>&, const AttentionMask&,
                                                          Tensor<3>*, std::optional<float>);
extern template Tensor<4> scaled_dot_product_attention<4>(const Tensor<4>&, const Tensor<4>&,
                                                          const Tensor<4>&, const AttentionMask&,
                                                          Tensor<4>*, std::optional<float>);
extern template Tensor<5> scaled_dot_product_attention<5>(const Tensor<5>&, const Tensor<5>&,
                                                          const Tensor<5>&, const AttentionMask&,
                                                          Tensor<5>*, std::optional<float>);
/// @endcond

/// Where the causal mask's diagonal sits when there are T_q queries and T_k keys. With
/// T_q = T_k both are the usual lower triangle; otherwise they differ, and no library
/// agrees on a default: PyTorch's `is_causal` and `torch.tril(torch.ones(T_q, T_k))` are
/// top-left, FlashAttention (from 2.1) is bottom-right. So the course's functions take
/// it as a parameter and refuse to guess.
///
/// ```
///   T_q = 3, T_k = 5      top-left        bottom-right
///                         x . . . .       x x x . .
///                         x x . . .       x x x x .
///                         x x x . .       x x x x x
/// ```
enum class CausalAlignment {
    unspecified,  ///< only for T_q = T_k; with T_q ≠ T_k a call is refused as ambiguous
    top_left,     ///< query i sees keys 0 … i: the queries are the first T_q positions
    bottom_right, ///< query i sees keys 0 … i + T_k − T_q: the queries are the last T_q
                  ///< positions, as a chunk of new tokens after a KV cache of T_k − T_q
};

/// The alignment's name as the course prints it: "top-left", "bottom-right" or "unspecified".
/// @param alignment the alignment @return its name
const char* alignment_name(CausalAlignment alignment);

/// The last key that query i may see under the causal mask: i (top-left) or
/// i + T_k − T_q (bottom-right), at most T_k − 1. A result below 0 (bottom-right with
/// T_q > T_k, for the first T_q − T_k queries) means the query sees no key at all.
/// @param i the query, 0 ≤ i < T_q  @param T_q queries  @param T_k keys
/// @param alignment required when T_q ≠ T_k
/// @return the last visible key, at most T_k − 1; negative when the query sees none
/// @throws std::invalid_argument for CausalAlignment::unspecified with T_q ≠ T_k, naming
///         both sizes and the two alignments
long causal_last_key(std::size_t i, std::size_t T_q, std::size_t T_k, CausalAlignment alignment);

/// The causal mask between T_q queries and T_k keys: true where query i may see key j,
/// j ≤ causal_last_key(i, T_q, T_k, alignment).
/// @param T_q queries, at least 1  @param T_k keys, at least 1
/// @param alignment top-left or bottom-right; may be left out only when T_q = T_k
/// @return (T_q, T_k)
/// @throws std::invalid_argument for an ambiguous call (T_q ≠ T_k, no alignment) or a size 0
Mask<2> causal_mask(std::size_t T_q, std::size_t T_k,
                    CausalAlignment alignment = CausalAlignment::unspecified);

/// A key padding mask for a batch of sequences of different lengths, right-padded to T_k:
/// true where key j is a real token of sequence b (j < lengths[b]), false on its padding.
/// Its shape, (B, 1, …, 1, T_k), broadcasts against attention weights of rank N, (B, T_q,
/// T_k) for N = 3 or (B, NH, T_q, T_k) for N = 4, so that it hides the same keys from every
/// query (and head) of sequence b. It masks the key axis only: the queries at padded
/// positions still get outputs, which must not reach the loss.
///
/// PyTorch's `key_padding_mask` (nn.MultiheadAttention, nn.Transformer) has the opposite
/// convention, true on the padding: this mask is its logical not.
/// @tparam N the rank of the attention weights it will be broadcast against, 3 to 5
/// @param lengths (B) each sequence's real length, 0 ≤ lengths[b] ≤ T_k (0: the whole
///        context is padding, and every query of that sequence gets a zero output)
/// @param T_k the padded length
/// @return (B, 1, …, 1, T_k) of rank N
/// @throws std::invalid_argument for an empty batch or a length above T_k
template <std::size_t N>
Mask<N> key_padding_mask(const std::vector<std::size_t>& lengths, std::size_t T_k);

/// @cond INTERNAL
extern template Mask<3> key_padding_mask<3>(const std::vector<std::size_t>&, std::size_t);
extern template Mask<4> key_padding_mask<4>(const std::vector<std::size_t>&, std::size_t);
extern template Mask<5> key_padding_mask<5>(const std::vector<std::size_t>&, std::size_t);
/// @endcond

/// The gradients of scaled_dot_product_attention() with respect to its three inputs.
template <std::size_t N>
struct AttentionGradients {
    Tensor<N> dq;  ///< (…, T_q, d_k)
    Tensor<N> dk;  ///< (…, T_k, d_k)
    Tensor<N> dv;  ///< (…, T_k, d_v)
};

/// The backward pass of scaled_dot_product_attention(), from the weights its forward pass
/// returned. With W the weights and dO the gradient of the output:
///
/// \f[ dV = W^\top dO,\quad dW = dO\,V^\top,\quad
///     dS_{ij} = W_{ij}\,(dW_{ij} - \textstyle\sum_k W_{ik}\, dW_{ik}),\quad
///     dQ = s\, dS\, K,\quad dK = s\, dS^\top Q \f]
///
/// where s is the scale. A hidden key has W = 0, so dS = 0 there: no gradient reaches a
/// masked score, and a fully masked row (all-zero weights) sends none at all.
/// @param dout    (…, T_q, d_v) the gradient of the loss with respect to the output
/// @param q       (…, T_q, d_k) as given to the forward pass
/// @param k       (…, T_k, d_k) as given to the forward pass
/// @param v       (…, T_k, d_v) as given to the forward pass
/// @param weights (…, T_q, T_k) the weights the forward pass returned
/// @param scale   the scale the forward pass used; default 1/√d_k
/// @return dq, dk, dv, shaped as q, k and v
/// @throws std::invalid_argument naming the shapes when they do not fit together
template <std::size_t N>
AttentionGradients<N> scaled_dot_product_attention_backward(
    const Tensor<N>& dout, const Tensor<N>& q, const Tensor<N>& k, const Tensor<N>& v,
    const Tensor<N>& weights, std::optional<float> scale = std::nullopt);

/// @cond INTERNAL
extern template AttentionGradients<2> scaled_dot_product_attention_backward<2>(
    const Tensor<2>&, const Tensor<2>&, const Tensor<2>&, const Tensor<2>&, const Tensor<2>&,
    std::optional<float>);
extern template AttentionGradients<3> scaled_dot_product_attention_backward<3>(
    const Tensor<3>&, const Tensor<3>&, const Tensor<3>&, const Tensor<3>&, const Tensor<3>&,
    std::optional<float>);
extern template AttentionGradients<4> scaled_dot_product_attention_backward<4>(
    const Tensor<4>&, const Tensor<4>&, const Tensor<4>&, const Tensor<4>&, const Tensor<4>&,
    std::optional<float>);
/// @endcond

}  // namespace attn
