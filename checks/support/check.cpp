#include "attn/check.hpp"

#include <iostream>

namespace attn::check {

namespace {
// doctest reports to std::cout: unbuffered, a crash later in the run (a learner's
// out-of-bounds write) cannot swallow the failures reported before it.
const bool cout_unbuffered = [] {
    std::cout.setf(std::ios::unitbuf);
    return true;
}();
}  // namespace

std::string index_string(std::size_t flat, const std::vector<std::size_t>& shape) {
    std::vector<std::size_t> idx(shape.size());
    for (std::size_t d = shape.size(); d-- > 0;) {
        idx[d] = shape[d] ? flat % shape[d] : 0;
        flat = shape[d] ? flat / shape[d] : 0;
    }
    std::string s = "[";
    for (std::size_t d = 0; d < idx.size(); ++d) s += (d ? ", " : "") + std::to_string(idx[d]);
    return s + "]";
}

}  // namespace attn::check
