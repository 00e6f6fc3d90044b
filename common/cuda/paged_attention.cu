// Lesson 20 on the GPU: one new query per sequence over its keys and values in a paged
// pool. As decode.cu's cached attention, with each key's and value's row found through the
// sequence's block table.
#include "attn/cuda/paged_attention.hpp"

#include "check.cuh"
#include "kernels.cuh"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace attn::cuda {
namespace {

constexpr int paged_threads = 128;

// Block (h, s): out[s, h] = Σ_j softmax_j(scale · q_{s,h} · K[j] + bias_j) · V[j] over the
// positions first[s] … pos[s], K[j] and V[j] read through tables[s].
__global__ void paged_attention_kernel(float* out, const float* q, int q_stride,
                                       const float* key_pool, const float* value_pool,
                                       const int* tables, int max_blocks, const int* first,
                                       const int* pos, int C, int NH, int G, int Bt, int hs,
                                       float scale, const float* slopes) {
    ATTN_DYNAMIC_SHARED(float, smem);
    const int h = blockIdx.x, s = blockIdx.y;
    const int p0 = first[s], T = pos[s] - p0 + 1;
    float* w = smem;           // (T) scores, then their exponentials
    float* reduce = smem + T;  // (32) the block reductions' partials
    const int g = h / (NH / G);  // the key/value head of h's group
    const float* qh = q + static_cast<std::size_t>(s) * q_stride + static_cast<std::size_t>(h) * hs;
    const int* table = tables + static_cast<std::size_t>(s) * max_blocks;
    const float slope = slopes ? slopes[h] : 0.0f;

    float row_max = -INFINITY;
    for (int j = threadIdx.x; j < T; j += blockDim.x) {
        const int p = p0 + j;
        const float* k = key_pool + ((static_cast<std::size_t>(table[p / Bt]) * G + g) * Bt + p % Bt) * hs;
        float score = 0.0f;
        for (int d = 0; d < hs; ++d) score = fmaf(qh[d], k[d], score);
        score *= scale;
        if (slope != 0.0f) score += slope * static_cast<float>(j - (T - 1));  // ALiBi: distance back
        w[j] = score;
        row_max = fmaxf(row_max, score);
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
        for (int j = 0; j < T; ++j) {
            const int p = p0 + j;
            const float* v = value_pool + ((static_cast<std::size_t>(table[p / Bt]) * G + g) * Bt + p % Bt) * hs;
            acc = fmaf(w[j], v[d], acc);
        }
        out[static_cast<std::size_t>(s) * C + static_cast<std::size_t>(h) * hs + d] = acc * inv;
    }
}

}  // namespace

DevicePagedBatch::~DevicePagedBatch() { cudaFree(ints_); }

void DevicePagedBatch::upload(const PagedBatch& batch, int num_blocks, int Bt) {
    auto fail = [](const std::string& what) { throw std::invalid_argument("paged attention: " + what); };
    const int S = static_cast<int>(batch.first.size());
    if (Bt <= 0 || num_blocks <= 0) fail("need Bt and the blocks positive");
    if (S <= 0 || batch.pos.size() != batch.first.size() || batch.max_blocks <= 0 ||
        batch.tables.size() != static_cast<std::size_t>(S) * batch.max_blocks)
        fail("the batch needs a first and a pos per sequence and a table of max_blocks entries each");
    int longest = 0;
    for (int s = 0; s < S; ++s) {
        const int f = batch.first[static_cast<std::size_t>(s)], p = batch.pos[static_cast<std::size_t>(s)];
        if (f < 0 || f > p || p / Bt >= batch.max_blocks)
            fail("sequence " + std::to_string(s) + ": positions " + std::to_string(f) + " … " +
                 std::to_string(p) + " are not a range inside its table");
        for (int b = f / Bt; b <= p / Bt; ++b) {
            const int block = batch.tables[static_cast<std::size_t>(s) * batch.max_blocks + b];
            if (block < 0 || block >= num_blocks)
                fail("sequence " + std::to_string(s) + ": table entry " + std::to_string(b) + " is block " +
                     std::to_string(block) + ", outside the pool of " + std::to_string(num_blocks));
        }
        longest = std::max(longest, p - f + 1);
    }
    const std::size_t bytes = (static_cast<std::size_t>(longest) + detail::warp_size) * sizeof(float);
    if (bytes > 48 * 1024)
        fail(std::to_string(longest) + " positions do not fit in 48 KiB of shared memory");
    std::vector<int> host(batch.tables);
    host.insert(host.end(), batch.first.begin(), batch.first.end());
    host.insert(host.end(), batch.pos.begin(), batch.pos.end());
    CUDA_CHECK(cudaDeviceSynchronize());  // no launch of the previous step still reads them
    if (host.size() > capacity_) {
        cudaFree(ints_);
        ints_ = nullptr;
        capacity_ = 0;
        CUDA_CHECK(cudaMalloc(&ints_, host.size() * sizeof(int)));
        capacity_ = host.size();
    }
    CUDA_CHECK(cudaMemcpy(ints_, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice));
    S_ = S;
    max_blocks_ = batch.max_blocks;
    num_blocks_ = num_blocks;
    longest_ = longest;
}

void paged_attention_forward(float* out, const float* q, int q_stride, const float* key_pool,
                             const float* value_pool, const DevicePagedBatch& batch, int Bt, int C,
                             int NH, int G, const float* alibi_slopes, stream_t stream) {
    if (NH <= 0 || G <= 0 || NH % G != 0 || C % NH != 0 || Bt <= 0 || q_stride < C || batch.sequences() <= 0)
        throw std::invalid_argument("paged attention: need NH, G and Bt positive, G dividing NH, NH "
                                    "dividing C, q_stride ≥ C and an uploaded batch");
    const std::size_t bytes = (static_cast<std::size_t>(batch.longest()) + detail::warp_size) * sizeof(float);
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const dim3 grid(static_cast<unsigned>(NH), static_cast<unsigned>(batch.sequences()));
    ATTN_LAUNCH(paged_attention_kernel, grid, paged_threads, bytes, stream)(
        out, q, q_stride, key_pool, value_pool, batch.tables(), batch.max_blocks(), batch.first(),
        batch.pos(), C, NH, G, Bt, hs, scale, alibi_slopes);
    CUDA_CHECK(cudaGetLastError());
}

void paged_attention_forward(float* out, const float* q, int q_stride, const float* key_pool,
                             const float* value_pool, const PagedBatch& batch, int num_blocks,
                             int Bt, int C, int NH, int G, const float* alibi_slopes,
                             stream_t stream) {
    if (NH <= 0 || G <= 0 || NH % G != 0 || C % NH != 0 || Bt <= 0 || num_blocks <= 0 || q_stride < C)
        throw std::invalid_argument("paged attention: need NH, G, Bt and the blocks positive, G "
                                    "dividing NH, NH dividing C and q_stride ≥ C");
    DevicePagedBatch uploaded;
    uploaded.upload(batch, num_blocks, Bt);
    paged_attention_forward(out, q, q_stride, key_pool, value_pool, uploaded, Bt, C, NH, G,
                            alibi_slopes, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));  // the tables are freed on return
}

}  // namespace attn::cuda
