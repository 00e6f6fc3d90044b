// The GPU model against the CPU model on the same weights and batch: logits, loss, every
// gradient, AdamW steps, and a checkpoint written from the GPU that reloads with the same
// losses. Without a usable device it prints one line starting "skipped:" and CTest reports
// the test as skipped.
#define DOCTEST_CONFIG_IMPLEMENT
#include "attn/checkpoint.hpp"
#include "attn/cuda/buffer.hpp"
#include "attn/cuda/device.hpp"
#include "attn/cuda/gpt_ops.hpp"
#include "attn/cuda/gpt.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/random.hpp"

#include "attn/cuda/generate.hpp"
#include "attn/cuda/training_device.hpp"
#include "attn/kv_cache.hpp"
#include "attn/data.hpp"
#include "attn/trainer.hpp"
#include "../scratch.hpp"
#include "../mpi/step_bounds.hpp"  // gamma_of, sum_chains: the bounds of one training step

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace attn;

namespace {

// Small enough to run in a blink, large enough that every kernel takes more than one
// block or warp along each axis: T = 32 rows per head, C = 64 > 32 lanes, 4C = 256.
// Two layers over the 65-character vocabulary, NH heads, C channels, contexts up to T.
GPTConfig two_layers(int T, int NH, int C) {
    GPTConfig c;
    c.vocab_size = 65;
    c.block_size = T;
    c.n_layer = 2;
    c.n_head = NH;
    c.n_embd = C;
    return c;
}

GPTConfig small_config(bool bias) {
    GPTConfig c = two_layers(32, 4, 64);
    c.bias = bias;
    return c;
}
constexpr int B = 4, T = 32;

// A batch of B·T token ids and their next tokens, from a seeded source.
void make_batch(std::vector<int>& x, std::vector<int>& y, std::uint64_t seed, int V) {
    Rng rng(seed);
    x.resize(static_cast<std::size_t>(B) * T);
    y.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<int>(rng.uniform() * static_cast<float>(V)) % V;
        y[i] = static_cast<int>(rng.uniform() * static_cast<float>(V)) % V;
    }
}

// The largest |a − b| over a range, and the largest |b| (the scale a tolerance refers to).
struct Difference {
    float max_abs = 0.0f;
    float scale = 0.0f;
};
Difference compare(const float* a, const float* b, std::size_t n) {
    Difference d;
    for (std::size_t i = 0; i < n; ++i) {
        d.max_abs = std::max(d.max_abs, std::fabs(a[i] - b[i]));
        d.scale = std::max(d.scale, std::fabs(b[i]));
    }
    return d;
}

// The tolerances, relative to the largest magnitude of the tensor compared.
//
// fp32: the GPU sums in other orders than OpenBLAS and the CPU loops (cuBLAS's blocking,
// warp reductions) and uses CUDA's expf/erff (≤ 2 ulp). Each sum of K terms then differs
// by about √K·ε·max|term| with ε = 6e-8; the longest sums here are the weight gradients'
// over B·T = 128 rows and the 4C = 256-wide matmuls, so ≈ 16·6e-8 ≈ 1e-6 per layer, grown
// through 2 blocks and the backward pass to ~1e-5. 1e-4 leaves a factor 10 of headroom
// and is still 100 times below what a wrong index or a missed term would give.
//
// TF32: the matmul inputs are rounded to a 10-bit mantissa, relative error up to 2^-11 ≈ 5e-4
// per term. Independent errors over K random-sign terms grow like √K, as the sum does, so
// each product is off by about 5e-4 to 1e-3 of its result; compounded through two blocks
// and the backward pass (where some gradients are small differences of large terms),
// 3e-2 leaves a wide margin and is still far below what a wrong index gives.
struct Tolerance {
    float relative;
};
constexpr Tolerance fp32_tolerance{1e-4f};
constexpr Tolerance tf32_tolerance{3e-2f};

void check_close(const char* what, const float* gpu, const float* cpu, std::size_t n,
                 Tolerance tol) {
    const Difference d = compare(gpu, cpu, n);
    CAPTURE(what);
    CAPTURE(d.max_abs);
    CAPTURE(d.scale);
    CHECK(d.max_abs <= tol.relative * std::max(d.scale, 1e-6f));
}

// The logits of a bf16 forward pass, the GPU's against the CPU's, row by row. A logit is
// Σ_c lnf[c]·wte[v][c] over C bfloat16 inputs: the weights' copies are the same on both sides
// (the same float32 weights, rounded alike), and lnf is the CPU's rounded activation. Where
// the GPU's lnf row is the same, the two sums of C exact products differ by their order
// only: at most 2γ_C·S, S = Σ_c |lnf[c]·wte[v][c]| (Higham). Where a value of the row
// rounded one bfloat16 ulp apart on the two sides (float32 values a few ulp apart on either
// side of a rounding midpoint) the logit moves by up to 2^-7 of that term more: every row
// is within (2γ_C + 2^-7)·S. Returns how many rows are beyond 2γ_C·S: those where the
// GPU's lnf differs from the CPU's.
std::size_t check_bf16_logits(const GPT& cpu, cuda::CudaGPT& gpu) {
    const int V = cpu.config().vocab_size, C = cpu.config().n_embd;
    const std::vector<float>& lnf = cpu.activations().lnf;
    const std::vector<float>& ref = cpu.logits();
    const std::size_t rows = ref.size() / static_cast<std::size_t>(V);
    std::vector<float> logits;
    gpu.copy_logits_to(logits);
    REQUIRE(logits.size() == ref.size());
    const float* wte = cpu.params().wte;
    const double order = 2 * mpi_test::gamma_of(C);
    std::size_t flipped_rows = 0;
    double worst = 0.0;  // the largest gap over its row-wise bound
    for (std::size_t n = 0; n < rows; ++n) {
        bool flipped = false;
        for (int v = 0; v < V; ++v) {
            double S = 0.0;
            for (int c = 0; c < C; ++c) {
                const double w = round_to_precision(wte[static_cast<std::size_t>(v) * C + c], Precision::bf16);
                S += std::fabs(lnf[n * C + c] * w);
            }
            const double gap = std::fabs(double(logits[n * V + v]) - ref[n * V + v]);
            flipped = flipped || gap > order * S;
            worst = std::max(worst, gap / ((order + 0x1p-7) * S));
        }
        flipped_rows += flipped;
    }
    CAPTURE(rows);
    CAPTURE(worst);
    CHECK(worst <= 1.0);
    return flipped_rows;
}

}  // namespace

TEST_CASE("the GPU model's logits, loss and every gradient match the CPU model's") {
    for (const bool bias : {true, false}) {
        for (const bool tf32 : {false, true}) {
            CAPTURE(bias);
            CAPTURE(tf32);
            const Tolerance tol = tf32 ? tf32_tolerance : fp32_tolerance;
            GPT cpu(small_config(bias), 7);
            cuda::CudaOptions options;
            options.tf32 = tf32;
            cuda::CudaGPT gpu(cpu, options);
            std::vector<int> x, y;
            make_batch(x, y, 11, cpu.config().vocab_size);

            const float cpu_loss = cpu.forward(x.data(), y.data(), B, T);
            const float gpu_loss = gpu.forward(x.data(), y.data(), B, T);
            // The loss is a mean of 128 log-sum-exps of logits of size ~1; the same relative
            // tolerance as the logits, times the loss (≈ ln 65 ≈ 4.2).
            CHECK(std::fabs(gpu_loss - cpu_loss) <= tol.relative * cpu_loss);

            std::vector<float> logits;
            gpu.copy_logits_to(logits);
            REQUIRE(logits.size() == cpu.logits().size());
            check_close("logits", logits.data(), cpu.logits().data(), logits.size(), tol);

            cpu.zero_grad();
            cpu.backward();
            gpu.zero_grad();
            gpu.backward();
            std::vector<float> grads;
            gpu.copy_gradients_to(grads);
            REQUIRE(grads.size() == cpu.gradients().size());
            // Tensor by tensor, each against its own scale: a small tensor's error must not
            // hide behind a large tensor's magnitude.
            for (const ParameterInfo& info : cpu.parameter_table()) {
                check_close(info.name.c_str(), grads.data() + info.offset,
                            cpu.gradients().data() + info.offset, info.size, tol);
            }
        }
    }
}

TEST_CASE("in bf16 the GPU model rounds where the CPU model rounds: three steps' losses and gradients agree") {
    // Generated models and batches (sizes, heads, bias, seeds), three AdamW steps each, the
    // GPU starting every step from the CPU's weights: the GPU's bf16 path (bfloat16 copies,
    // cublasGemmEx) against the CPU's (GPT::set_precision) on the same state.
    //
    // The bound. The two sides compute the same function in other summation orders: in
    // float32 that is Higham's 2γ_n of the magnitudes, n the longest chain of sums of the
    // step (step_bounds.hpp: sum_chains, gamma_of). In bfloat16 the two sides round the same
    // tensors at the same points, and where their float32 values differ in the last bits
    // a rounding can land one bfloat16 ulp apart: at most 2^-7 of the value (an 8-bit
    // significand), on each of a product's two inputs, so 2^-6 of the product's terms, taken
    // once, to first order, on the quantity's magnitude (as step_bounds.hpp does for the MPI
    // runs in bfloat16). Magnitudes: the loss's own (a mean of positive terms), and for a
    // gradient the largest of its tensor. These bounds hold wherever the two sides round (a
    // rounding point missed moves a value by at most half an ulp, less than a flip): the
    // next test checks where they round.
    std::mt19937 gen(1805);
    for (int model = 0; model < 4; ++model) {
        const int NH = 1 << (gen() % 3), hs = 8 << (gen() % 2), Tm = 8 + static_cast<int>(gen() % 25);
        const int Bm = 1 + static_cast<int>(gen() % 4);
        GPTConfig config = two_layers(Tm, NH, NH * hs);
        config.bias = gen() % 2;
        const std::uint64_t seed = gen();
        CAPTURE(model);
        CAPTURE(NH);
        CAPTURE(hs);
        CAPTURE(Tm);
        CAPTURE(Bm);
        CAPTURE(config.bias);
        GPT cpu(config, seed);
        cpu.set_precision(Precision::bf16);
        cuda::CudaOptions options;
        options.precision = Precision::bf16;
        cuda::CudaGPT gpu(cpu, options);
        TrainConfig shape;  // the sizes sum_chains reads
        shape.n_layer = config.n_layer;
        shape.n_head = NH;
        shape.n_embd = config.n_embd;
        shape.block_size = Tm;
        shape.batch_size = Bm;
        const mpi_test::SumChains chains = mpi_test::sum_chains(shape, static_cast<std::size_t>(config.vocab_size));
        const double flip = 0x1p-6;
        AdamW opt;
        Rng rng(seed);
        for (int step = 0; step < 3; ++step) {
            CAPTURE(step);
            std::vector<int> x(static_cast<std::size_t>(Bm) * Tm), y(x.size());
            for (std::size_t i = 0; i < x.size(); ++i) {
                x[i] = static_cast<int>(rng.uniform() * 65.0f) % 65;
                y[i] = static_cast<int>(rng.uniform() * 65.0f) % 65;
            }
            gpu.copy_parameters_from(cpu);
            const double cpu_loss = cpu.forward(x.data(), y.data(), Bm, Tm);
            const double gpu_loss = gpu.forward(x.data(), y.data(), Bm, Tm);
            const double loss_bound = (2 * mpi_test::gamma_of(chains.forward) + flip + mpi_test::unit_roundoff) * cpu_loss;
            CAPTURE(cpu_loss);
            CAPTURE(gpu_loss);
            CHECK(std::fabs(gpu_loss - cpu_loss) <= loss_bound);
            (void)check_bf16_logits(cpu, gpu);
            cpu.zero_grad();
            cpu.backward();
            gpu.zero_grad();
            gpu.backward();
            std::vector<float> grads;
            gpu.copy_gradients_to(grads);
            REQUIRE(grads.size() == cpu.gradients().size());
            for (const ParameterInfo& info : cpu.parameter_table()) {
                const Difference d = compare(grads.data() + info.offset, cpu.gradients().data() + info.offset, info.size);
                const double bound = (2 * mpi_test::gamma_of(chains.backward) + flip) * d.scale;
                CAPTURE(info.name);
                CAPTURE(d.max_abs);
                CAPTURE(d.scale);
                CHECK(d.max_abs <= bound);
            }
            opt.step(cpu, 1e-3f);
        }
    }
}

TEST_CASE("in bf16 the GPU model's logits are the CPU's but for rare rounding flips, and a rounding point moved is seen") {
    // A flip (one value rounded one bfloat16 ulp apart on the two sides) needs float32 values
    // on either side of a rounding midpoint. The two sides' float32 values differ by an ulp or
    // two where they differ at all (sums in other orders; the device's expf, erff and rsqrtf
    // up to 2 ulp off; the residual stream's additions are the same), so a value flips with a
    // chance of about 2^-22 / 2^-8 = 2^-14, the midpoints being 2^-8 to 2^-7 of the value
    // apart. A flip may move the rows that read it (its sequence's later rows, through
    // attention). With short sequences (T ≤ 4) a sequence holds T·(10·C·L + C) ≤ 2 700 rounded
    // values (ln_1, q, k, v, the attention's output, ln_2, GELU's output, ln_f): about 0.16
    // flips, so fewer than a quarter of the rows can differ. A rounding point missed or added
    // (or a product taken in float32) moves every value after it by up to 2^-9 of itself,
    // a quarter of an ulp on average: a quarter of them flip, and with them nearly every row.
    std::mt19937 gen(2718);
    for (int model = 0; model < 6; ++model) {
        const int NH = 1 << (gen() % 2), hs = 8 << (gen() % 2), Tm = 2 + static_cast<int>(gen() % 3);
        const int Bm = 12 + static_cast<int>(gen() % 5);
        GPTConfig config = two_layers(Tm, NH, NH * hs);
        config.n_layer = 1 + static_cast<int>(gen() % 2);
        config.bias = gen() % 2;
        CAPTURE(model);
        CAPTURE(NH);
        CAPTURE(hs);
        CAPTURE(Tm);
        CAPTURE(Bm);
        CAPTURE(config.n_layer);
        GPT cpu(config, gen());
        cpu.set_precision(Precision::bf16);
        cuda::CudaOptions options;
        options.precision = Precision::bf16;
        cuda::CudaGPT gpu(cpu, options);
        std::vector<int> x(static_cast<std::size_t>(Bm) * Tm);
        for (int& t : x) t = static_cast<int>(gen() % 65);
        cpu.forward(x.data(), nullptr, Bm, Tm);
        gpu.forward(x.data(), nullptr, Bm, Tm);
        const std::size_t flipped = check_bf16_logits(cpu, gpu);
        CAPTURE(flipped);
        CHECK(4 * flipped <= x.size());
    }
}

TEST_CASE("the GPU model refuses fp16, TF32 with bf16, and cached decoding in bf16, in one sentence") {
    GPT cpu(small_config(true), 7);
    cuda::CudaOptions fp16;
    fp16.precision = Precision::fp16;
    CHECK(cuda::unsupported_on_gpu(cpu.config(), fp16).find("fp16 needs loss scaling") != std::string::npos);
    CHECK_THROWS_AS(cuda::CudaGPT(cpu, fp16), std::invalid_argument);
    cuda::CudaOptions both;
    both.precision = Precision::bf16;
    both.tf32 = true;
    CHECK(cuda::unsupported_on_gpu(cpu.config(), both).find("TF32 with bf16") != std::string::npos);
    cuda::CudaOptions bf16;
    bf16.precision = Precision::bf16;
    cuda::CudaGPT gpu(cpu, bf16);
    std::vector<float> logits;
    CHECK_THROWS_WITH_AS(gpu.decode_step(logits, 1, 0),
                         doctest::Contains("the cached decoding computes in float32"), std::invalid_argument);
}

TEST_CASE("gradient clipping follows one rule on the CPU and the GPU, edge cases included") {
    // Every kind of gradient (a norm above or below the limit, a NaN, an infinity, all zero)
    // against every kind of max_norm (below or above the norm, 0, negative, +inf, NaN). The
    // rule (attn::clip_grad_norm): scaled by max_norm / (norm + 1e-6) only when that is below
    // one, the norm finite and max_norm > 0; otherwise left exactly as they were.
    const float nan = std::nanf(""), inf = std::numeric_limits<float>::infinity();
    const std::vector<std::vector<float>> kinds = {
        {3, 4, 0}, {0.3f, 0.4f, 0}, {3, 4, nan}, {3, inf, 0}, {0, 0, 0}};
    const std::vector<float> limits = {1, 10, 0, -1, inf, nan};
    const auto same = [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); };
    // A non-blocking stream: download() must wait for it (the legacy stream's copy would not).
    cuda::Stream stream;
    for (const std::vector<float>& g : kinds) {
        for (float max_norm : limits) {
            CAPTURE(g[0]);
            CAPTURE(g[1]);
            CAPTURE(g[2]);
            CAPTURE(max_norm);
            std::vector<float> cpu = g;
            const float cpu_norm = clip_grad_norm(cpu, max_norm);
            const float coef = max_norm / (cpu_norm + 1e-6f);
            const bool scaled = max_norm > 0.0f && std::isfinite(cpu_norm) && coef < 1.0f;
            for (std::size_t i = 0; i < g.size(); ++i) CHECK(same(cpu[i], scaled ? g[i] * coef : g[i]));
            cuda::DeviceBuffer grads(g), norm(1), scratch(cuda::clip_scratch_size());
            cuda::clip_grad_norm(grads.data(), norm.data(), scratch.data(), g.size(), max_norm,
                                 stream.get());
            const std::vector<float> gpu = grads.download();
            CHECK(same(norm.download()[0], cpu_norm));
            for (std::size_t i = 0; i < g.size(); ++i) CHECK(same(gpu[i], cpu[i]));
        }
    }
}

TEST_CASE("the embedding backward reaches token ids past 65 535, as the CPU's does") {
    // A grid's y and z stop at 65 535 blocks: token ids must not run along them.
    const int B = 1, T = 4, C = 4, V = 70000;
    const std::vector<int> ids = {69999, 65535, 65536, 0};
    Rng rng(61);
    std::vector<float> dout(static_cast<std::size_t>(B) * T * C);
    for (float& x : dout) x = rng.normal();
    std::vector<float> cpu_dwte(static_cast<std::size_t>(V) * C, 0.0f), cpu_dwpe(static_cast<std::size_t>(T) * C, 0.0f);
    encoder_backward(cpu_dwte.data(), cpu_dwpe.data(), dout.data(), ids.data(), B, T, C);
    // The ids travel in a float buffer, bit for bit (DeviceBuffer holds floats).
    std::vector<float> id_bits(ids.size());
    std::memcpy(id_bits.data(), ids.data(), ids.size() * sizeof(int));
    cuda::DeviceBuffer dwte(cpu_dwte.size()), dwpe(cpu_dwpe.size()), d_dout(dout), d_ids(id_bits);
    dwte.zero();
    dwpe.zero();
    cuda::encoder_backward(dwte.data(), dwpe.data(), d_dout.data(),
                           reinterpret_cast<const int*>(d_ids.data()), B, T, C, V, nullptr);
    const std::vector<float> gpu_dwte = dwte.download();
    // One position per id: each row is dout's row exactly, on both.
    for (int t = 0; t < T; ++t) {
        CAPTURE(ids[t]);
        for (int c = 0; c < C; ++c) {
            const std::size_t at = static_cast<std::size_t>(ids[t]) * C + c;
            CHECK(cpu_dwte[at] == dout[static_cast<std::size_t>(t) * C + c]);
            CHECK(gpu_dwte[at] == cpu_dwte[at]);
        }
    }
    CHECK(gpu_dwte == cpu_dwte);
    CHECK(dwpe.download() == cpu_dwpe);
}

TEST_CASE("five AdamW steps with clipping on the GPU follow the CPU's losses and weights") {
    GPT cpu(small_config(true), 7);
    cuda::CudaGPT gpu(cpu);
    AdamW cpu_opt, gpu_opt;
    const float lr = 1e-3f;
    std::vector<int> x, y;
    for (int step = 0; step < 5; ++step) {
        CAPTURE(step);
        make_batch(x, y, 100 + step, cpu.config().vocab_size);
        const float cpu_loss = cpu.forward(x.data(), y.data(), B, T);
        cpu.zero_grad();
        cpu.backward();
        const float cpu_norm = clip_grad_norm(cpu, 1.0f);
        cpu_opt.step(cpu, lr);

        gpu.forward_async(x.data(), y.data(), B, T);
        gpu.zero_grad();
        gpu.backward();
        gpu.clip_grad_norm_async(1.0f);
        gpu.adamw_step(gpu_opt, lr);
        const float gpu_loss = gpu.loss();
        const float gpu_norm = gpu.grad_norm();
        // fp32 as above (1e-4 relative), on values of size ~4 (loss) and ~1 (norm).
        CHECK(std::fabs(gpu_loss - cpu_loss) <= 1e-4f * cpu_loss);
        CHECK(std::fabs(gpu_norm - cpu_norm) <= 1e-4f * cpu_norm);
    }
    CHECK(gpu_opt.step_count == cpu_opt.step_count);
    GPT from_gpu(small_config(true), 0);
    gpu.copy_parameters_to(from_gpu);
    // Adam moves each weight by about lr per step whatever the gradient's size, so a weight
    // whose gradient is as small as the rounding noise may move differently on the two
    // devices: at most 2·lr per step, 5 steps. Such weights must be rare; the rest agree to
    // the rounding of the updates (~1e-6 on weights of size ~0.02-1).
    const std::vector<float>& a = from_gpu.parameters();
    const std::vector<float>& b = cpu.parameters();
    std::size_t far = 0;
    float worst = 0.0f;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const float d = std::fabs(a[i] - b[i]);
        worst = std::max(worst, d);
        far += d > 1e-5f;
    }
    CAPTURE(far);
    CHECK(worst <= 2 * 5 * lr);
    CHECK(static_cast<double>(far) <= 1e-3 * static_cast<double>(a.size()));

    AdamW moments;
    gpu.copy_optimizer_to(moments);
    const Difference dm = compare(moments.m.data(), cpu_opt.m.data(), moments.m.size());
    CAPTURE(dm.max_abs);
    // m is a β₁-weighted sum of the five steps' gradients, which agree to ~1e-4 of their size
    // (fp32 as above: different summation orders through two blocks and the backward pass);
    // m inherits that relative error, and its largest entries (dm.scale) set the floor:
    // 1e-3 of the largest is 10× above. A wrong β₁ (0.99 for 0.9) makes m several times
    // smaller after five steps.
    CHECK(dm.max_abs <= 1e-3f * dm.scale);
}

TEST_CASE("a checkpoint written from the GPU model reloads with the same losses") {
    namespace fs = std::filesystem;
    GPT cpu(small_config(true), 21);
    cuda::CudaGPT gpu(cpu);
    AdamW opt;
    std::vector<int> x, y;
    for (int step = 0; step < 3; ++step) {
        make_batch(x, y, 200 + step, cpu.config().vocab_size);
        gpu.forward_async(x.data(), y.data(), B, T);
        gpu.zero_grad();
        gpu.backward();
        gpu.clip_grad_norm_async(1.0f);
        gpu.adamw_step(opt, 1e-3f);
    }
    // Save: parameters through the CPU model, into the same files the CPU trainer writes.
    const fs::path dir = attn_test::scratch("attn_gpu_checkpoint_test");
    fs::remove_all(dir);
    gpu.copy_parameters_to(cpu);
    save_checkpoint(dir, cpu, {"", 3});
    AdamW saved_opt = opt;
    gpu.copy_optimizer_to(saved_opt);

    GPT reloaded = load_checkpoint(dir);
    cuda::CudaGPT gpu2(reloaded);
    gpu2.copy_optimizer_from(saved_opt);
    AdamW opt2 = saved_opt;

    // On the default (materialised) attention path every kernel sums in a fixed order (no
    // atomics) and cuBLAS is deterministic on one stream, so the same weights and batches
    // give the same bits, step after step.
    for (int step = 0; step < 3; ++step) {
        CAPTURE(step);
        make_batch(x, y, 300 + step, cpu.config().vocab_size);
        const float loss1 = gpu.forward(x.data(), y.data(), B, T);
        const float loss2 = gpu2.forward(x.data(), y.data(), B, T);
        CHECK(loss1 == loss2);
        for (cuda::CudaGPT* g : {&gpu, &gpu2}) {
            g->zero_grad();
            g->backward();
            g->clip_grad_norm_async(1.0f);
        }
        gpu.adamw_step(opt, 1e-3f);
        gpu2.adamw_step(opt2, 1e-3f);
    }
    // And the CPU reads the GPU's checkpoint: its loss agrees to the fp32 tolerance.
    GPT on_cpu = load_checkpoint(dir);
    const float cpu_loss = on_cpu.forward(x.data(), y.data(), B, T);
    cuda::CudaGPT fresh(on_cpu);
    const float gpu_loss = fresh.forward(x.data(), y.data(), B, T);
    CHECK(std::fabs(gpu_loss - cpu_loss) <= 1e-4f * cpu_loss);
    fs::remove_all(dir);
}

TEST_CASE("the GPU model rejects token ids outside the vocabulary before touching the device") {
    GPT cpu(small_config(true), 7);
    cuda::CudaGPT gpu(cpu);
    std::vector<int> x(static_cast<std::size_t>(B) * T, 0), y = x;
    x[5] = 65;
    CHECK_THROWS_AS(gpu.forward(x.data(), y.data(), B, T), std::invalid_argument);
    CHECK_THROWS_AS(gpu.forward(y.data(), y.data(), B, T + 1), std::invalid_argument);
}

namespace {
// For the fused attention: head size 64 (what its kernels take), and T = 160 spans two
// whole 64-row tiles and a partial third, so the causal tile skipping, the diagonal tiles
// and the ragged edge all take part.
GPTConfig fused_config(float dropout) {
    GPTConfig c = two_layers(160, 2, 128);
    c.dropout = dropout;
    return c;
}
constexpr int fused_B = 2, fused_T = 160;

std::vector<int> random_tokens(std::size_t n, std::uint64_t seed, int V) {
    Rng rng(seed);
    std::vector<int> t(n);
    for (int& v : t) v = static_cast<int>(rng.uniform() * static_cast<float>(V)) % V;
    return t;
}

cuda::CudaOptions fused_options() {
    cuda::CudaOptions o;
    o.attention = cuda::AttentionKind::fused;
    return o;
}

// The logits, loss and every gradient of `cpu` and of its copy on the GPU, in `mode`
// (training: with dropout, both seeded alike), on one batch of random tokens drawn from
// `seed` (the next tokens from seed + 1).
void check_same_pass(GPT& cpu, const cuda::CudaOptions& options, int batch, int time,
                     bool training, std::uint64_t seed = 51) {
    cuda::CudaGPT gpu(cpu, options);
    const std::size_t n = static_cast<std::size_t>(batch) * time;
    const std::vector<int> x = random_tokens(n, seed, 65), y = random_tokens(n, seed + 1, 65);
    cpu.train(training);
    gpu.train(training);
    cpu.seed_dropout(77);
    gpu.seed_dropout(77);
    const float cpu_loss = cpu.forward(x.data(), y.data(), batch, time);
    const float gpu_loss = gpu.forward(x.data(), y.data(), batch, time);
    CHECK(std::fabs(gpu_loss - cpu_loss) <= fp32_tolerance.relative * cpu_loss);
    std::vector<float> logits, grads;
    gpu.copy_logits_to(logits);
    check_close("logits", logits.data(), cpu.logits().data(), logits.size(), fp32_tolerance);
    cpu.zero_grad();
    cpu.backward();
    gpu.zero_grad();
    gpu.backward();
    gpu.copy_gradients_to(grads);
    for (const ParameterInfo& info : cpu.parameter_table()) {
        check_close(info.name.c_str(), grads.data() + info.offset,
                    cpu.gradients().data() + info.offset, info.size, fp32_tolerance);
    }
}
}  // namespace

TEST_CASE("with the fused attention, the GPU model's logits, loss and gradients match the CPU's") {
    // The fused backward sums in another order than the CPU: fp32 rounding, inside the
    // same tolerance as the materialised path.
    GPT cpu(fused_config(0.0f), 7);
    check_same_pass(cpu, fused_options(), fused_B, fused_T, false, 21);
}

TEST_CASE("with dropout, the fused and materialised attention draw the same masks") {
    // Both paths hash (seed, element index) for each weight's mask, so from the same seed
    // they compute the same function: the losses and gradients agree to fp32 rounding.
    // A mismatched mask would change the loss by ~1e-2, far outside the tolerance.
    GPT cpu(fused_config(0.2f), 7);
    cuda::CudaGPT fused(cpu, fused_options());
    cuda::CudaGPT materialised(cpu);
    const std::size_t n = static_cast<std::size_t>(fused_B) * fused_T;
    const std::vector<int> x = random_tokens(n, 31, 65), y = random_tokens(n, 32, 65);
    std::vector<float> g_fused, g_mat;
    for (cuda::CudaGPT* gpu : {&fused, &materialised}) {
        gpu->train(true);
        gpu->seed_dropout(99);
    }
    const float loss_fused = fused.forward(x.data(), y.data(), fused_B, fused_T);
    const float loss_mat = materialised.forward(x.data(), y.data(), fused_B, fused_T);
    CHECK(std::fabs(loss_fused - loss_mat) <= fp32_tolerance.relative * loss_mat);
    for (cuda::CudaGPT* gpu : {&fused, &materialised}) {
        gpu->zero_grad();
        gpu->backward();
    }
    fused.copy_gradients_to(g_fused);
    materialised.copy_gradients_to(g_mat);
    for (const ParameterInfo& info : cpu.parameter_table()) {
        check_close(info.name.c_str(), g_fused.data() + info.offset, g_mat.data() + info.offset,
                    info.size, fp32_tolerance);
    }
    // And the masks do something: a second seed gives other gradients, by far more than
    // the tolerance the two paths agree within. (Not the loss: at initialisation the
    // predictions are near uniform, and a new mask moves the loss by only ~7e-4, inside
    // fp32_tolerance's 1e-4 · 4.2.)
    fused.seed_dropout(100);
    fused.forward(x.data(), y.data(), fused_B, fused_T);
    fused.zero_grad();
    fused.backward();
    std::vector<float> g_other;
    fused.copy_gradients_to(g_other);
    float change = 0.0f, scale = 0.0f;
    for (std::size_t i = 0; i < g_other.size(); ++i) {
        change = std::max(change, std::fabs(g_other[i] - g_fused[i]));
        scale = std::max(scale, std::fabs(g_fused[i]));
    }
    MESSAGE("gradient change with another dropout seed: " << change / scale << " of the largest");
    CHECK(change > 100.0f * fp32_tolerance.relative * scale);
}

TEST_CASE("without the causal mask or the attention scale, the GPU model is the CPU model") {
    // Either change moves the loss by ~1e-3 and the attention gradients by far more than
    // the tolerance, so a GPU that kept the mask or the scale fails here.
    for (const bool causal : {true, false}) {
        for (const bool scaled : {true, false}) {
            if (causal && scaled) continue;
            CAPTURE(causal);
            CAPTURE(scaled);
            GPTConfig c = small_config(true);
            c.causal = causal;
            c.scaled_attention = scaled;
            GPT cpu(c, 7);
            check_same_pass(cpu, {}, B, T, false);
        }
    }
    GPTConfig c = fused_config(0.0f);  // the fused kernels, not causal
    c.causal = false;
    GPT cpu(c, 7);
    check_same_pass(cpu, fused_options(), fused_B, fused_T, false);
}

TEST_CASE("with dropout, the GPU model drops the elements the CPU model drops") {
    // Both hash (seed, forward pass, site, element index): from the same seed the two
    // compute the same function. A mask drawn otherwise changes the gradients by ~1e-1 of
    // their scale (the last test case of the dropout pair above measures a new seed's).
    GPTConfig c = small_config(true);
    c.dropout = 0.2f;
    GPT with_dropout(c, 7);
    check_same_pass(with_dropout, {}, B, T, true);
    GPT fused_cpu(fused_config(0.2f), 7);  // the CPU trains it on the materialised attention
    check_same_pass(fused_cpu, fused_options(), fused_B, fused_T, true);
}

TEST_CASE("the GPU's key/value cache refuses what the CPU's refuses: no causal mask, no scale") {
    for (const char* which : {"no causal mask", "no scale"}) {
        CAPTURE(which);
        GPTConfig c = small_config(true);
        c.causal = std::string(which) != "no causal mask";
        c.scaled_attention = std::string(which) != "no scale";
        GPT cpu(c, 7);
        cuda::CudaGPT gpu(cpu);
        std::vector<float> logits;
        const int token = 3;
        CHECK_THROWS_AS(gpu.decode_step(logits, token, 0), std::invalid_argument);
        CHECK_THROWS_AS(gpu.prefill(logits, &token, 1), std::invalid_argument);
        KVCache cache(c);
        DecodeScratch scratch;
        CHECK_THROWS_AS(forward_cached(scratch, cpu, cache, token, 0), std::invalid_argument);
    }
}

TEST_CASE("the fused attention refuses a head size its kernels do not take, in one sentence") {
    GPT cpu(small_config(true), 7);  // head size 16
    CHECK_THROWS_WITH_AS(cuda::CudaGPT(cpu, fused_options()),
                         doctest::Contains("head size of 64 or 128"), std::invalid_argument);
}

namespace {
// A small corpus and the tiny recipe: seconds on a GPU.
TextDataset trainer_corpus() {
    std::string text;
    for (int i = 0; i < 400; ++i) text += "To be, or not to be, that is the question. ";
    return make_dataset(text);
}
}  // namespace

TEST_CASE("the trainer on the GPU follows the CPU trainer's losses") {
    TrainConfig config = TrainConfig::named("tiny");
    config.max_iters = 10;
    Trainer cpu(config, trainer_corpus());
    Trainer gpu(config, trainer_corpus());
    gpu.use_device(cuda::make_training_device(gpu.model()));
    for (int step = 0; step < 10; ++step) {
        CAPTURE(step);
        const StepRecord a = cpu.train_step(), b = gpu.train_step();
        // fp32 on both sides; the five-step test above bounds the drift after a few AdamW
        // steps at 1e-4 relative, and ten steps of the tiny model stay inside it.
        CHECK(b.loss == doctest::Approx(a.loss).epsilon(1e-4));
    }
    const EvalRecord ea = cpu.evaluate(), eb = gpu.evaluate();
    CHECK(eb.val_loss == doctest::Approx(ea.val_loss).epsilon(1e-4));
}

TEST_CASE("a GPU training run resumed from its checkpoint repeats the uninterrupted run bit for bit") {
    TrainConfig config = TrainConfig::named("tiny");
    config.max_iters = 20;
    config.dropout = 0.1f;  // the masks must follow the step, not the process
    const auto dir = attn_test::scratch("attn_gpu_resume");
    Trainer straight(config, trainer_corpus());
    straight.use_device(cuda::make_training_device(straight.model()));
    Trainer first(config, trainer_corpus());
    first.use_device(cuda::make_training_device(first.model()));
    std::vector<float> expected, got;
    for (int i = 0; i < 20; ++i) expected.push_back(straight.train_step().loss);
    for (int i = 0; i < 10; ++i) got.push_back(first.train_step().loss);
    first.save(dir);
    Trainer resumed = Trainer::load(dir, trainer_corpus());
    resumed.use_device(cuda::make_training_device(resumed.model()));
    for (int i = 0; i < 10; ++i) got.push_back(resumed.train_step().loss);
    // The kernels of the default (materialised) attention path use no atomics and reduce in a
    // fixed order, so the same inputs give the same bits.
    CHECK(got == expected);
    std::filesystem::remove_all(dir);
}

TEST_CASE("cached decoding on the GPU gives the CPU's cached logits, after a prefill too") {
    GPT cpu(small_config(true), 7);
    cuda::CudaGPT gpu(cpu);
    const std::vector<int> ids = random_tokens(T, 41, 65);
    KVCache cache(cpu.config());
    DecodeScratch scratch;
    std::vector<float> logits;
    for (int pos = 0; pos < T; ++pos) {
        CAPTURE(pos);
        const std::vector<float>& expected = forward_cached(scratch, cpu, cache, ids[pos], pos);
        gpu.decode_step(logits, ids[pos], pos);
        check_close("decode_step logits", logits.data(), expected.data(), expected.size(),
                    fp32_tolerance);
    }
    // A prefill of 20 positions, then steps from there: the CPU's prefill and steps.
    std::vector<float> cpu_logits;
    prefill(cpu_logits, cpu, cache, ids.data(), 20);
    gpu.prefill(logits, ids.data(), 20);
    check_close("prefill logits", logits.data(), cpu_logits.data(), cpu_logits.size(), fp32_tolerance);
    for (int pos = 20; pos < T; ++pos) {
        CAPTURE(pos);
        const std::vector<float>& expected = forward_cached(scratch, cpu, cache, ids[pos], pos);
        gpu.decode_step(logits, ids[pos], pos);
        check_close("decode_step logits after prefill", logits.data(), expected.data(),
                    expected.size(), fp32_tolerance);
    }
    // A position that skips ahead, one past the block, a token outside the vocabulary.
    CHECK_THROWS_AS(gpu.decode_step(logits, 0, 5), std::invalid_argument);
    CHECK_THROWS_AS(gpu.decode_step(logits, 0, T), std::invalid_argument);
    CHECK_THROWS_AS(gpu.decode_step(logits, 65, 0), std::invalid_argument);
}

TEST_CASE("greedy text on the GPU, cached and uncached, is the CPU's, past the block too") {
    // Greedy decoding (top-k 1) picks the largest logit: fp32 differences of ~1e-6 change
    // a token only at a near-tie, which this seeded model does not have in 80 tokens.
    const TextDataset data = trainer_corpus();
    GPTConfig cfg = small_config(true);
    cfg.vocab_size = static_cast<int>(data.vocab.size());
    GPT model(cfg, 3);
    cuda::CudaGPT device_model(model);
    SampleOptions options;
    options.max_new_tokens = 80;  // past block_size = 32: the context is cropped
    options.top_k = 1;
    const std::string expected = attn::generate_text(model, data.vocab, "To be", options);
    CHECK(cuda::generate_text(device_model, data.vocab, "To be", options, false) == expected);
    CHECK(cuda::generate_text(device_model, data.vocab, "To be", options, true) == expected);
}

int main(int argc, char** argv) {
    std::string why;
    if (!cuda::device_available(&why)) {
        std::printf("skipped: no usable CUDA device (%s)\n", why.c_str());
        return 0;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
