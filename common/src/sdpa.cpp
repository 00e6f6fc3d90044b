#include "attn/sdpa.hpp"

#include "attn/attention.hpp"
#include "attn/linalg.hpp"

#include <cmath>
#include <limits>
#include <string>

namespace attn {

namespace {

std::string shapes_of(const std::vector<std::size_t>& q, const std::vector<std::size_t>& k,
                      const std::vector<std::size_t>& v) {
    return "q " + format_shape(q) + ", k " + format_shape(k) + ", v " + format_shape(v);
}

// Where the mask's element for weight (batch b, query i, key j) lives: the offset of the
// batch item plus i·row_stride + j·col_stride (strides are 0 along broadcast axes).
struct MaskLayout {
    std::vector<std::size_t> batch_offset;  // one per flattened batch item
    std::size_t row_stride = 0, col_stride = 0;
};

MaskLayout layout_of(const AttentionMask& mask, const std::vector<std::size_t>& weights_shape) {
    const std::vector<std::size_t>& ms = mask.shape();
    const std::size_t N = weights_shape.size(), M = ms.size();
    bool fits = M >= 2 && M <= N;
    for (std::size_t d = 0; fits && d < M; ++d) {
        const std::size_t want = weights_shape[N - M + d];
        fits = ms[d] == 1 || ms[d] == want;
    }
    require(fits, "scaled_dot_product_attention: the mask " + format_shape(ms) +
                      " does not broadcast to the attention weights " +
                      format_shape(weights_shape) + " (…, T_q, T_k)");
    // Strides of the mask in C order, aligned with the weights' axes; 0 where broadcast.
    std::vector<std::size_t> stride(N, 0);
    std::size_t s = 1;
    for (std::size_t d = M; d-- > 0;) {
        stride[N - M + d] = ms[d] == 1 ? 0 : s;
        s *= ms[d];
    }
    MaskLayout layout;
    layout.row_stride = stride[N - 2];
    layout.col_stride = stride[N - 1];
    std::size_t batches = 1;
    for (std::size_t d = 0; d + 2 < N; ++d) batches *= weights_shape[d];
    for (std::size_t b = 0; b < batches; ++b) {
        std::size_t rest = b, offset = 0;
        for (std::size_t d = N - 2; d-- > 0;) {
            offset += (rest % weights_shape[d]) * stride[d];
            rest /= weights_shape[d];
        }
        layout.batch_offset.push_back(offset);
    }
    return layout;
}

}  // namespace

template <std::size_t N>
Tensor<N> scaled_dot_product_attention(const Tensor<N>& q, const Tensor<N>& k, const Tensor<N>& v,
                                       const AttentionMask& mask,
                                       typename detail::non_deduced<Tensor<N>>::type* weights,
                                       std::optional<float> scale) {
    static_assert(N >= 2, "attention needs at least (T, d)");
    const std::vector<std::size_t> qs(q.shape().begin(), q.shape().end()),
        ks(k.shape().begin(), k.shape().end()), vs(v.shape().begin(), v.shape().end());
    const std::size_t Tq = qs[N - 2], dk = qs[N - 1], Tk = ks[N - 2], dv = vs[N - 1];
    for (std::size_t d = 0; d + 2 < N; ++d) {
        require(qs[d] == ks[d] && qs[d] == vs[d],
                "scaled_dot_product_attention: the batch axes differ: " + shapes_of(qs, ks, vs));
    }
    require(ks[N - 1] == dk, "scaled_dot_product_attention: q and k must share the last axis "
                             "d_k: " + shapes_of(qs, ks, vs));
    require(vs[N - 2] == Tk, "scaled_dot_product_attention: k and v must have the same number "
                             "of tokens T_k: " + shapes_of(qs, ks, vs));
    require(Tq > 0 && Tk > 0 && dk > 0, "scaled_dot_product_attention: no queries, no keys or empty vectors: " +
                                  shapes_of(qs, ks, vs));

    std::vector<std::size_t> ws = qs;  // (…, T_q, T_k)
    ws[N - 1] = Tk;
    const std::size_t B = q.size() / (Tq * dk);  // every leading axis, flattened

    // (…, T, d) in C order holds the same numbers as (B, T, d): one batched product does
    // every batch item at once.
    Tensor3 q3({B, Tq, dk}), k3({B, Tk, dk}), v3({B, Tk, dv});
    std::copy(q.begin(), q.end(), q3.begin());
    std::copy(k.begin(), k.end(), k3.begin());
    std::copy(v.begin(), v.end(), v3.begin());

    const float factor = scale.value_or(1.0f / std::sqrt(static_cast<float>(dk)));
    Tensor3 w = batched_matmul_transposed(q3, k3);  // (B, T_q, T_k) raw scores q·k
    w *= factor;
    if (!mask.empty()) {  // a hidden key's score becomes −∞, so its weight becomes exactly 0
        const MaskLayout layout = layout_of(mask, ws);
        for (std::size_t b = 0; b < B; ++b) {
            for (std::size_t i = 0; i < Tq; ++i) {
                float* row = &w(b, i, 0);
                const bool* allowed = mask.data() + layout.batch_offset[b] + i * layout.row_stride;
                for (std::size_t j = 0; j < Tk; ++j)
                    if (!allowed[j * layout.col_stride]) row[j] = minus_infinity;
            }
        }
    }
    // Lesson 04's softmax, with lesson 03's rule for a query that may attend to no key: its
    // weights are all zero, so its output is the zero vector (never NaN).
    w = softmax(w);
    Tensor3 out3 = batched_matmul(w, v3);  // (B, T_q, d_v)

    std::vector<std::size_t> os = qs;  // (…, T_q, d_v)
    os[N - 1] = dv;
    std::array<std::size_t, N> out_shape{}, w_shape{};
    std::copy(os.begin(), os.end(), out_shape.begin());
    std::copy(ws.begin(), ws.end(), w_shape.begin());
    Tensor<N> out(out_shape);
    std::copy(out3.begin(), out3.end(), out.begin());
    if (weights) {
        *weights = Tensor<N>(w_shape);
        std::copy(w.begin(), w.end(), weights->begin());
    }
    return out;
}

template Tensor<2> scaled_dot_product_attention<2>(const Tensor<2>&, const Tensor<2>&,
                                                   const Tensor<2>&, const AttentionMask&,
                                                   Tensor<2>*, std::optional<float>);
template Tensor<3> scaled_dot_product_attention<3>(const Tensor<3>&, const Tensor<3>&,
                                                   const Tensor<3>&, const AttentionMask&,
                                                   Tensor<3>*, std::optional<float>);
template Tensor<4> scaled_dot_product_attention<4>(const Tensor<4>&, const Tensor<4>&,
                                                   const Tensor<4>&, const AttentionMask&,
                                                   Tensor<4>*, std::optional<float>);
template Tensor<5> scaled_dot_product_attention<5>(const Tensor<5>&, const Tensor<5>&,
                                                   const Tensor<5>&, const AttentionMask&,
                                                   Tensor<5>*, std::optional<float>);

}  // namespace attn
