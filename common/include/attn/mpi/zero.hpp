/// @file zero.hpp
/// @brief ZeRO stage 1 over MPI (lesson 21; Rajbhandari et al., "ZeRO: Memory Optimizations
/// Toward Training Trillion Parameter Models", SC 2020): data parallelism in which each rank keeps
/// AdamW's moments for its shard of the parameters only. The gradients are summed by a ring
/// reduce-scatter (each rank ends with the whole batch's gradient of its shard), each rank
/// updates its shard, and a ring all-gather gives every rank every shard's new parameters.
#pragma once

#include "attn/mpi/data_parallel.hpp"
#include "attn/shard.hpp"

#include <cstddef>
#include <vector>

namespace attn::mpi {

/// What one rank sent in the last step, counted by the ring collectives themselves.
struct ZeroTraffic {
    std::size_t reduce_scatter_bytes = 0;  ///< the gradients' reduce-scatter
    std::size_t all_gather_bytes = 0;      ///< the parameters' all-gather
    std::size_t norm_bytes = 0;            ///< the clipping norm's sum of squares (one double)
    /// Everything. @return the sum of the three
    std::size_t total() const { return reduce_scatter_bytes + all_gather_bytes + norm_bytes; }
};

/// ZeRO stage 1 over MPI's world communicator (Trainer::use_group), with the ranks' shards
/// from shard_of() over the model's flat parameter buffer. MPI must be initialised.
///
/// Each rank still computes its share of the batch's gradients into a whole gradient buffer
/// (the model's backward pass writes one), so what the sharding saves is AdamW's moments:
/// 8 bytes per parameter become 8 per parameter of the shard. The collectives are written
/// out as rings of MPI_Sendrecv, so that each rank counts the bytes it sends: (P − |shard
/// r|) floats for the reduce-scatter and (P − |shard r + 1|) for the all-gather, together
/// 2(N − 1)/N of the parameters' bytes, what the ring allreduce of plain data parallelism
/// sends (the paper: stage 1 moves what data parallelism moves).
class ShardedOptimizer : public DataParallel {
public:
    ShardedOptimizer();

    void begin_gradients(GPT& model, double share) override;
    void finish_gradients(GPT& model) override;
    float clip_gradients(GPT& model, float max_norm) override;
    void update(GPT& model, AdamW& optimizer, float lr) override;
    void whole_moments(const GPT& model, const AdamW& optimizer, std::vector<float>& m, std::vector<float>& v) override;
    bool holds_whole_gradients() const override { return false; }

    /// This rank's shard of a model's parameters. @param model the model @return its range
    Shard shard(const GPT& model) const { return shard_of(model.parameters().size(), rank(), size()); }
    /// What this rank sent in the last step.
    const ZeroTraffic& last_traffic() const { return traffic_; }

private:
    float share_ = 1.0f;
    std::vector<float> scratch_;  // one shard received
    ZeroTraffic traffic_;
};

}  // namespace attn::mpi
