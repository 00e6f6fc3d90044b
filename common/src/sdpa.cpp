#include "attn/sdpa.hpp"

#include "attn/attention.hpp"
#include "attn/linalg.hpp"

#include <algorithm>
#include <array>
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

const char* alignment_name(CausalAlignment alignment) {
    switch (alignment) {
        case CausalAlignment::top_left: return "top-left";
        case CausalAlignment::bottom_right: return "bottom-right";
        case CausalAlignment::unspecified: break;
    }
    return "unspecified";
}

long causal_last_key(std::size_t i, std::size_t T_q, std::size_t T_k, CausalAlignment alignment) {
    if (alignment == CausalAlignment::unspecified) {
        require(T_q == T_k, "causal mask with T_q = " + std::to_string(T_q) + " queries and T_k = " +
                                std::to_string(T_k) + " keys: say where the diagonal sits, "
                                "CausalAlignment::top_left (PyTorch's is_causal) or bottom_right "
                                "(FlashAttention >= 2.1, a chunk after a KV cache)");
        alignment = CausalAlignment::top_left;  // the two agree when T_q = T_k
    }
    const long last = alignment == CausalAlignment::top_left
                          ? static_cast<long>(i)
                          : static_cast<long>(i) + static_cast<long>(T_k) - static_cast<long>(T_q);
    return std::min(last, static_cast<long>(T_k) - 1);
}

Mask<2> causal_mask(std::size_t T_q, std::size_t T_k, CausalAlignment alignment) {
    require(T_q > 0 && T_k > 0, "causal_mask: T_q = " + std::to_string(T_q) + " and T_k = " +
                                    std::to_string(T_k) + " must both be at least 1");
    Mask<2> mask = xt::zeros<bool>({T_q, T_k});
    for (std::size_t i = 0; i < T_q; ++i) {
        const long last = causal_last_key(i, T_q, T_k, alignment);
        for (long j = 0; j <= last; ++j) mask(i, static_cast<std::size_t>(j)) = true;
    }
    return mask;
}

template <std::size_t N>
Mask<N> key_padding_mask(const std::vector<std::size_t>& lengths, std::size_t T_k) {
    static_assert(N >= 3, "a key padding mask has a batch axis and the key axis");
    require(!lengths.empty(), "key_padding_mask: no sequences (the batch is empty)");
    std::array<std::size_t, N> shape{};
    shape.fill(1);
    shape[0] = lengths.size();
    shape[N - 1] = T_k;
    Mask<N> mask(shape);
    for (std::size_t b = 0; b < lengths.size(); ++b) {
        require(lengths[b] <= T_k, "key_padding_mask: sequence " + std::to_string(b) + " has " +
                                       std::to_string(lengths[b]) + " tokens, more than the " +
                                       "padded length T_k = " + std::to_string(T_k));
        bool* row = mask.data() + b * T_k;  // the middle axes are all 1
        for (std::size_t j = 0; j < T_k; ++j) row[j] = j < lengths[b];
    }
    return mask;
}

template Mask<3> key_padding_mask<3>(const std::vector<std::size_t>&, std::size_t);
template Mask<4> key_padding_mask<4>(const std::vector<std::size_t>&, std::size_t);
template Mask<5> key_padding_mask<5>(const std::vector<std::size_t>&, std::size_t);

template <std::size_t N>
AttentionGradients<N> scaled_dot_product_attention_backward(const Tensor<N>& dout, const Tensor<N>& q,
                                                            const Tensor<N>& k, const Tensor<N>& v,
                                                            const Tensor<N>& weights,
                                                            std::optional<float> scale) {
    const std::vector<std::size_t> qs(q.shape().begin(), q.shape().end()),
        ks(k.shape().begin(), k.shape().end()), vs(v.shape().begin(), v.shape().end()),
        ws(weights.shape().begin(), weights.shape().end()),
        os(dout.shape().begin(), dout.shape().end());
    const std::size_t Tq = qs[N - 2], dk = qs[N - 1], Tk = ks[N - 2], dv = vs[N - 1];
    for (std::size_t d = 0; d + 2 < N; ++d) {
        require(qs[d] == ks[d] && qs[d] == vs[d] && qs[d] == ws[d] && qs[d] == os[d],
                "scaled_dot_product_attention_backward: the batch axes differ: " +
                    shapes_of(qs, ks, vs) + ", weights " + format_shape(ws) + ", dout " +
                    format_shape(os));
    }
    require(ks[N - 1] == dk && vs[N - 2] == Tk && ws[N - 2] == Tq && ws[N - 1] == Tk &&
                os[N - 2] == Tq && os[N - 1] == dv && Tq > 0 && Tk > 0 && dk > 0,
            "scaled_dot_product_attention_backward: the shapes do not fit together: " +
                shapes_of(qs, ks, vs) + ", weights " + format_shape(ws) + " (…, T_q, T_k), dout " +
                format_shape(os) + " (…, T_q, d_v)");
    const std::size_t B = q.size() / (Tq * dk);  // every leading axis, flattened
    const float factor = scale.value_or(1.0f / std::sqrt(static_cast<float>(dk)));

    Tensor3 q3({B, Tq, dk}), k3({B, Tk, dk}), v3({B, Tk, dv}), w3({B, Tq, Tk}), do3({B, Tq, dv});
    std::copy(q.begin(), q.end(), q3.begin());
    std::copy(k.begin(), k.end(), k3.begin());
    std::copy(v.begin(), v.end(), v3.begin());
    std::copy(weights.begin(), weights.end(), w3.begin());
    std::copy(dout.begin(), dout.end(), do3.begin());

    // forward: out = W · V
    Tensor3 dw = batched_matmul_transposed(do3, v3);  // dW (B, T_q, T_k) = dO · Vᵀ
    Tensor3 dv3 = xt::zeros<float>({B, Tk, dv});      // dV (B, T_k, d_v) = Wᵀ · dO
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < Tq; ++i)
            for (std::size_t j = 0; j < Tk; ++j) {
                const float wij = w3(b, i, j);
                if (wij == 0.0f) continue;  // a hidden key (or an underflowed weight)
                for (std::size_t c = 0; c < dv; ++c) dv3(b, j, c) += wij * do3(b, i, c);
            }
    // forward: W = softmax(S) row by row, S = scale · Q · Kᵀ (masked entries −∞)
    // dS[i, j] = W[i, j] · (dW[i, j] − Σ_k W[i, k] · dW[i, k]); W = 0 where masked, so dS = 0
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < Tq; ++i) {
            double dot = 0.0;
            for (std::size_t j = 0; j < Tk; ++j) dot += static_cast<double>(w3(b, i, j)) * dw(b, i, j);
            for (std::size_t j = 0; j < Tk; ++j)
                dw(b, i, j) = w3(b, i, j) * (dw(b, i, j) - static_cast<float>(dot));
        }
    // dQ (B, T_q, d_k) = scale · dS · K;  dK (B, T_k, d_k) = scale · dSᵀ · Q
    Tensor3 dq3 = batched_matmul(dw, k3);
    dq3 *= factor;
    Tensor3 dk3 = xt::zeros<float>({B, Tk, dk});
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < Tq; ++i)
            for (std::size_t j = 0; j < Tk; ++j) {
                const float ds = factor * dw(b, i, j);
                if (ds == 0.0f) continue;
                for (std::size_t c = 0; c < dk; ++c) dk3(b, j, c) += ds * q3(b, i, c);
            }

    AttentionGradients<N> g{Tensor<N>(q.shape()), Tensor<N>(k.shape()), Tensor<N>(v.shape())};
    std::copy(dq3.begin(), dq3.end(), g.dq.begin());
    std::copy(dk3.begin(), dk3.end(), g.dk.begin());
    std::copy(dv3.begin(), dv3.end(), g.dv.begin());
    return g;
}

template AttentionGradients<2> scaled_dot_product_attention_backward<2>(
    const Tensor<2>&, const Tensor<2>&, const Tensor<2>&, const Tensor<2>&, const Tensor<2>&,
    std::optional<float>);
template AttentionGradients<3> scaled_dot_product_attention_backward<3>(
    const Tensor<3>&, const Tensor<3>&, const Tensor<3>&, const Tensor<3>&, const Tensor<3>&,
    std::optional<float>);
template AttentionGradients<4> scaled_dot_product_attention_backward<4>(
    const Tensor<4>&, const Tensor<4>&, const Tensor<4>&, const Tensor<4>&, const Tensor<4>&,
    std::optional<float>);

}  // namespace attn
