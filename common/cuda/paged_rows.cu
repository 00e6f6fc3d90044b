// Lesson 20's batched step on the GPU, what it needs besides the GPT's layers: rows of many
// sequences at their own positions (embeddings, RoPE) and their keys and values stored in a
// paged pool through the slots the CPU's block tables gave them.
#include "attn/cuda/paged_attention.hpp"

#include "kernels.cuh"

namespace attn::cuda {
namespace {
using detail::ceil_div;
constexpr int rows_threads = 256;

// out[r, c] = wte[tokens[r], c] + wpe[positions[r], c]; one thread per element of out (R, C).
__global__ void rows_encoder_kernel(float* out, const int* tokens, const int* positions,
                                    const float* wte, const float* wpe, int R, int C) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<std::size_t>(R) * C) return;
    const std::size_t r = i / C, c = i % C;
    const float e = wte[static_cast<std::size_t>(tokens[r]) * C + c];
    out[i] = wpe ? e + wpe[static_cast<std::size_t>(positions[r]) * C + c] : e;
}

// One thread per (row, head of q or k, pair i): (x₀, x₁) ← (x₀·cos − x₁·sin, x₀·sin + x₁·cos).
__global__ void rows_rope_kernel(float* qkv, const int* positions, const float* cos_sin, int R,
                                 int C, int NH, int G, int hs) {
    const int pairs = hs / 2, heads = NH + G;
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<std::size_t>(R) * heads * pairs) return;
    const int p = static_cast<int>(i % pairs);
    const int h = static_cast<int>(i / pairs % heads);
    const std::size_t r = i / pairs / heads;
    const std::size_t width = static_cast<std::size_t>(C) + 2 * static_cast<std::size_t>(G) * hs;
    // q heads at h·hs, then the G key heads from C on
    float* x = qkv + r * width + (h < NH ? static_cast<std::size_t>(h) * hs
                                         : static_cast<std::size_t>(C) + static_cast<std::size_t>(h - NH) * hs) + 2 * p;
    const float* cs = cos_sin + (static_cast<std::size_t>(positions[r]) * pairs + p) * 2;
    const float c = cs[0], s = cs[1], x0 = x[0], x1 = x[1];
    x[0] = x0 * c - x1 * s;
    x[1] = x0 * s + x1 * c;
}

// One thread per (row, key/value head, d): the key's and the value's float to (block, g,
// offset, d) of the pools.
__global__ void rows_store_kernel(float* key_pool, float* value_pool, const float* qkv,
                                  const int* slots, int R, int C, int G, int hs, int Bt) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::size_t per_row = static_cast<std::size_t>(G) * hs;
    if (i >= static_cast<std::size_t>(R) * per_row) return;
    const std::size_t r = i / per_row, j = i % per_row;  // j = g·hs + d
    const std::size_t g = j / hs, d = j % hs;
    const std::size_t block = static_cast<std::size_t>(slots[2 * r]);
    const std::size_t offset = static_cast<std::size_t>(slots[2 * r + 1]);
    const std::size_t at = ((block * G + g) * Bt + offset) * hs + d;
    const float* row = qkv + r * (static_cast<std::size_t>(C) + 2 * per_row);
    key_pool[at] = row[C + j];
    value_pool[at] = row[C + per_row + j];
}

}  // namespace

void rows_encoder_forward(float* out, const int* tokens, const int* positions, const float* wte,
                          const float* wpe, int R, int C, stream_t stream) {
    const std::size_t n = static_cast<std::size_t>(R) * C;
    ATTN_LAUNCH(rows_encoder_kernel, ceil_div(n, rows_threads), rows_threads, 0, stream)(
        out, tokens, positions, wte, wpe, R, C);
    CUDA_CHECK(cudaGetLastError());
}

void rows_rope_forward(float* qkv, const int* positions, const float* cos_sin, int R, int C,
                       int NH, int G, stream_t stream) {
    const int hs = C / NH;
    const std::size_t n = static_cast<std::size_t>(R) * (NH + G) * (hs / 2);
    ATTN_LAUNCH(rows_rope_kernel, ceil_div(n, rows_threads), rows_threads, 0, stream)(
        qkv, positions, cos_sin, R, C, NH, G, hs);
    CUDA_CHECK(cudaGetLastError());
}

void rows_store_keys_values(float* key_pool, float* value_pool, const float* qkv, const int* slots,
                            int R, int C, int G, int hs, int Bt, stream_t stream) {
    const std::size_t n = static_cast<std::size_t>(R) * G * hs;
    ATTN_LAUNCH(rows_store_kernel, ceil_div(n, rows_threads), rows_threads, 0, stream)(
        key_pool, value_pool, qkv, slots, R, C, G, hs, Bt);
    CUDA_CHECK(cudaGetLastError());
}

}  // namespace attn::cuda
