// A small RGB drawing surface for the course's pictures (heatmaps, loss curves): filled
// rectangles, lines and text (stb_easy_font's glyphs), saved as PNG (stb_image_write).
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace attn::detail {

using Rgb = std::array<std::uint8_t, 3>;

struct Canvas {
    int w, h;
    std::vector<std::uint8_t> px;  // (h, w, 3), white to start with

    Canvas(int width, int height);
    void rect(int x0, int y0, int x1, int y1, Rgb c);  // fills [x0, x1) × [y0, y1)
    void line(int x0, int y0, int x1, int y1, Rgb c, int thickness = 1);
    static int text_width(const std::string& s, int scale);
    void text(int x, int y, const std::string& s, int scale, Rgb c);  // (x, y) is the top left
    void save(const std::filesystem::path& path) const;  // throws std::runtime_error
};

}  // namespace attn::detail
