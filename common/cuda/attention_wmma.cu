// The 16-bit attention on the tensor cores (the kernel: attention_wmma.cuh), and the
// 16-bit device buffers both 16-bit kernels read and write.
#include "attention_wmma.cuh"

#include <stdexcept>
#include <utility>

namespace attn::cuda {

namespace {

std::uint16_t to_bits(float x, Precision format) {
    return format == Precision::bf16 ? float_to_bfloat16_bits(x) : float_to_float16_bits(x);
}
float from_bits(std::uint16_t b, Precision format) {
    return format == Precision::bf16 ? bfloat16_bits_to_float(b) : float16_bits_to_float(b);
}

}  // namespace

HalfBuffer::HalfBuffer(std::size_t n, Precision format) : size_(n), format_(format) {
    detail::require(format == Precision::bf16 || format == Precision::fp16,
                    std::string("HalfBuffer: the format must be bf16 or fp16, got ") +
                        precision_name(format));
    if (n > 0) CUDA_CHECK(cudaMalloc(&data_, n * sizeof(std::uint16_t)));
}

HalfBuffer::HalfBuffer(const std::vector<float>& host, Precision format)
    : HalfBuffer(host.size(), format) {
    upload(host);
}

HalfBuffer::~HalfBuffer() {
    if (data_) cudaFree(data_);  // no throwing from a destructor; a failed free is moot
}

HalfBuffer::HalfBuffer(HalfBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
      format_(other.format_) {}

HalfBuffer& HalfBuffer::operator=(HalfBuffer&& other) noexcept {
    if (this != &other) {
        if (data_) cudaFree(data_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
        format_ = other.format_;
    }
    return *this;
}

void HalfBuffer::upload(const std::vector<float>& host) {
    detail::require(host.size() == size_, "HalfBuffer::upload: " + std::to_string(host.size()) +
                                              " values for a buffer of " + std::to_string(size_));
    std::vector<std::uint16_t> bits(size_);
    for (std::size_t i = 0; i < size_; ++i) bits[i] = to_bits(host[i], format_);
    if (size_ > 0) {
        CUDA_CHECK(cudaDeviceSynchronize());  // as DeviceBuffer::upload: every stream's work first
        CUDA_CHECK(cudaMemcpy(data_, bits.data(), size_ * sizeof(std::uint16_t), cudaMemcpyHostToDevice));
    }
}

std::vector<float> HalfBuffer::download() const {
    std::vector<std::uint16_t> bits(size_);
    if (size_ > 0) {
        CUDA_CHECK(cudaDeviceSynchronize());  // as DeviceBuffer::download: non-blocking streams too
        CUDA_CHECK(cudaMemcpy(bits.data(), data_, size_ * sizeof(std::uint16_t), cudaMemcpyDeviceToHost));
    }
    std::vector<float> host(size_);
    for (std::size_t i = 0; i < size_; ++i) host[i] = from_bits(bits[i], format_);
    return host;
}

std::string wmma_attention_unsupported(Precision format) {
    int device = 0, major = 0, minor = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    const int needed = format == Precision::bf16 ? 8 : 7;
    if (major >= needed) return "";
    return std::string(precision_name(format)) + " tensor cores need compute capability " +
           std::to_string(needed) + ".0 or newer; this GPU has " + std::to_string(major) + "." +
           std::to_string(minor);
}

void wmma_attention_forward(HalfBuffer& out, float* lse, const HalfBuffer& q, const HalfBuffer& k,
                            const HalfBuffer& v, const AttentionShape& shape, void* stream) {
    detail::wmma_attention_forward_with<nvcuda::wmma::col_major>(out, lse, q, k, v, shape, stream);
}

}  // namespace attn::cuda
