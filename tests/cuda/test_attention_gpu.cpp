// Checks the GPU attention against the float64 CPU reference with FlashAttention's rule:
// the fused kernels' error is at most twice the plain CUDA version's, forward (out) and
// backward (dq, dk, dv); the fused log-sum-exp and the CPU tiled float32 version are
// compared too. Without a device it prints one line starting "skipped:" and CTest
// reports the test as skipped.
#include "attn/cuda/attention.hpp"
#include "attn/cuda/buffer.hpp"
#include "attn/cuda/device.hpp"
#include "attn/cuda/paged_attention.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/paged_cache.hpp"
#include "attn/flash.hpp"
#include "attn/random.hpp"
#include "attn/roofline.hpp"
#include "device_main.hpp"

#if ATTN_CUDA_SIMULATED
#include <cuda_runtime.h>  // the simulator's: its race-check switch
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

using namespace attn;
using attn::cuda::DeviceBuffer;

namespace {

std::vector<float> normal_buffer(Rng& rng, std::size_t n) {
    std::vector<float> x(n);
    for (auto& e : x) e = rng.normal();
    return x;
}

// One comparison line: the plain and fused errors against float64 and the verdict.
// `scale`: the size of the terms the result sums (the rule's rounding floor is relative to
// it); by default the result's own largest value.
bool report(const char* what, const std::vector<float>& plain, const std::vector<float>& fused,
            const std::vector<double>& ref, double scale = 0.0) {
    const std::size_t n = ref.size();
    const double plain_error = max_abs_error(plain.data(), ref.data(), n);
    const double fused_error = max_abs_error(fused.data(), ref.data(), n);
    // The plain version must itself be right, or the rule compares against a broken bar.
    // Against float64 (u = 2^-24, q, k, v, dout N(0, 1)): a score's hs-term sum (hs ≤ 128,
    // Σ|qk|/√hs ≈ 0.64·√128 ≈ 7.2) is within γ_128·7.2 ≈ 5.5e-5 at worst and √128 u·7.2 ≈
    // 4.9e-6 with random signs; with Σ_j p_j v_j (T ≤ 513, γ_513 ≈ 3e-5) and the backward's
    // dP = dO·v (Σ|dO v| ≈ 82, times scale 1/√hs in dq, dk) the worst case reaches ~1e-3,
    // the random-sign estimate ≲ 1.5e-5: 1e-4 rests on the latter, ≥ 6× above it.
    const bool ok = plain_error <= 1e-4 &&
                    passes_flash_rule(fused_error, plain_error,
                                      scale > 0.0 ? scale : max_abs(ref.data(), n));
    std::printf("    %-4s plain %.2e  fused %.2e  %s\n", what, plain_error, fused_error,
                ok ? "ok" : "FAILED");
    return ok;
}

bool check_case(const AttentionShape& s, std::uint64_t seed) {
    std::printf("B=%zu NH=%zu T=%zu hs=%zu %s\n", s.B, s.NH, s.T, s.hs,
                s.causal ? "causal" : "full");
    Rng rng(seed);
    const std::size_t n = s.qkv_size();
    const auto q = normal_buffer(rng, n), k = normal_buffer(rng, n), v = normal_buffer(rng, n),
               dout = normal_buffer(rng, n);

    // The float64 reference on the same float32 inputs.
    std::vector<double> out_ref(n), lse_ref(s.rows()), dq_ref(n), dk_ref(n), dv_ref(n);
    const auto q64 = to_double(q.data(), n), k64 = to_double(k.data(), n),
               v64 = to_double(v.data(), n), dout64 = to_double(dout.data(), n);
    attention_reference_forward(out_ref.data(), lse_ref.data(), q64.data(), k64.data(),
                                v64.data(), s);
    attention_reference_backward(dq_ref.data(), dk_ref.data(), dv_ref.data(), dout64.data(),
                                 q64.data(), k64.data(), v64.data(), s);

    DeviceBuffer d_q(q), d_k(k), d_v(v), d_dout(dout);
    DeviceBuffer d_out(n), d_dq(n), d_dk(n), d_dv(n);

    // Plain CUDA: the (B, NH, T, T) matrix in device memory.
    DeviceBuffer att(cuda::plain_attention_scratch_floats(s)), datt(att.size());
    cuda::plain_attention_forward(d_out.data(), att.data(), d_q.data(), d_k.data(), d_v.data(), s);
    cuda::plain_attention_backward(d_dq.data(), d_dk.data(), d_dv.data(), datt.data(),
                                   d_dout.data(), d_q.data(), d_k.data(), d_v.data(), att.data(), s);
    cuda::synchronize();
    const auto out_plain = d_out.download(), dq_plain = d_dq.download(),
               dk_plain = d_dk.download(), dv_plain = d_dv.download();

    // Fused. Poison the outputs first, so a value the kernels forget to write shows up.
    DeviceBuffer lse(s.rows()), delta(s.rows());
    for (DeviceBuffer* b : {&d_out, &d_dq, &d_dk, &d_dv, &lse}) {
        b->upload(std::vector<float>(b->size(), 1e30f));
    }
    cuda::flash_attention_forward(d_out.data(), lse.data(), d_q.data(), d_k.data(), d_v.data(), s);
    cuda::synchronize();
    const auto out_fused = d_out.download(), lse_fused = lse.download();
    bool ok = report("out", out_plain, out_fused, out_ref);

    // The backward on both schedules, each twice on poisoned outputs: every element is
    // written by one block in a fixed order (no atomics), so the second run gives the same
    // bits. dq and dk sum scale·dS·k and scale·dS·q, dS = P∘(dP − D): with one key (T = 1)
    // they are exactly 0, while dP and D (the same dot product dO·v summed in two orders)
    // differ by float32 rounding. Their rounding floor is relative to dv's size (dv = Pᵀ·dO,
    // the size of dP's terms), not to their own 0.
    const auto bits_equal = [](const std::vector<float>& a, const std::vector<float>& b) {
        return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    const double dv_scale = max_abs(dv_ref.data(), n);
    for (const auto schedule : {cuda::FlashBackwardSchedule::key_tiles, cuda::FlashBackwardSchedule::two_grids}) {
        std::vector<float> first[3];
        bool same_bits = true;
        for (int run = 0; run < 2; ++run) {
            for (DeviceBuffer* b : {&d_dq, &d_dk, &d_dv}) b->upload(std::vector<float>(b->size(), 1e30f));
            cuda::flash_attention_backward(d_dq.data(), d_dk.data(), d_dv.data(), delta.data(),
                                           d_dout.data(), d_q.data(), d_k.data(), d_v.data(),
                                           d_out.data(), lse.data(), s, nullptr, {}, schedule);
            cuda::synchronize();
            const std::vector<float> got[3] = {d_dq.download(), d_dk.download(), d_dv.download()};
            for (int g = 0; g < 3; ++g) {
                if (run == 0) first[g] = got[g];
                else same_bits &= bits_equal(got[g], first[g]);
            }
        }
        const cuda::FlashBackwardGrid grid = cuda::flash_backward_grid(s, schedule);
        if (schedule == cuda::FlashBackwardSchedule::key_tiles) {
            std::printf("    backward by key tiles, %u launch%s of %u block%s; a second run %s\n",
                        grid.key_tiles, grid.key_tiles == 1 ? "" : "es", grid.heads,
                        grid.heads == 1 ? "" : "s", same_bits ? "gives the same bits" : "DIFFERS");
        } else {
            std::printf("    backward on two grids, %u x %u blocks for dK, dV and %u x %u for dQ; "
                        "a second run %s\n", grid.key_tiles, grid.heads, grid.query_tiles,
                        grid.heads, same_bits ? "gives the same bits" : "DIFFERS");
        }
        ok &= same_bits;
        ok &= report("dq", dq_plain, first[0], dq_ref, std::max(max_abs(dq_ref.data(), n), dv_scale));
        ok &= report("dk", dk_plain, first[1], dk_ref, std::max(max_abs(dk_ref.data(), n), dv_scale));
        ok &= report("dv", dv_plain, first[2], dv_ref);
    }

    // With dropout the two schedules regenerate the same masks: their gradients agree to
    // float32 rounding (the key-tile schedule's masks are those of the materialised path:
    // tests/cuda/test_gpt_gpu.cpp). A mask drawn with the wrong index in one of them would
    // move whole terms, by ~|dS·k| ≈ 0.1, far above 1e-5.
    {
        const cuda::AttentionDropout dropout{0.2f, 1234};
        cuda::flash_attention_forward(d_out.data(), lse.data(), d_q.data(), d_k.data(), d_v.data(), s,
                                      nullptr, dropout);
        std::vector<float> by[2][3];
        int i = 0;
        for (const auto schedule : {cuda::FlashBackwardSchedule::key_tiles, cuda::FlashBackwardSchedule::two_grids}) {
            cuda::flash_attention_backward(d_dq.data(), d_dk.data(), d_dv.data(), delta.data(),
                                           d_dout.data(), d_q.data(), d_k.data(), d_v.data(),
                                           d_out.data(), lse.data(), s, nullptr, dropout, schedule);
            cuda::synchronize();
            by[i][0] = d_dq.download(), by[i][1] = d_dk.download(), by[i][2] = d_dv.download();
            ++i;
        }
        double worst = 0.0;
        for (int g = 0; g < 3; ++g) {
            worst = std::max(worst, max_abs_error(by[1][g].data(), to_double(by[0][g].data(), n).data(), n));
        }
        const bool drop_ok = worst <= 1e-5;
        std::printf("    dropout 0.2: two grids against key tiles, gradients %.2e (bar 1e-5)  %s\n",
                    worst, drop_ok ? "ok" : "FAILED");
        ok &= drop_ok;
    }

    // lse = m + ln Σ_j e^(s_j − m) ≈ ln T + O(1) ≤ 10 moves by Σ p_j Δs_j ≤ max|Δs| (scores
    // as above: γ_128·7.2 ≈ 5.5e-5 worst, √128 u·7.2 ≈ 4.9e-6 random-sign), plus the T-term
    // sum's γ_513 ≈ 3e-5 worst / √513 u ≈ 1.4e-6 and ½ulp(10) ≈ 4.8e-7 (u = 2^-24): worst
    // ≈ 8.6e-5, random-sign ≈ 5.2e-6 at hs = 128 (2.4e-6 + … at 64). 1e-5 rests on it, 2×.
    const double lse_error = max_abs_error(lse_fused.data(), lse_ref.data(), s.rows());
    const bool lse_ok = lse_error <= 1e-5;
    std::printf("    lse  fused %.2e (bar 1e-5)  %s\n", lse_error, lse_ok ? "ok" : "FAILED");

    // The same algorithm on the CPU in float32 (tiles of 64, as on the GPU): the two differ
    // only in the order of float32 additions (the scores' hs-term dots, the T-term sums):
    // two orders of those differ by 2γ_n Σ|terms|, ~1e-4 at worst as above, and with random
    // signs by ≈ √2·(4.9e-6·√Σp²·|v − out| + √T u) ≲ 3e-6 for outputs of size ≲ 1:
    // 1e-5 rests on that estimate, ~3× above it.
    std::vector<float> out_cpu(n), lse_cpu(s.rows());
    attention_flash_forward(out_cpu.data(), lse_cpu.data(), q.data(), k.data(), v.data(), s);
    const double cpu_error = max_abs_error(out_fused.data(), to_double(out_cpu.data(), n).data(), n);
    const bool cpu_ok = cpu_error <= 1e-5;
    std::printf("    out  fused vs CPU tiled float32 %.2e (bar 1e-5)  %s\n", cpu_error,
                cpu_ok ? "ok" : "FAILED");
    return ok && lse_ok && cpu_ok;
}

}  // namespace

// Lesson 20's paged decode attention: five sequences in one pool (one a fork that shares its
// parent's blocks and copied the last on write), each query over its own block table, on
// the device and on the CPU (paged_attention_step), both against float64 from the same rows.
// Block sizes 1, 3, 4 and 16, grouped heads, a window and ALiBi.
bool check_paged() {
    struct Case { int NH, G, hs, Bt, window; bool alibi; };
    const Case cases[] = {{4, 4, 32, 16, 0, false}, {4, 2, 64, 3, 0, true}, {2, 1, 16, 1, 5, false},
                          {3, 3, 33, 4, 7, true}};
    bool all = true;
    for (const Case& c : cases) {
        const int C = c.NH * c.hs, blocks = 80;
        Rng rng(static_cast<std::uint64_t>(31 * c.Bt + c.hs));
        PagedKVCache cache(1, c.NH, C, c.G, blocks, c.Bt);
        std::vector<float> k(static_cast<std::size_t>(c.G * c.hs)), v(k.size());
        auto append = [&](int seq) {
            for (float& x : k) x = 2.0f * rng.normal();
            for (float& x : v) x = rng.normal();
            cache.write(0, cache.append_slot(seq), k.data(), v.data());
        };
        std::vector<int> seqs;
        for (const int length : {1, 17, 40, 9}) {
            seqs.push_back(cache.add_sequence());
            for (int t = 0; t < length; ++t) append(seqs.back());
        }
        seqs.push_back(cache.fork(seqs[2]));  // shares 40 positions' blocks, then 3 of its own
        for (int t = 0; t < 3; ++t) append(seqs.back());
        const int S = static_cast<int>(seqs.size());
        const std::vector<float> q = normal_buffer(rng, static_cast<std::size_t>(S) * C);
        const std::vector<float> slopes = alibi_slopes(c.NH);

        cuda::PagedBatch batch;
        batch.max_blocks = blocks;
        std::vector<float> cpu(static_cast<std::size_t>(S) * C), att(static_cast<std::size_t>(c.NH) * 64);
        std::vector<double> ref(cpu.size());
        for (int s = 0; s < S; ++s) {
            const int seq = seqs[static_cast<std::size_t>(s)], pos = cache.length(seq) - 1;
            const int first = c.window > 0 ? std::max(0, pos + 1 - c.window) : 0;
            std::vector<int> row(static_cast<std::size_t>(blocks), 0);
            std::copy(cache.block_table(seq).begin(), cache.block_table(seq).end(), row.begin());
            batch.tables.insert(batch.tables.end(), row.begin(), row.end());
            batch.first.push_back(first);
            batch.pos.push_back(pos);
            paged_attention_step(&cpu[static_cast<std::size_t>(s) * C], att.data(), &q[static_cast<std::size_t>(s) * C],
                                 cache, 0, seq, pos, first, c.alibi ? slopes.data() : nullptr);
            for (int h = 0; h < c.NH; ++h) {  // float64 from the cache's rows, found by slot_of
                const int g = h / (c.NH / c.G), T = pos - first + 1;
                std::vector<double> w(static_cast<std::size_t>(T));
                double largest = -1e300, sum = 0.0;
                for (int j = 0; j < T; ++j) {
                    const BlockSlot sl = slot_of(cache.block_table(seq), first + j, c.Bt);
                    const float* kr = cache.keys(0, sl.block, g) + static_cast<std::size_t>(sl.offset) * c.hs;
                    double dot = 0.0;
                    for (int d = 0; d < c.hs; ++d) dot += double(q[static_cast<std::size_t>(s) * C + h * c.hs + d]) * kr[d];
                    w[static_cast<std::size_t>(j)] = dot / std::sqrt(double(c.hs)) + (c.alibi ? double(slopes[h]) * (j - (T - 1)) : 0.0);
                    largest = std::max(largest, w[static_cast<std::size_t>(j)]);
                }
                for (double& x : w) sum += (x = std::exp(x - largest));
                for (int d = 0; d < c.hs; ++d) {
                    double y = 0.0;
                    for (int j = 0; j < T; ++j) {
                        const BlockSlot sl = slot_of(cache.block_table(seq), first + j, c.Bt);
                        y += w[static_cast<std::size_t>(j)] / sum * cache.values(0, sl.block, g)[static_cast<std::size_t>(sl.offset) * c.hs + d];
                    }
                    ref[static_cast<std::size_t>(s) * C + h * c.hs + d] = y;
                }
            }
        }
        const std::size_t pool = static_cast<std::size_t>(blocks) * c.G * c.Bt * c.hs;
        DeviceBuffer d_keys(std::vector<float>(cache.keys(0, 0, 0), cache.keys(0, 0, 0) + pool));
        DeviceBuffer d_values(std::vector<float>(cache.values(0, 0, 0), cache.values(0, 0, 0) + pool));
        DeviceBuffer d_q(q), d_out(cpu.size()), d_slopes(slopes);
        cuda::paged_attention_forward(d_out.data(), d_q.data(), C, d_keys.data(), d_values.data(), batch,
                                      blocks, c.Bt, C, c.NH, c.G, c.alibi ? d_slopes.data() : nullptr, nullptr);
        const std::vector<float> gpu = d_out.download();
        // Against float64 (u = 2^-24; q, k ~ N(0, 4), v ~ N(0, 1), hs ≤ 64, T ≤ 43): as the CPU
        // step's test in test_kv_cache.cpp derives, a score is within γ_64·20 ≈ 7.8e-5 at worst
        // and ≈ 1e-5 with random signs, a weight moves by half that, an output by ≲ 2e-5 more
        // at most T·u·max|v| ≈ 1e-5; 2e-5 rests on the random-sign estimate. The device's
        // fmaf sums and expf (≤ 2 ulp) stay inside the same bound. A row read through the
        // wrong block, a dropped last row or the wrong group moves the outputs by O(0.1).
        const double gpu_error = max_abs_error(gpu.data(), ref.data(), ref.size());
        const double cpu_error = max_abs_error(cpu.data(), ref.data(), ref.size());
        const bool ok = gpu_error < 2e-5 && cpu_error < 2e-5;
        std::printf("paged NH=%d G=%d hs=%d Bt=%d window=%d %s: device %.2e  cpu %.2e against float64  %s\n",
                    c.NH, c.G, c.hs, c.Bt, c.window, c.alibi ? "alibi" : "", gpu_error, cpu_error,
                    ok ? "ok" : "FAILED");
        all = all && ok;
    }
    // bad batches are refused before any launch
    cuda::PagedBatch bad;
    bad.max_blocks = 1;
    bad.tables = {5};
    bad.first = {0};
    bad.pos = {0};
    DeviceBuffer d(16);
    try {
        cuda::paged_attention_forward(d.data(), d.data(), 4, d.data(), d.data(), bad, 2, 4, 4, 1, 1, nullptr, nullptr);
        std::printf("paged: a table entry outside the pool was accepted  FAILED\n");
        all = false;
    } catch (const std::invalid_argument& e) {
        std::printf("paged: a table entry outside the pool is refused: %s\n", e.what());
    }
    return all;
}

#if ATTN_CUDA_SIMULATED
// The performance model's formula for a forward pass (roofline::attention_forward_model)
// against what the simulator counts when the kernels run: the bytes of every version and
// shape, and cuBLAS's operations (a kernel's own arithmetic is not counted: the fused
// kernel's is the formula's alone). Each head's slice of every buffer is whole pages here,
// so the page-by-page count is exact.
bool check_model() {
    bool all = true;
    for (const bool causal : {true, false}) {
        for (const AttentionShape s : {AttentionShape{1, 2, 128, 64, causal}, AttentionShape{2, 1, 64, 128, causal}}) {
            Rng rng(5);
            const std::size_t n = s.qkv_size();
            DeviceBuffer q(normal_buffer(rng, n)), k(normal_buffer(rng, n)), v(normal_buffer(rng, n)), out(n),
                lse(s.rows()), att(cuda::plain_attention_scratch_floats(s));
            for (const bool fused : {false, true}) {
                const bool racecheck = cuda_sim::racecheck();
                cuda_sim::set_racecheck(false);
                cuda::count_work(true);
                if (fused) cuda::flash_attention_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), s);
                else cuda::plain_attention_forward(out.data(), att.data(), q.data(), k.data(), v.data(), s);
                bool counted = true;
                const auto launches = cuda::take_counted_work(&counted);
                cuda::count_work(false);
                cuda_sim::set_racecheck(racecheck);
                double read = 0, written = 0, flops = 0, model_read = 0, model_written = 0, model_flops = 0;
                for (const auto& l : launches) {
                    read += l.bytes_read;
                    written += l.bytes_written;
                    flops += l.fp32_flops;
                }
                for (const auto& l : roofline::attention_forward_model(s, fused)) {
                    model_read += l.bytes_read;
                    model_written += l.bytes_written;
                    if (!fused) model_flops += l.fp32_flops;
                }
                if (!counted) {  // the race check is off here: only the sanitizer build counts no bytes
                    std::printf("model: skipped, this build does not count bytes (AddressSanitizer's "
                                "allocations are not whole pages)\n");
                    return true;
                }
                const bool ok = read == model_read && written == model_written && flops == model_flops;
                std::printf("model %s T=%zu hs=%zu %s: counted %.0f read, %.0f written, %.0f operations; formula "
                            "%.0f, %.0f, %.0f  %s\n", fused ? "fused" : "plain", s.T, s.hs,
                            causal ? "causal" : "full", read, written, flops, model_read, model_written,
                            model_flops, ok ? "ok" : "FAILED");
                all = all && ok;
            }
        }
    }
    return all;
}
#endif

// `paged` as the only argument runs the paged decode attention alone (ctest -L serving).
int main(int argc, char** argv) {
    const bool paged_only = argc == 2 && std::string(argv[1]) == "paged";
    return run_on_device([paged_only] {
        if (paged_only) return check_paged() ? 0 : 1;
        // T below, at, and not a multiple of the 64-row tile; both head sizes; causal and not.
        const AttentionShape cases[] = {
            {2, 3, 1, 64, true},    {2, 3, 63, 64, true},   {2, 3, 64, 64, false},
            {1, 4, 200, 64, true},  {1, 4, 200, 64, false}, {1, 2, 513, 64, true},
            {2, 2, 130, 128, true}, {1, 2, 130, 128, false}, {1, 1, 257, 128, true},
        };
        int failed = 0, seed = 100;
        for (const AttentionShape& s : cases) failed += check_case(s, seed++) ? 0 : 1;
        failed += check_paged() ? 0 : 1;  // and lesson 20's paged decode attention
#if ATTN_CUDA_SIMULATED
        failed += check_model() ? 0 : 1;  // the performance model's counts
#endif
        if (failed) {
            std::printf("%d of %zu cases FAILED\n", failed, std::size(cases));
            return 1;
        }
        std::printf("all %zu cases pass FlashAttention's rule\n", std::size(cases));
        return 0;
    });
}
