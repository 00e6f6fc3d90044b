// ZeRO stages 1, 2 and 3: AdamW's moments (in stage 2 the summed gradients too, in stage 3 the
// parameters too) sharded over the ranks, the gradients reduce-scattered and the parameters all-gathered by rings of
// MPI_Sendrecv that count what they send.
#include "attn/mpi/zero.hpp"

#include "attn/fault.hpp"
#include "attn/gpt.hpp"

#include <algorithm>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>

namespace attn::mpi {

namespace {
int count_of(std::size_t n) {
    if (n > static_cast<std::size_t>(INT_MAX)) {
        throw std::invalid_argument("a shard of " + std::to_string(n) + " floats is more than one MPI call sends");
    }
    return static_cast<int>(n);
}

// The rings move a shard in pieces of at most this many floats (64 KiB), so that what a rank
// receives needs a buffer of this size, not of a shard.
constexpr std::size_t ring_chunk = 16384;

// The pieces every rank cuts its step's sends into: the same number on every rank (that of
// the largest shard), so that the ranks' MPI_Sendrecv calls pair up; a rank whose shard is
// shorter sends or receives nothing in the last.
std::size_t ring_pieces(std::size_t n, int N) {
    const std::size_t largest = shard_of(n, 0, N).size();
    return (largest + ring_chunk - 1) / ring_chunk;
}

// The floats of piece `c` of a shard of `size`.
std::size_t piece_floats(std::size_t size, std::size_t c) {
    return c * ring_chunk >= size ? 0 : std::min(ring_chunk, size - c * ring_chunk);
}

//! [reduce_scatter]
// A ring reduce-scatter of `data`'s n floats over the world's N ranks: afterwards this rank's
// shard_of(n, r, N) holds the sum over the ranks. Returns the bytes this rank sent.
std::size_t ring_reduce_scatter(float* data, std::size_t n, std::vector<float>& scratch) {
    int r = 0, N = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    const int next = (r + 1) % N, previous = (r + N - 1) % N;
    std::size_t sent = 0;
    // N − 1 steps round the ring: each rank passes on a shard's running sum and adds its own
    // gradients to the one it receives. The last one it receives is its own shard, complete.
    for (int step = 0; step < N - 1; ++step) {
        const Shard out = shard_of(n, ring_reduce_scatter_send(r, step, N), N);
        const Shard in = shard_of(n, ring_reduce_scatter_send(previous, step, N), N);
        for (std::size_t c = 0; c < ring_pieces(n, N); ++c) {  // a shard in pieces of 64 KiB
            const std::size_t send = piece_floats(out.size(), c), receive = piece_floats(in.size(), c);
            const std::size_t from = out.begin + c * ring_chunk, to = in.begin + c * ring_chunk;
            scratch.resize(std::max(scratch.size(), receive));
            MPI_Sendrecv(data + from, count_of(send), MPI_FLOAT, next, step, scratch.data(), count_of(receive),
                         MPI_FLOAT, previous, step, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            for (std::size_t i = 0; i < receive; ++i) data[to + i] += scratch[i];
            sent += send * sizeof(float);
        }
    }
    return sent;
}
//! [reduce_scatter]

//! [all_gather]
// A ring all-gather of `data`'s n floats over the N ranks of `comm`, in place: rank r's
// shard_of(n, r, N) is passed round the ring straight into the others' buffers, so that every
// rank ends with every shard. Returns the bytes this rank sent.
std::size_t ring_all_gather(float* data, std::size_t n, MPI_Comm comm = MPI_COMM_WORLD) {
    int r = 0, N = 1;
    MPI_Comm_rank(comm, &r);
    MPI_Comm_size(comm, &N);
    const int next = (r + 1) % N, previous = (r + N - 1) % N;
    std::size_t sent = 0;
    for (int step = 0; step < N - 1; ++step) {
        const Shard out = shard_of(n, ring_all_gather_send(r, step, N), N);
        const Shard in = shard_of(n, ring_all_gather_send(previous, step, N), N);
        MPI_Sendrecv(data + out.begin, count_of(out.size()), MPI_FLOAT, next, step, data + in.begin,
                     count_of(in.size()), MPI_FLOAT, previous, step, comm, MPI_STATUS_IGNORE);
        sent += out.size() * sizeof(float);
    }
    return sent;
}
//! [all_gather]

// The runs of the flat buffer that hold floats [lo, hi) of a bucket (its ranges one after the
// other): fn(offset in the flat buffer, offset in [lo, hi), floats).
template <class Fn>
void for_each_run(const GradientBucket& bucket, std::size_t lo, std::size_t hi, Fn&& fn) {
    std::size_t at = 0;  // the bucket's floats before this range
    for (const auto& [offset, size] : bucket.ranges) {
        const std::size_t a = std::max(lo, at), b = std::min(hi, at + size);
        if (a < b) fn(offset + (a - at), a - lo, b - a);
        at += size;
    }
}
}  // namespace

std::size_t ring_buffer_floats(std::size_t n, int ranks) {
    return ranks > 1 ? std::min(ring_chunk, shard_of(n, 0, ranks).size()) : 0;
}

ZeroGroup::ZeroGroup() : DataParallel(AllreduceSchedule::after) {}

float ZeroGroup::clip_shard(float* g, std::size_t n, float max_norm) {
    double local = 0.0;
    for (std::size_t i = 0; i < n; ++i) local += static_cast<double>(g[i]) * g[i];
    const double sum_sq = size() > 1 ? sum(local) : local;
    if (size() > 1) traffic_.norm_bytes = sizeof(double);
    const float norm = static_cast<float>(std::sqrt(sum_sq));
    // clip_grad_norm()'s rule, on this rank's shard (the rest is another rank's to clip).
    const float coef = max_norm / (norm + 1e-6f);
    if (max_norm > 0.0f && std::isfinite(norm) && coef < 1.0f) {
        for (std::size_t i = 0; i < n; ++i) g[i] *= coef;
    }
    return norm;
}

void ShardedOptimizer::begin_gradients(GPT&, double share) { share_ = static_cast<float>(share); }

void ShardedOptimizer::finish_gradients(GPT& model) {
    std::vector<float>& grads = model.gradients();
    scratch_.reserve(ring_buffer_floats(grads.size(), size()));  // once, its final size
    for (float& g : grads) g *= share_;  // this rank's part of the batch's mean
    traffic_ = {};
    traffic_.reduce_scatter_bytes = ring_reduce_scatter(grads.data(), grads.size(), scratch_);
}

float ShardedOptimizer::clip_gradients(GPT& model, float max_norm) {
    // The norm of the whole gradient from each rank's sum of squares over its shard.
    const Shard mine = shard(model);
    return clip_shard(model.gradients().data() + mine.begin, mine.size(), max_norm);
}

void ShardedOptimizer::update(GPT& model, AdamW& optimizer, float lr) {
    std::vector<float>& params = model.parameters();
    const Shard mine = shard(model);
    optimizer.step_range(params, model.gradients(), model.parameter_table(), lr, mine.begin, mine.end);
    traffic_.all_gather_bytes += ring_all_gather(params.data(), params.size());
    last_ = traffic_;
}

bool ShardedOptimizer::owned_state(const GPT& model, const AdamW& optimizer, OwnedState& out) const {
    out.scheme = "zero-1";
    const Shard mine = shard(model);
    out.segments = {{mine.begin, mine.size()}};
    const float* params = model.parameters().data() + mine.begin;
    out.weights = [params](std::size_t) { return params; };
    // None yet, the whole state (read from a checkpoint, not yet cut), or the shard's.
    const bool whole = optimizer.m.size() == model.parameters().size();
    if (!optimizer.m.empty()) {
        if (!whole && optimizer.m.size() != mine.size()) {
            throw std::logic_error("ShardedOptimizer: moments of " + std::to_string(optimizer.m.size()) +
                                   " parameters for a shard of " + std::to_string(mine.size()));
        }
        const float* m = optimizer.m.data() + (whole ? mine.begin : 0);
        const float* v = optimizer.v.data() + (whole ? mine.begin : 0);
        out.m = [m](std::size_t) { return m; };
        out.v = [v](std::size_t) { return v; };
    }
    return true;
}

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

namespace attn::mpi {

std::size_t ShardedGradients::largest_piece(const GPT& model) const {
    std::size_t largest = 0;
    for (const GradientBucket& bucket : model.gradient_buckets()) largest = std::max(largest, ring_buffer_floats(bucket.size, size()));
    return largest;
}

std::vector<AdamW::Segment> kept_segments(const GPT& model, int stage, int rank, int ranks) {
    if (stage == 1) {
        const Shard mine = shard_of(model.config().num_parameters(), rank, ranks);
        return {{mine.begin, mine.size()}};
    }
    std::vector<AdamW::Segment> runs;
    for (const GradientBucket& bucket : model.gradient_buckets()) {
        const Shard piece = shard_of(bucket.size, rank, ranks);
        for_each_run(bucket, piece.begin, piece.end,
                     [&](std::size_t offset, std::size_t, std::size_t n) { runs.push_back({offset, n}); });
    }
    return runs;
}

std::vector<AdamW::Segment> ShardedGradients::segments(const GPT& model) const {
    return kept_segments(model, 2, rank(), size());
}

namespace {
// Where run k of `runs` lies in moments that are either whole (the flat order) or this rank's
// runs one after the other ("packed"); nullptr for none yet.
std::function<const float*(std::size_t)> moments_at(const std::vector<float>& moments, bool packed,
                                                    const std::vector<AdamW::Segment>& runs) {
    if (moments.empty()) return {};
    if (!packed) return [&moments, runs](std::size_t k) { return moments.data() + runs[k].offset; };
    std::vector<std::size_t> at;
    std::size_t n = 0;
    for (const AdamW::Segment& s : runs) {
        at.push_back(n);
        n += s.size;
    }
    if (moments.size() != n) {
        throw std::logic_error("ZeRO: moments of " + std::to_string(moments.size()) + " parameters for runs of " +
                               std::to_string(n));
    }
    return [&moments, at](std::size_t k) { return moments.data() + at[k]; };
}
}  // namespace

bool ShardedGradients::owned_state(const GPT& model, const AdamW& optimizer, OwnedState& out) const {
    out.scheme = "zero-2";
    out.segments = segments(model);
    const std::vector<AdamW::Segment>& runs = out.segments;
    const float* params = model.parameters().data();
    out.weights = [params, runs](std::size_t k) { return params + runs[k].offset; };
    // Cut by an update, or read cut from a sharded checkpoint; else whole (an unsharded
    // checkpoint's, not yet cut) or none.
    const bool packed = moments_cut_ || optimizer.m.size() != model.config().num_parameters();
    out.m = moments_at(optimizer.m, packed, runs);
    out.v = moments_at(optimizer.v, packed, runs);
    return true;
}

std::size_t ShardedGradients::gradient_bytes() const {
    return (shard_.capacity() + scratch_.capacity() + sending_.capacity()) * sizeof(float);
}

void ShardedGradients::begin_gradients(GPT& model, double share) {
    share_ = static_cast<float>(share);
    traffic_ = {};
    piece_at_.clear();
    std::size_t mine = 0;
    for (const GradientBucket& bucket : model.gradient_buckets()) {
        piece_at_.push_back(mine);
        mine += shard_of(bucket.size, rank(), size()).size();
    }
    shard_.assign(mine, 0.0f);
    // The reduce-scatter's buffer, once, at its final size: the largest piece of any bucket.
    scratch_.reserve(largest_piece(model));
    const GPT* m = &model;
    model.set_gradient_sink([this, m](int bucket, float* gradients) { take(*m, bucket, gradients); });
}

//! [stage2]
void ShardedGradients::take(const GPT& model, int bucket, float* gradients) {
    fault_point("take", rank());
    const std::vector<GradientBucket>& buckets = model.gradient_buckets();
    const std::size_t n = buckets[static_cast<std::size_t>(bucket)].size;
    for (std::size_t i = 0; i < n; ++i) gradients[i] *= share_;  // this rank's part of the mean
    // The bucket's sum round the ring, this rank's piece of it kept; the model reuses the
    // buffer for its next block as soon as this returns.
    traffic_.reduce_scatter_bytes += ring_reduce_scatter(gradients, n, scratch_);
    const Shard piece = shard_of(n, rank(), size());
    std::copy(gradients + piece.begin, gradients + piece.end,
              shard_.begin() + static_cast<std::ptrdiff_t>(piece_at_[static_cast<std::size_t>(bucket)]));
}
//! [stage2]

void ShardedGradients::finish_gradients(GPT&) {}  // every bucket was taken during the pass

float ShardedGradients::clip_gradients(GPT&, float max_norm) { return clip_shard(shard_.data(), shard_.size(), max_norm); }

void ShardedGradients::cut_moments(const GPT& model, AdamW& optimizer, const std::vector<AdamW::Segment>& mine) {
    const std::size_t P = model.config().num_parameters();
    std::size_t n = 0;
    for (const AdamW::Segment& s : mine) n += s.size;
    if (!moments_cut_ && optimizer.m.size() != P && optimizer.m.size() == n) {
        moments_cut_ = true;  // another ShardedGradients' pieces: the same rule cut them
    }
    if (!moments_cut_ && !optimizer.m.empty()) {
        if (optimizer.m.size() != P || optimizer.v.size() != optimizer.m.size()) {
            throw std::logic_error("ShardedGradients: moments of " + std::to_string(optimizer.m.size()) +
                                   " parameters, neither the model's " + std::to_string(P) +
                                   " nor this rank's " + std::to_string(n));
        }
        // A checkpoint's whole state, in the flat buffer's order: this rank's pieces of it.
        std::vector<float> m, v;
        for (const AdamW::Segment& s : mine) {
            const auto from = static_cast<std::ptrdiff_t>(s.offset), to = static_cast<std::ptrdiff_t>(s.offset + s.size);
            m.insert(m.end(), optimizer.m.begin() + from, optimizer.m.begin() + to);
            v.insert(v.end(), optimizer.v.begin() + from, optimizer.v.begin() + to);
        }
        optimizer.m = std::move(m);
        optimizer.v = std::move(v);
    }
    moments_cut_ = true;
}

void ShardedGradients::update(GPT& model, AdamW& optimizer, float lr) {
    std::vector<float>& params = model.parameters();
    const std::vector<AdamW::Segment> mine = segments(model);
    cut_moments(model, optimizer, mine);
    optimizer.step_segments(params, shard_.data(), model.parameter_table(), lr, mine);
    sending_.reserve(largest_piece(model));  // once, at its final size
    const int N = size(), r = rank();
    const int next = (r + 1) % N, previous = (r + N - 1) % N;
    // Bucket by bucket, each rank's piece of new parameters round the ring: packed from the
    // flat buffer, and unpacked into it on arrival.
    for (const GradientBucket& bucket : model.gradient_buckets()) {
        for (int step = 0; step < N - 1; ++step) {
            const Shard out = shard_of(bucket.size, ring_all_gather_send(r, step, N), N);
            const Shard in = shard_of(bucket.size, ring_all_gather_send(previous, step, N), N);
            for (std::size_t c = 0; c < ring_pieces(bucket.size, N); ++c) {  // in pieces of 64 KiB
                const std::size_t send = piece_floats(out.size(), c), receive = piece_floats(in.size(), c);
                const std::size_t from = out.begin + c * ring_chunk, to = in.begin + c * ring_chunk;
                sending_.resize(std::max(sending_.size(), send));
                scratch_.resize(std::max(scratch_.size(), receive));
                for_each_run(bucket, from, from + send, [&](std::size_t offset, std::size_t at, std::size_t k) {
                    std::copy(params.begin() + static_cast<std::ptrdiff_t>(offset),
                              params.begin() + static_cast<std::ptrdiff_t>(offset + k),
                              sending_.begin() + static_cast<std::ptrdiff_t>(at));
                });
                MPI_Sendrecv(sending_.data(), count_of(send), MPI_FLOAT, next, step, scratch_.data(), count_of(receive),
                             MPI_FLOAT, previous, step, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                for_each_run(bucket, to, to + receive, [&](std::size_t offset, std::size_t at, std::size_t k) {
                    std::copy(scratch_.begin() + static_cast<std::ptrdiff_t>(at),
                              scratch_.begin() + static_cast<std::ptrdiff_t>(at + k),
                              params.begin() + static_cast<std::ptrdiff_t>(offset));
                });
                traffic_.all_gather_bytes += send * sizeof(float);
            }
        }
    }
    last_ = traffic_;
}

void ShardedGradients::whole_moments(const GPT& model, const AdamW& optimizer, std::vector<float>& m,
                                     std::vector<float>& v) {
    const std::size_t P = model.config().num_parameters();
    if (!moments_cut_ || optimizer.m.empty()) {  // none yet, or a checkpoint's whole state
        m = optimizer.m;
        v = optimizer.v;
        return;
    }
    std::size_t mine = 0;
    for (const GradientBucket& bucket : model.gradient_buckets()) mine += shard_of(bucket.size, rank(), size()).size();
    if (optimizer.m.size() != mine || optimizer.v.size() != mine) {
        throw std::logic_error("ShardedGradients: moments of " + std::to_string(optimizer.m.size()) +
                               " parameters for pieces of " + std::to_string(mine));
    }
    m.assign(rank() == 0 ? P : 0, 0.0f);
    v.assign(m.size(), 0.0f);
    std::vector<float> whole_bucket;
    std::size_t at = 0;  // this rank's piece of the bucket in its moments
    for (const GradientBucket& bucket : model.gradient_buckets()) {
        std::vector<int> counts, offsets;
        for (int q = 0; q < size(); ++q) {
            const Shard s = shard_of(bucket.size, q, size());
            counts.push_back(count_of(s.size()));
            offsets.push_back(count_of(s.begin));
        }
        const int own = counts[static_cast<std::size_t>(rank())];
        whole_bucket.assign(rank() == 0 ? bucket.size : 0, 0.0f);
        for (int which = 0; which < 2; ++which) {
            const std::vector<float>& moments = which == 0 ? optimizer.m : optimizer.v;
            MPI_Gatherv(moments.data() + at, own, MPI_FLOAT, whole_bucket.data(), counts.data(), offsets.data(),
                        MPI_FLOAT, 0, MPI_COMM_WORLD);
            if (rank() != 0) continue;
            std::vector<float>& out = which == 0 ? m : v;
            for_each_run(bucket, 0, bucket.size, [&](std::size_t offset, std::size_t a, std::size_t k) {
                std::copy(whole_bucket.begin() + static_cast<std::ptrdiff_t>(a),
                          whole_bucket.begin() + static_cast<std::ptrdiff_t>(a + k), out.begin() + static_cast<std::ptrdiff_t>(offset));
            });
        }
        at += static_cast<std::size_t>(own);
    }
}

}  // namespace attn::mpi

namespace attn::mpi {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

// The communication thread of a rank: it runs the ring all-gathers it is given, one after the
// other in the order they were started, on a communicator of its own (a duplicate of the
// world's), so that its messages never meet those of the collectives the passes' thread runs
// meanwhile (stage 3's reduce-scatters).
class ShardedParameters::Gatherer {
public:
    Gatherer() {
        int level = MPI_THREAD_SINGLE;
        MPI_Query_thread(&level);
        if (level < MPI_THREAD_MULTIPLE) {
            throw std::runtime_error("ZeRO stage 3 gathers the next block's weights on a second thread while the "
                                     "passes compute, which needs MPI_THREAD_MULTIPLE, and this MPI was started "
                                     "with less");
        }
        MPI_Comm_dup(MPI_COMM_WORLD, &comm_);  // collective: every rank attaches together
        thread_ = std::thread([this] { run(); });
    }
    ~Gatherer() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stop_ = true;  // a gather under way ends first; none started after
        }
        changed_.notify_all();
        thread_.join();
        int finalized = 0;
        MPI_Finalized(&finalized);
        if (!finalized) MPI_Comm_free(&comm_);
    }
    Gatherer(const Gatherer&) = delete;
    Gatherer& operator=(const Gatherer&) = delete;

    // Queues the gather of bucket b's n floats at `data` (this rank's piece already in place).
    void start(int bucket, float* data, std::size_t n) {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            Request r;
            r.bucket = bucket;
            r.data = data;
            r.n = n;
            queue_.push_back(r);
        }
        changed_.notify_all();
    }
    // Waits for the oldest gather not waited for yet, bucket b's. Returns the bytes it sent;
    // adds the seconds it took, and those spent waiting for it, to `times`.
    std::size_t wait(int bucket, GatherTimes& times) {
        const auto t0 = std::chrono::steady_clock::now();
        std::unique_lock<std::mutex> lock(mutex_);
        if (queue_.empty() || queue_.front().bucket != bucket) {
            throw std::logic_error("ShardedParameters: bucket " + std::to_string(bucket) +
                                   " waited for is not the oldest gather started");
        }
        changed_.wait(lock, [this] { return queue_.front().done; });
        const Request r = queue_.front();
        queue_.pop_front();
        --next_;
        lock.unlock();
        times.waiting += seconds_since(t0);
        times.gathering += r.seconds;
        if (r.error) std::rethrow_exception(r.error);
        return r.sent;
    }
    // Whether every gather started was waited for.
    bool idle() {
        std::lock_guard<std::mutex> lock(mutex_);
        return queue_.empty();
    }

private:
    struct Request {
        int bucket = 0;
        float* data = nullptr;
        std::size_t n = 0;
        bool done = false;
        std::size_t sent = 0;
        double seconds = 0.0;
        std::exception_ptr error;
    };
    void run() {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            changed_.wait(lock, [this] { return stop_ || next_ < queue_.size(); });
            if (stop_) return;
            const Request r = queue_[next_];
            lock.unlock();
            const auto t0 = std::chrono::steady_clock::now();
            std::size_t sent = 0;
            std::exception_ptr error;
            try {
                int rank = 0;
                MPI_Comm_rank(comm_, &rank);
                fault_point("gather", rank);
                sent = ring_all_gather(r.data, r.n, comm_);
            } catch (...) {
                error = std::current_exception();
            }
            const double seconds = seconds_since(t0);
            lock.lock();
            Request& done = queue_[next_];  // the same request: only wait() pops, and not this one
            done.sent = sent;
            done.seconds = seconds;
            done.error = error;
            done.done = true;
            ++next_;
            changed_.notify_all();
        }
    }

    MPI_Comm comm_ = MPI_COMM_NULL;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<Request> queue_;  // started and not yet waited for, oldest first
    std::size_t next_ = 0;       // queue_[next_] is the next to run (those before it are done)
    bool stop_ = false;
    std::thread thread_;  // last: started once the rest is ready
};

ShardedParameters::ShardedParameters() = default;
ShardedParameters::~ShardedParameters() = default;

void ShardedParameters::attach(GPT& model) {
    if (model.precision() != Precision::fp32) {
        throw std::invalid_argument(std::string("ZeRO stage 3 gathers the weights a block at a time, and mixed "
                                                "precision (") + precision_name(model.precision()) +
                                    ") rounds a copy of the whole weights, which no rank holds: train in fp32");
    }
    if (!gatherer_) gatherer_ = std::make_unique<Gatherer>();
    // This rank's piece of every bucket's parameters, packed as its gradients are, then the
    // model lets go of its whole buffer.
    bucket_sizes_.clear();
    piece_at_.clear();
    weights_.clear();
    const std::vector<float>& params = model.parameters();
    const bool whole = params.size() == model.config().num_parameters();
    std::vector<std::pair<std::size_t, std::size_t>> runs;  // this rank's, in order
    for (const GradientBucket& bucket : model.gradient_buckets()) {
        const Shard piece = shard_of(bucket.size, rank(), size());
        bucket_sizes_.push_back(bucket.size);
        piece_at_.push_back(weights_.size());
        for_each_run(bucket, piece.begin, piece.end, [&](std::size_t offset, std::size_t, std::size_t n) {
            runs.emplace_back(offset, n);
            if (whole) {
                weights_.insert(weights_.end(), params.begin() + static_cast<std::ptrdiff_t>(offset),
                                params.begin() + static_cast<std::ptrdiff_t>(offset + n));
            }
        });
        if (!whole) piece_at_.back() = 0;  // set below
    }
    if (!whole) {
        // A model made without whole weights (GPTBuffers): its shard read from a checkpoint,
        // or the seed's initial values of these runs alone.
        weights_ = model.take_kept_weights(runs);
        std::size_t at = 0;
        for (std::size_t b = 0; b < bucket_sizes_.size(); ++b) {
            piece_at_[b] = at;
            at += shard_of(bucket_sizes_[b], rank(), size()).size();
        }
    }
    weights_.shrink_to_fit();
    model.set_weight_source({[this](int bucket, float* weights) { start(bucket, weights); },
                             [this](int bucket) { wait(bucket); }});
}

//! [stage3]
void ShardedParameters::start(int bucket, float* weights) {
    const std::size_t b = static_cast<std::size_t>(bucket), n = bucket_sizes_[b];
    // A forward pass starts with the embeddings (the last bucket): a new step's traffic.
    if (b + 1 == bucket_sizes_.size() && !in_backward_) {
        traffic_ = {};
        times_ = {};
    }
    const Shard own = shard_of(n, rank(), size());
    std::copy(weights_.begin() + static_cast<std::ptrdiff_t>(piece_at_[b]),
              weights_.begin() + static_cast<std::ptrdiff_t>(piece_at_[b] + own.size()), weights + own.begin);
    // Every rank's piece round the ring, straight into its place in the bucket's buffer, on
    // the communication thread while this one goes on.
    gatherer_->start(bucket, weights, n);
}

void ShardedParameters::wait(int bucket) { traffic_.all_gather_bytes += gatherer_->wait(bucket, times_); }
//! [stage3]

bool ShardedParameters::owned_state(const GPT& model, const AdamW& optimizer, OwnedState& out) const {
    ShardedGradients::owned_state(model, optimizer, out);
    out.scheme = "zero-3";
    // The pieces of the weights where this rank keeps them, packed as its runs (attach()).
    std::vector<std::size_t> at;
    std::size_t n = 0;
    for (const AdamW::Segment& s : out.segments) {
        at.push_back(n);
        n += s.size;
    }
    if (n != weights_.size()) {
        throw std::logic_error("ShardedParameters: " + std::to_string(weights_.size()) + " weights kept for runs of " +
                               std::to_string(n));
    }
    const float* weights = weights_.data();
    out.weights = [weights, at](std::size_t k) { return weights + at[k]; };
    return true;
}

void ShardedParameters::begin_gradients(GPT& model, double share) {
    const ZeroTraffic forward = traffic_;  // the forward pass's gathers, counted in this step
    ShardedGradients::begin_gradients(model, share);
    traffic_ = forward;
    in_backward_ = true;
}

void ShardedParameters::update(GPT& model, AdamW& optimizer, float lr) {
    if (!gatherer_->idle()) throw std::logic_error("ShardedParameters::update: a gather is still under way");
    const std::vector<AdamW::Segment> mine = segments(model);
    cut_moments(model, optimizer, mine);
    // This rank's pieces where they lie; the next forward pass gathers them.
    optimizer.step_packed(weights_.data(), shard_.data(), model.parameter_table(), lr, mine);
    in_backward_ = false;
    last_ = traffic_;
    last_times_ = times_;
}

}  // namespace attn::mpi
