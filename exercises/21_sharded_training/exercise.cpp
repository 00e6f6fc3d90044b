// Exercise 21: the arithmetic of sharded training: shards, and a ring's reduce-scatter and
// all-gather, simulated in one process.
//
// Write shard_of, reduce_scatter_send, all_gather_send, ring_reduce_scatter and
// ring_all_gather below, then run `./workbook check 21`. Stuck? `./workbook hint 21`. The
// contract (what each does, what to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

#include <stdexcept>

namespace exercise {

Shard shard_of(std::size_t n, int rank, int ranks) {
    // TODO: throw std::invalid_argument if ranks < 1 or rank is not in 0 … ranks − 1.

    // TODO: every rank gets n / ranks elements, and the first n mod ranks ranks one more.
    // TODO: a shard begins where the one before it ends: count the elements of the ranks
    //       before this one (how many of them got one more?).

    (void)n, (void)rank, (void)ranks;
    throw attn::NotImplemented("shard_of in exercises/21_sharded_training/exercise.cpp: "
                               "n / ranks elements each, one more for the first n mod ranks");
}

int reduce_scatter_send(int rank, int step, int ranks) {
    // TODO: rank − 1 at step 0, one further back round the ring at each step.
    // TODO: the result must be in 0 … ranks − 1 for rank 0 too (what is -1 % 3 in C++?).

    (void)rank, (void)step, (void)ranks;
    throw attn::NotImplemented("reduce_scatter_send in exercises/21_sharded_training/exercise.cpp: "
                               "shard rank − 1 first, one back round the ring each step");
}

int all_gather_send(int rank, int step, int ranks) {
    // TODO: its own shard at step 0, then the one it received at the step before.

    (void)rank, (void)step, (void)ranks;
    throw attn::NotImplemented("all_gather_send in exercises/21_sharded_training/exercise.cpp: "
                               "its own shard first, then the one received the step before");
}

void ring_reduce_scatter(std::vector<std::vector<float>>& buffers) {
    // TODO: throw std::invalid_argument for no buffers, or buffers of different lengths.
    // TODO: N = buffers.size() ranks, n elements each; N − 1 steps.
    // TODO: at each step, every rank r receives from rank r − 1 (round the ring) the shard
    //       that rank sends, and adds its elements into the same elements of its own buffer.
    // TODO: every rank sends at once: what is sent must be what the sender held before the
    //       step, not what it has just received.

    (void)buffers;
    throw attn::NotImplemented("ring_reduce_scatter in exercises/21_sharded_training/exercise.cpp: "
                               "N − 1 steps, each rank adds the shard rank − 1 sends it");
}

void ring_all_gather(std::vector<std::vector<float>>& buffers) {
    // TODO: the same refusals and the same ring, with all_gather_send's shards, copied in
    //       instead of added.

    (void)buffers;
    throw attn::NotImplemented("ring_all_gather in exercises/21_sharded_training/exercise.cpp: "
                               "N − 1 steps, each rank copies in the shard rank − 1 sends it");
}

}  // namespace exercise
