/// @file data_parallel.hpp
/// @brief Data parallelism over MPI (lesson 19): every rank holds the whole model, runs its
/// share of each batch, and the gradients are summed with MPI's allreduce, bucket by bucket
/// while the backward pass is still running, or in one call after it.
#pragma once

#include "attn/trainer.hpp"

#include <mpi.h>

#include <cstddef>
#include <string>
#include <vector>

namespace attn::mpi {

/// When the gradients are summed over the ranks.
enum class AllreduceSchedule {
    /// Each bucket of GPT::gradient_buckets() starts a non-blocking allreduce
    /// (MPI_Iallreduce) as soon as the backward pass has finished it, so that the sums of
    /// the later layers travel while the earlier layers are still being computed; the step
    /// waits for all of them at the end.
    overlapped,
    /// One blocking allreduce (MPI_Allreduce) of every gradient once the backward pass is
    /// done: nothing overlaps.
    after,
};

/// The schedule's name as `train_gpt --allreduce` spells it: "overlapped" or "after".
/// @param schedule the schedule @return its name
const char* schedule_name(AllreduceSchedule schedule);

/// The schedule of a name. @param name "overlapped" or "after" @return the schedule
/// @throws std::invalid_argument for any other name
AllreduceSchedule parse_schedule(const std::string& name);

/// What the gradient sums of the last step cost this rank.
struct AllreduceTiming {
    double backward_seconds = 0.0;  ///< wall time of the backward pass (with the overlapped starts)
    /// Wall time the step spent waiting for the sums after the backward pass: the
    /// communication that did not hide behind it (with `after`, the whole allreduce).
    double exposed_seconds = 0.0;
    /// When this rank's backward pass ended, in seconds of the machine's monotonic clock
    /// (std::chrono::steady_clock), which the ranks of one machine share.
    double backward_end = 0.0;
    /// When this rank handed in its last gradients to be summed (its last bucket's start, or
    /// the one allreduce after the pass). No sum ends before every rank's hand-in: the time
    /// from a rank's backward_end to the last rank's hand-in is skew, a rank waiting for a
    /// slower one, not communication.
    double handed_in = 0.0;
    std::size_t bytes = 0;   ///< the gradient bytes handed to MPI (4 per parameter)
    int allreduce_calls = 0; ///< allreduces started: one per bucket, or one
};

/// A data-parallel group over MPI's world communicator (Trainer::use_group). MPI must be
/// initialised (attn::mpi::World).
class DataParallel : public DataParallelGroup {
public:
    /// @param schedule when the gradients are summed
    explicit DataParallel(AllreduceSchedule schedule = AllreduceSchedule::overlapped);
    ~DataParallel() override;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void begin_gradients(GPT& model, double share) override;
    void finish_gradients(GPT& model) override;
    double sum(double value) override;
    bool any(bool flag) override;
    void check_same(std::uint64_t fingerprint, const std::string& what) override;
    void barrier() override;

    /// The schedule in use.
    AllreduceSchedule schedule() const { return schedule_; }
    /// What the last step's gradient sums cost.
    const AllreduceTiming& last_timing() const { return timing_; }

private:
    void start_bucket(GPT& model, int bucket);

    AllreduceSchedule schedule_;
    int rank_ = 0, size_ = 1;
    float share_ = 1.0f;
    std::vector<std::vector<float>> buckets_;  // one packed buffer per gradient bucket
    std::vector<MPI_Request> requests_;        // one per started bucket
    double backward_start_ = 0.0;
    AllreduceTiming timing_;
};

}  // namespace attn::mpi
