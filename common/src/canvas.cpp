#include "canvas.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_easy_font.h>
#include <stb/stb_image_write.h>

namespace attn::detail {

Canvas::Canvas(int width, int height)
    : w(width), h(height), px(static_cast<std::size_t>(width) * static_cast<std::size_t>(height) * 3, 255) {}

void Canvas::rect(int x0, int y0, int x1, int y1, Rgb c) {
    x0 = std::max(x0, 0), y0 = std::max(y0, 0), x1 = std::min(x1, w), y1 = std::min(y1, h);
    for (int y = y0; y < y1; ++y)
        for (int x = x0; x < x1; ++x)
            std::copy(c.begin(), c.end(), px.begin() + (static_cast<long>(y) * w + x) * 3);
}

void Canvas::line(int x0, int y0, int x1, int y1, Rgb c, int thickness) {
    // Bresenham's line, drawn as small squares for thickness.
    const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
    const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
    int err = dx + dy;
    const int r0 = thickness / 2, r1 = thickness - r0;
    while (true) {
        rect(x0 - r0, y0 - r0, x0 + r1, y0 + r1, c);
        if (x0 == x1 && y0 == y1) break;
        const int e2 = 2 * err;
        if (e2 >= dy) err += dy, x0 += sx;
        if (e2 <= dx) err += dx, y0 += sy;
    }
}

int Canvas::text_width(const std::string& s, int scale) {
    // The right edge of the drawn quads: stb_easy_font_width counts advances only, and
    // comes out short of what stb_easy_font_print draws for some strings.
    std::vector<char> buffer(s.size() * 270 + 1000);
    std::string copy = s;
    const int quads = stb_easy_font_print(0, 0, copy.data(), nullptr, buffer.data(),
                                          static_cast<int>(buffer.size()));
    float right = 0.0f;
    for (int q = 0; q < quads; ++q) {
        float v2[2];
        std::memcpy(v2, buffer.data() + q * 64 + 32, sizeof v2);
        right = std::max(right, v2[0]);
    }
    return std::max(static_cast<int>(std::lround(right)), stb_easy_font_width(copy.data())) * scale;
}

void Canvas::text(int x, int y, const std::string& s, int scale, Rgb c) {
    std::vector<char> buffer(s.size() * 270 + 1000);
    std::string copy = s;
    const int quads = stb_easy_font_print(0, 0, copy.data(), nullptr, buffer.data(),
                                          static_cast<int>(buffer.size()));
    // Each quad is 4 vertices of (x, y, z, rgba), 16 bytes each; corners 0 and 2 span it.
    for (int q = 0; q < quads; ++q) {
        float v0[2], v2[2];
        std::memcpy(v0, buffer.data() + q * 64, sizeof v0);
        std::memcpy(v2, buffer.data() + q * 64 + 32, sizeof v2);
        rect(x + static_cast<int>(v0[0]) * scale, y + static_cast<int>(v0[1]) * scale,
             x + static_cast<int>(v2[0]) * scale, y + static_cast<int>(v2[1]) * scale, c);
    }
}

void Canvas::save(const std::filesystem::path& path) const {
    if (!stbi_write_png(path.string().c_str(), w, h, 3, px.data(), w * 3))
        throw std::runtime_error(path.string() + ": cannot write the PNG file");
}

}  // namespace attn::detail
