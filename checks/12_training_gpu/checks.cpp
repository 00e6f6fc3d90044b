// Checks for exercise 12: the row-wise causal softmax kernel, run in the CUDA simulator
// (each launch twice, threads in two orders, so that a race shows as a failure).
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - any T up to 70 (1 often) and scores of any size: each row is its float64 causal softmax
// - a common shift of every score leaves every weight as it was
// - any T < 1, rows < 1 or rows not a multiple of T is refused
// Families with no input in the contract say why in families.txt.
#include "exercise.hpp"

#include "attn/families.hpp"
#include "attn/property.hpp"

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

using exercise::causal_softmax;

namespace {

// Each check starts on a clean device. A kernel that fails leaves CUDA's error sticky: every
// later call returns it, so after one failed launch every later check would fail on its
// first cudaMalloc whatever its own verdict. The error is cleared as each check starts (and
// before each of a property's cases), and the check after a failed launch says so.

// Clears the error a failed launch left; returns its text ("" if there was none).
std::string clear_launch_error() {
    const cudaError_t pending = cudaPeekAtLastError();
    if (pending == cudaSuccess) return "";
    std::string what = cudaGetErrorString(pending);
#ifdef ATTN_CUDA_SIMULATED
    cuda_sim::take_failure();
#else
    cudaDeviceReset();  // a GPU context where a kernel failed is unusable until reset
#endif
    return what;
}

bool failed_before = false;  // an earlier check's launch failed

// Clears the error left by an earlier launch; the first run of a check after another
// check's failed launch says so (that check showed the error).
void start_clean() {
    clear_launch_error();  // a property's earlier case: its failure is the property's report
    if (!failed_before) return;
    MESSAGE("an earlier check's kernel launch failed, and CUDA keeps such an error for every "
            "later call: the device was reset, so this check gives its own verdict");
    failed_before = false;
}

// A doctest listener: as each check starts, clears what an earlier one left.
struct CleanDeviceListener : doctest::IReporter {
    explicit CleanDeviceListener(const doctest::ContextOptions&) {}
    void report_query(const doctest::QueryData&) override {}
    void test_run_start() override {}
    void test_run_end(const doctest::TestRunStats&) override {}
    void test_case_start(const doctest::TestCaseData&) override { failed_before = !clear_launch_error().empty(); }
    void test_case_reenter(const doctest::TestCaseData&) override {}
    void test_case_end(const doctest::CurrentTestCaseStats&) override {}
    void test_case_exception(const doctest::TestCaseException&) override {}
    void subcase_start(const doctest::SubcaseSignature&) override {}
    void subcase_end() override {}
    void log_assert(const doctest::AssertData&) override {}
    void log_message(const doctest::MessageData&) override {}
    void test_case_skipped(const doctest::TestCaseData&) override {}
};
DOCTEST_REGISTER_LISTENER("clean_device", 2, CleanDeviceListener);

// How far a correct kernel's weight may be from `ref`, the float64 causal softmax, in a row
// of T keys (u = 2^-24). CUDA's expf is within 2 ulp of the rounded e^x, so within 2.5 ulp
// ≤ 5u of e^x. A weight is e_j/Z: e_j's 5u, and s − m rounded by ≤ u·|s − m| = u·d (u·d·e^−d
// ≤ u/e, absolute); Z, T terms summed in any order, γ_(T−1) ≈ (T − 1)u, its terms' 5u and
// their arguments' Σ_k w_k·u·d_k ≤ (T − 1)u/e; the division ≤ 2u (a reciprocal, a product).
// A kernel that folds the maximum in as it goes (online softmax) rescales a partial sum by
// an expf and a product (6u) up to 7 times on a term's way (2 more keys in its lane, 5
// butterflies): 42u. In all (54 + 1.37(T − 1))u·ref + u/e ≤ (2T + 54)u·ref + u. The mistakes
// (keys missed or visited twice, masked keys in the maximum, half-warp sums) are off by
// O(0.1) or NaN.
double weight_bound(int T, double ref) {
    const double u = std::ldexp(1.0, -24);
    return (2.0 * T + 54.0) * u * ref + u;
}

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
    start_clean();
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
// more than weight_bound (a NaN counts as a miss). The mistakes (half-warp sums, keys
// visited many times, masked keys in the max) are off by O(0.1) or NaN.
int misses_on_wavy_scores(int rows, int T) {
    const auto s = wavy_scores(rows, T);
    const auto out = run(s, rows, T);
    const auto ref = reference(s, rows, T);
    int bad = 0;
    for (std::size_t n = 0; n < out.size(); ++n) {
        bad += !(std::fabs(out[n] - ref[n]) <= weight_bound(T, ref[n]));  // a NaN counts as bad
    }
    return bad;
}

// Checks every weight of `w`, the kernel's output for (rows, T) scores whose float64 causal
// softmax is `ref`: masked ones exactly 0, the others within weight_bound.
void check_rows(const std::vector<float>& w, const std::vector<double>& ref, int rows, int T) {
    for (int r = 0; r < rows; ++r)
        for (int j = 0; j < T; ++j) {
            const std::size_t n = static_cast<std::size_t>(r) * T + j;
            if (j > r % T)
                RC_ASSERT(w[n] == 0.0f);
            else
                RC_ASSERT(std::abs(w[n] - ref[n]) <= weight_bound(T, ref[n]));
        }
}

// x rounded to a multiple of 2^-10.
float on_grid(float x) { return std::ldexp(std::round(std::ldexp(x, 10)), -10); }

}  // namespace

TEST_CASE("two queries by hand: the first sees only itself, the second splits 1:3") {
    // Query 0 sees key 0 only (its 9 for key 1 is masked): [1, 0]. Query 1 sees scores
    // 0 and ln 3: weights 1 and 3 of 4, so [0.25, 0.75].
    const auto out = run({0.0f, 9.0f, 0.0f, std::log(3.0f)}, 2, 2);
    // out[0] = e^0/e^0 = 1 and out[1] = 0 exactly; 0.25, 0.75 within exp's 5u (2 ulp of the
    // rounded e^x) on each side, the sum's u and the division's 2u: ≲ 13u·0.75 ≈ 5.8e-7
    // (u = 2^-24), under Approx's 1e-6·(1 + p) ≥ 1.25e-6.
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
        // Each weight within weight_bound, (2T + 54)u·w + u, so the sum (in double) within
        // (2T + 54 + T)u ≤ 264u ≈ 1.6e-5 of 1 (u = 2^-24), under Approx's 1e-5·(1 + 1) = 2e-5.
        // Keys skipped or counted twice: off by O(0.1).
        CHECK(sum == doctest::Approx(1.0).epsilon(1e-5));
    }
}

TEST_CASE("every weight matches a float64 causal softmax, over several blocks of rows") {
    const int T = 45, rows = 3 * T;  // 135 rows: 17 blocks of 8 rows, the last one partial
    CHECK(misses_on_wavy_scores(rows, T) == 0);
}

TEST_CASE("large scores do not overflow: the maximum is subtracted before exp") {
    // exp(1000) overflows float; softmax(1000, 1001) = (1, e) / (1 + e). The shifts 0, −1 are
    // exact; exp (5u), sum and division (3u) on each side, and e, 1 + e and the quotient
    // rounded here in float (3u): ≲ 16u·0.73 ≈ 7e-7 (u = 2^-24), under Approx's
    // 1e-6·(1 + p) ≥ 1.27e-6. Without the shift: inf/inf, NaN.
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
    start_clean();
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
    // T from 1 (a quarter of the cases: one key) to 70 (lanes, warps and the boundaries
    // between them), one or two sequences of rows, scores ±(1 … 10)·10^e for e from −6 to 37
    // (differences up to 2·10^38, still finite); hidden keys (j > i) hold such a score, NaN,
    // +∞ or −∞ (the contract writes 0 there whatever the score: `e^(s − m)·0` is NaN for
    // them); the output buffer starts as garbage. Each weight within weight_bound of the
    // float64 softmax; hidden keys exactly 0.
    attn::check_property("causal_softmax equals the float64 causal softmax", [&] {
        const int T = static_cast<int>(attn::draw("T", attn::family::length(70)));
        const int heads = attn::draw("heads", rc::gen::inRange(1, 3));
        const int rows = T * heads;
        const std::size_t n = static_cast<std::size_t>(rows) * T;
        auto s = attn::draw("scores", rc::gen::container<std::vector<float>>(n, attn::family::magnitude(-6, 38)));
        const auto hidden = attn::draw("hidden keys hold", rc::gen::container<std::vector<float>>(
                                                               n, rc::gen::oneOf(attn::family::non_finite(),
                                                                                 attn::family::magnitude(-6, 38))));
        for (std::size_t k = 0; k < n; ++k)
            if (static_cast<int>(k) % T > static_cast<int>(k) / T % T) s[k] = hidden[k];
        check_rows(run(s, rows, T), reference(s, rows, T), rows, T);
    }, 60);
}

TEST_CASE("property: shifting every score by the same amount leaves every weight as it was") {
    // softmax(s + c) = softmax(s). Scores are multiples of 2^-10 of at most 10 in size and the
    // shift c (0, ±1 … ±10^4) is rounded to one too, so each s + c (below 2^14 in size) is
    // exact in float: the weights for s + c must be within weight_bound of the float64
    // softmax of s itself. A kernel that skips the maximum overflows here (e^10000).
    attn::check_property("causal_softmax(s + c) is the float64 causal softmax of s", [&] {
        const int T = static_cast<int>(attn::draw("T", attn::family::length(70)));
        const int heads = attn::draw("heads", rc::gen::inRange(1, 3));
        const int rows = T * heads;
        const auto steps = attn::draw("scores in steps of 2^-10", rc::gen::container<std::vector<int>>(
                                                                       static_cast<std::size_t>(rows) * T,
                                                                       rc::gen::inRange(-10240, 10241)));
        const float c = on_grid(attn::draw("shift", attn::family::shift()));
        std::vector<float> s(steps.size()), shifted(steps.size());
        for (std::size_t n = 0; n < s.size(); ++n) {
            s[n] = std::ldexp(static_cast<float>(steps[n]), -10);
            shifted[n] = s[n] + c;  // exact
        }
        check_rows(run(shifted, rows, T), reference(s, rows, T), rows, T);
    }, 30);
}

TEST_CASE("property: any T < 1, rows < 1 or rows not a multiple of T is refused") {
    // T that does not divide rows (0 among them), and rows or T below 1 (0, −1, −10^6, the
    // lowest int) with the other valid: std::invalid_argument each time, before any launch.
    // (−4 % 4 == 0 in C++: rows = −10^6 is a multiple of T = 4, the lowest int of T = 64.)
    start_clean();
    float* p = nullptr;
    REQUIRE(cudaMalloc(&p, 16 * sizeof(float)) == cudaSuccess);
    auto refused = [p](int rows, int T) {
        clear_launch_error();  // a wrong kernel launched for an earlier case
        try {
            causal_softmax(p, p, rows, T);
        } catch (const std::invalid_argument&) {
            return true;
        }
        return false;
    };
    auto as_int = [](long v) { return static_cast<int>(std::max<long>(v, INT_MIN)); };
    attn::check_property("causal_softmax refuses T < 1, rows < 1 and rows % T != 0", [&] {
        const int rows = attn::draw("rows", rc::gen::inRange(1, 200));
        const int T = static_cast<int>(attn::draw("T that does not divide rows",
                                                  attn::family::not_dividing(static_cast<std::size_t>(rows))));
        RC_ASSERT(refused(rows, T));
        const int good_T = attn::draw("T", rc::gen::inRange(1, 71));
        RC_ASSERT(refused(as_int(attn::draw("rows below 1", attn::family::below(1))), good_T));
        RC_ASSERT(refused(good_T, as_int(attn::draw("T below 1", attn::family::below(1)))));
    }, 100);
    clear_launch_error();
    cudaFree(p);
}
