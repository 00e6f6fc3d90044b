// Thread counts for OpenBLAS.
#include "attn/threads.hpp"

#include <cblas.h>

#include <stdexcept>
#include <string>

namespace attn {

void set_num_threads(int n) {
    if (n < 1) {
        throw std::invalid_argument("set_num_threads: expected at least 1 thread, got " +
                                    std::to_string(n));
    }
    openblas_set_num_threads(n);
}

int num_threads() { return openblas_get_num_threads(); }

}  // namespace attn
