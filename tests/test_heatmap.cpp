#include "attn/heatmap.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>

using namespace attn;

TEST_CASE("the text heatmap shades each cell by its weight and keeps zeros blank") {
    Tensor2 w = {{1.0f, 0.0f}, {0.3f, 0.7f}};
    const std::string picture = heatmap_text(w, {"a", "bc"}, {"a", "bc"});
    // Header, two rows, legend. Row labels are right-aligned to the longest one.
    CHECK(picture.find("    a bc\n") == 0);
    CHECK(picture.find(" a |██  |\n") != std::string::npos);
    CHECK(picture.find("bc |▒▒▓▓|\n") != std::string::npos);
}

TEST_CASE("long column labels are written downwards so that they stay readable") {
    Tensor2 w = {{1.0f, 0.0f}, {0.5f, 0.5f}};
    const std::string picture = heatmap_text(w, {"the", "cat"}, {"the", "cat"});
    CHECK(picture.find("     t c\n     h a\n     e t\n") == 0);
    CHECK(picture.find("the |██  |\n") != std::string::npos);
}

TEST_CASE("the text heatmap marks NaN and rejects label lists of the wrong length") {
    Tensor2 w = {{NAN}};
    CHECK(heatmap_text(w).find("|??|") != std::string::npos);
    CHECK_THROWS_AS(heatmap_text(w, {"a", "b"}, {}), std::invalid_argument);
}

TEST_CASE("PNG heatmaps are written as PNG files, and bad input is rejected") {
    const auto dir = attn_test::scratch_folder();
    Tensor2 w = {{1.0f, 0.0f, 0.0f}, {0.4f, 0.6f, 0.0f}, {0.2f, 0.3f, 0.5f}};
    const auto one = dir / "attn_test_heatmap.png";
    heatmap_png(one, w, {"the", "cat", "sat"}, {"the", "cat", "sat"}, "weights");
    std::ifstream in(one, std::ios::binary);
    char magic[8] = {};
    in.read(magic, 8);
    CHECK(std::string(magic + 1, 3) == "PNG");
    const auto grid = dir / "attn_test_heatmap_grid.png";
    heatmap_grid_png(grid, {w, w, w}, {"h0", "h1", "h2"}, {}, {}, 2);
    CHECK(std::filesystem::file_size(grid) > std::filesystem::file_size(one));
    CHECK_THROWS_AS(heatmap_grid_png(grid, {w, Tensor2(xt::zeros<float>({2, 2}))}, {"a", "b"}, {}, {}),
                    std::invalid_argument);
    CHECK_THROWS_AS(heatmap_png(dir / "no_such_dir" / "x.png", w, {}, {}, "t"), std::runtime_error);
    std::filesystem::remove(one);
    std::filesystem::remove(grid);
}
