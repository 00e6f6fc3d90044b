// Exercise 17: the masks of a padded encoder–decoder batch, the softmax they feed and the
// loss that must ignore the padding.
//
// Write batch_masks, chunk_causal_mask, masked_softmax and masked_mean_loss below, then run
// `./workbook check 17`. Stuck? `./workbook hint 17`. The contract (formulas, shapes, what
// to throw) is in exercise.hpp beside this file.
#include "exercise.hpp"

#include "attn/error.hpp"

#include <stdexcept>

namespace exercise {

BatchMasks batch_masks(const std::vector<int>& source_lengths, int S,
                       const std::vector<int>& target_lengths, int T) {
    // TODO: check the input (same number of sources and targets, at least one; S, T >= 1;
    //       0 <= source_lengths[b] <= S; 1 <= target_lengths[b] <= T), throwing
    //       std::invalid_argument otherwise.

    // TODO: three masks, all false to start (xt::zeros<bool>({B, S, S}) and so on), then
    //       encoder(b, i, j) = j < source_lengths[b]              (the KEY axis, every query)
    //       decoder(b, i, j) = j <= i && j < target_lengths[b]    (causal and padded)
    //       cross(b, i, j)   = j < source_lengths[b]              (whose keys are these?)

    (void)source_lengths, (void)S, (void)target_lengths, (void)T;
    throw attn::NotImplemented("batch_masks in exercises/17_cross_attention/exercise.cpp: the "
                               "encoder, decoder and cross-attention masks of a padded batch");
}

attn::Mask<2> chunk_causal_mask(int T_q, int T_k) {
    // TODO: check 1 <= T_q <= T_k. The chunk's queries are the LAST T_q of T_k positions:
    //       query i may see keys j <= i + (T_k - T_q).

    (void)T_q, (void)T_k;
    throw attn::NotImplemented("chunk_causal_mask in exercises/17_cross_attention/exercise.cpp: "
                               "the causal mask of new queries after a KV cache");
}

attn::Tensor3 masked_softmax(const attn::Tensor3& scores, const attn::Mask<3>& mask) {
    // TODO: check that the shapes are equal. For each row (b, i): the largest ALLOWED score
    //       m; exp(score - m) on the allowed keys, 0 on the others; divide by their sum.
    //       A row with no allowed key stays all zeros (not NaN, not uniform).

    (void)scores, (void)mask;
    throw attn::NotImplemented("masked_softmax in exercises/17_cross_attention/exercise.cpp: the "
                               "softmax over the allowed keys, zeros for a row that allows none");
}

double masked_mean_loss(const attn::Tensor2& losses, const std::vector<int>& target_lengths) {
    // TODO: check the sizes and that 1 <= target_lengths[b] <= T. Sum losses(b, t) for
    //       t < target_lengths[b] only, and divide by how many positions that was.

    (void)losses, (void)target_lengths;
    throw attn::NotImplemented("masked_mean_loss in exercises/17_cross_attention/exercise.cpp: "
                               "the mean loss over the real target positions");
}

}  // namespace exercise
