// Lesson 18: attention in reduced precision. The page that narrates this program is
// lesson.md beside it.
//
// The 16-bit formats (float16, bfloat16) beside float32: their ranges and spacing; where
// attention breaks in them, each measured: scores that overflow float16, a mask written as
// the format's most negative number, sums accumulated in 16 bits as T grows, and the
// online softmax with 16-bit inputs and float32 statistics against FlashAttention's rule;
// then mixed-precision training of the CPU recipe (bfloat16, float16 without and with loss
// scaling, beside float32), and the tensor-core kernels (in the CUDA simulator without a
// GPU). `--full` trains nanoGPT's CPU recipe for its 2000 steps instead of the short
// default; `--quick` a few steps; `--data FILE` trains on another text.
// Timed: this program prints measured times, so CTest runs it with nothing beside it (RUN_SERIAL).
#include "attn/data.hpp"
#include "attn/flash.hpp"
#include "attn/fp8.hpp"
#include "attn/lesson.hpp"
#include "attn/mixed_attention.hpp"
#include "attn/plot.hpp"
#include "attn/precision.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"
#include "attn/run_control.hpp"
#include "attn/trainer.hpp"

#ifdef ATTN_HAVE_CUDA
#include "attn/cuda/buffer.hpp"
#include "attn/cuda/device.hpp"
#include "attn/cuda/half_attention.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

using namespace attn;

namespace {

const Precision formats16[] = {Precision::bf16, Precision::fp16};

std::string hex16(std::uint16_t bits) {
    char b[8];
    std::snprintf(b, sizeof b, "0x%04x", bits);
    return b;
}

// A claim in the %.3g style (1e-07, 0.0078, 6.55e+04): for numbers across many magnitudes.
void claim_g(const std::string& name, double value) {
    char b[32];
    std::snprintf(b, sizeof b, "%.3g", value);
    print_claim(name, b);
}

std::uint16_t bits16(float x, Precision p) {
    return p == Precision::bf16 ? float_to_bfloat16_bits(x) : float_to_float16_bits(x);
}

void the_formats(const LessonOptions& options) {
    print_heading("Three formats");
    std::printf("%-6s %8s %8s %13s %15s %18s %11s\n", "format", "exponent", "mantissa", "largest",
                "smallest normal", "smallest subnormal", "epsilon");
    for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
        const FormatInfo f = format_info(p);
        std::printf("%-6s %8d %8d %13.5g %15.5g %18.5g %11.5g\n", precision_name(p), f.exponent_bits,
                    f.mantissa_bits, f.max, f.min_normal, f.min_subnormal, f.epsilon);
        const std::string n = precision_name(p);
        claim_g(n + "_max", f.max);
        claim_g(n + "_epsilon", f.epsilon);
        claim_g(n + "_min_normal", f.min_normal);
        claim_g(n + "_min_subnormal", f.min_subnormal);
        // 24, 8 and 11 significant bits: about 7.2, 2.4 and 3.3 decimal digits
        print_claim(n + "_decimal_digits", (f.mantissa_bits + 1) * std::log10(2.0), 1);
    }

    std::printf("\nsome values, rounded to nearest (ties to even):\n");
    std::printf("%14s  %-24s  %-24s\n", "float32", "bfloat16", "float16");
    for (float x : {0.1f, 1.0f / 3.0f, 3.14159265f, 1000.3f, 65504.0f, 65519.0f, 65520.0f, 1e-7f, 1e-8f, 3e38f}) {
        std::printf("%14.9g", static_cast<double>(x));
        for (Precision p : formats16) {
            const float r = round_to_precision(x, p);
            std::printf("  %-13.9g (%s)", static_cast<double>(r), hex16(bits16(x, p)).c_str());
        }
        std::printf("\n");
    }
    print_claim("bf16_of_0_1", static_cast<double>(round_to_precision(0.1f, Precision::bf16)), 11);
    print_claim("fp16_of_0_1", static_cast<double>(round_to_precision(0.1f, Precision::fp16)), 11);
    print_claim("fp16_of_1000_3", static_cast<double>(round_to_precision(1000.3f, Precision::fp16)), 1);
    print_claim("bf16_of_1000_3", static_cast<double>(round_to_precision(1000.3f, Precision::bf16)), 0);

    // The gap between neighbouring values relative to the value: flat (2^-mantissa) over
    // each format's normal range, rising where its subnormals lose bits, ending at its largest.
    if (!options.figures.empty()) {
        std::vector<PlotSeries> lines;
        for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
            PlotSeries s{precision_name(p), {}, {}};
            const FormatInfo f = format_info(p);
            for (double e = -46.0; e <= 39.0; e += 0.05) {
                const double x = std::pow(10.0, e);
                if (x < f.min_subnormal || x > f.max) continue;
                s.x.push_back(e);
                s.y.push_back(std::log10(spacing(x, p) / x));
            }
            lines.push_back(s);
        }
        line_plot_png(options.figures / "lesson18_spacing.png", lines,
                      "Relative gap between neighbouring values", "log10 |x|", "log10 (gap / |x|)");
        std::printf("\nchart: lesson18_spacing.png\n");
    }
}

void rounding_to_even() {
    print_heading("Rounding a tie: to even, away from zero, or by truncation");
    //! [ties]
    // The 128 bfloat16 midpoints in [1, 2): each exactly halfway between two neighbours.
    double to_even = 0.0, away = 0.0, truncated = 0.0;
    int up = 0;
    for (int k = 0; k < 128; ++k) {
        const float mid = 1.0f + (static_cast<float>(k) + 0.5f) * 0x1p-7f;
        const float lo = 1.0f + static_cast<float>(k) * 0x1p-7f, hi = lo + 0x1p-7f;
        const float even = round_to_precision(mid, Precision::bf16);
        up += even == hi;
        to_even += static_cast<double>(even - mid);
        away += static_cast<double>(hi - mid);        // ties away from zero: always up here
        truncated += static_cast<double>(lo - mid);   // cutting the low bits: always down
    }
    //! [ties]
    std::printf("the 128 midpoints in [1, 2): to even rounds %d up and %d down\n", up, 128 - up);
    std::printf("mean signed error: to even %+.6f, ties away %+.6f, truncation %+.6f\n", to_even / 128,
                away / 128, truncated / 128);
    std::printf("bits: 1 + 2^-8 -> %s (to 1), 1 + 3*2^-8 -> %s (to 1 + 2^-6), 1 + 2^-8 + 2^-20 -> %s\n",
                hex16(float_to_bfloat16_bits(1.00390625f)).c_str(),
                hex16(float_to_bfloat16_bits(1.01171875f)).c_str(),
                hex16(float_to_bfloat16_bits(1.0f + 0x1p-8f + 0x1p-20f)).c_str());
    print_claim("ties_up", std::to_string(up));
    print_claim("tie_bias_even", to_even / 128, 6);
    print_claim("tie_bias_away", away / 128, 6);
}

// q·k summed in float32 over hs channels.
float dot(const float* a, const float* b, std::size_t n) {
    float s = 0.0f;
    for (std::size_t i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

void scores_that_overflow() {
    print_heading("Scores that overflow float16 (one head, T = 256, hs = 64, causal)");
    const std::size_t T = 256, hs = 64;
    const double ln_max = std::log(format_info(Precision::fp16).max);
    std::printf("q, k entries N(0, sigma^2) rounded to float16; a score in float16 is inf once |q.k| >= 65520,\n"
                "e^s is inf once s > ln 65504 = %.2f. Counts over the %zu visible (query, key) pairs:\n",
                ln_max, T * (T + 1) / 2);
    std::printf("%6s %12s %14s %14s %20s %18s\n", "sigma", "max |q.k|", "inf unscaled", "inf scaled",
                "inf e^s, no max", "inf e^(s-max)");
    for (float sigma : {1.0f, 8.0f, 32.0f, 64.0f, 128.0f}) {
        Rng rng(static_cast<std::uint64_t>(sigma));
        std::vector<float> q(T * hs), k(T * hs);
        for (auto* x : {&q, &k}) {
            for (float& e : *x) e = sigma * rng.normal();
            round_in_place(x->data(), x->size(), Precision::fp16);
        }
        //! [overflow]
        const float scale = 1.0f / std::sqrt(static_cast<float>(hs));  // 1/8
        int inf_unscaled = 0, inf_scaled = 0, inf_exp = 0, inf_exp_shifted = 0;
        float largest = 0.0f;
        for (std::size_t i = 0; i < T; ++i) {
            float row_max = -std::numeric_limits<float>::infinity();
            std::vector<float> s(i + 1);
            for (std::size_t j = 0; j <= i; ++j) {
                const float raw = dot(&q[i * hs], &k[j * hs], hs);  // float32 sum
                largest = std::max(largest, std::fabs(raw));
                inf_unscaled += std::isinf(round_to_precision(raw, Precision::fp16));
                s[j] = round_to_precision(raw * scale, Precision::fp16);  // the score in float16
                inf_scaled += std::isinf(s[j]);
                row_max = std::max(row_max, s[j]);
            }
            for (std::size_t j = 0; j <= i; ++j) {
                inf_exp += std::isinf(round_to_precision(std::exp(s[j]), Precision::fp16));
                inf_exp_shifted += std::isinf(round_to_precision(std::exp(s[j] - row_max), Precision::fp16));
            }
        }
        //! [overflow]
        std::printf("%6.0f %12.0f %14d %14d %20d %18d\n", static_cast<double>(sigma),
                    static_cast<double>(largest), inf_unscaled, inf_scaled, inf_exp, inf_exp_shifted);
        const std::string n = "sigma" + std::to_string(static_cast<int>(sigma));
        print_claim(n + "_inf_unscaled", std::to_string(inf_unscaled));
        print_claim(n + "_inf_scaled", std::to_string(inf_scaled));
        print_claim(n + "_inf_exp", std::to_string(inf_exp));
        print_claim(n + "_inf_exp_shifted", std::to_string(inf_exp_shifted));
    }
    print_claim("ln_fp16_max", ln_max, 2);
    print_claim("visible_pairs", std::to_string(T * (T + 1) / 2));
}

// softmax of a row in float32 from 16-bit scores, NaN where the row has no finite maximum
// to subtract (the division is 0/0), as a plain softmax does.
std::vector<float> plain_softmax(const std::vector<float>& s) {
    const float m = *std::max_element(s.begin(), s.end());
    float sum = 0.0f;
    std::vector<float> p(s.size());
    for (std::size_t j = 0; j < s.size(); ++j) sum += p[j] = std::exp(s[j] - m);
    for (float& x : p) x /= sum;
    return p;
}

std::string row_text(const std::vector<float>& x) {
    std::string out = "[";
    for (std::size_t i = 0; i < x.size(); ++i) {
        char b[24];
        if (std::isnan(x[i])) std::snprintf(b, sizeof b, "%sNaN", i ? ", " : "");
        else std::snprintf(b, sizeof b, "%s%.4g", i ? ", " : "", static_cast<double>(x[i]));
        out += b;
    }
    return out + "]";
}

void masks() {
    print_heading("A mask written as the format's most negative number (a fully masked row)");
    //! [masks]
    // A padded query: every key masked. Its scores, in float16:
    const std::vector<float> scores = {-20.0f, 3.0f, -5.0f, -17.0f, 0.5f, -30.0f};
    const float lowest = -static_cast<float>(format_info(Precision::fp16).max);  // finfo.min
    std::vector<float> minus_inf(scores.size()), filled(scores.size()), added(scores.size());
    for (std::size_t j = 0; j < scores.size(); ++j) {
        minus_inf[j] = -std::numeric_limits<float>::infinity();             // masked_fill(-inf)
        filled[j] = lowest;                                                 // masked_fill(min)
        added[j] = round_to_precision(scores[j] + lowest, Precision::fp16);  // scores + mask
    }
    //! [masks]
    const std::vector<float> p_inf = plain_softmax(minus_inf), p_filled = plain_softmax(filled),
                             p_added = plain_softmax(added);
    std::printf("scores                          %s\n", row_text(scores).c_str());
    std::printf("-inf everywhere:      softmax = %s\n", row_text(p_inf).c_str());
    std::printf("filled with -65504:   softmax = %s\n", row_text(p_filled).c_str());
    std::printf("scores + (-65504):    in float16 %s\n", row_text(added).c_str());
    std::printf("                      softmax = %s\n", row_text(p_added).c_str());
    int nan_inf = 0, inf_added = 0;
    for (float x : p_inf) nan_inf += std::isnan(x);
    for (float x : added) inf_added += std::isinf(x);
    // The threshold: -65504 + s rounds to -inf once it reaches -65520 (halfway to the next
    // power of two, a tie that goes to the even pattern, infinity).
    float threshold = 0.0f;
    while (!std::isinf(round_to_precision(lowest + threshold, Precision::fp16))) threshold -= 0.25f;
    std::printf("-65504 + s is -inf in float16 for s <= %.2f; a row whose scores are all below it is NaN:\n",
                static_cast<double>(threshold));
    std::vector<float> all_low(4);
    for (std::size_t j = 0; j < all_low.size(); ++j) {
        all_low[j] = round_to_precision(-20.0f - static_cast<float>(j) + lowest, Precision::fp16);
    }
    const std::vector<float> p_low = plain_softmax(all_low);
    std::printf("scores [-20, -21, -22, -23] + (-65504): softmax = %s\n", row_text(p_low).c_str());
    // In bfloat16 the same sum stays finite: its most negative number is -3.39e38 and
    // its spacing there 2^120, so -3.39e38 + s is -3.39e38 again.
    const float bf_lowest = -static_cast<float>(format_info(Precision::bf16).max);
    std::printf("in bfloat16: -3.39e38 + (-30) = %.6g (its spacing there is %.3g)\n",
                static_cast<double>(round_to_precision(bf_lowest - 30.0f, Precision::bf16)),
                spacing(format_info(Precision::bf16).max, Precision::bf16));
    // Two masks added (a causal one and a padding one, each the most negative number): in
    // bfloat16 too the sum is past the largest value, so -inf.
    const float two_masks = round_to_precision(bf_lowest + bf_lowest, Precision::bf16);
    std::printf("in bfloat16, two such masks added: -3.39e38 + (-3.39e38) = %g\n", static_cast<double>(two_masks));
    print_claim("mask_two_bf16", std::isinf(two_masks) ? "-inf" : "finite");
    print_claim("mask_nan_count", std::to_string(nan_inf) + " of " + std::to_string(scores.size()));
    print_claim("mask_uniform_weight", static_cast<double>(p_filled[0]), 4);
    print_claim("mask_added_inf", std::to_string(inf_added));
    print_claim("mask_added_weight", static_cast<double>(p_added[1]), 4);
    print_claim("mask_threshold", static_cast<double>(threshold), 0);
    print_claim("mask_all_low_nan", std::isnan(p_low[0]) ? "NaN" : "finite");
}

void sums_in_16_bits(const LessonOptions& options) {
    print_heading("Sums kept in 16 bits as T grows (one row: scores and values N(0, 1), hs = 64)");
    std::printf("l = sum of e^(s - max): relative error against float64 when the running sum is kept in\n"
                "each format; out = P V / l: the largest error over the 64 channels relative to the largest\n"
                "output, P and V rounded to bfloat16 in both, only the running sum's format differs.\n"
                "Each: the mean over 8 rows.\n");
    std::printf("%7s %12s %12s %12s %14s %14s\n", "T", "l in bf16", "l in fp16", "l in fp32", "out, bf16 sum",
                "out, fp32 sum");
    PlotSeries line_bf16{"running sum in bf16", {}, {}}, line_fp16{"running sum in fp16", {}, {}},
        line_fp32{"running sum in fp32", {}, {}};
    const std::size_t hs = 64;
    const int rows = 8;
    for (std::size_t T : {64, 256, 1024, 4096, 16384}) {
        double e_l[3] = {0, 0, 0}, e_out[2] = {0, 0};
        double final_bf16 = 0.0, final_true = 0.0, final_bf16_lowest = 1e30;  // the sums themselves
        for (int r = 0; r < rows; ++r) {
            Rng rng(T * 100 + static_cast<std::size_t>(r));
            std::vector<float> s(T), v(T * hs);
            for (float& x : s) x = rng.normal();
            for (float& x : v) x = round_to_precision(rng.normal(), Precision::bf16);
            const float m = *std::max_element(s.begin(), s.end());
            //! [sums]
            double l64 = 0.0;
            float l[3] = {0.0f, 0.0f, 0.0f};  // kept in bf16, fp16, fp32
            const Precision kept[3] = {Precision::bf16, Precision::fp16, Precision::fp32};
            std::vector<float> p(T);
            for (std::size_t j = 0; j < T; ++j) {
                const float e = std::exp(s[j] - m);
                l64 += e;
                for (int f = 0; f < 3; ++f) l[f] = round_to_precision(l[f] + e, kept[f]);
                p[j] = round_to_precision(e, Precision::bf16);  // P·V's 16-bit input
            }
            //! [sums]
            for (int f = 0; f < 3; ++f) e_l[f] += std::fabs(l[f] - l64) / l64;
            final_bf16 += l[0] / rows;
            final_true += l64 / rows;
            final_bf16_lowest = std::min(final_bf16_lowest, static_cast<double>(l[0]));
            double worst[2] = {0, 0}, largest = 0.0;
            for (std::size_t d = 0; d < hs; ++d) {
                double acc64 = 0.0;
                float acc[2] = {0.0f, 0.0f};  // bf16, fp32
                for (std::size_t j = 0; j < T; ++j) {
                    const float term = p[j] * v[j * hs + d];  // exact in float32
                    acc64 += static_cast<double>(term);
                    acc[0] = round_to_precision(acc[0] + term, Precision::bf16);
                    acc[1] += term;
                }
                for (int f = 0; f < 2; ++f) {
                    worst[f] = std::max(worst[f], std::fabs(static_cast<double>(acc[f]) / l64 - acc64 / l64));
                }
                largest = std::max(largest, std::fabs(acc64 / l64));
            }
            e_out[0] += worst[0] / largest;
            e_out[1] += worst[1] / largest;
        }
        for (double& e : e_l) e /= rows;
        for (double& e : e_out) e /= rows;
        std::printf("%7zu %12.2e %12.2e %12.2e %14.2e %14.2e\n", T, e_l[0], e_l[1], e_l[2], e_out[0], e_out[1]);
        line_bf16.x.push_back(std::log10(static_cast<double>(T)));
        line_bf16.y.push_back(std::log10(e_l[0]));
        line_fp16.x.push_back(std::log10(static_cast<double>(T)));
        line_fp16.y.push_back(std::log10(e_l[1]));
        line_fp32.x.push_back(std::log10(static_cast<double>(T)));
        line_fp32.y.push_back(std::log10(std::max(e_l[2], 1e-12)));
        if (T == 4096) {
            print_claim("sum_bf16_4096", 100.0 * e_l[0], 0);
            // Where the bfloat16 sums stopped, against the true sums: a term rounds away once
            // it is below half the step at the sum's size.
            print_claim("sum_bf16_final_4096", final_bf16, 1);
            print_claim("sum_bf16_lowest_4096", final_bf16_lowest, 1);
            print_claim("sum_true_4096", final_true, 1);
            print_claim("sum_fp16_4096", 100.0 * e_l[1], 1);
            claim_g("sum_fp32_4096", e_l[2]);
            print_claim("out_bf16_4096", 100.0 * e_out[0], 0);
            claim_g("out_fp32_4096", e_out[1]);
        }
        if (T == 64) print_claim("sum_bf16_64", 100.0 * e_l[0], 2);
    }
    // Two ways to sum in bfloat16 without a wider accumulator, at T = 4096 on the same rows:
    // Kahan's compensated sum (the rounding error of each addition kept in a second bfloat16
    // number and fed back) and pairwise summation (halves summed recursively, so each term
    // goes through about log2 T additions instead of up to T).
    {
        const std::size_t T = 4096;
        double e_kahan = 0.0, e_pairwise = 0.0;
        for (int r = 0; r < rows; ++r) {
            Rng rng(T * 100 + static_cast<std::size_t>(r));
            std::vector<float> s(T);
            for (float& x : s) x = rng.normal();
            const float m = *std::max_element(s.begin(), s.end());
            std::vector<float> e(T);
            double l64 = 0.0;
            for (std::size_t j = 0; j < T; ++j) {
                e[j] = std::exp(s[j] - m);
                l64 += e[j];
            }
            //! [compensated]
            const auto bf = [](float x) { return round_to_precision(x, Precision::bf16); };
            float sum = 0.0f, c = 0.0f;  // Kahan: c holds what the last addition lost
            for (float term : e) {
                const float y = bf(term - c);
                const float t = bf(sum + y);
                c = bf(bf(t - sum) - y);
                sum = t;
            }
            // pairwise: each level adds neighbours, every result rounded to bfloat16
            std::vector<float> level(e.begin(), e.end());
            for (float& x : level) x = bf(x);
            while (level.size() > 1) {
                std::vector<float> next((level.size() + 1) / 2);
                for (std::size_t i = 0; i < next.size(); ++i)
                    next[i] = 2 * i + 1 < level.size() ? bf(level[2 * i] + level[2 * i + 1]) : level[2 * i];
                level.swap(next);
            }
            //! [compensated]
            e_kahan += std::fabs(sum - l64) / l64 / rows;
            e_pairwise += std::fabs(level[0] - l64) / l64 / rows;
        }
        std::printf("\nT = 4096, every operation in bfloat16: Kahan's compensated sum off by %.2e, "
                    "pairwise summation by %.2e\n", e_kahan, e_pairwise);
        print_claim("sum_bf16_kahan_4096", 100.0 * e_kahan, 2);
        print_claim("sum_bf16_pairwise_4096", 100.0 * e_pairwise, 2);
    }
    if (!options.figures.empty()) {
        line_plot_png(options.figures / "lesson18_sums.png", {line_bf16, line_fp16, line_fp32},
                      "Softmax denominator: relative error against float64", "log10 T",
                      "log10 relative error");
        std::printf("\nchart: lesson18_sums.png\n");
    }
}

void online_softmax_in_16_bits(const LessonOptions& options) {
    const AttentionShape shape{1, 4, options.quick ? std::size_t{128} : std::size_t{1024}, 64, true};
    print_heading("The online softmax on 16-bit inputs (B=1, NH=4, T=" + std::to_string(shape.T) +
                  ", hs=64, causal)");
    std::printf("errors against float64 of the same 16-bit inputs; FlashAttention's rule: at most twice\n"
                "the plain 16-bit version's (every intermediate result rounded to the format)\n");
    std::printf("%-6s %14s %24s %26s\n", "format", "plain 16-bit", "online, fp32 statistics",
                "online, 16-bit statistics");
    for (Precision format : {Precision::fp16, Precision::bf16}) {
        const std::size_t n = shape.qkv_size();
        // q, k, v rounded to the format, and the float64 attention of those values
        const auto [q, k, v, ref, ref_lse] =
            rounded_attention_inputs(shape, format, format == Precision::fp16 ? 1816 : 1817);
        //! [online16]
        std::vector<float> plain(n), online(n), stats16(n);
        attention_plain_rounded_forward(plain.data(), q.data(), k.data(), v.data(), shape, format);
        attention_flash_rounded_forward(online.data(), nullptr, q.data(), k.data(), v.data(), shape,
                                        format, /*statistics=*/Precision::fp32);
        attention_flash_rounded_forward(stats16.data(), nullptr, q.data(), k.data(), v.data(), shape,
                                        format, /*statistics=*/format);
        //! [online16]
        const double e_plain = max_abs_error(plain.data(), ref.data(), n);
        const double e_online = max_abs_error(online.data(), ref.data(), n);
        const double e_stats = max_abs_error(stats16.data(), ref.data(), n);
        const double scale = max_abs(ref.data(), n);
        const bool ok_online = passes_flash_rule(e_online, e_plain, scale);
        const bool ok_stats = passes_flash_rule(e_stats, e_plain, scale);
        std::printf("%-6s %14.2e %15.2e (%s) %17.2e (%s)\n", precision_name(format), e_plain, e_online,
                    ok_online ? "holds" : "FAILS", e_stats, ok_stats ? "holds" : "FAILS");
        const std::string f = precision_name(format);
        claim_g(f + "_plain_error", e_plain);
        claim_g(f + "_online_error", e_online);
        claim_g(f + "_stats16_error", e_stats);
        print_claim(f + "_online_rule", ok_online ? "holds" : "fails");
        print_claim(f + "_stats16_rule", ok_stats ? "holds" : "fails");
    }
}

// One training run's numbers for the table.
struct Run {
    std::string name;
    RunSummary summary;
    double final_val = 0.0, ms_per_step = 0.0, final_scale = 1.0;
    std::uint64_t rounded = 0, flushed = 0, subnormal = 0;
    long skipped = 0;
    bool scaled = false;
};

std::string percent_of(std::uint64_t part, std::uint64_t whole) {
    if (whole == 0) return "-";
    char b[32];
    std::snprintf(b, sizeof b, "%.3f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
    return b;
}

// The gradients entering the products at initialisation, for one batch of B sequences, in
// float16 without and with loss scaling: how many flush to zero, how many turn subnormal.
void underflow_against_batch(const TrainConfig& recipe, const TextDataset& data, bool quick) {
    std::printf("\nat initialisation, one batch's backward pass in float16: the gradients entering the\n"
                "products, by the number of positions the loss is averaged over (B x %d)\n", recipe.block_size);
    std::printf("%5s %9s %16s %16s %22s\n", "B", "B x T", "flushed to 0", "subnormal", "flushed, scale 65536");
    const int V = static_cast<int>(data.vocab.size());
    double last_share = -1.0;
    bool grows = true;  // whether each larger batch flushes a larger share
    for (int B : quick ? std::vector<int>{2, 4} : std::vector<int>{3, 12, 48, 192}) {
        GPT model(recipe.model_config(V), recipe.seed);
        model.set_precision(Precision::fp16);
        Rng rng(recipe.seed);
        std::vector<int> x, y;
        sample_batch(data.train, static_cast<std::size_t>(B), static_cast<std::size_t>(recipe.block_size), rng, x, y);
        model.forward(x, y, B, recipe.block_size);
        RoundingCounts plain, scaled;
        for (float scale : {1.0f, 65536.0f}) {
            model.reset_rounding_counts();
            model.zero_grad();
            model.backward(scale);
            (scale == 1.0f ? plain : scaled) = model.gradient_rounding();
        }
        const double share = static_cast<double>(plain.flushed) / static_cast<double>(std::max<std::uint64_t>(1, plain.values));
        grows = grows && share > last_share;
        last_share = share;
        std::printf("%5d %9d %16s %16s %22s\n", B, B * recipe.block_size,
                    percent_of(plain.flushed, plain.values).c_str(), percent_of(plain.subnormal, plain.values).c_str(),
                    percent_of(scaled.flushed, scaled.values).c_str());
        if (B == 12 || B == 192) {
            const std::string k = "init_b" + std::to_string(B);
            print_claim(k + "_flushed", 100.0 * static_cast<double>(plain.flushed) / static_cast<double>(plain.values), 2);
            print_claim(k + "_subnormal", 100.0 * static_cast<double>(plain.subnormal) / static_cast<double>(plain.values), 1);
            print_claim(k + "_scaled_flushed", 100.0 * static_cast<double>(scaled.flushed) / static_cast<double>(scaled.values), 3);
        }
    }
    print_claim("init_flush_grows", grows ? "grows" : "does not grow");
}

// Eight bits: the two FP8 formats beside the 16-bit ones, and what a per-tensor scale does
// for them on the gradients of one backward pass of the recipe's model at initialisation
// (float32 training; each parameter's gradient tensor rounded to FP8 on its own).
void eight_bits(const TrainConfig& recipe, const TextDataset& data, bool quick) {
    print_heading("Eight bits: E4M3 and E5M2, and a scale per tensor");
    std::printf("%-6s %8s %8s %13s %15s %18s %11s\n", "format", "exponent", "mantissa", "largest",
                "smallest normal", "smallest subnormal", "epsilon");
    for (Fp8 f : {Fp8::e4m3, Fp8::e5m2}) {
        const FormatInfo i = fp8_info(f);
        std::printf("%-6s %8d %8d %13.5g %15.5g %18.5g %11.5g\n", fp8_name(f), i.exponent_bits,
                    i.mantissa_bits, i.max, i.min_normal, i.min_subnormal, i.epsilon);
        const std::string n = fp8_name(f);
        print_claim(n + "_max", i.max, 0);
        claim_g(n + "_min_normal", i.min_normal);
        claim_g(n + "_min_subnormal", i.min_subnormal);
        claim_g(n + "_epsilon", i.epsilon);
        print_claim(n + "_decimal_digits", (i.mantissa_bits + 1) * std::log10(2.0), 1);
    }
    std::printf("\nsome values, rounded to nearest (ties to even; past the largest: NaN in e4m3, inf in e5m2):\n");
    for (float x : {0.1f, 3.14159265f, 300.0f, 500.0f, 60000.0f, 1e-3f, 1e-5f}) {
        std::printf("%12.6g  e4m3 %-10.6g e5m2 %-10.6g\n", static_cast<double>(x),
                    static_cast<double>(round_to_fp8(x, Fp8::e4m3)), static_cast<double>(round_to_fp8(x, Fp8::e5m2)));
    }
    claim_g("e4m3_of_0_1", round_to_fp8(0.1f, Fp8::e4m3));
    claim_g("e5m2_of_0_1", round_to_fp8(0.1f, Fp8::e5m2));

    const int B = quick ? 2 : 12;
    GPT model(recipe.model_config(static_cast<int>(data.vocab.size())), recipe.seed);
    Rng rng(recipe.seed);
    std::vector<int> x, y;
    sample_batch(data.train, static_cast<std::size_t>(B), static_cast<std::size_t>(recipe.block_size), rng, x, y);
    model.forward(x, y, B, recipe.block_size);
    model.zero_grad();
    model.backward();
    const std::vector<float>& g = model.gradients();
    std::printf("\nthe gradients of one backward pass at initialisation (B = %d), each of the %zu tensors rounded\n"
                "on its own; 65536: float16's loss scale, the same for every tensor; per tensor: 2^k, the\n"
                "largest power of two that keeps the tensor's largest |value| (its amax) within the format.\n"
                "Each multiplies before rounding and divides after; relative error over the finite results\n",
                B, model.parameter_table().size());
    std::printf("%-6s %-10s %14s %14s %18s\n", "format", "scale", "flushed to 0", "overflowed", "relative error");
    for (Fp8 f : {Fp8::e4m3, Fp8::e5m2}) {
        for (int mode = 0; mode < 3; ++mode) {  // none, float16's loss scale, per tensor
            const bool scaled = mode == 2;
            //! [fp8]
            std::uint64_t values = 0, flushed = 0, overflowed = 0;
            double err2 = 0.0, norm2 = 0.0;
            for (const ParameterInfo& t : model.parameter_table()) {
                const float* gt = g.data() + t.offset;
                float amax = 0.0f;
                for (std::size_t i = 0; i < t.size; ++i) amax = std::max(amax, std::fabs(gt[i]));
                // a power of two, so that scaling and unscaling are exact
                const float scale = scaled && amax > 0.0f
                    ? std::ldexp(1.0f, static_cast<int>(std::floor(std::log2(fp8_info(f).max / amax))))
                    : mode == 1 ? 65536.0f : 1.0f;
                for (std::size_t i = 0; i < t.size; ++i) {
                    const float r = round_to_fp8(gt[i] * scale, f) / scale;
                    ++values;
                    if (!std::isfinite(r)) { ++overflowed; continue; }
                    if (r == 0.0f && gt[i] != 0.0f) ++flushed;
                    err2 += (static_cast<double>(r) - gt[i]) * (static_cast<double>(r) - gt[i]);
                    norm2 += static_cast<double>(gt[i]) * gt[i];
                }
            }
            //! [fp8]
            const double rel = std::sqrt(err2 / norm2);
            const char* how[3] = {"none", "65536", "per tensor"};
            std::printf("%-6s %-10s %14s %14s %18.3g\n", fp8_name(f), how[mode],
                        percent_of(flushed, values).c_str(), percent_of(overflowed, values).c_str(), rel);
            const char* key[3] = {"_unscaled", "_loss_scaled", "_scaled"};
            const std::string k = std::string(fp8_name(f)) + key[mode];
            print_claim(k + "_flushed", 100.0 * static_cast<double>(flushed) / static_cast<double>(values), 2);
            print_claim(k + "_overflowed", 100.0 * static_cast<double>(overflowed) / static_cast<double>(values), 2);
            claim_g(k + "_error", rel);
        }
    }
    print_claim("fp8_batch", std::to_string(B));
}

void mixed_precision_training(const LessonOptions& options) {
    print_heading("Mixed-precision training of the CPU recipe");
    const TextDataset data = make_dataset(read_corpus(options.corpus()));
    //! [recipe]
    TrainConfig recipe = TrainConfig::named("cpu");  // 4 layers, 4 heads, 128 channels, block 64
    if (!options.full) recipe.shorten_to(600);        // the short default: 600 of its 2000 steps
    recipe.eval_interval = 100;
    if (options.quick) recipe.make_quick();
    //! [recipe]
    std::printf("%s: %zu train / %zu val tokens; %d layers, %d heads, %d channels, block %d, batch %d, "
                "%lld steps\n",
                options.corpus().filename().c_str(), data.train.size(), data.val.size(), recipe.n_layer,
                recipe.n_head, recipe.n_embd, recipe.block_size, recipe.batch_size,
                static_cast<long long>(recipe.max_iters));
    std::vector<Run> runs;
    //! [runs]
    struct Setting {
        const char* name;
        Precision precision;
        bool loss_scaling;
        std::uint64_t seed;
    };
    const std::uint64_t seed = recipe.seed, other_seed = recipe.seed + 1;
    for (const Setting& s : {Setting{"fp32", Precision::fp32, false, seed},
                             Setting{"fp32, another seed", Precision::fp32, false, other_seed},
                             Setting{"bf16", Precision::bf16, false, seed},
                             Setting{"fp16", Precision::fp16, false, seed},
                             Setting{"fp16, loss scaling", Precision::fp16, true, seed}}) {
        TrainConfig c = recipe;  // the same batches and initial weights for one seed
        c.precision = s.precision;
        c.loss_scaling = s.loss_scaling;
        c.seed = s.seed;
        Trainer trainer(c, data);
        Run run;
        run.summary = run_training(trainer, RunOptions{});
        //! [runs]
        run.name = s.name;
        run.scaled = trainer.scales_loss();
        run.final_val = run.summary.evals.back().val_loss;
        run.ms_per_step = 1e3 * run.summary.step_seconds / static_cast<double>(run.summary.steps.size());
        for (const StepRecord& r : run.summary.steps) {
            run.rounded += r.rounded_gradients;
            run.flushed += r.flushed_gradients;
            run.subnormal += r.subnormal_gradients;
        }
        run.skipped = trainer.loss_scaler().skipped_steps;
        run.final_scale = trainer.loss_scaler().scale;
        runs.push_back(run);
    }
    const Run &fp32 = runs[0], &fp32_seed = runs[1], &bf16 = runs[2], &fp16 = runs[3], &fp16_scaled = runs[4];
    std::printf("\n%-19s %9s %9s %12s %26s %10s %8s %11s %8s\n", "products in", "val loss", "vs fp32",
                "gradients", "flushed to 0", "subnormal", "skipped", "loss scale", "ms/step");
    for (const Run& r : runs) {
        char rounded[24] = "-", flushed[40] = "-", scale[24] = "-";
        if (r.rounded > 0) {
            std::snprintf(rounded, sizeof rounded, "%.3g", static_cast<double>(r.rounded));
            std::snprintf(flushed, sizeof flushed, "%llu (%s)", static_cast<unsigned long long>(r.flushed),
                          percent_of(r.flushed, r.rounded).c_str());
        }
        if (r.scaled) std::snprintf(scale, sizeof scale, "%g", r.final_scale);
        std::printf("%-19s %9.4f %+9.4f %12s %26s %10s %8ld %11s %8.1f\n", r.name.c_str(), r.final_val,
                    r.final_val - fp32.final_val, rounded, flushed, percent_of(r.subnormal, r.rounded).c_str(),
                    r.skipped, scale, r.ms_per_step);
    }
    std::printf("(gradients: the values rounded where they entered the products, over the whole run)\n");
    //! [margin]
    // bf16 against fp32: the same seed, so the same batches and initial weights; they may
    // differ by what rounding does, and should by no more than a small fraction of what
    // changing the seed does. The margin, stated before the run: 0.02 nats (1% of the loss).
    const double margin = 0.02;
    const double bf16_gap = bf16.final_val - fp32.final_val;
    const double seed_gap = fp32_seed.final_val - fp32.final_val;
    const bool within = std::fabs(bf16_gap) <= margin;
    //! [margin]
    std::printf("\nbf16's final val loss is %s of fp32's: %+.4f (margin %.2f; another seed moves fp32 by %+.4f)\n",
                within ? "within the margin" : "OUTSIDE the margin", bf16_gap, margin, seed_gap);
    const char* keys[] = {"fp32", "fp32_seed", "bf16", "fp16", "fp16_scaled"};
    for (std::size_t i = 0; i < runs.size(); ++i) {
        const Run& r = runs[i];
        const std::string k = keys[i];
        print_claim(k + "_val", r.final_val, 4);
        print_claim(k + "_flushed", std::to_string(r.flushed));
        const auto share = [&](std::uint64_t n) {
            return r.rounded ? 100.0 * static_cast<double>(n) / static_cast<double>(r.rounded) : 0.0;
        };
        print_claim(k + "_flushed_percent", share(r.flushed), 3);
        print_claim(k + "_subnormal_percent", share(r.subnormal), 1);
    }
    print_claim("rounded_gradients", static_cast<double>(fp16.rounded) / 1e9, 2);
    // A difference to 4 places, signed; one that rounds to zero prints "0.0000", not "-0.0000".
    const auto gap = [](const char* name, double d) {
        print_claim(name, std::fabs(d) < 0.00005 ? 0.0 : d, 4);
    };
    gap("bf16_gap", bf16_gap);
    print_claim("bf16_gap_abs", std::fabs(bf16_gap), 4);
    gap("seed_gap", seed_gap);
    print_claim("seed_gap_abs", std::fabs(seed_gap), 4);
    print_claim("bf16_margin", margin, 2);
    print_claim("bf16_within", within ? "within" : "outside");
    print_claim("bf16_closer_than_seed", std::fabs(bf16_gap) < std::fabs(seed_gap) ? "closer" : "not closer");
    gap("fp16_gap", fp16.final_val - fp32.final_val);
    gap("fp16_scaled_gap", fp16_scaled.final_val - fp32.final_val);
    claim_g("fp16_gap_size", std::fabs(fp16.final_val - fp32.final_val));
    print_claim("fp16_skipped", std::to_string(fp16_scaled.skipped));
    print_claim("fp16_final_scale", fp16_scaled.final_scale, 0);
    print_claim("train_steps", std::to_string(recipe.max_iters));
    // The step at which the most gradient values flushed, without loss scaling.
    double peak = 0.0;
    std::int64_t peak_step = 0;
    for (const StepRecord& r : fp16.summary.steps) {
        const double share = 100.0 * static_cast<double>(r.flushed_gradients) /
                             static_cast<double>(std::max<std::uint64_t>(1, r.rounded_gradients));
        if (share > peak) peak = share, peak_step = r.step;
    }
    print_claim("fp16_peak_flushed", peak, 1);
    print_claim("fp16_peak_step", std::to_string(peak_step));
    if (!options.figures.empty()) {
        // Each run's validation loss less fp32's, at every evaluation: the runs' curves
        // themselves lie on top of one another.
        std::vector<PlotSeries> gaps;
        for (const Run* r : {&fp32_seed, &bf16, &fp16, &fp16_scaled}) {
            PlotSeries s{r->name + " - fp32", {}, {}};
            for (std::size_t i = 0; i < r->summary.evals.size(); ++i) {
                s.x.push_back(static_cast<double>(r->summary.evals[i].step));
                s.y.push_back(r->summary.evals[i].val_loss - fp32.summary.evals[i].val_loss);
            }
            gaps.push_back(s);
        }
        line_plot_png(options.figures / "lesson18_training.png", gaps,
                      "Validation loss against the fp32 run (same seed unless said)", "step",
                      "difference (nats)");
        // Underflow step by step: the share of gradient values flushed to zero.
        std::vector<PlotSeries> flushes;
        for (const Run* r : {&fp16, &fp16_scaled}) {
            PlotSeries s{r->name, {}, {}};
            for (const StepRecord& step : r->summary.steps) {
                s.x.push_back(static_cast<double>(step.step));
                s.y.push_back(100.0 * static_cast<double>(step.flushed_gradients) /
                              static_cast<double>(std::max<std::uint64_t>(1, step.rounded_gradients)));
            }
            flushes.push_back(s);
        }
        line_plot_png(options.figures / "lesson18_underflow.png", flushes,
                      "float16: gradient values flushed to zero in each step", "step", "% of the values");
        std::printf("charts: lesson18_training.png, lesson18_underflow.png\n");
    }
    underflow_against_batch(recipe, data, options.quick);
    eight_bits(recipe, data, options.quick);
}

void tensor_cores() {
#if ATTN_CUDA_SIMULATED
    print_heading("On the GPU: 16-bit loads and tensor cores  [simulated on the CPU: results checked, no timing]");
#else
    print_heading("On the GPU: 16-bit loads and tensor cores");
#endif
#ifdef ATTN_HAVE_CUDA
    std::string why;
    if (!cuda::device_available(&why)) {
        std::printf("The GPU part needs a CUDA device (%s).\nIts numbers come from build/tests/half_attention_bench on one.\n",
                    why.c_str());
        return;
    }
#if ATTN_CUDA_SIMULATED
    const char* tag = "  [simulated]";
    const AttentionShape shape{1, 2, 128, 64, true};
#else
    const char* tag = "";
    std::printf("device: %s\n", cuda::device_summary().c_str());
    const AttentionShape shape{1, 8, 1024, 64, true};
#endif
    std::printf("B=%zu NH=%zu T=%zu hs=%zu causal; errors against float64 of the 16-bit inputs\n", shape.B,
                shape.NH, shape.T, shape.hs);
    for (Precision format : {Precision::fp16, Precision::bf16}) {
        const std::size_t n = shape.qkv_size();
        // q, k, v rounded to the format, and the float64 attention of those values
        const auto [q, k, v, ref, ref_lse] = rounded_attention_inputs(shape, format, 7);
        std::vector<float> plain(n);
        attention_plain_rounded_forward(plain.data(), q.data(), k.data(), v.data(), shape, format);
        const double e_plain = max_abs_error(plain.data(), ref.data(), n);
        //! [gpu]
        cuda::HalfBuffer d_q(q, format), d_k(k, format), d_v(v, format), d_out(n, format);
        cuda::DeviceBuffer lse(shape.rows());
        cuda::flash_attention_forward_16bit(d_out, lse.data(), d_q, d_k, d_v, shape);
        const std::vector<float> out_loads = d_out.download();
        std::vector<float> out_cores;
        if (cuda::wmma_attention_unsupported(format).empty()) {
            cuda::wmma_attention_forward(d_out, lse.data(), d_q, d_k, d_v, shape);
            out_cores = d_out.download();
        }
        //! [gpu]
        const double e_loads = max_abs_error(out_loads.data(), ref.data(), n);
        const double scale = max_abs(ref.data(), n);
        std::printf("%s: plain 16-bit %.2e; 16-bit loads %.2e (%s)", precision_name(format), e_plain, e_loads,
                    passes_flash_rule(e_loads, e_plain, scale) ? "rule holds" : "rule FAILS");
        if (out_cores.empty()) {
            std::printf("; tensor cores: %s%s\n", cuda::wmma_attention_unsupported(format).c_str(), tag);
        } else {
            const double e_cores = max_abs_error(out_cores.data(), ref.data(), n);
            std::printf("; tensor cores %.2e (%s)%s\n", e_cores,
                        passes_flash_rule(e_cores, e_plain, scale) ? "rule holds" : "rule FAILS", tag);
        }
    }
    std::printf("(timings against the float32 kernels: build/tests/half_attention_bench on a GPU)%s\n", tag);
#if ATTN_CUDA_SIMULATED
    {
        // Both float16 kernels once more, the simulator counting what each launch moves and
        // carries out: the tensor cores' products are counted (mma_sync), the 16-bit loads
        // kernel's own arithmetic is C++ the simulator does not see, so its operations come
        // from the formula 4·hs per visible (query, key) pair, T(T+1)/2 pairs per head.
        const std::size_t n = shape.qkv_size();
        const auto [q, k, v, ref, ref_lse] = rounded_attention_inputs(shape, Precision::fp16, 7);
        cuda::HalfBuffer d_q(q, Precision::fp16), d_k(k, Precision::fp16), d_v(v, Precision::fp16),
            d_out(n, Precision::fp16);
        cuda::DeviceBuffer lse(shape.rows());
        cuda::count_work(true);
        cuda::flash_attention_forward_16bit(d_out, lse.data(), d_q, d_k, d_v, shape);
        bool counted = true;
        auto launches = cuda::take_counted_work(&counted);
        const double t = static_cast<double>(shape.T);
        for (auto& l : launches) l.fp32_flops += 4.0 * static_cast<double>(shape.hs * shape.B * shape.NH) * t * (t + 1) / 2;
        if (cuda::wmma_attention_unsupported(Precision::fp16).empty()) {
            cuda::wmma_attention_forward(d_out, lse.data(), d_q, d_k, d_v, shape);
            bool cores_counted = true;
            for (const auto& l : cuda::take_counted_work(&cores_counted)) launches.push_back(l);
            counted = counted && cores_counted;
        }
        cuda::count_work(false);
        double formula = 0, cores = 0;
        for (const auto& l : launches) {
            if (l.f16_flops > 0) cores += l.f16_flops;
            else formula += l.fp32_flops;
        }
        if (counted) {
            if (cores > 0) print_claim("sim_cores_over_formula_flops", cores / formula, 2);
            std::printf("\nThe float16 kernels once more, counted by the simulator, and the least time an H100\n"
                        "SXM could take for each (H100 roofline bound, not a measurement; the 16-bit loads\n"
                        "kernel's GFLOP by formula, the tensor cores' counted):\n%s",
                        roofline::table(launches, 4).c_str());
        }
    }
#endif
#else
    std::printf("This build has no CUDA: the GPU part needs nvcc. Its numbers come from\n"
                "build/tests/half_attention_bench on a GPU.\n");
#endif
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 18: attention in reduced precision", [](const LessonOptions& options) {
        the_formats(options);
        rounding_to_even();
        scores_that_overflow();
        masks();
        sums_in_16_bits(options);
        online_softmax_in_16_bits(options);
        mixed_precision_training(options);
        tensor_cores();
    }, LessonText::corpus);
}
