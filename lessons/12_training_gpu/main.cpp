// Lesson 12: Training on the GPU. The page that narrates this program is lesson.md beside it.
//
// With the CUDA toolkit (ATTN_HAVE_CUDA) and a device, it compares the GPU model with the
// CPU model on the same weights and batch and trains briefly on the GPU. Built without a GPU
// (ATTN_CUDA_SIMULATED) the same GPU code runs in the CUDA simulator, every line saying so
// and no timing; without a device it says what the GPU part needs and shows the CPU side.
#include "attn/data.hpp"
#include "attn/gpt.hpp"
#include "attn/lesson.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"
#include "attn/roofline.hpp"

#if ATTN_HAVE_CUDA
#include "attn/cuda/device.hpp"
#include "attn/cuda/gpt.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace attn;

namespace {

// Which GPU op mirrors which CPU layer function, and the kernels behind it.
struct OpMapping {
    const char* cpu;      // gpt_layers.hpp
    const char* gpu;      // attn/cuda/gpt_ops.hpp
    const char* kernels;  // common/cuda/*.cu
};
//! [mapping]
const OpMapping mapping[] = {
    {"encoder_forward", "cuda::encoder_forward", "one thread per (b, t, c)"},
    {"encoder_backward", "cuda::encoder_backward", "one thread per (token, c), positions in order"},
    {"layernorm_forward", "cuda::layernorm_forward", "one warp per row, two passes"},
    {"layernorm_backward", "cuda::layernorm_backward", "warp per row + column sums in chunks"},
    {"matmul_forward", "cuda::matmul_forward", "cublasSgemm + bias kernel"},
    {"matmul_backward", "cuda::matmul_backward", "two cublasSgemm + column sums"},
    {"attention_forward", "cuda::attention_forward", "split heads, batched GEMM, warp softmax"},
    {"attention_backward", "cuda::attention_backward", "4 batched GEMMs, warp softmax backward"},
    {"gelu_forward/backward", "cuda::gelu_forward/backward", "element-wise, erff"},
    {"residual_forward", "cuda::residual_forward", "element-wise"},
    {"dropout_forward/backward", "cuda::dropout_forward/backward", "hash of (seed, index)"},
    {"crossentropy_forward", "cuda::crossentropy_forward", "one block per row + mean in double"},
    {"crossentropy_backward", "cuda::crossentropy_backward", "element-wise"},
    {"AdamW::step", "cuda::adamw_update", "element-wise, one launch per decay run"},
    {"clip_grad_norm", "cuda::clip_grad_norm", "Σg² in double, fixed order, then scale"},
};
//! [mapping]

void print_mapping() {
    print_heading("CPU layer functions and the GPU ops that mirror them");
    std::printf("%-26s %-30s %s\n", "CPU (gpt_layers.hpp)", "GPU (cuda/gpt_ops.hpp)", "kernels");
    for (const OpMapping& m : mapping) std::printf("%-26s %-30s %s\n", m.cpu, m.gpu, m.kernels);
}

// The comparison's model: small, so that the CPU side takes a blink.
GPTConfig small_config() {
    GPTConfig c;
    c.vocab_size = 65;
    c.block_size = 64;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 64;
    c.dropout = 0.0f;
    return c;
}
constexpr int B = 8, T = 64;

void random_batch(std::vector<int>& x, std::vector<int>& y, int V, std::uint64_t seed) {
    Rng rng(seed);
    x.resize(static_cast<std::size_t>(B) * T);
    y.resize(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<int>(rng.uniform() * static_cast<float>(V)) % V;
        y[i] = static_cast<int>(rng.uniform() * static_cast<float>(V)) % V;
    }
}

#if ATTN_HAVE_CUDA
// Without a GPU the lesson runs its GPU part in the CUDA simulator (common/cuda/sim): the
// results are checked as on a GPU, but its times say nothing about one, so none is printed.
#if ATTN_CUDA_SIMULATED
constexpr bool simulated = true;
#else
constexpr bool simulated = false;
#endif
const char* sim_tag() { return simulated ? "  [simulated on the CPU: results checked, no timing]" : ""; }

float max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
    float d = 0.0f;
    for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
    return d;
}

// GPU against CPU on the same weights and batch, in fp32 and with TF32 matmuls.
void compare_on_gpu(GPT& cpu, const std::vector<int>& x, const std::vector<int>& y) {
    print_heading(std::string("The same weights and batch on both devices") + sim_tag());
    const float cpu_loss = cpu.forward(x.data(), y.data(), B, T);
    cpu.zero_grad();
    cpu.backward();
    for (const bool tf32 : {false, true}) {
        //! [compare]
        cuda::CudaOptions options;
        options.tf32 = tf32;
        cuda::CudaGPT gpu(cpu, options);  // copies the config and the weights
        const float gpu_loss = gpu.forward(x.data(), y.data(), B, T);
        gpu.zero_grad();
        gpu.backward();
        std::vector<float> logits, grads;
        gpu.copy_logits_to(logits);
        gpu.copy_gradients_to(grads);
        //! [compare]
        std::printf("%s: loss CPU %.6f GPU %.6f | max |Δ| logits %.2e, gradients %.2e%s\n",
                    tf32 ? "TF32" : "fp32",
                    static_cast<double>(cpu_loss),
                    static_cast<double>(gpu_loss),
                    static_cast<double>(max_abs_difference(logits, cpu.logits())),
                    static_cast<double>(max_abs_difference(grads, cpu.gradients())), sim_tag());
    }
}

// A short run on a text written into the program, to watch the loss fall on the GPU.
void train_briefly_on_gpu() {
    print_heading(std::string("A short training run on the GPU") + sim_tag());
    std::string text;
    for (int i = 0; i < 60; ++i) {
        text += "The queen of hearts, she made some tarts, all on a summer's day; "
                "the knave of hearts, he stole the tarts, and took them clean away.\n";
    }
    const TextDataset data = make_dataset(text, 0.1, T + 1);
    GPTConfig cfg = small_config();
    cfg.vocab_size = static_cast<int>(data.vocab.size());
    GPT cpu(cfg, 1337);
    cuda::CudaGPT gpu(cpu);
    AdamW opt;
    Rng rng(7);
    std::vector<int> x, y;
    const auto start = std::chrono::steady_clock::now();
    const int last_step = simulated ? 20 : 200, report_every = simulated ? 5 : 50;
    //! [train]
    for (int step = 0; step <= last_step; ++step) {
        sample_batch(data.train, B, T, rng, x, y);
        gpu.forward_async(x.data(), y.data(), B, T);  // no wait
        gpu.zero_grad();
        gpu.backward();
        gpu.clip_grad_norm_async(1.0f);
        gpu.adamw_step(opt, 1e-3f);
        if (step % report_every == 0) {
            std::printf("step %3d  loss %.4f%s\n", step, static_cast<double>(gpu.loss()), sim_tag());
        }
    }
    //! [train]
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (simulated) {
        std::printf("%d steps of B=%d, T=%d%s\n", last_step + 1, B, T, sim_tag());
#if ATTN_CUDA_SIMULATED
        // One more step with the simulator counting each launch's bytes and operations.
        cuda::count_work(true);
        sample_batch(data.train, B, T, rng, x, y);
        gpu.forward_async(x.data(), y.data(), B, T);
        gpu.zero_grad();
        gpu.backward();
        gpu.clip_grad_norm_async(1.0f);
        gpu.adamw_step(opt, 1e-3f);
        bool counted = true;
        const auto launches = cuda::take_counted_work(&counted);
        cuda::count_work(false);
        if (counted) {
            std::printf("\nOne more step, its launches counted by the simulator (bytes each moves at the least;\n"
                        "operations of cuBLAS only, the kernels' own arithmetic is not seen), and the least\n"
                        "time an H100 SXM could take for each (H100 roofline bound, not a measurement):\n%s",
                        roofline::table(launches, 8).c_str());
            std::size_t n = 0;
            for (const auto& l : launches) n += l.launches;
            print_claim("sim_step_launches", static_cast<double>(n), 0);
        }
#endif
    } else {
        std::printf("%d steps of B=%d, T=%d in %.2f s on %s\n", last_step + 1, B, T, s,
                    cuda::device_summary().c_str());
    }
}
#endif

// Occupancy: how many blocks of a launch one H100 SM holds at once, by its per-SM limits
// (attn/roofline.hpp), for blocks of 256 threads as this lesson's softmax kernels use, with
// more and more shared memory or registers.
void print_occupancy() {
    print_heading("Occupancy: blocks of 256 threads on one H100 SM (its limits, not a measurement)");
    struct Case {
        const char* key;
        const char* what;
        std::size_t shared;
        int registers;
    };
    //! [occupancy]
    const Case cases[] = {
        {"plain", "no shared memory, 32 registers a thread", 0, 32},
        {"shared48", "48 KiB of shared memory a block", 48 * 1024, 32},
        {"regs128", "128 registers a thread", 0, 128},
    };
    //! [occupancy]
    std::printf("%-42s %10s %10s  %s\n", "block of 256 threads", "blocks/SM", "warps", "limited by");
    for (const Case& c : cases) {
        roofline::Launch l;
        l.threads_per_block = 256;
        l.shared_bytes = c.shared;
        l.registers_per_thread = c.registers;
        const roofline::Occupancy o = roofline::occupancy(l);
        std::printf("%-42s %10d %9.0f%%  %s\n", c.what, o.blocks_per_sm, 100 * o.warps_fraction,
                    o.limited_by.c_str());
        print_claim(std::string("occupancy_") + c.key + "_blocks", o.blocks_per_sm, 0);
        print_claim(std::string("occupancy_") + c.key + "_warps_pct", 100 * o.warps_fraction, 0);
    }
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 12: Training on the GPU", [](const LessonOptions&) {
        print_mapping();
        print_occupancy();

        GPT cpu(small_config(), 1337);
        std::vector<int> x, y;
        random_batch(x, y, cpu.config().vocab_size, 11);

#if ATTN_HAVE_CUDA
        std::string why;
        const bool have_device = cuda::device_available(&why);
#else
        const std::string why = "this build has no CUDA toolkit";
        const bool have_device = false;
#endif
        if (!have_device) {
            std::printf("\nThe GPU part needs a CUDA device (%s): build with nvcc and run "
                        "./workbook run 12 on a machine with an NVIDIA GPU.\n",
                        why.c_str());
            print_heading("The CPU side: the numbers the GPU is compared against");
            const float loss = cpu.forward(x.data(), y.data(), B, T);
            cpu.zero_grad();
            cpu.backward();
            double sum_sq = 0.0;
            for (float g : cpu.gradients()) sum_sq += static_cast<double>(g) * g;
            std::printf("model: %d layers, %d heads, C = %d, V = %d, %zu parameters; batch B=%d T=%d\n",
                        cpu.config().n_layer, cpu.config().n_head, cpu.config().n_embd,
                        cpu.config().vocab_size, cpu.parameters().size(), B, T);
            std::printf("loss %.6f (ln V = %.6f), gradient norm %.6f\n", static_cast<double>(loss),
                        std::log(static_cast<double>(cpu.config().vocab_size)), std::sqrt(sum_sq));
            return;
        }
#if ATTN_HAVE_CUDA
        compare_on_gpu(cpu, x, y);
        train_briefly_on_gpu();
#endif
    });
}
