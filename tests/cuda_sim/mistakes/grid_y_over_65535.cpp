// rule: a grid has at most 65535 blocks along y and z (2^31 - 1 along x)
// refused: one_block_per_row (launched at grid_y_over_65535.cpp:14): grid (1,70000,1) of blocks (32,1,1): each dimension must be at least 1, blocks at most (1024,1024,64), grids at most (2^31-1,65535,65535)
#include "mistake.hpp"

namespace {
// One block per row of a 70 000-row table along y, as an embedding backward over a large
// vocabulary might launch it.
__global__ void one_block_per_row(float* table) { table[blockIdx.y] = 0.0f; }
}  // namespace

MISTAKE(grid_y_over_65535) {
    float* table = nullptr;
    cudaMalloc(&table, 70000 * sizeof(float));
    ATTN_LAUNCH(one_block_per_row, dim3(1, 70000), 32, 0, nullptr)(table);
    return mistakes::said(cudaGetLastError());
}
