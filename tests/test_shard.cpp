// The arithmetic of ZeRO's shards and of a ring's reduce-scatter and all-gather (attn/shard.hpp),
// against hand computation and against a ring of N buffers simulated in one process: after
// the reduce-scatter each rank holds the complete sum of its own shard, after the all-gather
// every rank holds every shard, for every N from 1 to 7 and buffer sizes that N divides and
// does not, and each rank sends what the ring's arithmetic says.
#include "attn/shard.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <vector>

using attn::ring_all_gather_send;
using attn::ring_reduce_scatter_send;
using attn::Shard;
using attn::shard_of;

TEST_CASE("shards: 10 elements over 4 ranks are 3, 3, 2, 2, in order, by hand") {
    const Shard expected[4] = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
    for (int r = 0; r < 4; ++r) {
        CHECK(shard_of(10, r, 4).begin == expected[r].begin);
        CHECK(shard_of(10, r, 4).end == expected[r].end);
    }
    CHECK(shard_of(10, 0, 1).size() == 10);
    CHECK(shard_of(2, 3, 4).size() == 0);  // more ranks than elements: the last ones own none
    CHECK_THROWS_AS(shard_of(10, 4, 4), std::invalid_argument);
    CHECK_THROWS_AS(shard_of(10, 0, 0), std::invalid_argument);
}

TEST_CASE("shards: every element in exactly one shard, sizes within one of each other") {
    for (int ranks = 1; ranks <= 7; ++ranks) {
        for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{6}, std::size_t{26720}, std::size_t{26721}}) {
            std::size_t at = 0, smallest = n, largest = 0;
            for (int r = 0; r < ranks; ++r) {
                const Shard s = shard_of(n, r, ranks);
                CHECK(s.begin == at);  // consecutive, no gap, no overlap
                at = s.end;
                smallest = std::min(smallest, s.size());
                largest = std::max(largest, s.size());
            }
            CHECK(at == n);
            CHECK(largest - smallest <= 1);
        }
    }
}

namespace {
using Buffers = std::vector<std::vector<double>>;

// One step of a ring of N buffers simulated in one process: every rank r sends the shard
// `send(r, step, N)` to rank r + 1 at once (the messages are taken before any arrives), and
// each arriving shard is added to the receiver's copy (`add`) or replaces it. Returns the
// elements each rank sent.
std::vector<std::size_t> ring_step(Buffers& buffer, std::size_t P, int N, int step, int (*send)(int, int, int), bool add) {
    std::vector<std::vector<double>> message(static_cast<std::size_t>(N));
    std::vector<std::size_t> sent(static_cast<std::size_t>(N));
    for (int r = 0; r < N; ++r) {
        const Shard s = shard_of(P, send(r, step, N), N);
        const auto& from = buffer[static_cast<std::size_t>(r)];
        message[static_cast<std::size_t>(r)].assign(from.begin() + static_cast<std::ptrdiff_t>(s.begin),
                                                    from.begin() + static_cast<std::ptrdiff_t>(s.end));
        sent[static_cast<std::size_t>(r)] = s.size();
    }
    for (int r = 0; r < N; ++r) {
        const int from = (r + N - 1) % N;
        const Shard s = shard_of(P, send(from, step, N), N);
        auto& to = buffer[static_cast<std::size_t>(r)];
        for (std::size_t i = 0; i < s.size(); ++i) {
            const double x = message[static_cast<std::size_t>(from)][i];
            to[s.begin + i] = add ? to[s.begin + i] + x : x;
        }
    }
    return sent;
}
}  // namespace

TEST_CASE("a ring of N buffers: the reduce-scatter leaves each rank its own shard's sum, the all-gather every shard") {
    for (int N = 1; N <= 7; ++N) {
        for (std::size_t P : {std::size_t{7}, std::size_t{12}, std::size_t{29}}) {
            CAPTURE(N);
            CAPTURE(P);
            // Rank r's buffer holds (r + 1) · 1000 + i: the sum over ranks of element i is
            // 1000 · N(N + 1)/2 + N · i. Whole numbers below 2^53 in double: every sum is exact
            // in any order, so the checks compare with ==.
            Buffers buffer(static_cast<std::size_t>(N), std::vector<double>(P));
            for (int r = 0; r < N; ++r) {
                for (std::size_t i = 0; i < P; ++i) buffer[static_cast<std::size_t>(r)][i] = (r + 1) * 1000.0 + static_cast<double>(i);
            }
            const auto sum = [&](std::size_t i) { return 1000.0 * N * (N + 1) / 2 + N * static_cast<double>(i); };
            std::vector<std::size_t> sent(static_cast<std::size_t>(N), 0);
            for (int step = 0; step < N - 1; ++step) {
                const std::vector<std::size_t> now = ring_step(buffer, P, N, step, ring_reduce_scatter_send, true);
                for (int r = 0; r < N; ++r) sent[static_cast<std::size_t>(r)] += now[static_cast<std::size_t>(r)];
            }
            for (int r = 0; r < N; ++r) {
                const Shard own = shard_of(P, r, N);
                for (std::size_t i = own.begin; i < own.end; ++i) CHECK(buffer[static_cast<std::size_t>(r)][i] == sum(i));
                CHECK(sent[static_cast<std::size_t>(r)] == P - own.size());  // every shard but its own
            }
            // The all-gather: each rank's own shard round the ring.
            std::fill(sent.begin(), sent.end(), 0);
            for (int step = 0; step < N - 1; ++step) {
                const std::vector<std::size_t> now = ring_step(buffer, P, N, step, ring_all_gather_send, false);
                for (int r = 0; r < N; ++r) sent[static_cast<std::size_t>(r)] += now[static_cast<std::size_t>(r)];
            }
            for (int r = 0; r < N; ++r) {
                for (std::size_t i = 0; i < P; ++i) CHECK(buffer[static_cast<std::size_t>(r)][i] == sum(i));
                CHECK(sent[static_cast<std::size_t>(r)] == P - shard_of(P, (r + 1) % N, N).size());  // all but the next rank's
            }
        }
    }
}
