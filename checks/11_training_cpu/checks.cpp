// Checks for exercise 11: the AdamW step.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - any settings, step and magnitudes give torch.optim.AdamW's update
// - every setting out of its range, NaN included, and every step below 1 are refused
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/gpt.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xadapt.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

using exercise::adamw_step;
using exercise::AdamWSettings;
using Vec = std::vector<float>;

namespace {
AdamWSettings no_decay(float lr) {
    AdamWSettings s;
    s.lr = lr;
    s.weight_decay = 0.0f;
    return s;
}
}  // namespace

TEST_CASE("the first step moves every parameter by the learning rate against its gradient's sign") {
    // Step 1: m = 0.1·g, v = 0.01·g², and the bias corrections give m̂ = g, v̂ = g², so the
    // move is η·g/(|g| + ε): η for any non-zero gradient, 0 for a zero one.
    Vec param{1.0f, -2.0f, 0.5f}, grad{0.5f, -4.0f, 0.0f}, m(3, 0.0f), v(3, 0.0f);
    adamw_step(param, grad, m, v, 1, no_decay(0.1f), false);
    // ε = 1e-8 changes η·g/(|g| + ε) by η·ε/|g| ≤ 2e-9; float rounding (u = 2^-24): m̂ and
    // √v̂ ≲ 3u each, so η's move is within 7u·0.1, plus ½ulp(1.9) ≈ 1.2e-7 for the subtraction
    // and the reference's own ½ulp: ≤ 2.2e-7, 4.5× under 1e-6. m = (1 − 0.9f)·g carries
    // 1 − 0.9f = 0.10000002384 (4u high, exact subtraction): −0.4000000954 against −0.4f,
    // 8.9e-8 under 1e-7 (the worst here, 1.1×). The mistakes (no bias correction, |g| or β1 in
    // v, L2 decay) move θ by ≥ 1e-3.
    CHECK_CLOSE(xt::adapt(param), xt::adapt(Vec{0.9f, -1.9f, 0.5f}), 1e-6);
    CHECK_CLOSE(xt::adapt(m), xt::adapt(Vec{0.05f, -0.4f, 0.0f}), 1e-7);
    // 1 − 0.99 in float32 is 0.0099999905: v is off by up to 1e-6 relative, 1.5e-7 on 0.16.
    CHECK_CLOSE(xt::adapt(v), xt::adapt(Vec{0.0025f, 0.16f, 0.0f}), 1e-6);
}

TEST_CASE("two steps agree with values worked by hand") {
    // θ = 1, g = 1 then −1, η = 0.1, β = (0.9, 0.99):
    // step 1: m = 0.1, v = 0.01, m̂ = 1, v̂ = 1, θ = 0.9
    // step 2: m = 0.09 − 0.1 = −0.01, v = 0.0099 + 0.01 = 0.0199,
    //         m̂ = −0.01/0.19 = −0.0526316, v̂ = 0.0199/0.0199 = 1, θ = 0.9 + 0.00526316
    INFO("by hand: step 1 m = 0.1, v = 0.01, θ = 0.9; step 2 m = -0.01, v = 0.0199, "
         "m̂ = -0.01/(1 - 0.9²) = -0.0526316, v̂ = 0.0199/(1 - 0.99²) = 1, θ = 0.90526316");
    Vec param{1.0f}, m{0.0f}, v{0.0f};
    adamw_step(param, Vec{1.0f}, m, v, 1, no_decay(0.1f), false);
    adamw_step(param, Vec{-1.0f}, m, v, 2, no_decay(0.1f), false);
    // m = 0.09 − 0.1 and v = 0.0099 + 0.01: a few roundings of ½ulp(0.1) ≈ 3.7e-9, ≲ 2e-8,
    // 5× under 1e-7 (u = 2^-24).
    CHECK_CLOSE(xt::adapt(m), xt::adapt(Vec{-0.01f}), 1e-7);
    CHECK_CLOSE(xt::adapt(v), xt::adapt(Vec{0.0199f}), 1e-7);
    // Float rounding of the bias corrections (1 − 0.9801 loses about 2 digits): v̂ within
    // ≈ 2·ulp(0.98)/0.0199 ≈ 6e-6 relative, √v̂ 3e-6, so the move η·|m̂|/√v̂ ≈ 5.3e-3 is within
    // ~2e-8; with ½ulp(0.9) and the 8-digit reference ≲ 1e-7: 5e-6 is 50× above. Without the
    // bias correction θ = 0.9071, off by 1.8e-3.
    CHECK_CLOSE(xt::adapt(param), xt::adapt(Vec{0.90526316f}), 5e-6);
}

TEST_CASE("a zero gradient after a non-zero one still decays the moments and moves θ") {
    // θ = 1, g = 1 then 0, η = 0.1, β = (0.9, 0.99), no decay:
    // step 1: m = 0.1, v = 0.01, θ = 0.9
    // step 2: m = 0.09, v = 0.0099, m̂ = 0.09/0.19 = 0.4736842, v̂ = 0.0099/0.0199 = 0.4974874,
    //         θ = 0.9 − 0.1·0.4736842/0.7053279 = 0.8328420
    INFO("by hand: after g = 1 then g = 0, m = 0.09, v = 0.0099 and θ = 0.8328420: a zero "
         "gradient still decays m and v, and the momentum still moves θ");
    Vec param{1.0f}, m{0.0f}, v{0.0f};
    adamw_step(param, Vec{1.0f}, m, v, 1, no_decay(0.1f), false);
    adamw_step(param, Vec{0.0f}, m, v, 2, no_decay(0.1f), false);
    // m = 0.9·0.1 + 0.1·0 and v = 0.99·0.01 + 0.01·0: two roundings each, ≤ 2u·0.09 ≈ 1.1e-8
    // and 2u·0.01 ≈ 1.2e-9 (u = 2^-24), plus the expected float's ½ulp: 1e-7 is ~9× above.
    // Skipping the decay on a zero gradient leaves m = 0.1, 0.01 away.
    CHECK_CLOSE(xt::adapt(m), xt::adapt(Vec{0.09f}), 1e-7);
    CHECK_CLOSE(xt::adapt(v), xt::adapt(Vec{0.0099f}), 1e-7);
    // Float rounding of the bias corrections, as in the two-step example: v̂ = 0.4975 within
    // ~6e-6 relative, the move 0.067 within ~2e-7, plus ½ulp and the 7-digit reference:
    // ≲ 3e-7, 16× under 5e-6. Skipping the zero-gradient element leaves θ = 0.9, 0.067 off.
    CHECK_CLOSE(xt::adapt(param), xt::adapt(Vec{0.8328420f}), 5e-6);
}

TEST_CASE("weight decay shrinks only the tensors marked for it, and stays out of the moments") {
    AdamWSettings s;
    s.lr = 0.1f;
    s.weight_decay = 0.5f;
    const Vec zero{0.0f, 0.0f};
    SUBCASE("decayed: θ·(1 − η·λ) = θ·0.95 when the gradient is zero") {
        Vec param{2.0f, -4.0f}, m(2, 0.0f), v(2, 0.0f);
        adamw_step(param, zero, m, v, 1, s, true);
        // 1 − 0.1f·0.5f rounds to 0.95f and ×2, ×4 are exact: within ½ulp of 1.9 and 3.8,
        // ≤ 2.4e-7 (u = 2^-24), 4× under 1e-6; moments 0 exactly (g = 0). L2 decay through
        // the moments moves θ by η = 0.1 instead.
        CHECK_CLOSE(xt::adapt(param), xt::adapt(Vec{1.9f, -3.8f}), 1e-6);
        CHECK_CLOSE(xt::adapt(m), xt::adapt(zero), 0.0);
        CHECK_CLOSE(xt::adapt(v), xt::adapt(zero), 0.0);
    }
    SUBCASE("not decayed: unchanged") {
        Vec param{2.0f, -4.0f}, m(2, 0.0f), v(2, 0.0f);
        adamw_step(param, zero, m, v, 1, s, false);
        CHECK_CLOSE(xt::adapt(param), xt::adapt(Vec{2.0f, -4.0f}), 0.0);
    }
    SUBCASE("decayed with a gradient: the decay comes first, then the Adam move of η") {
        Vec param{2.0f}, m{0.0f}, v{0.0f};
        adamw_step(param, Vec{3.0f}, m, v, 1, s, true);
        CHECK_CLOSE(xt::adapt(param), xt::adapt(Vec{1.9f - 0.1f}), 1e-6);
    }
}

TEST_CASE("no momentum (β₁ = 0), a late step (t = 1000), and moments from earlier steps") {
    // The other checks start from zero moments at steps 1 to 5 with β₁ = 0.9: here m and v
    // hold earlier steps' values, t is 3 or 1000 (bias corrections near 1), β₁ is 0 or 0.9,
    // and the parameters are of either sign. The reference is the contract's formulas in
    // double, written out below.
    attn::Rng rng(11);
    for (float beta1 : {0.0f, 0.9f})
        for (long step : {3L, 1000L})
            for (bool decay : {false, true}) {
                CAPTURE(beta1);
                CAPTURE(step);
                CAPTURE(decay);
                AdamWSettings s;
                s.lr = 0.01f;
                s.beta1 = beta1;
                const std::size_t n = 8;
                Vec param(n), grad(n), m(n), v(n);
                for (std::size_t i = 0; i < n; ++i) {
                    param[i] = rng.normal() * 2.0f;
                    grad[i] = rng.normal();
                    m[i] = 0.1f * rng.normal();
                    v[i] = 0.01f * std::fabs(rng.normal()) + 1e-4f;  // positive
                }
                Vec expected_param(n), expected_m(n), expected_v(n);
                const double c1 = 1.0 - std::pow(double(s.beta1), step);
                const double c2 = 1.0 - std::pow(double(s.beta2), step);
                for (std::size_t i = 0; i < n; ++i) {
                    double theta = param[i];
                    if (decay) theta *= 1.0 - double(s.lr) * s.weight_decay;
                    const double mi = s.beta1 * double(m[i]) + (1.0 - s.beta1) * grad[i];
                    const double vi = s.beta2 * double(v[i]) + (1.0 - s.beta2) * double(grad[i]) * grad[i];
                    theta -= s.lr * (mi / c1) / (std::sqrt(vi / c2) + s.eps);
                    expected_param[i] = static_cast<float>(theta);
                    expected_m[i] = static_cast<float>(mi);
                    expected_v[i] = static_cast<float>(vi);
                }
                adamw_step(param, grad, m, v, step, s, decay);
                // Against the formulas in double from the same float β's (so 1 − β is the
                // same exact value on both sides), u = 2^-24: θ ≤ 6 gets the decay's product
                // (u·6) and the subtraction (½ulp(6) ≈ 2.4e-7), the move η|m̂|/√v̂ ≲ 0.3 within
                // ~10u, and the reference its ½ulp: ≲ 1e-6, 2× under 2e-6. m, v ≲ 0.5: three
                // roundings of ½ulp(0.3) ≈ 1.5e-8 plus the reference's, ≲ 6e-8 under 1e-7.
                CHECK_CLOSE(xt::adapt(param), xt::adapt(expected_param), 2e-6);
                CHECK_CLOSE(xt::adapt(m), xt::adapt(expected_m), 1e-7);
                CHECK_CLOSE(xt::adapt(v), xt::adapt(expected_v), 1e-7);
            }
}

TEST_CASE("five steps on a small GPT's gradients agree with attn::AdamW, tensor by tensor") {
    attn::GPTConfig config;
    config.vocab_size = 11;
    config.block_size = 8;
    config.n_layer = 2;
    config.n_head = 2;
    config.n_embd = 16;
    attn::GPT model(config, 3);
    attn::AdamW reference;  // nanoGPT's settings: β = (0.9, 0.99), λ = 0.1, ε = 1e-8
    const std::size_t P = model.parameters().size();
    Vec params = model.parameters(), m(P, 0.0f), v(P, 0.0f);
    attn::Rng rng(5);
    std::vector<int> x(2 * 8), y(2 * 8);
    for (long step = 1; step <= 5; ++step) {
        // Both optimizers get the same gradients (the reference model's): Adam divides by
        // √v̂, which amplifies tiny differences in tiny gradients, so two models drifting
        // apart by rounding would be compared, not two optimizers.
        for (int& t : x) t = static_cast<int>(rng.below(11));
        for (int& t : y) t = static_cast<int>(rng.below(11));
        model.forward(x, y, 2, 8);
        model.zero_grad();
        model.backward();
        AdamWSettings s;
        s.lr = 1e-2f;
        for (const attn::ParameterInfo& info : model.parameter_table()) {
            const auto begin = static_cast<long>(info.offset), end = static_cast<long>(info.offset + info.size);
            auto part = [&](const Vec& all) { return Vec(all.begin() + begin, all.begin() + end); };
            Vec p = part(params), g = part(model.gradients()), mi = part(m), vi = part(v);
            adamw_step(p, g, mi, vi, step, s, info.decay);
            std::copy(p.begin(), p.end(), params.begin() + begin);
            std::copy(mi.begin(), mi.end(), m.begin() + begin);
            std::copy(vi.begin(), vi.end(), v.begin() + begin);
        }
        reference.step(model, 1e-2f);
    }
    // The same formulas, perhaps in another order: a few float32 ulps per step on weights of
    // size ≤ 1 (ulp 6e-8) and on moves of size ≤ η = 0.01: well under 1e-6 after 5 steps.
    CHECK_CLOSE(xt::adapt(params), xt::adapt(model.parameters()), 1e-6);
    // m = β1·m + (1 − β1)·g in another order: ≤ 3 roundings of ½ulp(|m|) a step, |m| ≲ |g|
    // ≲ 0.3 (½ulp 1.5e-8, u = 2^-24), older ones shrunk by β1: Σ_k 0.9^k·4.5e-8 ≈ 1.8e-7 after
    // 5 steps at worst, ≈ 4.6e-8 with random signs: 1e-7 rests on that, 2× above (0 in the
    // same order). v ≲ 0.01·g² ≲ 1e-3 rounds by ~6e-11 a step: far under. The mistakes (|g|
    // or β1 in v, no bias correction, L2 decay, all tensors decayed) are ≥ 1e-4 off.
    CHECK_CLOSE(xt::adapt(m), xt::adapt(reference.m), 1e-7);
    CHECK_CLOSE(xt::adapt(v), xt::adapt(reference.v), 1e-7);
}

TEST_CASE("bad input is rejected with std::invalid_argument") {
    Vec p(3, 1.0f), g(3, 0.5f), m(3, 0.0f), v(3, 0.0f), short_vec(2, 0.0f);
    AdamWSettings good;
    CHECK_THROWS_AS(adamw_step(p, short_vec, m, v, 1, good, true), std::invalid_argument);
    CHECK_THROWS_AS(adamw_step(p, g, short_vec, v, 1, good, true), std::invalid_argument);
    CHECK_THROWS_AS(adamw_step(p, g, m, short_vec, 1, good, true), std::invalid_argument);
    CHECK_THROWS_AS(adamw_step(p, g, m, v, 0, good, true), std::invalid_argument);
    AdamWSettings bad = good;
    bad.beta1 = 1.0f;
    CHECK_THROWS_AS(adamw_step(p, g, m, v, 1, bad, true), std::invalid_argument);
    bad = good;
    bad.eps = 0.0f;
    CHECK_THROWS_AS(adamw_step(p, g, m, v, 1, bad, true), std::invalid_argument);
    bad = good;
    bad.lr = -1e-3f;
    CHECK_THROWS_AS(adamw_step(p, g, m, v, 1, bad, true), std::invalid_argument);
    // Each setting's range on its own, both ends: β₂ = 1 would divide 0 by 1 − 1ᵗ = 0.
    for (float beta : {1.0f, -0.1f}) {
        CAPTURE(beta);
        bad = good;
        bad.beta1 = beta;
        CHECK_THROWS_AS(adamw_step(p, g, m, v, 1, bad, true), std::invalid_argument);
        bad = good;
        bad.beta2 = beta;
        CHECK_THROWS_AS(adamw_step(p, g, m, v, 1, bad, true), std::invalid_argument);
    }
    bad = good;
    bad.weight_decay = -0.1f;
    {
        INFO("a negative weight decay would grow every weight: the contract asks for λ ≥ 0");
        CHECK_THROWS_AS(adamw_step(p, g, m, v, 1, bad, true), std::invalid_argument);
    }
    {
        INFO("step counts from 1: a negative step is refused as 0 is");
        CHECK_THROWS_AS(adamw_step(p, g, m, v, -1, good, true), std::invalid_argument);
    }
    // NaN is in no range: a check written `lr < 0` or `eps <= 0` is false for NaN and lets it
    // through (θ becomes NaN); `!(lr >= 0)`, `!(eps > 0)` refuse it.
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (float AdamWSettings::*setting : {&AdamWSettings::lr, &AdamWSettings::beta1, &AdamWSettings::beta2,
                                          &AdamWSettings::eps, &AdamWSettings::weight_decay}) {
        bad = good;
        bad.*setting = nan;
        INFO("settings {lr, beta1, beta2, eps, weight_decay} = {" << bad.lr << ", " << bad.beta1 << ", "
             << bad.beta2 << ", " << bad.eps << ", " << bad.weight_decay
             << "}: NaN fails every comparison, so write each range as !(x >= 0) (or !(x > 0)), "
                "which is true for NaN");
        CHECK_THROWS_AS(adamw_step(p, g, m, v, 1, bad, true), std::invalid_argument);
    }
}

TEST_CASE("property: every setting out of its range, NaN included, and every step below 1 are refused") {
    // One thing wrong at a time, the rest nanoGPT's defaults: η or λ in NaN, −denormal, −1,
    // −∞; ε in those or 0; β₁ or β₂ in those, 1, the float after 1, 2 or +∞; or the step
    // 0, −1, −10^6 or −2^62. Each must throw std::invalid_argument, with or without decay.
    attn::check_property("adamw_step refuses every setting out of range and every step below 1", [] {
        const float inf = std::numeric_limits<float>::infinity();
        const int what = attn::draw("what is wrong (0 lr, 1 beta1, 2 beta2, 3 eps, 4 weight_decay, 5 step)",
                                    rc::gen::inRange(0, 6));
        AdamWSettings st;
        long step = 1;
        switch (what) {
            case 0: st.lr = attn::draw("lr", attn::family::out_of_range(0.0f, inf)); break;
            case 1: st.beta1 = attn::draw("beta1", attn::family::out_of_range(0.0f, 1.0f, false, true)); break;
            case 2: st.beta2 = attn::draw("beta2", attn::family::out_of_range(0.0f, 1.0f, false, true)); break;
            case 3: st.eps = attn::draw("eps", attn::family::out_of_range(0.0f, inf, true)); break;
            case 4: st.weight_decay = attn::draw("weight_decay", attn::family::out_of_range(0.0f, inf)); break;
            default: step = attn::draw("step", attn::family::below(1)); break;
        }
        const bool decay = attn::draw("decay", rc::gen::arbitrary<bool>());
        Vec p{1.0f, -2.0f}, g{0.5f, -4.0f}, m(2, 0.0f), v(2, 0.0f);
        RC_ASSERT(attn::refused([&] { adamw_step(p, g, m, v, step, st, decay); }));
    });
}

TEST_CASE("property: any settings, step and magnitudes give torch.optim.AdamW's update") {
    // Up to 6 parameters (1 a quarter of the time) with θ, m from ±10^−6 … 10^3, v ≥ 0 and g
    // from ±10^−6 … 10^15 (so g² stays finite) or 0, steps 1 … 10^4 or 2^31 − 1 … 2^44, β₁ ∈ {0, 0.5, 0.9}, β₂ ∈ {0.9, 0.99, 0.999},
    // ε ∈ {1e-8, 1e-6}, η ∈ {1e-4, 1e-2}, λ ∈ {0, 0.1}, with or without decay, and the lower
    // ends of the ranges, which are allowed: η = 0 (θ moves by nothing) and β₂ = 0 (v = g²; a
    // range written `β₂ > 0` or `η > 0` refuses them); the reference
    // is the formula in float64 on the same float inputs. Bounds (u = 2^-24): m and v are two
    // products and a sum, ≤ 3u of |β₁m| + |(1 − β₁)g| (and of v's terms). 1 − βᵗ in float loses
    // relatively u·βᵗ/(1 − βᵗ) = u·κ per rounding of βᵗ (pow's and the constant's): the step
    // r = m̂/(√v̂ + ε) is within (12 + 3κ₁ + 2κ₂)u of itself, and θ within 3u·|θ| + that·η|r|.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("adamw_step equals the AdamW formula in float64", [&] {
        const std::size_t n = attn::draw("n", attn::family::length(6));
        AdamWSettings st;
        st.beta1 = attn::draw("beta1", rc::gen::element(0.0f, 0.5f, 0.9f));
        st.beta2 = attn::draw("beta2", rc::gen::element(0.0f, 0.9f, 0.99f, 0.999f));
        st.eps = attn::draw("eps", rc::gen::element(1e-8f, 1e-6f));
        st.lr = attn::draw("lr", rc::gen::element(0.0f, 1e-4f, 1e-2f));
        st.weight_decay = attn::draw("weight_decay", rc::gen::element(0.0f, 0.1f));
        const bool decay = attn::draw("decay", rc::gen::arbitrary<bool>());
        // Steps 1 … 10^4, or past what 32 bits hold (a step kept in an int wraps to another).
        const long step = attn::draw(
            "step", rc::gen::oneOf(rc::gen::inRange(1L, 10001L),
                                   rc::gen::map(attn::family::wide_count(), [](std::size_t c) { return static_cast<long>(c); })));
        Vec theta(n), g(n), m(n), v(n);
        for (std::size_t i = 0; i < n; ++i) {
            const std::string at = "[" + std::to_string(i) + "]";
            theta[i] = attn::draw("theta" + at, attn::family::magnitude(-6, 4));
            // a zero gradient still moves m, v and θ
            g[i] = attn::draw("g" + at, rc::gen::oneOf(attn::family::magnitude(-6, 16), rc::gen::just(0.0f)));
            m[i] = attn::draw("m" + at, attn::family::magnitude(-6, 4));
            v[i] = std::abs(attn::draw("v" + at + " (its size)", attn::family::magnitude(-6, 4)));
        }
        const Vec theta0 = theta, m0 = m, v0 = v;
        adamw_step(theta, g, m, v, step, st, decay);
        const double b1 = st.beta1, b2 = st.beta2, b1t = std::pow(b1, step), b2t = std::pow(b2, step);
        const double k1 = b1t / (1 - b1t), k2 = b2t / (1 - b2t);
        for (std::size_t i = 0; i < n; ++i) {
            const double mr = b1 * m0[i] + (1 - b1) * g[i], vr = b2 * v0[i] + (1 - b2) * double(g[i]) * g[i];
            RC_ASSERT(std::abs(m[i] - mr) <= 3 * u * (std::abs(b1 * m0[i]) + std::abs((1 - b1) * g[i])));
            RC_ASSERT(std::abs(v[i] - vr) <= 3 * u * (b2 * v0[i] + (1 - b2) * double(g[i]) * g[i]));
            const double r = (mr / (1 - b1t)) / (std::sqrt(vr / (1 - b2t)) + st.eps);
            const double th = theta0[i] * (decay ? 1 - double(st.lr) * st.weight_decay : 1.0) - double(st.lr) * r;
            const double tol = 3 * u * std::abs(theta0[i]) + (12 + 3 * k1 + 2 * k2) * u * st.lr * std::abs(r);
            RC_ASSERT(std::abs(theta[i] - th) <= tol);
        }
    });
}

