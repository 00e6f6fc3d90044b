/// @file plot.hpp
/// @brief Line charts as PNG files, for loss curves.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace attn {

/// One line of a chart.
struct PlotSeries {
    std::string name;       ///< shown in the legend
    std::vector<double> x;  ///< (n) x values, increasing
    std::vector<double> y;  ///< (n) y values; non-finite values are skipped
};

/// Draws line charts with axes, ticks, a legend and a title, and writes them as a PNG.
/// @param path     the PNG file to write
/// @param series   the lines (colours are assigned in order)
/// @param title    drawn above the chart
/// @param x_label  the x axis's name
/// @param y_label  the y axis's name
/// @throws std::invalid_argument if a series' x and y differ in length or no point is finite
/// @throws std::runtime_error if the file cannot be written
void line_plot_png(const std::filesystem::path& path, const std::vector<PlotSeries>& series,
                   const std::string& title, const std::string& x_label,
                   const std::string& y_label);

}  // namespace attn
