// PTX's warp-level matrix instructions in the CUDA simulator (mma.cuh, sim/cuda_sim_mma.hpp):
// mma.sync m16n8k16 and ldmatrix, their fragment layouts checked element by element against
// the PTX ISA's figures as mma_kernels.cuh writes them (its own formulas, not the model's),
// products of generated integer matrices against a plain triple loop, FlashAttention-2's
// ldmatrix-then-mma path, cp.async's groups, and the calls a GPU would hang on or fault on,
// refused. The cases before "#ifndef __CUDACC__" also run on a GPU (tests/cuda/test_mma_gpu.cu):
// the same kernels and expectations, so the model and the hardware answer to the same text.
//
// The reductions through shared memory of a warp's lanes: with __syncwarp between a write
// and another lane's read they pass the race check on every generated input; without it
// (the lock-step reduction of pre-Volta textbooks) they are refused on every one.
#include "sim_buffer.hpp"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "mma_kernels.cuh"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace {

template <class T>
std::vector<T> to_16bit(const std::vector<float>& x) {
    std::vector<T> out;
    for (float v : x) out.push_back(T(v));
    return out;
}

// D (16×8) = A (16×16) · B (16×8) + C in float64.
std::vector<double> product(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
    std::vector<double> d(128);
    for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 8; ++n) {
            double sum = c[static_cast<std::size_t>(m * 8 + n)];
            for (int k = 0; k < 16; ++k) sum += double(a[static_cast<std::size_t>(m * 16 + k)]) * b[static_cast<std::size_t>(k * 8 + n)];
            d[static_cast<std::size_t>(m * 8 + n)] = sum;
        }
    }
    return d;
}

template <class T>
std::vector<float> run_mma(bool through_ldmatrix, const std::vector<float>& a, const std::vector<float>& b,
                           const std::vector<float>& c) {
    Buffer<T> da(to_16bit<T>(a)), db(to_16bit<T>(b));
    Buffer<float> dc(c), dd(128);
    if (through_ldmatrix) {
        ATTN_LAUNCH(mma_probe::mma_through_ldmatrix<T>, 1, 32, 0, nullptr)(dd.p, da.p, db.p, dc.p);
    } else {
        ATTN_LAUNCH(mma_probe::mma_from_memory<T>, 1, 32, 0, nullptr)(dd.p, da.p, db.p, dc.p);
    }
    REQUIRE(cudaGetLastError() == cudaSuccess);
    return dd.get();
}

}  // namespace

TEST_CASE_TEMPLATE("mma.sync m16n8k16 puts every element of A, B and C where the PTX ISA's fragment figures do", T,
                   __nv_bfloat16, __half) {
    // Codes as values: A[r][k] = 16r + k (0 … 255, exact in bfloat16's 8 significant bits and
    // float16's 11), B[k][n] = 8k + n + 1, C[m][n] = 1000·(8m + n). With B selecting one
    // column of A, or A = I selecting B's rows, D shows each element at the place the figure
    // gives it, and every sum has one nonzero product: exact.
    std::vector<float> a_codes(256), b_codes(128), c_codes(128), zero_c(128, 0.0f), identity(256, 0.0f);
    for (int i = 0; i < 256; ++i) a_codes[static_cast<std::size_t>(i)] = static_cast<float>(i);
    for (int i = 0; i < 128; ++i) b_codes[static_cast<std::size_t>(i)] = static_cast<float>(i + 1);
    for (int i = 0; i < 128; ++i) c_codes[static_cast<std::size_t>(i)] = 1000.0f * static_cast<float>(i);
    for (int i = 0; i < 16; ++i) identity[static_cast<std::size_t>(i * 16 + i)] = 1.0f;
    for (int half = 0; half < 2; ++half) {  // D[m][n] = A[m][n + 8·half]
        std::vector<float> select(128, 0.0f);
        for (int n = 0; n < 8; ++n) select[static_cast<std::size_t>((n + 8 * half) * 8 + n)] = 1.0f;
        const auto d = run_mma<T>(false, a_codes, select, zero_c);
        for (int m = 0; m < 16; ++m) {
            for (int n = 0; n < 8; ++n) {
                CAPTURE(m);
                CAPTURE(n);
                CHECK(d[static_cast<std::size_t>(m * 8 + n)] == static_cast<float>(16 * m + n + 8 * half));
            }
        }
    }
    const auto d = run_mma<T>(false, identity, b_codes, c_codes);  // D = B + C
    for (int m = 0; m < 16; ++m) {
        for (int n = 0; n < 8; ++n) {
            CAPTURE(m);
            CAPTURE(n);
            CHECK(d[static_cast<std::size_t>(m * 8 + n)] == static_cast<float>(8 * m + n + 1 + 1000 * (8 * m + n)));
        }
    }
}

TEST_CASE_TEMPLATE("mma.sync m16n8k16 on generated integer matrices equals a plain triple loop, alone and after ldmatrix",
                   T, __nv_bfloat16, __half) {
    // Integers in [-8, 8] (exact in both 16-bit formats), C in [-64, 64]: every product is at
    // most 64 and every partial sum at most 16·64 + 64 < 2^24 in size, so float32 sums them
    // exactly in any order and D must equal the float64 product bit for bit.
    std::mt19937 random(20261128);
    std::uniform_int_distribution<int> small(-8, 8), medium(-64, 64);
    for (int trial = 0; trial < 25; ++trial) {
        std::vector<float> a(256), b(128), c(128);
        for (float& x : a) x = static_cast<float>(small(random));
        for (float& x : b) x = static_cast<float>(small(random));
        for (float& x : c) x = static_cast<float>(medium(random));
        const auto expected = product(a, b, c);
        for (bool through_ldmatrix : {false, true}) {
            const auto d = run_mma<T>(through_ldmatrix, a, b, c);
            for (std::size_t i = 0; i < 128; ++i) {
                CAPTURE(trial);
                CAPTURE(through_ldmatrix);
                CAPTURE(i);
                CHECK(static_cast<double>(d[i]) == expected[i]);
            }
        }
    }
}

TEST_CASE("ldmatrix .x1, .x2 and .x4, plain and .trans, give each lane the elements the PTX ISA's figure does") {
    // Row r of matrix j holds the codes 64j + 8r + c + 1 (c = 0 … 7); the rows lie in shared
    // memory in a shuffled order, so only the lanes' addresses say where each one is.
    std::vector<std::uint16_t> codes(256);
    for (int i = 0; i < 256; ++i) codes[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(i + 1);
    std::vector<int> slot(32);
    std::iota(slot.begin(), slot.end(), 0);
    std::shuffle(slot.begin(), slot.end(), std::mt19937(7));
    Buffer<std::uint16_t> dcodes(codes);
    Buffer<int> dslot(slot);
    Buffer<std::uint32_t> out(128);
    const auto code = [](int j, int r, int c) { return static_cast<std::uint32_t>(64 * j + 8 * r + c + 1); };
    for (int matrices : {1, 2, 4}) {
        for (int trans : {0, 1}) {
            ATTN_LAUNCH(mma_probe::ldmatrix_rows, 1, 32, 0, nullptr)(out.p, dcodes.p, dslot.p, matrices, trans);
            REQUIRE(cudaGetLastError() == cudaSuccess);
            const auto h = out.get();
            for (int lane = 0; lane < 32; ++lane) {
                for (int j = 0; j < matrices; ++j) {
                    // Lane l: row l / 4, columns 2(l % 4) and 2(l % 4) + 1; transposed,
                    // rows 2(l % 4) and 2(l % 4) + 1 of column l / 4.
                    const int g = lane / 4, t = lane % 4;
                    const std::uint32_t low = trans ? code(j, 2 * t, g) : code(j, g, 2 * t);
                    const std::uint32_t high = trans ? code(j, 2 * t + 1, g) : code(j, g, 2 * t + 1);
                    CAPTURE(matrices);
                    CAPTURE(trans);
                    CAPTURE(lane);
                    CAPTURE(j);
                    CHECK(h[static_cast<std::size_t>(lane * 4 + j)] == (low | (high << 16)));
                }
            }
        }
    }
}

TEST_CASE_TEMPLATE("cp.async of 4, 8 and 16 bytes lands at the wait_group that covers its group, not before", B,
                   std::integral_constant<int, 4>, std::integral_constant<int, 8>, std::integral_constant<int, 16>) {
    constexpr int chunk = B::value / 4, half = 32 * chunk;
    std::vector<float> in(2 * half);
    for (int i = 0; i < 2 * half; ++i) in[static_cast<std::size_t>(i)] = 0.5f * static_cast<float>(i) - 3.0f;
    Buffer<float> din(in), out(2 * half), first(half), second_early(half);
    ATTN_LAUNCH(mma_probe::cp_async_two_groups<B::value>, 1, 32, 0, nullptr)(out.p, first.p, second_early.p, din.p);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    const auto o = out.get(), f = first.get(), e = second_early.get();
    for (int i = 0; i < 2 * half; ++i) {
        CAPTURE(i);
        CHECK(o[static_cast<std::size_t>(i)] == in[static_cast<std::size_t>((i + 7 * chunk) % (2 * half))]);
    }
    for (int i = 0; i < half; ++i) {
        CAPTURE(i);
        CHECK(f[static_cast<std::size_t>(i)] == in[static_cast<std::size_t>(i)]);
#ifndef __CUDACC__
        std::uint32_t bits;
        std::memcpy(&bits, &e[static_cast<std::size_t>(i)], sizeof bits);
        CHECK(bits == 0xffffffffu);  // the second group, read before its wait: the model's NaN bytes
#endif
    }
}

// What follows is the simulator's alone: its refusals, and its race check.
#ifndef __CUDACC__

namespace {
// The mistakes a GPU punishes, one per `mistake`: 1, lanes 16-31 skip the product (a hang);
// 2, an ldmatrix row address in global memory; 3, a row address 8 bytes off 16.
__global__ void mma_misuse(float* d, const __nv_bfloat16* global_rows, int mistake) {
    alignas(16) __shared__ __nv_bfloat16 s[16 * 16];
    const int lane = static_cast<int>(threadIdx.x % 32);
    for (int i = lane; i < 256; i += 32) s[i] = __float2bfloat16(1.0f);
    __syncwarp();
    std::uint32_t a[4], b[2] = {0, 0};
    const __nv_bfloat16* rows = mistake == 2 ? global_rows : s;
    attn::cuda::ptx::ldmatrix_x4(a, &rows[(lane % 16) * 16 + (lane / 16) * 8 + (mistake == 3 ? 4 : 0)]);
    float c[4] = {0, 0, 0, 0}, out[4];
    if (mistake == 1 && lane >= 16) return;
    attn::cuda::ptx::mma_m16n8k16_bf16(out, a, b, c);
    d[lane] = out[0];
}
}  // namespace

TEST_CASE("mma.sync and ldmatrix are warp-collective, and ldmatrix reads aligned shared memory") {
    Buffer<__nv_bfloat16> global_rows(256);
    Buffer<float> d(32);
    SUBCASE("used rightly, the kernel runs") {
        ATTN_LAUNCH(mma_misuse, 1, 32, 0, nullptr)(d.p, global_rows.p, 0);
        CHECK(cudaGetLastError() == cudaSuccess);
    }
    SUBCASE("half the warp skips mma.sync") {
        ATTN_LAUNCH(mma_misuse, 1, 32, 0, nullptr)(d.p, global_rows.p, 1);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        const std::string why = cuda_sim::take_failure();
        CAPTURE(why);
        CHECK(why.find("mma.sync.m16n8k16 (bf16) at test_cuda_sim_mma.cpp") != std::string::npos);
        CHECK(why.find("is reached by 16 of warp 0's 32 lanes") != std::string::npos);
    }
    SUBCASE("a warp of 16 threads") {
        ATTN_LAUNCH(mma_misuse, 1, 16, 0, nullptr)(d.p, global_rows.p, 0);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        CHECK(cuda_sim::take_failure().find("needs all 32 lanes") != std::string::npos);
    }
    SUBCASE("row addresses in global memory") {
        ATTN_LAUNCH(mma_misuse, 1, 32, 0, nullptr)(d.p, global_rows.p, 2);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        CHECK(cuda_sim::take_failure().find("lane 0's row address is in device (global) memory") != std::string::npos);
    }
    SUBCASE("a row address 8 bytes past a 16-byte boundary") {
        ATTN_LAUNCH(mma_misuse, 1, 32, 0, nullptr)(d.p, global_rows.p, 3);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        CHECK(cuda_sim::take_failure().find("8 bytes past a 16-byte boundary") != std::string::npos);
    }
}

namespace {
struct Sum {
    static float apply(float x, float y) { return x + y; }
};
struct Max {
    static float apply(float x, float y) { return fmaxf(x, y); }
};

// A row of 64 reduced by one block of 64 threads: a barrier, then the last warp on its own,
// in four ways (`way`): 0, the lock-step reduction without __syncwarp; 1, one __syncwarp
// after each step (still a race: lane tid reads v[tid + 16] in the step where lane tid + 16
// writes it); 2, the CUDA C++ Programming Guide's way, each step's read and write apart by a
// __syncwarp; 3, __shfl_down_sync.
template <class Op>
__global__ void last_warp_reduce(const float* row, float* out, int way) {
    __shared__ float s[64];
    const int tid = static_cast<int>(threadIdx.x);
    s[tid] = row[tid];
    __syncthreads();
    if (tid < 32) {
        volatile float* v = s;
        if (way == 0) {
            for (int offset = 32; offset > 0; offset /= 2) v[tid] = Op::apply(v[tid], v[tid + offset]);
        } else if (way == 1) {
            for (int offset = 32; offset > 0; offset /= 2) {
                v[tid] = Op::apply(v[tid], v[tid + offset]);
                __syncwarp();
            }
        } else if (way == 2) {
            float x = s[tid];
            for (int offset = 32; offset > 0; offset /= 2) {
                x = Op::apply(x, s[tid + offset]);
                __syncwarp();  // every lane has read before any lane writes
                s[tid] = x;
                __syncwarp();  // every lane has written before any lane reads
            }
        } else {
            float x = Op::apply(s[tid], s[tid + 32]);
            for (int offset = 16; offset > 0; offset /= 2) x = Op::apply(x, __shfl_down_sync(0xffffffffu, x, offset));
            if (tid == 0) s[0] = x;
        }
    }
    __syncthreads();
    if (tid == 0) out[0] = s[0];
}
}  // namespace

TEST_CASE_TEMPLATE("a warp's reduction through shared memory is refused without __syncwarp and passes with it, on every generated row",
                   Op, Sum, Max) {
    // Rows of integers in [-1000, 1000]: every partial sum is an integer below 2^24, exact in
    // float32 in any order, so the right ways must give the float64 result exactly.
    cuda_sim::set_racecheck(true);
    cuda_sim::set_racecheck_every_launch(true);
    std::mt19937 random(64);
    std::uniform_int_distribution<int> value(-1000, 1000);
    Buffer<float> out(1);
    for (int trial = 0; trial < 100; ++trial) {
        std::vector<float> row(64);
        for (float& x : row) x = static_cast<float>(value(random));
        double expected = row[0];
        for (int i = 1; i < 64; ++i) expected = std::is_same<Op, Sum>::value ? expected + row[static_cast<std::size_t>(i)] : std::max<double>(expected, row[static_cast<std::size_t>(i)]);
        Buffer<float> drow(row);
        CAPTURE(trial);
        // One __syncwarp a step is refused for the sum only: in a maximum, the partial
        // maximum a lane may read too late or too early holds only elements its own already
        // includes, so every order gives the same bytes (a race that no order shows; the
        // README's "not seen").
        for (int way : {0, 1}) {
            if (way == 1 && std::is_same<Op, Max>::value) continue;
            CAPTURE(way);
            ATTN_LAUNCH(last_warp_reduce<Op>, 1, 64, 0, nullptr)(drow.p, out.p, way);
            CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
            CHECK(cuda_sim::take_failure().find("a race") != std::string::npos);
        }
        for (int way : {2, 3}) {
            CAPTURE(way);
            ATTN_LAUNCH(last_warp_reduce<Op>, 1, 64, 0, nullptr)(drow.p, out.p, way);
            REQUIRE(cudaGetLastError() == cudaSuccess);
            CHECK(static_cast<double>(out.get()[0]) == expected);
        }
    }
    cuda_sim::set_racecheck_every_launch(false);
    cuda_sim::set_racecheck(false);
}

namespace {
// cp.async used wrongly, one way per `mistake`: 1, a source in shared memory; 2, a destination
// in device memory; 3, a 16-byte copy at a 4-byte offset; 4, copies never waited for.
__global__ void cp_async_misuse(float* global, int mistake) {
    alignas(16) __shared__ float s[64];
    const int lane = static_cast<int>(threadIdx.x % 32);
    s[lane] = 0.0f;
    float* dst = mistake == 2 ? global + 32 : &s[32];
    const float* src = mistake == 1 ? &s[0] : global;
    attn::cuda::ptx::cp_async_ca<16>(dst + (mistake == 3 ? 1 : 0), src);
    attn::cuda::ptx::cp_async_commit_group();
    if (mistake != 4) attn::cuda::ptx::cp_async_wait_group<0>();
}
}  // namespace

TEST_CASE("cp.async refuses what a GPU faults on, and a thread that never waits for its copies") {
    Buffer<float> global(64);
    const auto refused = [&](int mistake) {
        ATTN_LAUNCH(cp_async_misuse, 1, 32, 0, nullptr)(global.p, mistake);
        CHECK(cudaGetLastError() == (mistake == 0 ? cudaSuccess : cudaErrorLaunchFailure));
        return cuda_sim::take_failure();
    };
    CHECK(refused(0).empty());
    CHECK(refused(1).find("the source is not device memory") != std::string::npos);
    CHECK(refused(2).find("the destination is device memory") != std::string::npos);
    CHECK(refused(3).find("aligned to the copy's 16 bytes") != std::string::npos);
    CHECK(refused(4).find("ended with 1 cp.async copy it never waited for") != std::string::npos);
}

#endif  // __CUDACC__
