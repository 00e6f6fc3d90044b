// Solution to exercise 17: the masks of a padded encoder–decoder batch, the masked softmax
// and the loss over the real positions.
#include "exercise.hpp"

#include <xtensor/xbuilder.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace exercise {

namespace {

void check_lengths(const std::vector<int>& lengths, int lowest, int padded, const char* what) {
    for (std::size_t b = 0; b < lengths.size(); ++b)
        if (lengths[b] < lowest || lengths[b] > padded)
            throw std::invalid_argument(std::string(what) + " " + std::to_string(b) + " has length " +
                                        std::to_string(lengths[b]) + ", outside [" + std::to_string(lowest) +
                                        ", " + std::to_string(padded) + "]");
}

}  // namespace

BatchMasks batch_masks(const std::vector<int>& source_lengths, int S,
                       const std::vector<int>& target_lengths, int T) {
    if (source_lengths.empty() || source_lengths.size() != target_lengths.size())
        throw std::invalid_argument("batch_masks: " + std::to_string(source_lengths.size()) + " sources and " +
                                    std::to_string(target_lengths.size()) + " targets (need the same, at least 1)");
    if (S < 1 || T < 1)
        throw std::invalid_argument("batch_masks: the padded lengths S = " + std::to_string(S) + " and T = " +
                                    std::to_string(T) + " must be at least 1");
    check_lengths(source_lengths, 0, S, "source");
    check_lengths(target_lengths, 1, T, "target");
    const std::size_t B = source_lengths.size(), s = static_cast<std::size_t>(S), t = static_cast<std::size_t>(T);
    BatchMasks m{xt::zeros<bool>({B, s, s}), xt::zeros<bool>({B, t, t}), xt::zeros<bool>({B, t, s})};
    for (std::size_t b = 0; b < B; ++b) {
        const int src = source_lengths[b], tgt = target_lengths[b];
        for (int i = 0; i < S; ++i)
            for (int j = 0; j < S; ++j) m.encoder(b, i, j) = j < src;  // the key axis
        for (int i = 0; i < T; ++i)
            for (int j = 0; j < T; ++j) m.decoder(b, i, j) = j <= i && j < tgt;
        for (int i = 0; i < T; ++i)
            for (int j = 0; j < S; ++j) m.cross(b, i, j) = j < src;  // the encoder's keys
    }
    return m;
}

attn::Mask<2> chunk_causal_mask(int T_q, int T_k) {
    if (T_q < 1 || T_k < T_q)
        throw std::invalid_argument("chunk_causal_mask: need 1 <= T_q <= T_k, got T_q = " + std::to_string(T_q) +
                                    ", T_k = " + std::to_string(T_k));
    attn::Mask<2> m = xt::zeros<bool>({static_cast<std::size_t>(T_q), static_cast<std::size_t>(T_k)});
    const int cached = T_k - T_q;  // query i is position cached + i
    for (int i = 0; i < T_q; ++i)
        for (int j = 0; j < T_k; ++j) m(i, j) = j <= i + cached;
    return m;
}

attn::Tensor3 masked_softmax(const attn::Tensor3& scores, const attn::Mask<3>& mask) {
    if (scores.shape() != mask.shape())
        throw std::invalid_argument("masked_softmax: scores " + attn::shape_of(scores) +
                                    " and mask " + attn::shape_of(mask) + " differ");
    attn::Tensor3 w = xt::zeros<float>(scores.shape());
    const std::size_t B = scores.shape()[0], Tq = scores.shape()[1], Tk = scores.shape()[2];
    for (std::size_t b = 0; b < B; ++b)
        for (std::size_t i = 0; i < Tq; ++i) {
            float m = -std::numeric_limits<float>::infinity();
            for (std::size_t j = 0; j < Tk; ++j)
                if (mask(b, i, j)) m = std::max(m, scores(b, i, j));
            if (m == -std::numeric_limits<float>::infinity()) continue;  // sees no key: zeros
            float sum = 0.0f;
            for (std::size_t j = 0; j < Tk; ++j)
                if (mask(b, i, j)) sum += w(b, i, j) = std::exp(scores(b, i, j) - m);
            for (std::size_t j = 0; j < Tk; ++j) w(b, i, j) /= sum;
        }
    return w;
}

double masked_mean_loss(const attn::Tensor2& losses, const std::vector<int>& target_lengths) {
    const std::size_t B = losses.shape()[0];
    const int T = static_cast<int>(losses.shape()[1]);
    if (target_lengths.size() != B)
        throw std::invalid_argument("masked_mean_loss: " + std::to_string(B) + " rows of losses but " +
                                    std::to_string(target_lengths.size()) + " lengths");
    check_lengths(target_lengths, 1, T, "target");
    double sum = 0.0;
    long count = 0;
    for (std::size_t b = 0; b < B; ++b)
        for (int t = 0; t < target_lengths[b]; ++t) {
            sum += losses(b, static_cast<std::size_t>(t));
            ++count;
        }
    return sum / static_cast<double>(count);
}

}  // namespace exercise
