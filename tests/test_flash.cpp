#include "attn/check.hpp"
#include "attn/flash.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

using namespace attn;

namespace {

std::vector<float> normal_buffer(Rng& rng, std::size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = rng.normal();
    return x;
}

template <class A, class B>
double max_abs_diff(const A& a, const B& b) {
    REQUIRE(a.size() == b.size());
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
    return worst;
}

// q, k, v and an upstream gradient for one problem, N(0, 1).
struct Problem {
    AttentionShape shape;
    std::vector<float> q, k, v, dout;
    Problem(const AttentionShape& s, std::uint64_t seed) : shape(s) {
        Rng rng(seed);
        q = normal_buffer(rng, s.qkv_size());
        k = normal_buffer(rng, s.qkv_size());
        v = normal_buffer(rng, s.qkv_size());
        dout = normal_buffer(rng, s.qkv_size());
    }
};

// Checks a backward pass's dq, dk, dv for p against central differences of the float64
// forward pass. L = Σ dout ∘ out, so ∂L/∂x is the backward's gradient; with h = 1e-5 the
// difference quotient is good to about 1e-10 (truncation O(h²), rounding 1e-16/h).
template <class G>
void check_finite_differences(const Problem& p, const std::vector<G>& dq,
                              const std::vector<G>& dk, const std::vector<G>& dv,
                              double tolerance) {
    const std::size_t n = p.shape.qkv_size();
    const auto q = to_double(p.q.data(), n), k = to_double(p.k.data(), n),
               v = to_double(p.v.data(), n), dout = to_double(p.dout.data(), n);
    auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                    const std::vector<double>& vv) {
        std::vector<double> out(n);
        attention_reference_forward(out.data(), nullptr, qq.data(), kk.data(), vv.data(), p.shape);
        double sum = 0;
        for (std::size_t i = 0; i < n; ++i) sum += dout[i] * out[i];
        return sum;
    };
    const double h = 1e-5;
    for (int which = 0; which < 3; ++which) {
        const std::vector<G>& grad = which == 0 ? dq : which == 1 ? dk : dv;
        for (std::size_t i = 0; i < n; ++i) {
            auto qq = q, kk = k, vv = v;
            std::vector<double>& x = which == 0 ? qq : which == 1 ? kk : vv;
            x[i] += h;
            const double up = loss(qq, kk, vv);
            x[i] -= 2 * h;
            const double down = loss(qq, kk, vv);
            CAPTURE(which);
            CAPTURE(i);
            CHECK(std::fabs((up - down) / (2 * h) - static_cast<double>(grad[i])) <= tolerance);
        }
    }
}

}  // namespace

TEST_CASE("the online-softmax update reproduces numbers worked by hand") {
    // Row scores [1, 2 | 3] in two tiles, values v = [1, 0], [0, 1], [2, 2].
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
    float acc[2] = {0.0f, 0.0f};
    const float s1[2] = {1.0f, 2.0f}, v1[4] = {1, 0, 0, 1};
    online_softmax_update(m, l, acc, s1, v1, 2, 2);
    // m = 2, l = e^-1 + e^0, acc = e^-1·[1, 0] + e^0·[0, 1]
    CHECK(m == 2.0f);
    CHECK(l == doctest::Approx(1.3678794).epsilon(1e-6));
    CHECK(acc[0] == doctest::Approx(0.3678794).epsilon(1e-6));
    CHECK(acc[1] == doctest::Approx(1.0).epsilon(1e-6));
    const float s2[1] = {3.0f}, v2[2] = {2, 2};
    online_softmax_update(m, l, acc, s2, v2, 1, 2);
    // m = 3, everything so far rescaled by e^(2−3): l = 1.3678794·e^-1 + 1 = 1.5032147
    CHECK(m == 3.0f);
    CHECK(l == doctest::Approx(1.5032147).epsilon(1e-6));
    // acc / l is softmax([1, 2, 3]) · V = [1.4205125, 1.5752104]; m + ln l = ln Σ e^s.
    CHECK(acc[0] / l == doctest::Approx(1.4205125).epsilon(1e-6));
    CHECK(acc[1] / l == doctest::Approx(1.5752104).epsilon(1e-6));
    CHECK(m + std::log(l) == doctest::Approx(3.4076060).epsilon(1e-6));
}

TEST_CASE("a fully masked tile leaves an empty online-softmax state empty, with no NaN") {
    const float inf = std::numeric_limits<float>::infinity();
    float m = -inf, l = 0.0f, acc[1] = {0.0f};
    const float masked[2] = {-inf, -inf}, v[2] = {5, 7};
    online_softmax_update(m, l, acc, masked, v, 2, 1);
    CHECK(m == -inf);
    CHECK(l == 0.0f);
    CHECK(acc[0] == 0.0f);
    const float later[1] = {0.5f};
    online_softmax_update(m, l, acc, later, v, 1, 1);  // then one visible key
    CHECK(acc[0] / l == doctest::Approx(5.0));
}

TEST_CASE("the online softmax does not overflow on large scores") {
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f, acc[1] = {0.0f};
    const float s1[1] = {1000.0f}, s2[1] = {1001.0f}, v1[1] = {0.0f}, v2[1] = {1.0f};
    online_softmax_update(m, l, acc, s1, v1, 1, 1);
    online_softmax_update(m, l, acc, s2, v2, 1, 1);
    // softmax([1000, 1001]) = [1/(1+e), e/(1+e)]: the output is e/(1+e) = 0.7310586
    CHECK(acc[0] / l == doctest::Approx(0.7310586).epsilon(1e-6));
}

TEST_CASE("tiled attention equals plain attention within 1e-6") {
    struct Case {
        std::size_t T, hs, rows, cols;
        bool causal;
    };
    // T a multiple of the tiles, not a multiple, smaller than one tile, unequal tiles.
    const Case cases[] = {{64, 16, 16, 16, true},  {64, 16, 16, 16, false}, {100, 32, 16, 32, true},
                          {100, 32, 32, 16, false}, {7, 8, 16, 16, true},    {129, 64, 64, 64, true},
                          {129, 64, 64, 64, false}, {33, 4, 5, 3, true},     {1, 8, 4, 4, true}};
    for (const Case& c : cases) {
        CAPTURE(c.T);
        CAPTURE(c.hs);
        CAPTURE(c.rows);
        CAPTURE(c.cols);
        CAPTURE(c.causal);
        const AttentionShape shape{2, 3, c.T, c.hs, c.causal};
        const Problem p(shape, 11 + c.T);
        std::vector<float> out_plain(shape.qkv_size()), lse_plain(shape.rows());
        std::vector<float> out_tiled(shape.qkv_size()), lse_tiled(shape.rows());
        attention_plain_forward(out_plain.data(), lse_plain.data(), p.q.data(), p.k.data(),
                                p.v.data(), shape);
        attention_flash_forward(out_tiled.data(), lse_tiled.data(), p.q.data(), p.k.data(),
                                p.v.data(), shape, {c.rows, c.cols});
        // Same products summed in another order; outputs are convex mixes of N(0,1) values,
        // so float32 rounding (6e-8 relative) stays far below 1e-6.
        CHECK(max_abs_diff(out_tiled, out_plain) <= 1e-6);
        // lse ≈ ln T + O(1) ≤ 6: a few float32 ulps of it.
        CHECK(max_abs_diff(lse_tiled, lse_plain) <= 2e-6);
    }
}

TEST_CASE("plain float32 attention agrees with the float64 reference") {
    const AttentionShape shape{1, 2, 50, 16, true};
    const Problem p(shape, 3);
    std::vector<float> out(shape.qkv_size());
    attention_plain_forward(out.data(), nullptr, p.q.data(), p.k.data(), p.v.data(), shape);
    std::vector<double> out_ref(shape.qkv_size());
    attention_reference_forward(out_ref.data(), nullptr, to_double(p.q.data(), p.q.size()).data(),
                                to_double(p.k.data(), p.k.size()).data(),
                                to_double(p.v.data(), p.v.size()).data(), shape);
    // float32 rounding of sums of 16 and 50 O(1) terms.
    CHECK(max_abs_diff(out, out_ref) <= 1e-6);
}

TEST_CASE("causal attention: the first query sees only itself, so its output is v_0") {
    const AttentionShape shape{1, 1, 5, 4, true};
    const Problem p(shape, 4);
    std::vector<float> out(shape.qkv_size()), lse(shape.rows());
    attention_flash_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), shape,
                            {2, 2});
    for (std::size_t d = 0; d < 4; ++d) CHECK(out[d] == doctest::Approx(p.v[d]).epsilon(1e-6));
}

TEST_CASE("the float64 reference backward agrees with finite differences") {
    for (bool causal : {true, false}) {
        CAPTURE(causal);
        const AttentionShape shape{1, 2, 6, 4, causal};
        const Problem p(shape, 5);
        const std::size_t n = shape.qkv_size();
        const auto q = to_double(p.q.data(), n), k = to_double(p.k.data(), n),
                   v = to_double(p.v.data(), n), dout = to_double(p.dout.data(), n);
        std::vector<double> dq(n), dk(n), dv(n);
        attention_reference_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                     k.data(), v.data(), shape);
        check_finite_differences(p, dq, dk, dv, 1e-8);
    }
}

TEST_CASE("tiled backward equals plain backward and the float64 reference") {
    struct Case {
        std::size_t T, hs, rows, cols;
        bool causal;
    };
    const Case cases[] = {{64, 16, 16, 16, true}, {100, 32, 16, 32, true}, {100, 32, 32, 16, false},
                          {7, 8, 16, 16, true},   {33, 4, 5, 3, true},     {129, 64, 64, 64, true}};
    for (const Case& c : cases) {
        CAPTURE(c.T);
        CAPTURE(c.hs);
        CAPTURE(c.causal);
        const AttentionShape shape{2, 2, c.T, c.hs, c.causal};
        const Problem p(shape, 21 + c.T);
        const std::size_t n = shape.qkv_size();
        std::vector<float> out(n), lse(shape.rows());
        attention_flash_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), shape,
                                {c.rows, c.cols});
        std::vector<float> dq(n), dk(n), dv(n), dq_plain(n), dk_plain(n), dv_plain(n);
        attention_flash_backward(dq.data(), dk.data(), dv.data(), p.dout.data(), p.q.data(),
                                 p.k.data(), p.v.data(), out.data(), lse.data(), shape,
                                 {c.rows, c.cols});
        attention_plain_backward(dq_plain.data(), dk_plain.data(), dv_plain.data(), p.dout.data(),
                                 p.q.data(), p.k.data(), p.v.data(), shape);
        std::vector<double> dq_ref(n), dk_ref(n), dv_ref(n);
        attention_reference_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(),
                                     to_double(p.dout.data(), n).data(),
                                     to_double(p.q.data(), n).data(), to_double(p.k.data(), n).data(),
                                     to_double(p.v.data(), n).data(), shape);
        // Gradients are sums over up to T keys (or queries) of O(1) products, ~|grad| ≤ 10:
        // float32 rounding of such sums is ~1e-6; D_i = dout·out in place of Σ P dP adds the
        // forward's rounding. 1e-5 leaves room without hiding a wrong term (those are O(0.1)).
        CHECK(max_abs_diff(dq, dq_plain) <= 1e-5);
        CHECK(max_abs_diff(dk, dk_plain) <= 1e-5);
        CHECK(max_abs_diff(dv, dv_plain) <= 1e-5);
        // FlashAttention's rule: the tiled version's error against float64 at most twice the
        // plain version's (with a floor of a few ulps, see passes_flash_rule).
        for (int which = 0; which < 3; ++which) {
            CAPTURE(which);
            const auto& tiled = which == 0 ? dq : which == 1 ? dk : dv;
            const auto& plain = which == 0 ? dq_plain : which == 1 ? dk_plain : dv_plain;
            const auto& ref = which == 0 ? dq_ref : which == 1 ? dk_ref : dv_ref;
            const double tiled_error = max_abs_error(tiled.data(), ref.data(), n);
            const double plain_error = max_abs_error(plain.data(), ref.data(), n);
            CAPTURE(tiled_error);
            CAPTURE(plain_error);
            CHECK(passes_flash_rule(tiled_error, plain_error, max_abs(ref.data(), n)));
        }
    }
}

TEST_CASE("tiled backward agrees with finite differences of the float64 forward") {
    const AttentionShape shape{1, 1, 9, 4, true};
    const Problem p(shape, 6);
    const std::size_t n = shape.qkv_size();
    std::vector<float> out(n), lse(shape.rows()), dq(n), dk(n), dv(n);
    attention_flash_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), shape,
                            {4, 3});
    attention_flash_backward(dq.data(), dk.data(), dv.data(), p.dout.data(), p.q.data(),
                             p.k.data(), p.v.data(), out.data(), lse.data(), shape, {4, 3});
    // The float32 gradient is good to ~1e-6.
    check_finite_differences(p, dq, dk, dv, 1e-5);
}

TEST_CASE("zero sizes and zero tiles are rejected with std::invalid_argument") {
    std::vector<float> buf(64), lse(8);
    const AttentionShape zero_T{1, 1, 0, 8, true};
    CHECK_THROWS_AS(attention_plain_forward(buf.data(), nullptr, buf.data(), buf.data(),
                                            buf.data(), zero_T),
                    std::invalid_argument);
    const AttentionShape ok{1, 1, 8, 8, true};
    CHECK_THROWS_AS(attention_flash_forward(buf.data(), lse.data(), buf.data(), buf.data(),
                                            buf.data(), ok, {0, 4}),
                    std::invalid_argument);
}

TEST_CASE("the tiled forward's working set does not grow with T") {
    const FlashBlocks blocks{64, 64};
    CHECK(flash_working_floats(blocks, 64) == 64 * 64 + 64 * 64 + 2 * 64);
    CHECK(plain_score_floats(4096) == 4096u * 4096u);
}

TEST_CASE("FlashAttention's rule: at most twice the plain error, with a floor of a few ulps") {
    CHECK(passes_flash_rule(2e-6, 1e-6, 1.0));
    CHECK_FALSE(passes_flash_rule(3e-6, 1e-6, 1.0));
    CHECK(passes_flash_rule(4e-7, 0.0, 1.0));   // 4 ulps of 1.0 ≈ 4.8e-7
    CHECK_FALSE(passes_flash_rule(6e-7, 0.0, 1.0));
    const float a[3] = {1.0f, 2.0f, 3.0f};
    const double ref[3] = {1.0, 2.5, -3.0};
    CHECK(max_abs_error(a, ref, 3) == 6.0);
    CHECK(max_abs(ref, 3) == 3.0);
}

namespace {

// The fast CPU version against the plain one and the float64 reference, forward and
// backward, under FlashAttention's rule.
void check_fast_against_reference(const AttentionShape& shape, std::uint64_t seed) {
    const Problem p(shape, seed);
    const std::size_t n = shape.qkv_size();
    std::vector<float> out(n), lse(shape.rows()), out_plain(n), lse_plain(shape.rows());
    attention_fast_forward(out.data(), lse.data(), p.q.data(), p.k.data(), p.v.data(), shape);
    attention_plain_forward(out_plain.data(), lse_plain.data(), p.q.data(), p.k.data(), p.v.data(),
                            shape);
    const auto q = to_double(p.q.data(), n), k = to_double(p.k.data(), n),
               v = to_double(p.v.data(), n), dout = to_double(p.dout.data(), n);
    std::vector<double> out_ref(n), lse_ref(shape.rows());
    attention_reference_forward(out_ref.data(), lse_ref.data(), q.data(), k.data(), v.data(), shape);
    {
        const double fast_error = max_abs_error(out.data(), out_ref.data(), n);
        const double plain_error = max_abs_error(out_plain.data(), out_ref.data(), n);
        CAPTURE(fast_error);
        CAPTURE(plain_error);
        CHECK(passes_flash_rule(fast_error, plain_error, max_abs(out_ref.data(), n)));
        // lse = m + ln Σ_j e^(s_j − m), the scores s_j = q·k_j/√hs summed by sgemm in the BLAS
        // kernel's order: |Δs_j| ≤ γ_hs Σ_d |q_d k_jd|/√hs (Higham, γ_n = n u/(1 − n u),
        // u = 2^-24), and lse moves by at most the largest |Δs_j|; the sum of T terms (each
        // with exp_approx's 2 ulp) is off by a relative γ_T + 4u, which ln turns into an
        // absolute one; lse itself rounds by u |lse|, m + ln l by two more. The bound is
        // computed per row from the data: ~5e-5 at hs = 128 (Σ|q k|/√hs ≈ 7), ~1e-5 at 64.
        // A wrong lse (a missing max, scale or term) is off by O(0.1) or more.
        const double u = std::ldexp(1.0, -24);
        auto gamma = [u](double terms) { return terms * u / (1.0 - terms * u); };
        const double scale = 1.0 / std::sqrt(static_cast<double>(shape.hs));
        double excess = 0.0;  // the largest |lse − lse_ref| over its row's bound (pass: ≤ 1)
        for (std::size_t row = 0; row < shape.rows(); ++row) {
            const std::size_t bh = row / shape.T, i = row % shape.T;
            const std::size_t keys = shape.causal ? i + 1 : shape.T;
            const double* qi = q.data() + row * shape.hs;
            double worst_score = 0.0;  // max_j Σ_d |q_d k_jd| / √hs
            for (std::size_t j = 0; j < keys; ++j) {
                const double* kj = k.data() + (bh * shape.T + j) * shape.hs;
                double sum = 0.0;
                for (std::size_t d = 0; d < shape.hs; ++d) sum += std::fabs(qi[d] * kj[d]);
                worst_score = std::max(worst_score, sum * scale);
            }
            const double bound = gamma(static_cast<double>(shape.hs)) * worst_score +
                                 gamma(static_cast<double>(keys)) + 4.0 * u +
                                 3.0 * u * std::fabs(lse_ref[row]);
            excess = std::max(excess, std::fabs(static_cast<double>(lse[row]) - lse_ref[row]) / bound);
        }
        CAPTURE(excess);
        CHECK(excess <= 1.0);
    }
    std::vector<float> dq(n), dk(n), dv(n), dq_plain(n), dk_plain(n), dv_plain(n);
    attention_fast_backward(dq.data(), dk.data(), dv.data(), p.dout.data(), p.q.data(), p.k.data(),
                            p.v.data(), out.data(), lse.data(), shape);
    attention_plain_backward(dq_plain.data(), dk_plain.data(), dv_plain.data(), p.dout.data(),
                             p.q.data(), p.k.data(), p.v.data(), shape);
    std::vector<double> dq_ref(n), dk_ref(n), dv_ref(n);
    attention_reference_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout.data(), q.data(),
                                 k.data(), v.data(), shape);
    for (int which = 0; which < 3; ++which) {
        CAPTURE(which);
        const auto& fast = which == 0 ? dq : which == 1 ? dk : dv;
        const auto& plain = which == 0 ? dq_plain : which == 1 ? dk_plain : dv_plain;
        const auto& ref = which == 0 ? dq_ref : which == 1 ? dk_ref : dv_ref;
        const double fast_error = max_abs_error(fast.data(), ref.data(), n);
        const double plain_error = max_abs_error(plain.data(), ref.data(), n);
        CAPTURE(fast_error);
        CAPTURE(plain_error);
        if (max_abs(ref.data(), n) == 0.0) {
            // T = 1: P ≡ 1, so dq = dk = 0 exactly, and what the fast backward leaves is
            // rounding: dS = P (dP − D)/√hs with dP = Σ_d dout_d v_d summed by sgemm (in the
            // BLAS kernel's order) and D = Σ_d dout_d out_d by a loop, out = v to a few ulps.
            // With u = 2^-24 and n = hs, Higham's bound |fl(Σ a_i b_i) − Σ a_i b_i| ≤
            // γ_n Σ|a_i b_i|, γ_n = n u/(1 − n u), for each sum, and |out_d − v_d| ≤ 4u |v_d|
            // (a product by P and a division by l, each ≤ 2u with exp_approx's 2 ulp):
            //   |dP − D| ≤ (2γ_hs + 4u(1 + γ_hs)) Σ_d |dout_d v_d|,
            // then dq_d = dS k_d and dk_d = dS q_d add a rounding each (and P ≤ 1 + 4u).
            // The bound is computed per row from the data in double: at hs = 128 it is ~3e-4
            // (Σ|dout v| ≈ 100, |k| ≲ 3, 1/√hs ≈ 0.09); one kernel's order gave 1.8e-6,
            // another's 0. A wrong dS (D left out, or out in place of dout) is O(1).
            REQUIRE(which < 2);
            const double u = std::ldexp(1.0, -24), nu = static_cast<double>(shape.hs) * u;
            const double gamma = nu / (1.0 - nu);
            const double scale = 1.0 / std::sqrt(static_cast<double>(shape.hs));
            const std::vector<float>& other = which == 0 ? p.k : p.q;  // dq = dS k, dk = dS q
            double excess = 0.0;  // the largest |gradient| over its row's bound (pass: ≤ 1)
            for (std::size_t row = 0; row < shape.rows(); ++row) {
                double dot = 0.0, largest = 0.0;  // Σ|dout_d v_d| and max |k_d| (or |q_d|)
                for (std::size_t d = 0; d < shape.hs; ++d) {
                    const std::size_t i = row * shape.hs + d;
                    dot += std::fabs(static_cast<double>(p.dout[i]) * p.v[i]);
                    largest = std::max(largest, std::fabs(static_cast<double>(other[i])));
                }
                const double bound = (1.0 + 8.0 * u) * scale *
                                     (2.0 * gamma + 4.0 * u * (1.0 + gamma)) * dot * largest *
                                     (1.0 + 2.0 * u);
                for (std::size_t d = 0; d < shape.hs; ++d) {
                    const double g = std::fabs(static_cast<double>(fast[row * shape.hs + d]));
                    excess = std::max(excess, g / bound);
                }
            }
            CAPTURE(excess);
            CHECK(excess <= 1.0);
            continue;
        }
        CHECK(passes_flash_rule(fast_error, plain_error, max_abs(ref.data(), n)));
    }
}

}  // namespace

TEST_CASE("the fast CPU attention passes FlashAttention's rule, forward and backward") {
    // Tiles are 128 queries by 128 keys: T below one tile, a multiple of it, one past a
    // tile, and not a multiple; both head sizes the GPU kernels take.
    for (std::size_t T : {1, 37, 128, 129, 300}) {
        for (std::size_t hs : {64, 128}) {
            for (bool causal : {true, false}) {
                CAPTURE(T);
                CAPTURE(hs);
                CAPTURE(causal);
                check_fast_against_reference({2, 2, T, hs, causal}, 31 + T + hs);
            }
        }
    }
}

TEST_CASE("the fast CPU attention gives the same result on 1 and 2 threads") {
    // Two threads split the query tiles (forward) and the key tiles (backward, each thread
    // adding into its own dq); the sums differ only in their order.
    const AttentionShape shape{1, 3, 300, 64, true};
    const Problem p(shape, 77);
    const std::size_t n = shape.qkv_size();
    std::vector<float> out[2], lse[2], dq[2], dk[2], dv[2];
    const int before = num_threads();
    for (int t = 0; t < 2; ++t) {
        set_num_threads(t + 1);
        out[t].resize(n), lse[t].resize(shape.rows()), dq[t].resize(n), dk[t].resize(n),
            dv[t].resize(n);
        attention_fast_forward(out[t].data(), lse[t].data(), p.q.data(), p.k.data(), p.v.data(),
                               shape);
        attention_fast_backward(dq[t].data(), dk[t].data(), dv[t].data(), p.dout.data(),
                                p.q.data(), p.k.data(), p.v.data(), out[t].data(), lse[t].data(),
                                shape);
    }
    set_num_threads(before);
    CHECK(max_abs_diff(out[0], out[1]) == 0.0);  // each row is computed by one thread alone
    CHECK(max_abs_diff(lse[0], lse[1]) == 0.0);
    CHECK(max_abs_diff(dk[0], dk[1]) == 0.0);  // each key tile too
    CHECK(max_abs_diff(dv[0], dv[1]) == 0.0);
    // dq: each of the 3 key tiles' products p_t = Σ_{j in t} dS_ij k_j is computed as
    // before, and only their sum is taken in another order (1 thread: (p0 + p1) + p2; 2
    // threads: (p0 + p2) + p1). Two sums of the same 3 terms differ by at most
    // 2γ_2 Σ_t |p_t| (Higham, γ_n = n u/(1 − n u), u = 2^-24), and Σ_t |p_t| ≤
    // Σ_j |dS_ij| |k_jd| with dS_ij = P_ij (dP_ij − D_i)/√hs, computed here in double (a
    // factor 1 + 2^-10 for the float32 p_t's own rounding): ~5e-6 at the largest element.
    // A key tile added twice or left out moves dq by O(1).
    {
        const double u = std::ldexp(1.0, -24), two_gamma = 2.0 * 2.0 * u / (1.0 - 2.0 * u);
        const std::size_t T = shape.T, hs = shape.hs;
        const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
        std::vector<double> p_row(T), dp_row(T);
        double excess = 0.0;  // the largest |dq₁ − dq₂| over its bound (pass: ≤ 1)
        for (std::size_t bh = 0; bh < shape.B * shape.NH; ++bh) {
            const float* q = p.q.data() + bh * T * hs;
            const float* k = p.k.data() + bh * T * hs;
            const float* v = p.v.data() + bh * T * hs;
            const float* dout = p.dout.data() + bh * T * hs;
            for (std::size_t i = 0; i < T; ++i) {
                double m = -INFINITY, l = 0.0, delta = 0.0;
                for (std::size_t j = 0; j <= i; ++j) {  // causal
                    double s = 0.0, dp = 0.0;
                    for (std::size_t d = 0; d < hs; ++d) {
                        s += static_cast<double>(q[i * hs + d]) * k[j * hs + d];
                        dp += static_cast<double>(dout[i * hs + d]) * v[j * hs + d];
                    }
                    p_row[j] = s * scale;
                    dp_row[j] = dp;
                    m = std::max(m, p_row[j]);
                }
                for (std::size_t j = 0; j <= i; ++j) l += (p_row[j] = std::exp(p_row[j] - m));
                for (std::size_t j = 0; j <= i; ++j) delta += (p_row[j] /= l) * dp_row[j];  // D_i
                for (std::size_t d = 0; d < hs; ++d) {
                    double terms = 0.0;  // Σ_j |dS_ij| |k_jd|
                    for (std::size_t j = 0; j <= i; ++j)
                        terms += p_row[j] * std::fabs(dp_row[j] - delta) * scale * std::fabs(k[j * hs + d]);
                    const std::size_t e = (bh * T + i) * hs + d;
                    const double gap = std::fabs(static_cast<double>(dq[0][e]) - dq[1][e]);
                    const double bound = two_gamma * terms * (1.0 + std::ldexp(1.0, -10));
                    if (gap > 0.0) excess = std::max(excess, gap / bound);
                }
            }
        }
        CAPTURE(excess);
        CHECK(excess <= 1.0);
    }
}

TEST_CASE("the fast CPU attention rejects zero sizes with std::invalid_argument") {
    std::vector<float> buf(64), lse(8);
    const AttentionShape zero_hs{1, 1, 8, 0, true};
    CHECK_THROWS_AS(attention_fast_forward(buf.data(), lse.data(), buf.data(), buf.data(),
                                           buf.data(), zero_hs),
                    std::invalid_argument);
    CHECK_THROWS_AS(attention_fast_backward(buf.data(), buf.data(), buf.data(), buf.data(),
                                            buf.data(), buf.data(), buf.data(), buf.data(),
                                            lse.data(), zero_hs),
                    std::invalid_argument);
}
