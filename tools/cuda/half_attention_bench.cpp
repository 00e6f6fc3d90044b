// The 16-bit attention workbench: the fused forward kernel in float32 (lesson 13) against
// the same kernel on 16-bit data, the tensor-core (WMMA) kernel and FlashAttention-2's
// forward on mma.sync (S, P and O in registers), float16 and bfloat16, causal, forward only.
//
//   build/tests/half_attention_bench                T = 256 512 1024 2048 4096, hs 64
//   build/tests/half_attention_bench 1024 --hs 128 --repeats 50
//
// For each T: every version validated on the first head against float64 of the same
// inputs (rounded to the format for the 16-bit versions) with FlashAttention's rule for
// its precision (error at most twice that of the plain version at that precision: the
// float32 plain CPU attention, or the plain 16-bit one, every intermediate rounded), then
// timed with CUDA events after warm-up. Shapes as attention_bench: B·T = 16384 tokens,
// NH = 2048 / hs heads. FLOPs: 2·B·NH·T²·hs (the causal half of q kᵀ and P v).
#include "attn/cuda/attention.hpp"
#include "attn/cuda/buffer.hpp"
#include "attn/cuda/device.hpp"
#include "attn/cuda/half_attention.hpp"
#include "attn/mixed_attention.hpp"
#include "attn/random.hpp"
#include "attn/roofline.hpp"
#include "bench.hpp"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

using namespace attn;
using attn::bench::Options;
using attn::cuda::DeviceBuffer;
using attn::cuda::HalfBuffer;

namespace {

Options parse(int argc, char** argv) {
    const Options o = bench::parse(argc, argv, "half_attention_bench", /*can_skip_validation=*/false);
    if (!cuda::half_attention_supports(o.hs)) throw std::invalid_argument("--hs must be 64 or 128");
    return o;
}

// The first head's float64 output and the error of the plain version at `format` (fp32: the
// float32 plain attention), from the first head of q, k, v (values of the format).
struct FirstHead {
    AttentionShape shape;
    std::vector<double> ref;
    double plain_error = 0.0, scale = 0.0;
};

FirstHead first_head(const std::vector<float>& q, const std::vector<float>& k,
                     const std::vector<float>& v, const AttentionShape& s, Precision format) {
    FirstHead h;
    h.shape = {1, 1, s.T, s.hs, s.causal};
    const std::size_t n = h.shape.qkv_size();
    h.ref.resize(n);
    attention_reference_forward(h.ref.data(), nullptr, to_double(q.data(), n).data(),
                                to_double(k.data(), n).data(), to_double(v.data(), n).data(), h.shape);
    std::vector<float> plain(n);
    if (format == Precision::fp32) attention_plain_forward(plain.data(), nullptr, q.data(), k.data(), v.data(), h.shape);
    else attention_plain_rounded_forward(plain.data(), q.data(), k.data(), v.data(), h.shape, format);
    h.plain_error = max_abs_error(plain.data(), h.ref.data(), n);
    h.scale = max_abs(h.ref.data(), n);
    return h;
}

bool report(std::size_t T, const AttentionShape& s, const char* name, const std::vector<float>& out,
            const FirstHead& h, double ms, double fp32_ms) {
    const double error = max_abs_error(out.data(), h.ref.data(), h.shape.qkv_size());
    const bool ok = passes_flash_rule(error, h.plain_error, h.scale);
    const double flops = 2.0 * static_cast<double>(s.B * s.NH * T * T * s.hs);
    // The performance model's least time on an H100 SXM (not a measurement): the bytes of
    // 16-bit or float32 inputs, the operations on the CUDA cores or the tensor cores.
    const std::string kernel = name;
    const bool tensor_cores = kernel.find("tensor") != std::string::npos || kernel.find("mma") != std::string::npos;
    const double model_ms = roofline::bound(roofline::attention_forward_model(
                                                s, true, kernel.find("fp32") == 0 ? 4 : 2, tensor_cores))
                                .seconds * 1e3;
    std::printf("%6zu %4zu %4zu  %-18s %9.2e %9.2e %-4s %9.3f %10.3f %8.1fx %9.2f %8.2fx\n", T, s.B, s.NH, name,
                error, h.plain_error, ok ? "ok" : "FAIL", ms, model_ms, ms / model_ms,
                flops / (ms * 1e-3) / 1e12, fp32_ms / ms);
    return ok;
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options o = parse(argc, argv);
        std::string why;
        if (!cuda::device_available(&why)) {
            std::fprintf(stderr, "half_attention_bench needs a CUDA device: %s\n", why.c_str());
            return 1;
        }
        std::printf("device: %s\n", cuda::device_summary().c_str());
        std::printf("causal attention forward, hs %zu, B·T = 16384, NH = %zu; %d timed runs after %d "
                    "warm-up\nerror: max |out − float64| on the first head; bar: the plain version at "
                    "the same precision (the rule: error ≤ 2 × bar)\n\n",
                    o.hs, 2048 / o.hs, o.repeats, o.warmup);
        bool all_ok = true;
        std::printf("H100 bound: the least time on an H100 SXM by the performance model (attn/roofline.hpp),\n"
                    "an H100 roofline bound, not a measurement; measured/ is this device's fwd ms over it\n\n");
        std::printf("%6s %4s %4s  %-18s %9s %9s %-4s %9s %10s %9s %9s %9s\n", "T", "B", "NH", "kernel", "error",
                    "bar", "rule", "fwd ms", "H100 bound", "measured/", "TFLOP/s", "vs fp32");
        for (const std::size_t T : o.Ts) {
            const AttentionShape s = bench::shape(T, o.hs);
            const std::size_t n = s.qkv_size();
            Rng rng(T);
            const auto q = bench::normals(rng, n), k = bench::normals(rng, n), v = bench::normals(rng, n);
            double fp32_ms = 0.0;
            {  // float32, lesson 13's fused kernel
                DeviceBuffer d_q(q), d_k(k), d_v(v), d_out(n), lse(s.rows());
                const auto fwd = [&] {
                    cuda::flash_attention_forward(d_out.data(), lse.data(), d_q.data(), d_k.data(), d_v.data(), s);
                };
                fwd();
                cuda::synchronize();
                const FirstHead h = first_head(q, k, v, s, Precision::fp32);
                const std::vector<float> out = d_out.download();
                fp32_ms = bench::time_kernel(fwd, o);
                all_ok &= report(T, s, "fp32 fused", std::vector<float>(out.begin(), out.begin() + static_cast<long>(T * s.hs)),
                                 h, fp32_ms, fp32_ms);
            }
            for (Precision format : {Precision::fp16, Precision::bf16}) {
                HalfBuffer d_q(q, format), d_k(k, format), d_v(v, format), d_out(n, format);
                DeviceBuffer lse(s.rows());
                const std::vector<float> q16 = d_q.download(), k16 = d_k.download(), v16 = d_v.download();
                const FirstHead h = first_head(q16, k16, v16, s, format);
                const std::string tag = precision_name(format);
                const std::pair<std::string, std::function<void()>> kernels[] = {
                    {tag + " 16-bit loads", [&] { cuda::flash_attention_forward_16bit(d_out, lse.data(), d_q, d_k, d_v, s); }},
                    {tag + " tensor cores", [&] { cuda::wmma_attention_forward(d_out, lse.data(), d_q, d_k, d_v, s); }},
                    {tag + " mma.sync", [&] { cuda::mma_attention_forward(d_out, lse.data(), d_q, d_k, d_v, s); }},
                };
                for (const auto& [name, fwd] : kernels) {
                    const std::string why_not = name.find("tensor") != std::string::npos ? cuda::wmma_attention_unsupported(format)
                                                : name.find("mma") != std::string::npos  ? cuda::mma_attention_unsupported(format)
                                                                                          : "";
                    if (!why_not.empty()) {
                        std::printf("%6zu  %s: %s\n", T, name.c_str(), why_not.c_str());
                        continue;
                    }
                    fwd();
                    cuda::synchronize();
                    const std::vector<float> out = d_out.download();
                    const double ms = bench::time_kernel(fwd, o);
                    all_ok &= report(T, s, name.c_str(),
                                     std::vector<float>(out.begin(), out.begin() + static_cast<long>(T * s.hs)), h, ms,
                                     fp32_ms);
                }
            }
        }
        if (!all_ok) {
            std::printf("validation FAILED: the timings above are not to be trusted\n");
            return 1;
        }
        return 0;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
