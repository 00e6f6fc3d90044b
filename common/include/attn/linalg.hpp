/// @file linalg.hpp
/// @brief Matrix products on 2-D tensors (through BLAS) and the batched forms the lessons use.
///
/// `xt::linalg::dot` follows `np.dot`, not batched matmul, so the course keeps one 2-D
/// `matmul` and loops over batch views where it needs more.
#pragma once

#include "attn/tensor.hpp"

#include <cstddef>
#include <type_traits>

namespace attn {

/// C = A · B for A (M, K) and B (K, N); returns (M, N).
Tensor2 matmul(const Tensor2& a, const Tensor2& b);

/// C = A · Bᵀ for A (M, K) and B (N, K); returns (M, N). This is a linear layer's product
/// with a PyTorch-layout weight (out, in).
Tensor2 matmul_transposed(const Tensor2& a, const Tensor2& b);

/// The batched product over the leading axis: out[b] = a[b] · bᵀ[b] for
/// a (B, M, K) and b (B, N, K); returns (B, M, N).
Tensor3 batched_matmul_transposed(const Tensor3& a, const Tensor3& b);

/// The batched product over the leading axis: out[b] = a[b] · b[b] for
/// a (B, M, K) and b (B, K, N); returns (B, M, N).
Tensor3 batched_matmul(const Tensor3& a, const Tensor3& b);

// xtensor converts a tensor of one rank to another silently (and then fails at run time with
// a made-up shape): a Tensor3 passed where a Tensor2 is expected would compile. These
// overloads match such a call exactly and are deleted, so it is a compile error at the line
// that makes it ("use of deleted function … [with N = 3; M = 2]"). Views still convert.
template <std::size_t N, std::size_t M, std::enable_if_t<(N != 2 || M != 2), int> = 0>
Tensor2 matmul(const Tensor<N>& a, const Tensor<M>& b) = delete;
template <std::size_t N, std::size_t M, std::enable_if_t<(N != 2 || M != 2), int> = 0>
Tensor2 matmul_transposed(const Tensor<N>& a, const Tensor<M>& b) = delete;
template <std::size_t N, std::size_t M, std::enable_if_t<(N != 3 || M != 3), int> = 0>
Tensor3 batched_matmul_transposed(const Tensor<N>& a, const Tensor<M>& b) = delete;
template <std::size_t N, std::size_t M, std::enable_if_t<(N != 3 || M != 3), int> = 0>
Tensor3 batched_matmul(const Tensor<N>& a, const Tensor<M>& b) = delete;

}  // namespace attn
