/// @file partial_attention.hpp
/// @brief Attention split over its keys and its sequence: two partial results over disjoint
/// sets of keys merged by their log-sum-exps (the rule ring attention uses, lesson 19), and
/// the ways a sequence is cut into pieces for N processes.
///
/// A partial attention of one query row over a set of keys K is the pair
/// \f$(o_K, \mathrm{lse}_K)\f$ with \f$\mathrm{lse}_K = \ln \sum_{j \in K} e^{s_j}\f$ and
/// \f$o_K = \sum_{j \in K} e^{s_j - \mathrm{lse}_K} v_j\f$: what lesson 13's tiled forward
/// writes for the keys it was given. Over two disjoint sets A and B,
/// \f$\mathrm{lse}_{A \cup B} = \ln(e^{\mathrm{lse}_A} + e^{\mathrm{lse}_B})\f$ and
/// \f$o_{A \cup B} = e^{\mathrm{lse}_A - \mathrm{lse}_{A \cup B}}\, o_A +
/// e^{\mathrm{lse}_B - \mathrm{lse}_{A \cup B}}\, o_B\f$: the online softmax's update, one
/// whole block of keys at a time.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace attn {

/// Folds a partial attention over other keys into `out` and `lse`, row by row:
///
///     m   = max(lse, lse_b)
///     lse = m + ln(e^(lse − m) + e^(lse_b − m))
///     out = e^(lse_old − lse) · out + e^(lse_b − lse) · out_b
///
/// Subtracting the larger log-sum-exp keeps every exponential at most 1, so nothing
/// overflows. A row whose lse is −∞ has seen no key (every key masked or none given): it
/// contributes nothing, and two such rows stay empty (out 0, lse −∞, no NaN).
/// @param out    (rows, hs) one side's output, replaced by the merged output
/// @param lse    (rows) its log-sum-exps, replaced by the merged ones
/// @param out_b  (rows, hs) the other side's output, over keys disjoint from the first's
/// @param lse_b  (rows) the other side's log-sum-exps
/// @param rows   query rows
/// @param hs     head size
void merge_partial_attention(float* out, float* lse, const float* out_b, const float* lse_b,
                             std::size_t rows, std::size_t hs);

/// The signature of a merge rule, so that a ring can be given another one (lesson 19 shows
/// what a wrong rule does to the result).
using MergeRule = void (*)(float* out, float* lse, const float* out_b, const float* lse_b,
                           std::size_t rows, std::size_t hs);

/// A WRONG merge, kept to be shown failing (lesson 19, and the ring's equality test): the
/// log-sum-exps added, lse = lse_a + lse_b, as if the log of a sum were the sum of the logs,
/// and the outputs weighted by e^(lse_a − lse) and e^(lse_b − lse) against that. An empty
/// side (lse −∞) is still skipped, so only the merging itself is wrong.
/// Parameters as merge_partial_attention().
/// @param out (rows, hs) @param lse (rows) @param out_b (rows, hs) @param lse_b (rows)
/// @param rows query rows @param hs head size
void merge_adding_log_sum_exps(float* out, float* lse, const float* out_b, const float* lse_b,
                               std::size_t rows, std::size_t hs);

/// How a sequence of T positions is cut into pieces for N processes (ranks).
enum class SequenceOrder {
    /// N pieces of T/N; rank r holds piece r. Under a causal mask rank r's queries see r + 1
    /// pieces of keys, so the last rank does about twice the average work.
    contiguous,
    /// 2N pieces of T/(2N); rank r holds pieces r and 2N − 1 − r, one early and one late,
    /// so that every rank sees the same number of keys under a causal mask (the zig-zag
    /// order of Megatron-LM's context parallelism).
    zigzag,
};

/// The order's name: "contiguous" or "zigzag". @param order the order @return its name
const char* sequence_order_name(SequenceOrder order);

/// A sequence of T positions split over `ranks` processes in one order.
struct SequenceSplit {
    std::size_t T = 1;      ///< positions in the whole sequence
    std::size_t ranks = 1;  ///< N, processes sharing it
    SequenceOrder order = SequenceOrder::zigzag;  ///< how the pieces are dealt out

    /// Throws std::invalid_argument unless ranks ≥ 1 and T is a positive multiple of the
    /// number of pieces.
    void validate() const;
    /// The number of pieces: N (contiguous) or 2N (zigzag).
    std::size_t pieces() const;
    /// Positions per piece, T / pieces().
    std::size_t piece_length() const { return T / pieces(); }
    /// Pieces each rank holds: 1 or 2.
    std::size_t pieces_per_rank() const { return pieces() / ranks; }
    /// Positions each rank holds, T / N.
    std::size_t local_length() const { return T / ranks; }
    /// The pieces of one rank, by their place in the sequence, in the order the rank
    /// stores them. @param rank 0 ≤ rank < N @return the piece indices
    std::vector<std::size_t> pieces_of(std::size_t rank) const;
};

/// Copies one rank's pieces out of a whole-sequence tensor.
/// @param local   (pieces_per_rank, B, NH, piece_length, width) written: the rank's pieces,
///                each a contiguous (B, NH, piece_length, width) tensor
/// @param global  (B, NH, T, width) the whole sequence
/// @param split   the split
/// @param rank    whose pieces
/// @param B       batch
/// @param NH      heads
/// @param width   hs for queries, keys, values and outputs; 1 for a log-sum-exp
void take_local_pieces(float* local, const float* global, const SequenceSplit& split,
                       std::size_t rank, std::size_t B, std::size_t NH, std::size_t width);

/// The inverse of take_local_pieces(): writes one rank's pieces into their places in a
/// whole-sequence tensor. Parameters as take_local_pieces(), with local read and global
/// written.
/// @param global (B, NH, T, width) @param local (pieces_per_rank, B, NH, piece_length, width)
/// @param split the split @param rank whose pieces @param B batch @param NH heads
/// @param width hs or 1
void put_local_pieces(float* global, const float* local, const SequenceSplit& split,
                      std::size_t rank, std::size_t B, std::size_t NH, std::size_t width);

/// How a block of queries (piece qi) relates to a block of keys (piece kj) of the same
/// length under a causal mask: every key visible, the diagonal (a causal mask inside), or
/// every key in the future (skipped: nothing to compute).
enum class BlockMask { full, diagonal, skipped };

/// The mask of the block (qi, kj). @param qi the queries' piece @param kj the keys' piece
/// @param causal whether attention is causal (without it every block is full)
/// @return full, diagonal or skipped
BlockMask block_mask(std::size_t qi, std::size_t kj, bool causal);

/// The (query, key) pairs whose scores one rank computes over all the steps of ring
/// attention: c² for a full block of c = piece_length() positions, c(c + 1)/2 for a
/// diagonal one. Their maximum over the ranks against their mean is the imbalance a split
/// causes (each step of the ring waits for its slowest rank).
/// @param split the split @param rank 0 ≤ rank < N @param causal causal or not
/// @return the number of pairs
std::size_t attention_pairs(const SequenceSplit& split, std::size_t rank, bool causal);

}  // namespace attn
