// The element-wise ops on the GPU: GELU, the residual connection and dropout, forward and
// backward (mirror attn::gelu_*, attn::residual_*, attn::dropout_*).
#include "kernels.cuh"

namespace attn::cuda {
namespace {
using detail::ceil_div;
constexpr int block_size = 256;
constexpr float inv_sqrt2 = 0.70710678118654752f;
constexpr float inv_sqrt_2pi = 0.39894228040143268f;

// Grid-stride loops: a grid capped at a few waves covers any N (size_t) without overflow.
unsigned int grid_for(std::size_t n) {
    const unsigned int blocks = ceil_div(n, block_size);
    return blocks < 65535u * 4u ? (blocks == 0 ? 1u : blocks) : 65535u * 4u;
}
#define ATTN_GRID_STRIDE(i, n)                                                                \
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x)

// out = ½·x·(1 + erf(x/√2))
__global__ void gelu_forward_kernel(float* out, const float* inp, std::size_t N) {
    ATTN_GRID_STRIDE(i, N) {
        const float x = inp[i];
        out[i] = 0.5f * x * (1.0f + erff(x * inv_sqrt2));
    }
}

// forward: out = x·Φ(x); dinp += dout·(Φ(x) + x·φ(x))
__global__ void gelu_backward_kernel(float* dinp, const float* inp, const float* dout,
                                     std::size_t N) {
    ATTN_GRID_STRIDE(i, N) {
        const float x = inp[i];
        const float cdf = 0.5f * (1.0f + erff(x * inv_sqrt2));
        const float pdf = inv_sqrt_2pi * expf(-0.5f * x * x);
        dinp[i] += dout[i] * (cdf + x * pdf);
    }
}

__global__ void residual_forward_kernel(float* out, const float* inp1, const float* inp2,
                                        std::size_t N) {
    ATTN_GRID_STRIDE(i, N) { out[i] = inp1[i] + inp2[i]; }
}

// forward: out = inp1 + inp2
__global__ void residual_backward_kernel(float* dinp1, float* dinp2, const float* dout,
                                         std::size_t N) {
    ATTN_GRID_STRIDE(i, N) {
        dinp1[i] += dout[i];
        dinp2[i] += dout[i];
    }
}

// x *= mask(i), mask = 0 with probability p, else 1/(1 − p); the mask is recomputed from
// (seed, i) by the backward pass, which is the same kernel applied to the gradient.
__global__ void dropout_kernel(float* x, float p, std::uint64_t seed, std::size_t N) {
    const float keep_scale = 1.0f / (1.0f - p);
    ATTN_GRID_STRIDE(i, N) {
        x[i] = dropout_uniform(seed, i) < p ? 0.0f : x[i] * keep_scale;
    }
}
#undef ATTN_GRID_STRIDE

void launch_gelu_forward(float* out, const float* inp, std::size_t N, cudaStream_t stream) {
    ATTN_LAUNCH(gelu_forward_kernel, grid_for(N), block_size, 0, stream)(out, inp, N);
    CUDA_CHECK(cudaGetLastError());
}
void launch_gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t N,
                          cudaStream_t stream) {
    ATTN_LAUNCH(gelu_backward_kernel, grid_for(N), block_size, 0, stream)(dinp, inp, dout, N);
    CUDA_CHECK(cudaGetLastError());
}
void launch_residual_forward(float* out, const float* inp1, const float* inp2, std::size_t N,
                             cudaStream_t stream) {
    ATTN_LAUNCH(residual_forward_kernel, grid_for(N), block_size, 0, stream)(out, inp1, inp2, N);
    CUDA_CHECK(cudaGetLastError());
}
void launch_residual_backward(float* dinp1, float* dinp2, const float* dout, std::size_t N,
                              cudaStream_t stream) {
    ATTN_LAUNCH(residual_backward_kernel, grid_for(N), block_size, 0, stream)(dinp1, dinp2, dout, N);
    CUDA_CHECK(cudaGetLastError());
}
void launch_dropout(float* x, float p, std::uint64_t seed, std::size_t N, cudaStream_t stream) {
    if (p <= 0.0f) return;
    ATTN_LAUNCH(dropout_kernel, grid_for(N), block_size, 0, stream)(x, p, seed, N);
    CUDA_CHECK(cudaGetLastError());
}
}  // namespace

void gelu_forward(float* out, const float* inp, std::size_t N, stream_t stream) {
    launch_gelu_forward(out, inp, N, stream);
}
void gelu_backward(float* dinp, const float* inp, const float* dout, std::size_t N,
                   stream_t stream) {
    launch_gelu_backward(dinp, inp, dout, N, stream);
}
void residual_forward(float* out, const float* inp1, const float* inp2, std::size_t N,
                      stream_t stream) {
    launch_residual_forward(out, inp1, inp2, N, stream);
}
void residual_backward(float* dinp1, float* dinp2, const float* dout, std::size_t N,
                       stream_t stream) {
    launch_residual_backward(dinp1, dinp2, dout, N, stream);
}
void dropout_forward(float* x, float p, std::uint64_t seed, std::size_t N, stream_t stream) {
    launch_dropout(x, p, seed, N, stream);
}
void dropout_backward(float* dx, float p, std::uint64_t seed, std::size_t N, stream_t stream) {
    // forward: x *= mask(seed, i); the same mask applied to the gradient
    launch_dropout(dx, p, seed, N, stream);
}

}  // namespace attn::cuda
