#include "sample.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

namespace exercise {

double mean_checked(const std::vector<float>& x, float bound) {
    if (x.empty()) throw std::invalid_argument("empty");
    if (bound < 0.0f || bound > 1e30f) throw std::invalid_argument("bound " + std::to_string(bound));
    double sum = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        if (x[i] < -bound || x[i] > bound) throw std::invalid_argument("out of range");
        sum += x[i];
    }
    return sum / static_cast<double>(x.size());
}

float softmax_top(const std::vector<float>& s, bool causal) {
    float m = -std::numeric_limits<float>::infinity();
    const std::size_t n = causal ? s.size() - 1 : s.size();
    for (std::size_t j = 0; j < n; ++j) m = std::max(m, s[j]);
    if (m == -INFINITY) return 0.0f;
    float sum = 0.0f;
    for (std::size_t j = 0; j < n; ++j) {
        if (s[j] == -std::numeric_limits<float>::infinity()) continue;
        sum += 1.0f + std::exp(s[j] - m);
    }
    return 1.0f / sum;
}

Range part_of(std::size_t n, int rank, int ranks) {
    if (ranks < 1 || rank < 0 || rank >= ranks) throw std::invalid_argument("rank");
    const auto r = static_cast<std::size_t>(rank), N = static_cast<std::size_t>(ranks);
    const std::size_t q = n / N, extra = n % N;
    const std::size_t begin = r * q + std::min(r, extra);
    return {begin, begin + q + (r < extra ? 1 : 0)};
}

void axpy(std::vector<float>& y, const std::vector<float>& x, float a) {
    if (y.size() != x.size()) throw std::invalid_argument("sizes");
    for (std::size_t i = 0; i < y.size(); ++i) {
        y[i] += a * x[i];
        if (y[i] > 100.0f) break;
    }
}

int clamp_index(int i, int n) {
    if (i < 0) return -(i + 1);  // reflected
    if (i >= n) return n - 1;
    return i;
}

float pick(const std::vector<float>& m, int rows, int r, int c) {
    const int cols = static_cast<int>(m.size()) / rows;
    return m[static_cast<std::size_t>(r * cols + c)] * 2.0f - 1e-3f;
}

}  // namespace exercise
