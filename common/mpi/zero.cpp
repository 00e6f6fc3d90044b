// ZeRO stage 1: AdamW's moments sharded over the ranks, the gradients reduce-scattered and the
// parameters all-gathered by rings of MPI_Sendrecv that count what they send.
#include "attn/mpi/zero.hpp"

#include "attn/gpt.hpp"

#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

namespace attn::mpi {

namespace {
int count_of(std::size_t n) {
    if (n > static_cast<std::size_t>(INT_MAX)) {
        throw std::invalid_argument("a shard of " + std::to_string(n) + " floats is more than one MPI call sends");
    }
    return static_cast<int>(n);
}
}  // namespace

ShardedOptimizer::ShardedOptimizer() : DataParallel(AllreduceSchedule::after) {}

void ShardedOptimizer::begin_gradients(GPT&, double share) { share_ = static_cast<float>(share); }

//! [reduce_scatter]
void ShardedOptimizer::finish_gradients(GPT& model) {
    std::vector<float>& grads = model.gradients();
    for (float& g : grads) g *= share_;  // this rank's part of the batch's mean
    traffic_ = {};
    const int N = size(), r = rank();
    const int next = (r + 1) % N, previous = (r + N - 1) % N;
    // N − 1 steps round the ring: each rank passes on a shard's running sum and adds its own
    // gradients to the one it receives. The last one it receives is its own shard, complete.
    for (int step = 0; step < N - 1; ++step) {
        const Shard out = shard_of(grads.size(), ring_reduce_scatter_send(r, step, N), N);
        const Shard in = shard_of(grads.size(), ring_reduce_scatter_send(previous, step, N), N);
        scratch_.resize(in.size());
        MPI_Sendrecv(grads.data() + out.begin, count_of(out.size()), MPI_FLOAT, next, step,
                     scratch_.data(), count_of(in.size()), MPI_FLOAT, previous, step, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
        for (std::size_t i = 0; i < in.size(); ++i) grads[in.begin + i] += scratch_[i];
        traffic_.reduce_scatter_bytes += out.size() * sizeof(float);
    }
}
//! [reduce_scatter]

float ShardedOptimizer::clip_gradients(GPT& model, float max_norm) {
    // The norm of the whole gradient from each rank's sum of squares over its shard.
    std::vector<float>& grads = model.gradients();
    const Shard mine = shard(model);
    double local = 0.0;
    for (std::size_t i = mine.begin; i < mine.end; ++i) local += static_cast<double>(grads[i]) * grads[i];
    const double sum_sq = size() > 1 ? sum(local) : local;
    if (size() > 1) traffic_.norm_bytes = sizeof(double);
    const float norm = static_cast<float>(std::sqrt(sum_sq));
    // clip_grad_norm()'s rule, on this rank's shard (the rest is another rank's to clip).
    const float coef = max_norm / (norm + 1e-6f);
    if (max_norm > 0.0f && std::isfinite(norm) && coef < 1.0f) {
        for (std::size_t i = mine.begin; i < mine.end; ++i) grads[i] *= coef;
    }
    return norm;
}

//! [all_gather]
void ShardedOptimizer::update(GPT& model, AdamW& optimizer, float lr) {
    std::vector<float>& params = model.parameters();
    const Shard mine = shard(model);
    optimizer.step_range(params, model.gradients(), model.parameter_table(), lr, mine.begin, mine.end);
    const int N = size(), r = rank();
    const int next = (r + 1) % N, previous = (r + N - 1) % N;
    // Each rank's new parameters round the ring, straight into the others' buffers.
    for (int step = 0; step < N - 1; ++step) {
        const Shard out = shard_of(params.size(), ring_all_gather_send(r, step, N), N);
        const Shard in = shard_of(params.size(), ring_all_gather_send(previous, step, N), N);
        MPI_Sendrecv(params.data() + out.begin, count_of(out.size()), MPI_FLOAT, next, step,
                     params.data() + in.begin, count_of(in.size()), MPI_FLOAT, previous, step,
                     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        traffic_.all_gather_bytes += out.size() * sizeof(float);
    }
}
//! [all_gather]

void ShardedOptimizer::whole_moments(const GPT& model, const AdamW& optimizer, std::vector<float>& m,
                                     std::vector<float>& v) {
    // Every rank is at the same step, so all hold moments of the same kind: none yet, the
    // whole state (read from a checkpoint, not yet cut to a shard), or their shards.
    const Shard mine = shard(model);
    if (optimizer.m.empty() || optimizer.m.size() == model.parameters().size()) {
        m = optimizer.m;
        v = optimizer.v;
        return;
    }
    if (optimizer.m.size() != mine.size() || optimizer.v.size() != mine.size()) {
        throw std::logic_error("ShardedOptimizer: moments of " + std::to_string(optimizer.m.size()) +
                               " parameters for a shard of " + std::to_string(mine.size()));
    }
    std::vector<int> counts, offsets;
    for (int r = 0; r < size(); ++r) {
        const Shard s = shard_of(model.parameters().size(), r, size());
        counts.push_back(count_of(s.size()));
        offsets.push_back(count_of(s.begin));
    }
    m.assign(rank() == 0 ? model.parameters().size() : 0, 0.0f);
    v.assign(m.size(), 0.0f);
    MPI_Gatherv(optimizer.m.data(), counts[static_cast<std::size_t>(rank())], MPI_FLOAT, m.data(), counts.data(),
                offsets.data(), MPI_FLOAT, 0, MPI_COMM_WORLD);
    MPI_Gatherv(optimizer.v.data(), counts[static_cast<std::size_t>(rank())], MPI_FLOAT, v.data(), counts.data(),
                offsets.data(), MPI_FLOAT, 0, MPI_COMM_WORLD);
}

}  // namespace attn::mpi
