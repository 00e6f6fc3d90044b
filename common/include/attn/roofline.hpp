/// @file roofline.hpp
/// @brief A performance model, not a measurement: the least time a launch can take on a GPU,
/// and how many of its blocks fit on one multiprocessor.
///
/// The least time is the roofline's (Williams, Waterman and Patterson, "Roofline: an
/// insightful visual performance model for multicore architectures", CACM 52(4), 2009): the
/// longer of the bytes a launch must move at the memory's rate and the operations it must do
/// at the peak of the unit that does them. Occupancy follows the rules of NVIDIA's CUDA
/// Occupancy Calculator. The CUDA simulator counts the bytes and part of the operations
/// (cuda_sim::Work, through attn::cuda::take_counted_work); a lesson or benchmark adds the
/// operations of a kernel's own arithmetic from a formula. Everything printed from here is
/// labelled "H100 roofline bound, not a measurement".
#pragma once

#include "attn/flash.hpp"

#include <cstddef>
#include <string>
#include <vector>

namespace attn::roofline {

/// A GPU's published peaks and per-multiprocessor limits.
struct Gpu {
    const char* name;       ///< what it is called
    int multiprocessors;    ///< SMs
    double fp32_flops;      ///< operations per second, CUDA cores, float32
    double tf32_flops;      ///< operations per second, tensor cores, TF32, dense
    double f16_flops;       ///< operations per second, tensor cores, float16/bfloat16 inputs, dense
    double memory_bytes;    ///< bytes per second of device memory
    int max_threads_per_sm;        ///< resident threads per SM
    int max_warps_per_sm;          ///< resident warps per SM
    int max_blocks_per_sm;         ///< resident blocks per SM
    int registers_per_sm;          ///< 32-bit registers per SM
    int register_unit;             ///< registers are given to a warp in units of this many
    int max_registers_per_thread;  ///< the most one thread may use
    std::size_t shared_per_sm;             ///< bytes of shared memory per SM
    std::size_t shared_reserved_per_block; ///< bytes the system keeps per resident block
    std::size_t shared_unit;               ///< shared memory is allocated in units of this
};

/// NVIDIA H100 SXM5: 132 SMs; 67 TFLOP/s float32, 494.7 TFLOP/s TF32 and 989.4 TFLOP/s
/// float16/bfloat16 on the tensor cores without sparsity (the datasheet's figures "with
/// sparsity" are twice these); 3.35 TB/s of HBM3 (NVIDIA H100 Tensor Core GPU datasheet,
/// 2023). Per SM, compute capability 9.0: 2 048 threads, 64 warps, 32 blocks, 65 536
/// registers given out 256 at a time per warp, 255 per thread, 228 KiB of shared memory of
/// which each block's system use takes 1 KiB, allocated in 128-byte units (CUDA C++
/// Programming Guide, "Compute Capabilities", table of technical specifications; the CUDA
/// Occupancy Calculator's allocation rules).
inline constexpr Gpu h100_sxm{"H100 SXM", 132, 67.0e12, 494.7e12, 989.4e12, 3.35e12,
                              2048, 64, 32, 65536, 256, 255, 228 * 1024, 1024, 128};

/// One launch's work (or several launches of one kernel, summed): its shape, and what it
/// reads, writes and computes.
struct Launch {
    std::string name;               ///< the kernel, or the cuBLAS call
    std::size_t launches = 1;       ///< how many launches are summed here
    std::size_t blocks = 1;         ///< blocks of the grid (summed over the launches)
    std::size_t threads_per_block = 1;  ///< threads of one block
    std::size_t shared_bytes = 0;   ///< shared memory per block, static and dynamic
    int registers_per_thread = 0;   ///< 0 when not known (no nvcc to ask)
    double bytes_read = 0;          ///< device memory read
    double bytes_written = 0;       ///< device memory written
    double fp32_flops = 0;          ///< operations on the CUDA cores
    double tf32_flops = 0;          ///< operations on the tensor cores, TF32
    double f16_flops = 0;           ///< operations on the tensor cores, 16-bit inputs
};

/// The least time: each byte moved once at the memory's rate, each operation at its unit's
/// peak, whichever is longer (the roofline's two limits; the units are taken to overlap).
struct Bound {
    double memory_seconds = 0;   ///< the bytes alone
    double compute_seconds = 0;  ///< the operations alone
    double seconds = 0;          ///< the bound: the longer limit (summed over launches)
    double memory_limited_seconds = 0;  ///< the part of `seconds` where memory is the longer
    /// "memory" or "compute": which limit most of the bound comes from.
    const char* limited_by() const { return 2 * memory_limited_seconds >= seconds ? "memory" : "compute"; }
};

/// The bound of one launch on `gpu`.
Bound bound(const Launch& launch, const Gpu& gpu = h100_sxm);
/// The bound of launches run one after another: each launch's bound, summed.
Bound bound(const std::vector<Launch>& launches, const Gpu& gpu = h100_sxm);

/// How many blocks of a launch one SM holds at once.
struct Occupancy {
    int blocks_per_sm = 0;      ///< resident at once on one SM
    double warps_fraction = 0;  ///< of the SM's warp slots those blocks fill
    std::string limited_by;     ///< "threads", "blocks", "registers", "shared memory", or why none fit
    double waves = 0;           ///< the grid's blocks over what all SMs hold at once
};
/// From the block's threads, its shared memory and (where known) its registers per thread.
Occupancy occupancy(const Launch& launch, const Gpu& gpu = h100_sxm);

/// One forward pass of attention on `shape`, by formula, launch by launch as the course's
/// CUDA versions run it; the bytes are the least each launch must move, as the simulator
/// counts them (tests/cuda/test_attention_gpu.cpp and test_half_attention_gpu.cpp check
/// that the two agree).
///
/// - fused (`flash_forward_kernel`): q, k, v read, out and the (B, NH, T) log-sum-exp
///   written; 4·hs operations per visible (query, key) pair (q·k and p·v). With 16-bit
///   inputs (`element_bytes` 2) q, k, v and out take 2 bytes an element (the log-sum-exp
///   stays float32), and with `tensor_cores` the operations run at the tensor cores' 16-bit
///   rate (the useful ones: a kernel that multiplies whole tiles across the diagonal does
///   more).
/// - plain, float32: q kᵀ by cuBLAS (q, k read, the (B, NH, T, T) scores written, 2·T²·hs
///   operations a head, the masked half too), the softmax reading and writing the scores in
///   place (its arithmetic not counted), P v by cuBLAS (the scores and v read, out written,
///   2·T²·hs a head).
std::vector<Launch> attention_forward_model(const AttentionShape& shape, bool fused, int element_bytes = 4,
                                            bool tensor_cores = false);

/// A table of launches, longest bound first, at most `rows` of them (the rest summed on one
/// line), then their total: kernel, launches, MiB read and written, GFLOP, the bound in µs
/// and its limit, and blocks per SM with their limit and registers ("?" where not known).
std::string table(std::vector<Launch> launches, std::size_t rows, const Gpu& gpu = h100_sxm);

}  // namespace attn::roofline
