// mistake: 0·ln 0 is computed (NaN) instead of taken as 0
// Solution to exercise 08: the attention-entropy measure.
#include "exercise.hpp"

#include <xtensor/xview.hpp>

#include <cmath>
#include <string>

namespace exercise {

attn::Tensor3 attention_entropy(const attn::Tensor4& weights) {
    const auto& s = weights.shape();
    const std::size_t n = s[3], rows = weights.size() / n;
    attn::Tensor3 h({s[0], s[1], s[2]});  // one entropy per row
    for (std::size_t r = 0; r < rows; ++r) {
        const float* p = weights.data() + r * n;
        double sum = 0.0, entropy = 0.0;
        for (std::size_t j = 0; j < n; ++j) {
            attn::require(p[j] >= 0.0f, "attention_entropy: negative weight " + std::to_string(p[j]));
            sum += p[j];
            entropy -= p[j] * std::log(static_cast<double>(p[j]));  // 0 ln 0 = 0
        }
        attn::require(std::fabs(sum - 1.0) <= 1e-3,
                      "attention_entropy: a row sums to " + std::to_string(sum) + ", not 1");
        h.data()[r] = static_cast<float>(entropy);
    }
    return h;
}

attn::Tensor1 mean_entropy_per_head(const attn::Tensor4& weights) {
    const attn::Tensor3 h = attention_entropy(weights);  // (B, NH, T_q)
    // Mean over the batch axis and the query axis, one number per head.
    return xt::mean(h, {0, 2});
}

}  // namespace exercise
