// Checks for exercise 12: the row-wise causal softmax kernel, run in the CUDA simulator
// (each launch twice, threads in two orders, so that a race shows as a failure).
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - any T up to 70 and scores of any size: each row is its float64 causal softmax
#include "exercise.hpp"

#include "attn/property.hpp"

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

using exercise::causal_softmax;

namespace {

// Uploads `scores` (rows, T), runs the learner's kernel into an output pre-filled with
// `fill`, and returns the output.
std::vector<float> run(const std::vector<float>& scores, int rows, int T, float fill = 7.0f) {
#ifdef ATTN_CUDA_SIMULATED
    // The simulator's strictest mode: each launch twice, threads in two orders (races fail),
    // expf and the other device functions off by up to CUDA's bound in ulp (a tolerance that
    // rests on libm's exact bits fails), and device memory closed to host code outside the
    // runtime's calls (a launcher that reads a device pointer on the host is stopped).
    cuda_sim::set_racecheck(true);
    cuda_sim::set_device_math_perturbed(true);
    cuda_sim::set_device_guard(true);
#endif
    const std::size_t bytes = scores.size() * sizeof(float);
    float *d_scores = nullptr, *d_out = nullptr;
    REQUIRE(cudaMalloc(&d_scores, bytes) == cudaSuccess);
    REQUIRE(cudaMalloc(&d_out, bytes) == cudaSuccess);
    const std::vector<float> garbage(scores.size(), fill);
    REQUIRE(cudaMemcpy(d_scores, scores.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(d_out, garbage.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    std::vector<float> out(scores.size());
    try {
        causal_softmax(d_out, d_scores, rows, T);
        REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
        REQUIRE(cudaMemcpy(out.data(), d_out, bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
    } catch (...) {
        cudaFree(d_scores);
        cudaFree(d_out);
        throw;
    }
    cudaFree(d_scores);
    cudaFree(d_out);
    return out;
}

// The causal softmax in float64, written out independently of any kernel.
std::vector<double> reference(const std::vector<float>& s, int rows, int T) {
    std::vector<double> out(s.size(), 0.0);
    for (int r = 0; r < rows; ++r) {
        const int i = r % T;
        double m = -INFINITY, sum = 0.0;
        for (int k = 0; k <= i; ++k) m = std::max(m, double(s[r * T + k]));
        for (int k = 0; k <= i; ++k) sum += std::exp(double(s[r * T + k]) - m);
        for (int k = 0; k <= i; ++k) out[r * T + k] = std::exp(double(s[r * T + k]) - m) / sum;
    }
    return out;
}

std::vector<float> wavy_scores(int rows, int T) {
    std::vector<float> s(static_cast<std::size_t>(rows) * T);
    for (std::size_t n = 0; n < s.size(); ++n) {
        s[n] = 3.0f * std::sin(0.37f * static_cast<float>(n)) + 0.01f * static_cast<float>(n % 97);
    }
    return s;
}

// How many of the kernel's weights for wavy scores (rows, T) miss the float64 softmax by
// more than 1e-6 (a NaN counts as a miss). Scores |s| ≤ 4, u = 2^-24: a weight e_j/Z is
// within (2u for expf + Z's rounding + u)·p_j; Z summed by a lane (⌈T/32⌉ ≤ 3 terms) then
// a 5-level butterfly is within γ_8 = 8u, so ≤ 11u·p ≤ 6.6e-7 at worst, 1.5× under 1e-6
// (one lane summing all T ≤ 65 terms: γ_65·p ≤ 3.9e-6·p, under 1e-6 for p ≤ 0.25, which
// these spreads keep to). __expf's 2 + 1.16|x| ulp would not fit. The mistakes (half-warp
// sums, keys visited many times, masked keys in the max) are off by O(0.1) or NaN.
int misses_on_wavy_scores(int rows, int T) {
    const auto s = wavy_scores(rows, T);
    const auto out = run(s, rows, T);
    const auto ref = reference(s, rows, T);
    int bad = 0;
    for (std::size_t n = 0; n < out.size(); ++n) {
        bad += !(std::fabs(out[n] - ref[n]) <= 1e-6);  // a NaN counts as bad
    }
    return bad;
}

}  // namespace

TEST_CASE("two queries by hand: the first sees only itself, the second splits 1:3") {
    // Query 0 sees key 0 only (its 9 for key 1 is masked): [1, 0]. Query 1 sees scores
    // 0 and ln 3: weights 1 and 3 of 4, so [0.25, 0.75].
    const auto out = run({0.0f, 9.0f, 0.0f, std::log(3.0f)}, 2, 2);
    // out[0] = e^0/e^0 = 1 and out[1] = 0 exactly; 0.25, 0.75 within exp's 2u, the sum's and
    // the division's u: ≲ 4u·0.75 ≈ 1.8e-7 (u = 2^-24), under Approx's 1e-6·(1 + p) ≥ 1.25e-6.
    // Letting the query's own key go (j < i) makes row 0 0/0; no mask makes row 0 [~0, 1].
    CHECK(out[0] == doctest::Approx(1.0f));
    CHECK(out[1] == 0.0f);
    CHECK(out[2] == doctest::Approx(0.25f).epsilon(1e-6));
    CHECK(out[3] == doctest::Approx(0.75f).epsilon(1e-6));
}

TEST_CASE("every masked weight is exactly 0 and every row sums to 1, rows longer than a warp") {
    const int T = 70, rows = 2 * T;  // two heads; keys past lane 31 and 63 too
    const auto out = run(wavy_scores(rows, T), rows, T);
    for (int r = 0; r < rows; ++r) {
        double sum = 0.0;
        for (int j = 0; j < T; ++j) {
            if (j > r % T) CHECK(out[r * T + j] == 0.0f);
            sum += out[r * T + j];
        }
        // Σ e_j/Z with Z from the same rounded e_j: Z's γ_8 (butterfly; γ_70 ≈ 4.2e-6 if one
        // lane sums a row) and a division's u, summed here in double (u = 2^-24): ≤ 4.2e-6,
        // under Approx's 1e-5·(1 + 1) = 2e-5. Keys skipped or counted twice: off by O(0.1).
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
    }
}

TEST_CASE("every weight matches a float64 causal softmax, over several blocks of rows") {
    const int T = 45, rows = 3 * T;  // 135 rows: 17 blocks of 8 rows, the last one partial
    CHECK(misses_on_wavy_scores(rows, T) == 0);
}

TEST_CASE("large scores do not overflow: the maximum is subtracted before exp") {
    // exp(1000) overflows float; softmax(1000, 1001) = (1, e) / (1 + e). The shifts 0, −1 are
    // exact; exp, sum and division on each side (e is float too) ≲ 6u·0.73 ≈ 2.6e-7
    // (u = 2^-24), under Approx's 1e-6·(1 + p) ≥ 1.27e-6. Without the shift: inf/inf, NaN.
    const auto out = run({1000.0f, 0.0f, 1000.0f, 1001.0f}, 2, 2);
    const float e = std::exp(1.0f);
    CHECK(out[0] == doctest::Approx(1.0f));
    CHECK(out[2] == doctest::Approx(1.0f / (1.0f + e)).epsilon(1e-6));
    CHECK(out[3] == doctest::Approx(e / (1.0f + e)).epsilon(1e-6));
}

TEST_CASE("a masked key's score, however large, does not set the row's maximum") {
    // Query 0 sees key 0 only: [1, 0], whatever key 1 holds. A maximum taken over both keys
    // is 1000, and e^(0 − 1000) = 0 for the only key query 0 may see: 0/0.
    INFO("query 0 may see key 0 only: take the row's maximum over the keys j <= i, not over "
         "the masked key 1 whose score is 1000");
    const auto out = run({0.0f, 1000.0f, 0.0f, 1.0f}, 2, 2);
    const float e = std::exp(1.0f);
    CHECK(out[0] == doctest::Approx(1.0f));
    CHECK(out[1] == 0.0f);
    CHECK(out[2] == doctest::Approx(1.0f / (1.0f + e)).epsilon(1e-6));
    CHECK(out[3] == doctest::Approx(e / (1.0f + e)).epsilon(1e-6));
}

TEST_CASE("scores around -1000 do not underflow: the maximum starts at minus infinity") {
    // softmax(−1000, −1001) = (e, 1) / (1 + e): a maximum that starts at 0 stays 0 here, and
    // e^(−1000) is 0 in float: 0/0.
    INFO("every score is near -1000: the running maximum must start at -infinity (or the "
         "first score), not at 0, or every e^(s - m) underflows to 0");
    const auto out = run({-1000.0f, 5.0f, -1000.0f, -1001.0f}, 2, 2);
    const float e = std::exp(1.0f);
    CHECK(out[0] == doctest::Approx(1.0f));
    CHECK(out[1] == 0.0f);
    CHECK(out[2] == doctest::Approx(e / (1.0f + e)).epsilon(1e-6));
    CHECK(out[3] == doctest::Approx(1.0f / (1.0f + e)).epsilon(1e-6));
}

TEST_CASE("rows of 31, 32, 33, 64 and 65 keys: every lane and every warp boundary") {
    // One key short of, exactly at and one past a warp's 32 lanes (and two warps' 64): a
    // lane that misses its last key or visits one twice shows here.
    for (int T : {31, 32, 33, 64, 65}) {
        CAPTURE(T);
        const int rows = 3 * T;  // three heads
        CHECK(misses_on_wavy_scores(rows, T) == 0);
    }
}

TEST_CASE("a single key: every row is [1]") {
    const auto out = run({-5.0f, 0.0f, 42.0f}, 3, 1);
    // Exact: e^(s − s) = 1 divided by 1.
    CHECK(out == std::vector<float>{1.0f, 1.0f, 1.0f});
}

TEST_CASE("rows that are not a multiple of T, no rows at all, or negative sizes are refused") {
    float* p = nullptr;
    REQUIRE(cudaMalloc(&p, 16 * sizeof(float)) == cudaSuccess);
    CHECK_THROWS_AS(causal_softmax(p, p, 5, 4), std::invalid_argument);
    CHECK_THROWS_AS(causal_softmax(p, p, 0, 4), std::invalid_argument);
    CHECK_THROWS_AS(causal_softmax(p, p, 4, 0), std::invalid_argument);
    INFO("-4 % 4 == 0 in C++, but -4 rows is no number of rows: refuse rows < 1 and T < 1");
    CHECK_THROWS_AS(causal_softmax(p, p, -4, 4), std::invalid_argument);
    CHECK_THROWS_AS(causal_softmax(p, p, 4, -4), std::invalid_argument);
    cudaFree(p);
}

TEST_CASE("property: any T up to 70 and scores of any size: each row is its float64 causal softmax") {
    // T from 1 to 70 (lanes, warps and the boundaries between them), one or two sequences of
    // rows, scores ±(1 … 10)·10^e for e from −3 to 30, hidden keys (j > i) holding anything
    // as well; the output buffer starts as garbage. Bound (u = 2^-24), as lesson 04's: s − m
    // rounds by ≤ u·|s − m| and u·d·e^−d ≤ u/e; exp ≤ 2u, a sum of ≤ T terms in any order
    // γ_(T−1), the division u: |w − ref| ≤ (T + 3)u·ref + u. Hidden keys exactly 0.
    const double u = std::ldexp(1.0, -24);
    const auto score = attn::magnitudes(-3, 31);
    attn::check_property("causal_softmax equals the float64 causal softmax", [&] {
        const int T = *rc::gen::inRange(1, 71), rows = T * *rc::gen::inRange(1, 3);
        const auto s = *rc::gen::container<std::vector<float>>(static_cast<std::size_t>(rows) * T, score);
        const std::vector<float> w = run(s, rows, T);
        const std::vector<double> ref = reference(s, rows, T);
        for (int r = 0; r < rows; ++r)
            for (int j = 0; j < T; ++j) {
                const std::size_t n = static_cast<std::size_t>(r) * T + j;
                if (j > r % T)
                    RC_ASSERT(w[n] == 0.0f);
                else
                    RC_ASSERT(std::abs(w[n] - ref[n]) <= (T + 3) * u * ref[n] + u);
            }
    }, 60);
}

