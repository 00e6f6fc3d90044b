// Lesson 13: fused attention. The page that narrates this program is lesson.md beside it.
// Timed: this program prints measured times, so CTest runs it with nothing beside it (RUN_SERIAL).
#include "attn/flash.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/plot.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"

#ifdef ATTN_HAVE_CUDA
#include "attn/cuda/attention.hpp"
#include "attn/cuda/buffer.hpp"
#include "attn/cuda/device.hpp"
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace attn;

namespace {

std::vector<float> normal_buffer(Rng& rng, std::size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = rng.normal();
    return x;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    }
    return worst;
}

// The fastest of `repeats` runs, in milliseconds (the fastest is the least disturbed).
double best_ms(const std::function<void()>& run, int repeats) {
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        run();
        const std::chrono::duration<double, std::milli> took =
            std::chrono::steady_clock::now() - start;
        best = std::min(best, took.count());
    }
    return best;
}

std::string mib(double bytes) {
    char buf[32];
    if (bytes < (1 << 20)) std::snprintf(buf, sizeof buf, "%7.1f KiB", bytes / 1024);
    else std::snprintf(buf, sizeof buf, "%7.1f MiB", bytes / (1 << 20));
    return buf;
}

void online_softmax_walkthrough() {
    print_heading("The online softmax, one tile of keys at a time");
    //! [walkthrough]
    // One query row: 12 scores (already scaled) and 12 values of size 2, in tiles of 4.
    const std::vector<float> scores = {0.5f, -1.0f, 2.0f, 0.0f, 3.5f, 1.0f,
                                       -0.5f, 0.2f, 1.5f, 4.0f, -2.0f, 0.8f};
    Rng rng(13);
    const std::vector<float> values = normal_buffer(rng, scores.size() * 2);  // (12, 2)
    float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
    float acc[2] = {0.0f, 0.0f};
    for (std::size_t j0 = 0; j0 < scores.size(); j0 += 4) {
        online_softmax_update(m, l, acc, &scores[j0], &values[j0 * 2], 4, 2);
        std::printf("after keys %2zu..%2zu: m = %.4f   l = %.6f   acc = [%9.6f, %9.6f]\n", j0,
                    j0 + 3, static_cast<double>(m), static_cast<double>(l),
                    static_cast<double>(acc[0]), static_cast<double>(acc[1]));
    }
    const float online[2] = {acc[0] / l, acc[1] / l};  // normalise once, at the end
    //! [walkthrough]

    // The plain way: the whole row's softmax first, then the weighted sum.
    const float row_max = *std::max_element(scores.begin(), scores.end());
    double sum = 0.0;
    for (float s : scores) sum += std::exp(s - row_max);
    float plain[2] = {0.0f, 0.0f};
    for (std::size_t j = 0; j < scores.size(); ++j) {
        const float p = static_cast<float>(std::exp(scores[j] - row_max) / sum);
        plain[0] += p * values[j * 2];
        plain[1] += p * values[j * 2 + 1];
    }
    std::printf("\nonline: acc / l          = [%9.6f, %9.6f]\n", static_cast<double>(online[0]),
                static_cast<double>(online[1]));
    std::printf("plain:  softmax(s) · V   = [%9.6f, %9.6f]\n", static_cast<double>(plain[0]),
                static_cast<double>(plain[1]));
    std::printf("m + ln l = %.6f,  ln Σ e^s = %.6f   (the log-sum-exp the backward pass keeps)\n",
                static_cast<double>(m + std::log(l)), row_max + std::log(sum));
}

void tiled_against_plain() {
    print_heading("Tiled attention against plain attention (B=2, NH=4, T=300, hs=64, causal)");
    //! [parity]
    const AttentionShape shape{2, 4, 300, 64, /*causal=*/true};
    Rng rng(1313);
    const auto q = normal_buffer(rng, shape.qkv_size()), k = normal_buffer(rng, shape.qkv_size()),
               v = normal_buffer(rng, shape.qkv_size());
    std::vector<float> out_plain(shape.qkv_size()), lse_plain(shape.rows());
    std::vector<float> out_tiled(shape.qkv_size()), lse_tiled(shape.rows());
    attention_plain_forward(out_plain.data(), lse_plain.data(), q.data(), k.data(), v.data(),
                            shape);
    attention_flash_forward(out_tiled.data(), lse_tiled.data(), q.data(), k.data(), v.data(),
                            shape, FlashBlocks{64, 64});  // 300 = 4·64 + 44: a partial tile
    //! [parity]
    std::printf("max |out_tiled - out_plain| = %.2e\n", max_abs_diff(out_tiled, out_plain));
    std::printf("max |lse_tiled - lse_plain| = %.2e\n", max_abs_diff(lse_tiled, lse_plain));

    //! [backward]
    const auto dout = normal_buffer(rng, shape.qkv_size());
    std::vector<float> dq(shape.qkv_size()), dk(shape.qkv_size()), dv(shape.qkv_size());
    std::vector<float> dq_plain(shape.qkv_size()), dk_plain(shape.qkv_size()),
        dv_plain(shape.qkv_size());
    attention_flash_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(),
                             v.data(), out_tiled.data(), lse_tiled.data(), shape);
    attention_plain_backward(dq_plain.data(), dk_plain.data(), dv_plain.data(), dout.data(),
                             q.data(), k.data(), v.data(), shape);
    //! [backward]
    std::printf("max |dq_tiled - dq_plain|   = %.2e\n", max_abs_diff(dq, dq_plain));
    std::printf("max |dk_tiled - dk_plain|   = %.2e\n", max_abs_diff(dk, dk_plain));
    std::printf("max |dv_tiled - dv_plain|   = %.2e\n", max_abs_diff(dv, dv_plain));

    // FlashAttention's bar: both against float64, the tiled error at most twice the plain one.
    const std::size_t n = shape.qkv_size();
    std::vector<double> out_ref(n);
    attention_reference_forward(out_ref.data(), nullptr, to_double(q.data(), n).data(),
                                to_double(k.data(), n).data(), to_double(v.data(), n).data(),
                                shape);
    const double e_plain = max_abs_error(out_plain.data(), out_ref.data(), n);
    const double e_tiled = max_abs_error(out_tiled.data(), out_ref.data(), n);
    std::printf("against float64: plain %.2e, tiled %.2e  → FlashAttention's rule %s\n", e_plain,
                e_tiled, passes_flash_rule(e_tiled, e_plain, max_abs(out_ref.data(), n))
                             ? "holds"
                             : "FAILS");
}

void causal_tiles(const LessonOptions& options) {
    print_heading("Which tiles a causal forward visits (T=512, tiles of 64)");
    const std::size_t T = 512, tile = 64, tiles = T / tile;
    // 1: every key visible, ½: the diagonal tile (masked inside), 0: skipped, never loaded.
    Tensor2 visited({tiles, tiles});
    std::size_t computed = 0;
    for (std::size_t i = 0; i < tiles; ++i) {
        for (std::size_t j = 0; j < tiles; ++j) {
            visited(i, j) = j < i ? 1.0f : j == i ? 0.5f : 0.0f;
            computed += j <= i;
        }
    }
    std::vector<std::string> rows, cols;
    for (std::size_t i = 0; i < tiles; ++i) {
        rows.push_back("q" + std::to_string(i * tile));
        cols.push_back(std::to_string(i));
    }
    std::printf("%s", heatmap_text(visited, rows, cols).c_str());
    std::printf("tiles computed: %zu of %zu (%.0f%%): (n+1)/(2n) for n = %zu tiles a side\n",
                computed, tiles * tiles, 100.0 * static_cast<double>(computed) / (tiles * tiles),
                tiles);
    if (!options.figures.empty()) {
        heatmap_png(options.figures / "lesson13_causal_tiles.png", visited, rows, cols,
                    "Causal tiles: 1 full, 0.5 diagonal, 0 skipped");
    }
}

void memory_and_traffic(const LessonOptions& options) {
    print_heading("Memory held for the scores, per head (hs=64, tiles 64×64)");
    const std::size_t hs = 64;
    const FlashBlocks blocks{64, 64};
    std::printf("%6s  %14s  %14s  %14s\n", "T", "plain: T×T", "tiled: tiles", "q, k, v, out");
    PlotSeries plain{"plain: T x T scores", {}, {}}, tiled{"tiled: one tile", {}, {}};
    for (std::size_t T = 256; T <= 16384; T *= 2) {
        //! [memory]
        const double plain_bytes = 4.0 * static_cast<double>(plain_score_floats(T));
        const double tiled_bytes = 4.0 * static_cast<double>(flash_working_floats(blocks, hs));
        const double io_bytes = 4.0 * 4.0 * static_cast<double>(T * hs);
        //! [memory]
        std::printf("%6zu  %s  %s  %s\n", T, mib(plain_bytes).c_str(), mib(tiled_bytes).c_str(),
                    mib(io_bytes).c_str());
        plain.x.push_back(static_cast<double>(T));
        plain.y.push_back(plain_bytes / (1 << 20));
        tiled.x.push_back(static_cast<double>(T));
        tiled.y.push_back(tiled_bytes / (1 << 20));
    }
    if (!options.figures.empty()) {
        line_plot_png(options.figures / "lesson13_memory.png", {plain, tiled},
                      "Memory for one head's scores", "T (tokens)", "MiB");
    }
    // The GPU recipe's training step (B = 64, NH = 6, T = 256, 6 layers): what the model
    // keeps per layer for the backward pass, the (B, NH, T) log-sum-exp of the fused
    // kernels against the (B, NH, T, T) weights of the materialised path.
    {
        const double B = 64, NH = 6, T = 256, L = 6, mib_size = 1 << 20;
        const double lse = 4 * B * NH * T * L / mib_size, weights = 4 * B * NH * T * T * L / mib_size;
        std::printf("\nthe GPU recipe (B = 64, 6 heads, T = 256, 6 layers) keeps %.2f MiB of log-sum-exp\n"
                    "with the fused kernels, against %.0f MiB of weights (and as much again for their\n"
                    "dropped copy) with the materialised ones\n", lse, weights);
        print_claim("recipe_lse_mib", lse, 2);
        print_claim("recipe_weights_mib", weights, 0);
    }

    print_heading("FLOPs and bytes of device memory per head, causal forward (hs=64)");
    std::printf("%6s  %10s  %12s  %12s  %10s  %10s\n", "T", "GFLOP", "plain bytes",
                "fused bytes", "plain F/B", "fused F/B");
    for (std::size_t T = 256; T <= 4096; T *= 2) {
        //! [traffic]
        const double t = static_cast<double>(T), d = static_cast<double>(hs);
        const double flops = 2.0 * t * t * d;  // 4·T²·hs for q kᵀ and P v, halved by the mask
        // plain: write S, read S, write P (softmax), read P (P v): four T×T passes of 4 bytes,
        // plus q, k, v read and out written once.
        const double plain_bytes = 4.0 * (4.0 * t * t + 4.0 * t * d);
        // fused: q read and out written once; each query tile reads the k, v tiles up to the
        // diagonal: on average half of k and v, T/64 times; one log-sum-exp per row.
        const double fused_bytes = 4.0 * (2.0 * t * d + (t / 64.0) * (t * d) + t);
        //! [traffic]
        std::printf("%6zu  %10.3f  %12s  %12s  %10.1f  %10.1f\n", T, flops / 1e9,
                    mib(plain_bytes).c_str(), mib(fused_bytes).c_str(), flops / plain_bytes,
                    flops / fused_bytes);
    }
}

// FlashAttention's IO bound and its tile sizes (Dao et al. 2022, Algorithm 1 and Theorem 2):
// with M floats of on-chip memory, B_c = ⌈M/4d⌉ keys and B_r = min(⌈M/4d⌉, d) queries per
// tile, and Θ(T²d²/M) floats moved from HBM against the standard Θ(Td + T²).
void io_bound() {
    print_heading("FlashAttention's IO bound and the tile size, for an H100's shared memory");
    //! [io]
    const double M = 227.0 * 1024 / 4;  // floats: the 227 KiB of shared memory a block may use (sm_90)
    std::printf("M = %.0f floats (227 KiB, float32)\n", M);
    std::printf("%4s  %10s  %10s  %6s  %16s  %16s  %8s\n", "d", "B_c", "B_r", "T", "standard Td + T²",
                "flash T²d²/M", "ratio");
    for (double d : {64.0, 128.0}) {
        const double bc = std::ceil(M / (4 * d)), br = std::min(bc, d);
        for (double T : {1024.0, 4096.0}) {
            const double standard = T * d + T * T, flash = T * T * d * d / M;
            std::printf("%4.0f  %10.0f  %10.0f  %6.0f  %16.3g  %16.3g  %8.1f\n", d, bc, br, T, standard,
                        flash, standard / flash);
            if (T == 4096.0) {
                const std::string k = d == 64.0 ? "d64" : "d128";
                print_claim("io_bc_" + k, bc, 0);
                print_claim("io_br_" + k, br, 0);
                print_claim("io_ratio_" + k, standard / flash, 1);
            }
        }
    }
    //! [io]
    print_claim("io_m_floats", M, 0);
}

void cpu_timings() {
    print_heading("Time of one forward pass on the CPU (B=1, NH=4, hs=64, causal)");
    const ThreadConfig threads = thread_config();
    std::printf("Wall clock, the best of 3 runs (fast: of 5). plain and tiled are the scalar loops\n"
                "above, on one thread; fast is the tiled algorithm with sgemm tile products and a\n"
                "vectorised softmax, on one thread (beside them) and on %d.\n",
                threads.threads);
    std::printf("%6s  %10s  %10s  %10s  %12s  %12s  %14s\n", "T", "plain ms", "tiled ms",
                "fast ms", "fast GFLOP/s", "plain / fast",
                ("fast ms, " + std::to_string(threads.threads) + " thr").c_str());
    for (std::size_t T : {256, 512, 1024, 2048}) {
        const AttentionShape shape{1, 4, T, 64, true};
        Rng rng(T);
        const auto q = normal_buffer(rng, shape.qkv_size()),
                   k = normal_buffer(rng, shape.qkv_size()),
                   v = normal_buffer(rng, shape.qkv_size());
        std::vector<float> out(shape.qkv_size()), lse(shape.rows());
        const bool scalar = T <= 1024;  // the scalar loops take seconds beyond
        const double plain = !scalar ? 0.0 : best_ms(
            [&] {
                attention_plain_forward(out.data(), nullptr, q.data(), k.data(), v.data(), shape);
            },
            3);
        const double tiled = !scalar ? 0.0 : best_ms(
            [&] {
                attention_flash_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), shape);
            },
            3);
        const auto fast_pass = [&] {
            //! [fast]
            attention_fast_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), shape);
            //! [fast]
        };
        const auto fast_ms = [&] { return best_ms(fast_pass, 5); };
        // one thread, as the scalar loops run; then the program's thread count again
        set_num_threads(1, "lesson 13: one thread beside the scalar loops");
        const double fast = fast_ms();
        set_num_threads(threads.threads, threads.threads_from);
        const double fast_all = fast_ms();
        // 2 products of 2·hs FLOPs per visible (query, key) pair, T(T+1)/2 pairs per head
        const double t = static_cast<double>(T), flops = 4.0 * 64 * 4 * (t * (t + 1) / 2);
        char plain_text[16] = "-", tiled_text[16] = "-", ratio_text[16] = "-";
        if (scalar) {
            std::snprintf(plain_text, sizeof plain_text, "%.2f", plain);
            std::snprintf(tiled_text, sizeof tiled_text, "%.2f", tiled);
            std::snprintf(ratio_text, sizeof ratio_text, "%.1fx", plain / fast);
        }
        std::printf("%6zu  %10s  %10s  %10.2f  %12.1f  %12s  %14.2f\n", T, plain_text, tiled_text,
                    fast, flops / (fast * 1e6), ratio_text, fast_all);
    }
    std::printf("(times vary from run to run and machine to machine: tools/bench/"
                "attention_cpu_bench.py\ntimes the fast one beside PyTorch in alternating rounds)\n");
}

#if defined(ATTN_HAVE_CUDA) && ATTN_CUDA_SIMULATED
// The two forward passes again, with the simulator counting what each launch reads, writes
// and computes; an H100's roofline bound and occupancy from those counts. A model, not a
// measurement: nothing here ran on a GPU.
void model_the_runs(const AttentionShape& shape, const std::function<void()>& plain,
                    const std::function<void()>& fused) {
    std::vector<roofline::Launch> launches[2];
    bool all_counted = true;
    for (int version = 0; version < 2; ++version) {
        cuda::count_work(true);
        (version == 0 ? plain : fused)();
        bool counted = true;
        launches[version] = cuda::take_counted_work(&counted);
        cuda::count_work(false);
        all_counted = all_counted && counted;
    }
    if (!all_counted) {
        std::printf("(the performance model needs the bytes each launch moves, which this build does not\n"
                    "count: the race check is on, or the sanitizer build's allocations are not whole pages)\n");
        return;
    }
    std::printf("\nWhat each launch moved and computed, counted by the simulator, and the least time an\n"
                "H100 SXM could take for it (H100 roofline bound, not a measurement):\n");
    std::printf("%-8s %-26s %3s %9s %9s %7s %9s %8s  %s\n", "version", "kernel or call", "n",
                "KiB read", "KiB writ.", "MFLOP", "bound µs", "limit", "blocks/SM (limit), registers");
    // The fused kernel's own arithmetic is C++ the simulator does not see: 4·hs operations
    // per visible (query, key) pair (q·k and p·v), T(T+1)/2 pairs per head.
    const double t = static_cast<double>(shape.T);
    const double fused_formula = 4.0 * static_cast<double>(shape.hs * shape.B * shape.NH) * t * (t + 1) / 2;
    double totals[2] = {0, 0}, bound_us[2] = {0, 0};
    const char* names[2] = {"plain", "fused"};
    for (int version = 0; version < 2; ++version) {
        for (roofline::Launch& l : launches[version]) {
            const bool library = l.name.rfind("cublas", 0) == 0;
            if (version == 1 && !library) l.fp32_flops += fused_formula;
            const roofline::Bound b = roofline::bound(l);
            char occupancy[64] = "-";
            if (!library) {
                const roofline::Occupancy o = roofline::occupancy(l);
                std::snprintf(occupancy, sizeof occupancy, "%d (%s), %s regs", o.blocks_per_sm,
                              o.limited_by.c_str(),
                              l.registers_per_thread > 0 ? std::to_string(l.registers_per_thread).c_str() : "?");
            }
            std::printf("%-8s %-26s %3zu %9.1f %9.1f %7.2f %9.3f %8s  %s\n", names[version],
                        l.name.c_str(), l.launches, l.bytes_read / 1024, l.bytes_written / 1024,
                        (l.fp32_flops + l.tf32_flops + l.f16_flops) / 1e6, b.seconds * 1e6,
                        b.limited_by(), occupancy);
            totals[version] += l.bytes_read + l.bytes_written;
            bound_us[version] += b.seconds * 1e6;
        }
    }
    std::printf("in all: plain moved %s and fused %s, %.1fx less; bounds %.2f µs and %.2f µs\n",
                mib(totals[0]).c_str(), mib(totals[1]).c_str(), totals[0] / totals[1], bound_us[0], bound_us[1]);
    std::printf("(each byte counted once per launch, as if every cache were large enough; the traffic\n"
                "table above counts k and v again for each query tile. The softmax kernel's and the\n"
                "fused kernel's own arithmetic are plain C++ here: the fused kernel's MFLOP come from\n"
                "the formula 4·hs·T(T+1)/2 per head, the softmax's are left out. Registers per thread\n"
                "are ptxas's for sm_90 where nvcc was there to report them, '?' where it was not.\n"
                "At this size any GPU's launch overhead, a few µs, is larger than these bounds.)\n");
    print_claim("sim_plain_over_fused_bytes", totals[0] / totals[1], 1);
}
#endif

void gpu_part() {
#if ATTN_CUDA_SIMULATED
    print_heading("On the GPU  [simulated on the CPU: results checked, no timing]");
#else
    print_heading("On the GPU");
#endif
#ifdef ATTN_HAVE_CUDA
    std::string why;
    if (!cuda::device_available(&why)) {
        std::printf("The GPU comparison needs a CUDA device (%s).\nIts numbers come from "
                    "build/tests/attention_bench and tools/cuda/attention_torch.py on one.\n",
                    why.c_str());
        return;
    }
#if ATTN_CUDA_SIMULATED
    // Built without a GPU: the kernels run in the CUDA simulator, on a shorter sequence.
    const char* tag = "  [simulated on the CPU: results checked, no timing]";
    const AttentionShape shape{1, 2, 192, 64, true};
#else
    const char* tag = "";
    std::printf("device: %s\n", cuda::device_summary().c_str());
    const AttentionShape shape{1, 8, 1024, 64, true};
#endif
    //! [gpu]
    Rng rng(7);
    const std::size_t n = shape.qkv_size();
    const auto q = normal_buffer(rng, n), k = normal_buffer(rng, n), v = normal_buffer(rng, n);
    cuda::DeviceBuffer d_q(q), d_k(k), d_v(v), d_out(n), lse(shape.rows());
    cuda::DeviceBuffer att(cuda::plain_attention_scratch_floats(shape));
    cuda::plain_attention_forward(d_out.data(), att.data(), d_q.data(), d_k.data(), d_v.data(), shape);
    const auto out_plain = d_out.download();
    cuda::flash_attention_forward(d_out.data(), lse.data(), d_q.data(), d_k.data(), d_v.data(), shape);
    const auto out_fused = d_out.download();
    //! [gpu]
    std::vector<double> out_ref(n);
    attention_reference_forward(out_ref.data(), nullptr, to_double(q.data(), n).data(),
                                to_double(k.data(), n).data(), to_double(v.data(), n).data(), shape);
    const double e_plain = max_abs_error(out_plain.data(), out_ref.data(), n);
    const double e_fused = max_abs_error(out_fused.data(), out_ref.data(), n);
    std::printf("B=%zu NH=%zu T=%zu hs=%zu causal, against float64: plain %.2e, fused %.2e → %s%s\n",
                shape.B, shape.NH, shape.T, shape.hs, e_plain, e_fused,
                passes_flash_rule(e_fused, e_plain, max_abs(out_ref.data(), n)) ? "rule holds"
                                                                                 : "rule FAILS",
                tag);
    std::printf("(plain held %s of scores for this; fused none. Timings: build/tests/attention_bench)%s\n",
                mib(4.0 * static_cast<double>(att.size())).c_str(), tag);
#if ATTN_CUDA_SIMULATED
    model_the_runs(shape, [&] {
        cuda::plain_attention_forward(d_out.data(), att.data(), d_q.data(), d_k.data(), d_v.data(), shape);
    }, [&] {
        cuda::flash_attention_forward(d_out.data(), lse.data(), d_q.data(), d_k.data(), d_v.data(), shape);
    });
#endif
#else
    std::printf("This build has no CUDA: the GPU part needs nvcc and a CUDA device. Its numbers\n"
                "come from build/tests/attention_bench and tools/cuda/attention_torch.py on one.\n");
#endif
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 13: fused attention", [](const LessonOptions& options) {
        online_softmax_walkthrough();
        tiled_against_plain();
        causal_tiles(options);
        memory_and_traffic(options);
        io_bound();
        cpu_timings();
        gpu_part();
    });
}
