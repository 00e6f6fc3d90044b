#include "attn/print.hpp"

#include <cstdio>
#include <iostream>

namespace attn {

namespace {
std::string number(float v, int precision) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%*.*f", precision + 4, precision, static_cast<double>(v));
    return buf;
}

// Indices to show along an axis of length n: all of them, or the edges with a gap.
std::vector<long> shown(std::size_t n, const PrintOptions& o) {
    std::vector<long> idx;
    if (n <= o.threshold) {
        for (std::size_t i = 0; i < n; ++i) idx.push_back(static_cast<long>(i));
    } else {
        for (std::size_t i = 0; i < o.edge_items; ++i) idx.push_back(static_cast<long>(i));
        idx.push_back(-1);  // the "..." marker
        for (std::size_t i = n - o.edge_items; i < n; ++i) idx.push_back(static_cast<long>(i));
    }
    return idx;
}

std::string row(const float* p, std::size_t n, std::size_t stride, const PrintOptions& o) {
    std::string s = "[";
    bool first = true;
    for (long i : shown(n, o)) {
        if (!first) s += ",";
        first = false;
        s += (i < 0) ? std::string(static_cast<std::size_t>(o.precision) + 4, ' ').replace(
                           static_cast<std::size_t>(o.precision) + 1, 3, "...")
                     : number(p[static_cast<std::size_t>(i) * stride], o.precision);
    }
    return s + "]";
}
}  // namespace

std::string format_tensor(const Tensor1& t, const PrintOptions& options) {
    return row(t.data(), t.size(), 1, options);
}

std::string format_tensor(const Tensor2& t, const PrintOptions& options) {
    const std::size_t rows = t.shape()[0], cols = t.shape()[1];
    std::string s;
    for (long r : shown(rows, options)) {
        if (r < 0) {
            s += " ...\n";
            continue;
        }
        s += row(t.data() + static_cast<std::size_t>(r) * cols, cols, 1, options) + "\n";
    }
    return s;
}

void print_heading(const std::string& title) {
    // Underline as many characters as the title shows, not bytes (titles may hold UTF-8).
    std::size_t width = 0;
    for (unsigned char c : title) width += (c & 0xC0) != 0x80;
    std::cout << "\n" << title << "\n" << std::string(width, '-') << "\n";
}

}  // namespace attn
