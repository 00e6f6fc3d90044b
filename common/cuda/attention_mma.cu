// The 16-bit attention on the tensor cores through PTX's mma.sync, FlashAttention-2's forward
// (the kernel: attention_mma.cuh).
#include "attention_mma.cuh"

#include <string>

namespace attn::cuda {

std::string mma_attention_unsupported(Precision format) {
    int device = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    if (major >= 8) return "";
    return std::string(precision_name(format)) + " mma.sync m16n8k16 needs compute capability 8.0 or newer; " +
           "this GPU has " + std::to_string(major) + "." + std::to_string(minor);
}

void mma_attention_forward(HalfBuffer& out, float* lse, const HalfBuffer& q, const HalfBuffer& k,
                           const HalfBuffer& v, const AttentionShape& shape, void* stream) {
    detail::mma_attention_forward_with<detail::MmaMistake::none>(out, lse, q, k, v, shape, stream);
}

}  // namespace attn::cuda
