// One new token's attention over a layer's cached keys and values (lesson 14 on the GPU):
// per head, the scores of its query against every cached key, their softmax, and the blend
// of the cached values. One block per head; the weights wait in shared memory.
#include "kernels.cuh"

#include <cmath>
#include <string>

namespace attn::cuda {
namespace {

constexpr int step_threads = 256;

// out[h·hs + d] = Σ_j softmax_j(scale · q_h · K_h[j]) · V_h[j][d], j < T.
__global__ void cached_attention_kernel(float* out, const float* q, const float* key_cache,
                                        const float* value_cache, int T, int capacity, int hs,
                                        float scale) {
    ATTN_DYNAMIC_SHARED(float, smem);
    float* w = smem;          // (T) scores, then their exponentials
    float* reduce = smem + T;  // (32) the block reductions' partials
    const int h = blockIdx.x;
    const float* qh = q + static_cast<std::size_t>(h) * hs;
    const float* K = key_cache + static_cast<std::size_t>(h) * capacity * hs;
    const float* V = value_cache + static_cast<std::size_t>(h) * capacity * hs;

    float row_max = -INFINITY;
    for (int j = threadIdx.x; j < T; j += blockDim.x) {
        float s = 0.0f;
        for (int d = 0; d < hs; ++d) s = fmaf(qh[d], K[static_cast<std::size_t>(j) * hs + d], s);
        w[j] = s * scale;
        row_max = fmaxf(row_max, w[j]);
    }
    row_max = detail::block_max(row_max, reduce);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < T; j += blockDim.x) {
        w[j] = expf(w[j] - row_max);
        sum += w[j];
    }
    sum = detail::block_sum(sum, reduce);  // its barriers also publish every w[j]
    const float inv = 1.0f / sum;
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < T; ++j) acc = fmaf(w[j], V[static_cast<std::size_t>(j) * hs + d], acc);
        out[static_cast<std::size_t>(h) * hs + d] = acc * inv;
    }
}

}  // namespace

void cached_attention_forward(float* out, const float* q, const float* key_cache,
                              const float* value_cache, int T, int capacity, int C, int NH,
                              stream_t stream) {
    if (NH <= 0 || C % NH != 0 || T <= 0 || T > capacity) {
        throw std::invalid_argument("cached attention: need 1 <= T <= capacity and NH dividing C; got T = " +
                                    std::to_string(T) + ", capacity = " + std::to_string(capacity) +
                                    ", C = " + std::to_string(C) + ", NH = " + std::to_string(NH));
    }
    const int hs = C / NH;
    const std::size_t bytes = (static_cast<std::size_t>(T) + detail::warp_size) * sizeof(float);
    if (bytes > 48 * 1024) {
        throw std::invalid_argument("cached attention: " + std::to_string(T) +
                                    " positions do not fit in 48 KiB of shared memory");
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    ATTN_LAUNCH(cached_attention_kernel, static_cast<unsigned>(NH), step_threads, bytes, stream)(
        out, q, key_cache, value_cache, T, capacity, hs, scale);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace attn::cuda
