// Partial attentions merged by their log-sum-exps, and sequences split into pieces.
#include "attn/partial_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

namespace attn {

//! [merge]
void merge_partial_attention(float* out, float* lse, const float* out_b, const float* lse_b,
                             std::size_t rows, std::size_t hs) {
    for (std::size_t i = 0; i < rows; ++i) {
        const float m = std::max(lse[i], lse_b[i]);
        if (m == -std::numeric_limits<float>::infinity()) continue;  // neither side saw a key
        const float a = std::exp(lse[i] - m), b = std::exp(lse_b[i] - m);  // both ≤ 1, one is 1
        const float sum = a + b;
        float* o = out + i * hs;
        const float* ob = out_b + i * hs;
        for (std::size_t d = 0; d < hs; ++d) o[d] = (a * o[d] + b * ob[d]) / sum;
        lse[i] = m + std::log(sum);
    }
}
//! [merge]

void merge_adding_log_sum_exps(float* out, float* lse, const float* out_b, const float* lse_b,
                               std::size_t rows, std::size_t hs) {
    const float none = -std::numeric_limits<float>::infinity();
    for (std::size_t i = 0; i < rows; ++i) {
        if (lse_b[i] == none) continue;
        if (lse[i] == none) {
            std::copy(out_b + i * hs, out_b + (i + 1) * hs, out + i * hs);
            lse[i] = lse_b[i];
            continue;
        }
        //! [wrong_merge]
        const float merged = lse[i] + lse_b[i];  // wrong: ln(x) + ln(y) is ln(x·y), not ln(x + y)
        //! [wrong_merge]
        const float a = std::exp(lse[i] - merged), b = std::exp(lse_b[i] - merged);
        for (std::size_t d = 0; d < hs; ++d) out[i * hs + d] = a * out[i * hs + d] + b * out_b[i * hs + d];
        lse[i] = merged;
    }
}

const char* sequence_order_name(SequenceOrder order) {
    return order == SequenceOrder::zigzag ? "zigzag" : "contiguous";
}

void SequenceSplit::validate() const {
    if (ranks < 1) throw std::invalid_argument("a sequence split needs at least one rank");
    const std::size_t n = pieces();
    if (T == 0 || T % n != 0) {
        throw std::invalid_argument(std::string("a ") + sequence_order_name(order) + " split of T = " +
                                    std::to_string(T) + " over " + std::to_string(ranks) +
                                    " ranks cuts it into " + std::to_string(n) +
                                    " equal pieces: T must be a positive multiple of " +
                                    std::to_string(n));
    }
}

std::size_t SequenceSplit::pieces() const {
    return order == SequenceOrder::zigzag ? 2 * ranks : ranks;
}

std::vector<std::size_t> SequenceSplit::pieces_of(std::size_t rank) const {
    if (rank >= ranks) {
        throw std::invalid_argument("rank " + std::to_string(rank) + " of a split over " +
                                    std::to_string(ranks) + " ranks");
    }
    if (order == SequenceOrder::contiguous) return {rank};
    return {rank, 2 * ranks - 1 - rank};
}

namespace {
// Where each contiguous run of a rank's pieces lies: (offset in the local tensor, offset in
// the whole tensor), each run piece_length · width floats long.
struct Span {
    std::size_t local, global;
};
std::vector<Span> piece_spans(const SequenceSplit& split, std::size_t rank, std::size_t B,
                              std::size_t NH, std::size_t width) {
    split.validate();
    const std::size_t T = split.T, c = split.piece_length();
    const std::size_t piece_floats = B * NH * c * width;  // one (B, NH, c, width) piece
    const std::vector<std::size_t> pieces = split.pieces_of(rank);
    std::vector<Span> spans;
    for (std::size_t p = 0; p < pieces.size(); ++p) {
        for (std::size_t bh = 0; bh < B * NH; ++bh) {
            spans.push_back({p * piece_floats + bh * c * width, (bh * T + pieces[p] * c) * width});
        }
    }
    return spans;
}
}  // namespace

void take_local_pieces(float* local, const float* global, const SequenceSplit& split,
                       std::size_t rank, std::size_t B, std::size_t NH, std::size_t width) {
    const std::vector<Span> spans = piece_spans(split, rank, B, NH, width);  // validates
    const std::size_t run = split.piece_length() * width;
    for (const Span& s : spans) {
        std::memcpy(local + s.local, global + s.global, run * sizeof(float));
    }
}

void put_local_pieces(float* global, const float* local, const SequenceSplit& split,
                      std::size_t rank, std::size_t B, std::size_t NH, std::size_t width) {
    const std::vector<Span> spans = piece_spans(split, rank, B, NH, width);  // validates
    const std::size_t run = split.piece_length() * width;
    for (const Span& s : spans) {
        std::memcpy(global + s.global, local + s.local, run * sizeof(float));
    }
}

BlockMask block_mask(std::size_t qi, std::size_t kj, bool causal) {
    if (!causal || kj < qi) return BlockMask::full;
    return kj == qi ? BlockMask::diagonal : BlockMask::skipped;
}

std::size_t attention_pairs(const SequenceSplit& split, std::size_t rank, bool causal) {
    split.validate();
    const std::size_t c = split.piece_length();
    std::size_t pairs = 0;
    for (std::size_t qi : split.pieces_of(rank)) {
        for (std::size_t kj = 0; kj < split.pieces(); ++kj) {
            const BlockMask mask = block_mask(qi, kj, causal);
            pairs += mask == BlockMask::full ? c * c : mask == BlockMask::diagonal ? c * (c + 1) / 2 : 0;
        }
    }
    return pairs;
}

}  // namespace attn
