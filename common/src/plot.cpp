#include "attn/plot.hpp"

#include "attn/tensor.hpp"
#include "canvas.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace attn {

namespace {

// Tick positions at 1, 2 or 5 times a power of ten, about `target` of them over [lo, hi].
std::vector<double> ticks(double lo, double hi, int target) {
    const double raw = (hi - lo) / target;
    const double mag = std::pow(10.0, std::floor(std::log10(raw)));
    double step = mag;
    for (double m : {1.0, 2.0, 5.0, 10.0})
        if (m * mag >= raw) { step = m * mag; break; }
    std::vector<double> t;
    // Ticks are counted, not accumulated, and one within rounding of zero is zero (no "-0").
    const double first = std::ceil(lo / step);
    for (int i = 0; (first + i) * step <= hi + step * 1e-9; ++i) {
        const double v = (first + i) * step;
        t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
    }
    return t;
}

std::string tick_label(double v) {
    char buf[32];
    if (v != 0.0 && (std::fabs(v) >= 1e5 || std::fabs(v) < 1e-2)) std::snprintf(buf, sizeof buf, "%.0e", v);
    else std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

}  // namespace

void line_plot_png(const std::filesystem::path& path, const std::vector<PlotSeries>& series,
                   const std::string& title, const std::string& x_label,
                   const std::string& y_label) {
    static const detail::Rgb palette[] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189}};
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (const auto& s : series) {
        require(s.x.size() == s.y.size(), "line_plot_png: series '" + s.name + "' has " + std::to_string(s.x.size()) +
                                              " x values and " + std::to_string(s.y.size()) + " y values");
        for (std::size_t i = 0; i < s.x.size(); ++i) {
            if (!std::isfinite(s.x[i]) || !std::isfinite(s.y[i])) continue;
            x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
            y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
        }
    }
    require(std::isfinite(x0), "line_plot_png: no finite point to draw");
    if (x1 == x0) x1 = x0 + 1;
    if (y1 == y0) y1 = y0 + 1;
    const double pad = 0.05 * (y1 - y0);
    y0 -= pad, y1 += pad;

    const int W = 900, H = 520, left = 90, right = 30, top = 50, bottom = 70, s = 2;
    detail::Canvas c(W, H);
    const detail::Rgb ink{30, 30, 30}, grid{225, 225, 225};
    const auto px = [&](double x) { return left + static_cast<int>(std::lround((x - x0) / (x1 - x0) * (W - left - right))); };
    const auto py = [&](double y) { return H - bottom - static_cast<int>(std::lround((y - y0) / (y1 - y0) * (H - top - bottom))); };

    for (double t : ticks(y0, y1, 6)) {
        c.line(left, py(t), W - right, py(t), grid);
        const std::string l = tick_label(t);
        c.text(left - 8 - detail::Canvas::text_width(l, s), py(t) - 7, l, s, ink);
    }
    for (double t : ticks(x0, x1, 8)) {
        c.line(px(t), top, px(t), H - bottom, grid);
        const std::string l = tick_label(t);
        c.text(px(t) - detail::Canvas::text_width(l, s) / 2, H - bottom + 8, l, s, ink);
    }
    c.line(left, top, left, H - bottom, ink);
    c.line(left, H - bottom, W - right, H - bottom, ink);
    // The title centred on the first line, the y axis's label on its own line beneath it.
    c.text((W - detail::Canvas::text_width(title, s)) / 2, 6, title, s, ink);
    c.text((W - detail::Canvas::text_width(x_label, s)) / 2, H - 32, x_label, s, ink);
    c.text(8, top - 22, y_label, s, ink);

    for (std::size_t k = 0; k < series.size(); ++k) {
        const auto colour = palette[k % 5];
        const auto& sr = series[k];
        bool have = false;
        int lx = 0, ly = 0;
        for (std::size_t i = 0; i < sr.x.size(); ++i) {
            if (!std::isfinite(sr.x[i]) || !std::isfinite(sr.y[i])) { have = false; continue; }
            const int x = px(sr.x[i]), y = py(sr.y[i]);
            if (have) c.line(lx, ly, x, y, colour, 2);
            else if (sr.x.size() == 1) c.rect(x - 3, y - 3, x + 4, y + 4, colour);
            lx = x, ly = y, have = true;
        }
    }

    // The legend goes in the top corner, right or left, that covers fewer of the points.
    int name_width = 0;
    for (const auto& sr : series) name_width = std::max(name_width, detail::Canvas::text_width(sr.name, s));
    const int box_w = name_width + 50, box_h = 24 * static_cast<int>(series.size()) + 8;
    const auto covered = [&](int x_lo) {
        int n = 0;
        for (const auto& sr : series)
            for (std::size_t i = 0; i < sr.x.size(); ++i) {
                if (!std::isfinite(sr.x[i]) || !std::isfinite(sr.y[i])) continue;
                const int x = px(sr.x[i]), y = py(sr.y[i]);
                n += x >= x_lo && x < x_lo + box_w && y >= top && y < top + box_h;
            }
        return n;
    };
    const int right_x = W - right - box_w, left_x = left + 10;
    const int box_x = covered(left_x) < covered(right_x) ? left_x : right_x;
    int legend_y = top + 8;
    for (std::size_t k = 0; k < series.size(); ++k) {
        c.rect(box_x + 6, legend_y + 5, box_x + 36, legend_y + 9, palette[k % 5]);
        c.text(box_x + 44, legend_y, series[k].name, s, ink);
        legend_y += 24;
    }
    c.save(path);
}

}  // namespace attn
