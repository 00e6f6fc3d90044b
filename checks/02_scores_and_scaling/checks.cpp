// Checks for exercise 02: scaled attention scores.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for any B, T_q, T_k and d_k, each score is q_i·k_j / √d_k of its own sequence
// - queries and keys of any magnitude, all entries distinct: q·kᵀ/√d_k, and scaling q scales the scores exactly
#include "exercise.hpp"

#include "attn/attention.hpp"
#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/property.hpp"
#include "attn/random.hpp"

#include <doctest/doctest.h>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

using attn::Tensor3;
using exercise::scaled_scores;

TEST_CASE("scores of a small input match values worked by hand") {
    // Two queries and three keys of size hs = 2, so every score is divided by √2.
    Tensor3 q = {{{1, 0}, {0, 1}}};
    Tensor3 k = {{{1, 1}, {2, 0}, {0, 3}}};
    // q0·k = (1, 2, 0), q1·k = (1, 0, 3).
    const Tensor3 expected = Tensor3({{{1, 2, 0}, {1, 0, 3}}}) / std::sqrt(2.0f);
    INFO("q0·k = (1, 2, 0) and q1·k = (1, 0, 3), each divided by √hs = √2");
    // The dots are exact (small integers); dividing by √2 or multiplying by 1/√2 differ by
    // ≤ 2 ulp of ≤ 2.2, 4.8e-7: 2× under 1e-6. Every scaling mistake is off by ≥ 0.3.
    CHECK_CLOSE(scaled_scores(q, k), expected, 1e-6);
}

TEST_CASE("the result has shape (B, T_q, T_k) and sequences do not mix") {
    attn::Rng rng(1);
    Tensor3 q = rng.normal_tensor<3>({4, 5, 4});
    Tensor3 k = rng.normal_tensor<3>({4, 6, 4});
    const Tensor3 before = scaled_scores(q, k);
    CHECK(attn::shape_of(before) == "(4, 5, 6)");
    // Swapping the batch axis into the transpose would make sequence 0 read sequence 3.
    xt::view(k, 3) += 1.0f;
    const Tensor3 after = scaled_scores(q, k);
    CHECK_CLOSE(xt::view(after, 0), xt::view(before, 0), 0.0);
    CHECK_CLOSE(xt::view(after, 1), xt::view(before, 1), 0.0);
    CHECK(xt::amax(xt::abs(xt::view(after, 3) - xt::view(before, 3)))() > 0.1f);
}

TEST_CASE("agrees with attn::attention_scores on random input") {
    attn::Rng rng(2);
    for (std::size_t hs : {1, 16, 64}) {
        CAPTURE(hs);
        Tensor3 q = rng.normal_tensor<3>({3, 7, hs}), k = rng.normal_tensor<3>({3, 7, hs});
        // Sums of up to n = 64 products of N(0,1) numbers (Σ|qk| ≈ 41, ≲ 60), divided by 8
        // (exact, as 4 and 1 are), possibly in another order: 2γ_64·60/8 ≈ 5.7e-5 worst
        // (u = 2^-24), √64 u·7.5 ≈ 3.6e-6 with random signs: 1e-5 rests on that, 2.8× above.
        // The mistakes (unscaled, /hs, ×√hs, /√T_q, k·qᵀ, another sequence's keys) move the
        // scores by O(0.1–10).
        CHECK_CLOSE(scaled_scores(q, k), attn::attention_scores(q, k), 1e-5);
    }
}

TEST_CASE("more queries than keys, fewer, one of each, and one sequence") {
    // The other checks have T_q <= T_k: here T_q > T_k too, single queries and keys, B = 1.
    attn::Rng rng(5);
    for (std::size_t B : {1, 3})
        for (const auto& [T_q, T_k] : {std::pair<std::size_t, std::size_t>{1, 1}, {6, 2}, {2, 6}})
            for (std::size_t hs : {1, 5}) {
                CAPTURE(B);
                CAPTURE(T_q);
                CAPTURE(T_k);
                CAPTURE(hs);
                const Tensor3 q = rng.normal_tensor<3>({B, T_q, hs});
                const Tensor3 k = rng.normal_tensor<3>({B, T_k, hs});
                const Tensor3 s = scaled_scores(q, k);
                REQUIRE(attn::shape_of(s) == attn::shape_of(attn::attention_scores(q, k)));
                // n ≤ 5 products of N(0,1) numbers, Σ|qk| ≲ 10: 2γ_5·10 ≈ 6e-6 even at worst
                // (u = 2^-24, the scale ≤ 1 only shrinks it); mistakes are O(0.1) or more.
                CHECK_CLOSE(s, attn::attention_scores(q, k), 1e-5);
            }
}

TEST_CASE("scaled scores of unit-variance queries and keys have standard deviation near 1") {
    attn::Rng rng(3);
    Tensor3 q = rng.normal_tensor<3>({4, 64, 256}), k = rng.normal_tensor<3>({4, 64, 256});
    const Tensor3 s = scaled_scores(q, k);
    double sum2 = 0;
    for (float v : s) sum2 += double(v) * v;
    const double spread = std::sqrt(sum2 / double(s.size()));
    // 16384 scores: the sampling error of a standard deviation is ~1/√(2·16384) ≈ 0.6%;
    // without the scaling it would be √256 = 16. (Statistical: Approx allows 0.05·(1 + 1)
    // = 0.1 absolute, ~16 sampling errors; /hs gives 1/16, /√T_q gives 2, ×√hs 256.)
    CHECK(spread == doctest::Approx(1.0).epsilon(0.05));
}

TEST_CASE("property: for any B, T_q, T_k and d_k, each score is q_i·k_j / √d_k of its own sequence") {
    // B from 1 to 3, T_q and T_k from 1 to 6 (1 a quarter of the time), d_k from 1 to 16,
    // entries small integers, against the float64 q·k/√d_k. Bound (u = 2^-24): a solution may
    // scale the dot product (exact here) or q first (then each term is rounded once, ≤ u);
    // either way √d_k or 1/√d_k rounds once or twice (≤ 2u), and a sum of d_k rounded terms
    // adds γ_(d_k): within (d_k + 3)u·Σ_c |q_c k_c|/√d_k. A score taken from another sequence,
    // k·qᵀ for q·kᵀ, or another scale (none, d_k, T, times √d_k) is off by far more.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("scaled_scores equals q·kᵀ/√d_k for any shapes", [u] {
        const std::size_t B = attn::draw("B", attn::family::length(3)),
                          Tq = attn::draw("T_q", attn::family::length(6)),
                          Tk = attn::draw("T_k", attn::family::length(6)),
                          d = attn::draw("d_k", rc::gen::inRange<std::size_t>(1, 17));
        const auto small = rc::gen::map(rc::gen::inRange(-4, 5), [](int i) { return static_cast<float>(i); });
        const auto qs = attn::draw("q (flat)", rc::gen::container<std::vector<float>>(B * Tq * d, small));
        const auto ks = attn::draw("k (flat)", rc::gen::container<std::vector<float>>(B * Tk * d, small));
        Tensor3 q = xt::zeros<float>({B, Tq, d}), k = xt::zeros<float>({B, Tk, d});
        std::copy(qs.begin(), qs.end(), q.begin());
        std::copy(ks.begin(), ks.end(), k.begin());
        const Tensor3 s = scaled_scores(q, k);
        RC_ASSERT(s.shape()[0] == B && s.shape()[1] == Tq && s.shape()[2] == Tk);
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < Tq; ++i)
                for (std::size_t j = 0; j < Tk; ++j) {
                    double dot = 0.0, size = 0.0;
                    for (std::size_t c = 0; c < d; ++c) {
                        dot += static_cast<double>(q(b, i, c)) * k(b, j, c);
                        size += std::abs(static_cast<double>(q(b, i, c)) * k(b, j, c));
                    }
                    const double root = std::sqrt(static_cast<double>(d)), ref = dot / root;
                    RC_ASSERT(std::abs(s(b, i, j) - ref) <= (static_cast<double>(d) + 3) * u * size / root);
                }
    });
}

TEST_CASE("property: queries and keys of any magnitude, all entries distinct: q·kᵀ/√d_k, and scaling q scales the scores exactly") {
    // Entries pairwise distinct (1/8 … 8 in size, either sign: a swapped argument or a
    // transposed index gives other numbers) times one magnitude per tensor, 10^-6 … 10^15,
    // so that a score is anything from ~10^-14 to ~10^32 and stays finite. Bound as above
    // plus the product's rounding, which the small integers did not have: each term is
    // rounded once (≤ u) before the sum, (d_k + 4)u·Σ_c |q_c k_c|/√d_k (u = 2^-24).
    // Then q times 2^e (e from −8 to 8): every product and partial sum is the same number
    // times 2^e, exactly (no overflow, no underflow at these sizes), so the scores must be
    // the first ones times 2^e bit for bit, whatever the order of the sums.
    const double u = std::ldexp(1.0, -24);
    attn::check_property("scaled_scores for q and k of any magnitude, and s·q gives s·scores", [u] {
        const std::size_t B = attn::draw("B", attn::family::length(2)),
                          Tq = attn::draw("T_q", attn::family::length(4)),
                          Tk = attn::draw("T_k", attn::family::length(4)),
                          d = attn::draw("d_k", attn::family::length(8));
        const float q_size = std::abs(attn::draw("q magnitude", attn::family::magnitude(-6, 15)));
        const float k_size = std::abs(attn::draw("k magnitude", attn::family::magnitude(-6, 15)));
        const auto values = attn::draw("q then k, distinct", attn::family::distinct(B * (Tq + Tk) * d));
        Tensor3 q = xt::zeros<float>({B, Tq, d}), k = xt::zeros<float>({B, Tk, d});
        for (std::size_t i = 0; i < q.size(); ++i) q.flat(i) = values[i] * q_size;
        for (std::size_t i = 0; i < k.size(); ++i) k.flat(i) = values[q.size() + i] * k_size;
        const Tensor3 s = scaled_scores(q, k);
        RC_ASSERT(s.shape()[0] == B && s.shape()[1] == Tq && s.shape()[2] == Tk);
        const double root = std::sqrt(static_cast<double>(d));
        for (std::size_t b = 0; b < B; ++b)
            for (std::size_t i = 0; i < Tq; ++i)
                for (std::size_t j = 0; j < Tk; ++j) {
                    double dot = 0.0, size = 0.0;
                    for (std::size_t c = 0; c < d; ++c) {
                        dot += static_cast<double>(q(b, i, c)) * k(b, j, c);
                        size += std::abs(static_cast<double>(q(b, i, c)) * k(b, j, c));
                    }
                    RC_ASSERT(std::abs(s(b, i, j) - dot / root) <= (static_cast<double>(d) + 4) * u * size / root);
                }
        const float scale = attn::draw("scale of q", attn::family::scale());
        const Tensor3 scaled = scaled_scores(Tensor3(q * scale), k);
        for (std::size_t i = 0; i < s.size(); ++i) RC_ASSERT(scaled.flat(i) == s.flat(i) * scale);
    });
}

TEST_CASE("shapes that do not fit are rejected with std::invalid_argument naming both shapes") {
    // q (2, 3, 4) against keys whose head size (7) or batch size (6) differs: the message
    // must show k's shape and q's size that it contradicts (4 or 2, which k's shape does not
    // contain), as the contract says: "naming both shapes". A bare "bad shapes" does not.
    attn::Rng rng(4);
    Tensor3 q = rng.normal_tensor<3>({2, 3, 4});
    const auto refusal = [&](const Tensor3& k, std::size_t q_size) {
        CAPTURE(attn::shape_of(k));
        try {
            (void)scaled_scores(q, k);
            FAIL_CHECK("scaled_scores(q " << attn::shape_of(q) << ", k " << attn::shape_of(k)
                                          << ") returned instead of throwing std::invalid_argument");
        } catch (const std::invalid_argument& e) {
            const std::string what = e.what();
            CHECK_MESSAGE(what.find(attn::shape_of(k)) != std::string::npos,
                          "the message must name k's shape " << attn::shape_of(k) << ": \"" << what << "\"");
            CHECK_MESSAGE(what.find(std::to_string(q_size)) != std::string::npos,
                          "the message must name q's shape " << attn::shape_of(q) << " (or at least its "
                          "size " << q_size << " that k's contradicts): \"" << what << "\"");
        }
    };
    SUBCASE("keys of another head size") { refusal(rng.normal_tensor<3>({2, 3, 7}), 4); }
    SUBCASE("keys from another batch size") { refusal(rng.normal_tensor<3>({6, 3, 4}), 2); }
}
