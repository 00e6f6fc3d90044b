// Work counting (cuda_sim::Work): the bytes a launch reads and writes, found page by page,
// and the operations of cuBLAS and the tensor cores, against what each kernel does by
// construction (counted by hand below). The performance model built on it is checked in
// tests/test_roofline.cpp.
#include "sim_buffer.hpp"
#include "cuda_sim_half.hpp"
#include "cuda_sim_wmma.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <string>
#include <vector>

using namespace nvcuda;

namespace {

// out[i] = in[i] for i < n: reads n floats, writes n.
__global__ void copy_floats(float* out, const float* in, int n) {
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = in[i];
}

// x[i] += 1 for i < n: reads and writes the same n floats.
__global__ void add_one(float* x, int n) {
    const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) x[i] += 1.0f;
}

// One 16×16×16 product per warp, on tiles every warp shares.
__global__ void tiles(float* d, const __half* a, const __half* b) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(fc, fa, fb, fc);
    const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32;
    wmma::store_matrix_sync(d + warp * 256, fc, 16, wmma::mem_row_major);
}

// Turns counting on (and the race check off) for one test, and back.
struct Counting {
    bool racecheck = cuda_sim::racecheck();
    Counting() {
        cuda_sim::set_racecheck(false);
        cuda_sim::take_work();
        cuda_sim::set_work_counting(true);
    }
    ~Counting() {
        cuda_sim::set_work_counting(false);
        cuda_sim::set_racecheck(racecheck);
    }
};

#if defined(__SANITIZE_ADDRESS__)
constexpr bool sanitizer_build = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool sanitizer_build = true;
#else
constexpr bool sanitizer_build = false;
#endif
#else
constexpr bool sanitizer_build = false;
#endif

}  // namespace

TEST_CASE("work counting: the bytes a kernel reads and writes, page by page, clipped to its allocations") {
    if (sanitizer_build) {
        // AddressSanitizer's allocations are not whole pages: the records say "not counted".
        Counting on;
        Buffer<float> in(std::vector<float>(1000, 1.0f)), out(1000);
        ATTN_LAUNCH(copy_floats, 4, 256, 0, nullptr)(out.p, in.p, 1000);
        const auto work = cuda_sim::take_work();
        REQUIRE(work.size() == 1);
        CHECK_FALSE(work[0].counted);
        return;
    }
    Counting on;
    const int n = 1 << 20;  // 4 MiB of floats: whole pages
    Buffer<float> in(std::vector<float>(n, 1.0f)), out(n);
    ATTN_LAUNCH(copy_floats, n / 256, 256, 0, nullptr)(out.p, in.p, n);
    ATTN_LAUNCH(add_one, n / 256, 256, 0, nullptr)(out.p, n);
    // Half the threads: half of each buffer.
    ATTN_LAUNCH(copy_floats, n / 512, 256, 0, nullptr)(out.p, in.p, n / 2);
    // 1 000 floats: 4 000 bytes of one page, not 4 096.
    Buffer<float> small_in(std::vector<float>(1000, 2.0f)), small_out(1000);
    ATTN_LAUNCH(copy_floats, 4, 256, 0, nullptr)(small_out.p, small_in.p, 1000);
    const auto work = cuda_sim::take_work();
    REQUIRE(work.size() == 4);
    for (const auto& w : work) CHECK(w.counted);
    CHECK(work[0].name == "copy_floats");
    CHECK(work[0].site.find("test_cuda_sim_work.cpp:") == 0);
    CHECK(work[0].grid.x == static_cast<unsigned>(n / 256));
    CHECK(work[0].bytes_read == 4u * n);
    CHECK(work[0].bytes_written == 4u * n);
    // x[i] += 1 reads each page, then writes it: both.
    CHECK(work[1].bytes_read == 4u * n);
    CHECK(work[1].bytes_written == 4u * n);
    CHECK(work[2].bytes_read == 2u * n);
    CHECK(work[2].bytes_written == 2u * n);
    CHECK(work[3].bytes_read == 4000u);
    CHECK(work[3].bytes_written == 4000u);
    for (const auto& w : work) CHECK(w.fp32_flops + w.tf32_flops + w.f16_flops == 0.0);  // a kernel's own arithmetic is not seen
    // The memory is as the kernels left it: counting protects pages, never changes them.
    CHECK(out.get()[0] == 1.0f);
    CHECK(out.get()[n - 1] == 2.0f);
    CHECK(small_out.get()[999] == 2.0f);
}

TEST_CASE("work counting: cuBLAS's products and the tensor cores' mma_sync count their operations") {
    Counting on;
    // C (m×n) = A (m×k) · B (k×n), column-major, sizes that fill whole pages of floats.
    const int m = 64, n = 128, k = 32;
    Buffer<float> A(std::vector<float>(m * k, 1.0f)), B(std::vector<float>(k * n, 1.0f)), C(m * n);
    cublasHandle_t h = nullptr;
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    const float one = 1.0f, zero = 0.0f;
    REQUIRE(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A.p, m, B.p, k, &zero, C.p, m) ==
            CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, A.p, m, B.p, k, &zero, C.p, m) ==
            CUBLAS_STATUS_SUCCESS);
    cublasDestroy(h);
    // 3 blocks of 64 threads: 6 warps, one product each.
    Buffer<__half> a(std::vector<__half>(256, __half(1.0f))), b(std::vector<__half>(256, __half(1.0f)));
    Buffer<float> d(6 * 256);
    ATTN_LAUNCH(tiles, 3, 64, 0, nullptr)(d.p, a.p, b.p);
    const auto work = cuda_sim::take_work();
    REQUIRE(work.size() == 3);
    CHECK(work[0].name == "cublasSgemm");
    CHECK(work[0].fp32_flops == 2.0 * m * n * k);
    CHECK(work[0].tf32_flops == 0.0);
    CHECK(work[1].tf32_flops == 2.0 * m * n * k);
    CHECK(work[1].fp32_flops == 0.0);
    CHECK(work[2].f16_flops == 6 * 2.0 * 16 * 16 * 16);
    CHECK(C.get()[0] == static_cast<float>(k));
    if (!sanitizer_build) {
        // beta = 0: C is written, not read; A and B are read whole.
        CHECK(work[0].bytes_read == 4u * (m * k + k * n));
        CHECK(work[0].bytes_written == 4u * m * n);
        CHECK(work[2].bytes_read == 2u * 2 * 256);
        CHECK(work[2].bytes_written == 4u * 6 * 256);
    }
}

TEST_CASE("work counting: race-checked launches are recorded as not counted") {
    Counting on;
    cuda_sim::set_racecheck(true);
    Buffer<float> in(std::vector<float>(1024, 1.0f)), out(1024);
    ATTN_LAUNCH(copy_floats, 4, 256, 0, nullptr)(out.p, in.p, 1024);
    const auto work = cuda_sim::take_work();
    REQUIRE(work.size() == 1);
    CHECK_FALSE(work[0].counted);
    CHECK(work[0].bytes_read == 0u);
}

TEST_CASE("the device guard closes device memory to host code, not to the runtime's calls and kernels") {
    if (!cuda_sim::set_device_guard(true)) {
        MESSAGE("the device guard is not available in this build (AddressSanitizer's allocations)");
        return;
    }
    // Copies, kernels, cuBLAS and frees work as before; host code is refused (the catalogue's
    // host_writes_device_memory ends a program that tries).
    Buffer<float> in(std::vector<float>(1000, 3.0f)), out(1000);
    ATTN_LAUNCH(copy_floats, 4, 256, 0, nullptr)(out.p, in.p, 1000);
    ATTN_LAUNCH(add_one, 4, 256, 0, nullptr)(out.p, 1000);
    CHECK(out.get()[999] == 4.0f);
    CHECK(cuda_sim::device_guard());
    cuda_sim::set_device_guard(false);
    out.p[0] = 5.0f;  // open again: the simulator's memory is the host's
    CHECK(out.get()[0] == 5.0f);
}
