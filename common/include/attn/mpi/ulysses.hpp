/// @file ulysses.hpp
/// @brief Sequence parallelism by all-to-all (DeepSpeed-Ulysses, lesson 19): each rank holds
/// a contiguous piece of the sequence with every head; one all-to-all gives each rank the
/// whole sequence for NH/N of the heads, which it attends over alone, and a second all-to-all
/// brings the output back to the sequence split.
#pragma once

#include "attn/flash.hpp"

#include <cstddef>
#include <vector>

namespace attn::mpi {

/// What an all-to-all pass cost this rank.
struct UlyssesStats {
    double compute_seconds = 0.0;  ///< CPU time of the attention on this rank's heads
    double exchange_seconds = 0.0; ///< wall time of the all-to-alls
    std::size_t bytes_sent = 0;    ///< bytes this rank sent to the other ranks
};

/// Attention over a sequence split over the ranks of MPI's world communicator, by heads in
/// the middle. Rank r holds positions [r·T/N, (r + 1)·T/N) of q, k, v as (B, NH, T/N, hs)
/// tensors (take_local_pieces() with a contiguous split); the output, its log-sum-exp
/// (B, NH, T/N) and the gradients come back the same way. NH must be a multiple of N.
class UlyssesAttention {
public:
    /// @param shape B, NH, the whole sequence's T, hs, and whether attention is causal
    /// @throws std::invalid_argument unless N divides NH and T
    explicit UlyssesAttention(const AttentionShape& shape);

    /// Floats of one rank's q, k, v, output or gradient: B·NH·(T/N)·hs.
    std::size_t local_floats() const { return local_floats_; }
    /// Floats of one rank's log-sum-exp: B·NH·(T/N).
    std::size_t local_rows() const { return local_floats_ / shape_.hs; }

    /// The forward pass: q, k, v to the head split (one all-to-all), attention over the
    /// whole sequence for NH/N heads, the output and its log-sum-exp back (two more).
    /// Keeps the head-split tensors for backward().
    /// @param out (local) written @param lse (local rows) written
    /// @param q (local) @param k (local) @param v (local)
    void forward(float* out, float* lse, const float* q, const float* k, const float* v);

    /// The backward pass of the last forward(): dout to the head split, the attention's
    /// backward there, dq, dk, dv back to the sequence split.
    /// @param dq (local) written @param dk (local) written @param dv (local) written
    /// @param dout (local) the loss's gradient with respect to out
    void backward(float* dq, float* dk, float* dv, const float* dout);

    /// What the last forward() or backward() cost this rank.
    const UlyssesStats& stats() const { return stats_; }

private:
    // Each of `count` tensors (B, NH, T/N, width), sequence split, to (B, NH/N, T, width),
    // head split: one all-to-all.
    void to_heads(float* const* heads, const float* const* sequence, int count, std::size_t width);
    // The inverse: (B, NH/N, T, width) to (B, NH, T/N, width).
    void to_sequence(float* const* sequence, const float* const* heads, int count,
                     std::size_t width);
    // The all-to-all both use: per_rank floats of send_ to each rank, into receive_; timed
    // and counted in stats_.
    void exchange(std::size_t per_rank);

    AttentionShape shape_;
    int rank_ = 0, size_ = 1;
    std::size_t chunk_ = 0, group_ = 0, local_floats_ = 0;  // T/N, NH/N
    std::vector<float> q_, k_, v_, out_, lse_;  // head split, (B, NH/N, T, ·), for backward
    std::vector<float> send_, receive_;
    UlyssesStats stats_;
};

}  // namespace attn::mpi
