/// @file half_attention.hpp
/// @brief Fused attention on 16-bit data (float16 or bfloat16) on the GPU: q, k, v and the
/// output stored in 16 bits, the statistics (each row's running maximum and sum) and the
/// output accumulator in float32, as FlashAttention keeps them. Three kernels compute it:
///
/// - flash_attention_forward_16bit: lesson 13's forward kernel with 16-bit loads and
///   stores, its products and softmax in float32 on the CUDA cores;
/// - wmma_attention_forward: the two products S = Q Kᵀ and O += P V on the tensor cores
///   through CUDA's WMMA API (16×16×16 tiles, 16-bit inputs, float32 accumulation), P
///   rounded to the inputs' format before its product;
/// - mma_attention_forward: FlashAttention-2's forward on PTX's mma.sync m16n8k16, S, P
///   and O in registers (their layouts are documented), P reused from S's accumulator
///   registers as the A operand of P V.
///
/// A plain header (no CUDA types). Layouts are flash.hpp's: q, k, v, out (B, NH, T, hs),
/// lse (B, NH, T); the scores are scaled by 1/√hs; causal or not. `stream` is a
/// `cudaStream_t` as `void*` (null: the default stream). The functions enqueue work and
/// return; a bad argument throws std::invalid_argument before any launch.
#pragma once

#include "attn/flash.hpp"
#include "attn/precision.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace attn::cuda {

/// `n` 16-bit floating-point values (float16 or bfloat16) in device memory, owned; freed by
/// the destructor. Movable, not copyable.
class HalfBuffer {
public:
    /// Allocates n values of `format` (uninitialised).
    /// @throws std::invalid_argument unless format is bf16 or fp16
    /// @throws std::runtime_error with CUDA's error text if the allocation fails
    HalfBuffer(std::size_t n, Precision format);
    /// Allocates and fills with `host` rounded to the format (to nearest, ties to even:
    /// attn::float_to_float16_bits, attn::float_to_bfloat16_bits).
    HalfBuffer(const std::vector<float>& host, Precision format);
    ~HalfBuffer();
    HalfBuffer(HalfBuffer&& other) noexcept;             ///< takes other's memory
    HalfBuffer& operator=(HalfBuffer&& other) noexcept;  ///< frees ours, takes other's
    HalfBuffer(const HalfBuffer&) = delete;
    HalfBuffer& operator=(const HalfBuffer&) = delete;

    std::uint16_t* data() { return data_; }              ///< the device pointer
    const std::uint16_t* data() const { return data_; }  ///< the device pointer
    std::size_t size() const { return size_; }           ///< number of values
    Precision format() const { return format_; }         ///< bf16 or fp16

    /// Copies `host` (size() values), rounded to the format, to the device, after all work
    /// queued on the device, on every stream, has finished.
    void upload(const std::vector<float>& host);
    /// The values as floats (exact), after all work queued on the device, on every stream
    /// (non-blocking ones too), has finished.
    std::vector<float> download() const;

private:
    std::uint16_t* data_ = nullptr;
    std::size_t size_ = 0;
    Precision format_ = Precision::fp16;
};

/// Whether the 16-bit kernels support this head size (64 and 128, as the float32 ones).
bool half_attention_supports(std::size_t hs);

/// Fused attention forward on 16-bit q, k, v: lesson 13's kernel (tiles of 64 queries and
/// 64 keys, online softmax, causal tiles skipped) with the tiles converted to float32 as
/// they are loaded, and the output rounded to the format as it is stored.
/// @param out   (B, NH, T, hs) written, of the inputs' format
/// @param lse   (B, NH, T) float32 device buffer, each row's log-sum-exp, written
/// @param q     (B, NH, T, hs)
/// @param k     (B, NH, T, hs)
/// @param v     (B, NH, T, hs)
/// @param shape the sizes; hs 64 or 128
/// @param stream a cudaStream_t, or null
/// @throws std::invalid_argument for an unsupported head size, buffers of another size or
///         of mixed formats
void flash_attention_forward_16bit(HalfBuffer& out, float* lse, const HalfBuffer& q,
                                   const HalfBuffer& k, const HalfBuffer& v,
                                   const AttentionShape& shape, void* stream = nullptr);

/// Why the tensor-core kernel cannot run `format` on this device, or "" when it can:
/// bfloat16 tensor cores need compute capability 8.0 (Ampere) or newer, float16 ones 7.0.
/// @param format bf16 or fp16 @return the reason, one sentence, or ""
std::string wmma_attention_unsupported(Precision format);

/// Fused attention forward on the tensor cores (WMMA, 16×16×16): each warp owns 16 query
/// rows, S = Q Kᵀ and O += P V are warp-wide mma_sync calls with float32 accumulators; the
/// online softmax between them runs in float32, a row at a time with a lane per key, on S
/// and on O, which stay in shared memory (the accumulator fragments' element layout is
/// unspecified, so a row-wise rescale cannot be done on the fragments themselves).
/// @param out   (B, NH, T, hs) written, of the inputs' format
/// @param lse   (B, NH, T) float32 device buffer, written
/// @param q     (B, NH, T, hs)
/// @param k     (B, NH, T, hs)
/// @param v     (B, NH, T, hs)
/// @param shape the sizes; hs 64 or 128
/// @param stream a cudaStream_t, or null
/// @throws std::invalid_argument as flash_attention_forward_16bit, and when
///         wmma_attention_unsupported() says why not
void wmma_attention_forward(HalfBuffer& out, float* lse, const HalfBuffer& q, const HalfBuffer& k,
                            const HalfBuffer& v, const AttentionShape& shape,
                            void* stream = nullptr);

/// Why the mma.sync kernel cannot run `format` on this device, or "" when it can:
/// mma.sync m16n8k16 needs compute capability 8.0 (Ampere) or newer, for float16 and
/// bfloat16 alike. @param format bf16 or fp16 @return the reason, one sentence, or ""
std::string mma_attention_unsupported(Precision format);

/// Fused attention forward as FlashAttention-2 computes it, on the tensor cores through PTX's
/// mma.sync m16n8k16 and ldmatrix: a block of 4 warps owns 64 query rows (16 a warp), whose
/// Q fragments stay in registers; for each tile of 64 keys (causal: tiles past the diagonal
/// skipped), S = Q Kᵀ into float32 accumulator registers, the online softmax on those
/// registers (base 2, each row's maximum and sum over the 4 lanes that hold it), P rounded
/// to the inputs' format into the A fragments of O += P V, O rescaled in registers; at the end
/// O / l in the format and lse in float32. The kernel and its layouts: attention_mma.cuh.
/// @param out   (B, NH, T, hs) written, of the inputs' format
/// @param lse   (B, NH, T) float32 device buffer, written
/// @param q     (B, NH, T, hs)
/// @param k     (B, NH, T, hs)
/// @param v     (B, NH, T, hs)
/// @param shape the sizes; hs 64 or 128
/// @param stream a cudaStream_t, or null
/// @throws std::invalid_argument as flash_attention_forward_16bit, and when
///         mma_attention_unsupported() says why not
void mma_attention_forward(HalfBuffer& out, float* lse, const HalfBuffer& q, const HalfBuffer& k,
                           const HalfBuffer& v, const AttentionShape& shape, void* stream = nullptr);

}  // namespace attn::cuda
