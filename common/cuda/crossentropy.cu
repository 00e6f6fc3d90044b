// Softmax and cross-entropy over the vocabulary on the GPU, forward and backward (mirrors
// attn::crossentropy_*).
#include "kernels.cuh"

namespace attn::cuda {
namespace {
using detail::ceil_div;
constexpr int row_block = 128;    // threads per row of logits (V = 65 in the course)
constexpr int mean_block = 1024;  // threads of the single block that averages the losses

// One block per row of logits (BT, V): maximum, Σ exp, probs and −log p[target] from the
// log-sum-exp (log(p) would underflow first).
__global__ void crossentropy_forward_kernel(float* probs, float* losses, const float* logits,
                                            const int* targets, int V) {
    __shared__ float shared[detail::warp_size];
    const std::size_t row = blockIdx.x;
    const float* z = logits + row * V;
    float* p = probs + row * V;
    float maxval = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x) maxval = fmaxf(maxval, z[i]);
    maxval = detail::block_max(maxval, shared);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < V; i += blockDim.x) sum += expf(z[i] - maxval);
    sum = detail::block_sum(sum, shared);
    const float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < V; i += blockDim.x) p[i] = expf(z[i] - maxval) * inv;
    if (threadIdx.x == 0) losses[row] = logf(sum) - (z[targets[row]] - maxval);
}

// mean_loss = Σ losses / BT, one block, each thread striding over the rows, in double; the
// order is fixed, so the same losses give the same bits.
__global__ void mean_kernel(float* mean_loss, const float* losses, int BT) {
    __shared__ double shared[detail::warp_size];
    double acc = 0.0;
    for (int i = threadIdx.x; i < BT; i += blockDim.x) acc += losses[i];
    acc = detail::block_sum(acc, shared);
    if (threadIdx.x == 0) *mean_loss = static_cast<float>(acc / static_cast<double>(BT));
}

// forward: loss = log Σ exp(z) − z[target]; dlogits += (probs − onehot(target)) / BT
__global__ void crossentropy_backward_kernel(float* dlogits, const float* probs,
                                             const int* targets, int BT, int V) {
    const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= static_cast<std::size_t>(BT) * V) return;
    const std::size_t row = i / V;
    const int v = static_cast<int>(i % V);
    const float dloss = 1.0f / static_cast<float>(BT);
    dlogits[i] += dloss * (probs[i] - (v == targets[row] ? 1.0f : 0.0f));
}

void launch_crossentropy_forward(float* probs, float* losses, float* mean_loss,
                                 const float* logits, const int* targets, int BT, int V,
                                 cudaStream_t stream) {
    ATTN_LAUNCH(crossentropy_forward_kernel, BT, row_block, 0, stream)(probs, losses, logits, targets, V);
    CUDA_CHECK(cudaGetLastError());
    ATTN_LAUNCH(mean_kernel, 1, mean_block, 0, stream)(mean_loss, losses, BT);
    CUDA_CHECK(cudaGetLastError());
}

void launch_crossentropy_backward(float* dlogits, const float* probs, const int* targets, int BT,
                                  int V, cudaStream_t stream) {
    const std::size_t n = static_cast<std::size_t>(BT) * V;
    ATTN_LAUNCH(crossentropy_backward_kernel, ceil_div(n, 256), 256, 0, stream)(dlogits, probs, targets,
                                                                         BT, V);
    CUDA_CHECK(cudaGetLastError());
}
}  // namespace

void crossentropy_forward(float* probs, float* losses, float* mean_loss, const float* logits,
                          const int* targets, int B, int T, int V, stream_t stream) {
    launch_crossentropy_forward(probs, losses, mean_loss, logits, targets, B * T, V, stream);
}

void crossentropy_backward(float* dlogits, const float* probs, const int* targets, int B, int T,
                           int V, stream_t stream) {
    launch_crossentropy_backward(dlogits, probs, targets, B * T, V, stream);
}

}  // namespace attn::cuda
