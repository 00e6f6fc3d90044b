#include "attn/entropy.hpp"

#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <string>

namespace attn {

Tensor3 attention_entropy(const Tensor4& weights) {
    const auto& s = weights.shape();
    const std::size_t rows = s[0] * s[1] * s[2], n = s[3];
    Tensor3 h({s[0], s[1], s[2]});
    for (std::size_t r = 0; r < rows; ++r) {
        const float* p = weights.data() + r * n;
        double sum = 0.0, entropy = 0.0;
        for (std::size_t j = 0; j < n; ++j) {
            require(p[j] >= 0.0f, "attention_entropy: weight " + std::to_string(p[j]) +
                                      " is negative: these are not probabilities");
            sum += p[j];
            if (p[j] > 0.0f) entropy -= p[j] * std::log(static_cast<double>(p[j]));
        }
        // float32 rows sum to 1 within a few ulps times n; 1e-3 only catches real mistakes.
        require(std::fabs(sum - 1.0) <= 1e-3,
                "attention_entropy: a row sums to " + std::to_string(sum) + ", not 1");
        h.data()[r] = static_cast<float>(entropy);
    }
    return h;
}

Tensor1 mean_entropy_per_head(const Tensor4& weights) {
    const Tensor3 h = attention_entropy(weights);  // (B, NH, T_q)
    const std::size_t B = h.shape()[0], NH = h.shape()[1], T = h.shape()[2];
    Tensor1 mean = xt::zeros<float>({NH});
    for (std::size_t hd = 0; hd < NH; ++hd) {
        double total = 0.0;
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < T; ++t) total += h(b, hd, t);
        mean(hd) = static_cast<float>(total / static_cast<double>(B * T));
    }
    return mean;
}

double uniform_causal_entropy(std::size_t T) {
    double total = 0.0;
    for (std::size_t i = 0; i < T; ++i) total += std::log(static_cast<double>(i + 1));
    return T == 0 ? 0.0 : total / static_cast<double>(T);
}

std::string entropy_bar(double value, double maximum, std::size_t width) {
    require(maximum > 0.0, "entropy_bar: the maximum must be positive");
    const double share = std::clamp(value / maximum, 0.0, 1.0);
    const auto filled = static_cast<std::size_t>(std::lround(share * static_cast<double>(width)));
    std::string s;
    for (std::size_t i = 0; i < width; ++i) s += i < filled ? "█" : "·";
    return s;
}

}  // namespace attn
