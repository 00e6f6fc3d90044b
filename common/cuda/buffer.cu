#include "attn/cuda/buffer.hpp"
#include "check.cuh"

#include <stdexcept>
#include <utility>

namespace attn::cuda {

DeviceBuffer::DeviceBuffer(std::size_t n) : size_(n) {
    if (n > 0) CUDA_CHECK(cudaMalloc(&data_, n * sizeof(float)));
}

DeviceBuffer::DeviceBuffer(const std::vector<float>& host) : DeviceBuffer(host.size()) {
    upload(host);
}

DeviceBuffer::~DeviceBuffer() {
    if (data_) cudaFree(data_);  // no throwing from a destructor; a failed free is moot
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
        if (data_) cudaFree(data_);
        data_ = std::exchange(other.data_, nullptr);
        size_ = std::exchange(other.size_, 0);
    }
    return *this;
}

void DeviceBuffer::upload(const std::vector<float>& host) {
    if (host.size() != size_) {
        throw std::invalid_argument("DeviceBuffer::upload: " + std::to_string(host.size()) +
                                    " floats for a buffer of " + std::to_string(size_));
    }
    if (size_ > 0) {
        // cudaMemcpy runs on the legacy stream, which does not wait for non-blocking streams
        // (CudaGPT's): wait for the whole device first, so that no kernel still reads the old
        // contents.
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy(data_, host.data(), size_ * sizeof(float), cudaMemcpyHostToDevice));
    }
}

std::vector<float> DeviceBuffer::download() const {
    std::vector<float> host(size_);
    if (size_ > 0) {
        CUDA_CHECK(cudaDeviceSynchronize());  // every stream's work, non-blocking ones too
        CUDA_CHECK(cudaMemcpy(host.data(), data_, size_ * sizeof(float), cudaMemcpyDeviceToHost));
    }
    return host;
}

void DeviceBuffer::zero() {
    if (size_ > 0) {
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemset(data_, 0, size_ * sizeof(float)));
    }
}

void synchronize() { CUDA_CHECK(cudaDeviceSynchronize()); }

Stream::Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
Stream::~Stream() {
    if (stream_) cudaStreamDestroy(stream_);
}
void Stream::synchronize() { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

}  // namespace attn::cuda
