// The cuBLAS calls the course makes, on OpenBLAS, with cuBLAS's documented semantics:
// column-major matrices, op(A) is m×k, op(B) is k×n, C is m×n, leading dimensions at least
// the rows of the stored matrix, C not read when beta is 0, and a batch at fixed strides.
// Every matrix must lie inside one device allocation, as on a GPU (where reading past it is
// an illegal address). In the TF32 math mode the inputs of each product are rounded to
// TF32 (a 10-bit mantissa, to nearest, as the tensor cores' conversion does) and the
// products are summed in fp32, so that a run with TF32 differs from an fp32 run as on a GPU.
// cublasGemmEx takes bfloat16 or float16 inputs: each is read exactly and the products (exact
// in fp32: two 8- or 11-bit significands) are summed in fp32, as the tensor cores do.
#include "include/cublas_v2.h"
#include "cuda_sim_half.hpp"

#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>
#include <utility>

struct cublasContext {
    cudaStream_t stream = nullptr;
    cublasMath_t math = CUBLAS_DEFAULT_MATH;
};

namespace cuda_sim {
// In cuda_sim.cpp's terms: a failed call leaves the device in CUDA's sticky error state.
std::string& cublas_detail() {
    thread_local std::string d;
    return d;
}
}  // namespace cuda_sim

namespace {

cublasStatus_t invalid(const std::string& what) {
    cuda_sim::cublas_detail() = what;
    return CUBLAS_STATUS_INVALID_VALUE;
}

// x rounded to TF32: the 13 low mantissa bits dropped, to nearest with ties away from zero
// (cvt.rna.tf32.f32); infinities and NaN pass unchanged.
float to_tf32(float x) {
    std::uint32_t bits;
    std::memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7f800000u) != 0x7f800000u) bits = (bits + 0x1000u) & ~0x1fffu;
    std::memcpy(&x, &bits, sizeof x);
    return x;
}

// The column-major rows×cols matrix at p (leading dimension ld), each element rounded to
// TF32, packed with leading dimension rows.
std::vector<float> tf32_copy(const float* p, int rows, int cols, int ld) {
    std::vector<float> out(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
    for (int j = 0; j < cols; ++j) {
        for (int i = 0; i < rows; ++i) {
            out[static_cast<std::size_t>(j) * rows + i] =
                to_tf32(p[static_cast<std::size_t>(j) * ld + i]);
        }
    }
    return out;
}

// The bytes from the first to past the last element of the column-major rows×cols matrix
// with leading dimension ld and elements of `size` bytes.
std::size_t matrix_bytes(int rows, int cols, int ld, std::size_t size) {
    if (rows == 0 || cols == 0) return 0;
    return (static_cast<std::size_t>(cols - 1) * static_cast<std::size_t>(ld) +
            static_cast<std::size_t>(rows)) * size;
}

// Whether the column-major rows×cols matrix at p with leading dimension ld lies inside one
// device allocation.
bool in_device(const void* p, int rows, int cols, int ld, std::size_t size, std::string* why) {
    if (rows == 0 || cols == 0) return true;
    return cuda_sim::in_device_memory(p, matrix_bytes(rows, cols, ld, size), why);
}

// The element types a product's inputs may have: float32, or 16-bit values read exactly.
enum class Input { f32, bf16, f16 };

std::size_t input_size(Input t) { return t == Input::f32 ? sizeof(float) : 2; }

// The column-major rows×cols matrix at p (leading dimension ld) of 16-bit values, each
// widened to float exactly, packed with leading dimension rows.
std::vector<float> widen_copy(const void* p, Input t, int rows, int cols, int ld) {
    std::vector<float> out(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
    const auto* bits = static_cast<const unsigned short*>(p);
    for (int j = 0; j < cols; ++j) {
        for (int i = 0; i < rows; ++i) {
            const unsigned short b = bits[static_cast<std::size_t>(j) * ld + i];
            out[static_cast<std::size_t>(j) * rows + i] =
                t == Input::bf16 ? __bfloat162float(__ushort_as_bfloat16(b)) : __half2float(__ushort_as_half(b));
        }
    }
    return out;
}

cublasStatus_t gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                    int k, const float* alpha, const void* A, int lda, const void* B, int ldb,
                    const float* beta, float* C, int ldc, const char* call,
                    Input inputs = Input::f32) {
    const std::size_t in_size = input_size(inputs);
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (cudaPeekAtLastError() == cudaErrorLaunchFailure) return CUBLAS_STATUS_EXECUTION_FAILED;
    const auto op_ok = [](cublasOperation_t o) { return o == CUBLAS_OP_N || o == CUBLAS_OP_T; };
    const int a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
    const int b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
    if (!op_ok(ta) || !op_ok(tb) || m < 0 || n < 0 || k < 0 || lda < std::max(1, a_rows) ||
        ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
        return invalid(std::string(call) + ": m=" + std::to_string(m) + " n=" + std::to_string(n) +
                       " k=" + std::to_string(k) + " lda=" + std::to_string(lda) +
                       " ldb=" + std::to_string(ldb) + " ldc=" + std::to_string(ldc) +
                       ": each leading dimension must be at least the rows of its stored matrix");
    }
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    std::string why;
    if ((k > 0 && (!in_device(A, a_rows, a_cols, lda, in_size, &why) ||
                   !in_device(B, b_rows, b_cols, ldb, in_size, &why))) ||
        !in_device(C, m, n, ldc, sizeof(float), &why)) {
        cuda_sim::cublas_detail() = std::string(call) + ": a matrix outside device memory: " + why;
        std::fprintf(stderr, "CUDA simulator: %s\n", cuda_sim::cublas_detail().c_str());
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    // cuBLAS reads A and B while it writes C: C may not overlap either (cuBLAS documents no
    // in-place product, and on a GPU the result would depend on the order of the tiles).
    const auto span = [](const void* p, int rows, int cols, int ld, std::size_t size) {
        const auto start = reinterpret_cast<std::uintptr_t>(p);
        return std::make_pair(start, start + matrix_bytes(rows, cols, ld, size));
    };
    const auto c_span = span(C, m, n, ldc, sizeof(float));
    for (const auto& [operand, range] :
         {std::make_pair("A", span(A, a_rows, a_cols, lda, in_size)),
          std::make_pair("B", span(B, b_rows, b_cols, ldb, in_size))}) {
        if (k > 0 && range.first < c_span.second && c_span.first < range.second) {
            cuda_sim::cublas_detail() = std::string(call) + ": C overlaps " + operand +
                                        ": cuBLAS reads " + operand +
                                        " while it writes C, so the output may not alias an input";
            std::fprintf(stderr, "CUDA simulator: %s\n", cuda_sim::cublas_detail().c_str());
            return CUBLAS_STATUS_INVALID_VALUE;
        }
    }
    const float alpha_value = *alpha, beta_value = *beta;  // host pointers, read at the call
    const cublasMath_t math = h->math;
    const cudaError_t queued = cuda_sim::submit(h->stream, call, {A, B, C}, [=] {
        const float* a = static_cast<const float*>(A);
        const float* b = static_cast<const float*>(B);
        int a_ld = lda, b_ld = ldb;
        if (beta_value == 0.0f) {  // cuBLAS does not read C then (it may hold NaN)
            for (int j = 0; j < n; ++j) {
                for (int i = 0; i < m; ++i) C[static_cast<std::size_t>(j) * ldc + i] = 0.0f;
            }
        }
        if (k == 0 || alpha_value == 0.0f) {
            if (beta_value != 0.0f && beta_value != 1.0f) {
                for (int j = 0; j < n; ++j) {
                    for (int i = 0; i < m; ++i) C[static_cast<std::size_t>(j) * ldc + i] *= beta_value;
                }
            }
            return;
        }
        const double flops = 2.0 * m * n * k;
        const bool tf32 = inputs == Input::f32 && math == CUBLAS_TF32_TENSOR_OP_MATH;
        cuda_sim::note_flops(inputs == Input::f32 && !tf32 ? flops : 0, tf32 ? flops : 0,
                             inputs == Input::f32 ? 0 : flops);
        std::vector<float> a_tf32, b_tf32;
        if (inputs != Input::f32) {  // the 16-bit values as floats, exactly: the sums in fp32
            a_tf32 = widen_copy(A, inputs, a_rows, a_cols, lda);
            b_tf32 = widen_copy(B, inputs, b_rows, b_cols, ldb);
            a = a_tf32.data();
            b = b_tf32.data();
            a_ld = a_rows;
            b_ld = b_rows;
        } else if (tf32) {
            a_tf32 = tf32_copy(a, a_rows, a_cols, lda);
            b_tf32 = tf32_copy(b, b_rows, b_cols, ldb);
            a = a_tf32.data();
            b = b_tf32.data();
            a_ld = a_rows;
            b_ld = b_rows;
        }
        cblas_sgemm(CblasColMajor, ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                    tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, m, n, k, alpha_value, a, a_ld, b, b_ld,
                    beta_value == 0.0f ? 0.0f : beta_value, C, ldc);
    });
    if (queued != cudaSuccess) {
        cuda_sim::cublas_detail() = cudaGetErrorString(queued);
        return CUBLAS_STATUS_EXECUTION_FAILED;
    }
    return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
    *handle = new cublasContext;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy(cublasHandle_t handle) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->math = mode;
    return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusString(cublasStatus_t status) {
    const char* text = "CUBLAS_STATUS_UNKNOWN_ERROR";
    switch (status) {
        case CUBLAS_STATUS_SUCCESS: text = "CUBLAS_STATUS_SUCCESS"; break;
        case CUBLAS_STATUS_NOT_INITIALIZED: text = "CUBLAS_STATUS_NOT_INITIALIZED"; break;
        case CUBLAS_STATUS_ALLOC_FAILED: text = "CUBLAS_STATUS_ALLOC_FAILED"; break;
        case CUBLAS_STATUS_INVALID_VALUE: text = "CUBLAS_STATUS_INVALID_VALUE"; break;
        case CUBLAS_STATUS_EXECUTION_FAILED: text = "CUBLAS_STATUS_EXECUTION_FAILED"; break;
        case CUBLAS_STATUS_NOT_SUPPORTED: text = "CUBLAS_STATUS_NOT_SUPPORTED"; break;
    }
    thread_local std::string s;
    s = text;
    if (status != CUBLAS_STATUS_SUCCESS && !cuda_sim::cublas_detail().empty()) {
        s += " (CUDA simulator: " + cuda_sim::cublas_detail() + ")";
    }
    return s.c_str();
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
    return gemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc,
                "cublasSgemm");
}

cublasStatus_t cublasSgemmStridedBatched(cublasHandle_t handle, cublasOperation_t transa,
                                         cublasOperation_t transb, int m, int n, int k,
                                         const float* alpha, const float* A, int lda,
                                         long long strideA, const float* B, int ldb,
                                         long long strideB, const float* beta, float* C, int ldc,
                                         long long strideC, int batchCount) {
    if (batchCount < 0) return invalid("cublasSgemmStridedBatched: batchCount < 0");
    for (int b = 0; b < batchCount; ++b) {
        const cublasStatus_t st =
            gemm(handle, transa, transb, m, n, k, alpha, A + b * strideA, lda, B + b * strideB, ldb,
                 beta, C + b * strideC, ldc, "cublasSgemmStridedBatched");
        if (st != CUBLAS_STATUS_SUCCESS) return st;
    }
    return CUBLAS_STATUS_SUCCESS;
}

namespace {
const char* type_name(cudaDataType_t t) {
    switch (t) {
        case CUDA_R_32F: return "CUDA_R_32F";
        case CUDA_R_64F: return "CUDA_R_64F";
        case CUDA_R_16F: return "CUDA_R_16F";
        case CUDA_R_16BF: return "CUDA_R_16BF";
    }
    return "an unknown cudaDataType_t";
}
}  // namespace

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo) {
    if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
    // What is modelled: two inputs of one type (float32, bfloat16 or float16), a float32
    // output, float32 sums. cuBLAS has more (16-bit outputs, 16-bit sums, float64, the FAST
    // compute types that round float32 inputs); the simulator refuses them by name.
    const bool modelled = Atype == Btype &&
                          (Atype == CUDA_R_32F || Atype == CUDA_R_16BF || Atype == CUDA_R_16F) &&
                          Ctype == CUDA_R_32F && computeType == CUBLAS_COMPUTE_32F &&
                          (algo == CUBLAS_GEMM_DEFAULT || algo == CUBLAS_GEMM_DEFAULT_TENSOR_OP);
    if (!modelled) {
        cuda_sim::cublas_detail() =
            std::string("cublasGemmEx: A ") + type_name(Atype) + ", B " + type_name(Btype) + ", C " +
            type_name(Ctype) + ", compute type " + std::to_string(static_cast<int>(computeType)) +
            ", algorithm " + std::to_string(static_cast<int>(algo)) +
            ": the simulator models A and B of one type (CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F), "
            "C in CUDA_R_32F and CUBLAS_COMPUTE_32F with the default algorithm only";
        return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    const Input inputs = Atype == CUDA_R_32F ? Input::f32 : Atype == CUDA_R_16BF ? Input::bf16 : Input::f16;
    return gemm(handle, transa, transb, m, n, k, static_cast<const float*>(alpha), A, lda, B, ldb,
                static_cast<const float*>(beta), static_cast<float*>(C), ldc, "cublasGemmEx", inputs);
}
