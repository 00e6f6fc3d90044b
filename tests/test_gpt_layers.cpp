// Every layer's backward pass against central finite differences of its forward pass.
#include "attn/gpt_layers.hpp"

#include "attn/gradcheck.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

using namespace attn;

namespace {

// Tolerance for the layer checks: the objective Σ w·out is a double sum of float outputs, each
// off by about 6e-8 relative, so with ~100 outputs of size O(1) it carries an error of about
// 1e-6; divided by the step 2h = 2e-2 that is ~5e-5 in the numeric derivative. The central
// difference's truncation error, h²/6 · f''' ≈ 2e-5 for O(1) third derivatives, adds to it.
// 1e-3 leaves room above both and is still far below a wrong gradient's O(0.1-1) error.
constexpr float h = 1e-2f;
constexpr double tol = 1e-3;

void check_gradient(const char* what, float* x, const std::vector<float>& analytic,
                    const std::function<double()>& objective) {
    const GradCheck r = finite_difference(x, analytic.data(), analytic.size(), h, objective);
    MESSAGE(std::string(what) << ": max |analytic - numeric| = " << r.max_abs_error
                              << " (largest gradient " << r.max_abs_grad << ")");
    CHECK_MESSAGE(r.max_abs_error <= tol, what);
    CHECK(r.max_abs_grad > 1e-3);  // the check compared something
}

}  // namespace

TEST_CASE("the embedding's backward scatters the gradient into the rows it read") {
    const int B = 2, T = 3, C = 4, V = 5;
    Rng rng(1);
    std::vector<float> wte = normal_vector(rng, V * C), wpe = normal_vector(rng, T * C);
    const std::vector<int> inp = {1, 3, 1, 0, 4, 1};  // token 1 three times, token 2 never
    std::vector<float> out(B * T * C), w = normal_vector(rng, out.size());
    std::vector<float> dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
    encoder_backward(dwte.data(), dwpe.data(), w.data(), inp.data(), B, T, C);
    auto objective = [&] {
        encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
        return weighted_sum(out, w);
    };
    check_gradient("dwte", wte.data(), dwte, objective);
    check_gradient("dwpe", wpe.data(), dwpe, objective);
    for (int i = 0; i < C; ++i) CHECK(dwte[2 * C + i] == 0.0f);  // an unused token gets none
}

TEST_CASE("LayerNorm's backward agrees with finite differences, with and without bias") {
    const int B = 2, T = 3, C = 8;
    Rng rng(2);
    std::vector<float> inp = normal_vector(rng, B * T * C, 2.0f);
    std::vector<float> weight = normal_vector(rng, C), bias = normal_vector(rng, C);
    for (bool with_bias : {true, false}) {
        CAPTURE(with_bias);
        const float* b = with_bias ? bias.data() : nullptr;
        std::vector<float> out(inp.size()), mean(B * T), rstd(B * T);
        std::vector<float> w = normal_vector(rng, out.size());
        layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), b, B, T,
                          C);
        std::vector<float> dinp(inp.size(), 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
        layernorm_backward(dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr,
                           w.data(), inp.data(), weight.data(), mean.data(), rstd.data(), B, T, C);
        auto objective = [&] {
            layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), b, B,
                              T, C);
            return weighted_sum(out, w);
        };
        check_gradient("dinp", inp.data(), dinp, objective);
        check_gradient("dweight", weight.data(), dweight, objective);
        if (with_bias) check_gradient("dbias", bias.data(), dbias, objective);
    }
}

TEST_CASE("the linear map's backward agrees with finite differences, with and without bias") {
    const int N = 5, C = 6, OC = 7;
    Rng rng(3);
    std::vector<float> inp = normal_vector(rng, N * C), weight = normal_vector(rng, OC * C);
    std::vector<float> bias = normal_vector(rng, OC);
    for (bool with_bias : {true, false}) {
        CAPTURE(with_bias);
        const float* b = with_bias ? bias.data() : nullptr;
        std::vector<float> out(N * OC), w = normal_vector(rng, out.size());
        std::vector<float> dinp(inp.size(), 0.0f), dweight(weight.size(), 0.0f), dbias(OC, 0.0f);
        matmul_backward(dinp.data(), dweight.data(), with_bias ? dbias.data() : nullptr, w.data(),
                        inp.data(), weight.data(), N, C, OC);
        auto objective = [&] {
            matmul_forward(out.data(), inp.data(), weight.data(), b, N, C, OC);
            return weighted_sum(out, w);
        };
        check_gradient("dinp", inp.data(), dinp, objective);
        check_gradient("dweight", weight.data(), dweight, objective);
        if (with_bias) check_gradient("dbias", bias.data(), dbias, objective);
    }
}

TEST_CASE("the linear map computes inp times weight transposed plus bias") {
    // out = [1 2] · [[1 0] [0 1] [1 1]]ᵀ + [0.5 0 -1] = [1.5 2 2], worked by hand
    const std::vector<float> inp = {1, 2}, weight = {1, 0, 0, 1, 1, 1}, bias = {0.5f, 0, -1};
    std::vector<float> out(3);
    matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), 1, 2, 3);
    CHECK(out == std::vector<float>{1.5f, 2.0f, 2.0f});
}

TEST_CASE("causal attention's backward agrees with finite differences") {
    const int B = 2, T = 5, C = 8, NH = 2;
    Rng rng(4);
    std::vector<float> qkv = normal_vector(rng, B * T * 3 * C);
    std::vector<float> out(B * T * C), att(B * NH * T * T), scratch(att.size());
    std::vector<float> w = normal_vector(rng, out.size());
    attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, B, T, C, NH);
    std::vector<float> dqkv(qkv.size(), 0.0f);
    attention_backward(dqkv.data(), scratch.data(), w.data(), qkv.data(), att.data(), nullptr, 0.0f,
                       B, T, C, NH);
    check_gradient("dqkv", qkv.data(), dqkv, [&] {
        attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, B, T, C, NH);
        return weighted_sum(out, w);
    });
    // The first token attends to itself only: its output is its own value, exactly (weight
    // e^0·(1/1) = 1, and 1·v rounds nothing); epsilon(1e-6) only gives a margin.
    for (int i = 0; i < C; ++i) CHECK(out[i] == doctest::Approx(qkv[2 * C + i]).epsilon(1e-6));
}

TEST_CASE("a dropout mask depends on each element's index alone, not on how the tensor is split") {
    // The model runs slices of the batch on different threads, and the GPU one thread per
    // element: the mask of elements [first, first + n) handed to one call must be the
    // whole tensor's mask at those indices.
    const int N = 1000, cut = 337;
    const float p = 0.4f;
    std::vector<float> whole(N, 1.0f), split(N, 1.0f), mask(N), mask_split(N);
    dropout_forward(whole.data(), mask.data(), p, DropoutSite{123, 0}, N);
    dropout_forward(split.data(), mask_split.data(), p, DropoutSite{123, 0}, cut);
    dropout_forward(split.data() + cut, mask_split.data() + cut, p, DropoutSite{123, cut}, N - cut);
    CHECK(split == whole);
    CHECK(mask_split == mask);
    // And another seed gives another mask.
    std::vector<float> other(N, 1.0f), other_mask(N);
    dropout_forward(other.data(), other_mask.data(), p, DropoutSite{124, 0}, N);
    CHECK(other != whole);
}

TEST_CASE("attention's backward with dropout agrees with finite differences for a fixed mask") {
    const int B = 1, T = 6, C = 8, NH = 2;
    const float p = 0.3f;
    Rng rng(5);
    std::vector<float> qkv = normal_vector(rng, B * T * 3 * C);
    std::vector<float> out(B * T * C), att(B * NH * T * T), att_dropped(att.size());
    std::vector<float> scratch(att.size()), w = normal_vector(rng, out.size());
    const DropoutSite site{99, 0};  // the same mask on every evaluation
    auto forward = [&] {
        attention_forward(out.data(), att.data(), att_dropped.data(), qkv.data(), p, &site, B, T,
                          C, NH);
    };
    forward();
    int dropped = 0;
    for (std::size_t i = 0; i < att.size(); ++i) dropped += att[i] > 0.0f && att_dropped[i] == 0.0f;
    CHECK(dropped > 0);
    std::vector<float> dqkv(qkv.size(), 0.0f);
    attention_backward(dqkv.data(), scratch.data(), w.data(), qkv.data(), att.data(),
                       att_dropped.data(), p, B, T, C, NH);
    check_gradient("dqkv", qkv.data(), dqkv, [&] {
        forward();
        return weighted_sum(out, w);
    });
}

TEST_CASE("attention weights are zero above the diagonal and each row sums to one") {
    const int B = 1, T = 4, C = 4, NH = 2;
    Rng rng(6);
    std::vector<float> qkv = normal_vector(rng, B * T * 3 * C, 3.0f);
    std::vector<float> out(B * T * C), att(B * NH * T * T);
    attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, B, T, C, NH);
    for (int h = 0; h < NH; ++h) {
        for (int t = 0; t < T; ++t) {
            CAPTURE(h);
            CAPTURE(t);
            double sum = 0.0;
            for (int j = 0; j < T; ++j) {
                const float a = att[(h * T + t) * T + j];
                if (j > t) CHECK(a == 0.0f);
                sum += a;
            }
            // Σ_j e_j·fl(1/Z), Z summed from the same rounded e_j (their errors cancel): Z's γ_3,
            // the reciprocal's u and T ≤ 4 products' u, ≤ 5u ≈ 3e-7 (u = 2^-24; the sum here
            // is double); Approx allows 1e-6·(1 + 1) = 2e-6, 6.7× above.
            CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
        }
    }
}

TEST_CASE("GELU is the exact erf form and its backward agrees with finite differences") {
    // GELU(1) = Φ(1) = 0.841344746..., GELU(-1) = -(1 - Φ(1)) = -0.158655254...
    const std::vector<float> x = {1.0f, -1.0f, 0.0f};
    std::vector<float> y(3);
    gelu_forward(y.data(), x.data(), 3);
    // 0.5·x·(1 + erf(x/√2)) in float32: erff's ≤ 2 ulp and ~4 roundings, ≲ 6u·0.84 ≈ 3e-7 at
    // x = 1 and ≲ 0.5·(2u·0.68 + 2u) ≈ 1e-7 at x = −1 (u = 2^-24); Approx allows
    // 1e-6·(1 + |y|), 1.8e-6 and 1.2e-6: ≥ 6× above. GELU(0) = 0·… is exactly 0.
    CHECK(y[0] == doctest::Approx(0.8413447460685429).epsilon(1e-6));
    CHECK(y[1] == doctest::Approx(-0.15865525393145707).epsilon(1e-6));
    CHECK(y[2] == 0.0f);

    Rng rng(7);
    const int N = 64;
    std::vector<float> inp = normal_vector(rng, N, 2.0f), out(N), w = normal_vector(rng, N);
    std::vector<float> dinp(N, 0.0f);
    gelu_backward(dinp.data(), inp.data(), w.data(), N);
    check_gradient("dinp", inp.data(), dinp, [&] {
        gelu_forward(out.data(), inp.data(), N);
        return weighted_sum(out, w);
    });
}

TEST_CASE("the residual connection passes the gradient to both inputs") {
    const std::vector<float> dout = {1.0f, -2.0f};
    std::vector<float> d1 = {0.5f, 0.5f}, d2 = {0.0f, 0.0f};
    residual_backward(d1.data(), d2.data(), dout.data(), 2);
    CHECK(d1 == std::vector<float>{1.5f, -1.5f});  // added to what was there
    CHECK(d2 == dout);
}

TEST_CASE("inverted dropout zeroes about p of the values and scales the rest by 1/(1-p)") {
    const int N = 20000;
    const float p = 0.25f;
    std::vector<float> x(N, 1.0f), mask(N);
    dropout_forward(x.data(), mask.data(), p, DropoutSite{8, 0}, N);
    int zeros = 0;
    double sum = 0.0;
    for (int i = 0; i < N; ++i) {
        zeros += x[i] == 0.0f;
        CHECK((x[i] == 0.0f || x[i] == doctest::Approx(1.0f / (1.0f - p))));
        sum += x[i];
    }
    // Binomial(20000, 0.25): standard deviation of the count ≈ 61, so ±300 is about 5 sigma.
    CHECK(std::abs(zeros - N / 4) < 300);
    // The mean of N kept-and-scaled values has standard deviation √(p/(1 − p)/N) ≈ 4.1e-3 (a
    // statistical tolerance): Approx allows 0.02·(1 + 1) = 0.04, about 10 of them.
    CHECK(sum / N == doctest::Approx(1.0).epsilon(0.02));  // the mean is kept
    std::vector<float> dx(N, 2.0f);
    dropout_backward(dx.data(), mask.data(), N);
    for (int i = 0; i < N; ++i) CHECK(dx[i] == 2.0f * mask[i]);
}

TEST_CASE(
    "cross-entropy of uniform logits is ln V and its backward agrees with finite differences") {
    const int B = 2, T = 3, V = 7;
    std::vector<float> logits(B * T * V, 0.5f), probs(logits.size()), losses(B * T);
    const std::vector<int> targets = {0, 6, 3, 3, 1, 2};
    const float uniform =
        crossentropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), B, T, V);
    // Equal logits: e^0 = 1 each and Z = 7 exactly; −ln(fl(1/7)) and the mean of 6 equal
    // losses round ≲ 8u·1.95 ≈ 9e-7 (u = 2^-24); Approx allows 1e-6·(1 + ln 7) ≈ 2.9e-6, 3×.
    CHECK(uniform == doctest::Approx(std::log(7.0)).epsilon(1e-6));

    Rng rng(9);
    logits = normal_vector(rng, logits.size(), 3.0f);
    crossentropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), B, T, V);
    std::vector<float> dlogits(logits.size(), 0.0f);
    crossentropy_backward(dlogits.data(), probs.data(), targets.data(), B, T, V);
    check_gradient("dlogits", logits.data(), dlogits, [&] {
        crossentropy_forward(probs.data(), losses.data(), logits.data(), targets.data(), B, T, V);
        double mean = 0.0;
        for (float l : losses) mean += l;
        return mean / (B * T);
    });
}
