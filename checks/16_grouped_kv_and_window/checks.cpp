// Checks for exercise 16: grouped-query attention's head mapping and its backward.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for any NH, G, T and hs, each query head reads its group's head, and backward is the transpose
// - every count below 1, and every G that does not divide NH, is refused
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include <array>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

using attn::Tensor3;
using exercise::expand_kv;
using exercise::expand_kv_backward;
using exercise::kv_head;

namespace {
float sum_of_products(const Tensor3& a, const Tensor3& b) {
    float s = 0.0f;
    for (std::size_t i = 0; i < a.size(); ++i) s += a.flat(i) * b.flat(i);
    return s;
}
}  // namespace

TEST_CASE("8 query heads in 2 groups: heads 0 to 3 read key/value head 0, heads 4 to 7 head 1") {
    for (int h = 0; h < 4; ++h) CHECK(kv_head(h, 8, 2) == 0);
    for (int h = 4; h < 8; ++h) CHECK(kv_head(h, 8, 2) == 1);
    // 6 heads in 3 groups of 2: 0 0 1 1 2 2
    CHECK(kv_head(1, 6, 3) == 0);
    CHECK(kv_head(2, 6, 3) == 1);
    CHECK(kv_head(5, 6, 3) == 2);
}

TEST_CASE("G = NH is multi-head attention and G = 1 multi-query attention") {
    for (int h = 0; h < 4; ++h) {
        CAPTURE(h);
        CHECK(kv_head(h, 4, 4) == h);  // every head its own
        CHECK(kv_head(h, 4, 1) == 0);  // every head reads the one
    }
}

TEST_CASE("expand_kv copies each key/value head to the query heads of its group, as worked by hand") {
    // G = 2 heads, T = 1, hs = 2: head 0 holds (1, 2), head 1 holds (3, 4). With NH = 4 the
    // query heads read 0, 0, 1, 1.
    const Tensor3 kv = {{{1, 2}}, {{3, 4}}};
    const Tensor3 expected = {{{1, 2}}, {{1, 2}}, {{3, 4}}, {{3, 4}}};
    CHECK_CLOSE(expand_kv(kv, 4), expected, 0.0);
    // NH = G: unchanged
    CHECK_CLOSE(expand_kv(kv, 2), kv, 0.0);
}

TEST_CASE("the gradient of a shared head is the sum over its group, as worked by hand") {
    // NH = 4 query heads' gradients (T = 1, hs = 2): (1, 0), (2, 0), (0, 10), (0, 20).
    // G = 2: head 0 gets (1 + 2, 0) = (3, 0), head 1 gets (0, 10 + 20) = (0, 30).
    const Tensor3 d = {{{1, 0}}, {{2, 0}}, {{0, 10}}, {{0, 20}}};
    const Tensor3 expected2 = {{{3, 0}}, {{0, 30}}};
    CHECK_CLOSE(expand_kv_backward(d, 2), expected2, 0.0);
    // G = 1 (multi-query): the one head gets the sum of all four, (3, 30)
    const Tensor3 expected1 = {{{3, 30}}};
    CHECK_CLOSE(expand_kv_backward(d, 1), expected1, 0.0);
    // G = 4: every head its own gradient
    CHECK_CLOSE(expand_kv_backward(d, 4), d, 0.0);
}

TEST_CASE("the backward pass is the forward's transpose: sum(d * expand(kv)) = sum(backward(d) * kv)") {
    attn::Rng rng(16);
    for (int G : {1, 2, 3, 6}) {
        CAPTURE(G);
        const Tensor3 kv = rng.normal_tensor<3>({static_cast<std::size_t>(G), 5, 4});
        const Tensor3 d = rng.normal_tensor<3>({6, 5, 4});
        const float forward_side = sum_of_products(d, expand_kv(kv, 6));
        const float backward_side = sum_of_products(expand_kv_backward(d, G), kv);
        // Sums of 120 products in float (Σ|terms| ≈ 120·0.64 ≈ 77): each side within
        // γ_120·77 ≈ 5.5e-4 (plus the group sums' few u), ≈ 1.1e-3 apart at worst, √120 u·77·√2
        // ≈ 7e-6 with random signs (u = 2^-24); Approx allows 1e-4·(1 + |sum| ≈ 11) ≈ 1.2e-3,
        // about the worst case. A wrong mapping, = for +=, or an average is off by O(1).
        CHECK(backward_side == doctest::Approx(forward_side).epsilon(1e-4));
    }
}

TEST_CASE("one query head, many in one group, and every T and hs: forward and backward by hand") {
    // The other checks have T = 1 or 5 and hs = 2 to 5 with 2 to 8 query heads: here also
    // NH = G = 1, NH = 7 in one group, and sequences of 1 to 6 positions of 1 to 3 channels.
    attn::Rng rng(17);
    for (const auto& [NH, G] : {std::pair<int, int>{1, 1}, {7, 1}, {6, 2}})
        for (std::size_t T : {1, 6})
            for (std::size_t hs : {1, 3}) {
                CAPTURE(NH);
                CAPTURE(G);
                CAPTURE(T);
                CAPTURE(hs);
                const std::size_t nh = static_cast<std::size_t>(NH), g = static_cast<std::size_t>(G);
                const Tensor3 kv = rng.normal_tensor<3>({g, T, hs});
                const Tensor3 d = rng.normal_tensor<3>({nh, T, hs});
                // Query head h reads head h / (NH / G); head g's gradient sums its group's.
                Tensor3 expanded = Tensor3::from_shape({nh, T, hs});
                Tensor3 dkv = xt::zeros<float>({g, T, hs});
                for (std::size_t h = 0; h < nh; ++h) {
                    const std::size_t group = h / (nh / g);
                    xt::view(expanded, h) = xt::view(kv, group);
                    xt::view(dkv, group) += xt::view(d, h);
                }
                CHECK_CLOSE(expand_kv(kv, NH), expanded, 0.0);
                // The same sums of ≤ 7 N(0,1) terms, any order: each addition rounds by ½ulp of
                // a partial sum ≲ 4 (≤ 2.4e-7, u = 2^-24), ≤ 6 of them: ≤ 1.4e-6 a side at worst,
                // ≈ √6·1.2e-7·√2 ≈ 4e-7 apart with random signs: 1e-6 rests on that, 2.5× above
                // (0 in the reference's head order). Keeping one head or averaging is O(1) off.
                CHECK_CLOSE(expand_kv_backward(d, G), dkv, 1e-6);
            }
}

TEST_CASE("empty inputs and no query heads are refused: NH = 0 or G = 0 is no count of heads") {
    // An empty kv (G = 0) or an empty gradient (NH = 0) has shape (0, T, hs): the contract
    // refuses G or NH below 1 with std::invalid_argument. Without that check, NH % 0 divides
    // by zero (SIGFPE) and NH = 0 returns a gradient of zeros as if there were heads.
    INFO("G = kv.shape()[0] and NH = dexpanded.shape()[0] may be 0: check that both are at least 1 "
         "before NH % G");
    CHECK_THROWS_AS(expand_kv(xt::zeros<float>({0, 1, 2}), 4), std::invalid_argument);
    CHECK_THROWS_AS(expand_kv(xt::zeros<float>({0, 1, 2}), 0), std::invalid_argument);
    CHECK_THROWS_AS(expand_kv(xt::ones<float>({2, 1, 2}), 0), std::invalid_argument);
    CHECK_THROWS_AS(expand_kv_backward(xt::zeros<float>({0, 1, 2}), 1), std::invalid_argument);
    CHECK_THROWS_AS(expand_kv_backward(xt::zeros<float>({0, 1, 2}), 0), std::invalid_argument);
    CHECK_THROWS_AS(kv_head(0, 0, 0), std::invalid_argument);
}

TEST_CASE("property: for any NH, G, T and hs, each query head reads its group's head, and backward is the transpose") {
    // G from 1 to 6, NH a multiple of G up to 24, T and hs from 1 to 5 (1 a quarter of the
    // time each). kv's entries are pairwise distinct (a head, position or channel read for
    // another shows); d's are small integers times a power of two of any size (2^−20 …
    // 2^100), so every group sum is exact in float. For every h: kv_head(h) = h / (NH / G);
    // expand_kv copies exactly that head, bit for bit; Σ d·expand(kv) = Σ backward(d)·kv,
    // exactly in double (the backward pass is the forward's transpose). Invariances: kv's
    // heads in a drawn order expand to the same groups in that order, and d·2^e (e from −8 to
    // 8) goes back as backward(d)·2^e, bit for bit.
    attn::check_property("kv_head, expand_kv and its backward agree with the grouping", [] {
        const int G = attn::draw("G", rc::gen::inRange(1, 7));
        const int NH = attn::draw("NH / G", rc::gen::inRange(1, 5)) * G;
        const std::size_t T = attn::draw("T", attn::family::length(5)), hs = attn::draw("hs", attn::family::length(5));
        const std::size_t g = static_cast<std::size_t>(G), nh = static_cast<std::size_t>(NH);
        const auto kv_values = attn::draw("kv (flat, distinct)", attn::family::distinct(g * T * hs));
        const auto d_ints = attn::draw("d / its magnitude (flat)",
                                       rc::gen::container<std::vector<int>>(nh * T * hs, rc::gen::inRange(-3, 4)));
        const float size = attn::draw("magnitude of d", attn::family::magnitude(-6, 30));
        const float power = std::ldexp(1.0f, static_cast<int>(std::lround(std::log2(std::abs(static_cast<double>(size))))));
        const auto order = attn::draw("order of kv's heads", attn::family::permutation(g));
        const float scale = attn::draw("scale of d", attn::family::scale());
        Tensor3 kv = xt::zeros<float>({g, T, hs}), d = xt::zeros<float>({nh, T, hs});
        for (std::size_t i = 0; i < kv.size(); ++i) kv.flat(i) = kv_values[i];
        for (std::size_t i = 0; i < d.size(); ++i) d.flat(i) = static_cast<float>(d_ints[i]) * power;
        for (int h = 0; h < NH; ++h) RC_ASSERT(kv_head(h, NH, G) == h / (NH / G));
        const Tensor3 e = expand_kv(kv, NH);
        RC_ASSERT(e.shape() == (std::array<std::size_t, 3>{nh, T, hs}));
        for (std::size_t h = 0; h < nh; ++h)
            RC_ASSERT(xt::view(e, h) == xt::view(kv, h / (nh / g)));
        Tensor3 moved = kv;
        for (std::size_t k = 0; k < g; ++k) xt::view(moved, k) = xt::view(kv, order[k]);
        const Tensor3 moved_e = expand_kv(moved, NH);
        for (std::size_t h = 0; h < nh; ++h)
            RC_ASSERT(xt::view(moved_e, h) == xt::view(kv, order[h / (nh / g)]));
        const Tensor3 back = expand_kv_backward(d, G);
        RC_ASSERT(back.shape() == (std::array<std::size_t, 3>{g, T, hs}));
        double forward = 0.0, backward = 0.0;
        for (std::size_t i = 0; i < e.size(); ++i) forward += static_cast<double>(d.flat(i)) * e.flat(i);
        for (std::size_t i = 0; i < back.size(); ++i) backward += static_cast<double>(back.flat(i)) * kv.flat(i);
        RC_ASSERT(forward == backward);
        const Tensor3 back_scaled = expand_kv_backward(Tensor3(d * scale), G);
        for (std::size_t i = 0; i < back.size(); ++i) RC_ASSERT(back_scaled.flat(i) == back.flat(i) * scale);
    });
}

TEST_CASE("property: every count below 1, and every G that does not divide NH, is refused") {
    // NH or G below 1 (0, −1, −2, −10^6, the lowest int), given as an argument or as a tensor's
    // first axis (which can only be 0: an empty kv or an empty gradient), with the other count
    // valid; or a G that does not divide NH (0 or one of 2 … 2NH + 1 that is no divisor).
    // kv_head, expand_kv and expand_kv_backward must each throw std::invalid_argument: the
    // contract's "NH or G below 1", not a division by zero, an empty result or a shape (NH, …)
    // built from a count that is no count.
    const auto below_1 = [](const char* name) {
        return static_cast<int>(std::max<long>(attn::draw(name, attn::family::below(1)), std::numeric_limits<int>::min()));
    };
    attn::check_property("kv_head, expand_kv and expand_kv_backward refuse counts out of range", [&] {
        const std::size_t T = attn::draw("T", attn::family::length(3)), hs = attn::draw("hs", attn::family::length(3));
        const int good = attn::draw("the valid count", rc::gen::inRange(1, 9));
        const std::size_t n = static_cast<std::size_t>(good);
        switch (attn::draw("which count is wrong", rc::gen::inRange(0, 5))) {
            case 0: {  // NH below 1, G valid
                const int NH = below_1("NH");
                RC_ASSERT(attn::refused([&] { (void)kv_head(0, NH, good); }));
                RC_ASSERT(attn::refused([&] { (void)expand_kv(xt::ones<float>({n, T, hs}), NH); }));
                RC_ASSERT(attn::refused([&] { (void)expand_kv_backward(xt::ones<float>({std::size_t{0}, T, hs}), good); }));
                break;
            }
            case 1: {  // G below 1, NH valid
                const int G = below_1("G");
                RC_ASSERT(attn::refused([&] { (void)kv_head(0, good, G); }));
                RC_ASSERT(attn::refused([&] { (void)expand_kv(xt::ones<float>({std::size_t{0}, T, hs}), good); }));
                RC_ASSERT(attn::refused([&] { (void)expand_kv_backward(xt::ones<float>({n, T, hs}), G); }));
                break;
            }
            case 2: {  // both below 1
                const int NH = below_1("NH"), G = below_1("G");
                RC_ASSERT(attn::refused([&] { (void)kv_head(0, NH, G); }));
                RC_ASSERT(attn::refused([&] { (void)expand_kv(xt::ones<float>({std::size_t{0}, T, hs}), NH); }));
                RC_ASSERT(attn::refused([&] { (void)expand_kv_backward(xt::ones<float>({std::size_t{0}, T, hs}), G); }));
                break;
            }
            default: {  // G does not divide NH
                const std::size_t G = attn::draw("G (not dividing NH)", attn::family::not_dividing(n));
                const int g = static_cast<int>(G);
                RC_ASSERT(attn::refused([&] { (void)kv_head(0, good, g); }));
                RC_ASSERT(attn::refused([&] { (void)expand_kv(xt::ones<float>({G, T, hs}), good); }));
                RC_ASSERT(attn::refused([&] { (void)expand_kv_backward(xt::ones<float>({n, T, hs}), g); }));
                break;
            }
        }
    });
}

TEST_CASE("the shapes follow: (G, T, hs) to (NH, T, hs) and back") {
    const Tensor3 kv = xt::ones<float>({2, 3, 5});
    const Tensor3 out = expand_kv(kv, 6);
    CHECK(out.shape()[0] == 6);
    CHECK(out.shape()[1] == 3);
    CHECK(out.shape()[2] == 5);
    const Tensor3 back = expand_kv_backward(out, 2);
    CHECK(back.shape()[0] == 2);
    // each of the 2 heads collects 3 query heads' ones
    CHECK(back(1, 2, 4) == 3.0f);
}

TEST_CASE("G that does not divide NH, a head outside 0 to NH − 1 or a count below 1 throws "
          "std::invalid_argument") {
    CHECK_THROWS_AS(kv_head(0, 4, 3), std::invalid_argument);
    CHECK_THROWS_AS(kv_head(4, 4, 2), std::invalid_argument);
    CHECK_THROWS_AS(kv_head(-1, 4, 2), std::invalid_argument);
    CHECK_THROWS_AS(kv_head(0, 4, 0), std::invalid_argument);
    CHECK_THROWS_AS(kv_head(0, 0, 1), std::invalid_argument);
    CHECK_THROWS_AS(expand_kv(xt::ones<float>({3, 1, 2}), 4), std::invalid_argument);
    CHECK_THROWS_AS(expand_kv_backward(xt::ones<float>({4, 1, 2}), 3), std::invalid_argument);
    CHECK_THROWS_AS(expand_kv_backward(xt::ones<float>({4, 1, 2}), 0), std::invalid_argument);
    // Negative counts: 4 % -2 == 0 in C++, but -2 heads is no number of heads.
    INFO("4 % -2 == 0 and -4 % 2 == 0 in C++: refuse counts below 1 before testing divisibility");
    CHECK_THROWS_AS(kv_head(0, 4, -2), std::invalid_argument);
    CHECK_THROWS_AS(expand_kv(xt::ones<float>({2, 1, 2}), -4), std::invalid_argument);
    CHECK_THROWS_AS(expand_kv_backward(xt::ones<float>({4, 1, 2}), -2), std::invalid_argument);
}
