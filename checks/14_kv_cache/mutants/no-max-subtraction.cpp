// mistake: the step's softmax does not subtract the largest score
// Solution to exercise 14: appending to the cache and attending over it.
#include "exercise.hpp"

#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace exercise {

attn::Tensor1 append_and_attend(attn::Tensor2& key_cache, attn::Tensor2& value_cache, int pos,
                                const attn::Tensor1& q, const attn::Tensor1& k,
                                const attn::Tensor1& v) {
    const std::size_t capacity = key_cache.shape()[0], hs = key_cache.shape()[1];
    const std::size_t hs_v = value_cache.shape()[1];
    auto fail = [](const std::string& what) { throw std::invalid_argument(what); };
    if (value_cache.shape()[0] != capacity)
        fail("the caches hold " + std::to_string(capacity) + " and " +
             std::to_string(value_cache.shape()[0]) + " rows");
    if (q.size() != hs || k.size() != hs)
        fail("q and k must have hs = " + std::to_string(hs) + " elements, got " +
             std::to_string(q.size()) + " and " + std::to_string(k.size()));
    if (v.size() != hs_v)
        fail("v must have hs_v = " + std::to_string(hs_v) + " elements, got " +
             std::to_string(v.size()));
    if (pos < 0 || static_cast<std::size_t>(pos) >= capacity)
        fail("pos " + std::to_string(pos) + " is outside [0, " + std::to_string(capacity) + ")");

    // append: the new token's key and value become row pos
    xt::row(key_cache, pos) = k;
    xt::row(value_cache, pos) = v;

    // attend: one query over rows 0..pos
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    std::vector<float> w(static_cast<std::size_t>(pos) + 1);  // (pos + 1)
    for (int j = 0; j <= pos; ++j) {
        float s = 0.0f;
        for (std::size_t i = 0; i < hs; ++i) s += q(i) * key_cache(j, i);
        w[j] = s * scale;
    }
    const float m = *std::max_element(w.begin(), w.end());
    float sum = 0.0f;
    for (float& x : w) sum += (x = std::exp(x));
    attn::Tensor1 out = xt::zeros<float>({hs_v});
    for (int j = 0; j <= pos; ++j) {
        for (std::size_t i = 0; i < hs_v; ++i) out(i) += w[j] / sum * value_cache(j, i);
    }
    return out;
}

}  // namespace exercise
