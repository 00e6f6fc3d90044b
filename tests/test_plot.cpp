#include "attn/plot.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>

using namespace attn;

TEST_CASE("a loss curve is written as a PNG file, skipping non-finite points") {
    const auto path = attn_test::scratch("attn_test_plot.png");
    PlotSeries train{"train", {0, 100, 200, 300}, {4.2, 2.5, NAN, 1.9}};
    PlotSeries val{"val", {0, 300}, {4.2, 2.0}};
    line_plot_png(path, {train, val}, "loss", "step", "loss");
    std::ifstream in(path, std::ios::binary);
    char magic[4] = {};
    in.read(magic, 4);
    CHECK(std::string(magic + 1, 3) == "PNG");
    std::filesystem::remove(path);
}

TEST_CASE("a chart with mismatched or no data is rejected") {
    const auto path = attn_test::scratch("attn_test_plot_bad.png");
    CHECK_THROWS_AS(line_plot_png(path, {PlotSeries{"a", {0, 1}, {1}}}, "t", "x", "y"), std::invalid_argument);
    CHECK_THROWS_AS(line_plot_png(path, {PlotSeries{"a", {0}, {NAN}}}, "t", "x", "y"), std::invalid_argument);
}
