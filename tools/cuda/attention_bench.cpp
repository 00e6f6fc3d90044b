// The attention workbench: plain CUDA attention (cuBLAS + softmax, the (T, T) matrix in
// device memory) against the fused FlashAttention-style kernels, causal, float32.
//
//   build/tests/attention_bench                 T = 256 512 1024 2048 4096, hs 64
//   build/tests/attention_bench 1024 4096       chosen T only
//   build/tests/attention_bench --hs 128 --no-validate --repeats 50
//
// For each T, as llm.c's dev/cuda files do: the CPU float64 reference on the first head,
// each version validated against it with a stated tolerance, then timed with CUDA events
// after warm-up. The shapes follow FlashAttention-2's benchmark: B·T = 16384 tokens,
// NH = 2048 / hs heads. tools/cuda/attention_torch.py times PyTorch's
// scaled_dot_product_attention on the same shapes.
//
// FLOPs counted (useful work only, the same count for every version):
//   forward   4·B·NH·T²·hs for q kᵀ and P v, halved by the causal mask: 2·B·NH·T²·hs
//   backward  2.5 × forward (five T×T×hs products: S again, dP, dV, dQ, dK), the
//             convention of FlashAttention's benchmark (the fused backward does seven:
//             its dQ launch computes S and dP again; those two are not counted)
// The plain version computes the masked half too; its TFLOP/s count only the useful half.
//
// Peak memory: cudaMemGetInfo's used bytes after the timed runs, less those used before
// any buffer was allocated: inputs, outputs, gradients and each version's own scratch
// (plain: two (B, NH, T, T) matrices and cuBLAS's workspace; fused: two (B, NH, T) rows).
#include "attn/cuda/attention.hpp"
#include "attn/cuda/buffer.hpp"
#include "attn/cuda/device.hpp"
#include "attn/flash.hpp"
#include "attn/random.hpp"
#include "attn/roofline.hpp"
#include "bench.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

using namespace attn;
using attn::bench::check;
using attn::bench::Options;
using attn::cuda::DeviceBuffer;

namespace {

std::size_t used_device_bytes() {
    std::size_t free_bytes = 0, total = 0;
    check(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
    return total - free_bytes;
}

// The first head (b = 0, h = 0) of a (B, NH, T, hs) buffer.
std::vector<float> first_head(const std::vector<float>& x, const AttentionShape& s) {
    return std::vector<float>(x.begin(), x.begin() + static_cast<long>(s.T * s.hs));
}

struct Reference {
    std::vector<double> out, dq, dk, dv;
};

// Float64 reference for the first head only (a full T = 4096 problem would take the CPU
// minutes; heads are independent, so one head checks the indexing of all).
Reference reference_first_head(const std::vector<float>& q, const std::vector<float>& k,
                               const std::vector<float>& v, const std::vector<float>& dout,
                               const AttentionShape& s) {
    const AttentionShape one{1, 1, s.T, s.hs, s.causal};
    const std::size_t n = one.qkv_size();
    Reference r{std::vector<double>(n), std::vector<double>(n), std::vector<double>(n),
                std::vector<double>(n)};
    const auto q64 = to_double(q.data(), n), k64 = to_double(k.data(), n),
               v64 = to_double(v.data(), n), dout64 = to_double(dout.data(), n);
    attention_reference_forward(r.out.data(), nullptr, q64.data(), k64.data(), v64.data(), one);
    attention_reference_backward(r.dq.data(), r.dk.data(), r.dv.data(), dout64.data(),
                                 q64.data(), k64.data(), v64.data(), one);
    return r;
}

// Validation tolerances. Outputs are convex mixes of N(0,1) values: float32 error ~1e-6.
// Gradients sum up to T = 4096 O(1) terms: ~sqrt(T)·1e-7·|terms| stays below 1e-4.
constexpr double kForwardTolerance = 1e-5;
constexpr double kBackwardTolerance = 1e-4;

bool validate(const char* name, const DeviceBuffer& out, const DeviceBuffer& dq,
              const DeviceBuffer& dk, const DeviceBuffer& dv, const Reference& ref,
              const AttentionShape& s) {
    const std::size_t n = s.T * s.hs;
    const double e_out = max_abs_error(first_head(out.download(), s).data(), ref.out.data(), n);
    double e_grad = max_abs_error(first_head(dq.download(), s).data(), ref.dq.data(), n);
    e_grad = std::max(e_grad, max_abs_error(first_head(dk.download(), s).data(), ref.dk.data(), n));
    e_grad = std::max(e_grad, max_abs_error(first_head(dv.download(), s).data(), ref.dv.data(), n));
    const bool ok = e_out <= kForwardTolerance && e_grad <= kBackwardTolerance;
    std::printf("  validate %-6s out %.2e (tol %.0e)  grads %.2e (tol %.0e)  %s\n", name, e_out,
                kForwardTolerance, e_grad, kBackwardTolerance, ok ? "ok" : "MISMATCH");
    return ok;
}

void print_row(std::size_t T, const AttentionShape& s, const char* name, double fwd_ms,
               double fwdbwd_ms, std::size_t peak_bytes) {
    const double fwd_flops = 2.0 * static_cast<double>(s.B * s.NH * T * T * s.hs);
    const double fwdbwd_flops = 3.5 * fwd_flops;
    // The performance model's least time for the forward pass on an H100 SXM (its bytes as
    // the CUDA simulator counts them, its operations by formula): not a measurement.
    const double model_ms =
        roofline::bound(roofline::attention_forward_model(s, std::string(name) == "fused")).seconds * 1e3;
    std::printf("%6zu %4zu %4zu  %-6s %10.3f %10.3f %8.1fx %10.2f %12.3f %10.2f %11.1f\n", T, s.B, s.NH, name,
                fwd_ms, model_ms, fwd_ms / model_ms, fwd_flops / (fwd_ms * 1e-3) / 1e12, fwdbwd_ms,
                fwdbwd_flops / (fwdbwd_ms * 1e-3) / 1e12, static_cast<double>(peak_bytes) / (1 << 20));
}

}  // namespace

int main(int argc, char** argv) {
    try {
        const Options o = bench::parse(argc, argv, "attention_bench", /*can_skip_validation=*/true);
        std::string why;
        if (!cuda::device_available(&why)) {
            std::fprintf(stderr, "attention_bench needs a CUDA device: %s\n", why.c_str());
            return 1;
        }
        if (!cuda::flash_attention_supports(o.hs)) throw std::invalid_argument("--hs must be 64 or 128");
        std::printf("device: %s\n", cuda::device_summary().c_str());
        std::printf("causal attention, float32, hs %zu, B·T = 16384, NH = %zu; %d timed runs after %d "
                    "warm-up\n\n", o.hs, 2048 / o.hs, o.repeats, o.warmup);
        check(cudaFree(nullptr), "cudaFree");  // create the context before the baseline
        const std::size_t baseline = used_device_bytes();
        bool all_ok = true;
        std::size_t cublas_kept = 0;  // what cuBLAS keeps after the plain runs (its workspace)
        std::printf("%6s %4s %4s  %-6s %10s %10s %9s %10s %12s %10s %11s\n", "T", "B", "NH", "method",
                    "fwd ms", "H100 bound", "measured/", "TFLOP/s", "fwd+bwd ms", "TFLOP/s", "peak MiB");
        for (const std::size_t T : o.Ts) {
            const AttentionShape s = bench::shape(T, o.hs);
            const std::size_t n = s.qkv_size();
            Rng rng(T);
            const auto q = bench::normals(rng, n), k = bench::normals(rng, n),
                       v = bench::normals(rng, n), dout = bench::normals(rng, n);
            Reference ref;
            if (o.validate) ref = reference_first_head(q, k, v, dout, s);

            DeviceBuffer d_q(q), d_k(k), d_v(v), d_dout(dout), d_out(n), d_dq(n), d_dk(n), d_dv(n);

            const std::size_t before_plain = used_device_bytes();
            {  // plain
                DeviceBuffer att(cuda::plain_attention_scratch_floats(s)), datt(att.size());
                auto fwd = [&] {
                    cuda::plain_attention_forward(d_out.data(), att.data(), d_q.data(), d_k.data(),
                                                  d_v.data(), s);
                };
                auto fwdbwd = [&] {
                    fwd();
                    cuda::plain_attention_backward(d_dq.data(), d_dk.data(), d_dv.data(), datt.data(),
                                                   d_dout.data(), d_q.data(), d_k.data(), d_v.data(),
                                                   att.data(), s);
                };
                fwdbwd();
                cuda::synchronize();
                if (o.validate) all_ok &= validate("plain", d_out, d_dq, d_dk, d_dv, ref, s);
                const double f = bench::time_kernel(fwd, o), fb = bench::time_kernel(fwdbwd, o);
                print_row(T, s, "plain", f, fb, used_device_bytes() - baseline);
            }
            cublas_kept += used_device_bytes() - before_plain;  // att, datt are freed by now
            {  // fused
                DeviceBuffer lse(s.rows()), delta(s.rows());
                auto fwd = [&] {
                    cuda::flash_attention_forward(d_out.data(), lse.data(), d_q.data(), d_k.data(),
                                                  d_v.data(), s);
                };
                auto fwdbwd = [&] {
                    fwd();
                    cuda::flash_attention_backward(d_dq.data(), d_dk.data(), d_dv.data(),
                                                   delta.data(), d_dout.data(), d_q.data(),
                                                   d_k.data(), d_v.data(), d_out.data(), lse.data(), s);
                };
                fwdbwd();
                cuda::synchronize();
                if (o.validate) all_ok &= validate("fused", d_out, d_dq, d_dk, d_dv, ref, s);
                const double f = bench::time_kernel(fwd, o), fb = bench::time_kernel(fwdbwd, o);
                // cuBLAS keeps its workspace after the plain runs: leave it out of the fused figure.
                print_row(T, s, "fused", f, fb, used_device_bytes() - baseline - cublas_kept);
            }
        }
        int sms = 0;
        check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "cudaDeviceGetAttribute");
        std::printf("\nThe fused backward's schedules on this device's %d SMs (the rows above use the "
                    "automatic one):\n", sms);
        std::printf("%6s  %-38s  %-38s  %s\n", "T", "key tiles", "two grids", "automatic");
        for (const std::size_t T : o.Ts) {
            const AttentionShape s = bench::shape(T, o.hs);
            const auto tiles = cuda::flash_backward_grid(s, cuda::FlashBackwardSchedule::key_tiles);
            const auto two = cuda::flash_backward_grid(s, cuda::FlashBackwardSchedule::two_grids);
            const auto chosen = cuda::flash_backward_grid(s).schedule;
            char a[80], b[80];
            std::snprintf(a, sizeof a, "%u launches of %u blocks (%.2f per SM)", tiles.key_tiles,
                          tiles.heads, static_cast<double>(tiles.heads) / sms);
            std::snprintf(b, sizeof b, "%u + %u blocks in 2 launches", two.key_tiles * two.heads,
                          two.query_tiles * two.heads);
            std::printf("%6zu  %-38s  %-38s  %s\n", T, a, b,
                        chosen == cuda::FlashBackwardSchedule::two_grids ? "two grids" : "key tiles");
        }
        std::printf("\nFLOPs: forward 2·B·NH·T²·hs (causal half of q kᵀ and P v), forward+backward "
                    "3.5× that.\npeak MiB includes q, k, v, out, dout, dq, dk, dv (8·B·NH·T·hs "
                    "floats) and each version's scratch.\n"
                    "H100 bound: the forward's least time on an H100 SXM by the performance model "
                    "(attn/roofline.hpp: the\nbytes the CUDA simulator counts, at 3.35 TB/s, against the "
                    "operations at 67 TFLOP/s float32), an\nH100 roofline bound, not a measurement; "
                    "measured/ is this device's fwd ms over it.\n");
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
