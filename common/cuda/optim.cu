// AdamW and gradient-norm clipping on the GPU (mirror attn::AdamW::step and
// attn::clip_grad_norm); neither reads anything back to the host.
#include "kernels.cuh"

#include <cmath>

namespace attn::cuda {
namespace {
using detail::ceil_div;
constexpr int block_size = 256;
constexpr int norm_blocks = 512;  // partial sums of squares; clip_scratch_size() holds them

// torch's single-tensor AdamW, operation for operation, as the CPU's AdamW::step.
__global__ void adamw_kernel(float* params, const float* grads, float* m, float* v,
                             std::size_t n, float decay, float beta1, float beta2, float eps,
                             float step_size, float bias_correction2_sqrt) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = grads[i];
    float p = params[i] * decay;
    const float mi = m[i] * beta1 + (1.0f - beta1) * g;
    const float vi = v[i] * beta2 + (1.0f - beta2) * g * g;
    const float denom = sqrtf(vi) / bias_correction2_sqrt + eps;
    p -= step_size * mi / denom;
    m[i] = mi;
    v[i] = vi;
    params[i] = p;
}

// partial[block] = Σ grads² over a grid-stride slice, in double.
__global__ void sum_squares_kernel(double* partial, const float* grads, std::size_t n) {
    __shared__ double shared[detail::warp_size];
    double acc = 0.0;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        acc += static_cast<double>(grads[i]) * grads[i];
    }
    acc = detail::block_sum(acc, shared);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// norm = √(Σ partial), one block, summed in a fixed order.
__global__ void finish_norm_kernel(float* norm, const double* partial, int count) {
    __shared__ double shared[detail::warp_size];
    double acc = 0.0;
    for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = detail::block_sum(acc, shared);
    if (threadIdx.x == 0) *norm = static_cast<float>(sqrt(acc));
}

// attn::clip_grad_norm's rule: grads *= max_norm / (norm + 1e-6) when that is < 1, the norm
// finite and max_norm > 0 (the launch is skipped otherwise); a NaN or infinite norm leaves
// the gradients as they are.
__global__ void scale_gradients_kernel(float* grads, const float* norm, std::size_t n,
                                       float max_norm) {
    const float total = *norm;
    if (!(total <= 3.402823466e38f)) return;  // NaN or +inf: not finite (FLT_MAX)
    const float coef = max_norm / (total + 1e-6f);
    if (!(coef < 1.0f)) return;
    for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
         i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
        grads[i] *= coef;
    }
}

void launch_adamw(float* params, const float* grads, float* m, float* v, std::size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, long step,
                  cudaStream_t stream) {
    if (n == 0) return;
    // The scalars exactly as the CPU computes them (double, then float).
    const double bias_correction1 = 1.0 - std::pow(static_cast<double>(beta1), step);
    const double bias_correction2 = 1.0 - std::pow(static_cast<double>(beta2), step);
    const float step_size = static_cast<float>(lr / bias_correction1);
    const float bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
    const float decay = 1.0f - lr * weight_decay;
    ATTN_LAUNCH(adamw_kernel, ceil_div(n, block_size), block_size, 0, stream)(
        params, grads, m, v, n, decay, beta1, beta2, eps, step_size, bias_correction2_sqrt);
    CUDA_CHECK(cudaGetLastError());
}

void launch_clip(float* grads, float* norm, float* scratch, std::size_t n, float max_norm,
                 cudaStream_t stream) {
    double* partial = reinterpret_cast<double*>(scratch);
    ATTN_LAUNCH(sum_squares_kernel, norm_blocks, block_size, 0, stream)(partial, grads, n);
    CUDA_CHECK(cudaGetLastError());
    ATTN_LAUNCH(finish_norm_kernel, 1, norm_blocks, 0, stream)(norm, partial, norm_blocks);
    CUDA_CHECK(cudaGetLastError());
    if (max_norm > 0.0f) {
        ATTN_LAUNCH(scale_gradients_kernel, norm_blocks, block_size, 0, stream)(grads, norm, n, max_norm);
        CUDA_CHECK(cudaGetLastError());
    }
}
}  // namespace

void adamw_update(float* params, const float* grads, float* m, float* v, std::size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, long step,
                  stream_t stream) {
    launch_adamw(params, grads, m, v, n, lr, beta1, beta2, eps, weight_decay, step, stream);
}

void clip_grad_norm(float* grads, float* norm, float* scratch, std::size_t n, float max_norm,
                    stream_t stream) {
    launch_clip(grads, norm, scratch, n, max_norm, stream);
}

std::size_t clip_scratch_size() { return 2 * static_cast<std::size_t>(norm_blocks); }

}  // namespace attn::cuda
