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

// Copies host ints to a new device allocation, freed by the destructor.
struct DeviceInts {
    int* data = nullptr;
    explicit DeviceInts(const std::vector<int>& host) {
        CUDA_CHECK(cudaMalloc(&data, host.size() * sizeof(int)));
        CUDA_CHECK(cudaMemcpy(data, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice));
    }
    ~DeviceInts() { cudaFree(data); }
    DeviceInts(const DeviceInts&) = delete;
    DeviceInts& operator=(const DeviceInts&) = delete;
};

}  // namespace

void paged_attention_forward(float* out, const float* q, int q_stride, const float* key_pool,
                             const float* value_pool, const PagedBatch& batch, int num_blocks,
                             int Bt, int C, int NH, int G, const float* alibi_slopes,
                             stream_t stream) {
    auto fail = [](const std::string& what) { throw std::invalid_argument("paged attention: " + what); };
    const int S = static_cast<int>(batch.first.size());
    if (NH <= 0 || G <= 0 || NH % G != 0 || C % NH != 0 || Bt <= 0 || num_blocks <= 0 || q_stride < C)
        fail("need NH, G, Bt and the blocks positive, G dividing NH, NH dividing C and q_stride ≥ C");
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
    const DeviceInts tables(batch.tables), first(batch.first), pos(batch.pos);
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    const dim3 grid(static_cast<unsigned>(NH), static_cast<unsigned>(S));
    ATTN_LAUNCH(paged_attention_kernel, grid, paged_threads, bytes, stream)(
        out, q, q_stride, key_pool, value_pool, tables.data, batch.max_blocks, first.data, pos.data,
        C, NH, G, Bt, hs, scale, alibi_slopes);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cudaStreamSynchronize(stream));  // the tables are freed on return
}

}  // namespace attn::cuda
