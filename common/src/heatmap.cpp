#include "attn/heatmap.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>

#include "canvas.hpp"

namespace attn {

namespace {

using detail::Canvas;

std::vector<std::string> labels_or_numbers(const std::vector<std::string>& labels, std::size_t n,
                                           const char* what) {
    if (labels.empty()) {
        std::vector<std::string> numbers;
        for (std::size_t i = 0; i < n; ++i) numbers.push_back(std::to_string(i));
        return numbers;
    }
    require(labels.size() == n, std::string("heatmap: ") + what + " labels: expected " +
                                    std::to_string(n) + ", got " + std::to_string(labels.size()));
    return labels;
}

// Display width of a UTF-8 string: one per code point.
std::size_t width(const std::string& s) {
    std::size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
}

// The first `n` code points of s, padded with spaces to n.
std::string fit(const std::string& s, std::size_t n) {
    std::string out;
    std::size_t taken = 0;
    for (std::size_t i = 0; i < s.size() && taken < n;) {
        std::size_t len = 1;
        const auto c = static_cast<unsigned char>(s[i]);
        if (c >= 0xF0) len = 4;
        else if (c >= 0xE0) len = 3;
        else if (c >= 0xC0) len = 2;
        out += s.substr(i, len);
        i += len;
        ++taken;
    }
    return out + std::string(n - taken, ' ');
}

// The code points of a UTF-8 string, each as its bytes.
std::vector<std::string> split_characters(const std::string& s) {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < s.size();) {
        const auto c = static_cast<unsigned char>(s[i]);
        const std::size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        out.push_back(s.substr(i, len));
        i += len;
    }
    return out;
}

// A printable ASCII version of a token label for the PNG font (which has ASCII only).
std::string printable(const std::string& s) {
    if (s == " ") return "' '";
    if (s == "\n") return "\\n";
    std::string out;
    for (unsigned char c : s) out += (c >= 32 && c < 127) ? static_cast<char>(c) : '?';
    return out;
}

// The colour of a weight in [0, 1]: white through blue to a dark navy, so that zero
// (a masked position) reads as empty paper.
detail::Rgb colour(float v) {
    static const float stops[][3] = {
        {255, 255, 255}, {198, 219, 239}, {107, 174, 214}, {33, 113, 181}, {8, 48, 107}};
    if (std::isnan(v)) return {230, 50, 50};
    v = std::clamp(v, 0.0f, 1.0f) * 4.0f;
    const int i = std::min(3, static_cast<int>(v));
    const float f = v - static_cast<float>(i);
    detail::Rgb c{};
    for (int k = 0; k < 3; ++k)
        c[static_cast<std::size_t>(k)] = static_cast<std::uint8_t>(
            std::lround(stops[i][k] + f * (stops[i + 1][k] - stops[i][k])));
    return c;
}

constexpr int kScale = 2;      // font scale: stb_easy_font glyphs are about 6 px tall
constexpr int kLine = 12 * kScale;

struct Layout {
    int cell, label_w, label_h, map_w, map_h, panel_w, panel_h;
};

Layout layout(std::size_t rows, std::size_t cols, const std::vector<std::string>& rl,
              const std::vector<std::string>& cl) {
    Layout l{};
    l.cell = static_cast<int>(std::clamp<std::size_t>(560 / std::max(rows, cols), 28, 56));
    for (const auto& s : rl) l.label_w = std::max(l.label_w, Canvas::text_width(printable(s), kScale));
    int col_label_w = 0;
    for (const auto& s : cl) col_label_w = std::max(col_label_w, Canvas::text_width(printable(s), kScale));
    l.label_w += 12;
    l.label_h = kLine + 6;
    if (col_label_w > l.cell - 4) l.cell = std::min(96, col_label_w + 6);
    l.map_w = l.cell * static_cast<int>(cols);
    l.map_h = l.cell * static_cast<int>(rows);
    l.panel_w = l.label_w + l.map_w + 24;
    l.panel_h = kLine + 10 + l.label_h + l.map_h + 16;
    return l;
}

void draw_panel(Canvas& canvas, int ox, int oy, const Layout& l, const Tensor2& w,
                const std::vector<std::string>& rl, const std::vector<std::string>& cl,
                const std::string& title) {
    const detail::Rgb ink{20, 20, 20}, grey{90, 90, 90};
    canvas.text(ox + l.label_w, oy + 4, printable(title), kScale, ink);
    const int top = oy + kLine + 10 + l.label_h, left = ox + l.label_w;
    const std::size_t rows = w.shape()[0], cols = w.shape()[1];
    const bool numbers = l.cell >= 44;
    for (std::size_t j = 0; j < cols; ++j) {
        const std::string s = printable(cl[j]);
        canvas.text(left + static_cast<int>(j) * l.cell + (l.cell - Canvas::text_width(s, kScale)) / 2,
                    top - l.label_h + 4, s, kScale, ink);
    }
    for (std::size_t i = 0; i < rows; ++i) {
        const int y = top + static_cast<int>(i) * l.cell;
        const std::string s = printable(rl[i]);
        canvas.text(left - 8 - Canvas::text_width(s, kScale), y + (l.cell - 7 * kScale) / 2, s,
                    kScale, ink);
        for (std::size_t j = 0; j < cols; ++j) {
            const int x = left + static_cast<int>(j) * l.cell;
            const float v = w(i, j);
            canvas.rect(x, y, x + l.cell - 1, y + l.cell - 1, colour(v));
            if (numbers) {
                char buf[16];
                std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(v));
                const auto c = (v > 0.4f) ? detail::Rgb{255, 255, 255} : grey;
                canvas.text(x + (l.cell - Canvas::text_width(buf, 1)) / 2, y + l.cell / 2 - 4, buf,
                            1, c);
            }
        }
    }
}

}  // namespace

std::string heatmap_text(const Tensor2& w, const std::vector<std::string>& row_labels,
                         const std::vector<std::string>& col_labels) {
    static const char* shades[] = {"  ", "░░", "▒▒", "▓▓", "██"};
    const std::size_t rows = w.shape()[0], cols = w.shape()[1];
    const auto rl = labels_or_numbers(row_labels, rows, "row");
    const auto cl = labels_or_numbers(col_labels, cols, "column");
    std::size_t lw = 0;
    for (const auto& s : rl) lw = std::max(lw, width(s));
    // Column labels sit above their two-character cells: on one line when they fit,
    // otherwise written downwards, one character per line, so words stay readable.
    std::size_t cw = 0;
    for (const auto& s : cl) cw = std::max(cw, width(s));
    std::string out;
    if (cw <= 2) {
        out = std::string(lw + 2, ' ');
        for (const auto& s : cl) out += fit(s, 2);
        out += "\n";
    } else {
        std::vector<std::vector<std::string>> chars;
        for (const auto& s : cl) chars.push_back(split_characters(s));
        for (std::size_t k = 0; k < cw; ++k) {
            std::string line = std::string(lw + 2, ' ');
            for (const auto& c : chars) line += fit(k < c.size() ? c[k] : "", 2);
            while (!line.empty() && line.back() == ' ') line.pop_back();
            out += line + "\n";
        }
    }
    for (std::size_t i = 0; i < rows; ++i) {
        out += std::string(lw - width(rl[i]), ' ') + rl[i] + " |";
        for (std::size_t j = 0; j < cols; ++j) {
            const float v = w(i, j);
            if (std::isnan(v)) {
                out += "??";
                continue;
            }
            // Five shades for [0, 1]: 0 exactly is blank, so masked positions stand out.
            const int level = v <= 0.0f ? 0 : std::clamp(1 + static_cast<int>(v * 4.0f), 1, 4);
            out += shades[level];
        }
        out += "|\n";
    }
    out += std::string(lw + 2, ' ') + "shades: '  ' 0   ░ <0.25   ▒ <0.5   ▓ <0.75   █ up to 1\n";
    return out;
}

void heatmap_png(const std::filesystem::path& path, const Tensor2& w,
                 const std::vector<std::string>& row_labels,
                 const std::vector<std::string>& col_labels, const std::string& title) {
    heatmap_grid_png(path, {w}, {title}, row_labels, col_labels, 1);
}

void heatmap_grid_png(const std::filesystem::path& path, const std::vector<Tensor2>& maps,
                      const std::vector<std::string>& titles,
                      const std::vector<std::string>& row_labels,
                      const std::vector<std::string>& col_labels, std::size_t per_row) {
    require(!maps.empty(), "heatmap_grid_png: no maps to draw");
    require(titles.size() == maps.size(), "heatmap_grid_png: expected one title per map (" +
                                              std::to_string(maps.size()) + "), got " +
                                              std::to_string(titles.size()));
    const std::size_t rows = maps[0].shape()[0], cols = maps[0].shape()[1];
    for (const auto& m : maps) expect_shape("heatmap_grid_png map", m, {rows, cols});
    const auto rl = labels_or_numbers(row_labels, rows, "row");
    const auto cl = labels_or_numbers(col_labels, cols, "column");
    per_row = std::max<std::size_t>(1, std::min(per_row, maps.size()));
    const Layout l = layout(rows, cols, rl, cl);
    const std::size_t grid_rows = (maps.size() + per_row - 1) / per_row;
    Canvas canvas(l.panel_w * static_cast<int>(per_row) + 8,
                  l.panel_h * static_cast<int>(grid_rows) + 8);
    for (std::size_t k = 0; k < maps.size(); ++k) {
        draw_panel(canvas, 4 + l.panel_w * static_cast<int>(k % per_row),
                   4 + l.panel_h * static_cast<int>(k / per_row), l, maps[k], rl, cl, titles[k]);
    }
    canvas.save(path);
}

}  // namespace attn
