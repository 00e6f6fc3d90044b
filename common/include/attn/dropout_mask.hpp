/// @file dropout_mask.hpp
/// @brief The dropout masks of the GPT on both devices: a pure function of a seed and an
/// element's index, so that the CPU model and the GPU model drop the same elements.
///
/// A mask drawn from a random stream depends on the order in which the elements are
/// visited, which a GPU's thousands of threads cannot reproduce; a hash of (seed, index)
/// depends on nothing else. So both models hash: element `index` of a site is dropped when
/// `dropout_uniform(seed, index) < p`, and the backward pass can recompute the mask instead
/// of storing it. A plain header (no CUDA types): the CUDA kernels include it too.
#pragma once

#include <cstdint>

/// @cond INTERNAL
// The functions below are compiled for the GPU too when a .cu file includes them.
#if defined(__CUDACC__)
#define ATTN_HOST_DEVICE __host__ __device__
#else
#define ATTN_HOST_DEVICE
#endif
/// @endcond

namespace attn {

/// splitmix64's finaliser: 64 well-mixed bits from any 64-bit value.
/// @param x any value @return its hash
ATTN_HOST_DEVICE inline std::uint64_t mix64(std::uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/// A uniform number in [0, 1) (24 random bits) from a seed and an element's index.
/// @param seed the site's seed (dropout_site_seed) @param index the element's index
/// @return the number that decides whether the element is dropped
ATTN_HOST_DEVICE inline float dropout_uniform(std::uint64_t seed, std::uint64_t index) {
    const std::uint64_t z = mix64(seed + 0x9e3779b97f4a7c15ull * (index + 1));
    return static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
}

/// The places in the GPT where dropout applies, each with masks of its own: the embedding
/// (B, T, C), then per layer l the attention weights (B, NH, T, T), the attention's output
/// projection (B, T, C) and the MLP's output (B, T, C).
/// @param layer the block, or −1 for the embedding @param part 0 weights, 1 projection, 2 MLP
/// @return the site's number, 0 for the embedding and 1 + 3·layer + part after it
inline int dropout_site(int layer, int part) { return layer < 0 ? 0 : 1 + 3 * layer + part; }

/// The seed of one site's mask in one forward pass: the model's dropout seed, the number of
/// forward passes since it was set (1 for the first) and the site, hashed together.
/// @param seed the model's dropout seed (GPT::seed_dropout, cuda::CudaGPT::seed_dropout)
/// @param forward_call the forward pass, counted from 1 after the seed was set
/// @param site dropout_site()'s number
/// @return the seed that dropout_uniform takes for this site's elements
inline std::uint64_t dropout_site_seed(std::uint64_t seed, std::uint64_t forward_call, int site) {
    const auto mixed = mix64(forward_call * 1024 + static_cast<std::uint64_t>(site) +
                             0x9e3779b97f4a7c15ull);
    return mix64((seed ^ mixed) + 0x9e3779b97f4a7c15ull);
}

/// Where one call's elements lie in a site's mask: its seed, and the index of the call's
/// first element in the whole (batch-wide) tensor, so that a slice of the batch draws the
/// same mask elements as the whole batch does.
struct DropoutSite {
    std::uint64_t seed = 0;         ///< dropout_site_seed() of the site in this pass
    std::uint64_t first_index = 0;  ///< the index of the call's element 0 in the site's tensor
};

}  // namespace attn
