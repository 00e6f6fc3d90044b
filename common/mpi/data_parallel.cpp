// Data parallelism over MPI: gradient buckets summed while the backward pass runs.
#include "attn/mpi/data_parallel.hpp"

#include "attn/fault.hpp"
#include "attn/gpt.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
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

std::size_t bucket_cap_bytes(double megabytes) {
    if (!(megabytes >= 0.0) || megabytes > 1e6) {
        throw std::invalid_argument("a bucket cap is a number of megabytes from 0 to 1e6, not " +
                                    std::to_string(megabytes));
    }
    return static_cast<std::size_t>(megabytes * 1024.0 * 1024.0 + 0.5);
}

std::string describe(const BucketPlan& plan) {
    auto mb = [](std::size_t bytes) {
        char text[32];
        std::snprintf(text, sizeof text, "%.3g MB", static_cast<double>(bytes) / (1024.0 * 1024.0));
        return std::string(text);
    };
    std::string s = plan.cap_bytes == 0 ? "one per block" : "at least " + mb(plan.cap_bytes);
    if (plan.first_cap_bytes != 0) s += " (the first " + mb(plan.first_cap_bytes) + ")";
    if (plan.view) s += ", summed in place";
    return s;
}

std::vector<DataParallel::Bucket> DataParallel::plan_buckets(const GPT& model, const BucketPlan& plan) {
    const std::vector<GradientBucket>& blocks = model.gradient_buckets();
    std::vector<Bucket> out;
    bool open = false;  // the last bucket takes more blocks
    for (int b = 0; b < static_cast<int>(blocks.size()); ++b) {
        if (!open) out.push_back({b, b, 0, {}});
        Bucket& bucket = out.back();
        bucket.last = b;
        bucket.size += blocks[static_cast<std::size_t>(b)].size;
        for (const auto& range : blocks[static_cast<std::size_t>(b)].ranges) bucket.ranges.push_back(range);
        // Closed once it holds its cap (a cap of 0 closes every block at once).
        const std::size_t cap = out.size() == 1 && plan.first_cap_bytes != 0 ? plan.first_cap_bytes : plan.cap_bytes;
        open = bucket.size * sizeof(float) < cap;
    }
    for (Bucket& bucket : out) {
        // Adjacent ranges joined: one block's tensor of a kind ends where the next block's
        // begins (the blocks are finished from the last one back, so sort by offset first).
        std::sort(bucket.ranges.begin(), bucket.ranges.end());
        std::vector<std::pair<std::size_t, std::size_t>> joined;
        for (const auto& [offset, size] : bucket.ranges) {
            if (!joined.empty() && joined.back().first + joined.back().second == offset) joined.back().second += size;
            else joined.emplace_back(offset, size);
        }
        bucket.ranges = std::move(joined);
    }
    return out;
}

DataParallel::DataParallel(AllreduceSchedule schedule, BucketPlan plan) : schedule_(schedule), plan_(plan) {
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
    plan_buckets_ = plan_buckets(model, plan_);
    timing_.buckets = static_cast<int>(plan_buckets_.size());
    buckets_.resize(plan_.view ? 0 : plan_buckets_.size());
    for (std::size_t b = 0; b < buckets_.size(); ++b) buckets_[b].resize(plan_buckets_[b].size);
    requests_.clear();
    started_ = 0;
    model.set_gradient_ready_hook([this, &model](int block) {
        fault_point("bucket", rank());
        // A bucket's sum starts when the backward pass has finished its last block.
        if (started_ >= plan_buckets_.size() || plan_buckets_[started_].last != block) return;
        std::vector<float> none;
        start_bucket(model, plan_buckets_[started_], plan_.view ? none : buckets_[started_]);
        ++started_;
        timing_.handed_in = machine_seconds();  // the last bucket's time stays
    });
}

//! [bucket]
void DataParallel::start_bucket(GPT& model, const Bucket& bucket, std::vector<float>& packed) {
    float* grads = model.gradients().data();
    if (plan_.view) {
        // In place: each range weighted by this rank's share of the batch where it lies, and
        // summed there; the sums land in the model's gradients with no copy back.
        for (const auto& [offset, size] : bucket.ranges) {
            for (std::size_t i = 0; i < size; ++i) grads[offset + i] *= share_;
            requests_.emplace_back();
            MPI_Iallreduce(MPI_IN_PLACE, grads + offset, static_cast<int>(size), MPI_FLOAT, MPI_SUM,
                           MPI_COMM_WORLD, &requests_.back());
            ++timing_.allreduce_calls;
        }
    } else {
        // Copy the bucket's gradients into one buffer, weighted by this rank's share of the
        // batch, and start summing it over the ranks without waiting for the sum.
        std::size_t at = 0;
        for (const auto& [offset, size] : bucket.ranges) {
            for (std::size_t i = 0; i < size; ++i) packed[at++] = share_ * grads[offset + i];
        }
        requests_.emplace_back();
        MPI_Iallreduce(MPI_IN_PLACE, packed.data(), static_cast<int>(packed.size()), MPI_FLOAT,
                       MPI_SUM, MPI_COMM_WORLD, &requests_.back());
        ++timing_.allreduce_calls;
    }
    // MPI moves a non-blocking collective on only inside its own calls: testing the sums in
    // flight lets them progress while the backward pass computes the next bucket.
    int done = 0;
    MPI_Testall(static_cast<int>(requests_.size()), requests_.data(), &done, MPI_STATUSES_IGNORE);
    timing_.bytes += bucket.size * sizeof(float);
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
        timing_.buckets = 1;
    } else {
        model.set_gradient_ready_hook({});
        if (started_ != plan_buckets_.size()) {
            throw std::logic_error("DataParallel: the backward pass finished " + std::to_string(started_) +
                                   " of " + std::to_string(plan_buckets_.size()) + " gradient buckets");
        }
        MPI_Waitall(static_cast<int>(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
        requests_.clear();
        // The sums back into the model's gradients (in place, they are there already).
        for (std::size_t b = 0; b < buckets_.size(); ++b) {
            std::size_t at = 0;
            for (const auto& [offset, size] : plan_buckets_[b].ranges) {
                for (std::size_t i = 0; i < size; ++i) grads[offset + i] = buckets_[b][at++];
            }
        }
    }
    timing_.exposed_seconds = MPI_Wtime() - backward_end;
    ++gradient_sums_;
    allreduce_calls_ += timing_.allreduce_calls;
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

std::size_t DataParallel::gradient_bytes() const {
    std::size_t bytes = 0;
    for (const std::vector<float>& b : buckets_) bytes += b.capacity() * sizeof(float);
    return bytes;
}

}  // namespace attn::mpi
