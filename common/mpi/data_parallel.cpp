// Data parallelism over MPI: gradient buckets summed while the backward pass runs.
#include "attn/mpi/data_parallel.hpp"

#include "attn/gpt.hpp"

#include <chrono>
#include <cstdint>
#include <stdexcept>

namespace attn::mpi {

namespace {
// The machine's monotonic clock, the same for every process on it (MPI_Wtime is not: Open MPI
// counts it from each process's own start).
double machine_seconds() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

const char* schedule_name(AllreduceSchedule schedule) {
    return schedule == AllreduceSchedule::after ? "after" : "overlapped";
}

AllreduceSchedule parse_schedule(const std::string& name) {
    if (name == "overlapped") return AllreduceSchedule::overlapped;
    if (name == "after") return AllreduceSchedule::after;
    throw std::invalid_argument("unknown allreduce schedule '" + name +
                                "' (the schedules are: overlapped, after)");
}

DataParallel::DataParallel(AllreduceSchedule schedule) : schedule_(schedule) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

DataParallel::~DataParallel() {
    // A step abandoned by an exception may leave sums in flight: they must end before their
    // buffers do.
    if (!requests_.empty()) MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(),
                                        MPI_STATUSES_IGNORE);
}

void DataParallel::begin_gradients(GPT& model, double share) {
    share_ = static_cast<float>(share);
    timing_ = {};
    backward_start_ = MPI_Wtime();
    if (schedule_ == AllreduceSchedule::after) return;
    const std::vector<GradientBucket>& buckets = model.gradient_buckets();
    buckets_.resize(buckets.size());
    for (std::size_t b = 0; b < buckets.size(); ++b) buckets_[b].resize(buckets[b].size);
    requests_.clear();
    model.set_gradient_ready_hook([this, &model](int bucket) {
        start_bucket(model, bucket);
        timing_.handed_in = machine_seconds();  // the last bucket's time stays
    });
}

//! [bucket]
void DataParallel::start_bucket(GPT& model, int bucket) {
    // Copy the bucket's gradients into one buffer, weighted by this rank's share of the
    // batch, and start summing it over the ranks without waiting for the sum.
    const GradientBucket& info = model.gradient_buckets()[static_cast<std::size_t>(bucket)];
    std::vector<float>& packed = buckets_[static_cast<std::size_t>(bucket)];
    const float* grads = model.gradients().data();
    std::size_t at = 0;
    for (const auto& [offset, size] : info.ranges) {
        for (std::size_t i = 0; i < size; ++i) packed[at++] = share_ * grads[offset + i];
    }
    requests_.emplace_back();
    MPI_Iallreduce(MPI_IN_PLACE, packed.data(), static_cast<int>(packed.size()), MPI_FLOAT,
                   MPI_SUM, MPI_COMM_WORLD, &requests_.back());
    // MPI moves a non-blocking collective on only inside its own calls: testing the sums in
    // flight lets them progress while the backward pass computes the next bucket.
    int done = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    timing_.bytes += packed.size() * sizeof(float);
    ++timing_.allreduce_calls;
}
//! [bucket]

void DataParallel::finish_gradients(GPT& model) {
    const double backward_end = MPI_Wtime();
    timing_.backward_seconds = backward_end - backward_start_;
    timing_.backward_end = machine_seconds();
    if (schedule_ == AllreduceSchedule::after) timing_.handed_in = timing_.backward_end;
    std::vector<float>& grads = model.gradients();
    if (schedule_ == AllreduceSchedule::after) {
        //! [after]
        for (float& g : grads) g *= share_;
        MPI_Allreduce(MPI_IN_PLACE, grads.data(), static_cast<int>(grads.size()), MPI_FLOAT,
                      MPI_SUM, MPI_COMM_WORLD);
        //! [after]
        timing_.bytes = grads.size() * sizeof(float);
        timing_.allreduce_calls = 1;
    } else {
        model.set_gradient_ready_hook({});
        if (requests_.size() != buckets_.size()) {
            throw std::logic_error("DataParallel: the backward pass finished " +
                                   std::to_string(requests_.size()) + " of " +
                                   std::to_string(buckets_.size()) + " gradient buckets");
        }
        MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
        requests_.clear();
        // The sums back into the model's gradients.
        const std::vector<GradientBucket>& buckets = model.gradient_buckets();
        for (std::size_t b = 0; b < buckets.size(); ++b) {
            std::size_t at = 0;
            for (const auto& [offset, size] : buckets[b].ranges) {
                for (std::size_t i = 0; i < size; ++i) grads[offset + i] = buckets_[b][at++];
            }
        }
    }
    timing_.exposed_seconds = MPI_Wtime() - backward_end;
}

double DataParallel::sum(double value) {
    double total = 0.0;
    MPI_Allreduce(&value, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    return total;
}

bool DataParallel::any(bool flag) {
    int mine = flag ? 1 : 0, some = 0;
    MPI_Allreduce(&mine, &some, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return some != 0;
}

void DataParallel::check_same(std::uint64_t fingerprint, const std::string& what) {
    const auto value = static_cast<unsigned long long>(fingerprint);
    unsigned long long low = 0, high = 0;
    MPI_Allreduce(&value, &low, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&value, &high, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    if (low != high) {
        // Which ranks differ from rank 0, for the message.
        unsigned long long first = value;
        MPI_Bcast(&first, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
        int differs = value != first ? 1 : 0, count = 0;
        MPI_Allreduce(&differs, &count, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        throw std::runtime_error("the ranks do not start from the same state: " + what + " differ in " +
                                 std::to_string(count) + " of " + std::to_string(size_) +
                                 " ranks from rank 0's");  // thrown in every rank alike
    }
}

void DataParallel::barrier() { MPI_Barrier(MPI_COMM_WORLD); }

}  // namespace attn::mpi
