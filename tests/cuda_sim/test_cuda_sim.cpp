// The CUDA simulator's own checks: indices, barriers, shuffles, shared memory, the launch
// limits a GPU enforces, a barrier not all threads reach, the race check, and cuBLAS's
// column-major semantics against products computed by hand.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "sim_buffer.hpp"

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

__global__ void write_indices(int* out) {
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned per_block = blockDim.x * blockDim.y * blockDim.z;
    out[block * per_block + thread] = static_cast<int>(block * 1000 + thread);
}

// Thread i writes its index to shared memory; after the barrier it reads its neighbour's.
__global__ void rotate_through_shared(int* out) {
    __shared__ int s[256];
    const int t = static_cast<int>(threadIdx.x);
    const int n = static_cast<int>(blockDim.x);
    s[t] = t + 100 * static_cast<int>(blockIdx.x);
    __syncthreads();
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[(t + 1) % n];
}

// The same without the barrier: a race.
__global__ void rotate_without_barrier(int* out) {
    __shared__ int s[256];
    const int t = static_cast<int>(threadIdx.x);
    s[t] = t + 100 * static_cast<int>(blockIdx.x);
    out[blockIdx.x * blockDim.x + threadIdx.x] = s[(t + 1) % static_cast<int>(blockDim.x)];
}

__global__ void shuffles(float* sum, float* down, float* bcast) {
    const float x = static_cast<float>(threadIdx.x);
    float s = x;
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    sum[threadIdx.x] = s;
    down[threadIdx.x] = __shfl_down_sync(0xffffffffu, x, 3);
    bcast[threadIdx.x] = __shfl_sync(0xffffffffu, x, 5);
}

__global__ void dynamic_shared_sum(float* out, int n) {
    ATTN_DYNAMIC_SHARED(float, buf);
    buf[threadIdx.x] = static_cast<float>(threadIdx.x);
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int i = 0; i < n; ++i) total += buf[i];
        out[0] = total;
    }
}

// Half the threads return before the barrier.
__global__ void early_return(int* out) {
    if (threadIdx.x % 2 == 1) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void nothing(int*) {}

// What the lost-update search must let through: atomics, writes ordered by a barrier, and
// every thread writing the same value.
__global__ void count_atomically(int* counter) { atomicAdd(counter, 1); }
__global__ void write_in_turn(int* out) {
    if (threadIdx.x == 0) out[0] = 1;
    __syncthreads();
    if (threadIdx.x == 1) out[0] += 1;  // after the barrier: ordered after thread 0's write
}
__global__ void all_write_one_value(int* flag) { *flag = 7; }
__global__ void count_plainly(int* counter) { *counter += 1; }

// Static __shared__: one thread reads a variable nobody wrote in this block, then writes it
// (a GPU leaves shared memory uninitialised: the first read is garbage in every block); and
// 40 KiB of it, which needs an opt-in with any dynamic shared memory beside it.
__global__ void read_before_write(float* out) {
    __shared__ float carried;
    if (threadIdx.x == 0) {
        out[blockIdx.x] = carried;
        carried = 5.0f;
    }
}
__global__ void device_exp(float* out, const float* in, int n) {
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = expf(in[i]);
}
// One of the device functions the simulator perturbs, on each argument: 0 expf, 1 logf,
// 2 erff, 3 rsqrtf.
__global__ void device_math(float* out, const float* in, int n, int function) {
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n) return;
    switch (function) {
        case 0: out[i] = expf(in[i]); break;
        case 1: out[i] = logf(in[i]); break;
        case 2: out[i] = erff(in[i]); break;
        default: out[i] = rsqrtf(in[i]); break;
    }
}
__global__ void forty_kib(float* out) {
    __shared__ float tile[10240];
    tile[threadIdx.x] = 1.0f;
    __syncthreads();
    out[0] = tile[0];
}

}  // namespace

TEST_CASE("every thread of a 3-D grid of 3-D blocks sees its own indices") {
    const dim3 grid(2, 3, 2), block(4, 2, 3);
    const std::size_t n = 2 * 3 * 2 * 4 * 2 * 3;
    Buffer<int> out(n);
    ATTN_LAUNCH(write_indices, grid, block, 0, nullptr)(out.p);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    const auto h = out.get();
    for (std::size_t i = 0; i < n; ++i) CHECK(h[i] == static_cast<int>(i / 24 * 1000 + i % 24));
}

TEST_CASE("__syncthreads orders shared memory across all threads of a block") {
    Buffer<int> out(2 * 256);
    cuda_sim::set_racecheck(true);
    ATTN_LAUNCH(rotate_through_shared, 2, 256, 0, nullptr)(out.p);
    CHECK(cudaGetLastError() == cudaSuccess);
    const auto h = out.get();
    for (int b = 0; b < 2; ++b) {
        for (int t = 0; t < 256; ++t) CHECK(h[b * 256 + t] == (t + 1) % 256 + 100 * b);
    }
    cuda_sim::set_racecheck(false);
}

TEST_CASE("the race check reports shared memory read without a barrier") {
    Buffer<int> out(256);
    cuda_sim::set_racecheck(true);
    ATTN_LAUNCH(rotate_without_barrier, 1, 256, 0, nullptr)(out.p);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    CHECK(cuda_sim::take_failure().find("a race") != std::string::npos);
    cuda_sim::set_racecheck(false);
}

TEST_CASE("warp shuffles follow CUDA's lane rules: xor butterflies, down, broadcast") {
    Buffer<float> sum(64), down(64), bcast(64);
    ATTN_LAUNCH(shuffles, 1, 64, 0, nullptr)(sum.p, down.p, bcast.p);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    const auto s = sum.get(), d = down.get(), b = bcast.get();
    for (int t = 0; t < 64; ++t) {
        const int warp = t / 32, lane = t % 32;
        CHECK(s[t] == static_cast<float>(32 * 31 / 2 + 32 * 32 * warp));  // Σ lanes of the warp
        CHECK(d[t] == static_cast<float>(lane + 3 < 32 ? t + 3 : t));     // past 31: its own
        CHECK(b[t] == static_cast<float>(32 * warp + 5));
    }
}

TEST_CASE("a launch a GPU would refuse fails with the GPU's error") {
    Buffer<int> out(1);
    ATTN_LAUNCH(nothing, 1, 1025, 0, nullptr)(out.p);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    ATTN_LAUNCH(nothing, 1, dim3(1, 1, 65), 0, nullptr)(out.p);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    ATTN_LAUNCH(nothing, dim3(1, 65536), 1, 0, nullptr)(out.p);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    ATTN_LAUNCH(nothing, 0, 32, 0, nullptr)(out.p);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    ATTN_LAUNCH(nothing, 1, 32, 0, nullptr)(out.p);
    CHECK(cudaGetLastError() == cudaSuccess);
}

TEST_CASE("dynamic shared memory above 48 KiB needs cudaFuncSetAttribute, up to 227 KiB") {
    Buffer<float> out(1);
    const std::size_t big = 64 * 1024;
    ATTN_LAUNCH(dynamic_shared_sum, 1, 64, big, nullptr)(out.p, 64);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaFuncSetAttribute(dynamic_shared_sum, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(big)) == cudaSuccess);
    ATTN_LAUNCH(dynamic_shared_sum, 1, 64, big, nullptr)(out.p, 64);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(out.get()[0] == 64.0f * 63.0f / 2.0f);
    CHECK(cudaFuncSetAttribute(dynamic_shared_sum, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               300 * 1024) == cudaErrorInvalidValue);
    cuda_sim::take_failure();
}

TEST_CASE("static __shared__ is counted against the limits, reported, and uninitialised in every block") {
    // The sizes come from the program's symbol table: the release and sanitizer builds keep
    // it (a stripped program would count 0 and is not what the tests run).
    cudaFuncAttributes attributes{};
    REQUIRE(cudaFuncGetAttributes(&attributes, forty_kib) == cudaSuccess);
    CHECK(attributes.sharedSizeBytes == 40 * 1024);
    REQUIRE(cudaFuncGetAttributes(&attributes, read_before_write) == cudaSuccess);
    CHECK(attributes.sharedSizeBytes == sizeof(float));
    REQUIRE(cudaFuncGetAttributes(&attributes, nothing) == cudaSuccess);
    CHECK(attributes.sharedSizeBytes == 0);

    Buffer<float> out(3);
    ATTN_LAUNCH(forty_kib, 1, 32, 8 * 1024, nullptr)(out.p);  // 48 KiB exactly: allowed
    CHECK(cudaGetLastError() == cudaSuccess);
    ATTN_LAUNCH(forty_kib, 1, 32, 8 * 1024 + 4, nullptr)(out.p);
    const std::string why = cuda_sim::take_failure();
    CAPTURE(why);
    CHECK(why.find("40960 bytes of static __shared__ memory and 8196 of dynamic") != std::string::npos);
    // Opting in: the dynamic maximum plus the static bytes may not pass 227 KiB.
    CHECK(cudaFuncSetAttribute(forty_kib, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024) ==
          cudaErrorInvalidValue);
    cuda_sim::take_failure();
    CHECK(cudaFuncSetAttribute(forty_kib, cudaFuncAttributeMaxDynamicSharedMemorySize, 16 * 1024) == cudaSuccess);
    ATTN_LAUNCH(forty_kib, 1, 32, 16 * 1024, nullptr)(out.p);
    CHECK(cudaGetLastError() == cudaSuccess);

    // Every block, and the next launch, starts from NaN bytes: not the 0 of a C++ static,
    // not what the last block left.
    for (int launch = 0; launch < 2; ++launch) {
        ATTN_LAUNCH(read_before_write, 3, 32, 0, nullptr)(out.p);
        REQUIRE(cudaGetLastError() == cudaSuccess);
        for (float x : out.get()) CHECK(std::isnan(x));
    }
}

TEST_CASE("CUDA_SIM_DEVICE_MATH=ulp moves expf within CUDA's 2 ulp, the same way for the same argument") {
    // Units in the last place between two floats of one sign: the distance of their bits.
    auto ulps = [](float a, float b) {
        std::int32_t x = 0, y = 0;
        std::memcpy(&x, &a, 4);
        std::memcpy(&y, &b, 4);
        return x > y ? x - y : y - x;
    };
    const int n = 1000;
    std::vector<float> in(n);
    for (int i = 0; i < n; ++i) in[static_cast<std::size_t>(i)] = -20.0f + 0.04f * static_cast<float>(i);
    Buffer<float> x(in), out(n);
    const bool was = cuda_sim::device_math_perturbed();
    for (bool perturbed : {false, true}) {
        cuda_sim::set_device_math_perturbed(perturbed);
        ATTN_LAUNCH(device_exp, (n + 127) / 128, 128, 0, nullptr)(out.p, x.p, n);
        REQUIRE(cudaGetLastError() == cudaSuccess);
        const std::vector<float> first = out.get();
        ATTN_LAUNCH(device_exp, (n + 127) / 128, 128, 0, nullptr)(out.p, x.p, n);
        CHECK(out.get() == first);  // a function of the argument alone
        int moved = 0, worst = 0;
        for (int i = 0; i < n; ++i) {
            const float exact = std::exp(in[static_cast<std::size_t>(i)]);
            const int d = ulps(first[static_cast<std::size_t>(i)], exact);
            moved += d != 0;
            worst = std::max(worst, d);
        }
        CAPTURE(perturbed);
        CHECK(worst <= (perturbed ? 2 : 0));
        if (perturbed) CHECK(moved > n / 2);  // 4 of the 5 whole offsets in [-2, 2] move it
    }
    cuda_sim::set_device_math_perturbed(was);
}

TEST_CASE("CUDA_SIM_DEVICE_MATH=ulp keeps the special values CUDA documents exact, and moves the rest within range") {
    // The CUDA Math API's special values (libdevice User's Guide, __nv_expf, __nv_logf,
    // __nv_erff, __nv_rsqrtf), which the PTX instructions ex2, lg2 and rsqrt give as well
    // (PTX ISA 8.x, sections 9.7.3.21, 9.7.3.20 and 9.7.3.16; see cuda_sim.hpp): a GPU
    // returns them exactly, so an exact check on them is fair. expf(0) one ulp off once made
    // a correct online softmax (its running sums rescaled by expf(0)) miss "a single key:
    // every row is [1]".
    const float inf = INFINITY, nan = NAN, tiny = std::numeric_limits<float>::denorm_min();
    struct Special {
        int function;
        const char* name;
        float argument, result;
    };
    const std::vector<Special> specials = {
        {0, "expf", 0.0f, 1.0f},      {0, "expf", -0.0f, 1.0f},    {0, "expf", tiny, 1.0f},
        {0, "expf", -tiny, 1.0f},     {0, "expf", -inf, 0.0f},     {0, "expf", inf, inf},
        {0, "expf", nan, nan},        {1, "logf", 1.0f, 0.0f},     {1, "logf", 0.0f, -inf},
        {1, "logf", -0.0f, -inf},     {1, "logf", inf, inf},       {1, "logf", -1.0f, nan},
        {1, "logf", nan, nan},        {2, "erff", 0.0f, 0.0f},     {2, "erff", -0.0f, -0.0f},
        {2, "erff", inf, 1.0f},       {2, "erff", -inf, -1.0f},    {2, "erff", nan, nan},
        {3, "rsqrtf", 0.0f, inf},     {3, "rsqrtf", -0.0f, -inf},  {3, "rsqrtf", inf, 0.0f},
        {3, "rsqrtf", -1.0f, nan},    {3, "rsqrtf", nan, nan},
    };
    auto bits = [](float x) {
        std::uint32_t b = 0;
        std::memcpy(&b, &x, 4);
        return b;
    };
    const bool was = cuda_sim::device_math_perturbed();
    cuda_sim::set_device_math_perturbed(true);
    for (const Special& c : specials) {
        Buffer<float> x(std::vector<float>{c.argument}), out(1);
        ATTN_LAUNCH(device_math, 1, 32, 0, nullptr)(out.p, x.p, 1, c.function);
        REQUIRE(cudaGetLastError() == cudaSuccess);
        const float got = out.get()[0];
        CAPTURE(c.name);
        CAPTURE(c.argument);
        CAPTURE(got);
        if (std::isnan(c.result)) {
            CHECK(std::isnan(got));
        } else {
            CHECK(bits(got) == bits(c.result));  // the sign of a zero too
        }
    }

    // Every other argument still moves, by at most the function's bound, and stays in the
    // function's range: expf and rsqrtf above 0, logf with the sign of the exact result,
    // |erff| ≤ 1 (erff(4) is 1 in float: a move up would pass it).
    auto ulps = [&](float a, float b) {
        const std::int64_t d = static_cast<std::int64_t>(static_cast<std::int32_t>(bits(a))) -
                               static_cast<std::int32_t>(bits(b));
        return d < 0 ? -d : d;
    };
    struct Ordinary {
        int function;
        const char* name;
        float from, to;
        int bound;
        float (*exact)(float);  // libm's, as the simulator computes it before moving it
    };
    const std::vector<Ordinary> ordinary = {
        {0, "expf", -20.0f, 20.0f, 2, [](float x) { return std::exp(x); }},
        {1, "logf", 0.01f, 40.0f, 1, [](float x) { return std::log(x); }},
        {2, "erff", -5.0f, 5.0f, 2, [](float x) { return std::erf(x); }},
        {3, "rsqrtf", 0.01f, 40.0f, 2, [](float x) { return 1.0f / std::sqrt(x); }},
    };
    const int n = 1000;
    for (const Ordinary& f : ordinary) {
        CAPTURE(f.name);
        std::vector<float> in(n);
        for (int i = 0; i < n; ++i)
            in[static_cast<std::size_t>(i)] = f.from + (f.to - f.from) * static_cast<float>(i) / n;
        Buffer<float> x(in), out(n);
        ATTN_LAUNCH(device_math, (n + 127) / 128, 128, 0, nullptr)(out.p, x.p, n, f.function);
        REQUIRE(cudaGetLastError() == cudaSuccess);
        const std::vector<float> got = out.get();
        int moved = 0, outside = 0;
        std::int64_t worst = 0;
        for (int i = 0; i < n; ++i) {
            const float exact = f.exact(in[static_cast<std::size_t>(i)]);
            const float y = got[static_cast<std::size_t>(i)];
            const std::int64_t d = ulps(y, exact);
            moved += d != 0;
            worst = std::max(worst, d);
            outside += (f.function == 0 || f.function == 3) ? !(y > 0.0f)
                     : f.function == 2                     ? !(std::fabs(y) <= 1.0f)
                                                           : (y != 0.0f && std::signbit(y) != std::signbit(exact));
        }
        CHECK(worst <= f.bound);
        CHECK(outside == 0);
        CHECK(moved > n / 2);  // most arguments' draws, 2 or 4 of 3 or 5 offsets, move them
    }
    cuda_sim::set_device_math_perturbed(was);
}

TEST_CASE("a __syncthreads that half the block returns before is reported, not a hang") {
    Buffer<int> out(64);
    ATTN_LAUNCH(early_return, 1, 64, 0, nullptr)(out.p);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    // The failure is sticky, as on a GPU: later calls report it too.
    int* p = nullptr;
    CHECK(cudaMalloc(&p, 4) == cudaErrorLaunchFailure);
    const std::string why = cuda_sim::take_failure();
    CHECK(why.find("reached by 32 of the block's 64 threads") != std::string::npos);
    CHECK(cudaMalloc(&p, 4) == cudaSuccess);
    cudaFree(p);
}

TEST_CASE("copies outside a device allocation are refused, naming the overrun") {
    Buffer<float> b(4);
    std::vector<float> h(8);
    CHECK(cudaMemcpy(b.p, h.data(), 8 * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaErrorInvalidValue);
    CHECK(cuda_sim::take_failure().find("16 bytes past the end") != std::string::npos);
    CHECK(cudaMemcpy(h.data(), h.data() + 4, 4, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue);
    cuda_sim::take_failure();
}

TEST_CASE("cublasSgemm is column-major with cuBLAS's transposes and leading dimensions") {
    // A stored column-major 2×3 with lda 3 (one unused row), B 3×2 with ldb 3.
    // A = [1 2 3; 4 5 6], B = [1 0; 0 1; 1 1]: A·B = [4 5; 10 11] (by hand).
    const std::vector<float> a = {1, 4, -9, 2, 5, -9, 3, 6, -9};
    const std::vector<float> b = {1, 0, 1, 0, 1, 1};
    Buffer<float> A(a), B(b), C(std::vector<float>(4, 7.0f));
    cublasHandle_t h = nullptr;
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    REQUIRE(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, A.p, 3, B.p, 3, &zero, C.p, 2) ==
            CUBLAS_STATUS_SUCCESS);
    CHECK(C.get() == std::vector<float>{4, 10, 5, 11});
    // Bᵀ·Aᵀ = (A·B)ᵀ = [4 10; 5 11], with beta = 1 adding to C.
    REQUIRE(cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_T, 2, 2, 3, &one, B.p, 3, A.p, 3, &one, C.p, 2) ==
            CUBLAS_STATUS_SUCCESS);
    CHECK(C.get() == std::vector<float>{8, 15, 15, 22});
    // A leading dimension below the rows is refused, as cuBLAS does.
    CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &one, A.p, 1, B.p, 3, &zero, C.p, 2) ==
          CUBLAS_STATUS_INVALID_VALUE);
    // Two batches at stride 4 of 1×1 products: C_b = A_b·B_b.
    Buffer<float> a2(std::vector<float>{2, 0, 0, 0, 3}), b2(std::vector<float>{5, 0, 0, 0, 7}),
        c2(std::vector<float>(5, 0.0f));
    REQUIRE(cublasSgemmStridedBatched(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a2.p, 1, 4, b2.p,
                                      1, 4, &zero, c2.p, 1, 4, 2) == CUBLAS_STATUS_SUCCESS);
    CHECK(c2.get() == std::vector<float>{10, 0, 0, 0, 21});
    cublasDestroy(h);
    cuda_sim::take_failure();
}

TEST_CASE("in the TF32 math mode the products' inputs are rounded to a 10-bit mantissa") {
    // 1 + 2^-12 lies below half of TF32's last place (2^-10) and rounds to 1; 1 + 2^-11 is
    // exactly half and rounds away from zero to 1 + 2^-10; 3 is exact. So with B = 1 the
    // 1×1 products are 1, 1 + 2^-10 and 3 in TF32, and the inputs themselves in fp32.
    const float below = 1.0f + 0x1p-12f, half = 1.0f + 0x1p-11f;
    Buffer<float> A(std::vector<float>{below, half, 3.0f}), B(std::vector<float>{1.0f}),
        C(std::vector<float>(3, 0.0f));
    cublasHandle_t h = nullptr;
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    REQUIRE(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 1, 1, &one, A.p, 3, B.p, 1, &zero, C.p, 3) ==
            CUBLAS_STATUS_SUCCESS);
    CHECK(C.get() == std::vector<float>{below, half, 3.0f});
    REQUIRE(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 3, 1, 1, &one, A.p, 3, B.p, 1, &zero, C.p, 3) ==
            CUBLAS_STATUS_SUCCESS);
    CHECK(C.get() == std::vector<float>{1.0f, 1.0f + 0x1p-10f, 3.0f});
    cublasDestroy(h);
    cuda_sim::take_failure();
}

TEST_CASE("cublasGemmEx sums exact 16-bit inputs in float32, within n·2^-24·Σ|a·b| of float64") {
    // Generated products: sizes, transposes, padded leading dimensions, beta 0 or 1, inputs
    // over twelve binades of either sign, in bfloat16 and in float16. The reference is a
    // float64 triple loop over the same 16-bit values. Each product of two inputs is exact in
    // float32 (8- or 11-bit significands: at most 22 bits), so the only error is float32's
    // sum of the k products and beta·C: k + 1 terms, each addition off by at most u = 2^-24
    // of the running sum, so |C - ref| ≤ (k + 1)·u·(Σ|a·b| + |beta·C|) (Higham, (3.4)).
    std::mt19937 gen(20240611);
    cublasHandle_t h = nullptr;
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    for (const cudaDataType_t type : {CUDA_R_16BF, CUDA_R_16F}) {
        for (int trial = 0; trial < 40; ++trial) {
            std::uniform_int_distribution<int> size(1, 37);
            const int m = size(gen), n = size(gen), k = size(gen);
            const bool ta = gen() % 2, tb = gen() % 2;
            const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
            const int lda = a_rows + static_cast<int>(gen() % 3), ldb = b_rows + static_cast<int>(gen() % 3);
            const int ldc = m + static_cast<int>(gen() % 3);
            const float beta = static_cast<float>(gen() % 2);
            CAPTURE(type);
            CAPTURE(m);
            CAPTURE(n);
            CAPTURE(k);
            CAPTURE(ta);
            CAPTURE(tb);
            // float16 keeps 2^-6 .. 2^6 inside its normal range; bfloat16 takes the same
            std::uniform_real_distribution<float> exponent(-6.0f, 6.0f), mantissa(1.0f, 2.0f);
            const auto draw = [&] {
                const float x = std::ldexp(mantissa(gen), static_cast<int>(exponent(gen))) * (gen() % 2 ? 1.0f : -1.0f);
                return type == CUDA_R_16BF ? __bfloat16_as_ushort(__float2bfloat16_rn(x))
                                           : __half_as_ushort(__float2half_rn(x));
            };
            const auto value = [type](unsigned short bits) {
                return static_cast<double>(type == CUDA_R_16BF ? __bfloat162float(__ushort_as_bfloat16(bits))
                                                               : __half2float(__ushort_as_half(bits)));
            };
            std::vector<unsigned short> a(static_cast<std::size_t>(lda) * a_cols), b(static_cast<std::size_t>(ldb) * b_cols);
            for (auto& x : a) x = draw();
            for (auto& x : b) x = draw();
            std::vector<float> c0(static_cast<std::size_t>(ldc) * n);
            for (auto& x : c0) x = std::ldexp(mantissa(gen), static_cast<int>(exponent(gen)));
            Buffer<unsigned short> A(a), B(b);
            Buffer<float> C(c0);
            const float one = 1.0f;
            REQUIRE(cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &one, A.p,
                                 type, lda, B.p, type, ldb, &beta, C.p, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                 CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
            const std::vector<float> c = C.get();
            const double u = 0x1p-24;
            int wrong = 0;
            for (int j = 0; j < n; ++j) {
                for (int i = 0; i < m; ++i) {
                    double ref = beta * c0[static_cast<std::size_t>(j) * ldc + i], magnitude = std::fabs(ref);
                    for (int p = 0; p < k; ++p) {
                        const double x = value(ta ? a[static_cast<std::size_t>(i) * lda + p] : a[static_cast<std::size_t>(p) * lda + i]);
                        const double y = value(tb ? b[static_cast<std::size_t>(p) * ldb + j] : b[static_cast<std::size_t>(j) * ldb + p]);
                        ref += x * y;
                        magnitude += std::fabs(x * y);
                    }
                    const double bound = (k + 1) * u * magnitude;
                    if (!(std::fabs(c[static_cast<std::size_t>(j) * ldc + i] - ref) <= bound)) ++wrong;
                }
            }
            CHECK(wrong == 0);
            // the padding rows of C are not written
            for (int j = 0; j < n; ++j) {
                for (int i = m; i < ldc; ++i) CHECK(c[static_cast<std::size_t>(j) * ldc + i] == c0[static_cast<std::size_t>(j) * ldc + i]);
            }
        }
    }
    cublasDestroy(h);
    cuda_sim::take_failure();
}

TEST_CASE("cublasGemmEx refuses, by name, every combination of types it does not model") {
    // Every combination of the four types for A, B and C and the compute types: modelled are
    // A = B in CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F with C in CUDA_R_32F and COMPUTE_32F.
    Buffer<float> A(std::vector<float>(4, 1.0f)), B(std::vector<float>(4, 1.0f)), C(std::vector<float>(4, 0.0f));
    cublasHandle_t h = nullptr;
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    const cudaDataType_t types[] = {CUDA_R_32F, CUDA_R_64F, CUDA_R_16F, CUDA_R_16BF};
    const cublasComputeType_t computes[] = {CUBLAS_COMPUTE_16F, CUBLAS_COMPUTE_32F, CUBLAS_COMPUTE_32F_PEDANTIC,
                                            CUBLAS_COMPUTE_64F, CUBLAS_COMPUTE_32F_FAST_16F,
                                            CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_COMPUTE_32F_FAST_TF32};
    int accepted = 0;
    for (const cudaDataType_t at : types) {
        for (const cudaDataType_t bt : types) {
            for (const cudaDataType_t ct : types) {
                for (const cublasComputeType_t compute : computes) {
                    const bool modelled = at == bt && at != CUDA_R_64F && ct == CUDA_R_32F && compute == CUBLAS_COMPUTE_32F;
                    const cublasStatus_t st = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, A.p, at, 1, B.p, bt,
                                                           1, &zero, C.p, ct, 1, compute, CUBLAS_GEMM_DEFAULT);
                    CAPTURE(at);
                    CAPTURE(bt);
                    CAPTURE(ct);
                    CAPTURE(compute);
                    CHECK(st == (modelled ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED));
                    if (!modelled) CHECK(std::string(cublasGetStatusString(st)).find("cublasGemmEx: A ") != std::string::npos);
                    accepted += st == CUBLAS_STATUS_SUCCESS;
                }
            }
        }
    }
    CHECK(accepted == 3);
    cublasDestroy(h);
    cuda_sim::take_failure();
}

namespace {
__global__ void fill_with(float* out, float value) { out[threadIdx.x] = value; }
}  // namespace

TEST_CASE("work on a non-blocking stream runs when the stream is synchronised, as a GPU may run it late") {
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    Buffer<float> out(std::vector<float>(32, 0.0f));
    float* pinned = nullptr;
    REQUIRE(cudaMallocHost(&pinned, 32 * sizeof(float)) == cudaSuccess);
    pinned[0] = -1.0f;
    ATTN_LAUNCH(fill_with, 1, 32, 0, stream)(out.p, 7.0f);
    REQUIRE(cudaMemcpyAsync(pinned, out.p, 32 * sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    // Reading pinned[0] here, before the stream is synchronised, would end the program with
    // the copy's name: the catalogue's read_pinned_before_stream_sync shows it.
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(pinned[0] == 7.0f);
    // Bytes of the same page that no copy touches stay the program's to use meanwhile.
    float* both = nullptr;
    REQUIRE(cudaMallocHost(&both, 64 * sizeof(float)) == cudaSuccess);
    both[40] = 5.0f;
    REQUIRE(cudaMemcpyAsync(both, out.p, 32 * sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    CHECK(both[40] == 5.0f);
    both[41] = 6.0f;
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(both[0] == 7.0f);
    CHECK(both[41] == 6.0f);
    REQUIRE(cudaFreeHost(both) == cudaSuccess);

    // A copy from pageable memory reads it at the call (CUDA stages it); into pageable memory
    // it returns only when done.
    std::vector<float> source(32, 3.0f), back(32, 0.0f);
    REQUIRE(cudaMemcpyAsync(out.p, source.data(), 32 * sizeof(float), cudaMemcpyHostToDevice, stream) == cudaSuccess);
    source.assign(32, 4.0f);
    REQUIRE(cudaMemcpyAsync(back.data(), out.p, 32 * sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    CHECK(back[31] == 3.0f);

    // cuBLAS on the stream is queued too, with alpha and beta read at the call.
    cublasHandle_t handle = nullptr;
    REQUIRE(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetStream(handle, stream) == CUBLAS_STATUS_SUCCESS);
    Buffer<float> a(std::vector<float>{2.0f}), b(std::vector<float>{5.0f}), c(std::vector<float>{0.0f});
    float alpha = 1.0f, beta = 0.0f;
    REQUIRE(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &alpha, a.p, 1, b.p, 1, &beta, c.p, 1) ==
            CUBLAS_STATUS_SUCCESS);
    alpha = 100.0f;
    REQUIRE(cudaMemcpyAsync(pinned, c.p, sizeof(float), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(pinned[0] == 10.0f);
    cublasDestroy(handle);
    cudaFreeHost(pinned);
    cudaStreamDestroy(stream);
}

TEST_CASE("the legacy stream's copies and kernels that race with a non-blocking stream's queued work are refused") {
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
    Buffer<float> out(32), other(32);
    ATTN_LAUNCH(fill_with, 1, 32, 0, stream)(out.p, 7.0f);
    std::vector<float> host(32);
    // Another allocation: no race.
    CHECK(cudaMemcpy(host.data(), other.p, 32 * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(cudaMemcpy(host.data(), out.p, 32 * sizeof(float), cudaMemcpyDeviceToHost) == cudaErrorIllegalState);
    CHECK(cuda_sim::take_failure().find("queued on a non-blocking stream") != std::string::npos);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
    CHECK(cudaMemcpy(host.data(), out.p, 32 * sizeof(float), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(host[0] == 7.0f);
    cudaStreamDestroy(stream);
}

TEST_CASE("cuBLAS refuses an output that overlaps an input") {
    cublasHandle_t handle = nullptr;
    REQUIRE(cublasCreate(&handle) == CUBLAS_STATUS_SUCCESS);
    Buffer<float> ab(std::vector<float>(8, 1.0f));
    const float one = 1.0f, zero = 0.0f;
    // A and B are floats 0-3 of the buffer: C at floats 2-5 overlaps them.
    CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, ab.p, 2, ab.p, 2, &zero, ab.p + 2, 2) ==
          CUBLAS_STATUS_INVALID_VALUE);
    // Disjoint parts of one allocation are fine: C at floats 4-7.
    CHECK(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, ab.p, 2, ab.p, 2, &zero, ab.p + 4, 2) ==
          CUBLAS_STATUS_SUCCESS);
    CHECK(ab.get()[4] == 2.0f);
    cublasDestroy(handle);
}

TEST_CASE("the race check finds lost updates, and lets atomics, ordered writes and same-value writes through") {
    Buffer<int> counter(1), out(1), flag(1);
    cudaMemset(counter.p, 0, sizeof(int));
    cudaMemset(out.p, 0, sizeof(int));
    cuda_sim::set_racecheck(true);
    const std::size_t searched = cuda_sim::stats().lost_update_checked;
    ATTN_LAUNCH(count_atomically, 4, 256, 0, nullptr)(counter.p);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(counter.get()[0] == 1024);
    ATTN_LAUNCH(write_in_turn, 1, 64, 0, nullptr)(out.p);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(out.get()[0] == 2);
    ATTN_LAUNCH(all_write_one_value, 2, 64, 0, nullptr)(flag.p);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cuda_sim::stats().lost_update_checked == searched + 3);  // each launch was searched
    // The same count without the atomic: right here, one at a time, and refused.
    cudaMemset(counter.p, 0, sizeof(int));
    ATTN_LAUNCH(count_plainly, 1, 64, 0, nullptr)(counter.p);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    CHECK(cuda_sim::take_failure().find("a lost update") != std::string::npos);
    cuda_sim::set_racecheck(false);
}
