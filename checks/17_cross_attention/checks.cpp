// Checks for exercise 17: the masks of a padded encoder–decoder batch, the masked softmax
// and the loss over the real positions.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - any offset, any masked positions, any masked values: the weights are the allowed keys' softmax
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include <cmath>
#include <sstream>
#include <stdexcept>
#include <string>

using attn::Mask;
using attn::Tensor2;
using attn::Tensor3;
using exercise::batch_masks;
using exercise::chunk_causal_mask;
using exercise::masked_mean_loss;
using exercise::masked_softmax;

namespace {
// One (rows, cols) slice of a mask drawn as text, x for true: readable in a failure message.
template <class M>
std::string drawn(const M& m) {
    std::string s;
    for (std::size_t i = 0; i < m.shape()[0]; ++i) {
        for (std::size_t j = 0; j < m.shape()[1]; ++j) s += m(i, j) ? 'x' : '.';
        s += '/';
    }
    return s;
}
std::string drawn3(const Mask<3>& m, std::size_t b) { return drawn(Mask<2>(xt::view(m, b))); }
// The first row of a (1, 1, T) tensor as text.
std::string row_text(const Tensor3& t) {
    std::ostringstream o;
    o << '[';
    for (std::size_t j = 0; j < t.shape()[2]; ++j) o << (j ? ", " : "") << t(0, 0, j);
    o << ']';
    return o.str();
}
}  // namespace

TEST_CASE("the masks of a batch of two, worked by hand") {
    // sources of 3 and 1 tokens (S = 3), decoder inputs of 2 and 3 tokens (T = 3)
    const exercise::BatchMasks m = batch_masks({3, 1}, 3, {2, 3}, 3);
    REQUIRE(m.encoder.shape() == std::array<std::size_t, 3>{2, 3, 3});
    REQUIRE(m.decoder.shape() == std::array<std::size_t, 3>{2, 3, 3});
    REQUIRE(m.cross.shape() == std::array<std::size_t, 3>{2, 3, 3});
    // encoder: every query of sequence 1, padded ones too, sees its one real key
    CHECK(drawn3(m.encoder, 0) == "xxx/xxx/xxx/");
    CHECK(drawn3(m.encoder, 1) == "x../x../x../");
    // decoder: causal, and sequence 0's padded key 2 hidden from its padded query 2
    CHECK(drawn3(m.decoder, 0) == "x../xx./xx./");
    CHECK(drawn3(m.decoder, 1) == "x../xx./xxx/");
    // cross: the source's padding, whatever the decoder's length
    CHECK(drawn3(m.cross, 0) == "xxx/xxx/xxx/");
    CHECK(drawn3(m.cross, 1) == "x../x../x../");
}

TEST_CASE("cross-attention hides the source's padding, not the decoder's") {
    // sources of 4 and 2 tokens (S = 4), decoder inputs of 1 and 3 tokens (T = 3)
    const exercise::BatchMasks m = batch_masks({4, 2}, 4, {1, 3}, 3);
    REQUIRE(m.cross.shape() == std::array<std::size_t, 3>{2, 3, 4});
    CHECK(drawn3(m.cross, 0) == "xxxx/xxxx/xxxx/");
    CHECK(drawn3(m.cross, 1) == "xx../xx../xx../");
}

TEST_CASE("a source that is all padding hides every key of its encoder and cross-attention rows") {
    const exercise::BatchMasks m = batch_masks({0, 2}, 2, {1, 2}, 2);
    CHECK(drawn3(m.encoder, 0) == "../../");
    CHECK(drawn3(m.cross, 0) == "../../");
    CHECK(drawn3(m.encoder, 1) == "xx/xx/");
}

TEST_CASE("a chunk after a KV cache sees the whole cache: bottom-right alignment, worked by hand") {
    // 2 new queries after 3 cached positions: positions 3 and 4 of the text
    CHECK(drawn(chunk_causal_mask(2, 5)) == "xxxx./xxxxx/");
    // 1 query (one decoding step) sees every key
    CHECK(drawn(chunk_causal_mask(1, 4)) == "xxxx/");
    // no cache: the usual lower triangle
    CHECK(drawn(chunk_causal_mask(3, 3)) == "x../xx./xxx/");
}

TEST_CASE("the masked softmax of a row worked by hand: weights over the allowed keys, zero elsewhere") {
    // scores 0, ln 2, ln 3, 5 with the last two hidden: e^0 : e^ln2 = 1 : 2 -> 1/3, 2/3, 0, 0
    const Tensor3 s = {{{0.0f, std::log(2.0f), std::log(3.0f), 5.0f}}};
    const Mask<3> m = {{{true, true, false, false}}};
    const Tensor3 expected = {{{1.0f / 3.0f, 2.0f / 3.0f, 0.0f, 0.0f}}};
    // ln 2 rounded (u·0.69), exp, a 2-term sum and the division: ≲ 4u·0.67 ≈ 1.6e-7
    // (u = 2^-24), 6× under 1e-6. A softmax over every key then zeroed gives weights of
    // 1/(6 + e^5) and 2/(6 + e^5): off by ≥ 0.3.
    CHECK_CLOSE(masked_softmax(s, m), expected, 1e-6);
}

TEST_CASE("a query whose context is all padding gets weights of exactly zero, never NaN or uniform") {
    const Tensor3 s = {{{1.0f, 2.0f, 3.0f}, {0.5f, 0.5f, 0.5f}}};
    const Mask<3> m = {{{true, true, true}, {false, false, false}}};
    const Tensor3 w = masked_softmax(s, m);
    for (std::size_t j = 0; j < 3; ++j) {
        CAPTURE(j);
        CHECK(w(0, 1, j) == 0.0f);
    }
    double row0 = 0.0;
    for (std::size_t j = 0; j < 3; ++j) row0 += w(0, 0, j);
    // Σ e_j/Z, Z from the same rounded e_j: Z's γ_2 and the division's u, ≤ 3u ≈ 1.8e-7
    // (u = 2^-24; summed in double), under Approx's 1e-6·2. A −1e9 fill or no rule for an
    // empty row gives 1/3 each or NaN in row 1, caught by the == 0 above.
    CHECK(row0 == doctest::Approx(1.0).epsilon(1e-6));
}

TEST_CASE("the masked softmax of a padded row equals the softmax of the row without its padding") {
    attn::Rng rng(17);
    const Tensor3 s = rng.normal_tensor<3>({2, 3, 6}, 0.0f, 3.0f);
    Mask<3> m = xt::zeros<bool>({2, 3, 6});
    const int real[2] = {6, 4};
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t i = 0; i < 3; ++i)
            for (int j = 0; j < real[b]; ++j) m(b, i, static_cast<std::size_t>(j)) = true;
    const Tensor3 w = masked_softmax(s, m);
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t i = 0; i < 3; ++i) {
            double sum = 0.0;
            for (int j = 0; j < real[b]; ++j) sum += std::exp(static_cast<double>(s(b, i, static_cast<std::size_t>(j))));
            for (int j = 0; j < 6; ++j) {
                CAPTURE(b);
                CAPTURE(i);
                CAPTURE(j);
                const double expected = j < real[b] ? std::exp(static_cast<double>(s(b, i, static_cast<std::size_t>(j)))) / sum : 0.0;
                // float32 exp (≤ 2u), a sum of ≤ 6 terms (γ_5 of Z) and a division against
                // float64: ≤ 8u·p ≤ 4.8e-7 even at worst (u = 2^-24), 2× under 1e-6. The padding
                // counted (the softmax over all keys, a key past the length) is O(0.1) off.
                CHECK(std::fabs(w(b, i, static_cast<std::size_t>(j)) - expected) < 1e-6);
            }
        }
}

TEST_CASE("huge allowed scores neither overflow nor lose the answer") {
    const Tensor3 s = {{{1000.0f, 999.0f, -1000.0f}}};
    const Mask<3> m = {{{true, true, false}}};
    const Tensor3 w = masked_softmax(s, m);
    const double e = std::exp(1.0);
    // 1000 − 999 exact; exp, sum, division ≲ 4u·0.73 ≈ 1.8e-7 (u = 2^-24), 10× under Approx's
    // 1e-6·(1 + 0.73). Without the shift e^1000 overflows: NaN.
    CHECK(w(0, 0, 0) == doctest::Approx(e / (e + 1)).epsilon(1e-6));
    CHECK(w(0, 0, 1) == doctest::Approx(1 / (e + 1)).epsilon(1e-6));
    CHECK(w(0, 0, 2) == 0.0f);
}

TEST_CASE("property: any offset, any masked positions, any masked values: the weights are the allowed keys' softmax") {
    // Rows c + d_j with d = (−2, 0, −1, −4, −3) for offsets c from −10^6 to 10^6 (c + d_j and
    // their differences are exact in float there), under masks hiding leading, trailing,
    // interleaved keys, all but one, or all; the hidden keys hold 10^30, −10^30, 0, c + 1000
    // or c. The weights must be the softmax of the allowed d_j (float64 reference) and exactly
    // 0 elsewhere, whatever the hidden keys hold. A maximum that starts at 0 or at key 0's
    // score (hidden or not) gives e^(s − m) = 0 everywhere, 0/0. Bound, u = 2^-24: s − m is
    // exact, e^x ≤ 2u, the sum of ≤ 5 terms γ_4 and the division u: ≤ 7u·w; 9u·w is asked.
    const float d[5] = {-2, 0, -1, -4, -3};
    const float offsets[] = {0, 200, -200, 1000, -1000, 1e4f, -1e4f, 1e6f, -1e6f};
    const bool masks[6][5] = {{true, true, true, true, true},   {false, true, true, true, true},
                              {true, true, true, false, false}, {false, true, false, true, false},
                              {false, false, true, false, false}, {false, false, false, false, false}};
    const double u = std::ldexp(1.0, -24);
    for (float c : offsets)
        for (const auto& allowed : masks)
            for (float hidden : {1e30f, -1e30f, 0.0f, c + 1000.0f, c}) {
                Tensor3 s = xt::zeros<float>({1, 1, 5});
                Mask<3> m = xt::zeros<bool>({1, 1, 5});
                double z = 0.0;
                double dmax = -1e300;
                for (std::size_t j = 0; j < 5; ++j) {
                    m(0, 0, j) = allowed[j];
                    s(0, 0, j) = allowed[j] ? c + d[j] : hidden;
                    if (allowed[j]) dmax = std::max(dmax, static_cast<double>(d[j]));
                }
                for (std::size_t j = 0; j < 5; ++j)
                    if (allowed[j]) z += std::exp(d[j] - dmax);
                const Tensor3 w = masked_softmax(s, m);
                INFO("scores " << row_text(s) << ", mask " << drawn3(m, 0) << " (x: allowed); weights "
                     << row_text(w));
                INFO("the maximum is over the allowed keys only, and starts at −∞, not at 0 or at key 0");
                for (std::size_t j = 0; j < 5; ++j) {
                    CAPTURE(j);
                    const double expected = allowed[j] ? std::exp(d[j] - dmax) / z : 0.0;
                    REQUIRE(std::isfinite(w(0, 0, j)));
                    if (allowed[j])
                        CHECK(std::abs(w(0, 0, j) - expected) <= 9 * u * expected);
                    else
                        CHECK(w(0, 0, j) == 0.0f);
                }
            }
}

TEST_CASE("the loss is the mean over the real positions only, worked by hand") {
    // sequence 0 has 2 real positions (1, 2), sequence 1 has 1 (3); the 9s are padding
    const Tensor2 losses = {{1.0f, 2.0f, 9.0f}, {3.0f, 9.0f, 9.0f}};
    // Small integers: sums exact, one division (u), far inside Approx's default 100·2^-23
    // relative. Dividing by B·T, per-sequence means or padding counted give ≥ 0.5 off.
    CHECK(masked_mean_loss(losses, {2, 1}) == doctest::Approx(2.0));  // (1 + 2 + 3) / 3
    CHECK(masked_mean_loss(losses, {3, 3}) == doctest::Approx(33.0 / 6));
    CHECK(masked_mean_loss(losses, {1, 1}) == doctest::Approx(2.0));  // (1 + 3) / 2
}

TEST_CASE("bad input is refused with std::invalid_argument") {
    CHECK_THROWS_AS(batch_masks({2, 1}, 2, {1}, 2), std::invalid_argument);     // 2 sources, 1 target
    CHECK_THROWS_AS(batch_masks({}, 2, {}, 2), std::invalid_argument);         // empty batch
    CHECK_THROWS_AS(batch_masks({3}, 2, {1}, 2), std::invalid_argument);       // source longer than S
    CHECK_THROWS_AS(batch_masks({1}, 2, {0}, 2), std::invalid_argument);       // a target of 0 tokens
    CHECK_THROWS_AS(batch_masks({1}, 2, {3}, 2), std::invalid_argument);       // target longer than T
    CHECK_THROWS_AS(batch_masks({-1}, 2, {1}, 2), std::invalid_argument);
    CHECK_THROWS_AS(chunk_causal_mask(3, 2), std::invalid_argument);           // more queries than keys
    CHECK_THROWS_AS(chunk_causal_mask(0, 2), std::invalid_argument);
    CHECK_THROWS_AS(masked_softmax(xt::zeros<float>({1, 2, 3}), xt::ones<bool>({1, 3, 2})),
                    std::invalid_argument);
    CHECK_THROWS_AS(masked_mean_loss(xt::zeros<float>({2, 3}), {1}), std::invalid_argument);
    CHECK_THROWS_AS(masked_mean_loss(xt::zeros<float>({1, 3}), {4}), std::invalid_argument);
    CHECK_THROWS_AS(masked_mean_loss(xt::zeros<float>({1, 3}), {0}), std::invalid_argument);
}
