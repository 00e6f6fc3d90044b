/// @file npy.hpp
/// @brief Reading and writing NumPy `.npy` files (float32 and bool, C order).
///
/// `.npy` is the interchange format between the course and PyTorch: reference values
/// computed by `tools/reference/*.py` arrive as `.npy`, and model weights are a directory
/// of `.npy` files (see the weights format in the README).
#pragma once

#include "attn/tensor.hpp"

#include <cstddef>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace attn {

/// Thrown for a file that is missing, unreadable or not a valid `.npy` file of the
/// expected type and rank. The message names the file and what is wrong with it.
class NpyError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// The raw contents of a `.npy` file: its shape and its data converted to float32.
struct NpyArray {
    std::vector<std::size_t> shape;  ///< the array's shape, as NumPy reports it
    std::vector<float> data;         ///< the values in C order
    std::string dtype;               ///< the descriptor in the file, e.g. `<f4`
};

/// Reads a `.npy` file of float32, float64, bool, int32 or int64 values (little-endian,
/// C order), converting the values to float32. Throws NpyError with the path on any problem.
NpyArray read_npy(const std::filesystem::path& path);

/// Writes a float32 array in C order. Throws NpyError if the file cannot be written.
void write_npy(const std::filesystem::path& path, const std::vector<std::size_t>& shape,
               const float* data);

/// Loads a float32 tensor of rank N; throws NpyError if the file's rank is not N.
template <std::size_t N>
Tensor<N> load_npy(const std::filesystem::path& path) {
    NpyArray a = read_npy(path);
    if (a.shape.size() != N) {
        throw NpyError(path.string() + ": expected a " + std::to_string(N) +
                       "-d array, the file holds shape " + format_shape(a.shape));
    }
    std::array<std::size_t, N> shape{};
    for (std::size_t i = 0; i < N; ++i) shape[i] = a.shape[i];
    Tensor<N> t(shape);
    std::copy(a.data.begin(), a.data.end(), t.begin());
    return t;
}

/// Saves a float32 tensor of any rank as a `.npy` file.
template <std::size_t N>
void save_npy(const std::filesystem::path& path, const Tensor<N>& t) {
    write_npy(path, std::vector<std::size_t>(t.shape().begin(), t.shape().end()), t.data());
}

}  // namespace attn
