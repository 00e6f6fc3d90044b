// Exercise 20: the block-table arithmetic of a paged key/value cache.
//
// Write slot_of, append_slot, free_sequence and gather below, then run `./workbook check 20`.
// Stuck? `./workbook hint 20`. The contract (what each does, what to throw) is in
// exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

#include <stdexcept>

namespace exercise {

Slot slot_of(const std::vector<int>& table, int position, int block_tokens) {
    // TODO: check block_tokens >= 1, position >= 0 and position / block_tokens < table.size();
    //       otherwise throw std::invalid_argument saying which.

    // TODO: return {table[position / block_tokens], position % block_tokens}.

    (void)table, (void)position, (void)block_tokens;
    throw attn::NotImplemented("slot_of in exercises/20_serving/exercise.cpp: "
                               "the block at index p / block_tokens, the row p mod block_tokens");
}

Slot append_slot(Pool& pool, Sequence& seq, const std::function<void(int from, int to)>& copy) {
    // TODO: the offset of the new position is seq.length % pool.block_tokens.
    // TODO: offset 0: a new block (free.back(), count 1) appended to the table.
    // TODO: otherwise, if the last block's count is above 1: a new block, copy(old, new), the
    //       old one's count down by one, the new one in the table in its place.
    // TODO: throw OutOfBlocks before changing anything when a block is needed and none is free.
    // TODO: seq.length grows by one; return {the table's last block, offset}.

    (void)pool, (void)seq, (void)copy;
    throw attn::NotImplemented("append_slot in exercises/20_serving/exercise.cpp: "
                               "a block at a block's start, a copy of a shared last block");
}

void free_sequence(Pool& pool, Sequence& seq) {
    // TODO: for every block of seq.table: its count down by one; at 0, back onto pool.free.
    // TODO: then seq.length = 0 and seq.table empty.

    (void)pool, (void)seq;
    throw attn::NotImplemented("free_sequence in exercises/20_serving/exercise.cpp: "
                               "a block returns to the pool when no sequence holds it");
}

attn::Tensor2 gather(const attn::Tensor3& storage, const Sequence& seq) {
    // TODO: a (seq.length, hs) matrix; row p is storage(block, offset, :) with
    //       {block, offset} = slot_of(seq.table, p, storage.shape()[1]).

    (void)storage, (void)seq;
    throw attn::NotImplemented("gather in exercises/20_serving/exercise.cpp: "
                               "row p from slot_of(table, p)");
}

}  // namespace exercise
