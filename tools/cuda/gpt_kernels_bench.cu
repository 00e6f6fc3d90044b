// The kernel workbench, in the manner of llm.c's dev/cuda: for each op of the GPU model,
// run the CPU reference (gpt_layers.hpp), run the GPU version (gpt_ops.hpp), check that
// they agree within a stated tolerance, then time the GPU version with CUDA events after a
// warm-up. Usage: gpt_kernels_bench [B] [T]   (default 16 256; C = 384, NH = 6, V = 65,
// the tiny-shakespeare recipe's sizes).
#include "attn/cuda/device.hpp"
#include "attn/cuda/gpt_ops.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/random.hpp"

#include "check.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using namespace attn;

namespace {

// A device copy of a host vector, freed on scope exit.
template <typename V>
struct Device {
    V* ptr = nullptr;
    std::size_t n = 0;
    explicit Device(const std::vector<V>& host) : n(host.size()) {
        CUDA_CHECK(cudaMalloc(&ptr, std::max<std::size_t>(n, 1) * sizeof(V)));
        CUDA_CHECK(cudaMemcpy(ptr, host.data(), n * sizeof(V), cudaMemcpyHostToDevice));
    }
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;
    ~Device() { cudaFree(ptr); }
    std::vector<V> get() const {
        std::vector<V> host(n);
        CUDA_CHECK(cudaMemcpy(host.data(), ptr, n * sizeof(V), cudaMemcpyDeviceToHost));
        return host;
    }
};

std::vector<float> random_vector(std::size_t n, Rng& rng, float scale = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = scale * rng.normal();
    return v;
}

int failures = 0;

// max |gpu − cpu| ≤ tolerance · max |cpu|: tolerances are relative to the tensor's scale.
void validate(const char* name, const std::vector<float>& gpu, const std::vector<float>& cpu,
              float tolerance) {
    float diff = 0.0f, scale = 0.0f;
    for (std::size_t i = 0; i < cpu.size(); ++i) {
        diff = std::max(diff, std::fabs(gpu[i] - cpu[i]));
        scale = std::max(scale, std::fabs(cpu[i]));
    }
    const bool ok = diff <= tolerance * std::max(scale, 1e-6f) && gpu.size() == cpu.size();
    failures += !ok;
    std::printf("  %-34s max |Δ| %.3g of scale %.3g (tolerance %.0e relative): %s\n", name, diff,
                scale, static_cast<double>(tolerance), ok ? "OK" : "MISMATCH");
}

// Mean time of `fn` over `repeats` calls after `warmup` calls, with CUDA events.
void time_it(const char* name, double bytes, double flops, const std::function<void()>& fn) {
    const int warmup = 5, repeats = 50;
    for (int i = 0; i < warmup; ++i) fn();
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start));
    for (int i = 0; i < repeats; ++i) fn();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    const double s = static_cast<double>(ms) / repeats / 1e3;
    std::printf("  %-34s %9.1f µs", name, s * 1e6);
    if (bytes > 0) std::printf("  %7.1f GB/s", bytes / s / 1e9);
    if (flops > 0) std::printf("  %7.1f TFLOP/s", flops / s / 1e12);
    std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
    std::string why;
    if (!cuda::device_available(&why)) {
        std::printf("skipped: the workbench needs a CUDA device (%s)\n", why.c_str());
        return 0;
    }
    try {
        const int B = argc > 1 ? std::atoi(argv[1]) : 16;
        const int T = argc > 2 ? std::atoi(argv[2]) : 256;
        const int C = 384, NH = 6, V = 65;
        if (B <= 0 || T <= 0) throw std::invalid_argument("B and T must be positive");
        const int N = B * T;
        const std::size_t BTC = static_cast<std::size_t>(N) * C;
        std::printf("%s\nB = %d, T = %d, C = %d, NH = %d, V = %d\n",
                    cuda::device_summary().c_str(), B, T, C, NH, V);
        Rng rng(1337);
        cuda::Blas blas_fp32(false), blas_tf32(true);
        cuda::stream_t stream = nullptr;
        const double f = sizeof(float);

        std::printf("\nencoder\n");
        {
            std::vector<int> inp(N);
            for (int& id : inp) id = static_cast<int>(rng.uniform() * static_cast<float>(V)) % V;
            const std::vector<float> wte = random_vector(static_cast<std::size_t>(V) * C, rng);
            const std::vector<float> wpe = random_vector(static_cast<std::size_t>(T) * C, rng);
            const std::vector<float> dout = random_vector(BTC, rng);
            std::vector<float> out(BTC), dwte(wte.size(), 0.0f), dwpe(wpe.size(), 0.0f);
            encoder_forward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
            encoder_backward(dwte.data(), dwpe.data(), dout.data(), inp.data(), B, T, C);
            Device<int> d_inp(inp);
            Device<float> d_wte(wte), d_wpe(wpe), d_out{std::vector<float>(BTC)}, d_dout(dout),
                d_dwte{std::vector<float>(wte.size())}, d_dwpe{std::vector<float>(wpe.size())};
            cuda::encoder_forward(d_out.ptr, d_inp.ptr, d_wte.ptr, d_wpe.ptr, B, T, C, stream);
            cuda::encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_dout.ptr, d_inp.ptr, B, T, C, V, stream);
            // Same additions in another order: a few ulps of the sums over B·T positions.
            validate("encoder_forward out", d_out.get(), out, 1e-6f);
            validate("encoder_backward dwte", d_dwte.get(), dwte, 1e-5f);
            validate("encoder_backward dwpe", d_dwpe.get(), dwpe, 1e-5f);
            time_it("encoder_forward", 3 * BTC * f, 0, [&] {
                cuda::encoder_forward(d_out.ptr, d_inp.ptr, d_wte.ptr, d_wpe.ptr, B, T, C, stream);
            });
            time_it("encoder_backward", 2 * BTC * f, 0, [&] {
                cuda::encoder_backward(d_dwte.ptr, d_dwpe.ptr, d_dout.ptr, d_inp.ptr, B, T, C, V,
                                       stream);
            });
        }

        std::printf("\nlayernorm\n");
        {
            const std::vector<float> inp = random_vector(BTC, rng), w = random_vector(C, rng),
                                     b = random_vector(C, rng), dout = random_vector(BTC, rng);
            std::vector<float> out(BTC), mean(N), rstd(N), dinp(BTC, 0.0f), dw(C, 0.0f),
                db(C, 0.0f);
            layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(),
                              B, T, C);
            layernorm_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(),
                               w.data(), mean.data(), rstd.data(), B, T, C);
            Device<float> d_inp(inp), d_w(w), d_b(b), d_dout(dout), d_out{std::vector<float>(BTC)},
                d_mean{std::vector<float>(N)}, d_rstd{std::vector<float>(N)},
                d_dinp{std::vector<float>(BTC)}, d_dw{std::vector<float>(C)},
                d_db{std::vector<float>(C)},
                d_scratch{std::vector<float>(2 * cuda::column_reduce_scratch(N, C))};
            cuda::layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_w.ptr, d_b.ptr,
                                    B, T, C, stream);
            cuda::layernorm_backward(d_dinp.ptr, d_dw.ptr, d_db.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr,
                                     d_mean.ptr, d_rstd.ptr, d_scratch.ptr, B, T, C, stream);
            // Sums over C = 384 channels (forward) and B·T rows (dweight): ~√K ulps.
            validate("layernorm_forward out", d_out.get(), out, 1e-5f);
            validate("layernorm_forward rstd", d_rstd.get(), rstd, 1e-5f);
            validate("layernorm_backward dinp", d_dinp.get(), dinp, 1e-4f);
            validate("layernorm_backward dweight", d_dw.get(), dw, 1e-4f);
            validate("layernorm_backward dbias", d_db.get(), db, 1e-4f);
            time_it("layernorm_forward", 2 * BTC * f, 0, [&] {
                cuda::layernorm_forward(d_out.ptr, d_mean.ptr, d_rstd.ptr, d_inp.ptr, d_w.ptr,
                                        d_b.ptr, B, T, C, stream);
            });
            time_it("layernorm_backward", 4 * BTC * f, 0, [&] {
                cuda::layernorm_backward(d_dinp.ptr, d_dw.ptr, d_db.ptr, d_dout.ptr, d_inp.ptr,
                                         d_w.ptr, d_mean.ptr, d_rstd.ptr, d_scratch.ptr, B, T, C,
                                         stream);
            });
        }

        std::printf("\nmatmul (c_fc: C -> 4C)\n");
        {
            const int OC = 4 * C;
            const std::vector<float> inp = random_vector(BTC, rng),
                                     w = random_vector(static_cast<std::size_t>(OC) * C, rng, 0.02f),
                                     b = random_vector(OC, rng, 0.02f),
                                     dout = random_vector(static_cast<std::size_t>(N) * OC, rng);
            std::vector<float> out(static_cast<std::size_t>(N) * OC), dinp(BTC, 0.0f),
                dw(w.size(), 0.0f), db(OC, 0.0f);
            matmul_forward(out.data(), inp.data(), w.data(), b.data(), N, C, OC);
            matmul_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), N,
                            C, OC);
            for (const bool tf32 : {false, true}) {
                cuda::Blas& blas = tf32 ? blas_tf32 : blas_fp32;
                // fp32: other summation orders over K ≤ B·T terms, ~√K·6e-8 relative;
                // TF32: inputs rounded to 10 mantissa bits, ~5e-4 per product.
                const float tol = tf32 ? 3e-2f : 1e-4f;
                Device<float> d_inp(inp), d_w(w), d_b(b), d_dout(dout),
                    d_out{std::vector<float>(out.size())}, d_dinp{std::vector<float>(BTC)},
                    d_dw{std::vector<float>(w.size())}, d_db{std::vector<float>(OC)},
                    d_scratch{std::vector<float>(cuda::column_reduce_scratch(N, OC))};
                cuda::matmul_forward(d_out.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, N, C, OC, blas, stream);
                cuda::matmul_backward(d_dinp.ptr, d_dw.ptr, d_db.ptr, d_dout.ptr, d_inp.ptr, d_w.ptr,
                                      d_scratch.ptr, N, C, OC, blas, stream);
                const std::string tag = tf32 ? " (TF32)" : " (fp32)";
                validate(("matmul_forward out" + tag).c_str(), d_out.get(), out, tol);
                validate(("matmul_backward dinp" + tag).c_str(), d_dinp.get(), dinp, tol);
                validate(("matmul_backward dweight" + tag).c_str(), d_dw.get(), dw, tol);
                validate(("matmul_backward dbias" + tag).c_str(), d_db.get(), db, 1e-4f);
                const double flops = 2.0 * N * C * OC;
                time_it(("matmul_forward" + tag).c_str(), 0, flops, [&] {
                    cuda::matmul_forward(d_out.ptr, d_inp.ptr, d_w.ptr, d_b.ptr, N, C, OC, blas,
                                         stream);
                });
                time_it(("matmul_backward" + tag).c_str(), 0, 2 * flops, [&] {
                    cuda::matmul_backward(d_dinp.ptr, d_dw.ptr, d_db.ptr, d_dout.ptr, d_inp.ptr,
                                          d_w.ptr, d_scratch.ptr, N, C, OC, blas, stream);
                });
            }
        }

        std::printf("\nattention (materialised, causal)\n");
        {
            const std::size_t TT = static_cast<std::size_t>(T) * T;
            const std::vector<float> qkv = random_vector(3 * BTC, rng), dout = random_vector(BTC, rng);
            std::vector<float> out(BTC), att(static_cast<std::size_t>(B) * NH * TT),
                dqkv(3 * BTC, 0.0f), scratch(att.size());  // (B, NH, T, T)
            attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, B, T, C, NH);
            attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(),
                               nullptr, 0.0f, B, T, C, NH);
            Device<float> d_qkv(qkv), d_dout(dout), d_out{std::vector<float>(BTC)},
                d_att{std::vector<float>(att.size())}, d_dqkv{std::vector<float>(3 * BTC)},
                d_q{std::vector<float>(BTC)}, d_k{std::vector<float>(BTC)},
                d_v{std::vector<float>(BTC)}, d_y{std::vector<float>(BTC)},
                d_scores{std::vector<float>(att.size())};
            const cuda::AttentionScratch s{d_q.ptr, d_k.ptr, d_v.ptr, d_y.ptr, d_scores.ptr};
            cuda::attention_forward(d_out.ptr, d_att.ptr, nullptr, d_qkv.ptr, 0.0f, 0, s, B, T, C,
                                    NH, blas_fp32, stream);
            cuda::attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_att.ptr, nullptr, 0.0f, s,
                                     B, T, C, NH, blas_fp32, stream);
            // fp32 products over hs = 64 and T = 256 terms and a softmax: ~1e-6 relative.
            validate("attention_forward att", d_att.get(), att, 1e-4f);
            validate("attention_forward out", d_out.get(), out, 1e-4f);
            validate("attention_backward dqkv", d_dqkv.get(), dqkv, 1e-4f);
            const double flops = 4.0 * B * NH * TT * (C / NH);  // two (T,T,hs) products
            time_it("attention_forward (fp32)", 0, flops, [&] {
                cuda::attention_forward(d_out.ptr, d_att.ptr, nullptr, d_qkv.ptr, 0.0f, 0, s, B, T,
                                        C, NH, blas_fp32, stream);
            });
            time_it("attention_backward (fp32)", 0, 2 * flops, [&] {
                cuda::attention_backward(d_dqkv.ptr, d_dout.ptr, d_qkv.ptr, d_att.ptr, nullptr,
                                         0.0f, s, B, T, C, NH, blas_fp32, stream);
            });
        }

        std::printf("\nGELU and residual (B·T·4C elements)\n");
        {
            const std::size_t n = 4 * BTC;
            const std::vector<float> inp = random_vector(n, rng), inp2 = random_vector(n, rng),
                                     dout = random_vector(n, rng);
            std::vector<float> out(n), dinp(n, 0.0f), sum(n);
            gelu_forward(out.data(), inp.data(), static_cast<int>(n));
            gelu_backward(dinp.data(), inp.data(), dout.data(), static_cast<int>(n));
            residual_forward(sum.data(), inp.data(), inp2.data(), static_cast<int>(n));
            Device<float> d_inp(inp), d_inp2(inp2), d_dout(dout), d_out{std::vector<float>(n)},
                d_dinp{std::vector<float>(n)}, d_sum{std::vector<float>(n)};
            cuda::gelu_forward(d_out.ptr, d_inp.ptr, n, stream);
            cuda::gelu_backward(d_dinp.ptr, d_inp.ptr, d_dout.ptr, n, stream);
            cuda::residual_forward(d_sum.ptr, d_inp.ptr, d_inp2.ptr, n, stream);
            // erff and expf are within 2 ulps of the correctly rounded value.
            validate("gelu_forward out", d_out.get(), out, 1e-6f);
            validate("gelu_backward dinp", d_dinp.get(), dinp, 1e-6f);
            validate("residual_forward out", d_sum.get(), sum, 0.0f);
            time_it("gelu_forward", 2 * n * f, 0,
                    [&] { cuda::gelu_forward(d_out.ptr, d_inp.ptr, n, stream); });
            time_it("gelu_backward", 3 * n * f, 0,
                    [&] { cuda::gelu_backward(d_dinp.ptr, d_inp.ptr, d_dout.ptr, n, stream); });
            time_it("residual_forward", 3 * n * f, 0,
                    [&] { cuda::residual_forward(d_sum.ptr, d_inp.ptr, d_inp2.ptr, n, stream); });
        }

        std::printf("\ncross-entropy\n");
        {
            const std::size_t n = static_cast<std::size_t>(N) * V;
            const std::vector<float> logits = random_vector(n, rng, 2.0f);
            std::vector<int> targets(N);
            for (int& t : targets) t = static_cast<int>(rng.uniform() * static_cast<float>(V)) % V;
            std::vector<float> probs(n), losses(N), dlogits(n, 0.0f);
            const float mean = crossentropy_forward(probs.data(), losses.data(), logits.data(),
                                                    targets.data(), B, T, V);
            crossentropy_backward(dlogits.data(), probs.data(), targets.data(), B, T, V);
            Device<float> d_logits(logits), d_probs{std::vector<float>(n)},
                d_losses{std::vector<float>(N)}, d_mean{std::vector<float>(1)},
                d_dlogits{std::vector<float>(n)};
            Device<int> d_targets(targets);
            cuda::crossentropy_forward(d_probs.ptr, d_losses.ptr, d_mean.ptr, d_logits.ptr,
                                       d_targets.ptr, B, T, V, stream);
            cuda::crossentropy_backward(d_dlogits.ptr, d_probs.ptr, d_targets.ptr, B, T, V, stream);
            // Sums over V = 65 exponentials: a few ulps.
            validate("crossentropy_forward probs", d_probs.get(), probs, 1e-5f);
            validate("crossentropy_forward losses", d_losses.get(), losses, 1e-5f);
            validate("crossentropy_forward mean", d_mean.get(), {mean}, 1e-5f);
            validate("crossentropy_backward dlogits", d_dlogits.get(), dlogits, 1e-5f);
            time_it("crossentropy_forward", 2 * n * f, 0, [&] {
                cuda::crossentropy_forward(d_probs.ptr, d_losses.ptr, d_mean.ptr, d_logits.ptr,
                                           d_targets.ptr, B, T, V, stream);
            });
            time_it("crossentropy_backward", 2 * n * f, 0, [&] {
                cuda::crossentropy_backward(d_dlogits.ptr, d_probs.ptr, d_targets.ptr, B, T, V,
                                            stream);
            });
        }

        std::printf("\nAdamW and clipping (the recipe's model: 6 layers, C = 384)\n");
        {
            GPTConfig cfg;
            GPT model(cfg, 1);
            std::vector<float>& grads = model.gradients();
            for (float& g : grads) g = 0.01f * rng.normal();
            GPT reference(cfg, 1);
            reference.gradients() = grads;
            const std::size_t n = grads.size();
            AdamW opt;
            const float cpu_norm = clip_grad_norm(reference, 1.0f);
            opt.step(reference, 1e-3f);
            Device<float> d_p(model.parameters()), d_g(grads), d_m{std::vector<float>(n)},
                d_v{std::vector<float>(n)}, d_norm{std::vector<float>(1)},
                d_scratch{std::vector<float>(cuda::clip_scratch_size())};
            cuda::clip_grad_norm(d_g.ptr, d_norm.ptr, d_scratch.ptr, n, 1.0f, stream);
            // One decay setting for the whole buffer here; the model splits it into runs.
            // Compare the decayed tensors only: wte's range is decayed in both.
            cuda::adamw_update(d_p.ptr, d_g.ptr, d_m.ptr, d_v.ptr, n, 1e-3f, opt.beta1, opt.beta2,
                               opt.eps, opt.weight_decay, 1, stream);
            const std::vector<float> p = d_p.get();
            const ParameterInfo& wte = model.parameter_table().front();
            std::vector<float> gpu_wte(p.begin() + static_cast<long>(wte.offset),
                                       p.begin() + static_cast<long>(wte.offset + wte.size));
            std::vector<float> cpu_wte(
                reference.parameters().begin() + static_cast<long>(wte.offset),
                reference.parameters().begin() + static_cast<long>(wte.offset + wte.size));
            // The norm is summed in double on both; the update is elementwise fp32.
            validate("clip_grad_norm norm", d_norm.get(), {cpu_norm}, 1e-6f);
            validate("adamw_update wte", gpu_wte, cpu_wte, 1e-5f);
            time_it("clip_grad_norm", 2 * n * f, 0, [&] {
                cuda::clip_grad_norm(d_g.ptr, d_norm.ptr, d_scratch.ptr, n, 1.0f, stream);
            });
            time_it("adamw_update", 7 * n * f, 0, [&] {
                cuda::adamw_update(d_p.ptr, d_g.ptr, d_m.ptr, d_v.ptr, n, 1e-3f, opt.beta1,
                                   opt.beta2, opt.eps, opt.weight_decay, 1, stream);
            });
        }

        CUDA_CHECK(cudaDeviceSynchronize());
        std::printf("\n%s\n", failures == 0 ? "every kernel agrees with the CPU reference"
                                            : "some kernels disagree with the CPU reference");
        return failures == 0 ? 0 : 1;
    } catch (const std::exception& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 1;
    }
}
