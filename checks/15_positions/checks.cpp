// Checks for exercise 15: RoPE's rotation and its backward.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - at any positions up to 10^5, a score depends only on the offset, and backward undoes forward
// - rows of any magnitude and distinct entries, at any position up to 2^31 − 1, against the
//   rotation in double, and exactly linear under a power of two
// - every negative position and every odd head size is refused
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/fixtures.hpp"
#include "attn/npy.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <cmath>
#include <filesystem>
#include <limits>
#include <stdexcept>
#include <vector>

using attn::Tensor2;
using exercise::rope_rotate;
using exercise::rope_rotate_backward;

namespace {
// One rotation computed by PyTorch (tools/reference/make_position_fixtures.py): x (5, 8) at
// positions 3..7, its rotation, and the gradient of sum(rotation * dy) by autograd.
const std::filesystem::path fixtures = attn::fixtures_dir() / "positions" / "rotation";
constexpr int fixture_pos0 = 3;

float sum_of_products(const Tensor2& a, const Tensor2& b) {
    float s = 0.0f;
    for (std::size_t i = 0; i < a.size(); ++i) s += a.flat(i) * b.flat(i);
    return s;
}

// The contract's rotation written out in double, angles and products alike, rounded to
// float at the end: the reference for positions far from 0. `sign` −1 is the backward pass.
Tensor2 rotation_in_double(const Tensor2& x, int pos0, double sign) {
    const std::size_t T = x.shape()[0], hs = x.shape()[1];
    Tensor2 y = Tensor2::from_shape({T, hs});
    for (std::size_t t = 0; t < T; ++t) {
        for (std::size_t i = 0; i < hs / 2; ++i) {
            const double theta = sign * (pos0 + static_cast<double>(t)) *
                                 std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
            const double x0 = x(t, 2 * i), x1 = x(t, 2 * i + 1);
            y(t, 2 * i) = static_cast<float>(x0 * std::cos(theta) - x1 * std::sin(theta));
            y(t, 2 * i + 1) = static_cast<float>(x0 * std::sin(theta) + x1 * std::cos(theta));
        }
    }
    return y;
}
}  // namespace

TEST_CASE("at position 0 every angle is 0, so nothing moves, forward or backward") {
    const Tensor2 x = {{0.5f, -1.0f, 2.0f, 3.0f}};
    CHECK_CLOSE(rope_rotate(x, 0), x, 0.0);
    CHECK_CLOSE(rope_rotate_backward(x, 0), x, 0.0);
}

TEST_CASE("two rows rotated as worked by hand, the pairs adjacent") {
    // hs = 4: pair 0 turns by p radians, pair 1 by p · 10000^(−2/4) = p / 100.
    // Row 0 at position 1: (1, 0) by 1 rad → (cos 1, sin 1) = (0.5403023, 0.8414710);
    //                      (0, 1) by 0.01 → (−sin 0.01, cos 0.01) = (−0.0099998, 0.9999500).
    // Row 1 at position 2: (0, 1) by 2 rad → (−sin 2, cos 2) = (−0.9092974, −0.4161468);
    //                      (1, 0) by 0.02 → (cos 0.02, sin 0.02) = (0.9998000, 0.0199987).
    const Tensor2 x = {{1, 0, 0, 1}, {0, 1, 1, 0}};
    const Tensor2 expected = {{0.5403023f, 0.8414710f, -0.0099998f, 0.9999500f},
                              {-0.9092974f, -0.4161468f, 0.9998000f, 0.0199987f}};
    // Values given to 7 digits (≤ 5e-8 off). y = x0·c − x1·s with c, s rounded to float (u
    // each, u = 2^-24), two products and a subtraction: ≤ 3u(|x0| + |x1|) = 1.8e-7 here, 4×
    // under 1e-6. The mistakes (−θ, exponent −i/hs or 0, Llama's pairing, in-place, positions
    // from 1) move these values by ≥ 0.01.
    CHECK_CLOSE(rope_rotate(x, 1), expected, 1e-6);
}

TEST_CASE("the backward pass of one row, worked by hand, turns the other way") {
    // dy = (1, 0, 0, 1) at position 1: pair 0 by −1 rad → (cos 1, −sin 1); pair 1 (0, 1) by
    // −0.01 → (sin 0.01, cos 0.01).
    const Tensor2 dy = {{1, 0, 0, 1}};
    const Tensor2 expected = {{0.5403023f, -0.8414710f, 0.0099998f, 0.9999500f}};
    // As above: ≤ 2.3e-7; rotating by +θ flips two signs, 1.7 off.
    CHECK_CLOSE(rope_rotate_backward(dy, 1), expected, 1e-6);
}

TEST_CASE("rope_rotate matches PyTorch's rotation at positions 3 to 7") {
    const Tensor2 x = attn::load_npy<2>(fixtures / "x.npy");
    // float32 on both sides, |x| ≤ 2.8: each side within 3u(|x0| + |x1|) ≤ 3u·5.6 ≈ 1e-6
    // (u = 2^-24), PyTorch's float angle (≤ 7) adds ½ulp(7)·|x| ≈ 6.7e-7: ≲ 2.7e-6 at worst,
    // 3.7× under 1e-5. The mistakes move the rotated values by ≥ 1e-2.
    CHECK_CLOSE(rope_rotate(x, fixture_pos0), attn::load_npy<2>(fixtures / "rotated.npy"), 1e-5);
}

TEST_CASE("rope_rotate_backward matches PyTorch's autograd at positions 3 to 7") {
    const Tensor2 dy = attn::load_npy<2>(fixtures / "dy.npy");
    // As above (|dy| ≤ 2.7): ≲ 2.7e-6 at worst; forgetting pos0 or turning by +θ is O(1) off.
    CHECK_CLOSE(rope_rotate_backward(dy, fixture_pos0), attn::load_npy<2>(fixtures / "dx.npy"),
                1e-5);
}

TEST_CASE("positions past 1000, as in a long context, against angles computed in double") {
    // An angle p·10000^(−2i/hs) computed in float is rounded to float's spacing near it,
    // 6e-5 near 1000 and 0.004 near 32766, and the rotated values move by up to half that
    // (3.8e-5 at position 1000); computed in double it stays within 1e-11 of the truth.
    attn::Rng rng(16);
    const Tensor2 x = rng.normal_tensor<2>({3, 64});
    for (int pos0 : {1000, 4093, 32765}) {
        CAPTURE(pos0);
        INFO("compute the angle (pos0 + t)·10000^(-2i/hs) in double, as the TODO says: in float "
             "a position in the thousands loses the angle's last digits");
        // Products of floats of size ≲ 3 with cos and sin rounded to float: ≤ 3u(|x0| + |x1|)
        // ≈ 1.1e-6 plus the reference's ½ulp (u = 2^-24): 8× under 1e-5, even at worst. The
        // float angle (the first mistake) is off by 3.8e-5 at 1000 and ~2e-3 at 32765, ≥ 3.8×
        // the tolerance.
        CHECK_CLOSE(rope_rotate(x, pos0), rotation_in_double(x, pos0, 1.0), 1e-5);
        CHECK_CLOSE(rope_rotate_backward(x, pos0), rotation_in_double(x, pos0, -1.0), 1e-5);
    }
}

TEST_CASE("positions past 2^24 and up to 2^31 − 1 (pos0 is any int ≥ 0), against angles computed in double") {
    // A position held in a float is rounded past 2^24 (float's 24-bit mantissa): 2^24 + 1
    // becomes 2^24, and near 2^31 a float's spacing is 128, so pair 0 (θ = p radians) turns
    // by up to 64 radians too few or too many. Held in double (or as an int until the angle
    // is formed) every position up to 2^31 − 1 is exact.
    attn::Rng rng(24);
    const Tensor2 x = rng.normal_tensor<2>({3, 8}, 0.0f, 0.5f);
    for (int pos0 : {(1 << 24) + 1, (1 << 24) + 3, std::numeric_limits<int>::max() - 2}) {
        CAPTURE(pos0);
        INFO("keep the position in double (or an int) until the angle: a float holds integers "
             "exactly only up to 2^24 = 16777216");
        // θ = p·f_i with f_i = 10000^(−2i/8): f_0 = 1 exactly in any form (pow or exp of 0),
        // so pair 0's angle is p, exact in double. f_i for i ≥ 1 is within a few ulps whether
        // taken by pow or by exp(−2i/hs·ln 10000): θ within ~4·10^-15·θ ≤ 4e-15·2^31·0.1 ≈
        // 8.6e-7 rad, which moves a pair (|x| ≲ 2, N(0, 0.5)) by ≤ 2·8.6e-7 ≈ 1.7e-6. The
        // float rounding of cos, sin and the products, 3u(|x0| + |x1|) ≲ 7e-7, and the
        // reference's ½ulp: ≲ 2.7e-6, 3.7× under 1e-5. The position in float turns pair 0 by
        // 1 radian or more.
        CHECK_CLOSE(rope_rotate(x, pos0), rotation_in_double(x, pos0, 1.0), 1e-5);
        CHECK_CLOSE(rope_rotate_backward(x, pos0), rotation_in_double(x, pos0, -1.0), 1e-5);
    }
}

TEST_CASE("one pair (hs = 2) and one row: the pair turns by exactly pos0 radians") {
    const Tensor2 x = {{1.0f, 2.0f}};
    const double c = std::cos(7.0), s = std::sin(7.0);
    const Tensor2 expected = {{static_cast<float>(c - 2 * s), static_cast<float>(s + 2 * c)}};
    // ≤ 3u·3 ≈ 5.4e-7 plus ½ulp(2.2) ≈ 1.2e-7 (u = 2^-24): 1.5× under 1e-6.
    CHECK_CLOSE(rope_rotate(x, 7), expected, 1e-6);
}

TEST_CASE("the backward pass is the forward's transpose: sum(dy * R x) = sum(Rᵀ dy * x)") {
    attn::Rng rng(15);
    const Tensor2 x = rng.normal_tensor<2>({7, 16}), dy = rng.normal_tensor<2>({7, 16});
    const float forward_side = sum_of_products(dy, rope_rotate(x, 5));
    const float backward_side = sum_of_products(rope_rotate_backward(dy, 5), x);
    // Sums of 112 products in float (Σ|terms| ≈ 112·0.64 ≈ 72): each side within γ_112·72 ≈
    // 4.8e-4 plus the rotation's 3u per value, ≈ 1e-3 apart at worst, √112 u·72·√2 ≈ 6.4e-6
    // with random signs (u = 2^-24); Approx allows 1e-4·(1 + |sum| ≈ 10) ≈ 1.1e-3, just above
    // the worst case. A wrong sign is off by O(1).
    CHECK(backward_side == doctest::Approx(forward_side).epsilon(1e-4));
    // and the rotation keeps each vector's length: Σ x² ≈ 112 within γ_112·112 ≈ 7.5e-4 a
    // side, and the rotation's 6u·Σ|y|(|x0| + |x1|) ≲ 8e-5: ~1.6e-3 at worst, above Approx's
    // 1e-5·113 ≈ 1.1e-3, but ≈ 1.3e-5 with random signs, 90× under: it rests on that. An
    // in-place rotation changes the lengths by O(1).
    CHECK(sum_of_products(rope_rotate(x, 5), rope_rotate(x, 5)) ==
          doctest::Approx(sum_of_products(x, x)).epsilon(1e-5));
}

TEST_CASE("a query and a key score the same when both move by the same offset") {
    attn::Rng rng(3);
    const Tensor2 q = rng.normal_tensor<2>({1, 8}), k = rng.normal_tensor<2>({1, 8});
    // q at position 9, k at 4: offset 5. Then both moved by 20.
    const float near = sum_of_products(rope_rotate(q, 9), rope_rotate(k, 4));
    const float far = sum_of_products(rope_rotate(q, 29), rope_rotate(k, 24));
    // An 8-term dot (Σ|qk| ≈ 5) of vectors rotated at other positions: each value within
    // 3u(|x0| + |x1|), each sum within γ_8·5: ≲ 200u ≈ 1.2e-5 apart at worst (u = 2^-24),
    // under Approx's 1e-5·(1 + |near|) ≳ 2e-5. Another offset moves the score by O(0.1).
    CHECK(far == doctest::Approx(near).epsilon(1e-5));
    // a different offset gives a different score
    CHECK(sum_of_products(rope_rotate(q, 9), rope_rotate(k, 6)) != doctest::Approx(near).epsilon(1e-3));
}

TEST_CASE("property: at any positions up to 10^5, a score depends only on the offset, and backward undoes forward") {
    // q at position m and k at n, then both moved by c, for m, n, c up to 10^5 and head sizes
    // 2 … 16, entries small integers: RoPE's whole point is that q·k sees only m − n. The
    // dots are summed in double here. Bound (u = 2^-24): each rotated value is the exact
    // rotation rounded once (θ, cos, sin in double), or after a few float operations on
    // float cos and sin: within 6u of its size; the rotation keeps norms, so each dot is
    // within 12u·|q|·|k| and the two within 24u·|q||k|. An angle in float is off by up to
    // 0.004 rad at 10^5 and moves a dot by ~10^-3·|q||k|. rope_rotate_backward turns the other
    // way: applied to rope_rotate(x, p) it gives x back within 12u·|x| per row.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("q·k after RoPE depends on the offset only, and backward inverts forward", [u] {
        const std::size_t hs = attn::draw("hs / 2", rc::gen::inRange<std::size_t>(1, 9)) * 2;
        const int m = attn::draw("m (q's position)", rc::gen::inRange(0, 100001)),
                  n = attn::draw("n (k's position)", rc::gen::inRange(0, 100001)),
                  c = attn::draw("c (both moved by)", rc::gen::inRange(0, 100001));
        const auto q_int = attn::draw("q", rc::gen::container<std::vector<int>>(hs, rc::gen::inRange(-4, 5)));
        const auto k_int = attn::draw("k", rc::gen::container<std::vector<int>>(hs, rc::gen::inRange(-4, 5)));
        Tensor2 q = xt::zeros<float>({std::size_t{1}, hs}), k = xt::zeros<float>({std::size_t{1}, hs});
        double qq = 0.0, kk = 0.0;
        for (std::size_t i = 0; i < hs; ++i) {
            q(0, i) = static_cast<float>(q_int[i]);
            k(0, i) = static_cast<float>(k_int[i]);
            qq += q(0, i) * q(0, i);
            kk += k(0, i) * k(0, i);
        }
        auto dot = [hs](const Tensor2& a, const Tensor2& b) {
            double d = 0.0;
            for (std::size_t i = 0; i < hs; ++i) d += static_cast<double>(a(0, i)) * b(0, i);
            return d;
        };
        const double near = dot(rope_rotate(q, m), rope_rotate(k, n)),
                     far = dot(rope_rotate(q, m + c), rope_rotate(k, n + c));
        RC_ASSERT(std::abs(near - far) <= 24 * u * std::sqrt(qq * kk) + 1e-30);
        const Tensor2 back = rope_rotate_backward(rope_rotate(q, m), m);
        for (std::size_t i = 0; i < hs; ++i)
            RC_ASSERT(std::abs(back(0, i) - q(0, i)) <= 12 * u * std::sqrt(qq));
    });
}

TEST_CASE("property: rows of any magnitude and distinct entries, at any position up to 2^31 − 1, against the rotation in double") {
    // 1 to 4 rows (1 a quarter of the time) of hs = 2 … 16 entries, pairwise distinct and of
    // either sign (Llama's pairing of i with i + hs/2, or a pair's two channels exchanged,
    // shows), times a power of two of any size (2^−20 … 2^100), at a pos0 up to 10^5 or from
    // 2^24 to 2^31 − 1 − T. Against rotation_in_double, forward and backward: per pair
    // |y − ref| ≤ (4u + δθ)(|x0| + |x1|), u = 2^-24: 3u from float cos, sin and the products,
    // u the reference's own rounding; δθ ≤ 2^-49·θ the angle's, a frequency within a few
    // ulps whichever way it is computed (pair 0's, 1, exactly). Then x·2^e (e from −8 to 8)
    // must rotate to y·2^e, bit for bit: the same cos and sin, products scaled exactly.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("rope_rotate and its backward equal the rotation in double at any magnitude and position", [u] {
        const std::size_t T = attn::draw("T", attn::family::length(4));
        const std::size_t hs = attn::draw("hs / 2", rc::gen::inRange<std::size_t>(1, 9)) * 2;
        const int pos0 = attn::draw("pos0", rc::gen::oneOf(rc::gen::inRange(0, 100001),
                                                           rc::gen::inRange((1 << 24), std::numeric_limits<int>::max() - 4)));
        const float size = attn::draw("magnitude of x", attn::family::magnitude(-6, 30));
        const float power = std::ldexp(1.0f, static_cast<int>(std::lround(std::log2(std::abs(static_cast<double>(size))))));
        const auto entries = attn::draw("x / its magnitude (flat, distinct)", attn::family::distinct(T * hs));
        const float scale = attn::draw("scale", attn::family::scale());
        Tensor2 x = xt::zeros<float>({T, hs});
        for (std::size_t i = 0; i < x.size(); ++i) x.flat(i) = entries[i] * power;
        for (double sign : {1.0, -1.0}) {
            const Tensor2 y = sign > 0 ? rope_rotate(x, pos0) : rope_rotate_backward(x, pos0);
            const Tensor2 ref = rotation_in_double(x, pos0, sign);
            RC_ASSERT(y.shape() == ref.shape());
            for (std::size_t t = 0; t < T; ++t)
                for (std::size_t i = 0; i < hs / 2; ++i) {
                    const double theta = (pos0 + static_cast<double>(t)) *
                                         std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
                    const double tol = (4 * u + std::ldexp(theta, -49)) *
                                       (std::abs(static_cast<double>(x(t, 2 * i))) + std::abs(static_cast<double>(x(t, 2 * i + 1))));
                    RC_ASSERT(std::abs(static_cast<double>(y(t, 2 * i)) - ref(t, 2 * i)) <= tol);
                    RC_ASSERT(std::abs(static_cast<double>(y(t, 2 * i + 1)) - ref(t, 2 * i + 1)) <= tol);
                }
            const Tensor2 scaled = sign > 0 ? rope_rotate(Tensor2(x * scale), pos0) : rope_rotate_backward(Tensor2(x * scale), pos0);
            for (std::size_t i = 0; i < y.size(); ++i) RC_ASSERT(scaled.flat(i) == y.flat(i) * scale);
        }
    });
}

TEST_CASE("property: every negative position and every odd head size is refused") {
    // pos0 below 0 (−1, −2, −10^6, the lowest int) with an even hs, or an odd hs from 1 to 15
    // at a position ≥ 0, for 1 to 4 rows: std::invalid_argument from both functions.
    attn::check_property("rope_rotate and its backward refuse pos0 < 0 and an odd hs", [] {
        const std::size_t T = attn::draw("T", attn::family::length(4));
        const bool odd = attn::draw("odd hs (else a negative pos0)", rc::gen::arbitrary<bool>());
        const std::size_t hs = odd ? attn::draw("(hs − 1) / 2", rc::gen::inRange<std::size_t>(0, 8)) * 2 + 1
                                   : attn::draw("hs / 2", rc::gen::inRange<std::size_t>(1, 9)) * 2;
        const int pos0 = odd ? attn::draw("pos0", rc::gen::inRange(0, 100001))
                             : static_cast<int>(std::max<long>(attn::draw("pos0 below 0", attn::family::below(0)),
                                                               std::numeric_limits<int>::min()));
        const Tensor2 x = xt::ones<float>({T, hs});
        for (int backward = 0; backward < 2; ++backward) {
            RC_ASSERT(attn::refused([&] { (void)(backward ? rope_rotate_backward(x, pos0) : rope_rotate(x, pos0)); }));
        }
    });
}

TEST_CASE("an odd head size or a negative position throws std::invalid_argument") {
    const Tensor2 odd = xt::zeros<float>({2, 3}), even = xt::zeros<float>({2, 4});
    CHECK_THROWS_AS(rope_rotate(odd, 0), std::invalid_argument);
    CHECK_THROWS_AS(rope_rotate(even, -1), std::invalid_argument);
    CHECK_THROWS_AS(rope_rotate_backward(odd, 0), std::invalid_argument);
    CHECK_THROWS_AS(rope_rotate_backward(even, -1), std::invalid_argument);
}
