// The CUDA simulator's 16-bit types and tensor cores: __half and __nv_bfloat16 against
// PyTorch's conversions (the committed fixtures), __syncwarp, and the WMMA calls: 16×16×16
// products of every layout against float64 (exactly, on inputs whose products and sums are
// exact in float32; within float32 rounding on random ones), and the rules a GPU imposes,
// each broken once: a lane that skips a call, lanes passing different pointers, a
// misaligned pointer, a leading dimension that is not a multiple of 16 bytes, a warp of
// fewer than 32 threads.
#include "attn/fixtures.hpp"
#include "sim_buffer.hpp"
#include "cuda_bf16.h"
#include "cuda_fp16.h"
#include "mma.h"

#include "attn/npy.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

using namespace nvcuda;

namespace {

// D (16×16, ld 16) = A·B + C with A, B 16-bit in the given layouts, C and D in memory layout
// `acc` (0: row-major, 1: column-major); one warp.
template <class T, class LA, class LB>
__global__ void gemm16(float* d, const T* a, const T* b, const float* c, int acc) {
    const wmma::layout_t mem = acc == 0 ? wmma::mem_row_major : wmma::mem_col_major;
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, LB> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::load_matrix_sync(fc, c, 16, mem);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d, fc, 16, mem);
}

// Each element of an accumulator filled with 2 and scaled by its lane's number of elements:
// element-wise work on a fragment, whatever the layout.
__global__ void fill_and_scale(float* d) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
    wmma::fill_fragment(f, 2.0f);
    for (int e = 0; e < f.num_elements; ++e) f.x[e] *= 3.0f;
    wmma::store_matrix_sync(d, f, 16, wmma::mem_row_major);
}

// The mistakes a GPU punishes (with a hang, garbage or an error), one per `mistake`.
__global__ void misuse(float* d, const __half* a, int mistake) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 0.0f);
    const int lane = static_cast<int>(threadIdx.x % 32);
    if (mistake == 1) {  // half the lanes skip the product
        wmma::load_matrix_sync(fa, a, 16);
        wmma::load_matrix_sync(fb, a, 16);
        if (lane < 16) wmma::mma_sync(fc, fa, fb, fc);
    } else if (mistake == 2) {  // each lane its own row: another pointer per lane
        wmma::load_matrix_sync(fa, a + 16 * lane, 16);
    } else if (mistake == 3) {  // 16 bytes past an aligned address
        wmma::load_matrix_sync(fa, a + 8, 16);
    } else if (mistake == 4) {  // a leading dimension of 20 halves: 40 bytes
        wmma::load_matrix_sync(fa, a, 20);
    }
    wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}

// Lane i writes base + i to shared memory; after __syncwarp it reads lane i + 1's.
__global__ void rotate_in_warp(int* out, int base, bool sync) {
    __shared__ int s[32];
    const int lane = static_cast<int>(threadIdx.x);
    s[lane] = base + lane;
    if (sync) __syncwarp();
    out[lane] = s[(lane + 1) % 32];
}

template <class T>
std::vector<T> to_16bit(const std::vector<float>& x) {
    std::vector<T> out;
    for (float v : x) out.push_back(T(v));
    return out;
}

// The float64 product of two row-major 16×16 matrices plus C (row-major).
std::vector<double> product64(const std::vector<float>& a, const std::vector<float>& b,
                              const std::vector<float>& c) {
    std::vector<double> d(256);
    for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 16; ++j) {
            double s = c[i * 16 + j];
            for (int k = 0; k < 16; ++k) s += static_cast<double>(a[i * 16 + k]) * b[k * 16 + j];
            d[i * 16 + j] = s;
        }
    }
    return d;
}

std::vector<float> transpose16(const std::vector<float>& m) {
    std::vector<float> t(256);
    for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 16; ++j) t[j * 16 + i] = m[i * 16 + j];
    }
    return t;
}

// One product in the given layouts: the inputs stored as the layouts say, the result read
// back row-major; its largest difference from float64.
template <class T, class LA, class LB>
double gemm_error(const std::vector<float>& a, const std::vector<float>& b,
                  const std::vector<float>& c, int acc) {
    const bool a_col = std::is_same<LA, wmma::col_major>::value;
    const bool b_col = std::is_same<LB, wmma::col_major>::value;
    Buffer<T> A(to_16bit<T>(a_col ? transpose16(a) : a)), B(to_16bit<T>(b_col ? transpose16(b) : b));
    Buffer<float> C(acc == 0 ? c : transpose16(c)), D(256);
    ATTN_LAUNCH((gemm16<T, LA, LB>), 1, 32, 0, nullptr)(D.p, A.p, B.p, C.p, acc);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    std::vector<float> d = D.get();
    if (acc == 1) d = transpose16(d);
    const std::vector<double> ref = product64(a, b, c);
    double worst = 0.0;
    for (int i = 0; i < 256; ++i) worst = std::max(worst, std::fabs(d[i] - ref[i]));
    return worst;
}

template <class T>
void every_layout(const std::vector<float>& a, const std::vector<float>& b,
                  const std::vector<float>& c, double tolerance) {
    for (int acc = 0; acc < 2; ++acc) {
        CAPTURE(acc);
        CHECK(gemm_error<T, wmma::row_major, wmma::row_major>(a, b, c, acc) <= tolerance);
        CHECK(gemm_error<T, wmma::row_major, wmma::col_major>(a, b, c, acc) <= tolerance);
        CHECK(gemm_error<T, wmma::col_major, wmma::row_major>(a, b, c, acc) <= tolerance);
        CHECK(gemm_error<T, wmma::col_major, wmma::col_major>(a, b, c, acc) <= tolerance);
    }
}

std::vector<int> fixture(const std::string& name) {
    const attn::NpyArray a =
        attn::read_npy(attn::fixtures_dir() / "precision" / name);
    return std::vector<int>(a.data.begin(), a.data.end());
}

}  // namespace

TEST_CASE("__half and __nv_bfloat16 round floats as PyTorch does, to nearest with ties to even") {
    const std::vector<int> high = fixture("input_bits_high.npy"), low = fixture("input_bits_low.npy");
    const std::vector<int> fp16 = fixture("float16_bits.npy"), bf16 = fixture("bfloat16_bits.npy");
    REQUIRE(high.size() == fp16.size());
    for (std::size_t i = 0; i < high.size(); ++i) {
        const std::uint32_t bits = (static_cast<std::uint32_t>(high[i]) << 16) | static_cast<std::uint32_t>(low[i]);
        float x;
        std::memcpy(&x, &bits, sizeof x);
        CAPTURE(i);
        CAPTURE(x);
        const unsigned short h = __half_as_ushort(__float2half_rn(x));
        const unsigned short b = __bfloat16_as_ushort(__float2bfloat16_rn(x));
        if (std::isnan(x)) {
            CHECK(std::isnan(__half2float(__ushort_as_half(h))));
            CHECK(std::isnan(__bfloat162float(__ushort_as_bfloat16(b))));
            continue;
        }
        CHECK(h == fp16[i]);
        CHECK(b == bf16[i]);
        // back to float: exact
        CHECK(__half2float(__ushort_as_half(h)) == static_cast<float>(__half(x)));
    }
    CHECK(__half2float(__float2half(65504.0f)) == 65504.0f);
    CHECK(std::isinf(__half2float(__float2half(65520.0f))));
    CHECK(__bfloat162float(__float2bfloat16(1.00390625f)) == 1.0f);  // a tie, to even
}

TEST_CASE("__syncwarp orders shared memory between the lanes of a warp") {
    Buffer<int> out(32);
    cuda_sim::set_racecheck(true);
    ATTN_LAUNCH(rotate_in_warp, 1, 32, 0, nullptr)(out.p, 100, true);
    CHECK(cudaGetLastError() == cudaSuccess);
    const auto h = out.get();
    for (int lane = 0; lane < 32; ++lane) CHECK(h[lane] == 100 + (lane + 1) % 32);
    // Without it a lane may read its neighbour's slot before the neighbour writes it (here:
    // the value the last launch left), which the race check's two orders tell apart.
    ATTN_LAUNCH(rotate_in_warp, 1, 32, 0, nullptr)(out.p, 200, false);
    CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
    CHECK(cuda_sim::take_failure().find("a race") != std::string::npos);
    cuda_sim::set_racecheck(false);
}

TEST_CASE("mma_sync multiplies 16x16 tiles exactly where float32 can, in every layout") {
    // Small integers and halves: every product and every partial sum is exact in float32,
    // and every input exact in float16 and bfloat16, so D must equal the float64 product.
    std::vector<float> a(256), b(256), c(256);
    for (int i = 0; i < 256; ++i) {
        a[i] = static_cast<float>((i * 7) % 13 - 6);
        b[i] = 0.5f * static_cast<float>((i * 5) % 11 - 5);
        c[i] = static_cast<float>(i % 9 - 4);
    }
    every_layout<__half>(a, b, c, 0.0);
    every_layout<__nv_bfloat16>(a, b, c, 0.0);
}

TEST_CASE("mma_sync on random 16-bit inputs is the float64 product within float32 rounding") {
    std::mt19937 gen(18);
    std::normal_distribution<float> normal;
    std::vector<float> a(256), b(256), c(256);
    for (auto* m : {&a, &b, &c}) {
        for (float& x : *m) x = normal(gen);
    }
    // The inputs as the 16-bit values the kernel sees; 16 products of size ~1 summed in
    // float32: each partial sum off by at most half an ulp of ~8, 17 of them: < 1e-5.
    const auto as = [](std::vector<float> m, auto convert) {
        for (float& x : m) x = convert(x);
        return m;
    };
    const auto h = [](float x) { return __half2float(__float2half(x)); };
    const auto bf = [](float x) { return __bfloat162float(__float2bfloat16(x)); };
    every_layout<__half>(as(a, h), as(b, h), c, 1e-5);
    every_layout<__nv_bfloat16>(as(a, bf), as(b, bf), c, 1e-5);
}

TEST_CASE("element-wise work on a fragment: fill_fragment, then every element scaled") {
    Buffer<float> d(256);
    ATTN_LAUNCH(fill_and_scale, 1, 32, 0, nullptr)(d.p);
    REQUIRE(cudaGetLastError() == cudaSuccess);
    for (float x : d.get()) CHECK(x == 6.0f);
}

TEST_CASE("fragment layouts: CUDA's element counts, every element held as often as CUDA holds it, drawn anew") {
    // What the layout-dependent code of the mistake catalogue relies on being refused: a
    // 16-bit input fragment holds each of the 256 elements in two slots of two different
    // lanes (16 slots a lane), the accumulator each once (8 a lane); and the race check's
    // second draw is another layout, so a result that depends on it changes.
    using Kind = cuda_sim::FragmentKind;
    CHECK(wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major>::num_elements == 16);
    CHECK(wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>::num_elements == 16);
    CHECK(wmma::fragment<wmma::accumulator, 16, 16, 16, float>::num_elements == 8);
    for (Kind kind : {Kind::matrix_a, Kind::matrix_b, Kind::accumulator}) {
        const cuda_sim::FragmentLayout& l = cuda_sim::fragment_layout(kind);
        const int copies = kind == Kind::accumulator ? 1 : 2;
        CHECK(l.elements == 8 * copies);
        std::vector<std::vector<int>> lanes(256);
        for (int lane = 0; lane < 32; ++lane) {
            for (int e = 0; e < l.elements; ++e) {
                REQUIRE(l.row[lane][e] < 16);
                REQUIRE(l.col[lane][e] < 16);
                lanes[static_cast<std::size_t>(16 * l.row[lane][e] + l.col[lane][e])].push_back(lane);
            }
        }
        for (const auto& holders : lanes) {
            REQUIRE(holders.size() == static_cast<std::size_t>(copies));
            if (copies == 2) CHECK(holders[0] != holders[1]);
        }
    }
    // Not lane l holding row l/2 (the layout of one GPU's documentation, and this simulator's
    // before): a draw that happened to be it would let the catalogue's mistakes through.
    const cuda_sim::FragmentLayout& acc = cuda_sim::fragment_layout(Kind::accumulator);
    int documented = 0;
    for (int lane = 0; lane < 32; ++lane) {
        for (int e = 0; e < 8; ++e) documented += acc.row[lane][e] == lane / 2 && acc.col[lane][e] == 8 * (lane % 2) + e;
    }
    CHECK(documented < 32);
}

TEST_CASE("WMMA calls are warp-collective and check what a GPU requires") {
    Buffer<__half> a(to_16bit<__half>(std::vector<float>(16 * 64, 1.0f)));
    Buffer<float> d(256);
    SUBCASE("a lane that skips mma_sync: the launch fails, naming the call") {
        ATTN_LAUNCH(misuse, 1, 32, 0, nullptr)(d.p, a.p, 1);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        const std::string why = cuda_sim::take_failure();
        CAPTURE(why);
        CHECK(why.find("wmma::mma_sync") != std::string::npos);
        CHECK(why.find("every lane must reach the same call") != std::string::npos);
    }
    SUBCASE("lanes passing different pointers") {
        ATTN_LAUNCH(misuse, 1, 32, 0, nullptr)(d.p, a.p, 2);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        CHECK(cuda_sim::take_failure().find("another pointer") != std::string::npos);
    }
    SUBCASE("a pointer that is not 256-bit aligned") {
        ATTN_LAUNCH(misuse, 1, 32, 0, nullptr)(d.p, a.p, 3);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        CHECK(cuda_sim::take_failure().find("not 256-bit aligned") != std::string::npos);
    }
    SUBCASE("a leading dimension that is not a multiple of 8 halves") {
        ATTN_LAUNCH(misuse, 1, 32, 0, nullptr)(d.p, a.p, 4);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        CHECK(cuda_sim::take_failure().find("multiple of 8") != std::string::npos);
    }
    SUBCASE("a warp of 16 threads") {
        ATTN_LAUNCH(misuse, 1, 16, 0, nullptr)(d.p, a.p, 0);
        CHECK(cudaGetLastError() == cudaErrorLaunchFailure);
        CHECK(cuda_sim::take_failure().find("needs all 32 lanes") != std::string::npos);
    }
    SUBCASE("used rightly, the same kernel runs") {
        ATTN_LAUNCH(misuse, 1, 32, 0, nullptr)(d.p, a.p, 0);
        CHECK(cudaGetLastError() == cudaSuccess);
    }
}
