/// @file ring_attention.hpp
/// @brief Ring attention (context parallelism, lesson 19): a sequence too long for one
/// process split over N ranks; each keeps its queries, and the keys and values go round the
/// ring, one rank's block per step, while each rank folds the block it holds into its
/// output with the log-sum-exp merge (attn/partial_attention.hpp). The backward pass sends
/// the keys' and values' gradients round the ring too.
#pragma once

#include "attn/flash.hpp"
#include "attn/partial_attention.hpp"

#include <cstddef>
#include <vector>

namespace attn::mpi {

/// What a ring pass cost this rank.
struct RingStats {
    double compute_seconds = 0.0;  ///< CPU time of the block computations and merges
    double wait_seconds = 0.0;     ///< wall time waiting for the next block after computing
    std::size_t bytes_sent = 0;    ///< bytes this rank sent to the next
    std::size_t pairs = 0;         ///< (query, key) scores this rank computed
    std::size_t blocks = 0;        ///< blocks computed (a skipped one not counted)
    std::size_t peak_floats = 0;   ///< floats the ring's own buffers held at once
};

/// Attention over a sequence split over the ranks of MPI's world communicator. Every rank
/// holds its pieces of q, k, v (SequenceSplit::pieces_of(rank)) as a
/// (pieces_per_rank, B, NH, piece_length, hs) tensor, take_local_pieces()'s layout; the
/// output, its log-sum-exp and the gradients come back in the same layout. Equal to
/// single-process attention (attention_fast_forward / attention_fast_backward) up to the
/// order of the float sums.
class RingAttention {
public:
    /// @param shape B, NH, the whole sequence's T, hs, and whether attention is causal
    /// @param order how the sequence is dealt out (zigzag balances the causal work)
    /// @param merge the rule that folds a block into the output (merge_partial_attention;
    ///        another only to show what a wrong one does)
    /// @throws std::invalid_argument when T does not split into equal pieces
    RingAttention(const AttentionShape& shape, SequenceOrder order,
                  MergeRule merge = merge_partial_attention);

    /// The split of the sequence over the ranks.
    const SequenceSplit& split() const { return split_; }
    /// Floats of one rank's q, k, v, output or gradient: pieces_per_rank·B·NH·piece_length·hs.
    std::size_t local_floats() const { return local_floats_; }
    /// Floats of one rank's log-sum-exp: pieces_per_rank·B·NH·piece_length.
    std::size_t local_rows() const { return local_rows_; }

    /// The forward pass: N steps; in each, the rank sends the block of keys and values it
    /// holds to the next rank and receives the previous rank's while it computes its queries
    /// against the block it holds, skipping blocks wholly in the future (causal).
    /// @param out (local) written @param lse (local rows) written
    /// @param q (local) @param k (local) @param v (local)
    void forward(float* out, float* lse, const float* q, const float* k, const float* v);

    /// The backward pass: the blocks of keys and values go round again, each followed by
    /// the gradients the ranks so far have added to it; after N steps every block's dk and
    /// dv are back with their rank.
    /// @param dq (local) written @param dk (local) written @param dv (local) written
    /// @param dout (local) the loss's gradient with respect to out
    /// @param q (local) @param k (local) @param v (local)
    /// @param out (local) the forward's output @param lse (local rows) its log-sum-exp
    void backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                  const float* k, const float* v, const float* out, const float* lse);

    /// What the last forward() or backward() cost this rank.
    const RingStats& stats() const { return stats_; }

private:
    AttentionShape shape_;
    SequenceSplit split_;
    MergeRule merge_;
    int rank_ = 0, size_ = 1;
    std::size_t piece_floats_ = 0, piece_rows_ = 0, local_floats_ = 0, local_rows_ = 0;
    RingStats stats_;
};

}  // namespace attn::mpi
