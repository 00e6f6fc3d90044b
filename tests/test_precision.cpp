// The 16-bit formats: conversions against PyTorch's (committed fixtures), against GCC's
// _Float16 for every float16 value and every midpoint between two of them, and against a
// nearest-value search in double for bfloat16; ranges, spacing, rounding counts, loss
// scaling; and the 16-bit attention of mixed_attention.hpp against float64 with
// FlashAttention's rule.
#include "attn/fixtures.hpp"
#include "attn/bits.hpp"
#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/trainer.hpp"
#include "attn/mixed_attention.hpp"
#include "attn/npy.hpp"
#include "attn/precision.hpp"
#include "attn/random.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

using namespace attn;

namespace {

const std::filesystem::path fixtures = attn::fixtures_dir() / "precision";

bool is_nan16(std::uint16_t h, int mantissa_bits) {
    const std::uint16_t exponent = static_cast<std::uint16_t>(((1u << (15 - mantissa_bits)) - 1u) << mantissa_bits);
    return (h & exponent) == exponent && (h & ((1u << mantissa_bits) - 1u)) != 0;
}

std::vector<int> read_ints(const std::string& name) {
    const NpyArray a = read_npy(fixtures / name);
    return std::vector<int>(a.data.begin(), a.data.end());  // 16-bit values: exact in float32
}

// GCC's own float → _Float16 conversion (round to nearest even), as bits.
std::uint16_t gcc_float16(float x) {
    const _Float16 h = static_cast<_Float16>(x);
    std::uint16_t b;
    std::memcpy(&b, &h, sizeof b);
    return b;
}

// The bfloat16 nearest to x by definition, without bit tricks: the two neighbours of x
// (its value cut to 7 mantissa bits, and that plus one step away from zero, 2^128 past the
// largest), compared by distance in double (exact); a tie goes to the even pattern.
std::uint16_t nearest_bfloat16(float x) {
    const std::uint32_t b = bits_of(x);
    const std::uint32_t lo = b & 0xffff0000u;
    if ((b & 0xffffu) == 0) return static_cast<std::uint16_t>(lo >> 16);
    const double below = static_cast<double>(float_of(lo));
    const std::uint32_t hi = lo + 0x10000u;  // one step further from zero
    const double above = (hi & 0x7fffffffu) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), x)
                                                           : static_cast<double>(float_of(hi));
    const double d_below = std::fabs(static_cast<double>(x) - below);
    const double d_above = std::fabs(above - static_cast<double>(x));
    if (d_below < d_above) return static_cast<std::uint16_t>(lo >> 16);
    if (d_above < d_below) return static_cast<std::uint16_t>(hi >> 16);
    return static_cast<std::uint16_t>(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

}  // namespace

TEST_CASE("float16 and bfloat16 conversions give PyTorch's bits on hard values") {
    const std::vector<int> high = read_ints("input_bits_high.npy"), low = read_ints("input_bits_low.npy");
    const std::vector<int> fp16 = read_ints("float16_bits.npy"), bf16 = read_ints("bfloat16_bits.npy");
    REQUIRE(high.size() == low.size());
    REQUIRE(fp16.size() == high.size());
    REQUIRE(bf16.size() == high.size());
    REQUIRE(high.size() > 3000);
    int nans = 0;
    for (std::size_t i = 0; i < high.size(); ++i) {
        const float x = float_of((static_cast<std::uint32_t>(high[i]) << 16) | static_cast<std::uint32_t>(low[i]));
        CAPTURE(i);
        CAPTURE(x);
        const std::uint16_t h = float_to_float16_bits(x), b = float_to_bfloat16_bits(x);
        if (std::isnan(x)) {  // any quiet NaN will do (PyTorch writes 0x7e00 and 0x7fc0)
            ++nans;
            CHECK(is_nan16(h, 10));
            CHECK(is_nan16(b, 7));
            CHECK(is_nan16(static_cast<std::uint16_t>(fp16[i]), 10));
            CHECK(is_nan16(static_cast<std::uint16_t>(bf16[i]), 7));
            continue;
        }
        CHECK(h == fp16[i]);
        CHECK(b == bf16[i]);
    }
    CHECK(nans >= 6);  // the fixture's NaNs, including payloads only in the low half
}

TEST_CASE("float16: every value, every midpoint and one float step either side agree with GCC's _Float16") {
    int checked = 0;
    for (std::uint32_t h = 0; h < 0x10000u; ++h) {
        const auto bits = static_cast<std::uint16_t>(h);
        if ((bits & 0x7c00u) == 0x7c00u) continue;  // infinities and NaNs: below
        const float v = float16_bits_to_float(bits);
        CAPTURE(h);
        REQUIRE(float_to_float16_bits(v) == bits);  // exact values come back unchanged
        // the midpoint to the next value away from zero (exact in float32), and its neighbours
        const std::uint16_t next = static_cast<std::uint16_t>(bits + 1);
        const float w = (next & 0x7c00u) == 0x7c00u ? std::copysign(65520.0f, v) : float16_bits_to_float(next);
        const float mid = 0.5f * (v + w);
        for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2.0f * mid)}) {
            CAPTURE(x);
            CHECK(float_to_float16_bits(x) == gcc_float16(x));
            ++checked;
        }
    }
    CHECK(checked > 190000);
    Rng rng(1618);
    for (int i = 0; i < 200000; ++i) {
        const float x = float_of(static_cast<std::uint32_t>(rng.next_u64()));
        if (std::isnan(x)) continue;
        CAPTURE(x);
        CHECK(float_to_float16_bits(x) == gcc_float16(x));
    }
    CHECK(float_to_float16_bits(std::numeric_limits<float>::infinity()) == 0x7c00);
    CHECK(float_to_float16_bits(-std::numeric_limits<float>::infinity()) == 0xfc00);
}

TEST_CASE("bfloat16: every midpoint, one float step either side and random floats are the nearest value, ties to even") {
    for (std::uint32_t h = 0; h < 0x10000u; ++h) {
        const auto bits = static_cast<std::uint16_t>(h);
        if ((bits & 0x7f80u) == 0x7f80u) continue;
        const std::uint32_t mid = (h << 16) | 0x8000u;  // halfway to the next pattern
        CAPTURE(h);
        REQUIRE(float_to_bfloat16_bits(bfloat16_bits_to_float(bits)) == bits);
        for (std::uint32_t x : {mid, mid - 1, mid + 1}) {
            CAPTURE(x);
            CHECK(float_to_bfloat16_bits(float_of(x)) == nearest_bfloat16(float_of(x)));
        }
    }
    Rng rng(2718);
    for (int i = 0; i < 200000; ++i) {
        const float x = float_of(static_cast<std::uint32_t>(rng.next_u64()));
        if (std::isnan(x)) continue;
        CAPTURE(x);
        CHECK(float_to_bfloat16_bits(x) == nearest_bfloat16(x));
    }
    // by hand: 1 + 2^-8 is halfway between 1 (0x3f80, even) and 1 + 2^-7 (0x3f81)
    CHECK(float_to_bfloat16_bits(1.00390625f) == 0x3f80);
    CHECK(float_to_bfloat16_bits(1.01171875f) == 0x3f82);  // 1 + 3·2^-8: to 0x3f82, even
    CHECK(float_to_bfloat16_bits(FLT_MAX) == 0x7f80);      // past the largest: infinity
    CHECK(float_to_bfloat16_bits(float_of(0x7f800001u)) != 0x7f80);  // a NaN stays a NaN
    CHECK(is_nan16(float_to_bfloat16_bits(float_of(0x7f800001u)), 7));
}

TEST_CASE("the formats' ranges come from their bit widths") {
    const FormatInfo h = format_info(Precision::fp16), b = format_info(Precision::bf16),
                     f = format_info(Precision::fp32);
    CHECK(h.max == 65504.0);
    CHECK(h.min_normal == 6.103515625e-05);          // 2^-14
    CHECK(h.min_subnormal == 5.9604644775390625e-08);  // 2^-24
    CHECK(h.epsilon == 0.0009765625);                // 2^-10
    CHECK(b.max == 3.3895313892515355e+38);          // (2 − 2^-7)·2^127
    CHECK(b.min_normal == static_cast<double>(FLT_MIN));
    CHECK(b.min_subnormal == std::ldexp(1.0, -133));
    CHECK(b.epsilon == 0.0078125);                   // 2^-7
    CHECK(f.max == static_cast<double>(FLT_MAX));
    CHECK(f.min_subnormal == std::ldexp(1.0, -149));
    CHECK(f.epsilon == static_cast<double>(FLT_EPSILON));
    // the largest values convert to themselves, and are the formats' largest
    CHECK(float16_bits_to_float(float_to_float16_bits(65504.0f)) == 65504.0f);
    CHECK(std::isinf(round_to_precision(65520.0f, Precision::fp16)));
    CHECK(round_to_precision(65519.0f, Precision::fp16) == 65504.0f);
    CHECK(static_cast<double>(round_to_precision(3.3895313e38f, Precision::bf16)) == b.max);
}

TEST_CASE("spacing: the gap between neighbouring values at a magnitude") {
    CHECK(spacing(1.0, Precision::bf16) == 0.0078125);
    CHECK(spacing(1.0, Precision::fp16) == 0.0009765625);
    CHECK(spacing(1.0, Precision::fp32) == static_cast<double>(FLT_EPSILON));
    CHECK(spacing(1000.0, Precision::fp16) == 0.5);      // [512, 1024): 2^9 · 2^-10
    CHECK(spacing(65504.0, Precision::fp16) == 32.0);
    CHECK(spacing(1e-7, Precision::fp16) == 5.9604644775390625e-08);  // subnormal: 2^-24
    CHECK(spacing(300.0, Precision::bf16) == 2.0);       // [256, 512): 2^8 · 2^-7
}

TEST_CASE("rounding a buffer counts the values flushed to zero, made subnormal and overflowed") {
    std::vector<float> x = {1e-8f, 1e-6f, 7e4f, 1.0f, 0.0f, std::nanf(""), -2e-8f};
    const RoundingCounts c = round_in_place(x.data(), x.size(), Precision::fp16);
    CHECK(c.values == 5);      // zero and NaN are not counted
    CHECK(c.flushed == 2);     // 1e-8 and -2e-8 are below 2^-25 ≈ 2.98e-8
    CHECK(c.subnormal == 1);   // 1e-6 < 2^-14
    CHECK(c.overflowed == 1);  // 7e4 > 65520
    CHECK(x[0] == 0.0f);
    CHECK(std::signbit(x[6]));  // -0
    CHECK(x[1] == float16_bits_to_float(float_to_float16_bits(1e-6f)));
    std::vector<float> y = {1e-8f, 7e4f};
    const RoundingCounts none = round_in_place(y.data(), y.size(), Precision::fp32);
    CHECK(none.values == 0);
    CHECK(y[0] == 1e-8f);
    const RoundingCounts b = round_in_place(y.data(), y.size(), Precision::bf16);
    CHECK(b.flushed == 0);  // bfloat16 has float32's range
    CHECK(b.overflowed == 0);
}

TEST_CASE("rounding a whole buffer gives the value of the conversion, value by value") {
    // round_in_place takes another route (branch-free, for vector code): every float16 and
    // bfloat16 value, every midpoint and a float step either side, and random floats.
    std::vector<float> x;
    for (std::uint32_t h = 0; h < 0x10000u; ++h) {
        for (Precision p : {Precision::fp16, Precision::bf16}) {
            const auto bits = static_cast<std::uint16_t>(h);
            const float v = p == Precision::fp16 ? float16_bits_to_float(bits) : bfloat16_bits_to_float(bits);
            if (!std::isfinite(v)) continue;
            const float mid = p == Precision::fp16 ? 0.5f * (v + float16_bits_to_float(static_cast<std::uint16_t>(bits + 1)))
                                                   : float_of((static_cast<std::uint32_t>(h) << 16) | 0x8000u);
            for (float e : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2.0f * mid)}) x.push_back(e);
        }
    }
    Rng rng(3141);
    for (int i = 0; i < 200000; ++i) x.push_back(float_of(static_cast<std::uint32_t>(rng.next_u64())));
    x.push_back(std::numeric_limits<float>::infinity());
    x.push_back(float_of(0x7f800001u));
    for (Precision p : {Precision::fp16, Precision::bf16}) {
        CAPTURE(precision_name(p));
        std::vector<float> y = x;
        round_in_place(y.data(), y.size(), p);
        for (std::size_t i = 0; i < x.size(); ++i) {
            const float expected = round_to_precision(x[i], p);
            if (std::isnan(x[i])) {
                CHECK(std::isnan(y[i]));
                continue;
            }
            CAPTURE(x[i]);
            REQUIRE(bits_of(y[i]) == bits_of(expected));
        }
    }
}

TEST_CASE("precision names parse and print, and bad names are refused") {
    for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16}) {
        CHECK(parse_precision(precision_name(p)) == p);
    }
    CHECK_THROWS_AS(parse_precision("fp8"), std::invalid_argument);
}

TEST_CASE("the loss scaler halves on a non-finite step, skips it, and doubles after its interval") {
    LossScaler s;
    s.scale = 1024.0;
    s.growth_interval = 3;
    CHECK(s.update(true));
    CHECK(s.update(true));
    CHECK(s.scale == 1024.0);
    CHECK(s.update(true));  // the third good step in a row: grows
    CHECK(s.scale == 2048.0);
    CHECK_FALSE(s.update(false));  // skipped, halved, the count starts again
    CHECK(s.scale == 1024.0);
    CHECK(s.skipped_steps == 1);
    CHECK(s.update(true));
    CHECK(s.update(true));
    CHECK(s.scale == 1024.0);
}

TEST_CASE("16-bit attention: the online softmax with float32 statistics passes FlashAttention's rule, half-precision statistics do not") {
    // Causal, T = 1024 (long rows: a 16-bit running sum of ~1000 terms loses its low bits).
    const AttentionShape s{1, 2, 1024, 64, true};
    for (Precision format : {Precision::fp16, Precision::bf16}) {
        CAPTURE(precision_name(format));
        const std::size_t n = s.qkv_size();
        const RoundedAttentionInputs in = rounded_attention_inputs(s, format, format == Precision::fp16 ? 16 : 17);
        const float *q = in.q.data(), *k = in.k.data(), *v = in.v.data();
        const double* ref = in.out.data();
        std::vector<float> plain(n), online(n), half_stats(n);
        attention_plain_rounded_forward(plain.data(), q, k, v, s, format);
        attention_flash_rounded_forward(online.data(), nullptr, q, k, v, s, format, Precision::fp32);
        attention_flash_rounded_forward(half_stats.data(), nullptr, q, k, v, s, format, format);
        const double e_plain = max_abs_error(plain.data(), ref, n);
        const double e_online = max_abs_error(online.data(), ref, n);
        const double e_half = max_abs_error(half_stats.data(), ref, n);
        const double scale = max_abs(ref, n);
        CAPTURE(e_plain);
        CAPTURE(e_online);
        CAPTURE(e_half);
        // The plain version is itself a 16-bit one: its error is a few units of the format's
        // last place of the outputs (~|out| · 2^-11 for float16, 2^-8 for bfloat16).
        CHECK(e_plain < 8.0 * format_info(format).epsilon * scale);
        CHECK(passes_flash_rule(e_online, e_plain, scale));
        CHECK_FALSE(passes_flash_rule(e_half, e_plain, scale));
    }
}

namespace {

// One run of a fixture's model: loss, logits and the gradients (divided by the loss scale).
struct MixedRun {
    double loss;
    std::vector<double> logits, grads;
};

MixedRun run_mixed(const std::filesystem::path& dir, Precision precision, float loss_scale) {
    GPT model = load_checkpoint(dir / "weights");
    model.set_precision(precision);
    model.train(false);
    const NpyArray xs = read_npy(dir / "x.npy"), ys = read_npy(dir / "y.npy");
    const std::vector<int> x(xs.data.begin(), xs.data.end()), y(ys.data.begin(), ys.data.end());
    const float loss = model.forward(x, y, static_cast<int>(xs.shape[0]), static_cast<int>(xs.shape[1]));
    model.zero_grad();
    model.reset_rounding_counts();
    model.backward(loss_scale);
    MixedRun r{loss, std::vector<double>(model.logits().begin(), model.logits().end()), {}};
    for (float g : model.gradients()) r.grads.push_back(static_cast<double>(g) / loss_scale);
    return r;
}

double max_gap(const double* a, const double* b, std::size_t n) {
    double worst = 0.0;
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    return worst;
}

double largest_of(const double* a, std::size_t n) {
    double largest = 0.0;
    for (std::size_t i = 0; i < n; ++i) largest = std::max(largest, std::fabs(a[i]));
    return largest;
}

}  // namespace

TEST_CASE("the mixed-precision GPT matches PyTorch's model with the same products rounded") {
    // tools/reference/make_precision_fixtures.py writes the model's mixed precision from its
    // definition (every Linear layer's input, weight and incoming gradient rounded, q, k and
    // v rounded, float32 products), with its own rounding (PyTorch's .to(dtype)).
    //
    // Tolerances. Both sides compute the same float32 values before each rounding, each sum
    // in its own order (ours in the BLAS kernel's). Two orders differ by at most
    // 2γ_n Σ|a_i b_i| (Higham, γ_n = n u/(1 − n u), u = 2^-24), but a value that close to a
    // boundary between two 16-bit values rounds to a different one, a step of 2^-10 of it
    // (float16, u = 2^-11) or 2^-7 (bfloat16, u = 2^-8), and the step runs on through every
    // later layer and position of its sequence (measured: one such flip moves 20 of the 32
    // positions' logits). How far two correct orders land apart is therefore a property of
    // these weights and inputs, not a small multiple of u, so the test measures it: our own
    // model with the products' inner sums split into runs of 1, 3, 4, 5, 8 and 11 terms
    // (set_matmul_inner_chunk) and unsplit, seven legal orders; `spread` is the largest
    // difference between two of them. PyTorch's order is one more legal order, so its
    // distance from ours is of the size of that spread; the tolerance is twice it, plus
    // the float32 part for when no value flips: 2γ_128 (the longest sum, 4C = 128 terms,
    // 2γ ≈ 1.5e-5) of the value's scale (|loss|, the largest logit, each gradient
    // tensor's largest).
    //
    // What these numbers were (OpenBLAS Haswell): bfloat16, no flip: spread 5e-7 (loss),
    // 2e-7 (logits), 8e-6 of the largest (gradients). float16, one flip near the start:
    // spread 2.5e-5, 1.4e-3, 9e-4 (SkylakeX's kernels gave 1.0e-5 and 1.4e-3 against
    // PyTorch). A rounding left out moves bfloat16's loss by 1.8e-4 to 1.1e-3, its logits by
    // 8e-3 to 2.7e-2 and its gradients by 4e-3 to 1.8e-2 of the largest, whichever of the
    // forward's six roundings, the backward's five or the weights' it is: far outside
    // bfloat16's tolerances. float16 rounds finely enough that one flip moves the outputs as
    // far as one rounding left out, so its case catches only larger mistakes (the weights'
    // rounding or all of them left out); the last check below makes sure of that.
    struct Case {
        const char* name;
        Precision precision;
        float loss_scale;
    };
    const double u = std::ldexp(1.0, -24), n = 128.0;
    const double two_gamma = 2.0 * n * u / (1.0 - n * u);
    for (const Case& c : {Case{"gpt_bf16", Precision::bf16, 1.0f}, Case{"gpt_fp16", Precision::fp16, 1.0f},
                          Case{"gpt_fp16_scaled", Precision::fp16, 1024.0f}}) {
        const std::string name = c.name;
        CAPTURE(name);
        const std::filesystem::path dir = fixtures / name;
        const int before = matmul_inner_chunk();
        std::vector<MixedRun> orders;
        for (int chunk : {0, 1, 3, 4, 5, 8, 11}) {
            set_matmul_inner_chunk(chunk);
            orders.push_back(run_mixed(dir, c.precision, c.loss_scale));
        }
        set_matmul_inner_chunk(before);
        const MixedRun& ours = orders.front();
        const std::vector<ParameterInfo> table = load_checkpoint(dir / "weights").parameter_table();
        // the spreads: loss, logits, then each gradient tensor
        double loss_spread = 0.0, logit_spread = 0.0;
        std::vector<double> grad_spread(table.size(), 0.0);
        for (std::size_t a = 0; a < orders.size(); ++a) {
            for (std::size_t b = a + 1; b < orders.size(); ++b) {
                loss_spread = std::max(loss_spread, std::fabs(orders[a].loss - orders[b].loss));
                logit_spread = std::max(logit_spread, max_gap(orders[a].logits.data(), orders[b].logits.data(),
                                                              ours.logits.size()));
                for (std::size_t t = 0; t < table.size(); ++t) {
                    grad_spread[t] = std::max(grad_spread[t],
                                              max_gap(orders[a].grads.data() + table[t].offset,
                                                      orders[b].grads.data() + table[t].offset, table[t].size));
                }
            }
        }
        const double ref_loss = read_npy(dir / "loss.npy").data[0];
        const NpyArray logits = read_npy(dir / "logits.npy");
        REQUIRE(logits.data.size() == ours.logits.size());
        const std::vector<double> ref_logits(logits.data.begin(), logits.data.end());
        std::vector<std::vector<double>> ref_grads;
        for (const ParameterInfo& p : table) {
            const NpyArray g = read_npy(dir / "grad" / (p.name + ".npy"));
            REQUIRE(g.data.size() == p.size);
            ref_grads.emplace_back(g.data.begin(), g.data.end());
        }
        const double loss_tolerance = 2.0 * loss_spread + two_gamma * std::fabs(ref_loss);
        const double logit_tolerance =
            2.0 * logit_spread + two_gamma * largest_of(ref_logits.data(), ref_logits.size());
        // Which of our checks a run passes: every one of them, or not.
        auto matches = [&](const MixedRun& r, bool report) {
            bool ok = true;
            const double loss_gap = std::fabs(r.loss - ref_loss);
            const double logit_gap = max_gap(r.logits.data(), ref_logits.data(), ref_logits.size());
            if (report) {
                CAPTURE(loss_spread);
                CAPTURE(loss_tolerance);
                CHECK(loss_gap <= loss_tolerance);
                CAPTURE(logit_spread);
                CAPTURE(logit_tolerance);
                CHECK(logit_gap <= logit_tolerance);
            }
            ok = ok && loss_gap <= loss_tolerance && logit_gap <= logit_tolerance;
            for (std::size_t t = 0; t < table.size(); ++t) {
                const double largest = largest_of(ref_grads[t].data(), table[t].size);
                const double tolerance = 2.0 * grad_spread[t] + two_gamma * largest;
                const double gap = max_gap(r.grads.data() + table[t].offset, ref_grads[t].data(), table[t].size);
                if (report) {
                    CAPTURE(table[t].name);
                    CAPTURE(grad_spread[t]);
                    CAPTURE(largest);
                    CHECK(gap <= tolerance);
                }
                ok = ok && gap <= tolerance;
            }
            return ok;
        };
        matches(ours, true);
        // The same weights in float32 (every rounding left out) must fail the same checks.
        CHECK_FALSE(matches(run_mixed(dir, Precision::fp32, c.loss_scale), false));
        // What the backward pass's rounding lost, counted on both sides (a flip moves a
        // count by one).
        GPT model = load_checkpoint(dir / "weights");
        model.set_precision(c.precision);
        model.train(false);
        const NpyArray xs = read_npy(dir / "x.npy"), ys = read_npy(dir / "y.npy");
        const std::vector<int> x(xs.data.begin(), xs.data.end()), y(ys.data.begin(), ys.data.end());
        model.forward(x, y, static_cast<int>(xs.shape[0]), static_cast<int>(xs.shape[1]));
        model.zero_grad();
        model.reset_rounding_counts();
        model.backward(c.loss_scale);
        const NpyArray counts = read_npy(dir / "rounding.npy");
        const RoundingCounts& r = model.gradient_rounding();
        CHECK(std::fabs(static_cast<double>(r.values) - counts.data[0]) <= 2.0);
        CHECK(std::fabs(static_cast<double>(r.flushed) - counts.data[1]) <= 2.0);
        CHECK(std::fabs(static_cast<double>(r.subnormal) - counts.data[2]) <= 2.0 + 0.01 * counts.data[2]);
    }
}

namespace {

// A text of a small alphabet for the trainer's tests: 20 000 characters, deterministic.
TextDataset small_corpus() {
    Rng rng(77);
    std::string text;
    const std::string letters = "abcdefghij ,.\n";
    while (text.size() < 20000) text += letters[rng.below(letters.size())];
    return make_dataset(text);
}

TrainConfig tiny_run(Precision p) {
    TrainConfig c = TrainConfig::named("tiny");
    c.precision = p;
    c.shorten_to(8);
    c.eval_interval = 4;
    c.eval_iters = 1;
    return c;
}

}  // namespace

TEST_CASE("mixed-precision runs resume bit for bit: the precision and the loss scale are in the checkpoint") {
    const std::filesystem::path dir = attn_test::scratch("attn_precision_resume");
    for (Precision p : {Precision::bf16, Precision::fp16}) {
        CAPTURE(precision_name(p));
        TrainConfig c = tiny_run(p);
        c.initial_loss_scale = 256.0;
        Trainer whole(c, small_corpus());
        std::vector<float> losses;
        while (!whole.done()) losses.push_back(whole.train_step().loss);
        Trainer first(c, small_corpus());
        for (int i = 0; i < 4; ++i) first.train_step();
        first.save(dir);
        Trainer resumed = Trainer::load(dir, small_corpus());
        CHECK(resumed.config().precision == p);
        CHECK(resumed.model().precision() == p);
        CHECK(resumed.loss_scaler().scale == first.loss_scaler().scale);
        for (std::size_t i = 4; i < losses.size(); ++i) {
            CAPTURE(i);
            CHECK(resumed.train_step().loss == losses[i]);
        }
    }
    std::filesystem::remove_all(dir);
}

TEST_CASE("loss scaling: steps whose gradients overflow float16 are skipped and the scale halves until they do not") {
    TrainConfig c = tiny_run(Precision::fp16);
    c.initial_loss_scale = 0x1p60;  // every product's gradient input far past 65504
    Trainer t(c, small_corpus());
    const std::vector<float> before = t.model().parameters();
    const StepRecord first = t.train_step();
    CHECK(first.skipped);
    CHECK(t.loss_scaler().scale == 0x1p59);
    CHECK(t.model().parameters() == before);  // no update
    CHECK(t.optimizer().step_count == 0);
    long skipped = 1;
    StepRecord r = first;
    while (r.skipped && !t.done()) {
        r = t.train_step();
        skipped += r.skipped;
    }
    // Each skip halves: the steps run out before 2^60 comes down to float16's range.
    CHECK(t.loss_scaler().skipped_steps == skipped);
    CHECK(t.loss_scaler().scale == std::ldexp(1.0, 60 - static_cast<int>(skipped)));
    // Without loss scaling nothing is multiplied, so nothing overflows and no step is skipped.
    TrainConfig unscaled = c;
    unscaled.loss_scaling = false;
    Trainer u(unscaled, small_corpus());
    CHECK_FALSE(u.train_step().skipped);  // the loss is not scaled: nothing overflows
}

TEST_CASE("loss scaling keeps the gradient values float16 flushes to zero, and the gradient nearer float32's") {
    // One batch at initialisation (small gradients: the loss is a mean over B·T positions),
    // fp16 without and with a scale of 2^16, against the fp32 gradients.
    const TextDataset data = small_corpus();
    TrainConfig c = tiny_run(Precision::fp16);
    c.batch_size = 32;
    GPT model(c.model_config(static_cast<int>(data.vocab.size())), c.seed);
    std::vector<int> x, y;
    Rng rng(5);
    sample_batch(data.train, 32, static_cast<std::size_t>(c.block_size), rng, x, y);
    auto gradients = [&](Precision p, float scale, RoundingCounts* counts) {
        model.set_precision(p);
        model.forward(x, y, 32, c.block_size);
        model.zero_grad();
        model.reset_rounding_counts();
        model.backward(scale);
        if (counts) *counts = model.gradient_rounding();
        std::vector<float> g = model.gradients();
        for (float& v : g) v /= scale;
        return g;
    };
    RoundingCounts plain, scaled;
    const std::vector<float> g32 = gradients(Precision::fp32, 1.0f, nullptr);
    const std::vector<float> g16 = gradients(Precision::fp16, 1.0f, &plain);
    const std::vector<float> g16s = gradients(Precision::fp16, 65536.0f, &scaled);
    CAPTURE(plain.flushed);
    CAPTURE(scaled.flushed);
    CHECK(plain.flushed > 100 * (scaled.flushed + 1));
    // The gradient's relative distance from float32's: larger without the scale (the values
    // that flush are the smallest ones, so the norm moves less than the count).
    auto distance = [&](const std::vector<float>& g) {
        double d = 0.0, n = 0.0;
        for (std::size_t i = 0; i < g.size(); ++i) {
            d += (static_cast<double>(g[i]) - g32[i]) * (static_cast<double>(g[i]) - g32[i]);
            n += static_cast<double>(g32[i]) * g32[i];
        }
        return std::sqrt(d / n);
    };
    CAPTURE(distance(g16));
    CAPTURE(distance(g16s));
    CHECK(distance(g16s) < distance(g16));
}
