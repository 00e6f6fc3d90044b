#include "attn/tensor.hpp"

namespace attn {

std::string format_shape(const std::vector<std::size_t>& shape) {
    std::string s = "(";
    for (std::size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    if (shape.size() == 1) s += ",";  // as Python writes a 1-tuple
    return s + ")";
}

}  // namespace attn
