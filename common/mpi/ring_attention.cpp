// Ring attention: keys and values go round the ranks, merged by their log-sum-exps.
#include "attn/mpi/ring_attention.hpp"

#include "attn/mpi/world.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace attn::mpi {

namespace {

constexpr int kv_tag = 1, dkv_tag = 2;

// Lets MPI move the transfers in flight along (it progresses them only inside its calls).
void progress(std::vector<MPI_Request>& requests) {
    int done = 0;
    MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
}

void wait_all(std::vector<MPI_Request>& requests) {
    MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
    requests.clear();
}

void add_into(float* into, const float* x, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) into[i] += x[i];
}

}  // namespace

RingAttention::RingAttention(const AttentionShape& shape, SequenceOrder order, MergeRule merge)
    : shape_(shape), merge_(merge) {
    check_attention_shape(shape);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    split_ = SequenceSplit{shape.T, static_cast<std::size_t>(size_), order};
    split_.validate();
    piece_rows_ = shape.B * shape.NH * split_.piece_length();
    piece_floats_ = piece_rows_ * shape.hs;
    local_rows_ = split_.pieces_per_rank() * piece_rows_;
    local_floats_ = split_.pieces_per_rank() * piece_floats_;
}

void RingAttention::forward(float* out, float* lse, const float* q, const float* k,
                            const float* v) {
    stats_ = {};
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    const std::vector<std::size_t> mine = split_.pieces_of(static_cast<std::size_t>(rank_));
    const std::size_t L = local_floats_;
    // Two buffers of [k | v]: the block being computed on and the one arriving.
    std::vector<float> kv[2] = {std::vector<float>(2 * L), std::vector<float>(2 * L)};
    std::copy(k, k + L, kv[0].begin());
    std::copy(v, v + L, kv[0].begin() + static_cast<std::ptrdiff_t>(L));
    std::vector<float> part_out(piece_floats_), part_lse(piece_rows_);
    stats_.peak_floats = 4 * L + piece_floats_ + piece_rows_;
    std::fill(out, out + L, 0.0f);
    std::fill(lse, lse + local_rows_, -std::numeric_limits<float>::infinity());
    const AttentionShape block{shape_.B, shape_.NH, split_.piece_length(), shape_.hs, false};

    //! [ring_forward]
    int current = 0;
    for (int step = 0; step < size_; ++step) {
        const int source = (rank_ + size_ - step) % size_;  // whose keys and values we hold
        std::vector<MPI_Request> transfers;
        if (step < size_ - 1) {  // pass the block on while computing with it
            transfers.resize(2);
            MPI_Irecv(kv[1 - current].data(), static_cast<int>(2 * L), MPI_FLOAT, prev, kv_tag,
                      MPI_COMM_WORLD, &transfers[0]);
            MPI_Isend(kv[current].data(), static_cast<int>(2 * L), MPI_FLOAT, next, kv_tag,
                      MPI_COMM_WORLD, &transfers[1]);
            stats_.bytes_sent += 2 * L * sizeof(float);
        }
        const double cpu_start = cpu_seconds();
        const std::vector<std::size_t> theirs = split_.pieces_of(static_cast<std::size_t>(source));
        for (std::size_t i = 0; i < mine.size(); ++i) {
            for (std::size_t j = 0; j < theirs.size(); ++j) {
                const BlockMask mask = block_mask(mine[i], theirs[j], shape_.causal);
                if (mask == BlockMask::skipped) continue;  // every key in the future
                AttentionShape s = block;
                s.causal = mask == BlockMask::diagonal;
                const float* kj = kv[current].data() + j * piece_floats_;
                const float* vj = kv[current].data() + L + j * piece_floats_;
                attention_fast_forward(part_out.data(), part_lse.data(), q + i * piece_floats_,
                                       kj, vj, s);
                merge_(out + i * piece_floats_, lse + i * piece_rows_, part_out.data(),
                       part_lse.data(), piece_rows_, shape_.hs);
                ++stats_.blocks;
                const std::size_t c = split_.piece_length();
                stats_.pairs += s.causal ? c * (c + 1) / 2 : c * c;  // per head
                progress(transfers);
            }
        }
        stats_.compute_seconds += cpu_seconds() - cpu_start;
        const double wait_start = wall_seconds();
        wait_all(transfers);
        stats_.wait_seconds += wall_seconds() - wait_start;
        current = 1 - current;
    }
    //! [ring_forward]
}

void RingAttention::backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                             const float* k, const float* v, const float* out, const float* lse) {
    stats_ = {};
    const int next = (rank_ + 1) % size_, prev = (rank_ + size_ - 1) % size_;
    const std::vector<std::size_t> mine = split_.pieces_of(static_cast<std::size_t>(rank_));
    const std::size_t L = local_floats_;
    const int kv_count = static_cast<int>(2 * L);
    // [k | v] of the block held and of the one arriving; [dk | dv] summed so far for the
    // block held (arriving from the previous rank), this rank's share of it, and the sum
    // passed on.
    std::vector<float> kv[2] = {std::vector<float>(2 * L), std::vector<float>(2 * L)};
    std::vector<float> dkv_in(2 * L), dkv_mine(2 * L), dkv_out(2 * L);
    std::vector<float> dq_part(piece_floats_), dk_part(piece_floats_), dv_part(piece_floats_);
    stats_.peak_floats = 10 * L + 3 * piece_floats_;
    std::copy(k, k + L, kv[0].begin());
    std::copy(v, v + L, kv[0].begin() + static_cast<std::ptrdiff_t>(L));
    std::fill(dq, dq + L, 0.0f);
    const AttentionShape block{shape_.B, shape_.NH, split_.piece_length(), shape_.hs, false};

    //! [ring_backward]
    int current = 0;
    MPI_Request dkv_send = MPI_REQUEST_NULL;
    for (int step = 0; step < size_; ++step) {
        const int source = (rank_ + size_ - step) % size_;
        std::vector<MPI_Request> transfers;
        if (step < size_ - 1) {  // the keys and values move on as in the forward pass
            transfers.resize(2);
            MPI_Irecv(kv[1 - current].data(), kv_count, MPI_FLOAT, prev, kv_tag, MPI_COMM_WORLD,
                      &transfers[0]);
            MPI_Isend(kv[current].data(), kv_count, MPI_FLOAT, next, kv_tag, MPI_COMM_WORLD,
                      &transfers[1]);
            stats_.bytes_sent += 2 * L * sizeof(float);
        }
        // The gradients the ranks before have added to this block arrive while this rank
        // computes its own share of them.
        MPI_Request dkv_recv = MPI_REQUEST_NULL;
        if (step > 0) {
            MPI_Irecv(dkv_in.data(), kv_count, MPI_FLOAT, prev, dkv_tag, MPI_COMM_WORLD, &dkv_recv);
            transfers.push_back(dkv_recv);
        }
        const double cpu_start = cpu_seconds();
        std::fill(dkv_mine.begin(), dkv_mine.end(), 0.0f);
        const std::vector<std::size_t> theirs = split_.pieces_of(static_cast<std::size_t>(source));
        for (std::size_t i = 0; i < mine.size(); ++i) {
            for (std::size_t j = 0; j < theirs.size(); ++j) {
                const BlockMask mask = block_mask(mine[i], theirs[j], shape_.causal);
                if (mask == BlockMask::skipped) continue;
                AttentionShape s = block;
                s.causal = mask == BlockMask::diagonal;
                const std::size_t qi = i * piece_floats_, kj = j * piece_floats_;
                attention_fast_backward(dq_part.data(), dk_part.data(), dv_part.data(), dout + qi,
                                        q + qi, kv[current].data() + kj,
                                        kv[current].data() + L + kj, out + qi,
                                        lse + i * piece_rows_, s);
                add_into(dq + qi, dq_part.data(), piece_floats_);
                add_into(dkv_mine.data() + kj, dk_part.data(), piece_floats_);
                add_into(dkv_mine.data() + L + kj, dv_part.data(), piece_floats_);
                ++stats_.blocks;
                progress(transfers);
            }
        }
        stats_.compute_seconds += cpu_seconds() - cpu_start;
        const double wait_start = wall_seconds();
        wait_all(transfers);  // the next block's k, v and this block's dk, dv so far
        MPI_Wait(&dkv_send, MPI_STATUS_IGNORE);  // dkv_out is free again
        stats_.wait_seconds += wall_seconds() - wait_start;
        // This block's sum so far, passed on: to the next rank that holds it, or, after the
        // last step, to the rank it belongs to (the next one).
        for (std::size_t n = 0; n < 2 * L; ++n) {
            dkv_out[n] = (step > 0 ? dkv_in[n] : 0.0f) + dkv_mine[n];
        }
        if (size_ > 1) {
            MPI_Isend(dkv_out.data(), kv_count, MPI_FLOAT, next, dkv_tag, MPI_COMM_WORLD, &dkv_send);
            stats_.bytes_sent += 2 * L * sizeof(float);
        }
        current = 1 - current;
    }
    // This rank's own block, with every rank's share, back from the previous rank.
    const double wait_start = wall_seconds();
    if (size_ > 1) {
        MPI_Recv(dkv_in.data(), kv_count, MPI_FLOAT, prev, dkv_tag, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Wait(&dkv_send, MPI_STATUS_IGNORE);
    } else {
        dkv_in = dkv_out;
    }
    stats_.wait_seconds += wall_seconds() - wait_start;
    //! [ring_backward]
    std::copy(dkv_in.begin(), dkv_in.begin() + static_cast<std::ptrdiff_t>(L), dk);
    std::copy(dkv_in.begin() + static_cast<std::ptrdiff_t>(L), dkv_in.end(), dv);
}

}  // namespace attn::mpi
