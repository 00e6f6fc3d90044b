// 16-bit storage, float32 arithmetic: the conversions the 16-bit kernels use, and the
// checks their host functions share.
#pragma once

#include "attn/cuda/half_attention.hpp"
#include "kernels.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <initializer_list>
#include <string>

namespace attn::cuda::detail {

__device__ inline float to_float(float x) { return x; }
__device__ inline float to_float(__half x) { return __half2float(x); }
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// float → the storage type, to nearest with ties to even.
template <class T>
__device__ inline T from_float(float x);
template <>
__device__ inline float from_float<float>(float x) {
    return x;
}
template <>
__device__ inline __half from_float<__half>(float x) {
    return __float2half_rn(x);
}
template <>
__device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// The buffers of one 16-bit attention call: one format, each (B, NH, T, hs).
inline void check_half_attention(const char* who, const AttentionShape& s, const HalfBuffer& out,
                                 std::initializer_list<const HalfBuffer*> inputs) {
    check_attention_shape(s);
    require(half_attention_supports(s.hs), std::string(who) + ": the head size must be 64 or 128, got " +
                                               std::to_string(s.hs));
    require(s.B * s.NH <= 65535 && s.T <= (1u << 24),
            std::string(who) + ": B·NH must be at most 65535 and T at most 2^24");
    for (const HalfBuffer* b : inputs) {
        require(b->format() == out.format(),
                std::string(who) + ": q, k, v and out must share one format, got " +
                    precision_name(b->format()) + " and " + precision_name(out.format()));
    }
    for (const HalfBuffer* b : inputs) {
        require(b->size() == s.qkv_size() && out.size() == s.qkv_size(),
                std::string(who) + ": q, k, v and out must hold B·NH·T·hs = " +
                    std::to_string(s.qkv_size()) + " values each");
    }
}

}  // namespace attn::cuda::detail
