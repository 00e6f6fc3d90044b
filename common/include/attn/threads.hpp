/// @file threads.hpp
/// @brief How many CPU threads the library's loops and matrix products use.
///
/// The library runs its loops on OpenMP threads and splits each matrix product between
/// them, one single-threaded OpenBLAS call per thread, so that one pool of threads does
/// all the work. The default is OpenMP's (the number of CPUs, or `OMP_NUM_THREADS`).
#pragma once

namespace attn {

/// Sets the number of threads for the library's loops and matrix products.
/// @param n threads, at least 1
/// @throws std::invalid_argument when n < 1
void set_num_threads(int n);

/// The number of threads the library's parallel loops use.
int num_threads();

}  // namespace attn
