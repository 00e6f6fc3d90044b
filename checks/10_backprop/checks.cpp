// Checks for exercise 10: backpropagation through attention and LayerNorm.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - LayerNorm's gradients do not change when a row is shifted, by 1 or by 10^4
// - LayerNorm's gradients do not move when rows of any width are shifted by any offset
// - at any offset and width, LayerNorm's gradients match the float64 formula on the same rows
// - every gradient is linear in dout: dout times 2^e scales dq, dk, dv, dx, dweight and dbias exactly
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/gradcheck.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <sstream>
#include <vector>

using attn::Tensor1;
using attn::Tensor2;

namespace {

// The forward pass of one causal head, from the course library: out (T, hs) and the weights
// w (T, T), for q, k, v (T, hs) packed side by side as the library's fused qkv (T, 3·hs).
struct Head {
    Tensor2 out, w;
};
Head head_forward(const Tensor2& q, const Tensor2& k, const Tensor2& v) {
    const int T = static_cast<int>(q.shape()[0]), hs = static_cast<int>(q.shape()[1]);
    std::vector<float> qkv(static_cast<std::size_t>(T) * 3 * hs);
    for (int t = 0; t < T; ++t) {
        for (int c = 0; c < hs; ++c) {
            qkv[t * 3 * hs + c] = q(t, c);
            qkv[t * 3 * hs + hs + c] = k(t, c);
            qkv[t * 3 * hs + 2 * hs + c] = v(t, c);
        }
    }
    Head h{Tensor2({q.shape()[0], q.shape()[1]}), Tensor2({q.shape()[0], q.shape()[0]})};
    attn::attention_forward(h.out.data(), h.w.data(), nullptr, qkv.data(), 0.0f, nullptr, 1, T, hs,
                            1);
    return h;
}

// Σ g·out in double: the loss whose gradient with respect to out is g.
double weighted(const Tensor2& out, const Tensor2& g) {
    double s = 0.0;
    for (std::size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out.flat(i)) * g.flat(i);
    return s;
}

// Tolerance of the finite-difference comparisons: a step h = 1e-2 on O(1) inputs has a
// truncation error h²/6·f''' of about 2e-5, and float rounding of a sum of ~30 outputs
// divided by 2h adds about 5e-5 (measured on the solution: below 2e-4, the most for
// LayerNorm rows around 5, where float32 resolves x ± h less finely); 1e-3 stays far below
// the O(0.1) error of a wrong formula. In u = 2^-24 terms: each output of size ≲ 5 rounds
// to ≈ √n u·5 with random signs (n ≤ 9), ~30 of them weighted O(1) change between x ± h, so
// the objective's difference carries ≈ √30·√9·u·5·√2 ≈ 7e-6, /2h = 3.5e-4 at most, ~5e-5
// typically; 1e-3 sits above the measured 2e-4 and ≥ 100× below the mistakes (a missing
// 1/√hs, C − 1, a missing term or sign: O(0.1–1)).
constexpr float h = 1e-2f;
constexpr double fd_tol = 1e-3;

// The gradient `name` (the exercise's, x's shape) against central differences of `loss`
// with respect to x. A failure names the first element off by more than fd_tol with both
// values, and the largest difference, so that a wrong row, column or sign can be seen.
template <class Tensor>
void check_gradient(const char* name, Tensor& x, const Tensor& analytic,
                    const std::function<double()>& loss) {
    const std::vector<double> numeric = attn::numeric_gradient(x.data(), x.size(), h, loss);
    const std::vector<std::size_t> shape(x.shape().begin(), x.shape().end());
    std::size_t first = x.size(), worst = 0;
    double largest = 0.0;
    for (std::size_t i = 0; i < x.size(); ++i) {
        const double error = std::fabs(analytic.flat(i) - numeric[i]);
        const double e = std::isnan(error) ? INFINITY : error;
        if (e > fd_tol && first == x.size()) first = i;
        if (e > largest) largest = e, worst = i;
    }
    std::ostringstream why;
    if (first < x.size()) {
        why << "your " << name << attn::check::index_string(first, shape) << " is "
            << analytic.flat(first) << ", finite differences of the forward pass give "
            << numeric[first] << " (tolerance " << fd_tol << ")";
        if (worst != first)
            why << "; the largest difference is at " << attn::check::index_string(worst, shape)
                << ": " << analytic.flat(worst) << " against " << numeric[worst];
    }
    const bool every_element_within_tolerance = first == x.size();
    CHECK_MESSAGE(every_element_within_tolerance, why.str());
}

// The exercise's attention gradients against finite differences of the library's forward
// pass, for q and k (T, hs) of spread `size`, and random v and dout.
void check_attention_gradients(attn::Rng& rng, std::size_t T, std::size_t hs, float size) {
    Tensor2 q = rng.normal_tensor<2>({T, hs}, 0.0f, size), k = rng.normal_tensor<2>({T, hs}, 0.0f, size),
            v = rng.normal_tensor<2>({T, hs});
    const Tensor2 dout = rng.normal_tensor<2>({T, hs});
    const auto g = exercise::attention_backward(dout, q, k, v, head_forward(q, k, v).w);
    // Read as raw arrays below: the shapes first (each gradient is its input's shape).
    REQUIRE(attn::shape_of(g.dq) == attn::shape_of(q));
    REQUIRE(attn::shape_of(g.dk) == attn::shape_of(k));
    REQUIRE(attn::shape_of(g.dv) == attn::shape_of(v));
    auto loss = [&] { return weighted(head_forward(q, k, v).out, dout); };
    check_gradient("dq", q, g.dq, loss);
    check_gradient("dk", k, g.dk, loss);
    check_gradient("dv", v, g.dv, loss);
}

// The exercise's LayerNorm gradients against finite differences of the library's forward
// pass, for x (N, C) drawn around `centre` with spread `spread`, and random weight, bias
// and dout.
void check_layernorm_gradients(attn::Rng& rng, std::size_t N, std::size_t C, float centre,
                               float spread) {
    Tensor2 x = rng.normal_tensor<2>({N, C}, centre, spread);
    Tensor1 weight = rng.normal_tensor<1>({C}), bias = rng.normal_tensor<1>({C});
    const Tensor2 dout = rng.normal_tensor<2>({N, C});
    const auto g = exercise::layernorm_backward(dout, x, weight);
    // The finite differences read the gradients as raw arrays: their shapes first, so that a
    // wrong one (Tensor1({C}) is one element holding C) fails here instead of being read past.
    INFO("dx must be x's shape, dweight and dbias (C) = (" << C << ")");
    REQUIRE(attn::shape_of(g.dx) == attn::shape_of(x));
    REQUIRE(attn::shape_of(g.dweight) == attn::shape_of(weight));
    REQUIRE(attn::shape_of(g.dbias) == attn::shape_of(bias));
    Tensor2 y({N, C});
    std::vector<float> mean(N), rstd(N);
    auto loss = [&] {
        attn::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), weight.data(),
                                bias.data(), 1, static_cast<int>(N), static_cast<int>(C));
        return weighted(y, dout);
    };
    check_gradient("dx", x, g.dx, loss);
    check_gradient("dweight", weight, g.dweight, loss);
    check_gradient("dbias", bias, g.dbias, loss);
}

}  // namespace

TEST_CASE("a single token attends to itself: all of dout goes to its value") {
    const Tensor2 q = {{0.3f, -1.0f}}, k = {{2.0f, 0.5f}}, v = {{1.0f, 4.0f}};
    const Tensor2 w = {{1.0f}}, dout = {{0.7f, -0.2f}};
    const auto g = exercise::attention_backward(dout, q, k, v, w);
    // w is 1 whatever the scores: q and k get no gradient, and dv = dout. Exact, in fact:
    // ds = 1·(dw − 1·dw) = 0 and dv = 1·dout round nothing; 1e-7 is a margin.
    CHECK_CLOSE(g.dq, Tensor2({{0.0f, 0.0f}}), 1e-7);
    CHECK_CLOSE(g.dk, Tensor2({{0.0f, 0.0f}}), 1e-7);
    CHECK_CLOSE(g.dv, dout, 1e-7);
}

TEST_CASE("a two-token example matches gradients worked by hand") {
    // hs = 1, so the scale is 1. Row 1's scores are [0, ln 3]: weights [1/4, 3/4].
    // out[1] = 1/4·1 + 3/4·5 = 4; the loss is out[1], so dout = [[0], [1]].
    // dv = wᵀ·dout = [1/4, 3/4]; dw[1] = v = [1, 5]; Σ w·dw = 4;
    // ds[1] = w·(dw − 4) = [−3/4, 3/4]; dq[1] = ds[1]·k = 3/4·ln 3; dk = ds[1]ᵀ·q[1] = [−3/4, 3/4].
    const float ln3 = std::log(3.0f);
    const Tensor2 q = {{1.0f}, {1.0f}}, k = {{0.0f}, {ln3}}, v = {{1.0f}, {5.0f}};
    const Tensor2 w = {{1.0f, 0.0f}, {0.25f, 0.75f}}, dout = {{0.0f}, {1.0f}};
    INFO("by hand: dv = wᵀ·dout = [1/4, 3/4], dq[1] = ds[1]·k = 3/4·ln 3, "
         "dk = ds[1]ᵀ·q[1] = [-3/4, 3/4] with ds[1] = w·(dw − Σ w·dw) = [-3/4, 3/4]");
    const auto g = exercise::attention_backward(dout, q, k, v, w);
    // Exact in float32 but for dq's one product 0.75·ln 3, the same float product on both
    // sides: 1e-6 is a margin. dk = ds·q gives [0, 0] (off by 0.75), no Σ w·dw term
    // [0.25, 3.75]-sized ds, a flipped sign 1.5 away.
    CHECK_CLOSE(g.dv, Tensor2({{0.25f}, {0.75f}}), 1e-6);
    CHECK_CLOSE(g.dq, Tensor2({{0.0f}, {0.75f * ln3}}), 1e-6);
    CHECK_CLOSE(g.dk, Tensor2({{-0.75f}, {0.75f}}), 1e-6);
}

TEST_CASE("dq, dk and dv agree with finite differences of the forward pass") {
    attn::Rng rng(10);
    check_attention_gradients(rng, 6, 4, 1.0f);
}

TEST_CASE("heads wider than the sequence, longer sequences, and sharper weights") {
    // The check above has T = 6 tokens of hs = 4 channels and scores of size ~1: here
    // hs > T, T > hs, and q and k twice as large, whose weights are far from uniform.
    struct Case {
        std::size_t T, hs;
        float size;  // of q and k
    };
    attn::Rng rng(15);
    for (const Case& c : {Case{3, 8, 1.0f}, Case{9, 2, 1.0f}, Case{5, 3, 2.0f}}) {
        CAPTURE(c.T);
        CAPTURE(c.hs);
        CAPTURE(c.size);
        check_attention_gradients(rng, c.T, c.hs, c.size);
    }
}

TEST_CASE("the mask: the first query's gradient reaches the first key and value only") {
    attn::Rng rng(11);
    const Tensor2 q = rng.normal_tensor<2>({5, 3}), k = rng.normal_tensor<2>({5, 3}),
                  v = rng.normal_tensor<2>({5, 3});
    Tensor2 dout = xt::zeros<float>({5, 3});
    xt::view(dout, 0) = rng.normal_tensor<1>({3});  // only out[0] matters
    const auto g = exercise::attention_backward(dout, q, k, v, head_forward(q, k, v).w);
    // out[0] = v[0] exactly (token 0 sees only itself): dv[0] = dout[0], nothing else moves.
    // Exact: w's row 0 is [1, 0, …] and the other rows of dout are 0, so ds = 0 and
    // dv = 1·dout[0] round nothing; 1e-6 is a margin. dv = w·dout moves other rows by O(1).
    CHECK_CLOSE(g.dv, dout, 1e-6);
    CHECK_CLOSE(g.dq, xt::zeros<float>({5, 3}), 1e-6);
    CHECK_CLOSE(g.dk, xt::zeros<float>({5, 3}), 1e-6);
}

TEST_CASE("LayerNorm's gradients agree with finite differences of the forward pass") {
    attn::Rng rng(12);
    check_layernorm_gradients(rng, 4, 6, 0.5f, 2.0f);
}

TEST_CASE("LayerNorm's gradients for one row of two channels, and rows far from zero") {
    // The check above has N = 4 rows of C = 6 channels around 0.5: here a single row of
    // two channels (the fewest with a variance), and 3 rows of 16 around 5.
    struct Case {
        int N, C;
        float mean;  // of x
    };
    attn::Rng rng(16);
    for (const Case& c : {Case{1, 2, 0.0f}, Case{3, 16, 5.0f}}) {
        CAPTURE(c.N);
        CAPTURE(c.C);
        CAPTURE(c.mean);
        check_layernorm_gradients(rng, static_cast<std::size_t>(c.N), static_cast<std::size_t>(c.C), c.mean, 1.0f);
    }
}

TEST_CASE("LayerNorm keeps its epsilon: a row of tiny variance") {
    // x = [d, -d] with d = 0.001: mean 0, var = d² = 1e-6, rstd = 1/√(1e-6 + 1e-5) = 301.51134,
    // n = d·rstd = [0.3015113, -0.3015113]. weight 1, dout [1, 0]: dn = [1, 0], mean(dn) = 1/2,
    // mean(dn·n) = 0.3015113/2, dx = rstd·(dn − 1/2 − n·mean(dn·n)) = ±rstd/2·(1 − n²)
    // = ±137.05061 (calculator). Without the epsilon rstd is 1000, n = ±1 and dx = 0.
    INFO("rstd = 1/√(var + 1e-5) = 301.51 here (var = 1e-6): dx should be ±137.05, "
         "dweight [0.3015, -0]; leaving out the 1e-5 gives rstd = 1000");
    const Tensor2 x = {{0.001f, -0.001f}}, dout = {{1.0f, 0.0f}};
    const auto g = exercise::layernorm_backward(dout, x, Tensor1({1.0f, 1.0f}));
    // rstd is O(300): float rounding of the terms stays below 1e-3 of 137.
    CHECK_CLOSE(g.dx, Tensor2({{137.05061f, -137.05061f}}), 1e-3);
    CHECK_CLOSE(g.dweight, Tensor1({0.3015113f, 0.0f}), 1e-6);
}

TEST_CASE("LayerNorm's input gradient sums to zero over each row") {
    // Adding a constant to a row does not change LayerNorm's output, so the gradient has no
    // component along (1, 1, ..., 1).
    attn::Rng rng(13);
    const Tensor2 x = rng.normal_tensor<2>({3, 8}), dout = rng.normal_tensor<2>({3, 8});
    const auto g = exercise::layernorm_backward(dout, x, rng.normal_tensor<1>({8}));
    // Sums of 8 gradients of size O(1): float rounding stays below 1e-5.
    CHECK_CLOSE(xt::sum(g.dx, {1}), xt::zeros<float>({3}), 1e-5);
    CHECK_CLOSE(g.dbias, xt::sum(dout, {0}), 1e-5);
}

TEST_CASE("property: LayerNorm's gradients do not change when a row is shifted, by 1 or by 10^4") {
    // LayerNorm sees only x − mean, so shifting a row by c changes none of its gradients. Rows
    // of C = 4 quarter-valued entries (|x| ≤ 4) shifted by c up to ±10^4: x + c, the partial
    // sums (|Σ| < 2^15 + 16) and the mean (÷ 4) are exact in float, so x − mean is too, and a
    // two-pass solution computes the same numbers for every c. A solution whose rounding
    // grows with |c| (Welford's running mean, a mean times a rounded 1/C) carries ~u·|c| in
    // x − mean, times rstd ≲ 1 and ≤ C terms of |w·dout| ≤ 3 in dx, dweight: the bound asked
    // is 8u·(|c| + 4)·C·3, ≈ 0.06 at 10^4 against O(1) gradients (u = 2^-24). The variance as
    // E[x²] − mean² loses everything there: x² ≈ 10^8 is stored to ±4, the variance is noise.
    const std::size_t N = 3, C = 4;
    const Tensor2 x0 = {{-1.5f, 0.25f, 2.0f, 3.75f}, {4.0f, -4.0f, 0.5f, -0.75f}, {1.0f, 1.25f, -2.5f, 0.0f}};
    const Tensor1 weight = {0.5f, -1.5f, 1.0f, 2.0f};
    const Tensor2 dout = {{1.0f, -0.5f, 0.25f, 1.5f}, {-1.0f, 0.75f, 1.25f, -0.5f}, {0.5f, 1.0f, -1.5f, 0.25f}};
    const auto base = exercise::layernorm_backward(dout, x0, weight);
    const double u = std::ldexp(1.0, -24);
    for (float c : {1.0f, -3.0f, 100.0f, -1000.0f, 1e4f, -1e4f}) {
        Tensor2 x = x0;
        for (std::size_t i = 0; i < N; ++i)
            for (std::size_t j = 0; j < C; ++j) x(i, j) += c;
        const auto g = exercise::layernorm_backward(dout, x, weight);
        const double tol = 8 * u * (std::abs(c) + 4) * C * 3;
        CAPTURE(c);
        INFO("the gradients of x + c must be those of x: compute the variance as the mean of "
             "(x − mean)², not as E[x²] − mean², which loses everything when the row is far from 0");
        CHECK_CLOSE(g.dx, base.dx, tol);
        CHECK_CLOSE(g.dweight, base.dweight, tol);
        CHECK_CLOSE(g.dbias, base.dbias, tol);
    }
}

TEST_CASE("property: LayerNorm's gradients do not move when rows of any width are shifted by any offset") {
    // The check above with drawn rows: N from 1 to 3 (1 a quarter of the time) rows of C = 2,
    // 4 or 8 quarter-valued entries in [−4, 4] (entries 0 and 1 set to −3 and 3, so that
    // var ≥ 18/C ≥ 2.25 and rstd < 1), weights in [−2, 2] and dout in [−1.5, 1.5] (quarters:
    // |w·dout| ≤ 3), and an offset c (0, ±1 … ±10^4, rounded to a quarter). x + c, every
    // partial sum (< 2^24 quarters) and the mean (÷ C, a power of two) are exact in float,
    // so a two-pass solution computes the same x − mean for every c. One whose rounding grows
    // with |c| (Welford's running mean: C divisions each rounding by u·|c|) carries ≤ (C + 4)u·
    // (|c| + 4) in x − mean, times rstd < 1 and ≤ C terms of |w·dout| ≤ 3: the bound asked is
    // (C + 4)u·(|c| + 4)·C·3 (u = 2^-24). E[x²] − mean² loses everything at |c| ~ 10^4.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("layernorm_backward is invariant under a shift of its rows", [u] {
        const std::size_t N = attn::draw("N", attn::family::length(3)),
                          C = attn::draw("C", rc::gen::element<std::size_t>(2, 4, 8));
        const auto quarters = [](int lo, int hi) {
            return rc::gen::map(rc::gen::inRange(lo, hi + 1), [](int i) { return static_cast<float>(i) / 4.0f; });
        };
        auto xs = attn::draw("x (flat)", rc::gen::container<std::vector<float>>(N * C, quarters(-16, 16)));
        const auto ws = attn::draw("weight", rc::gen::container<std::vector<float>>(C, quarters(-8, 8)));
        const auto ds = attn::draw("dout (flat)", rc::gen::container<std::vector<float>>(N * C, quarters(-6, 6)));
        const float c = std::round(4.0f * attn::draw("offset", attn::family::offset())) / 4.0f;
        Tensor2 x0 = xt::zeros<float>({N, C}), dout = xt::zeros<float>({N, C});
        Tensor1 weight = xt::zeros<float>({C});
        std::copy(xs.begin(), xs.end(), x0.begin());
        std::copy(ds.begin(), ds.end(), dout.begin());
        std::copy(ws.begin(), ws.end(), weight.begin());
        for (std::size_t r = 0; r < N; ++r) x0(r, 0) = -3.0f, x0(r, 1) = 3.0f;
        const Tensor2 x = x0 + c;
        const auto base = exercise::layernorm_backward(dout, x0, weight);
        const auto g = exercise::layernorm_backward(dout, x, weight);
        const double tol = (static_cast<double>(C) + 4) * u * (std::abs(c) + 4) * static_cast<double>(C) * 3;
        const auto dx = attn::check::compare(g.dx, base.dx, tol);
        if (!dx.ok) RC_FAIL("dx of x + c against dx of x: " + dx.report);
        const auto dw = attn::check::compare(g.dweight, base.dweight, tol);
        if (!dw.ok) RC_FAIL("dweight of x + c against dweight of x: " + dw.report);
        const auto db = attn::check::compare(g.dbias, base.dbias, tol);
        if (!db.ok) RC_FAIL("dbias of x + c against dbias of x: " + db.report);
    });
}

TEST_CASE("property: at any offset and width, LayerNorm's gradients match the float64 formula on the same rows") {
    // The property above keeps its rows on a grid, where every mean is exact: there a variance
    // written Σ(x + mean)(x − mean) (that is, Σx² − C·mean²) is exact too and passes. Here rows
    // of N(c, 1) floats, c from the offsets (0, ±1 … ±10^4), C from 2 to 16, N from 1 to 3,
    // w in [−2, 2], dout N(0, 1), against the formula in float64 on the same floats.
    // A two-pass float solution: the mean's sum carries ≤ C·u·(|c| + 4) (u = 2^-24, |x| ≤
    // |c| + 4 for these rows), each x − mean that plus u|x − mean|; the variance then moves
    // relatively by ≤ 2·that/s + (C + 2)u, s = √(var + eps) = 1/rstd the row's spread, rstd by
    // half of it, and dx, which is rstd times dn minus two means of dn and dn·n, by ≤ 4× the
    // larger of the two through the chain: dx within 16·(C·u·(|c| + 4)/s + (C + 2)u), the
    // largest over the rows, of the size of its terms (3·rstd·|dn|:
    // dx itself may be far smaller, 0 up to rounding when C = 2), dweight = Σ dout·n of Σ|dout·n|. The product form's Σ(x + mean)(x − mean) adds 2·mean·Σ(x − mean), and Σ(x − mean)
    // is the mean's rounding times C: relatively 2|c|·(that rounding)/s² ≈ 2|c|·√C·u·|c|/s², 40
    // at |c| = 10^4 and s = 1, 0.4 at 10^3, where the bound is 0.15 and 0.015; both grow as
    // the spread shrinks, the product form's as 1/s², the bound as 1/s.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("layernorm_backward equals float64 LayerNorm backward at any offset", [u] {
        const std::size_t N = attn::draw("N", attn::family::length(3)),
                          C = attn::draw("C", rc::gen::inRange<std::size_t>(2, 17));
        const float c = attn::draw("offset", attn::family::offset());
        attn::Rng rng(attn::draw("seed", rc::gen::inRange<std::uint64_t>(0, 1000000)));
        const Tensor2 x = rng.normal_tensor<2>({N, C}) + c, dout = rng.normal_tensor<2>({N, C});
        Tensor1 weight = rng.normal_tensor<1>({C});
        weight = xt::clip(weight, -2.0f, 2.0f);
        const auto g = exercise::layernorm_backward(dout, x, weight);
        // The formula in float64 (eps = 1e-5 inside the square root, as the forward pass).
        xt::xtensor<double, 2> dx({N, C});
        xt::xtensor<double, 1> dw = xt::zeros<double>({C});
        // The size of the terms each result sums (a result may be far smaller: with C = 2,
        // dx is 0 up to rounding): rstd·|dn| for dx, Σ|dout·n| for dweight.
        double dx_terms = 0, dw_terms = 0, rel = 0;
        for (std::size_t r = 0; r < N; ++r) {
            double mean = 0, var = 0;
            for (std::size_t k = 0; k < C; ++k) mean += x(r, k);
            mean /= static_cast<double>(C);
            for (std::size_t k = 0; k < C; ++k) var += (x(r, k) - mean) * (x(r, k) - mean);
            var /= static_cast<double>(C);
            const double rstd = 1.0 / std::sqrt(var + 1e-5);
            // the row's bound, with its own spread √(var + eps) = 1/rstd
            rel = std::max(rel, 16 * (static_cast<double>(C) * u * (std::abs(c) + 4) * rstd +
                                      (static_cast<double>(C) + 2) * u));
            double dn_mean = 0, dnn_mean = 0;
            for (std::size_t k = 0; k < C; ++k) {
                const double n = (x(r, k) - mean) * rstd, dn = static_cast<double>(dout(r, k)) * weight(k);
                dn_mean += dn / static_cast<double>(C);
                dnn_mean += dn * n / static_cast<double>(C);
                dw(k) += static_cast<double>(dout(r, k)) * n;
                dx_terms = std::max(dx_terms, 3 * rstd * std::abs(dn));
                dw_terms += std::abs(static_cast<double>(dout(r, k)) * n);
            }
            for (std::size_t k = 0; k < C; ++k) {
                const double n = (x(r, k) - mean) * rstd, dn = static_cast<double>(dout(r, k)) * weight(k);
                dx(r, k) = rstd * (dn - dn_mean - n * dnn_mean);
            }
        }
        const auto cx = attn::check::compare(g.dx, dx, rel * dx_terms);
        if (!cx.ok) RC_FAIL("dx against the float64 formula: " + cx.report);
        const auto cw = attn::check::compare(g.dweight, dw, rel * dw_terms);
        if (!cw.ok) RC_FAIL("dweight against the float64 formula: " + cw.report);
    });
}

TEST_CASE("property: every gradient is linear in dout: dout times 2^e scales dq, dk, dv, dx, dweight and dbias exactly") {
    // The backward passes are linear in dout: every product with dout, and every sum of such
    // products, scales by 2^e (e from −8 to 8) exactly in float, so the gradients of
    // 2^e·dout must be 2^e times those of dout, bit for bit. Attention with T from 1 to 6
    // (1 a quarter of the time) and hs from 1 to 4, LayerNorm with N from 1 to 3 rows of C
    // from 2 to 6. A term that does not carry dout (a bias, a stray constant, the −Σ w·dw
    // term computed from something else) breaks it.
    attn::check_property("attention_backward and layernorm_backward are linear in dout", [] {
        const std::size_t T = attn::draw("T", attn::family::length(6)), hs = attn::draw("hs", rc::gen::inRange<std::size_t>(1, 5)),
                          N = attn::draw("N", attn::family::length(3)), C = attn::draw("C", rc::gen::inRange<std::size_t>(2, 7));
        const float scale = attn::draw("scale of dout", attn::family::scale());
        attn::Rng rng(attn::draw("seed", rc::gen::inRange<std::uint64_t>(0, 1000000)));
        const Tensor2 q = rng.normal_tensor<2>({T, hs}), k = rng.normal_tensor<2>({T, hs}), v = rng.normal_tensor<2>({T, hs}),
                      dout = rng.normal_tensor<2>({T, hs});
        const Tensor2 w = head_forward(q, k, v).w;
        const auto a = exercise::attention_backward(dout, q, k, v, w);
        const auto a2 = exercise::attention_backward(Tensor2(dout * scale), q, k, v, w);
        const auto same = [scale](const auto& scaled, const auto& plain) {
            RC_ASSERT(scaled.shape() == plain.shape());
            for (std::size_t i = 0; i < plain.size(); ++i) RC_ASSERT(scaled.flat(i) == plain.flat(i) * scale);
        };
        same(a2.dq, a.dq);
        same(a2.dk, a.dk);
        same(a2.dv, a.dv);
        const Tensor2 x = rng.normal_tensor<2>({N, C}), dy = rng.normal_tensor<2>({N, C});
        const Tensor1 weight = rng.normal_tensor<1>({C});
        const auto l = exercise::layernorm_backward(dy, x, weight);
        const auto l2 = exercise::layernorm_backward(Tensor2(dy * scale), x, weight);
        same(l2.dx, l.dx);
        same(l2.dweight, l.dweight);
        same(l2.dbias, l.dbias);
    });
}

TEST_CASE("shapes that do not fit are rejected with std::invalid_argument") {
    attn::Rng rng(14);
    const Tensor2 a = rng.normal_tensor<2>({4, 3}), w = rng.normal_tensor<2>({4, 4});
    CHECK_THROWS_AS(exercise::attention_backward(a, a, rng.normal_tensor<2>({4, 2}), a, w),
                    std::invalid_argument);
    CHECK_THROWS_AS(exercise::attention_backward(a, a, a, a, rng.normal_tensor<2>({4, 3})),
                    std::invalid_argument);
    INFO("v must be (T, hs) as q is; dout must be the output's shape, (T, hs)");
    CHECK_THROWS_AS(exercise::attention_backward(a, a, a, rng.normal_tensor<2>({4, 5}), w),
                    std::invalid_argument);
    CHECK_THROWS_AS(exercise::attention_backward(rng.normal_tensor<2>({4, 2}), a, a, a, w),
                    std::invalid_argument);
    // A v with a row more than q (T + 1, hs): dout·vᵀ is then (T, T + 1) and wᵀ·dout still
    // (T, hs), so the products accept it and dv comes out the wrong size; only a check of v's
    // shape refuses it.
    CHECK_THROWS_AS(exercise::attention_backward(a, a, a, rng.normal_tensor<2>({5, 3}), w),
                    std::invalid_argument);
    CHECK_THROWS_AS(exercise::layernorm_backward(a, a, rng.normal_tensor<1>({4})),
                    std::invalid_argument);
    CHECK_THROWS_AS(
        exercise::layernorm_backward(rng.normal_tensor<2>({3, 3}), a, rng.normal_tensor<1>({3})),
        std::invalid_argument);
}
