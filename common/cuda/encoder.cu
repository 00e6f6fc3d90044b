// Token + position embedding on the GPU, forward and backward (mirrors attn::encoder_*).
#include "kernels.cuh"

namespace attn::cuda {
namespace {
using detail::ceil_div;

// out[b,t,c] = wte[inp[b,t],c] + wpe[t,c]; one thread per element of out (B, T, C).
__global__ void encoder_forward_kernel(float* out, const int* inp, const float* wte,
                                       const float* wpe, int B, int T, int C) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::size_t n = static_cast<std::size_t>(B) * T * C;
    if (i >= n) return;
    const std::size_t bt = i / C;
    const int c = static_cast<int>(i % C);
    const int t = static_cast<int>(bt % T);
    out[i] = wte[static_cast<std::size_t>(inp[bt]) * C + c] + wpe[static_cast<std::size_t>(t) * C + c];
}

// forward: out_bt[c] = wte[inp[bt], c] + ...
// dwte[v, c] += Σ_{bt: inp[bt] = v} dout[bt, c]. Block (128) × grid (V, C/128): each
// thread owns one (v, c) and walks every position in order, the ids staged through shared
// memory 128 at a time. No atomics, so the sum's order and its bits are fixed. The token id
// runs along the grid's x, which allows 2^31 − 1 blocks (y and z allow 65 535: a vocabulary
// such as GPT-2's 50 257 fits there, Llama 3's 128 256 does not).
constexpr int encoder_tile = 128;
__global__ void encoder_backward_wte_kernel(float* dwte, const float* dout, const int* inp,
                                            int BT, int C) {
    __shared__ int ids[encoder_tile];
    const int v = blockIdx.x;
    const int c = blockIdx.y * encoder_tile + threadIdx.x;
    float acc = 0.0f;
    for (int start = 0; start < BT; start += encoder_tile) {
        const int n = min(encoder_tile, BT - start);
        __syncthreads();  // the previous tile is no longer read
        if (static_cast<int>(threadIdx.x) < n) ids[threadIdx.x] = inp[start + threadIdx.x];
        __syncthreads();
        if (c < C) {
            for (int j = 0; j < n; ++j) {
                if (ids[j] == v) acc += dout[static_cast<std::size_t>(start + j) * C + c];
            }
        }
    }
    if (c < C && acc != 0.0f) dwte[static_cast<std::size_t>(v) * C + c] += acc;
}

// forward: out_bt[c] = ... + wpe[t, c]
// dwpe[t, c] += Σ_b dout[b, t, c]; one thread per (t, c), batches in order.
__global__ void encoder_backward_wpe_kernel(float* dwpe, const float* dout, int B, int T, int C) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<std::size_t>(T) * C) return;
    float acc = 0.0f;
    for (int b = 0; b < B; ++b) acc += dout[static_cast<std::size_t>(b) * T * C + i];
    dwpe[i] += acc;
}

void launch_encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B,
                            int T, int C, cudaStream_t stream) {
    const std::size_t n = static_cast<std::size_t>(B) * T * C;
    const int block = 256;
    ATTN_LAUNCH(encoder_forward_kernel, ceil_div(n, block), block, 0, stream)(out, inp, wte, wpe, B, T, C);
    CUDA_CHECK(cudaGetLastError());
}

void launch_encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B,
                             int T, int C, int V, cudaStream_t stream) {
    const dim3 grid(V, ceil_div(C, encoder_tile));
    ATTN_LAUNCH(encoder_backward_wte_kernel, grid, encoder_tile, 0, stream)(dwte, dout, inp, B * T, C);
    CUDA_CHECK(cudaGetLastError());
    const int block = 256;
    ATTN_LAUNCH(encoder_backward_wpe_kernel, ceil_div(static_cast<std::size_t>(T) * C, block), block, 0,
                                  stream)(dwpe, dout, B, T, C);
    CUDA_CHECK(cudaGetLastError());
}
}  // namespace

void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                     int C, stream_t stream) {
    launch_encoder_forward(out, inp, wte, wpe, B, T, C, stream);
}

void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T,
                      int C, int V, stream_t stream) {
    launch_encoder_backward(dwte, dwpe, dout, inp, B, T, C, V, stream);
}

}  // namespace attn::cuda
