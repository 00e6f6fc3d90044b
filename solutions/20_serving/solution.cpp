// Solution to exercise 20: the block-table arithmetic of a paged key/value cache.
#include "exercise.hpp"

#include <xtensor/xbuilder.hpp>

#include <stdexcept>
#include <string>

namespace exercise {

Slot slot_of(const std::vector<int>& table, int position, int block_tokens) {
    if (block_tokens < 1)
        throw std::invalid_argument("slot_of: block_tokens must be at least 1, got " +
                                    std::to_string(block_tokens));
    if (position < 0 || position / block_tokens >= static_cast<int>(table.size()))
        throw std::invalid_argument("slot_of: position " + std::to_string(position) +
                                    " is outside the table's " + std::to_string(table.size()) +
                                    " blocks of " + std::to_string(block_tokens));
    return {table[static_cast<std::size_t>(position / block_tokens)], position % block_tokens};
}

namespace {
int take(Pool& pool) {
    const int b = pool.free.back();
    pool.free.pop_back();
    pool.refs[static_cast<std::size_t>(b)] = 1;
    return b;
}
}  // namespace

Slot append_slot(Pool& pool, Sequence& seq, const std::function<void(int from, int to)>& copy) {
    const int offset = seq.length % pool.block_tokens;
    if (offset == 0) {
        if (pool.free.empty()) throw OutOfBlocks("append_slot: no free block for a new block");
        seq.table.push_back(take(pool));
    } else {
        int& last = seq.table.back();
        if (pool.refs[static_cast<std::size_t>(last)] > 1) {  // shared: write into a copy
            if (pool.free.empty()) throw OutOfBlocks("append_slot: no free block to copy into");
            const int fresh = take(pool);
            copy(last, fresh);
            --pool.refs[static_cast<std::size_t>(last)];
            last = fresh;
        }
    }
    ++seq.length;
    return {seq.table.back(), offset};
}

void free_sequence(Pool& pool, Sequence& seq) {
    for (int b : seq.table) {
        if (--pool.refs[static_cast<std::size_t>(b)] == 0) pool.free.push_back(b);
    }
    seq.length = 0;
    seq.table.clear();
}

attn::Tensor2 gather(const attn::Tensor3& storage, const Sequence& seq) {
    const int block_tokens = static_cast<int>(storage.shape()[1]);
    const std::size_t hs = storage.shape()[2];
    attn::Tensor2 out = xt::zeros<float>({static_cast<std::size_t>(seq.length), hs});
    for (int p = 0; p < seq.length; ++p) {
        const Slot s = slot_of(seq.table, p, block_tokens);
        for (std::size_t d = 0; d < hs; ++d)
            out(static_cast<std::size_t>(p), d) =
                storage(static_cast<std::size_t>(s.block), static_cast<std::size_t>(s.offset), d);
    }
    return out;
}

}  // namespace exercise
