// rule: a copy stays inside the device allocation it names
// refused: runs 16 bytes past the end of its device allocation of 16 bytes
#include "mistake.hpp"

#include <vector>

MISTAKE(copy_past_allocation) {
    float* buffer = nullptr;
    cudaMalloc(&buffer, 4 * sizeof(float));
    const std::vector<float> host(8, 1.0f);
    return mistakes::said(cudaMemcpy(buffer, host.data(), 8 * sizeof(float), cudaMemcpyHostToDevice));
}
