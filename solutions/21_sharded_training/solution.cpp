// Solution to exercise 21: shards, and a ring's reduce-scatter and all-gather in one process.
#include "exercise.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace exercise {

Shard shard_of(std::size_t n, int rank, int ranks) {
    if (ranks < 1 || rank < 0 || rank >= ranks)
        throw std::invalid_argument("shard_of: rank " + std::to_string(rank) + " of " + std::to_string(ranks) +
                                    " ranks (at least 1 rank, and a rank in 0 … ranks − 1)");
    const auto r = static_cast<std::size_t>(rank), parts = static_cast<std::size_t>(ranks);
    const std::size_t q = n / parts, extra = n % parts;  // the first `extra` shards hold q + 1
    const std::size_t begin = r * q + std::min(r, extra);
    return {begin, begin + q + (r < extra ? 1 : 0)};
}

int reduce_scatter_send(int rank, int step, int ranks) {
    return ((rank - 1 - step) % ranks + ranks) % ranks;  // in C++, -1 % 3 is -1
}

int all_gather_send(int rank, int step, int ranks) {
    return ((rank - step) % ranks + ranks) % ranks;
}

namespace {
// The length every buffer has; throws for no buffers or buffers of different lengths.
std::size_t common_length(const char* who, const std::vector<std::vector<float>>& buffers) {
    if (buffers.empty()) throw std::invalid_argument(std::string(who) + ": no buffers (one per rank)");
    const std::size_t n = buffers[0].size();
    for (std::size_t r = 1; r < buffers.size(); ++r) {
        if (buffers[r].size() != n)
            throw std::invalid_argument(std::string(who) + ": rank " + std::to_string(r) + "'s buffer has " +
                                        std::to_string(buffers[r].size()) + " elements, rank 0's " +
                                        std::to_string(n));
    }
    return n;
}
}  // namespace

void ring_reduce_scatter(std::vector<std::vector<float>>& buffers) {
    const std::size_t n = common_length("ring_reduce_scatter", buffers);
    const int N = static_cast<int>(buffers.size());
    for (int step = 0; step < N - 1; ++step) {
        const std::vector<std::vector<float>> held = buffers;  // all send at once: what each held before
        for (int r = 0; r < N; ++r) {
            const int from = (r + N - 1) % N;
            const Shard s = shard_of(n, reduce_scatter_send(from, step, N), N);
            std::vector<float>& to = buffers[static_cast<std::size_t>(r)];
            for (std::size_t i = s.begin; i < s.end; ++i) to[i] += held[static_cast<std::size_t>(from)][i];
        }
    }
}

void ring_all_gather(std::vector<std::vector<float>>& buffers) {
    const std::size_t n = common_length("ring_all_gather", buffers);
    const int N = static_cast<int>(buffers.size());
    for (int step = 0; step < N - 1; ++step) {
        const std::vector<std::vector<float>> held = buffers;
        for (int r = 0; r < N; ++r) {
            const int from = (r + N - 1) % N;
            const Shard s = shard_of(n, all_gather_send(from, step, N), N);
            std::vector<float>& to = buffers[static_cast<std::size_t>(r)];
            for (std::size_t i = s.begin; i < s.end; ++i) to[i] = held[static_cast<std::size_t>(from)][i];
        }
    }
}

}  // namespace exercise
