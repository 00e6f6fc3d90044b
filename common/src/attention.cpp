#include "attn/attention.hpp"

#include "attn/linalg.hpp"

#include <xtensor/xview.hpp>

#include <cmath>
#include <string>

namespace attn {

Tensor3 transpose_last_two(const Tensor3& x) { return xt::transpose(x, {0, 2, 1}); }

namespace {
// q (B, T_q, hs) and k (B, T_k, hs) must share B and hs.
void expect_query_key(const Tensor3& q, const Tensor3& k) {
    require(q.shape()[0] == k.shape()[0] && q.shape()[2] == k.shape()[2],
            "scores: q (B, T_q, hs) and k (B, T_k, hs) must share B and hs: q " + shape_of(q) +
                ", k " + shape_of(k));
}

// Softmax of `rows` contiguous rows of n logits each; `shape` only names the input in errors.
void softmax_rows(const float* in, float* out, std::size_t rows, std::size_t n,
                  const std::string& shape) {
    require(n > 0, "softmax: the last axis is empty, shape " + shape);
    for (std::size_t r = 0; r < rows; ++r, in += n, out += n) {
        float largest = minus_infinity;
        for (std::size_t j = 0; j < n; ++j) {
            const float x = in[j];
            if (std::isnan(x) || x == -minus_infinity) {
                throw std::invalid_argument("softmax: logits must be finite or -inf; row " +
                                            std::to_string(r) + ", entry " + std::to_string(j) +
                                            " is " + (std::isnan(x) ? "nan" : "+inf") +
                                            " (input shape " + shape + ")");
            }
            largest = std::max(largest, x);
        }
        if (largest == minus_infinity) {  // fully masked: attend to nothing (see the header)
            std::fill(out, out + n, 0.0f);
            continue;
        }
        float sum = 0.0f;
        for (std::size_t j = 0; j < n; ++j) sum += out[j] = std::exp(in[j] - largest);
        for (std::size_t j = 0; j < n; ++j) out[j] /= sum;  // sum ≥ 1: the largest gives e⁰
    }
}

template <std::size_t N>
Tensor<N> softmax_last_axis(const Tensor<N>& logits) {
    Tensor<N> out(logits.shape());
    const std::size_t n = logits.shape()[N - 1];
    softmax_rows(logits.data(), out.data(), n ? logits.size() / n : 0, n, shape_of(logits));
    return out;
}
}  // namespace

Tensor3 dot_product_scores(const Tensor3& q, const Tensor3& k) {
    expect_query_key(q, k);
    return batched_matmul_transposed(q, k);  // = batched_matmul(q, transpose_last_two(k))
}

Tensor3 attention_scores(const Tensor3& q, const Tensor3& k) {
    expect_query_key(q, k);
    const std::size_t hs = q.shape()[2];
    require(hs > 0, "attention_scores: the head size is 0, q " + shape_of(q));
    Tensor3 s = batched_matmul_transposed(q, k);
    s /= std::sqrt(static_cast<float>(hs));
    return s;
}

Mask<2> causal_mask(std::size_t block_size) {
    require(block_size > 0, "causal_mask: the block size must be positive");
    Mask<2> m({block_size, block_size});
    for (std::size_t i = 0; i < block_size; ++i)
        for (std::size_t j = 0; j < block_size; ++j) m(i, j) = j <= i;
    return m;
}

Mask<2> mask_for_length(const Mask<2>& mask, std::size_t T) {
    require(mask.shape()[0] == mask.shape()[1],
            "mask_for_length: the mask must be square, got " + shape_of(mask));
    require(T <= mask.shape()[0], "mask_for_length: a sequence of T = " + std::to_string(T) +
                                      " tokens is longer than the block size " +
                                      std::to_string(mask.shape()[0]) + " the mask was built for");
    return xt::view(mask, xt::range(0, T), xt::range(0, T));
}

Tensor3 masked_fill(const Tensor3& scores, const Mask<2>& mask, float value) {
    expect_shape("mask", mask, {scores.shape()[1], scores.shape()[2]});
    Tensor3 out = scores;
    for (std::size_t b = 0; b < out.shape()[0]; ++b)
        for (std::size_t i = 0; i < out.shape()[1]; ++i)
            for (std::size_t j = 0; j < out.shape()[2]; ++j)
                if (!mask(i, j)) out(b, i, j) = value;
    return out;
}

Tensor1 softmax(const Tensor1& logits) { return softmax_last_axis(logits); }
Tensor2 softmax(const Tensor2& logits) { return softmax_last_axis(logits); }
Tensor3 softmax(const Tensor3& logits) { return softmax_last_axis(logits); }

Tensor3 dropout(const Tensor3& x, float p, Rng& rng) {
    require(p >= 0.0f && p < 1.0f,
            "dropout: the probability must be in [0, 1), got " + std::to_string(p));
    if (p == 0.0f) return x;
    const float keep_scale = 1.0f / (1.0f - p);
    Tensor3 out(x.shape());
    for (std::size_t i = 0; i < x.size(); ++i)
        out.flat(i) = rng.uniform() < p ? 0.0f : x.flat(i) * keep_scale;
    return out;
}

Head::Head(std::size_t n_embd, std::size_t head_size, std::size_t block_size, float dropout,
           Rng& init_rng, std::uint64_t dropout_seed)
    : key(n_embd, head_size, false, init_rng),
      query(n_embd, head_size, false, init_rng),
      value(n_embd, head_size, false, init_rng),
      tril(causal_mask(block_size)),
      dropout_p(dropout),
      dropout_rng(dropout_seed) {
    require(dropout >= 0.0f && dropout < 1.0f,
            "Head: the dropout probability must be in [0, 1), got " + std::to_string(dropout));
}

Head::Head(Tensor2 w_key, Tensor2 w_query, Tensor2 w_value, std::size_t block_size,
           float dropout, std::uint64_t dropout_seed)
    : key(std::move(w_key)),
      query(std::move(w_query)),
      value(std::move(w_value)),
      tril(causal_mask(block_size)),
      dropout_p(dropout),
      dropout_rng(dropout_seed) {
    expect_shape("Head w_query", query.weight, {key.out_features(), key.in_features()});
    expect_shape("Head w_value", value.weight, {key.out_features(), key.in_features()});
    require(dropout >= 0.0f && dropout < 1.0f,
            "Head: the dropout probability must be in [0, 1), got " + std::to_string(dropout));
}

Tensor3 Head::attention_weights(const Tensor3& x) const {
    expect_shape("Head input x", x, {any, any, n_embd()});
    const Tensor3 q = query.forward(x);                          // (B, T, hs)
    const Tensor3 k = key.forward(x);                            // (B, T, hs)
    const Mask<2> mask = mask_for_length(tril, x.shape()[1]);    // (T, T)
    return softmax(masked_fill(attention_scores(q, k), mask));   // (B, T, T)
}

Tensor3 Head::forward(const Tensor3& x) {
    Tensor3 weights = attention_weights(x);                      // (B, T, T)
    if (training) weights = dropout(weights, dropout_p, dropout_rng);
    return batched_matmul(weights, value.forward(x));            // (B, T, hs)
}

}  // namespace attn
