// rule: a WMMA fragment's element order is unspecified: an accumulator's elements are not a matrix_a fragment's
// refused: wmma::mma_sync at wmma_accumulator_as_matrix_a.cpp:32: matrix_a element (
#include "cuda_sim_wmma.hpp"
#include "mistake.hpp"

#include <vector>

using namespace nvcuda;

namespace {
// S = Q·K, then O = S·V on the tensor cores without S leaving the registers: the
// accumulator's elements copied into a matrix_a fragment by index, as if the two kinds
// held the same elements in the same order. On a GPU they do not (an accumulator holds 8
// floats a lane, a 16-bit matrix_a fragment 16 halves, in another order): O is wrong.
// The way that works: store S to shared memory and load it as matrix_a.
__global__ void chained_products(const __half* q, const __half* k, const __half* v, float* o) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> q_frag;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> k_frag;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> v_frag;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_frag;
    wmma::load_matrix_sync(q_frag, q, 16);
    wmma::load_matrix_sync(k_frag, k, 16);
    wmma::load_matrix_sync(v_frag, v, 16);
    wmma::fill_fragment(s_frag, 0.0f);
    wmma::fill_fragment(o_frag, 0.0f);
    wmma::mma_sync(s_frag, q_frag, k_frag, s_frag);

    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> p_frag;
    wmma::fill_fragment(p_frag, 0.0f);
    for (int e = 0; e < s_frag.num_elements; ++e) p_frag.x[e] = __float2half(s_frag.x[e]);
    wmma::mma_sync(o_frag, p_frag, v_frag, o_frag);
    wmma::store_matrix_sync(o, o_frag, 16, wmma::mem_row_major);
}
}  // namespace

MISTAKE(wmma_accumulator_as_matrix_a) {
    __half *q = nullptr, *k = nullptr, *v = nullptr;
    float* o = nullptr;
    cudaMalloc(&q, 256 * sizeof(__half));
    cudaMalloc(&k, 256 * sizeof(__half));
    cudaMalloc(&v, 256 * sizeof(__half));
    cudaMalloc(&o, 256 * sizeof(float));
    std::vector<__half> ones(256, __float2half(1.0f));
    for (__half* p : {q, k, v}) cudaMemcpy(p, ones.data(), 256 * sizeof(__half), cudaMemcpyHostToDevice);
    // One warp.
    ATTN_LAUNCH(chained_products, 1, 32, 0, nullptr)(q, k, v, o);
    return mistakes::said(cudaDeviceSynchronize());
}
