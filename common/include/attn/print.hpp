/// @file print.hpp
/// @brief Readable printing of tensors and headings for the lessons' output.
#pragma once

#include "attn/tensor.hpp"

#include <string>

namespace attn {

/// Options for format_tensor().
struct PrintOptions {
    int precision = 4;          ///< digits after the decimal point
    std::size_t edge_items = 3; ///< items kept at each end of a long axis
    std::size_t threshold = 8;  ///< an axis longer than this is summarised with "..."
};

/// Formats a 1-D tensor as one bracketed row: `[ 0.1234, -0.5000, ...]`.
std::string format_tensor(const Tensor1& t, const PrintOptions& options = {});
/// Formats a 2-D tensor as aligned rows, one per line.
std::string format_tensor(const Tensor2& t, const PrintOptions& options = {});

/// Prints a section heading with an underline, so captured output reads as sections.
void print_heading(const std::string& title);

}  // namespace attn
