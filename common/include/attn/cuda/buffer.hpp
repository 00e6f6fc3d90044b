/// @file buffer.hpp
/// @brief A float32 buffer in GPU memory that frees itself, for tests and tools that move
/// host vectors to the device and back.
///
/// A plain header (no CUDA types); the implementation is compiled by nvcc.
#pragma once

#include <cstddef>
#include <vector>

struct CUstream_st;

namespace attn::cuda {

/// A non-blocking CUDA stream, owned: created by the constructor, destroyed (after its work
/// has finished) by the destructor. Work on it does not wait for the legacy stream, nor the
/// legacy stream for it: DeviceBuffer's copies wait for the whole device for that reason.
class Stream {
public:
    /// @throws std::runtime_error with CUDA's error text if the stream cannot be created
    Stream();
    ~Stream();
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    CUstream_st* get() const { return stream_; }  ///< the handle, for the library's calls
    /// Waits for the work queued on this stream; throws std::runtime_error if it failed.
    void synchronize();

private:
    CUstream_st* stream_ = nullptr;
};

/// `n` floats of device memory, owned: freed by the destructor. Movable, not copyable.
class DeviceBuffer {
public:
    /// Allocates n floats (uninitialised).
    /// @throws std::runtime_error with CUDA's error text if the allocation fails
    explicit DeviceBuffer(std::size_t n);
    /// Allocates and fills with a copy of `host`.
    explicit DeviceBuffer(const std::vector<float>& host);
    ~DeviceBuffer();
    DeviceBuffer(DeviceBuffer&& other) noexcept;             ///< takes other's memory
    DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;  ///< frees ours, takes other's
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;

    float* data() { return data_; }                  ///< the device pointer
    const float* data() const { return data_; }      ///< the device pointer
    std::size_t size() const { return size_; }       ///< number of floats

    /// Copies `host` (which must have size() elements) to the device, after all work queued
    /// on the device, on every stream, has finished.
    void upload(const std::vector<float>& host);
    /// Copies the buffer to a new host vector, after all work queued on the device, on every
    /// stream (non-blocking ones too, which the legacy stream's copy would not wait for), has
    /// finished.
    std::vector<float> download() const;
    /// Sets every float to 0.0f, after all queued work has finished.
    void zero();

private:
    float* data_ = nullptr;
    std::size_t size_ = 0;
};

/// Waits until the device has finished all queued work; throws std::runtime_error with
/// CUDA's error text if any of it failed.
void synchronize();

}  // namespace attn::cuda
