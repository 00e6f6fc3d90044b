/// @file data_parallel.hpp
/// @brief Data parallelism over MPI (lesson 19): every rank holds the whole model, runs its
/// share of each batch, and the gradients are summed with MPI's allreduce, bucket by bucket
/// while the backward pass is still running, or in one call after it.
#pragma once

#include "attn/trainer.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
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

/// How the overlapped schedule groups the model's gradients into allreduce calls, after
/// PyTorch's DistributedDataParallel (its `bucket_cap_mb` and `gradient_as_bucket_view`).
/// The model finishes its gradients a block at a time (GPT::gradient_buckets()), so a bucket
/// here is one or more whole blocks in the order the backward pass finishes them: blocks are
/// added to a bucket until it holds at least its cap, as DDP adds tensors.
struct BucketPlan {
    /// Bytes a bucket holds before it is closed and its sum started; 0 (the default): every
    /// block is a bucket of its own. DDP's default is 25 MiB.
    std::size_t cap_bytes = 0;
    /// The cap of the first bucket (DDP: 1 MiB, so that the first sum starts early); 0: the
    /// same as cap_bytes.
    std::size_t first_cap_bytes = 0;
    /// Sum the gradients where the model keeps them, one in-place allreduce per contiguous
    /// range of the bucket, instead of copying the bucket into one packed buffer and the sum
    /// back (DDP's gradient_as_bucket_view saves that copy the same way). The model keeps each
    /// kind of tensor of all blocks together (llm.c's layout), so a bucket of k blocks is as
    /// many ranges as a block has tensors: more, smaller calls, and no copy.
    bool view = false;
};

/// Bytes from megabytes as `train_gpt --bucket-cap-mb` takes them (MiB, as DDP's
/// bucket_cap_mb). @param megabytes from 0 to 1e6 @return bytes
/// @throws std::invalid_argument outside that range
std::size_t bucket_cap_bytes(double megabytes);

/// The plan in words: "one per block", "at least 0.06 MB (the first 0.03 MB), summed in place".
/// @param plan the plan @return its description
std::string describe(const BucketPlan& plan);

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
    int allreduce_calls = 0; ///< allreduces started: one per bucket (per range with view), or one
    int buckets = 0;         ///< buckets of the plan (1 with `after`)
};

/// A data-parallel group over MPI's world communicator (Trainer::use_group). MPI must be
/// initialised (attn::mpi::World).
class DataParallel : public DataParallelGroup {
public:
    /// @param schedule when the gradients are summed
    /// @param plan how the overlapped schedule groups the gradients (ignored by `after`,
    /// which sums every gradient in one call)
    explicit DataParallel(AllreduceSchedule schedule = AllreduceSchedule::overlapped, BucketPlan plan = {});
    ~DataParallel() override;

    int rank() const override { return rank_; }
    int size() const override { return size_; }
    void begin_gradients(GPT& model, double share) override;
    void finish_gradients(GPT& model) override;
    double sum(double value) override;
    bool any(bool flag) override;
    void check_same(std::uint64_t fingerprint, const std::string& what) override;
    void barrier() override;
    /// The packed buffers of the buckets (one float per gradient, a whole copy of them), which
    /// the overlapped schedule keeps unless BucketPlan::view sums in place; none with `after`.
    /// @return their bytes
    std::size_t gradient_bytes() const override;

    /// The schedule in use.
    AllreduceSchedule schedule() const { return schedule_; }
    /// The bucket plan in use.
    const BucketPlan& plan() const { return plan_; }
    /// What the last step's gradient sums cost.
    const AllreduceTiming& last_timing() const { return timing_; }
    /// The times the gradients were summed over the ranks since the group was made, one per
    /// finish_gradients(): one per step, however many micro-batches' gradients a step adds
    /// up first (TrainConfig::grad_accum, DDP's no_sync). @return the count
    std::int64_t gradient_sums() const { return gradient_sums_; }
    /// The allreduce calls of those sums, all together (AllreduceTiming::allreduce_calls of
    /// every step). @return the count
    std::int64_t allreduce_calls() const { return allreduce_calls_; }

    /// A bucket of the plan: the model's gradient buckets (blocks) first..last, and its
    /// contiguous ranges in the flat gradient buffer (adjacent ranges joined).
    struct Bucket {
        int first = 0;         ///< its first gradient bucket of the model (GPT::gradient_buckets())
        int last = 0;          ///< its last: the sum starts when the backward pass has finished it
        std::size_t size = 0;  ///< floats
        /// (offset, size) of each contiguous range in the flat gradient buffer, by offset
        std::vector<std::pair<std::size_t, std::size_t>> ranges;
    };
    /// The plan's buckets for a model, in the order their sums start.
    /// @param model the model @param plan the plan @return the buckets
    static std::vector<Bucket> plan_buckets(const GPT& model, const BucketPlan& plan);

private:
    void start_bucket(GPT& model, const Bucket& bucket, std::vector<float>& packed);

    AllreduceSchedule schedule_;
    BucketPlan plan_;
    std::vector<Bucket> plan_buckets_;         // plan_buckets() of the model in use
    int rank_ = 0, size_ = 1;
    float share_ = 1.0f;
    std::vector<std::vector<float>> buckets_;  // one packed buffer per bucket (not with view)
    std::vector<MPI_Request> requests_;        // one per started allreduce
    std::size_t started_ = 0;                  // buckets whose sums have started this step
    double backward_start_ = 0.0;
    AllreduceTiming timing_;
    std::int64_t gradient_sums_ = 0, allreduce_calls_ = 0;  // since the group was made
};

}  // namespace attn::mpi
