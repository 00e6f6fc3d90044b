// Checks for exercise 17: the masks of a padded encoder–decoder batch, the masked softmax
// and the loss over the real positions.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - the masks of any padded batch are the contract's, in its shapes
// - every padded length below 1 and every length outside its range is refused
// - a chunk of any length after a cache of any length sees the cache and its own past
// - any offset, any masked positions, any masked values: the weights are the allowed keys' softmax
// - scores of any size under masks of every kind, with anything in the hidden keys
// - a common shift, or the keys reordered with their mask, changes no weight beyond rounding
// - the loss of any sizes of losses at any offset is the exact mean over the real positions
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

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

TEST_CASE("padded lengths of one are valid: S = 1 and T = 1, worked by hand") {
    INFO("S and T must be at least 1, and 1 is allowed: a one-token source or decoder input");
    // S = T = 1: sources of 1 and 0 tokens, decoder inputs of 1 token each
    const exercise::BatchMasks one = batch_masks({1, 0}, 1, {1, 1}, 1);
    REQUIRE(one.encoder.shape() == std::array<std::size_t, 3>{2, 1, 1});
    REQUIRE(one.decoder.shape() == std::array<std::size_t, 3>{2, 1, 1});
    REQUIRE(one.cross.shape() == std::array<std::size_t, 3>{2, 1, 1});
    CHECK(drawn3(one.encoder, 0) == "x/");
    CHECK(drawn3(one.encoder, 1) == "./");
    CHECK(drawn3(one.decoder, 1) == "x/");
    CHECK(drawn3(one.cross, 0) == "x/");
    CHECK(drawn3(one.cross, 1) == "./");
    // T = 1 with S = 2, and S = 1 with T = 3
    const exercise::BatchMasks first = batch_masks({2}, 2, {1}, 1);
    REQUIRE(first.cross.shape() == std::array<std::size_t, 3>{1, 1, 2});
    CHECK(drawn3(first.decoder, 0) == "x/");
    CHECK(drawn3(first.cross, 0) == "xx/");
    const exercise::BatchMasks source_of_one = batch_masks({1}, 1, {3}, 3);
    REQUIRE(source_of_one.cross.shape() == std::array<std::size_t, 3>{1, 3, 1});
    CHECK(drawn3(source_of_one.encoder, 0) == "x/");
    CHECK(drawn3(source_of_one.decoder, 0) == "x../xx./xxx/");
    CHECK(drawn3(source_of_one.cross, 0) == "x/x/x/");
}

TEST_CASE("property: the masks of any padded batch are the contract's, in its shapes") {
    // B from 1 to 3, S and T from 1 to 6 (1 a quarter of the time each), source lengths in
    // [0, S], target lengths in [1, T]: the shapes (B, S, S), (B, T, T) and (B, T, S), and
    // every entry as the contract defines it (encoder j < src, decoder j ≤ i and j < tgt,
    // cross j < src).
    attn::check_property("batch_masks of any padded batch", [] {
        const std::size_t B = attn::draw("B", attn::family::length(3));
        const int S = static_cast<int>(attn::draw("S", attn::family::length(6)));
        const int T = static_cast<int>(attn::draw("T", attn::family::length(6)));
        const auto src = attn::draw("source lengths", rc::gen::container<std::vector<int>>(B, rc::gen::inRange(0, S + 1)));
        const auto tgt = attn::draw("target lengths", rc::gen::container<std::vector<int>>(B, rc::gen::inRange(1, T + 1)));
        const exercise::BatchMasks m = batch_masks(src, S, tgt, T);
        const std::size_t s = static_cast<std::size_t>(S), t = static_cast<std::size_t>(T);
        RC_ASSERT(m.encoder.shape() == (std::array<std::size_t, 3>{B, s, s}));
        RC_ASSERT(m.decoder.shape() == (std::array<std::size_t, 3>{B, t, t}));
        RC_ASSERT(m.cross.shape() == (std::array<std::size_t, 3>{B, t, s}));
        for (std::size_t b = 0; b < B; ++b) {
            const std::size_t n_src = static_cast<std::size_t>(src[b]), n_tgt = static_cast<std::size_t>(tgt[b]);
            for (std::size_t i = 0; i < s; ++i)
                for (std::size_t j = 0; j < s; ++j) RC_ASSERT(m.encoder(b, i, j) == (j < n_src));
            for (std::size_t i = 0; i < t; ++i) {
                for (std::size_t j = 0; j < t; ++j) RC_ASSERT(m.decoder(b, i, j) == (j <= i && j < n_tgt));
                for (std::size_t j = 0; j < s; ++j) RC_ASSERT(m.cross(b, i, j) == (j < n_src));
            }
        }
    });
}

TEST_CASE("property: every padded length below 1 and every length outside its range is refused") {
    // One thing wrong at a time, the rest valid (B from 1 to 3, S and T from 1 to 6):
    // S below 1 (0, −1, −2, −10^6, the lowest int) with sources of 0 tokens, the only length
    // a padded length of 0 would allow; T below 1; a source length below 0 or past S; a
    // target length below 1 or past T; one more target than sources. Each must throw
    // std::invalid_argument.
    const auto below = [](const char* name, long lowest) {
        return static_cast<int>(std::max<long>(attn::draw(name, attn::family::below(lowest)), std::numeric_limits<int>::min()));
    };
    attn::check_property("batch_masks refuses every padded length and every length out of range", [&] {
        const std::size_t B = attn::draw("B", attn::family::length(3));
        int S = static_cast<int>(attn::draw("S", attn::family::length(6)));
        int T = static_cast<int>(attn::draw("T", attn::family::length(6)));
        auto src = attn::draw("source lengths", rc::gen::container<std::vector<int>>(B, rc::gen::inRange(0, S + 1)));
        auto tgt = attn::draw("target lengths", rc::gen::container<std::vector<int>>(B, rc::gen::inRange(1, T + 1)));
        const std::size_t at = attn::draw("which sequence", rc::gen::inRange<std::size_t>(0, B));
        switch (attn::draw("what is wrong", rc::gen::inRange(0, 7))) {
            case 0:
                S = below("S", 1);
                std::fill(src.begin(), src.end(), 0);
                break;
            case 1: T = below("T", 1); break;
            case 2: src[at] = below("a source length", 0); break;
            case 3: src[at] = S + attn::draw("a source length past S by", rc::gen::inRange(1, 3)); break;
            case 4: tgt[at] = below("a target length", 1); break;
            case 5: tgt[at] = T + attn::draw("a target length past T by", rc::gen::inRange(1, 3)); break;
            default: tgt.push_back(1); break;
        }
        RC_ASSERT(attn::refused([&] { (void)batch_masks(src, S, tgt, T); }));
    });
}

TEST_CASE("a chunk after a KV cache sees the whole cache: bottom-right alignment, worked by hand") {
    // 2 new queries after 3 cached positions: positions 3 and 4 of the text
    CHECK(drawn(chunk_causal_mask(2, 5)) == "xxxx./xxxxx/");
    // 1 query (one decoding step) sees every key
    CHECK(drawn(chunk_causal_mask(1, 4)) == "xxxx/");
    // no cache: the usual lower triangle
    CHECK(drawn(chunk_causal_mask(3, 3)) == "x../xx./xxx/");
}

TEST_CASE("property: a chunk of any length after a cache of any length sees the cache and its own past") {
    // T_q from 1 to 6 (1 a quarter of the time: one decoding step) after 0 to 6 cached
    // positions: shape (T_q, T_k) and m(i, j) = j ≤ i + T_k − T_q. Then T_q below 1 (0, −1,
    // −2, −10^6, the lowest int), or T_k below T_q by 1 to 3: std::invalid_argument.
    attn::check_property("chunk_causal_mask is bottom-right aligned for any chunk and cache", [] {
        const int Tq = static_cast<int>(attn::draw("T_q", attn::family::length(6)));
        const int cached = attn::draw("cached positions", rc::gen::inRange(0, 7));
        const int Tk = Tq + cached;
        const Mask<2> m = chunk_causal_mask(Tq, Tk);
        RC_ASSERT(m.shape() == (std::array<std::size_t, 2>{static_cast<std::size_t>(Tq), static_cast<std::size_t>(Tk)}));
        for (int i = 0; i < Tq; ++i)
            for (int j = 0; j < Tk; ++j)
                RC_ASSERT(m(static_cast<std::size_t>(i), static_cast<std::size_t>(j)) == (j <= i + cached));
        const bool no_queries = attn::draw("refused for (else T_k < T_q)", rc::gen::arbitrary<bool>());
        const int bad_q = static_cast<int>(std::max<long>(attn::draw("T_q below 1", attn::family::below(1)),
                                                          std::numeric_limits<int>::min()));
        const int short_by = attn::draw("T_k short of T_q by", rc::gen::inRange(1, 4));
        RC_ASSERT(attn::refused([&] { (void)(no_queries ? chunk_causal_mask(bad_q, Tk) : chunk_causal_mask(Tq, Tq - short_by)); }));
    });
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

namespace {

// RC_ASSERTs that w is the masked softmax of s under m, against float64, row by row. Bound,
// with u = 2^-24, for a row of n allowed keys, d_j = s_j − m: s_j − m rounds by ≤ u·|d_j|,
// which moves a weight by ≤ p_j·u·|d_j| ≤ u/e (x·e^−x ≤ 1/e) and the sum Z by ≤ n·u/e of
// itself; e^x adds 2u, Z's sum γ_n, the division u: |w_j − p_j| ≤ u + (2n + 4)u·p_j. A one-pass
// (online) form rescales Z up to n times, 3u each: (4n + 6)u·p_j is asked, plus 2^-149 for a
// weight that falls among float's subnormals (rounded by ≤ 2^-150 absolutely, then divided
// by Z ≥ 1). A key the mask hides, and every key of a row it hides whole, must be exactly 0.
void check_masked_softmax(const Tensor3& w, const Tensor3& s, const Mask<3>& m) {
    const double u = std::ldexp(1.0, -24);
    RC_ASSERT(w.shape() == s.shape());
    for (std::size_t b = 0; b < s.shape()[0]; ++b)
        for (std::size_t i = 0; i < s.shape()[1]; ++i) {
            double top = -INFINITY, z = 0.0, n = 0.0;
            for (std::size_t j = 0; j < s.shape()[2]; ++j)
                if (m(b, i, j)) {
                    top = std::max(top, static_cast<double>(s(b, i, j)));
                    n += 1;
                }
            for (std::size_t j = 0; j < s.shape()[2]; ++j)
                if (m(b, i, j)) z += std::exp(s(b, i, j) - top);
            for (std::size_t j = 0; j < s.shape()[2]; ++j) {
                if (!m(b, i, j)) {
                    RC_ASSERT(w(b, i, j) == 0.0f);
                    continue;
                }
                const double p = std::exp(s(b, i, j) - top) / z;
                RC_ASSERT(std::abs(w(b, i, j) - p) <= u + (4 * n + 6) * u * p + std::ldexp(1.0, -149));
            }
        }
}

}  // namespace

TEST_CASE("property: scores of any size under masks of every kind, with anything in the hidden keys") {
    // B, T_q and T_k from 1 to 4 (1 a quarter of the time each), so that B, T_q and T_k
    // differ (an index b and i exchanged, or T_q taken for T_k, shows); allowed scores a
    // common offset (0, ±1 … ±10^4) plus ±10^−6 … 10^30, each batch's mask of a drawn kind
    // (leading, trailing, interleaved, one key, all keys, causal), one row sometimes hidden
    // whole (a query whose context is all padding); hidden keys hold NaN, ±∞, or a score of
    // any size. Against float64 (check_masked_softmax's bound). A maximum over all but the
    // first or the last allowed key misses a score far above the rest: e^(s − m) overflows.
    attn::check_property("masked_softmax of any scores under any mask equals the float64 masked softmax", [] {
        const std::size_t B = attn::draw("B", attn::family::length(4)), Tq = attn::draw("T_q", attn::family::length(4)),
                          Tk = attn::draw("T_k", attn::family::length(4));
        const float c = attn::draw("offset", attn::family::offset());
        const auto allowed = attn::draw("scores (before the offset, flat)",
                                        rc::gen::container<std::vector<float>>(B * Tq * Tk, attn::family::magnitude(-6, 30)));
        const auto hidden = attn::draw("hidden keys hold (flat)",
                                       rc::gen::container<std::vector<float>>(B * Tq * Tk, rc::gen::oneOf(attn::family::non_finite(),
                                                                                                         attn::family::magnitude(-6, 38))));
        Mask<3> m = xt::zeros<bool>({B, Tq, Tk});
        for (std::size_t b = 0; b < B; ++b) xt::view(m, b) = attn::family::mask("mask " + std::to_string(b), Tq, Tk);
        if (attn::draw("one row hidden whole", rc::gen::arbitrary<bool>()))
            xt::view(m, attn::draw("its batch", rc::gen::inRange<std::size_t>(0, B)),
                     attn::draw("its row", rc::gen::inRange<std::size_t>(0, Tq)), xt::all()) = false;
        Tensor3 s = xt::zeros<float>({B, Tq, Tk});
        for (std::size_t k = 0; k < s.size(); ++k) s.flat(k) = m.flat(k) ? allowed[k] + c : hidden[k];
        check_masked_softmax(masked_softmax(s, m), s, m);
    });
}

TEST_CASE("property: a common shift, or the keys reordered with their mask, changes no weight beyond rounding") {
    // B, T_q, T_k from 1 to 4, scores pairwise distinct (1/8 … 8·n, either sign), masks of
    // every kind. Invariances: the softmax of s + c over the allowed keys is the softmax of s
    // (c a shift 0, ±1 … ±10^4; s + c rounds, so it is held against float64 on the rounded
    // scores), and the keys of every row permuted with their mask give the weights permuted:
    // each within check_masked_softmax's bound of the float64 weights, which do not depend on
    // the shift's or the order's arithmetic.
    attn::check_property("masked_softmax is shift-invariant and permutes with its keys", [] {
        const std::size_t B = attn::draw("B", attn::family::length(4)), Tq = attn::draw("T_q", attn::family::length(4)),
                          Tk = attn::draw("T_k", attn::family::length(4));
        const auto values = attn::draw("scores (flat, distinct)", attn::family::distinct(B * Tq * Tk));
        const float c = attn::draw("shift", attn::family::shift());
        const auto order = attn::draw("the keys' order", attn::family::permutation(Tk));
        Mask<3> m = xt::zeros<bool>({B, Tq, Tk});
        for (std::size_t b = 0; b < B; ++b) xt::view(m, b) = attn::family::mask("mask " + std::to_string(b), Tq, Tk);
        Tensor3 s = xt::zeros<float>({B, Tq, Tk});
        std::copy(values.begin(), values.end(), s.begin());
        const Tensor3 w = masked_softmax(s, m);
        check_masked_softmax(w, s, m);
        const Tensor3 shifted = s + c;
        check_masked_softmax(masked_softmax(shifted, m), shifted, m);
        Tensor3 moved = s;
        Mask<3> moved_mask = m;
        for (std::size_t j = 0; j < Tk; ++j) {
            xt::view(moved, xt::all(), xt::all(), j) = xt::view(s, xt::all(), xt::all(), order[j]);
            xt::view(moved_mask, xt::all(), xt::all(), j) = xt::view(m, xt::all(), xt::all(), order[j]);
        }
        check_masked_softmax(masked_softmax(moved, moved_mask), moved, moved_mask);
    });
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

TEST_CASE("the loss of one large position among many small ones is summed in double") {
    // One loss of 2^24 and 15 of 1: the exact mean is (2^24 + 15)/16 = 1048576.9375. A float
    // holds 2^24 + 1 as 2^24 (its spacing there is 2): a sum kept in float stops counting the
    // ones and gives 2^24/16 = 1048576. In double every partial sum here is an integer below
    // 2^53, exact, and the one division rounds by ½ulp: within 1.2e-10, and the float sum is
    // 0.94 off. Approx's epsilon(1e-12) allows 1e-12·(1 + 1.05e6) ≈ 1.05e-6.
    INFO("sum the losses in double, as the return type says: a float accumulator stops growing by 1 past 2^24");
    Tensor2 losses = xt::ones<float>({2, 8});
    losses(0, 0) = 16777216.0f;
    CHECK(masked_mean_loss(losses, {8, 8}) == doctest::Approx((16777216.0 + 15.0) / 16.0).epsilon(1e-12));
}

TEST_CASE("property: the loss of any sizes of losses at any offset is the exact mean over the real positions") {
    // B from 1 to 4, T from 1 to 6 (1 a quarter of the time each), lengths in [1, T], losses
    // c + ±10^−6 … 10^30 (c an offset 0, ±1 … ±10^4) at the real positions and NaN, ±∞ or
    // anything at the padded ones. Against the mean taken in long double: a double sum of
    // N = Σ lengths terms is within γ_N·Σ|l| ≈ N·2^-53·Σ|l|, the division adds ½ulp, and long
    // double's own sum 2^-64·N·Σ|l|: |mean − ref| ≤ (N + 2)·2^-53·Σ|l| / N. A sum kept in float
    // rounds by 2^-24 of a partial sum, 2^29 times more.
    attn::check_property("masked_mean_loss is the mean of the real positions, to double's rounding", [] {
        const std::size_t B = attn::draw("B", attn::family::length(4)), T = attn::draw("T", attn::family::length(6));
        const auto lengths = attn::draw("target lengths",
                                        rc::gen::container<std::vector<int>>(B, rc::gen::inRange(1, static_cast<int>(T) + 1)));
        const float c = attn::draw("offset", attn::family::offset());
        const auto real = attn::draw("losses (before the offset, flat)",
                                     rc::gen::container<std::vector<float>>(B * T, attn::family::magnitude(-6, 30)));
        const float padding = attn::draw("the padded positions hold", rc::gen::oneOf(attn::family::non_finite(), attn::family::magnitude(-6, 38)));
        Tensor2 losses = xt::zeros<float>({B, T});
        long double sum = 0.0L, size = 0.0L;
        double count = 0.0;
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t t = 0; t < T; ++t) {
                const bool in = t < static_cast<std::size_t>(lengths[b]);
                losses(b, t) = in ? real[b * T + t] + c : padding;
                if (in) {
                    sum += losses(b, t);
                    size += std::abs(static_cast<long double>(losses(b, t)));
                    count += 1;
                }
            }
        const double got = masked_mean_loss(losses, lengths);
        const double ref = static_cast<double>(sum / count);
        RC_ASSERT(std::abs(got - ref) <= (count + 2) * std::ldexp(1.0, -53) * static_cast<double>(size) / count);
    });
}

TEST_CASE("bad input is refused with std::invalid_argument") {
    CHECK_THROWS_AS(batch_masks({2, 1}, 2, {1}, 2), std::invalid_argument);     // 2 sources, 1 target
    CHECK_THROWS_AS(batch_masks({}, 2, {}, 2), std::invalid_argument);         // empty batch
    CHECK_THROWS_AS(batch_masks({3}, 2, {1}, 2), std::invalid_argument);       // source longer than S
    CHECK_THROWS_AS(batch_masks({1}, 2, {0}, 2), std::invalid_argument);       // a target of 0 tokens
    CHECK_THROWS_AS(batch_masks({1}, 2, {3}, 2), std::invalid_argument);       // target longer than T
    CHECK_THROWS_AS(batch_masks({-1}, 2, {1}, 2), std::invalid_argument);
    CHECK_THROWS_AS(batch_masks({0}, 0, {1}, 1), std::invalid_argument);      // S = 0: no source position
    CHECK_THROWS_AS(batch_masks({0, 0}, -1, {1, 1}, 1), std::invalid_argument);
    CHECK_THROWS_AS(batch_masks({1}, 1, {1}, 0), std::invalid_argument);      // T = 0
    CHECK_THROWS_AS(chunk_causal_mask(3, 2), std::invalid_argument);           // more queries than keys
    CHECK_THROWS_AS(chunk_causal_mask(0, 2), std::invalid_argument);
    CHECK_THROWS_AS(masked_softmax(xt::zeros<float>({1, 2, 3}), xt::ones<bool>({1, 3, 2})),
                    std::invalid_argument);
    CHECK_THROWS_AS(masked_mean_loss(xt::zeros<float>({2, 3}), {1}), std::invalid_argument);
    CHECK_THROWS_AS(masked_mean_loss(xt::zeros<float>({1, 3}), {4}), std::invalid_argument);
    CHECK_THROWS_AS(masked_mean_loss(xt::zeros<float>({1, 3}), {0}), std::invalid_argument);
}
