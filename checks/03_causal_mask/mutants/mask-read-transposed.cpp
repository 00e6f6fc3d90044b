// mistake: the mask is read as mask(j, i)
// Solution to exercise 03: the causal mask and the masked fill.
#include "exercise.hpp"

#include <limits>

namespace exercise {

attn::Mask<2> causal_mask(std::size_t block_size) {
    attn::require(block_size > 0, "causal_mask: the block size must be positive");
    attn::Mask<2> m({block_size, block_size});
    for (std::size_t i = 0; i < block_size; ++i)
        for (std::size_t j = 0; j < block_size; ++j) m(i, j) = j <= i;  // the past and itself
    return m;
}

attn::Tensor3 masked_fill(const attn::Tensor3& scores, const attn::Mask<2>& mask) {
    attn::expect_shape("mask", mask, {scores.shape()[1], scores.shape()[2]});
    attn::Tensor3 out = scores;
    for (std::size_t b = 0; b < out.shape()[0]; ++b)
        for (std::size_t i = 0; i < out.shape()[1]; ++i)
            for (std::size_t j = 0; j < out.shape()[2]; ++j)
                if (!mask(j, i)) out(b, i, j) = -std::numeric_limits<float>::infinity();
    return out;
}

}  // namespace exercise
