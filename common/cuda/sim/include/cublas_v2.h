// The CUDA simulator's cuBLAS, on OpenBLAS (see ../cuda_sim.hpp).
#pragma once
#include "../cuda_sim.hpp"

// cublasGemmEx's types, with CUDA's values (library_types.h and cublas_api.h).
enum cudaDataType_t {
    CUDA_R_32F = 0,
    CUDA_R_64F = 1,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
};
using cudaDataType = cudaDataType_t;
enum cublasComputeType_t {
    CUBLAS_COMPUTE_16F = 64,
    CUBLAS_COMPUTE_32F = 68,
    CUBLAS_COMPUTE_32F_PEDANTIC = 69,
    CUBLAS_COMPUTE_64F = 70,
    CUBLAS_COMPUTE_32F_FAST_16F = 74,
    CUBLAS_COMPUTE_32F_FAST_16BF = 75,
    CUBLAS_COMPUTE_32F_FAST_TF32 = 77,
};
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1, CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99 };

// C (m×n, float32) = alpha·op(A)·op(B) + beta·C with A and B both CUDA_R_16BF or both
// CUDA_R_16F, or both CUDA_R_32F, and CUBLAS_COMPUTE_32F: each 16-bit input read exactly
// (a product of two is exact in float32) and the products summed in float32, as the tensor
// cores do. alpha and beta are floats. Any other combination of types is
// CUBLAS_STATUS_NOT_SUPPORTED, naming it.
cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType_t Atype, int lda, const void* B,
                            cudaDataType_t Btype, int ldb, const void* beta, void* C,
                            cudaDataType_t Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t algo);
