/// @file paged_attention.hpp
/// @brief Lesson 20 on the GPU: one new query per sequence over its keys and values in a
/// paged pool (attn::PagedKVCache's layout), as attn::paged_attention_step.
#pragma once

#include "attn/cuda/gpt_ops.hpp"  // stream_t

#include <vector>

namespace attn::cuda {

/// The sequences of one batched decode step and where their keys and values are.
struct PagedBatch {
    /// The block tables, one row of `max_blocks` entries per sequence (unused entries: any
    /// value, never read).
    std::vector<int> tables;
    int max_blocks = 0;        ///< entries per row of `tables`
    /// Per sequence: the oldest position read (the query attends over positions first … pos).
    std::vector<int> first;
    std::vector<int> pos;      ///< per sequence: the query's position, at least first
};

/// Per sequence s and head h: `out[s, h·hs + d] = Σ_j softmax_j(q_{s,h} · k_j / √hs [+ m_h (j − T + 1)])
/// v_j[d]` over positions j = first[s] … pos[s], where the key of position p is row p mod Bt of
/// block tables[s, p / Bt] in the pool. One block of threads per (head, sequence); the weights
/// stay in shared memory. The tables and positions are copied to the device on every call.
/// @param out (S, C) device memory  @param q (S rows of q_stride floats) device memory; row
/// s's first C floats are its query, heads side by side
/// @param q_stride floats between two sequences' queries (C, or c_attn's width)
/// @param key_pool one layer's keys, (num_blocks, G, Bt, hs), device memory
/// @param value_pool one layer's values, same layout
/// @param batch the tables and positions, S = first.size() sequences
/// @param num_blocks blocks in the pool  @param Bt positions per block
/// @param C channels  @param NH query heads  @param G key/value heads, dividing NH
/// @param alibi_slopes (NH) device memory, or null for no bias
/// @param stream the stream
/// @throws std::invalid_argument for sizes that do not fit together, a position range outside
///         its table, a table entry outside the pool, or more than 12 256 positions per
///         sequence (48 KiB of shared memory)
void paged_attention_forward(float* out, const float* q, int q_stride, const float* key_pool,
                             const float* value_pool, const PagedBatch& batch, int num_blocks,
                             int Bt, int C, int NH, int G, const float* alibi_slopes,
                             stream_t stream);

}  // namespace attn::cuda
