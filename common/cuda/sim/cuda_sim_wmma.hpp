// The CUDA simulator's tensor cores: CUDA's warp matrix functions (nvcuda::wmma, mma.h) for
// 16×16×16 tiles with float16 or bfloat16 inputs and a float32 accumulator.
//
// As on a GPU, every call is warp-collective: all 32 lanes of a warp must reach the same
// call with the same pointer, leading dimension and layout (the simulator fails the launch,
// naming the line, when one does not), and a fragment is spread over the lanes, each
// holding `num_elements` of its elements: 16 for matrix_a and matrix_b (each element of the
// matrix in two lanes' slots, as CUDA's 16-bit fragments of sm_70 and later), 8 for the
// float accumulator. Which lane holds which element is unspecified by CUDA and differs
// between GPUs; here each run draws a layout per fragment kind at random
// (cuda_sim::fragment_layout; CUDA_SIM_WMMA_SEED=N repeats one), and the race check's two
// runs use two draws. Code may apply one operation to every element of a fragment; code
// that needs to know where an element lies is wrong on some GPU, and here its results
// change from run to run. mma_sync refuses a matrix_a or matrix_b fragment whose two copies
// of an element differ (code that changed elements by position).
//
// mma_sync computes D = A·B + C with each product of two 16-bit values exact in float32
// and the sums in float32, in order of k (a tensor core's internal order and rounding of
// the sum are not specified; they differ from this by float32 rounding).
//
// The checks CUDA documents: the matrix pointer 256-bit (32-byte) aligned; the leading
// dimension ldm, in elements, a multiple of 8 for 16-bit elements and of 4 for float.
#pragma once

#include "cuda_sim.hpp"
#include "cuda_sim_half.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
// Slots a lane holds: 16-bit input fragments hold each element twice, the accumulator once.
template <class Use>
constexpr int lane_elements = std::is_same<Use, accumulator>::value ? 8 : 16;
template <class Use>
constexpr ::cuda_sim::FragmentKind kind_of = std::is_same<Use, matrix_a>::value   ? ::cuda_sim::FragmentKind::matrix_a
                                             : std::is_same<Use, matrix_b>::value ? ::cuda_sim::FragmentKind::matrix_b
                                                                                : ::cuda_sim::FragmentKind::accumulator;

template <class T>
constexpr bool is_16bit = std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value;
template <class L>
constexpr bool is_layout = std::is_same<L, row_major>::value || std::is_same<L, col_major>::value;
}  // namespace detail

/// A 16×16 tile spread over the warp: matrix_a (M×K) and matrix_b (K×N) of __half or
/// __nv_bfloat16 with a row_major or col_major layout, or the float accumulator (M×N).
template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
    static_assert(M == 16 && N == 16 && K == 16,
                  "the CUDA simulator's tensor cores take 16x16x16 tiles only");
    static_assert(std::is_same<Use, accumulator>::value
                      ? std::is_same<T, float>::value && std::is_void<Layout>::value
                      : (std::is_same<Use, matrix_a>::value || std::is_same<Use, matrix_b>::value) &&
                            detail::is_16bit<T> && detail::is_layout<Layout>,
                  "the CUDA simulator's tensor cores: matrix_a and matrix_b of __half or "
                  "__nv_bfloat16 with row_major or col_major, a float accumulator without a layout");

public:
    using use_type = Use;
    static constexpr int num_elements = detail::lane_elements<Use>;  ///< elements this lane holds
    T x[num_elements];                                                ///< this lane's elements
};

namespace detail {

// Each lane's arguments to one call, left on its stack while the warp gathers.
struct Call {
    const void* pointer;
    unsigned ldm;
    int layout;  // 0: row-major in memory, 1: column-major
    void* fragment;
    float value;  // fill_fragment's
};

inline std::string same_arguments(void* const* args, bool check_pointer, bool check_value) {
    const Call& first = *static_cast<const Call*>(args[0]);
    for (int lane = 1; lane < 32; ++lane) {
        const Call& c = *static_cast<const Call*>(args[lane]);
        if (check_pointer && (c.pointer != first.pointer || c.ldm != first.ldm || c.layout != first.layout)) {
            return "lane " + std::to_string(lane) +
                   " passed another pointer, leading dimension or layout than lane 0 (every lane "
                   "of the warp must pass the same)";
        }
        if (check_value && !(c.value == first.value || (c.value != c.value && first.value != first.value))) {
            return "lane " + std::to_string(lane) + " passed another value than lane 0";
        }
    }
    return "";
}

template <class T>
std::string check_matrix(const Call& c) {
    const auto address = reinterpret_cast<std::uintptr_t>(c.pointer);
    if (address % 32 != 0) {
        return "the matrix pointer is not 256-bit aligned (address " + std::to_string(address) +
               " is " + std::to_string(address % 32) + " bytes past a multiple of 32)";
    }
    const unsigned multiple = 16 / sizeof(T);
    if (c.ldm % multiple != 0 || c.ldm < 16) {
        return "the leading dimension " + std::to_string(c.ldm) + " must be at least 16 and a multiple of " +
               std::to_string(multiple) + " for " + (sizeof(T) == 2 ? "16-bit" : "float") + " elements";
    }
    return "";
}

// The offset of element (row, col) in memory: row_major (layout 0) or col_major (1).
inline std::size_t offset(int row, int col, unsigned ldm, int layout) {
    return layout == 0 ? static_cast<std::size_t>(row) * ldm + static_cast<std::size_t>(col)
                       : static_cast<std::size_t>(col) * ldm + static_cast<std::size_t>(row);
}

template <class T, class Fragment>
std::string load(void* const* args) {
    std::string wrong = same_arguments(args, true, false);
    if (wrong.empty()) wrong = check_matrix<T>(*static_cast<const Call*>(args[0]));
    if (!wrong.empty()) return wrong;
    const auto& l = ::cuda_sim::fragment_layout(kind_of<typename Fragment::use_type>);
    for (int lane = 0; lane < 32; ++lane) {
        const Call& c = *static_cast<const Call*>(args[lane]);
        auto& f = *static_cast<Fragment*>(c.fragment);
        const T* p = static_cast<const T*>(c.pointer);
        for (int e = 0; e < Fragment::num_elements; ++e) {
            f.x[e] = p[offset(l.row[lane][e], l.col[lane][e], c.ldm, c.layout)];
        }
    }
    return "";
}

template <class Fragment>
std::string store(void* const* args) {
    std::string wrong = same_arguments(args, true, false);
    if (wrong.empty()) wrong = check_matrix<float>(*static_cast<const Call*>(args[0]));
    if (!wrong.empty()) return wrong;
    const auto& l = ::cuda_sim::fragment_layout(::cuda_sim::FragmentKind::accumulator);
    for (int lane = 0; lane < 32; ++lane) {
        const Call& c = *static_cast<const Call*>(args[lane]);
        const auto& f = *static_cast<const Fragment*>(c.fragment);
        float* p = static_cast<float*>(const_cast<void*>(c.pointer));
        for (int e = 0; e < Fragment::num_elements; ++e) {
            p[offset(l.row[lane][e], l.col[lane][e], c.ldm, c.layout)] = f.x[e];
        }
    }
    return "";
}

template <class Fragment>
std::string fill(void* const* args) {
    const std::string wrong = same_arguments(args, false, true);
    if (!wrong.empty()) return wrong;
    for (int lane = 0; lane < 32; ++lane) {
        const Call& c = *static_cast<const Call*>(args[lane]);
        auto& f = *static_cast<Fragment*>(c.fragment);
        for (int e = 0; e < Fragment::num_elements; ++e) f.x[e] = c.value;
    }
    return "";
}

struct MmaCall {
    void* d;
    const void* a;
    const void* b;
    const void* c;
};

// Gathers a 16-bit input fragment's matrix from the warp's lanes; "" or, where the two slots
// holding one element disagree, what is wrong.
template <class Fragment>
std::string gather(void* const* args, const void* MmaCall::*which, const char* name, float (&m)[16][16]) {
    const auto& l = ::cuda_sim::fragment_layout(kind_of<typename Fragment::use_type>);
    int holder[16][16];
    for (auto& row : holder) {
        for (int& h : row) h = -1;
    }
    for (int lane = 0; lane < 32; ++lane) {
        const auto& f = *static_cast<const Fragment*>(static_cast<const MmaCall*>(args[lane])->*which);
        for (int e = 0; e < Fragment::num_elements; ++e) {
            const int r = l.row[lane][e], c = l.col[lane][e];
            const float v = static_cast<float>(f.x[e]);
            if (holder[r][c] >= 0 && std::memcmp(&v, &m[r][c], sizeof v) != 0) {
                return std::string(name) + " element (" + std::to_string(r) + ", " + std::to_string(c) +
                       ") is held by lanes " + std::to_string(holder[r][c]) + " and " + std::to_string(lane) +
                       " with different values: elements were changed by position, which CUDA leaves "
                       "unspecified (code may apply one operation to every element of a fragment; "
                       "CUDA_SIM_WMMA_SEED=" + std::to_string(::cuda_sim::fragment_layout_seed()) +
                       " repeats this run's layouts)";
            }
            m[r][c] = v;
            holder[r][c] = lane;
        }
    }
    return "";
}

template <class Acc, class A, class B>
std::string mma(void* const* args) {
    float a[16][16], b[16][16], d[16][16];  // the warp's whole tiles, gathered from the lanes
    std::string wrong = gather<A>(args, &MmaCall::a, "matrix_a", a);
    if (wrong.empty()) wrong = gather<B>(args, &MmaCall::b, "matrix_b", b);
    if (!wrong.empty()) return wrong;
    const auto& l = ::cuda_sim::fragment_layout(::cuda_sim::FragmentKind::accumulator);
    for (int lane = 0; lane < 32; ++lane) {
        const auto& fc = *static_cast<const Acc*>(static_cast<const MmaCall*>(args[lane])->c);
        for (int e = 0; e < Acc::num_elements; ++e) d[l.row[lane][e]][l.col[lane][e]] = fc.x[e];
    }
    float out[16][16];
    for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 16; ++j) {
            float sum = d[i][j];
            for (int k = 0; k < 16; ++k) sum += a[i][k] * b[k][j];  // each product exact
            out[i][j] = sum;
        }
    }
    ::cuda_sim::note_flops(0, 0, 2.0 * 16 * 16 * 16);  // a multiply and an add per product
    for (int lane = 0; lane < 32; ++lane) {  // D may be C: written only after every read
        auto& fd = *static_cast<Acc*>(static_cast<const MmaCall*>(args[lane])->d);
        for (int e = 0; e < Acc::num_elements; ++e) fd.x[e] = out[l.row[lane][e]][l.col[lane][e]];
    }
    return "";
}

template <class L>
constexpr int layout_of() {
    return std::is_same<L, row_major>::value ? 0 : 1;
}

}  // namespace detail

/// Loads a 16×16 tile of 16-bit elements into matrix_a or matrix_b: element (r, c) of the
/// fragment's matrix from mptr[r·ldm + c] (row_major) or mptr[c·ldm + r] (col_major).
template <class Use, class T, class Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& a, const T* mptr, unsigned ldm,
                      const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::Call call{mptr, ldm, detail::layout_of<Layout>(), &a, 0.0f};
    ::cuda_sim::warp_collective("wmma::load_matrix_sync", &call,
                                detail::load<T, fragment<Use, 16, 16, 16, T, Layout>>, file, line);
}

/// Loads a 16×16 float tile into an accumulator, row- or column-major in memory.
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& a, const float* mptr,
                             unsigned ldm, layout_t layout, const char* file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
    detail::Call call{mptr, ldm, layout == mem_row_major ? 0 : 1, &a, 0.0f};
    ::cuda_sim::warp_collective("wmma::load_matrix_sync", &call,
                                detail::load<float, fragment<accumulator, 16, 16, 16, float>>, file,
                                line);
}

/// Stores an accumulator's 16×16 floats, row- or column-major.
inline void store_matrix_sync(float* mptr, const fragment<accumulator, 16, 16, 16, float>& a,
                              unsigned ldm, layout_t layout, const char* file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    detail::Call call{mptr, ldm, layout == mem_row_major ? 0 : 1,
                      const_cast<fragment<accumulator, 16, 16, 16, float>*>(&a), 0.0f};
    ::cuda_sim::warp_collective("wmma::store_matrix_sync", &call,
                                detail::store<fragment<accumulator, 16, 16, 16, float>>, file, line);
}

/// Sets every element of a fragment to v (every lane passes the same v).
template <class Use, class T, class Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& a, float v,
                   const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::Call call{nullptr, 0, 0, &a, static_cast<float>(T(v))};
    ::cuda_sim::warp_collective("wmma::fill_fragment", &call,
                                detail::fill<fragment<Use, 16, 16, 16, T, Layout>>, file, line);
}

/// D = A·B + C on the warp's tensor cores: 16-bit inputs, float32 products and sums.
template <class T, class LA, class LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, T, LA>& a,
              const fragment<matrix_b, 16, 16, 16, T, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c,
              const char* file = __builtin_FILE(), int line = __builtin_LINE()) {
    detail::MmaCall call{&d, &a, &b, &c};
    ::cuda_sim::warp_collective(
        "wmma::mma_sync", &call,
        detail::mma<fragment<accumulator, 16, 16, 16, float>, fragment<matrix_a, 16, 16, 16, T, LA>,
                    fragment<matrix_b, 16, 16, 16, T, LB>>,
        file, line);
}

}  // namespace wmma
}  // namespace nvcuda
