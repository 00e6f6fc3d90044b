// rule: a WMMA fragment's element order is unspecified: a causal mask cannot pick an accumulator's elements by index
// refused: masked_scores (launched at wmma_mask_by_position.cpp:44): the result depends on which lane holds which element of a WMMA fragment
#include "cuda_sim_wmma.hpp"
#include "mistake.hpp"

#include <vector>

using namespace nvcuda;

namespace {
// S = Q·K on the tensor cores, then the causal mask applied in the registers: each lane
// works out which (row, column) its element e is from a layout read off one GPU's
// documentation (lane l holds row l/2, columns 8·(l%2) + e) and sets the future to -inf.
// Another GPU holds the elements elsewhere and the mask falls on the wrong ones. The way
// that works: store S and mask it in memory, where the positions are known.
__global__ void masked_scores(const __half* q, const __half* k, float* s) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> q_frag;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> k_frag;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag;
    wmma::load_matrix_sync(q_frag, q, 16);
    wmma::load_matrix_sync(k_frag, k, 16);
    wmma::fill_fragment(s_frag, 0.0f);
    wmma::mma_sync(s_frag, q_frag, k_frag, s_frag);
    const int lane = static_cast<int>(threadIdx.x % 32);
    for (int e = 0; e < s_frag.num_elements; ++e) {
        const int row = lane / 2, col = 8 * (lane % 2) + e;
        if (col > row) s_frag.x[e] = -INFINITY;
    }
    wmma::store_matrix_sync(s, s_frag, 16, wmma::mem_row_major);
}
}  // namespace

MISTAKE(wmma_mask_by_position) {
    // The race check runs the launch twice, with the fragment layouts drawn twice.
    cuda_sim::set_racecheck(true);
    __half *q = nullptr, *k = nullptr;
    float* s = nullptr;
    cudaMalloc(&q, 256 * sizeof(__half));
    cudaMalloc(&k, 256 * sizeof(__half));
    cudaMalloc(&s, 256 * sizeof(float));
    std::vector<__half> ones(256, __float2half(1.0f));
    for (__half* p : {q, k}) cudaMemcpy(p, ones.data(), 256 * sizeof(__half), cudaMemcpyHostToDevice);
    // One warp.
    ATTN_LAUNCH(masked_scores, 1, 32, 0, nullptr)(q, k, s);
    return mistakes::said(cudaDeviceSynchronize());
}
