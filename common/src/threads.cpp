// Thread counts: OpenMP runs the library's loops and splits its matrix products, so
// OpenBLAS, called from inside those threads, runs each product on the calling thread.
#include "attn/threads.hpp"

#include <cblas.h>
#include <omp.h>

#include <stdexcept>
#include <string>

namespace attn {

namespace {
// Runs once, before main: OpenBLAS's own pool would otherwise spin beside OpenMP's threads
// on the same cores, each waiting for the other to give the cores back.
const bool openblas_single_threaded = [] {
    openblas_set_num_threads(1);
    return true;
}();
}  // namespace

void set_num_threads(int n) {
    if (n < 1) {
        throw std::invalid_argument("set_num_threads: expected at least 1 thread, got " +
                                    std::to_string(n));
    }
    openblas_set_num_threads(1);
    omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace attn
