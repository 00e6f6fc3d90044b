// Checks for exercise 20: the block-table arithmetic of a paged key/value cache.
//
// Properties, checked on generated inputs (the TEST_CASEs named "property: …"):
// - for any block size and any run of new sequences, forks, appends and frees on a small pool,
//   every sequence reads back exactly the rows written to it, every block's count is the
//   number of tables that hold it, and no block is lost or handed out twice
// - slot_of at any position an int holds, and every count out of range refused
#include "exercise.hpp"

#include "attn/check.hpp"
#include "attn/families.hpp"
#include "attn/property.hpp"

#include <doctest/doctest.h>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

using exercise::append_slot;
using exercise::free_sequence;
using exercise::gather;
using exercise::OutOfBlocks;
using exercise::Pool;
using exercise::Sequence;
using exercise::Slot;
using exercise::slot_of;

namespace {

// A pool of n free blocks of `bt` positions; the next taken is block 0, then 1, …
Pool fresh_pool(int n, int bt) {
    Pool p{bt, std::vector<int>(static_cast<std::size_t>(n), 0), {}};
    for (int b = n - 1; b >= 0; --b) p.free.push_back(b);
    return p;
}

// The same pool with its free blocks handed out in the order `order` (a permutation of 0 … n − 1):
// the next taken is block order[0], then order[1], …
Pool fresh_pool(const std::vector<std::size_t>& order, int bt) {
    Pool p{bt, std::vector<int>(order.size(), 0), {}};
    for (auto b = order.rbegin(); b != order.rend(); ++b) p.free.push_back(static_cast<int>(*b));
    return p;
}

// A second sequence holding the same blocks (what a fork does): every count up by one.
Sequence fork(Pool& pool, const Sequence& parent) {
    for (int b : parent.table) ++pool.refs[static_cast<std::size_t>(b)];
    return parent;
}

// A copy callback that records its calls.
struct Copies {
    std::vector<std::pair<int, int>> calls;
    std::function<void(int, int)> fn() {
        return [this](int from, int to) { calls.emplace_back(from, to); };
    }
};

}  // namespace

TEST_CASE("slot_of: the division picks the block, the remainder the row, as worked by hand") {
    const std::vector<int> table = {7, 3, 9};  // blocks of 4: positions 0-3, 4-7, 8-11
    const int expected_block[12] = {7, 7, 7, 7, 3, 3, 3, 3, 9, 9, 9, 9};
    for (int p = 0; p < 12; ++p) {
        CAPTURE(p);
        const Slot s = slot_of(table, p, 4);
        CHECK(s.block == expected_block[p]);
        CHECK(s.offset == p % 4);
    }
    // blocks of 1: every position its own block
    CHECK(slot_of(table, 2, 1).block == 9);
    CHECK(slot_of(table, 2, 1).offset == 0);
}

TEST_CASE("slot_of refuses a position past the table, a negative one and blocks of no positions") {
    const std::vector<int> table = {7, 3, 9};
    CHECK_THROWS_AS(slot_of(table, 12, 4), std::invalid_argument);  // the 4th block: none
    CHECK_THROWS_AS(slot_of(table, -1, 4), std::invalid_argument);
    CHECK_THROWS_AS(slot_of(table, 0, 0), std::invalid_argument);
    CHECK_THROWS_AS(slot_of({}, 0, 4), std::invalid_argument);
}

TEST_CASE("append_slot takes a block exactly when a position starts one, as worked by hand") {
    Pool pool = fresh_pool(3, 2);  // 3 blocks of 2 positions; free.back() is block 0
    Sequence a;
    Copies copies;
    const Slot s0 = append_slot(pool, a, copies.fn());
    CHECK(s0.block == 0);
    CHECK(s0.offset == 0);
    CHECK(pool.refs == std::vector<int>{1, 0, 0});
    CHECK(pool.free == std::vector<int>{2, 1});
    const Slot s1 = append_slot(pool, a, copies.fn());  // row 1 of block 0: no new block
    CHECK(s1.block == 0);
    CHECK(s1.offset == 1);
    CHECK(pool.free == std::vector<int>{2, 1});
    const Slot s2 = append_slot(pool, a, copies.fn());  // position 2 starts block 1
    CHECK(s2.block == 1);
    CHECK(s2.offset == 0);
    CHECK(a.length == 3);
    CHECK(a.table == std::vector<int>{0, 1});
    CHECK(pool.refs == std::vector<int>{1, 1, 0});
    CHECK(pool.free == std::vector<int>{2});
    CHECK(copies.calls.empty());  // nothing shared, nothing copied
}

TEST_CASE("append_slot copies a shared last block before writing into it, as worked by hand") {
    Pool pool = fresh_pool(4, 2);
    Sequence a;
    Copies copies;
    for (int i = 0; i < 3; ++i) append_slot(pool, a, copies.fn());  // a: blocks [0 1], length 3
    Sequence b = fork(pool, a);                                        // both hold 0 and 1
    CHECK(pool.refs == std::vector<int>{2, 2, 0, 0});
    // b's position 3 is row 1 of block 1, which a still reads: b writes into a copy, block 2
    const Slot s = append_slot(pool, b, copies.fn());
    CHECK(s.block == 2);
    CHECK(s.offset == 1);
    REQUIRE(copies.calls.size() == 1);  // the rows come along: copy(1, 2)
    CHECK(copies.calls[0].first == 1);
    CHECK(copies.calls[0].second == 2);
    CHECK(b.table == std::vector<int>{0, 2});
    CHECK(a.table == std::vector<int>{0, 1});  // a never sees the change
    CHECK(pool.refs == std::vector<int>{2, 1, 1, 0});
    // a's own position 3: block 1 is a's alone now, no copy
    const Slot t = append_slot(pool, a, copies.fn());
    CHECK(t.block == 1);
    CHECK(t.offset == 1);
    CHECK(copies.calls.size() == 1);
    // a block shared but full is never written again: the next position starts a new block
    Sequence c = fork(pool, a);  // length 4: blocks 0 and 1 full
    const Slot u = append_slot(pool, c, copies.fn());
    CHECK(u.offset == 0);
    CHECK(u.block == 3);
    CHECK(copies.calls.size() == 1);
}

TEST_CASE("out of blocks: append_slot throws OutOfBlocks and changes nothing") {
    Copies copies;
    SUBCASE("a position that starts a block") {
        Pool pool = fresh_pool(1, 2);
        Sequence a;
        append_slot(pool, a, copies.fn());
        append_slot(pool, a, copies.fn());  // block 0 full
        const Pool before = pool;
        CHECK_THROWS_AS(append_slot(pool, a, copies.fn()), OutOfBlocks);
        CHECK(a.length == 2);
        CHECK(a.table == std::vector<int>{0});
        CHECK(pool.refs == before.refs);
        CHECK(pool.free == before.free);
    }
    SUBCASE("a shared block that needs a copy") {
        Pool pool = fresh_pool(1, 2);
        Sequence a;
        append_slot(pool, a, copies.fn());  // block 0, one row
        Sequence b = fork(pool, a);
        CHECK_THROWS_AS(append_slot(pool, b, copies.fn()), OutOfBlocks);
        CHECK(b.length == 1);
        CHECK(b.table == std::vector<int>{0});
        CHECK(pool.refs == std::vector<int>{2});
        CHECK(copies.calls.empty());
    }
}

TEST_CASE("free_sequence returns a block only when no other sequence holds it") {
    Pool pool = fresh_pool(4, 2);
    Sequence a;
    Copies copies;
    for (int i = 0; i < 4; ++i) append_slot(pool, a, copies.fn());  // blocks [0 1]
    Sequence b = fork(pool, a);
    append_slot(pool, b, copies.fn());  // b: [0 1 2]
    free_sequence(pool, a);
    CHECK(a.length == 0);
    CHECK(a.table.empty());
    CHECK(pool.refs == std::vector<int>{1, 1, 1, 0});  // b still holds 0 and 1
    CHECK(pool.free == std::vector<int>{3});
    free_sequence(pool, b);
    CHECK(pool.refs == std::vector<int>{0, 0, 0, 0});
    std::vector<int> all = pool.free;
    std::sort(all.begin(), all.end());
    CHECK(all == std::vector<int>{0, 1, 2, 3});  // every block back, once
}

TEST_CASE("gather reads the sequence's rows in position order, as worked by hand") {
    // 3 blocks of 2 rows of one number: row r of block b holds 10·b + r
    attn::Tensor3 storage = xt::zeros<float>({3, 2, 1});
    for (std::size_t b = 0; b < 3; ++b)
        for (std::size_t r = 0; r < 2; ++r) storage(b, r, 0) = static_cast<float>(10 * b + r);
    Sequence s{3, {2, 0}};  // positions 0, 1 in block 2, position 2 in row 0 of block 0
    const attn::Tensor2 expected = {{20}, {21}, {0}};
    CHECK_CLOSE(gather(storage, s), expected, 0.0);
    Sequence empty;
    CHECK(gather(storage, empty).shape()[0] == 0);
}

TEST_CASE("gather copies every channel of a row, as worked by hand with three channels") {
    // 2 blocks of 2 rows of 3 channels: row r of block b holds (10b + r, 100 + 10b + r,
    // 200 + 10b + r). Sequence {3, {1, 0}}: positions 0 and 1 in block 1, position 2 in
    // row 0 of block 0.
    attn::Tensor3 storage = xt::zeros<float>({2, 2, 3});
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t r = 0; r < 2; ++r)
            for (std::size_t d = 0; d < 3; ++d) storage(b, r, d) = static_cast<float>(100 * d + 10 * b + r);
    const attn::Tensor2 expected = {{10, 110, 210}, {11, 111, 211}, {0, 100, 200}};
    INFO("row p of the result is all hs channels of position p's row: storage(block, offset, d) for every d");
    CHECK_CLOSE(gather(storage, Sequence{3, {1, 0}}), expected, 0.0);
}

TEST_CASE("property: slot_of at any position an int holds, and every count out of range refused") {
    // Positions from 0 to 2^31 − 1 (an int's range, as the contract has it) with blocks large
    // enough that the table needs at most 4096 entries, each entry a distinct block id: the
    // slot is {table[p / bt], p mod bt}. Then one thing out of range: block_tokens below 1
    // (0, −1, −2, −10^6, the lowest int), a position below 0, or one at or past the table's
    // end: std::invalid_argument.
    attn::check_property("slot_of is the division and the remainder at any position, and refuses the rest", [] {
        const int position = attn::draw("position", rc::gen::oneOf(rc::gen::inRange(0, 100000),
                                                                   rc::gen::inRange(0, std::numeric_limits<int>::max())));
        const int smallest = position / 4096 + 1;
        const int bt = attn::draw("block_tokens (at least position / 4096 + 1)",
                                  rc::gen::inRange(smallest, smallest + 1 + attn::draw("extra", rc::gen::inRange(0, 1000))));
        const std::size_t blocks = static_cast<std::size_t>(position / bt) + 1 + attn::draw("blocks past it", rc::gen::inRange<std::size_t>(0, 3));
        std::vector<int> table(blocks);
        for (std::size_t i = 0; i < blocks; ++i) table[i] = static_cast<int>(7 * i + 3);
        const Slot s = slot_of(table, position, bt);
        RC_ASSERT(s.block == table[static_cast<std::size_t>(position / bt)]);
        RC_ASSERT(s.offset == position % bt);
        const auto below = [](const char* name, long lowest) {
            return static_cast<int>(std::max<long>(attn::draw(name, attn::family::below(lowest)), std::numeric_limits<int>::min()));
        };
        switch (attn::draw("what is out of range", rc::gen::inRange(0, 3))) {
            case 0: RC_ASSERT(attn::refused([&] { (void)slot_of(table, position, below("block_tokens", 1)); })); break;
            case 1: RC_ASSERT(attn::refused([&] { (void)slot_of(table, below("position", 0), bt); })); break;
            default: {
                const long past = static_cast<long>(blocks) * bt + attn::draw("past the table by", rc::gen::inRange(0, 3));
                if (past > std::numeric_limits<int>::max()) return;  // no int position is past this table
                RC_ASSERT(attn::refused([&] { (void)slot_of(table, static_cast<int>(past), bt); }));
            }
        }
    });
}

TEST_CASE("property: the pool stays whole and every sequence reads back its own rows") {
    // Blocks of 1 to 4 positions (1 a quarter of the time), a pool of 3 to 8 blocks handed
    // out in a drawn order, rows of 2 to 4 channels, up to 60 random operations: a new
    // sequence, a fork, an append (its row holds a number never used before times each
    // channel's own factor, pairwise distinct, written through the returned slot; copies go
    // through the callback into the same storage), a free. A reference list of each
    // sequence's rows is kept alongside, and every channel of every row is compared.
    attn::check_property("slot_of, append_slot, free_sequence and gather keep a pool whole", [] {
        const int bt = static_cast<int>(attn::draw("block_tokens", attn::family::length(4)));
        const int n = attn::draw("blocks in the pool", rc::gen::inRange(3, 9));
        const std::size_t hs = attn::draw("hs", rc::gen::inRange<std::size_t>(2, 5));
        const auto channel = attn::draw("each channel's factor (distinct)", attn::family::distinct(hs));
        Pool pool = fresh_pool(attn::draw("the order blocks are handed out", attn::family::permutation(static_cast<std::size_t>(n))), bt);
        attn::Tensor3 storage = xt::zeros<float>({static_cast<std::size_t>(n), static_cast<std::size_t>(bt), hs});
        auto copy = [&storage](int from, int to) {
            xt::view(storage, static_cast<std::size_t>(to)) = xt::view(storage, static_cast<std::size_t>(from));
        };
        std::vector<Sequence> seqs;
        std::vector<std::vector<float>> rows;  // the reference: position p's channel d is rows[p·hs + d]
        float next = 1.0f;
        const int ops = attn::draw("operations", rc::gen::inRange(1, 61));
        for (int op = 0; op < ops; ++op) {
            const int kind = attn::draw("operation (0 new, 1 fork, 2 free, else append)", rc::gen::inRange(0, 8));
            if (seqs.empty() || kind == 0) {
                seqs.emplace_back();
                rows.emplace_back();
            } else {
                const std::size_t i = attn::draw("on sequence", rc::gen::inRange<std::size_t>(0, seqs.size()));
                if (kind == 1) {
                    seqs.push_back(fork(pool, seqs[i]));
                    rows.push_back(rows[i]);
                } else if (kind == 2) {
                    free_sequence(pool, seqs[i]);
                    RC_ASSERT(seqs[i].length == 0 && seqs[i].table.empty());
                    seqs.erase(seqs.begin() + static_cast<long>(i));
                    rows.erase(rows.begin() + static_cast<long>(i));
                } else {
                    const Sequence before = seqs[i];
                    const std::vector<int> refs = pool.refs, free = pool.free;
                    try {
                        const Slot s = append_slot(pool, seqs[i], copy);
                        RC_ASSERT(s.offset == before.length % bt);
                        RC_ASSERT(seqs[i].length == before.length + 1);
                        for (std::size_t d = 0; d < hs; ++d) {
                            const float value = next * channel[d];
                            storage(static_cast<std::size_t>(s.block), static_cast<std::size_t>(s.offset), d) = value;
                            rows[i].push_back(value);
                        }
                        next += 1.0f;
                    } catch (const OutOfBlocks&) {
                        RC_ASSERT(free.empty());  // thrown only when the pool is empty ...
                        RC_ASSERT(seqs[i].length == before.length);  // ... and nothing changed
                        RC_ASSERT(seqs[i].table == before.table);
                        RC_ASSERT(pool.refs == refs);
                    }
                }
            }
            // every sequence reads back exactly its rows
            std::map<int, int> holders;
            for (std::size_t k = 0; k < seqs.size(); ++k) {
                RC_ASSERT(seqs[k].length == static_cast<int>(rows[k].size() / hs));
                RC_ASSERT(static_cast<int>(seqs[k].table.size()) == (seqs[k].length + bt - 1) / bt);
                for (int b : seqs[k].table) ++holders[b];
                const attn::Tensor2 g = gather(storage, seqs[k]);
                RC_ASSERT(g.shape() == (std::array<std::size_t, 2>{rows[k].size() / hs, hs}));
                for (std::size_t p = 0; p < rows[k].size() / hs; ++p)
                    for (std::size_t d = 0; d < hs; ++d) RC_ASSERT(g(p, d) == rows[k][p * hs + d]);
            }
            // counts are the tables that hold each block; free blocks are held by none, once each
            std::set<int> free_set(pool.free.begin(), pool.free.end());
            RC_ASSERT(free_set.size() == pool.free.size());
            for (int b = 0; b < n; ++b) {
                RC_ASSERT(pool.refs[static_cast<std::size_t>(b)] == holders[b]);
                RC_ASSERT((free_set.count(b) == 1) == (holders[b] == 0));
            }
        }
    });
}
