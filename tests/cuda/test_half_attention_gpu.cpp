// Checks the 16-bit attention kernels (float16 and bfloat16 inputs, float32 statistics)
// against float64 with FlashAttention's rule for half precision: each kernel's error is at
// most twice that of the plain 16-bit implementation (every intermediate result stored in
// the format, as PyTorch computes on 16-bit tensors: attn::attention_plain_rounded_forward),
// both measured against the float64 attention of the same 16-bit inputs. The log-sum-exp is
// checked against float64 too. In the CUDA simulator it also shows that the check can fail:
// the tensor-core kernel with K's fragment in the wrong layout (row_major where Kᵀ needs
// col_major) must fail the rule on every case longer than one key. Without a device it
// prints one line starting "skipped:" and CTest reports the test as skipped.
//
// The mma.sync kernel (FlashAttention-2's forward, attention_mma.cuh) runs on generated shapes
// besides the fixed ones (T below 16 and not a multiple of 64, causal and not, hs 64 and 128,
// several B·NH), and its output agrees with the WMMA kernel's on the same inputs within a bound
// derived below. In the simulator, wrong fragment indices must fail the rule on every case
// where they change the result: each of the 15 other readings of the C layout's row and key
// offsets by the mask, each of the 23 other orders of P's A registers, a row maximum over
// two lanes of four and V loaded without .trans; and the tensor-core operations it is
// counted are those of the key tiles it visits, by formula.
#include "attn/cuda/buffer.hpp"
#include "attn/cuda/device.hpp"
#include "attn/cuda/half_attention.hpp"
#include "attn/mixed_attention.hpp"
#include "device_main.hpp"

#include "attn/random.hpp"
#include "attn/roofline.hpp"

#if ATTN_CUDA_SIMULATED
#include "attention_mma.cuh"
#include "attention_wmma.cuh"
#include <cuda_runtime.h>  // the simulator's: its race-check switch
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using namespace attn;
using attn::cuda::DeviceBuffer;
using attn::cuda::HalfBuffer;

namespace {

// A kernel under test: (out, lse, q, k, v, shape).
using Kernel = std::function<void(HalfBuffer&, float*, const HalfBuffer&, const HalfBuffer&,
                                  const HalfBuffer&, const AttentionShape&)>;

struct Problem {
    AttentionShape shape;
    Precision format;
    RoundedAttentionInputs in;  // q, k, v (values of the format), the float64 out and lse
    std::vector<float> out_plain;
    double plain_error = 0.0, scale = 0.0;

    Problem(const AttentionShape& s, Precision f, std::uint64_t seed)
        : shape(s), format(f), in(rounded_attention_inputs(s, f, seed)) {
        const std::size_t n = s.qkv_size();
        out_plain.resize(n);
        attention_plain_rounded_forward(out_plain.data(), in.q.data(), in.k.data(), in.v.data(), s, f);
        plain_error = max_abs_error(out_plain.data(), in.out.data(), n);
        scale = max_abs(in.out.data(), n);
    }
};

struct Result {
    double error, lse_error;
    bool rule;
    std::vector<float> out;
};

Result run(const Problem& p, const Kernel& kernel) {
    const std::size_t n = p.shape.qkv_size();
    HalfBuffer q(p.in.q, p.format), k(p.in.k, p.format), v(p.in.v, p.format);
    // Poisoned outputs: a value the kernel forgets to write shows up.
    HalfBuffer out(std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()), p.format);
    DeviceBuffer lse(std::vector<float>(p.shape.rows(), 1e30f));
    kernel(out, lse.data(), q, k, v, p.shape);
    cuda::synchronize();
    const std::vector<float> o = out.download(), l = lse.download();
    Result r;
    r.error = max_abs_error(o.data(), p.in.out.data(), n);
    r.lse_error = max_abs_error(l.data(), p.in.lse.data(), p.shape.rows());
    r.rule = passes_flash_rule(r.error, p.plain_error, p.scale);
    r.out = o;
    return r;
}

// The plain 16-bit version must itself be sound, or the rule compares against a broken bar:
// its error is a few units of the format's last place of outputs of size ~1.
bool plain_is_sound(const Problem& p) {
    return p.plain_error <= 8.0 * format_info(p.format).epsilon * std::max(1.0, p.scale);
}

// Shapes drawn for the mma.sync kernel: for each head size and causal or not, one T below 16
// and one from 17 to `longest` that is not a multiple of 64, B in 1…2 and NH in 1…3.
std::vector<AttentionShape> generated_shapes(std::uint64_t seed, std::size_t longest) {
    Rng rng(seed);
    std::vector<AttentionShape> shapes;
    for (const std::size_t hs : {64, 128}) {
        for (const bool causal : {true, false}) {
            std::size_t long_T = 0;
            do long_T = 17 + rng.below(longest - 16);
            while (long_T % 64 == 0);
            for (const std::size_t T : {static_cast<std::size_t>(1 + rng.below(15)), long_T}) {
                shapes.push_back({1 + rng.below(2), 1 + rng.below(3), T, hs, causal});
            }
        }
    }
    return shapes;
}

// Two kernels that both compute o = Σ_j fl(p_j) v_j / l in float32 from the same 16-bit inputs
// (p_j = e^(s_j − m) rounded to the format, l the float32 sum of the unrounded p_j) and round o
// once, differ by at most: each kernel's rounding of P, ≤ u·max|v| (u = ε/2: Σ p_j |δ_j| |v_j| / l
// with Σ p_j ≤ l), and of the output, ≤ u·max|o|, twice; and each kernel's float32 sums and
// exponentials (the running maximum is taken over 32 or 64 keys, so the rescales differ): the
// sum's γ_T ≤ T·2^-24 and T/32 + 1 rescales of ≤ 2 ulp (2^-22) each, relative to max|v|, over-
// counted as T·2^-22 each.
double agreement_bound(const Problem& p) {
    double v_max = 0.0;
    for (const float x : p.in.v) v_max = std::max(v_max, std::fabs(static_cast<double>(x)));
    return format_info(p.format).epsilon * (v_max + p.scale) +
           2.0 * static_cast<double>(p.shape.T) * std::ldexp(1.0, -22) * v_max;
}

double max_difference(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double x = std::fabs(static_cast<double>(a[i]) - b[i]);
        if (std::isnan(x)) return std::numeric_limits<double>::infinity();
        d = std::max(d, x);
    }
    return d;
}

#if ATTN_CUDA_SIMULATED
// The mma.sync kernel on float16, hs 64, with the mask's C layout offsets changed by the bits
// MaskLayout and P's A registers in order number POrder (attention_mma.cuh).
template <int MaskLayout, int POrder>
void mma_fp16_hs64(HalfBuffer& o, float* l, const HalfBuffer& q, const HalfBuffer& k, const HalfBuffer& v,
                   const AttentionShape& s) {
    using A = cuda::detail::MmaAttention<__half, 64, MaskLayout, POrder>;
    cuda::detail::launch_mma_attention<A>(reinterpret_cast<__half*>(o.data()), l,
                                          reinterpret_cast<const __half*>(q.data()),
                                          reinterpret_cast<const __half*>(k.data()),
                                          reinterpret_cast<const __half*>(v.data()), s, nullptr);
}
using Forward = void (*)(HalfBuffer&, float*, const HalfBuffer&, const HalfBuffer&, const HalfBuffer&,
                         const AttentionShape&);
template <int... X>
std::vector<Forward> wrong_mask_layouts(std::integer_sequence<int, X...>) {
    return {&mma_fp16_hs64<X + 1, 0>...};  // 1 … 15: every layout but the ISA's
}
template <int... X>
std::vector<Forward> wrong_p_orders(std::integer_sequence<int, X...>) {
    return {&mma_fp16_hs64<0, X + 1>...};  // 1 … 23: every order but the identity
}
#endif

}  // namespace

int main() {
    return run_on_device([] {
#if ATTN_CUDA_SIMULATED
        // The simulator runs each WMMA call as a warp-wide exchange: short sequences.
        std::vector<AttentionShape> cases = {
            {1, 2, 1, 64, true},  {1, 2, 47, 64, true},  {1, 1, 130, 64, false},
            {2, 1, 96, 64, true}, {1, 1, 70, 128, true}, {1, 1, 33, 128, false},
        };
        const std::vector<AttentionShape> drawn = generated_shapes(1800, 200);
#else
        std::vector<AttentionShape> cases = {
            {2, 3, 1, 64, true},     {2, 3, 63, 64, true},    {2, 3, 64, 64, false},
            {1, 4, 200, 64, true},   {1, 4, 1000, 64, false}, {1, 2, 2049, 64, true},
            {2, 2, 130, 128, true},  {1, 2, 130, 128, false}, {1, 1, 1025, 128, true},
        };
        const std::vector<AttentionShape> drawn = generated_shapes(1800, 1500);
#endif
        cases.insert(cases.end(), drawn.begin(), drawn.end());
        const Kernel flash16 = [](HalfBuffer& o, float* l, const HalfBuffer& q, const HalfBuffer& k,
                                  const HalfBuffer& v, const AttentionShape& s) {
            cuda::flash_attention_forward_16bit(o, l, q, k, v, s);
        };
        const Kernel tensor_cores = [](HalfBuffer& o, float* l, const HalfBuffer& q, const HalfBuffer& k,
                                       const HalfBuffer& v, const AttentionShape& s) {
            cuda::wmma_attention_forward(o, l, q, k, v, s);
        };
        const Kernel mma_sync = [](HalfBuffer& o, float* l, const HalfBuffer& q, const HalfBuffer& k,
                                   const HalfBuffer& v, const AttentionShape& s) {
            cuda::mma_attention_forward(o, l, q, k, v, s);
        };
        int failed = 0, checked = 0, seed = 180;
        for (Precision format : {Precision::fp16, Precision::bf16}) {
            const std::string no_tensor_cores = cuda::wmma_attention_unsupported(format);
            const std::string no_mma = cuda::mma_attention_unsupported(format);
            for (const AttentionShape& s : cases) {
                const Problem p(s, format, static_cast<std::uint64_t>(seed++));
                std::printf("%s B=%zu NH=%zu T=%zu hs=%zu %s: plain 16-bit %.2e\n", precision_name(format),
                            s.B, s.NH, s.T, s.hs, s.causal ? "causal" : "full", p.plain_error);
                if (!plain_is_sound(p)) {
                    std::printf("    the plain 16-bit version is off: FAILED\n");
                    ++failed;
                }
                const std::pair<const char*, const Kernel*> kernels[] = {
                    {"16-bit loads", &flash16}, {"tensor cores", &tensor_cores}, {"mma.sync", &mma_sync}};
                std::vector<float> wmma_out, mma_out;
                for (const auto& [name, kernel] : kernels) {
                    const std::string& why_not = kernel == &tensor_cores ? no_tensor_cores : no_mma;
                    if (kernel != &flash16 && !why_not.empty()) {
                        std::printf("    %-13s not run: %s\n", name, why_not.c_str());
                        continue;
                    }
                    const Result r = run(p, *kernel);
                    if (kernel == &tensor_cores) wmma_out = r.out;
                    if (kernel == &mma_sync) mma_out = r.out;
                    // lse: scores summed in float32 from 16-bit inputs (products exact in
                    // float32), ln of a float32 sum, against float64 on the same inputs: the
                    // scores' γ_hs Σ|qk|/√hs ≤ 5.5e-5 (hs 128) plus the sum's γ_T ≤ 1.2e-4
                    // (T 2049) at worst (u = 2^-24), ≈ 4.9e-6 + √2049 u ≈ 7.6e-6 with random
                    // signs, plus ½ulp(lse ≤ 16) ≈ 4.8e-7: 1e-4 is 13× above that estimate,
                    // below the worst case (~1.8e-4) on the largest cases.
                    const bool lse_ok = r.lse_error <= 1e-4;
                    std::printf("    %-13s %.2e (bar 2 x plain), lse %.1e  %s\n", name, r.error, r.lse_error,
                                r.rule && lse_ok ? "ok" : "FAILED");
                    failed += r.rule && lse_ok ? 0 : 1;
                    ++checked;
                }
                if (!wmma_out.empty() && !mma_out.empty()) {
                    const double difference = max_difference(mma_out, wmma_out), bound = agreement_bound(p);
                    const bool ok = difference <= bound;
                    std::printf("    mma.sync against tensor cores (WMMA): %.2e, bound %.2e  %s\n", difference, bound,
                                ok ? "ok" : "FAILED");
                    failed += ok ? 0 : 1;
                }
            }
        }
        // Bad arguments are refused before any launch.
        {
            HalfBuffer a(64, Precision::fp16), b(64, Precision::bf16);
            DeviceBuffer l(1);
            bool refused = false;
            try {
                cuda::wmma_attention_forward(a, l.data(), a, b, a, {1, 1, 1, 64, true});
            } catch (const std::invalid_argument& e) {
                refused = std::string(e.what()).find("one format") != std::string::npos;
            }
            std::printf("mixed formats refused: %s\n", refused ? "ok" : "FAILED");
            failed += refused ? 0 : 1;
            refused = false;
            try {
                HalfBuffer c(96 * 4, Precision::fp16);
                cuda::mma_attention_forward(c, l.data(), c, c, c, {1, 1, 4, 96, false});
            } catch (const std::invalid_argument& e) {
                refused = std::string(e.what()).find("mma_attention_forward: the head size must be 64 or 128") !=
                          std::string::npos;
            }
            std::printf("mma.sync: head size 96 refused: %s\n", refused ? "ok" : "FAILED");
            failed += refused ? 0 : 1;
        }
#if ATTN_CUDA_SIMULATED
        // The performance model's formula (roofline::attention_forward_model with 16-bit
        // inputs) against what the simulator counts: the bytes of both kernels, and the
        // tensor cores' operations between the useful ones and those of every (query, key)
        // pair. Each head's slice of every buffer is whole pages here, so the count is exact.
        for (const bool causal : {true, false}) {
            const AttentionShape s{1, 2, 128, 64, causal};
            const std::size_t n = s.qkv_size();
            const std::vector<float> ones(n, 0.5f);
            HalfBuffer q(ones, Precision::fp16), k(ones, Precision::fp16), v(ones, Precision::fp16),
                o(n, Precision::fp16);
            DeviceBuffer l(s.rows());
            for (const int which : {0, 1, 2}) {  // 16-bit loads, WMMA, mma.sync
                const bool cores = which > 0;
                const bool racecheck = cuda_sim::racecheck();
                cuda_sim::set_racecheck(false);
                cuda::count_work(true);
                (which == 0 ? flash16 : which == 1 ? tensor_cores : mma_sync)(o, l.data(), q, k, v, s);
                bool counted = true;
                const auto launches = cuda::take_counted_work(&counted);
                cuda::count_work(false);
                cuda_sim::set_racecheck(racecheck);
                if (!counted) {
                    std::printf("model: skipped, this build does not count bytes (AddressSanitizer's allocations "
                                "are not whole pages)\n");
                    break;
                }
                const roofline::Launch m = roofline::attention_forward_model(s, true, 2, cores).front();
                double read = 0, written = 0, f16 = 0;
                for (const auto& x : launches) {
                    read += x.bytes_read;
                    written += x.bytes_written;
                    f16 += x.f16_flops;
                }
                const double all_pairs = 4.0 * 64 * 2 * 128 * 128;
                // mma.sync: both products over every (query, key) pair of the 64 × 64 tiles it
                // visits, 4·hs per pair: query tile i visits key tiles 0 … i (causal) or all.
                const double tiles = causal ? 1 + 2 : 2 * 2, visited = 4.0 * 64 * 2 * tiles * 64 * 64;
                const bool ok = read == m.bytes_read && written == m.bytes_written &&
                                (!cores || (f16 >= m.f16_flops && f16 <= all_pairs)) && (which != 2 || f16 == visited);
                std::printf("model %s %s: counted %.0f read, %.0f written, %.0f tensor-core operations; formula "
                            "%.0f, %.0f, %.0f useful  %s\n", which == 0 ? "16-bit loads" : which == 1 ? "tensor cores" : "mma.sync",
                            causal ? "causal" : "full", read, written, f16, m.bytes_read, m.bytes_written,
                            m.f16_flops, ok ? "ok" : "FAILED");
                failed += ok ? 0 : 1;
            }
        }
        // The same check on a deliberately wrong fragment layout: it must fail.
        int noticed = 0, wrong_cases = 0;
        for (Precision format : {Precision::fp16, Precision::bf16}) {
            for (const AttentionShape& s : cases) {
                if (s.T < 2) continue;  // one key: softmax gives it weight 1 whatever its score
                ++wrong_cases;
                const Problem p(s, format, static_cast<std::uint64_t>(seed++));
                const Result r = run(p, [](HalfBuffer& o, float* l, const HalfBuffer& q, const HalfBuffer& k,
                                           const HalfBuffer& v, const AttentionShape& shape) {
                    cuda::detail::wmma_attention_forward_with<nvcuda::wmma::row_major>(o, l, q, k, v,
                                                                                       shape, nullptr);
                });
                noticed += r.rule ? 0 : 1;
                std::printf("K's fragment row_major (wrong), %s T=%zu hs=%zu: %.2e  %s\n",
                            precision_name(format), s.T, s.hs, r.error,
                            r.rule ? "NOT NOTICED" : "fails the rule, as it must");
            }
        }
        if (noticed != wrong_cases) {
            std::printf("the rule missed the wrong layout in %d of %d cases: FAILED\n",
                        wrong_cases - noticed, wrong_cases);
            ++failed;
        }
        // The mma.sync kernel's wrong fragment indices, generated: every other reading of the
        // mask's C layout offsets, on the causal cases (where the mask decides), and every
        // other order of P's A registers, on all, in float16 with hs 64 and T > 16 (so that
        // rows g + 8 and keys 8 … 15 of a k16 step exist).
        {
            const auto masks = wrong_mask_layouts(std::make_integer_sequence<int, 15>{});
            const auto orders = wrong_p_orders(std::make_integer_sequence<int, 23>{});
            const std::pair<const char*, const std::vector<Forward>*> families[] = {
                {"the mask's row and key offsets", &masks}, {"P's A registers", &orders}};
            for (const auto& [family, mutants] : families) {
                const bool causal_only = mutants == &masks;
                int runs = 0, caught = 0;
                for (std::size_t m = 0; m < mutants->size(); ++m) {
                    for (const AttentionShape& s : cases) {
                        if (s.hs != 64 || s.T <= 16 || (causal_only && !s.causal)) continue;
                        ++runs;
                        const Problem p(s, Precision::fp16, static_cast<std::uint64_t>(seed++));
                        const Result r = run(p, (*mutants)[m]);
                        caught += r.rule ? 0 : 1;
                        if (r.rule) {
                            std::printf("mma.sync with %s, wrong variant %zu of %zu, T=%zu %s: %.2e NOT NOTICED\n",
                                        family, m + 1, mutants->size(), s.T, s.causal ? "causal" : "full", r.error);
                        }
                    }
                }
                const bool ok = runs > 0 && caught == runs;
                std::printf("mma.sync with %s in each of the %zu other ways: fails the rule in %d of %d runs  %s\n",
                            family, mutants->size(), caught, runs, ok ? "ok, as it must" : "FAILED");
                failed += ok ? 0 : 1;
            }
        }
        // Two more, each on every case where it changes the result (formats alternating):
        // lanes t = 2, 3 hold a key once T > 4.
        using cuda::detail::MmaMistake;
        struct Mistake {
            const char* name;
            void (*forward)(HalfBuffer&, float*, const HalfBuffer&, const HalfBuffer&, const HalfBuffer&,
                            const AttentionShape&, void*);
            bool (*changes)(const AttentionShape&);
        };
        const Mistake mistakes[] = {
            {"row maximum over 2 lanes of 4", cuda::detail::mma_attention_forward_with<MmaMistake::row_max_over_two_lanes>,
             [](const AttentionShape& s) { return s.T > 4; }},
            {"V through ldmatrix without .trans", cuda::detail::mma_attention_forward_with<MmaMistake::v_not_transposed>,
             [](const AttentionShape&) { return true; }},
        };
        for (const Mistake& mistake : mistakes) {
            int applicable = 0, caught = 0, index = 0;
            for (const AttentionShape& s : cases) {
                const Precision format = index++ % 2 ? Precision::bf16 : Precision::fp16;
                if (!mistake.changes(s)) continue;
                ++applicable;
                const Problem p(s, format, static_cast<std::uint64_t>(seed++));
                const auto forward = mistake.forward;
                const Result r = run(p, [forward](HalfBuffer& o, float* l, const HalfBuffer& q, const HalfBuffer& k,
                                                  const HalfBuffer& v, const AttentionShape& shape) {
                    forward(o, l, q, k, v, shape, nullptr);
                });
                caught += r.rule ? 0 : 1;
                if (r.rule) {
                    std::printf("mma.sync with %s, %s B=%zu NH=%zu T=%zu hs=%zu %s: %.2e NOT NOTICED\n", mistake.name,
                                precision_name(format), s.B, s.NH, s.T, s.hs, s.causal ? "causal" : "full", r.error);
                }
            }
            const bool ok = applicable > 0 && caught == applicable;
            std::printf("mma.sync with %s: fails the rule in %d of %d cases it changes  %s\n", mistake.name, caught,
                        applicable, ok ? "ok, as it must" : "FAILED");
            failed += ok ? 0 : 1;
        }
#endif
        if (failed) {
            std::printf("%d checks FAILED\n", failed);
            return 1;
        }
        std::printf("all %d kernel runs pass FlashAttention's rule for half precision\n", checked);
        return 0;
    });
}
