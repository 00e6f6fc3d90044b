// mistake: does not check that the key/value heads divide the query heads (a remainder head is silently dropped or read past the end)
// Solution to exercise 16: grouped-query attention's head mapping and its backward.
#include "exercise.hpp"

#include <xtensor/xbuilder.hpp>

#include <stdexcept>
#include <string>

namespace exercise {

namespace {

void check_heads(int n_head, int n_kv_head, const char* who) {
    if (n_head < 1 || n_kv_head < 1)
        throw std::invalid_argument(std::string(who) + ": the key/value heads G = " +
                                    std::to_string(n_kv_head) + " must divide the query heads NH = " +
                                    std::to_string(n_head) + " (both at least 1)");
}

}  // namespace

int kv_head(int h, int n_head, int n_kv_head) {
    check_heads(n_head, n_kv_head, "kv_head");
    if (h < 0 || h >= n_head)
        throw std::invalid_argument("kv_head: the query head " + std::to_string(h) +
                                    " is outside [0, " + std::to_string(n_head) + ")");
    const int group = n_head / n_kv_head;  // query heads per key/value head
    return h / group;
}

attn::Tensor3 expand_kv(const attn::Tensor3& kv, int n_head) {
    const int G = static_cast<int>(kv.shape()[0]);
    check_heads(n_head, G, "expand_kv");
    const std::size_t T = kv.shape()[1], hs = kv.shape()[2];
    attn::Tensor3 out = attn::Tensor3::from_shape({static_cast<std::size_t>(n_head), T, hs});
    for (int h = 0; h < n_head; ++h) {
        const std::size_t g = static_cast<std::size_t>(kv_head(h, n_head, G));
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t d = 0; d < hs; ++d) out(static_cast<std::size_t>(h), t, d) = kv(g, t, d);
    }
    return out;
}

attn::Tensor3 expand_kv_backward(const attn::Tensor3& dexpanded, int n_kv_head) {
    const int NH = static_cast<int>(dexpanded.shape()[0]);
    check_heads(NH, n_kv_head, "expand_kv_backward");
    const std::size_t T = dexpanded.shape()[1], hs = dexpanded.shape()[2];
    attn::Tensor3 dkv = xt::zeros<float>({static_cast<std::size_t>(n_kv_head), T, hs});
    for (int h = 0; h < NH; ++h) {
        const std::size_t g = static_cast<std::size_t>(kv_head(h, NH, n_kv_head));
        for (std::size_t t = 0; t < T; ++t)
            for (std::size_t d = 0; d < hs; ++d)
                dkv(g, t, d) += dexpanded(static_cast<std::size_t>(h), t, d);
    }
    return dkv;
}

}  // namespace exercise
