/// @file threads.hpp
/// @brief How many CPU threads the library's loops and matrix products use: one policy for
/// every program.
///
/// The library runs its loops on OpenMP threads and splits each matrix product between
/// them, one OpenBLAS call per thread, so that one pool of threads does all the work.
/// OpenBLAS (the pthreads build Debian installs) also starts a pool of its own, as many
/// threads as there are CPUs; left alone, its threads and the library's would compete for
/// the same cores, and a training step takes two to three times longer. So:
///
/// | setting | what it does | default |
/// |---|---|---|
/// | `--threads N` (programs that take it) or attn::set_num_threads | the library's threads | |
/// | `OMP_NUM_THREADS=N` | the library's threads, when no `--threads` is given | the CPUs this process may run on (`taskset`, cgroups) |
/// | `OPENBLAS_NUM_THREADS=N` | OpenBLAS's threads inside each product | 1 |
///
/// The policy is applied before `main` in every program linked with the library (an object
/// file the library adds to each program's link, so it cannot be left out), and again by
/// set_num_threads. describe_threads() says what is in force; `train_gpt`, the lessons and
/// the benchmarks print it (`--threads-info`).
#pragma once

#include <string>

namespace attn {

/// The thread settings in force, and where each came from.
struct ThreadConfig {
    int threads = 1;          ///< the library's OpenMP threads
    std::string threads_from; ///< "--threads", "OMP_NUM_THREADS" or "CPUs"
    int blas_threads = 1;     ///< OpenBLAS's threads inside each product (as OpenBLAS reports)
    std::string blas_from;    ///< "OPENBLAS_NUM_THREADS" or "default"
    int cpus = 1;             ///< CPUs this process may run on
};

/// Applies the policy: OpenBLAS on `OPENBLAS_NUM_THREADS` threads when set, else on 1; the
/// library's threads as OpenMP's default (`OMP_NUM_THREADS`, else the CPUs this process may
/// run on). Runs before `main` in every program linked with the library; calling it again
/// changes nothing that set_num_threads set.
void apply_thread_policy();

/// Sets the number of threads for the library's loops and matrix products (and re-applies
/// the OpenBLAS side of the policy).
/// @param n threads, at least 1
/// @param from what asked for it, shown by describe_threads (for example "--threads")
/// @throws std::invalid_argument when n < 1
void set_num_threads(int n, const std::string& from = "set_num_threads");

/// The number of threads the library's parallel loops use.
int num_threads();

/// The settings in force, read back from OpenMP and OpenBLAS themselves.
ThreadConfig thread_config();

/// One line for a program to print at its start, for example
/// `threads: 2 (the 2 CPUs this process may use); OpenBLAS 1 thread per product (default)`,
/// with a warning when the two together ask for more threads than there are CPUs.
std::string describe_threads();

}  // namespace attn
