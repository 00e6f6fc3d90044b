/// @file sdpa.hpp
/// @brief Scaled dot-product attention over any number of leading batch axes, with an
/// optional boolean mask (true means "may attend"), and the causal mask.
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

}  // namespace attn
