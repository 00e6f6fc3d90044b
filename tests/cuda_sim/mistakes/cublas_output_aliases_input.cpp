// rule: cuBLAS's output C may not overlap its inputs A or B (no in-place product)
// refused: cublasSgemm: C overlaps A
#include "mistake.hpp"

#include <vector>

MISTAKE(cublas_output_aliases_input) {
    cublasHandle_t handle = nullptr;
    cublasCreate(&handle);
    float* a = nullptr;
    float* b = nullptr;
    cudaMalloc(&a, 16 * sizeof(float));
    cudaMalloc(&b, 16 * sizeof(float));
    const std::vector<float> host(16, 1.0f);
    cudaMemcpy(a, host.data(), 16 * sizeof(float), cudaMemcpyHostToDevice);
    cudaMemcpy(b, host.data(), 16 * sizeof(float), cudaMemcpyHostToDevice);
    const float one = 1.0f, zero = 0.0f;
    // a = a · b, written over a while it is read
    return mistakes::said(
        cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, a, 4, b, 4, &zero, a, 4));
}
