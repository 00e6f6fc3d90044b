#include "attn/linalg.hpp"

#include <cblas.h>

namespace attn {

namespace {
// Row-major sgemm on contiguous buffers: C (M, N) = A (M, K) · op(B).
void gemm(bool b_transposed, std::size_t M, std::size_t N, std::size_t K, const float* a,
          const float* b, float* c) {
    if (M == 0 || N == 0) return;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, b_transposed ? CblasTrans : CblasNoTrans,
                static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), 1.0f, a,
                static_cast<int>(K), b, static_cast<int>(b_transposed ? K : N), 0.0f, c,
                static_cast<int>(N));
}
}  // namespace

Tensor2 matmul(const Tensor2& a, const Tensor2& b) {
    require(a.shape()[1] == b.shape()[0],
            "matmul: inner sizes differ: a " + shape_of(a) + ", b " + shape_of(b));
    Tensor2 c({a.shape()[0], b.shape()[1]});
    gemm(false, a.shape()[0], b.shape()[1], a.shape()[1], a.data(), b.data(), c.data());
    return c;
}

Tensor2 matmul_transposed(const Tensor2& a, const Tensor2& b) {
    require(a.shape()[1] == b.shape()[1],
            "matmul_transposed: inner sizes differ: a " + shape_of(a) + ", b " + shape_of(b));
    Tensor2 c({a.shape()[0], b.shape()[0]});
    gemm(true, a.shape()[0], b.shape()[0], a.shape()[1], a.data(), b.data(), c.data());
    return c;
}

Tensor3 batched_matmul_transposed(const Tensor3& a, const Tensor3& b) {
    require(a.shape()[0] == b.shape()[0] && a.shape()[2] == b.shape()[2],
            "batched_matmul_transposed: shapes do not fit: a " + shape_of(a) + ", b " +
                shape_of(b));
    const std::size_t B = a.shape()[0], M = a.shape()[1], N = b.shape()[1], K = a.shape()[2];
    Tensor3 c({B, M, N});
    for (std::size_t i = 0; i < B; ++i)
        gemm(true, M, N, K, a.data() + i * M * K, b.data() + i * N * K, c.data() + i * M * N);
    return c;
}

Tensor3 batched_matmul(const Tensor3& a, const Tensor3& b) {
    require(a.shape()[0] == b.shape()[0] && a.shape()[2] == b.shape()[1],
            "batched_matmul: shapes do not fit: a " + shape_of(a) + ", b " + shape_of(b));
    const std::size_t B = a.shape()[0], M = a.shape()[1], N = b.shape()[2], K = a.shape()[2];
    Tensor3 c({B, M, N});
    for (std::size_t i = 0; i < B; ++i)
        gemm(false, M, N, K, a.data() + i * M * K, b.data() + i * K * N, c.data() + i * M * N);
    return c;
}

}  // namespace attn
