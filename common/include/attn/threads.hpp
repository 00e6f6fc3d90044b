/// @file threads.hpp
/// @brief How many CPU threads the library's matrix products and loops use.
///
/// OpenBLAS runs the matrix products on its own pool of threads; set_num_threads() sizes
/// it, so that a benchmark compares like with like (PyTorch's `torch.set_num_threads`).
#pragma once

namespace attn {

/// Sets the number of threads for the matrix products (OpenBLAS).
/// @param n threads, at least 1
/// @throws std::invalid_argument when n < 1
void set_num_threads(int n);

/// The number of threads set_num_threads() last set (or the library's default).
int num_threads();

}  // namespace attn
