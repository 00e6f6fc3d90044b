// Checks for exercise 21: shards, and a ring's reduce-scatter and all-gather in one process.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - the shards of any count past 2^31 are in order, without gap or overlap, the longer first
// - every count of ranks below 1 and every rank outside 0 … ranks − 1 is refused
// - for any buffer length up to 60 and 1 to 8 ranks, at any magnitude and in any order of the
//   ranks, the reduce-scatter leaves each rank the sum of its own shard and the all-gather
//   then gives every rank the whole sum
// - the all-gather copies each rank's own shard, every value distinct, to every rank bit for bit
//
// The reference shards here are dealt out element by element (rank 0, 1, …, round again) and
// laid end to end, and the sums are taken directly: neither reads the exercise's code. Every
// value is a small whole number, so every sum is exact in any order and compared with ==.
#include "exercise.hpp"

#include "attn/families.hpp"
#include "attn/property.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

using exercise::all_gather_send;
using exercise::reduce_scatter_send;
using exercise::ring_all_gather;
using exercise::ring_reduce_scatter;
using exercise::Shard;
using exercise::shard_of;

namespace {

using Buffers = std::vector<std::vector<float>>;

// The shards of n elements over `ranks`, found another way than the contract's arithmetic:
// deal the elements out one at a time, to rank 0, 1, …, ranks − 1 and round again, count what
// each rank got, and lay the shards end to end in rank order.
std::vector<Shard> dealt_shards(std::size_t n, int ranks) {
    std::vector<std::size_t> count(static_cast<std::size_t>(ranks), 0);
    for (std::size_t e = 0; e < n; ++e) ++count[e % count.size()];
    std::vector<Shard> shards;
    std::size_t at = 0;
    for (std::size_t c : count) {
        shards.push_back({at, at + c});
        at += c;
    }
    return shards;
}

// "[a, b, c]": elements begin … end − 1 of v.
std::string show(const std::vector<float>& v, std::size_t begin, std::size_t end) {
    std::ostringstream s;
    s << '[';
    for (std::size_t i = begin; i < end && i < v.size(); ++i) s << (i > begin ? ", " : "") << v[i];
    s << ']';
    return s.str();
}

// "after 1 step", "after 3 steps".
std::string after_steps(int steps) {
    return "after " + std::to_string(steps) + (steps == 1 ? " step" : " steps");
}

// "{0, 2}": the ranks in a set of contributions (bit r for rank r).
std::string ranks_in(std::uint32_t set) {
    std::ostringstream s;
    s << '{';
    bool first = true;
    for (int r = 0; r < 32; ++r) {
        if (set & (1u << r)) {
            s << (first ? "" : ", ") << r;
            first = false;
        }
    }
    s << '}';
    return s.str();
}

// CHECKs elements begin … end − 1 of `got` against `expected`, saying expected against actual.
void check_elements(const std::string& what, const std::vector<float>& got, const std::vector<float>& expected,
                    std::size_t begin, std::size_t end) {
    bool same = got.size() == expected.size();
    for (std::size_t i = begin; same && i < end; ++i) same = got[i] == expected[i];
    CHECK_MESSAGE(same, what << ", elements [" << begin << ", " << end << "): expected "
                             << show(expected, begin, end) << ", got " << show(got, begin, end)
                             << std::string(got.size() != expected.size() ? " (the buffer's length changed)" : ""));
}

// The sum over ranks of each element, taken directly.
std::vector<float> direct_sum(const Buffers& buffers) {
    std::vector<float> sum(buffers[0].size(), 0.0f);
    for (const auto& b : buffers) {
        for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += b[i];
    }
    return sum;
}

// After a reduce-scatter: each rank's own shard holds the sum.
void check_own_shards(const Buffers& buffers, const std::vector<float>& sum) {
    const int N = static_cast<int>(buffers.size());
    const std::vector<Shard> shards = dealt_shards(sum.size(), N);
    for (int r = 0; r < N; ++r) {
        const Shard s = shards[static_cast<std::size_t>(r)];
        check_elements("after ring_reduce_scatter, rank " + std::to_string(r) + "'s own shard",
                       buffers[static_cast<std::size_t>(r)], sum, s.begin, s.end);
    }
}

// After an all-gather: every rank's whole buffer holds `whole`.
void check_every_buffer(const Buffers& buffers, const std::vector<float>& whole) {
    for (std::size_t r = 0; r < buffers.size(); ++r) {
        check_elements("after ring_all_gather, rank " + std::to_string(r) + "'s buffer", buffers[r], whole, 0,
                       whole.size());
    }
}

// N buffers of n elements; rank r's element i is (i mod 9 + 1)·10^r: in any sum of them each
// decimal digit is one rank's contribution (units rank 0's, tens rank 1's, …), so a digit 0
// is a rank left out and a digit too large a rank counted twice.
Buffers digit_buffers(std::size_t n, int N) {
    Buffers b(static_cast<std::size_t>(N), std::vector<float>(n));
    float scale = 1.0f;
    for (auto& buffer : b) {
        for (std::size_t i = 0; i < n; ++i) buffer[i] = static_cast<float>(i % 9 + 1) * scale;
        scale *= 10.0f;
    }
    return b;
}

const std::string digits_note =
    "rank r's element i is (i mod 9 + 1)·10^r: in a sum each digit is one rank's contribution "
    "(units rank 0's, tens rank 1's, …); a digit 0 is a rank missing, a digit too large a rank "
    "counted twice";

}  // namespace

TEST_CASE("shard_of: 10 elements over 4 ranks own elements 0-2, 3-5, 6-7 and 8-9, as worked by hand") {
    // q = 10 / 4 = 2, and the first 10 mod 4 = 2 ranks hold one more: sizes 3, 3, 2, 2.
    const std::size_t begin[4] = {0, 3, 6, 8}, end[4] = {3, 6, 8, 10};
    for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        const Shard s = shard_of(10, r, 4);
        INFO("expected [" << begin[r] << ", " << end[r] << "), got [" << s.begin << ", " << s.end << ")");
        CHECK(s.begin == begin[r]);
        CHECK(s.end == end[r]);
        CHECK(s.size() == end[r] - begin[r]);
    }
}

TEST_CASE("shard_of: 7 over 3 ranks, 3 over 4, 8 over 4 and 5 over 1, as worked by hand") {
    struct Case {
        std::size_t n;
        int ranks;
        std::vector<std::size_t> bounds;  // shard r is [bounds[r], bounds[r + 1])
    };
    const Case cases[] = {
        {7, 3, {0, 3, 5, 7}},     // 7 = 3 + 2 + 2: one longer shard, rank 0's
        {3, 4, {0, 1, 2, 3, 3}},  // sizes 1, 1, 1, 0: more ranks than elements, the last owns none
        {8, 4, {0, 2, 4, 6, 8}},  // 4 divides 8: all the same size
        {5, 1, {0, 5}},           // one rank owns everything
        {0, 3, {0, 0, 0, 0}},     // nothing to share: every shard empty
    };
    for (const Case& c : cases) {
        for (int r = 0; r < c.ranks; ++r) {
            CAPTURE(c.n);
            CAPTURE(c.ranks);
            CAPTURE(r);
            const Shard s = shard_of(c.n, r, c.ranks);
            const std::size_t b = c.bounds[static_cast<std::size_t>(r)], e = c.bounds[static_cast<std::size_t>(r) + 1];
            INFO("expected [" << b << ", " << e << "), got [" << s.begin << ", " << s.end << ")");
            CHECK(s.begin == b);
            CHECK(s.end == e);
        }
    }
}

TEST_CASE("shard_of for every n from 0 to 60 over 1 to 8 ranks: in order, no gap or overlap, the longer first") {
    for (int ranks = 1; ranks <= 8; ++ranks) {
        for (std::size_t n = 0; n <= 60; ++n) {
            CAPTURE(n);
            CAPTURE(ranks);
            std::size_t at = 0, smallest = n, largest = 0, previous = n;
            bool ok = true;
            for (int r = 0; r < ranks && ok; ++r) {
                const Shard s = shard_of(n, r, ranks);
                CAPTURE(r);
                INFO("rank " << r << "'s shard is [" << s.begin << ", " << s.end << ")");
                // Each shard begins where the one before ends (the first at 0): no gap, no overlap.
                ok = ok && s.begin == at && s.end >= s.begin;
                CHECK_MESSAGE(s.begin == at, "it should begin at " << at << ", where the shard before ends");
                CHECK_MESSAGE(s.end >= s.begin, "it ends before it begins");
                // The longer shards first: sizes never grow with the rank.
                ok = ok && s.size() <= previous;
                CHECK_MESSAGE(s.size() <= previous, "a shard longer than the one before it: the longer ones come first");
                previous = s.size();
                at = s.end;
                smallest = std::min(smallest, s.size());
                largest = std::max(largest, s.size());
            }
            if (!ok) break;
            CHECK_MESSAGE(at == n, "the shards end at " << at << ", not at n = " << n);
            CHECK_MESSAGE(largest - smallest <= 1, "sizes from " << smallest << " to " << largest
                                                                << ": they may differ by one at most");
        }
    }
}

TEST_CASE("shard_of past 2^32 elements, as a 7-billion-parameter model's buffer is: worked by hand") {
    // Pure arithmetic, no memory. 7 000 000 001 over 8 ranks: q = 875 000 000, and
    // 7 000 000 001 mod 8 = 1 rank (rank 0) holds one more. 2^32 + 3 over 4: q = 2^30, the
    // first 3 ranks hold one more. An int holds at most 2^31 − 1: n cut to int is
    // 2 705 032 705 … or negative, and a begin or a size in int wraps.
    INFO("compute the shards in std::size_t: n / ranks, n % ranks and rank·q all pass 2^31 here");
    const std::size_t n = 7000000001ULL, q = 875000000ULL;
    for (int r = 0; r < 8; ++r) {
        CAPTURE(r);
        const Shard s = shard_of(n, r, 8);
        const std::size_t begin = r == 0 ? 0 : static_cast<std::size_t>(r) * q + 1, end = static_cast<std::size_t>(r + 1) * q + 1;
        INFO("expected [" << begin << ", " << end << "), got [" << s.begin << ", " << s.end << ")");
        CHECK(s.begin == begin);
        CHECK(s.end == end);
    }
    const std::size_t m = (std::size_t{1} << 32) + 3, quarter = std::size_t{1} << 30;
    const std::size_t bounds[5] = {0, quarter + 1, 2 * quarter + 2, 3 * quarter + 3, 4 * quarter + 3};
    for (int r = 0; r < 4; ++r) {
        CAPTURE(r);
        const Shard s = shard_of(m, r, 4);
        INFO("expected [" << bounds[r] << ", " << bounds[r + 1] << "), got [" << s.begin << ", " << s.end << ")");
        CHECK(s.begin == bounds[r]);
        CHECK(s.end == bounds[r + 1]);
    }
}

TEST_CASE("property: the shards of any count past 2^31 are in order, without gap or overlap, the longer first") {
    // n from 2^31 − 1 to 2^44 (and the edges 2^32 − 1, 2^32, 2^32 + 1, 7·10^9 + 1), over 1 to
    // 8 ranks (1 a quarter of the time) or 9 to 4096: shard 0 begins at 0, each begins where
    // the one before ends, the last ends at n, no size grows with the rank and no two differ
    // by more than one. These properties alone fix the shards: sizes q + 1 for the first
    // n mod ranks, q for the rest.
    attn::check_property("shard_of cuts any wide count into ordered shards of sizes differing by one at most", [] {
        const std::size_t n = attn::draw("n", attn::family::wide_count());
        const int ranks = attn::draw("ranks", rc::gen::oneOf(rc::gen::cast<int>(attn::family::length(8)), rc::gen::inRange(9, 4097)));
        std::size_t at = 0, previous = n, smallest = n, largest = 0;
        for (int r = 0; r < ranks; ++r) {
            const Shard s = shard_of(n, r, ranks);
            if (s.begin != at || s.end < s.begin || s.size() > previous) {
                std::ostringstream what;
                what << "n = " << n << " over " << ranks << " ranks: rank " << r << "'s shard is [" << s.begin << ", "
                     << s.end << "), after a shard that ends at " << at << " and holds " << previous << " elements";
                RC_FAIL(what.str());
            }
            previous = s.size();
            smallest = std::min(smallest, s.size());
            largest = std::max(largest, s.size());
            at = s.end;
        }
        RC_ASSERT(at == n);
        RC_ASSERT(largest - smallest <= 1);
    });
}

TEST_CASE("property: every count of ranks below 1 and every rank outside 0 … ranks − 1 is refused") {
    // ranks below 1 (0, −1, −2, −10^6, the lowest int) with any rank, or a valid count of
    // 1 to 8 with a rank below 0 or at or past it, for any n up to 2^44: std::invalid_argument.
    attn::check_property("shard_of refuses ranks < 1 and ranks outside the ring", [] {
        const std::size_t n = attn::draw("n", rc::gen::oneOf(rc::gen::inRange<std::size_t>(0, 100), attn::family::wide_count()));
        const auto clamp = [](long v) { return static_cast<int>(std::max<long>(v, std::numeric_limits<int>::min())); };
        int rank = 0, ranks = 0;
        if (attn::draw("no ranks (else a rank outside them)", rc::gen::arbitrary<bool>())) {
            ranks = clamp(attn::draw("ranks", attn::family::below(1)));
            rank = attn::draw("rank", rc::gen::inRange(-2, 3));
        } else {
            ranks = static_cast<int>(attn::draw("ranks", attn::family::length(8)));
            rank = attn::draw("rank", rc::gen::oneOf(rc::gen::cast<int>(rc::gen::map(attn::family::below(0), clamp)),
                                                     rc::gen::inRange(ranks, ranks + 3)));
        }
        RC_ASSERT(attn::refused([&] { (void)shard_of(n, rank, ranks); }));
    });
}

TEST_CASE("shard_of refuses fewer than one rank and a rank outside 0 … ranks − 1") {
    CHECK_THROWS_AS(shard_of(10, 4, 4), std::invalid_argument);   // ranks are 0 … 3
    CHECK_THROWS_AS(shard_of(10, -1, 4), std::invalid_argument);
    CHECK_THROWS_AS(shard_of(10, 0, 0), std::invalid_argument);   // no ranks
    CHECK_THROWS_AS(shard_of(10, 0, -2), std::invalid_argument);
    CHECK_THROWS_AS(shard_of(0, 1, 1), std::invalid_argument);
}

TEST_CASE("the send schedules of 3 and 4 ranks, as worked by hand") {
    // Reduce-scatter: rank r sends shard r − 1, then r − 2, … (mod ranks); the last shard it
    // receives, from rank r − 1, is r − 1 − 1 − (ranks − 2) = r − ranks = r: its own.
    // All-gather: rank r sends r, then r − 1, …: what it received the step before.
    const int rs3[3][2] = {{2, 1}, {0, 2}, {1, 0}}, ag3[3][2] = {{0, 2}, {1, 0}, {2, 1}};
    for (int r = 0; r < 3; ++r) {
        for (int step = 0; step < 2; ++step) {
            CAPTURE(r);
            CAPTURE(step);
            INFO("3 ranks, rank " << r << " at step " << step << ": reduce-scatter should send shard "
                                  << rs3[r][step] << ", all-gather shard " << ag3[r][step]);
            CHECK(reduce_scatter_send(r, step, 3) == rs3[r][step]);
            CHECK(all_gather_send(r, step, 3) == ag3[r][step]);
        }
    }
    const int rs4[4][3] = {{3, 2, 1}, {0, 3, 2}, {1, 0, 3}, {2, 1, 0}};
    const int ag4[4][3] = {{0, 3, 2}, {1, 0, 3}, {2, 1, 0}, {3, 2, 1}};
    for (int r = 0; r < 4; ++r) {
        for (int step = 0; step < 3; ++step) {
            CAPTURE(r);
            CAPTURE(step);
            INFO("4 ranks, rank " << r << " at step " << step << ": reduce-scatter should send shard "
                                  << rs4[r][step] << ", all-gather shard " << ag4[r][step]);
            CHECK(reduce_scatter_send(r, step, 4) == rs4[r][step]);
            CHECK(all_gather_send(r, step, 4) == ag4[r][step]);
        }
    }
}

TEST_CASE("the reduce-scatter's schedule, followed symbolically for 1 to 8 ranks: each rank ends with every contribution to its own shard, none twice") {
    // holds[r][k]: the ranks whose contributions rank r's copy of shard k holds (bit j for
    // rank j); each rank starts with its own alone. At each step every rank sends what it held
    // before the step, and the receiver adds it in: the sets join, and a rank in both is a
    // contribution counted twice.
    for (int N = 1; N <= 8; ++N) {
        CAPTURE(N);
        const auto n = static_cast<std::size_t>(N);
        std::vector<std::vector<std::uint32_t>> holds(n, std::vector<std::uint32_t>(n));
        for (std::size_t r = 0; r < n; ++r) {
            for (std::size_t k = 0; k < n; ++k) holds[r][k] = 1u << r;
        }
        for (int step = 0; step < N - 1; ++step) {
            CAPTURE(step);
            std::vector<int> shard(n);
            std::vector<std::uint32_t> message(n);
            for (int r = 0; r < N; ++r) {
                const int k = reduce_scatter_send(r, step, N);
                REQUIRE_MESSAGE((k >= 0 && k < N), "rank " << r << " sends shard " << k << ", not a rank of 0 … "
                                                           << N - 1);
                shard[static_cast<std::size_t>(r)] = k;
                message[static_cast<std::size_t>(r)] = holds[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
            }
            for (int r = 0; r < N; ++r) {
                const int from = (r + N - 1) % N;
                const auto k = static_cast<std::size_t>(shard[static_cast<std::size_t>(from)]);
                std::uint32_t& mine = holds[static_cast<std::size_t>(r)][k];
                const std::uint32_t got = message[static_cast<std::size_t>(from)];
                CHECK_MESSAGE((mine & got) == 0u,
                              "rank " << r << " receives shard " << k << " from rank " << from << " with the contributions of ranks "
                                      << ranks_in(got) << ", but already holds " << ranks_in(mine) << ": ranks "
                                      << ranks_in(mine & got) << " counted twice");
                mine |= got;
            }
        }
        const std::uint32_t all = (1u << N) - 1u;
        for (int r = 0; r < N; ++r) {
            const std::uint32_t own = holds[static_cast<std::size_t>(r)][static_cast<std::size_t>(r)];
            CHECK_MESSAGE(own == all, after_steps(N - 1) << ", rank " << r << "'s own shard " << r
                                               << " holds the contributions of ranks " << ranks_in(own)
                                               << ", expected all of " << ranks_in(all));
        }
    }
}

TEST_CASE("the all-gather's schedule, followed symbolically for 1 to 8 ranks: a rank sends only a shard it holds whole, and ends with all") {
    // whole[r][k]: rank r's copy of shard k is the complete sum; after the reduce-scatter only
    // its own is. A copy replaces what the receiver had, whole or not.
    for (int N = 1; N <= 8; ++N) {
        CAPTURE(N);
        const auto n = static_cast<std::size_t>(N);
        std::vector<std::vector<bool>> whole(n, std::vector<bool>(n, false));
        for (std::size_t r = 0; r < n; ++r) whole[r][r] = true;
        for (int step = 0; step < N - 1; ++step) {
            CAPTURE(step);
            std::vector<int> shard(n);
            std::vector<bool> sent_whole(n);
            for (int r = 0; r < N; ++r) {
                const int k = all_gather_send(r, step, N);
                REQUIRE_MESSAGE((k >= 0 && k < N), "rank " << r << " sends shard " << k << ", not a rank of 0 … "
                                                           << N - 1);
                const bool w = whole[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)];
                CHECK_MESSAGE(w, "rank " << r << " sends shard " << k
                                         << ", which it does not hold whole yet (its own first, then what it received the step before)");
                shard[static_cast<std::size_t>(r)] = k;
                sent_whole[static_cast<std::size_t>(r)] = w;
            }
            for (int r = 0; r < N; ++r) {
                const int from = (r + N - 1) % N;
                whole[static_cast<std::size_t>(r)][static_cast<std::size_t>(shard[static_cast<std::size_t>(from)])] =
                    sent_whole[static_cast<std::size_t>(from)];
            }
        }
        for (int r = 0; r < N; ++r) {
            for (int k = 0; k < N; ++k) {
                CHECK_MESSAGE(whole[static_cast<std::size_t>(r)][static_cast<std::size_t>(k)],
                              after_steps(N - 1) << ", rank " << r << " does not hold shard " << k << " whole");
            }
        }
    }
}

TEST_CASE("ring_reduce_scatter over 3 ranks and 7 elements, as worked by hand") {
    // Shards [0, 3) [3, 5) [5, 7). Rank 0 holds 1 … 7, rank 1 10 … 70, rank 2 100 … 700: the
    // sums are 111, 222, …, 777, and rank r must end with its own shard's.
    Buffers b = {{1, 2, 3, 4, 5, 6, 7}, {10, 20, 30, 40, 50, 60, 70}, {100, 200, 300, 400, 500, 600, 700}};
    const std::vector<float> sum = {111, 222, 333, 444, 555, 666, 777};
    ring_reduce_scatter(b);
    INFO(digits_note);
    check_elements("rank 0's own shard", b[0], sum, 0, 3);
    check_elements("rank 1's own shard", b[1], sum, 3, 5);
    check_elements("rank 2's own shard", b[2], sum, 5, 7);
}

TEST_CASE("ring_reduce_scatter, then ring_all_gather, over 4 ranks and 10 elements: shards of 3, 3, 2, 2") {
    Buffers b = digit_buffers(10, 4);
    // (i mod 9 + 1) in every digit: 1111, 2222, …, 9999, then 1111 again.
    const std::vector<float> sum = {1111, 2222, 3333, 4444, 5555, 6666, 7777, 8888, 9999, 1111};
    ring_reduce_scatter(b);
    INFO(digits_note);
    check_elements("after ring_reduce_scatter, rank 0's own shard", b[0], sum, 0, 3);
    check_elements("after ring_reduce_scatter, rank 1's own shard", b[1], sum, 3, 6);
    check_elements("after ring_reduce_scatter, rank 2's own shard", b[2], sum, 6, 8);
    check_elements("after ring_reduce_scatter, rank 3's own shard", b[3], sum, 8, 10);
    ring_all_gather(b);
    check_every_buffer(b, sum);
}

TEST_CASE("ring_reduce_scatter, then ring_all_gather, with more ranks than elements: 3 elements over 4 ranks") {
    // Shards of 1, 1, 1 and 0 elements: rank 3 owns none, and sends and receives nothing when
    // its empty shard comes round.
    Buffers b = digit_buffers(3, 4);
    const std::vector<float> sum = {1111, 2222, 3333};
    ring_reduce_scatter(b);
    INFO(digits_note);
    check_elements("after ring_reduce_scatter, rank 0's own shard", b[0], sum, 0, 1);
    check_elements("after ring_reduce_scatter, rank 1's own shard", b[1], sum, 1, 2);
    check_elements("after ring_reduce_scatter, rank 2's own shard", b[2], sum, 2, 3);
    ring_all_gather(b);
    check_every_buffer(b, sum);
}

TEST_CASE("ring_all_gather on its own: each rank's own shard reaches every rank, by hand") {
    // What the reduce-scatter would have left: each rank's own shard (here 1 … 10 in all),
    // and -1 everywhere else, which must all be copied over.
    SUBCASE("10 elements over 4 ranks") {
        Buffers b = {{1, 2, 3, -1, -1, -1, -1, -1, -1, -1},
                     {-1, -1, -1, 4, 5, 6, -1, -1, -1, -1},
                     {-1, -1, -1, -1, -1, -1, 7, 8, -1, -1},
                     {-1, -1, -1, -1, -1, -1, -1, -1, 9, 10}};
        ring_all_gather(b);
        INFO("a -1 left is a shard that never arrived; another number, a wrong shard or an addition");
        check_every_buffer(b, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10});
    }
    SUBCASE("3 elements over 4 ranks: rank 3 owns nothing") {
        Buffers b = {{1, -1, -1}, {-1, 2, -1}, {-1, -1, 3}, {-1, -1, -1}};
        ring_all_gather(b);
        check_every_buffer(b, {1, 2, 3});
    }
    SUBCASE("7 elements over 3 ranks") {
        Buffers b = {{1, 2, 3, -1, -1, -1, -1}, {-1, -1, -1, 4, 5, -1, -1}, {-1, -1, -1, -1, -1, 6, 7}};
        ring_all_gather(b);
        check_every_buffer(b, {1, 2, 3, 4, 5, 6, 7});
    }
}

TEST_CASE("ring_reduce_scatter against the direct sum, for shards that do not divide evenly and one rank") {
    // (n, ranks): n not a multiple of ranks (one longer shard, several, n < ranks), a multiple,
    // an empty buffer, one rank (no step at all).
    const std::pair<std::size_t, int> cases[] = {{5, 2}, {5, 3}, {11, 4}, {13, 5}, {23, 8}, {9, 7}, {2, 3},
                                                  {1, 5}, {5, 8}, {12, 4}, {0, 3}, {6, 1}, {2, 2}, {17, 6}};
    for (const auto& [n, N] : cases) {
        CAPTURE(n);
        CAPTURE(N);
        Buffers b(static_cast<std::size_t>(N), std::vector<float>(n));
        for (std::size_t r = 0; r < b.size(); ++r) {
            for (std::size_t i = 0; i < n; ++i) b[r][i] = static_cast<float>(static_cast<int>((7 * r + 3 * i) % 11) - 5);
        }
        const std::vector<float> sum = direct_sum(b);
        ring_reduce_scatter(b);
        check_own_shards(b, sum);
    }
}

TEST_CASE("property: for any length up to 60 and 1 to 8 ranks, reduce-scatter then all-gather give every rank the sum") {
    // Whole numbers from -50 to 50 times a power of two of any size (2^−20 … 2^90): every
    // partial sum is exact, in any order. 1 to 8 ranks and 0 to 60 elements (one rank, and one
    // element, a quarter of the time each). The ranks' buffers in a drawn order must give the
    // same sums (addition does not care which rank holds what).
    attn::check_property("ring_reduce_scatter leaves each rank its shard's sum; ring_all_gather every rank all", [] {
        const auto n = attn::draw("n", rc::gen::oneOf(rc::gen::just<std::size_t>(1), rc::gen::inRange<std::size_t>(0, 61)));
        const int N = static_cast<int>(attn::draw("ranks", attn::family::length(8)));
        const auto values = attn::draw("values / their magnitude (rank by rank)",
                                       rc::gen::container<std::vector<int>>(n * static_cast<std::size_t>(N), rc::gen::inRange(-50, 51)));
        const float size = attn::draw("magnitude", attn::family::magnitude(-6, 27));
        const float power = std::ldexp(1.0f, static_cast<int>(std::lround(std::log2(std::abs(static_cast<double>(size))))));
        const auto order = attn::draw("the ranks' order", attn::family::permutation(static_cast<std::size_t>(N)));
        for (int pass = 0; pass < 2; ++pass) {
            Buffers b(static_cast<std::size_t>(N), std::vector<float>(n));
            for (std::size_t r = 0; r < b.size(); ++r) {
                const std::size_t from = pass == 0 ? r : order[r];
                for (std::size_t i = 0; i < n; ++i) b[r][i] = static_cast<float>(values[from * n + i]) * power;
            }
            const std::vector<float> sum = direct_sum(b);
            const std::vector<Shard> shards = dealt_shards(n, N);
            ring_reduce_scatter(b);
            for (std::size_t r = 0; r < b.size(); ++r) {
                RC_ASSERT(b[r].size() == n);
                for (std::size_t i = shards[r].begin; i < shards[r].end; ++i) {
                    if (b[r][i] != sum[i]) {
                        std::ostringstream what;
                        what << "after ring_reduce_scatter, rank " << r << "'s own shard [" << shards[r].begin << ", "
                             << shards[r].end << "), element " << i << ": expected the sum " << sum[i] << ", got " << b[r][i];
                        RC_FAIL(what.str());
                    }
                }
            }
            ring_all_gather(b);
            for (std::size_t r = 0; r < b.size(); ++r) {
                RC_ASSERT(b[r].size() == n);
                for (std::size_t i = 0; i < n; ++i) {
                    if (b[r][i] != sum[i]) {
                        std::ostringstream what;
                        what << "after ring_all_gather, rank " << r << "'s element " << i << ": expected the sum " << sum[i]
                             << ", got " << b[r][i];
                        RC_FAIL(what.str());
                    }
                }
            }
        }
    });
}

TEST_CASE("property: the all-gather copies each rank's own shard, every value distinct, to every rank bit for bit") {
    // 1 to 8 ranks, 0 to 60 elements; rank r's own shard holds values distinct from every
    // other (a shard sent to the wrong place, or the wrong shard sent, shows), every other
    // element NaN (what a shard never received would still hold). Afterwards every buffer
    // holds every rank's own shard, bit for bit.
    attn::check_property("ring_all_gather copies every own shard everywhere", [] {
        const auto n = attn::draw("n", rc::gen::inRange<std::size_t>(0, 61));
        const int N = static_cast<int>(attn::draw("ranks", attn::family::length(8)));
        const auto whole = attn::draw("the gathered buffer (distinct)", attn::family::distinct(n));
        const std::vector<Shard> shards = dealt_shards(n, N);
        Buffers b(static_cast<std::size_t>(N), std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
        for (std::size_t r = 0; r < b.size(); ++r)
            for (std::size_t i = shards[r].begin; i < shards[r].end; ++i) b[r][i] = whole[i];
        ring_all_gather(b);
        for (std::size_t r = 0; r < b.size(); ++r) {
            RC_ASSERT(b[r].size() == n);
            for (std::size_t i = 0; i < n; ++i) RC_ASSERT(b[r][i] == whole[i]);
        }
    });
}

TEST_CASE("ring_reduce_scatter and ring_all_gather refuse no buffers and buffers of different lengths") {
    Buffers none;
    CHECK_THROWS_AS(ring_reduce_scatter(none), std::invalid_argument);
    CHECK_THROWS_AS(ring_all_gather(none), std::invalid_argument);
    Buffers uneven = {{1, 2, 3}, {4, 5, 6}, {7, 8}};
    CHECK_THROWS_AS(ring_reduce_scatter(uneven), std::invalid_argument);
    CHECK_THROWS_AS(ring_all_gather(uneven), std::invalid_argument);
    Buffers longer = {{1, 2}, {3, 4, 5}};
    CHECK_THROWS_AS(ring_reduce_scatter(longer), std::invalid_argument);
    CHECK_THROWS_AS(ring_all_gather(longer), std::invalid_argument);
}
