/// @file shard.hpp
/// @brief Which part of a flat buffer each of N processes owns, and the order in which a ring
/// of them passes the parts around: the arithmetic of a reduce-scatter and an all-gather
/// (ZeRO's sharded optimizer, attn/mpi/zero.hpp; lesson 21 and its exercise), without MPI.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace attn {

/// A range [begin, end) of a flat buffer.
struct Shard {
    std::size_t begin = 0;  ///< its first element
    std::size_t end = 0;    ///< one past its last
    /// Its elements. @return end − begin
    std::size_t size() const { return end - begin; }
};

/// The shard of `n` elements that process `rank` of `ranks` owns: consecutive parts, the first
/// n mod ranks of them one element longer than the others, so that no two differ by more than
/// one and every element is in exactly one. @param n the buffer's elements @param rank the
/// process, 0 … ranks − 1 @param ranks the processes (at least 1) @return its range
/// @throws std::invalid_argument for a rank outside 0 … ranks − 1
inline Shard shard_of(std::size_t n, int rank, int ranks) {
    if (ranks < 1 || rank < 0 || rank >= ranks) {
        throw std::invalid_argument("shard_of: rank " + std::to_string(rank) + " of " + std::to_string(ranks));
    }
    const std::size_t q = n / static_cast<std::size_t>(ranks), extra = n % static_cast<std::size_t>(ranks);
    const auto r = static_cast<std::size_t>(rank);
    const std::size_t begin = r * q + (r < extra ? r : extra);
    return {begin, begin + q + (r < extra ? 1 : 0)};
}

/// In a ring of `ranks` processes (each sends to rank + 1 and receives from rank − 1), the
/// shard that process `rank` sends at step `step` (0 … ranks − 2) of a reduce-scatter; it
/// receives the shard ring_reduce_scatter_send(rank − 1, step) and adds it to its own copy.
/// Process r sends shard r − 1 first, so that after ranks − 1 steps the shard it holds the
/// complete sum of is its own, r. @param rank the process @param step the step
/// @param ranks the processes @return the shard's owner
inline int ring_reduce_scatter_send(int rank, int step, int ranks) {
    return ((rank - step - 1) % ranks + ranks) % ranks;
}

/// The same for an all-gather, after a reduce-scatter: at step `step` process `rank` sends
/// the shard it holds complete since the step before (its own first) and receives
/// ring_all_gather_send(rank − 1, step). @param rank the process @param step the step
/// @param ranks the processes @return the shard's owner
inline int ring_all_gather_send(int rank, int step, int ranks) { return ((rank - step) % ranks + ranks) % ranks; }

}  // namespace attn
