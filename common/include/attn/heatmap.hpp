/// @file heatmap.hpp
/// @brief Pictures of attention weights: shaded text for the terminal, PNG files for the docs.
#pragma once

#include "attn/tensor.hpp"

#include <filesystem>
#include <string>
#include <vector>

namespace attn {

/// Draws a matrix of weights in [0, 1] as shaded block characters, two per cell
/// (`  `, `░░`, `▒▒`, `▓▓`, `██` for 0 to 1), with row labels on the left and the column
/// labels on top (written downwards, one character per line, when wider than two).
///
/// Plain characters, no colour codes: it reads the same in a terminal, a log file and the
/// docs. Values below 0 or above 1 are clamped; NaN is drawn as `??`.
///
/// @param w           (rows, cols) the weights, e.g. one head's attention (T_q, T_k)
/// @param row_labels  one label per row (the querying tokens), or empty for row numbers
/// @param col_labels  one label per column (the attended tokens), or empty for numbers
/// @return the picture, one line per row plus a header and a legend, ending in a newline
std::string heatmap_text(const Tensor2& w, const std::vector<std::string>& row_labels = {},
                         const std::vector<std::string>& col_labels = {});

/// Writes a matrix of weights in [0, 1] as a PNG heatmap with a title, token labels on
/// both axes and each cell's value printed in it when the matrix is small enough to read.
///
/// @param path        the PNG file to write
/// @param w           (rows, cols) the weights
/// @param row_labels  one label per row, or empty for row numbers
/// @param col_labels  one label per column, or empty for numbers
/// @param title       the caption drawn above the map
/// @throws std::invalid_argument if a label list has the wrong length
/// @throws std::runtime_error if the file cannot be written
void heatmap_png(const std::filesystem::path& path, const Tensor2& w,
                 const std::vector<std::string>& row_labels,
                 const std::vector<std::string>& col_labels, const std::string& title);

/// Writes several heatmaps of the same shape side by side in one PNG, e.g. every head of
/// a multi-head attention layer.
///
/// @param path        the PNG file to write
/// @param maps        the matrices, all (rows, cols)
/// @param titles      one caption per map
/// @param row_labels  one label per row, or empty for row numbers
/// @param col_labels  one label per column, or empty for numbers
/// @param per_row     how many maps to draw in one row of the grid
void heatmap_grid_png(const std::filesystem::path& path, const std::vector<Tensor2>& maps,
                      const std::vector<std::string>& titles,
                      const std::vector<std::string>& row_labels,
                      const std::vector<std::string>& col_labels, std::size_t per_row = 4);

}  // namespace attn
