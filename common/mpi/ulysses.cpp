// Ulysses sequence parallelism: all-to-all from the sequence split to the head split and back.
#include "attn/mpi/ulysses.hpp"

#include "attn/mpi/world.hpp"

#include <mpi.h>

#include <cstring>
#include <stdexcept>
#include <string>

namespace attn::mpi {

UlyssesAttention::UlyssesAttention(const AttentionShape& shape) : shape_(shape) {
    check_attention_shape(shape);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    const auto N = static_cast<std::size_t>(size_);
    if (shape.NH % N != 0 || shape.T % N != 0) {
        throw std::invalid_argument("Ulysses gives each of the " + std::to_string(N) +
                                    " ranks NH/N heads of T/N positions: N must divide NH = " +
                                    std::to_string(shape.NH) + " and T = " + std::to_string(shape.T));
    }
    chunk_ = shape.T / N;
    group_ = shape.NH / N;
    local_floats_ = shape.B * shape.NH * chunk_ * shape.hs;
}

void UlyssesAttention::exchange(std::size_t per_rank) {
    const double start = wall_seconds();
    MPI_Alltoall(send_.data(), static_cast<int>(per_rank), MPI_FLOAT, receive_.data(),
                 static_cast<int>(per_rank), MPI_FLOAT, MPI_COMM_WORLD);
    stats_.exchange_seconds += wall_seconds() - start;
    stats_.bytes_sent += static_cast<std::size_t>(size_ - 1) * per_rank * sizeof(float);
}

void UlyssesAttention::to_heads(float* const* heads, const float* const* sequence, int count,
                                std::size_t width) {
    const std::size_t B = shape_.B, NH = shape_.NH, T = shape_.T, c = chunk_, g = group_;
    const std::size_t run = g * c * width;  // one b's heads for one rank: contiguous
    const std::size_t per_rank = static_cast<std::size_t>(count) * B * run;
    send_.resize(per_rank * static_cast<std::size_t>(size_));
    receive_.resize(send_.size());
    // To rank p: heads [p·g, (p + 1)·g) of this rank's positions, tensor by tensor.
    for (int p = 0; p < size_; ++p) {
        float* to = send_.data() + static_cast<std::size_t>(p) * per_rank;
        for (int t = 0; t < count; ++t) {
            for (std::size_t b = 0; b < B; ++b, to += run) {
                std::memcpy(to, sequence[t] + (b * NH + static_cast<std::size_t>(p) * g) * c * width,
                            run * sizeof(float));
            }
        }
    }
    exchange(per_rank);
    // From rank p: its positions [p·c, (p + 1)·c) of this rank's heads.
    for (int p = 0; p < size_; ++p) {
        const float* from = receive_.data() + static_cast<std::size_t>(p) * per_rank;
        for (int t = 0; t < count; ++t) {
            for (std::size_t b = 0; b < B; ++b) {
                for (std::size_t h = 0; h < g; ++h, from += c * width) {
                    std::memcpy(heads[t] + ((b * g + h) * T + static_cast<std::size_t>(p) * c) * width,
                                from, c * width * sizeof(float));
                }
            }
        }
    }
}

void UlyssesAttention::to_sequence(float* const* sequence, const float* const* heads, int count,
                                   std::size_t width) {
    const std::size_t B = shape_.B, NH = shape_.NH, T = shape_.T, c = chunk_, g = group_;
    const std::size_t per_rank = static_cast<std::size_t>(count) * B * g * c * width;
    send_.resize(per_rank * static_cast<std::size_t>(size_));
    receive_.resize(send_.size());
    // To rank p: its positions of this rank's heads.
    for (int p = 0; p < size_; ++p) {
        float* to = send_.data() + static_cast<std::size_t>(p) * per_rank;
        for (int t = 0; t < count; ++t) {
            for (std::size_t b = 0; b < B; ++b) {
                for (std::size_t h = 0; h < g; ++h, to += c * width) {
                    std::memcpy(to, heads[t] + ((b * g + h) * T + static_cast<std::size_t>(p) * c) * width,
                                c * width * sizeof(float));
                }
            }
        }
    }
    exchange(per_rank);
    // From rank p: heads [p·g, (p + 1)·g) of this rank's positions.
    for (int p = 0; p < size_; ++p) {
        const float* from = receive_.data() + static_cast<std::size_t>(p) * per_rank;
        for (int t = 0; t < count; ++t) {
            for (std::size_t b = 0; b < B; ++b, from += g * c * width) {
                std::memcpy(sequence[t] + (b * NH + static_cast<std::size_t>(p) * g) * c * width,
                            from, g * c * width * sizeof(float));
            }
        }
    }
}

void UlyssesAttention::forward(float* out, float* lse, const float* q, const float* k,
                               const float* v) {
    stats_ = {};
    const std::size_t head_floats = shape_.B * group_ * shape_.T * shape_.hs;
    for (std::vector<float>* t : {&q_, &k_, &v_, &out_}) t->resize(head_floats);
    lse_.resize(head_floats / shape_.hs);
    //! [ulysses_forward]
    float* heads[] = {q_.data(), k_.data(), v_.data()};
    const float* sequence[] = {q, k, v};
    to_heads(heads, sequence, 3, shape_.hs);  // (B, NH, T/N, hs) → (B, NH/N, T, hs)
    const AttentionShape mine{shape_.B, group_, shape_.T, shape_.hs, shape_.causal};
    const double cpu_start = cpu_seconds();
    attention_fast_forward(out_.data(), lse_.data(), q_.data(), k_.data(), v_.data(), mine);
    stats_.compute_seconds = cpu_seconds() - cpu_start;
    float* out_sequence[] = {out};
    const float* out_heads[] = {out_.data()};
    to_sequence(out_sequence, out_heads, 1, shape_.hs);  // back to (B, NH, T/N, hs)
    //! [ulysses_forward]
    float* lse_sequence[] = {lse};
    const float* lse_heads[] = {lse_.data()};
    to_sequence(lse_sequence, lse_heads, 1, 1);
}

void UlyssesAttention::backward(float* dq, float* dk, float* dv, const float* dout) {
    if (q_.empty()) throw std::logic_error("UlyssesAttention::backward before forward");
    stats_ = {};
    const std::size_t head_floats = q_.size();
    std::vector<float> dout_h(head_floats), dq_h(head_floats), dk_h(head_floats), dv_h(head_floats);
    float* dout_heads[] = {dout_h.data()};
    const float* dout_sequence[] = {dout};
    to_heads(dout_heads, dout_sequence, 1, shape_.hs);
    const AttentionShape mine{shape_.B, group_, shape_.T, shape_.hs, shape_.causal};
    const double cpu_start = cpu_seconds();
    attention_fast_backward(dq_h.data(), dk_h.data(), dv_h.data(), dout_h.data(), q_.data(),
                            k_.data(), v_.data(), out_.data(), lse_.data(), mine);
    stats_.compute_seconds = cpu_seconds() - cpu_start;
    float* grads[] = {dq, dk, dv};
    const float* grads_heads[] = {dq_h.data(), dk_h.data(), dv_h.data()};
    to_sequence(grads, grads_heads, 3, shape_.hs);
}

}  // namespace attn::mpi
