// The performance model (attn/roofline.hpp) against hand computation: the roofline's two
// limits from the H100 SXM's published rates, and occupancy by the CUDA Occupancy
// Calculator's rules (warps, blocks, registers in 256-register units per warp, shared
// memory in 128-byte units plus 1 KiB a block), worked out below for each case.
#include "attn/roofline.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using attn::roofline::bound;
using attn::roofline::h100_sxm;
using attn::roofline::Launch;
using attn::roofline::occupancy;

// Tolerances: the expected times below are the hand computations written to 5 or 6
// significant digits, so they are off by at most half a unit in their last digit: relative
// 1.7e-6 for 298.507e-6 (epsilon 1e-5), 2.4e-5 for 2.0513e-3 and 3.6e-6 for 138.91e-6 and
// 277.83e-6 (epsilon 1e-4). The model computes in double, whose rounding (~1e-16) is far
// below either. A wrong peak or a missing term moves a value by 2x or more.
TEST_CASE("roofline: the longer of bytes at 3.35 TB/s and operations at each unit's peak") {
    Launch copy;
    copy.bytes_read = 0.5e9;
    copy.bytes_written = 0.5e9;  // 1e9 / 3.35e12 s = 298.5 µs
    CHECK(bound(copy).seconds == doctest::Approx(298.507e-6).epsilon(1e-5));
    CHECK(bound(copy).limited_by() == std::string("memory"));

    Launch gemm;  // 4096³ float32 product: 2·4096³ = 1.374e11 operations at 67e12/s = 2.051 ms
    gemm.fp32_flops = 2.0 * 4096.0 * 4096.0 * 4096.0;
    gemm.bytes_read = 2 * 4.0 * 4096 * 4096;  // 134 MB: 40 µs, the shorter
    gemm.bytes_written = 4.0 * 4096 * 4096;
    CHECK(bound(gemm).seconds == doctest::Approx(2.0513e-3).epsilon(1e-4));
    CHECK(bound(gemm).limited_by() == std::string("compute"));
    // The same operations in bfloat16 on the tensor cores: 1.374e11 / 989.4e12 = 138.9 µs.
    Launch half = gemm;
    half.fp32_flops = 0;
    half.f16_flops = gemm.fp32_flops;
    CHECK(bound(half).compute_seconds == doctest::Approx(138.91e-6).epsilon(1e-4));
    // TF32: half the 16-bit rate, 277.8 µs.
    Launch tf32 = gemm;
    tf32.fp32_flops = 0;
    tf32.tf32_flops = gemm.fp32_flops;
    CHECK(bound(tf32).compute_seconds == doctest::Approx(277.83e-6).epsilon(1e-4));
    // One after the other: each launch's longer limit, summed (not the longer of the sums).
    const auto both = bound(std::vector<Launch>{copy, half});
    CHECK(both.seconds == doctest::Approx(298.507e-6 + 138.91e-6).epsilon(1e-4));
    CHECK(both.memory_limited_seconds == doctest::Approx(298.507e-6).epsilon(1e-5));
}

TEST_CASE("occupancy: blocks per SM from threads, registers and shared memory, as NVIDIA's calculator counts them") {
    Launch l;
    l.blocks = 1056;
    l.threads_per_block = 256;  // 8 warps: 64 / 8 = 8 blocks, all 64 warp slots
    auto o = occupancy(l);
    CHECK(o.blocks_per_sm == 8);
    CHECK(o.warps_fraction == 1.0);
    CHECK(o.limited_by == "threads");
    CHECK(o.waves == doctest::Approx(1.0));  // 1056 / (132 · 8)

    l.shared_bytes = 48 * 1024;  // 49 152 + 1 024 a block: 233 472 / 50 176 = 4.65 → 4
    o = occupancy(l);
    CHECK(o.blocks_per_sm == 4);
    CHECK(o.warps_fraction == 0.5);
    CHECK(o.limited_by == "shared memory");
    CHECK(o.waves == doctest::Approx(2.0));

    l.shared_bytes = 40 * 1024 + 1;  // rounded up to 41 088, + 1 024: 233 472 / 42 112 = 5.54 → 5
    CHECK(occupancy(l).blocks_per_sm == 5);

    l.shared_bytes = 0;
    l.registers_per_thread = 37;  // 37 · 32 = 1 184 → 1 280 a warp: 65 536 / 1 280 = 51 warps → 6 blocks
    o = occupancy(l);
    CHECK(o.blocks_per_sm == 6);
    CHECK(o.warps_fraction == doctest::Approx(0.75));
    CHECK(o.limited_by == "registers");

    Launch small;
    small.threads_per_block = 32;  // 1 warp: the 32-block limit comes first, 32 of 64 warps
    o = occupancy(small);
    CHECK(o.blocks_per_sm == 32);
    CHECK(o.warps_fraction == 0.5);
    CHECK(o.limited_by == "blocks");

    Launch wide;
    wide.threads_per_block = 128;
    wide.registers_per_thread = 128;  // 4 096 a warp: 16 warps → 4 blocks of 4
    CHECK(occupancy(wide).blocks_per_sm == 4);
    wide.registers_per_thread = 256;  // over 255: no block fits
    CHECK(occupancy(wide).blocks_per_sm == 0);
    wide.registers_per_thread = 0;
    wide.shared_bytes = 228 * 1024;  // with the 1 KiB reserve, more than an SM has
    o = occupancy(wide);
    CHECK(o.blocks_per_sm == 0);
    CHECK(o.limited_by == "no block fits (shared memory)");
}
