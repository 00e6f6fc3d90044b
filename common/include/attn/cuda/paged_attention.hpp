/// @file paged_attention.hpp
/// @brief Lesson 20 on the GPU: one new query per sequence over its keys and values in a
/// paged pool (attn::PagedKVCache's layout), as attn::paged_attention_step.
#pragma once

#include "attn/cuda/gpt_ops.hpp"  // stream_t

#include <cstddef>
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

/// A PagedBatch checked against its pool and copied to the device once, for the launches of
/// every layer of one step (paged_attention_forward with a PagedBatch copies it on every
/// call and waits for the launch). Owns its device memory; reused from step to step.
class DevicePagedBatch {
public:
    DevicePagedBatch() = default;
    ~DevicePagedBatch();
    DevicePagedBatch(const DevicePagedBatch&) = delete;             ///< owns device memory
    DevicePagedBatch& operator=(const DevicePagedBatch&) = delete;  ///< owns device memory
    /// Checks `batch` as paged_attention_forward does and copies it to the device (waits for
    /// the device first: the previous step's launches may still read the old tables).
    /// @param batch the tables and positions  @param num_blocks blocks in the pool
    /// @param Bt positions per block
    /// @throws std::invalid_argument as paged_attention_forward
    void upload(const PagedBatch& batch, int num_blocks, int Bt);
    int sequences() const { return S_; }             ///< S, the queries
    int max_blocks() const { return max_blocks_; }   ///< entries per table row
    int num_blocks() const { return num_blocks_; }   ///< the pool's blocks it was checked against
    int longest() const { return longest_; }         ///< the most positions one query reads
    const int* tables() const { return ints_; }      ///< (S, max_blocks) device memory
    const int* first() const { return ints_ + static_cast<std::size_t>(S_) * max_blocks_; }  ///< (S)
    const int* pos() const { return first() + S_; }  ///< (S) device memory

private:
    int* ints_ = nullptr;  // tables, first, pos
    std::size_t capacity_ = 0;
    int S_ = 0, max_blocks_ = 0, num_blocks_ = 0, longest_ = 0;
};

/// paged_attention_forward over a batch already on the device: enqueued, no wait.
/// @param out (S, C) device memory  @param q (S rows of q_stride floats) device memory
/// @param q_stride floats between two queries  @param key_pool one layer's keys,
/// (num_blocks, G, Bt, hs)  @param value_pool its values  @param batch uploaded for a pool of
/// this many blocks of Bt positions  @param Bt positions per block  @param C channels
/// @param NH query heads  @param G key/value heads  @param alibi_slopes (NH) or null
/// @param stream the stream
/// @throws std::invalid_argument for sizes that do not fit together
void paged_attention_forward(float* out, const float* q, int q_stride, const float* key_pool,
                             const float* value_pool, const DevicePagedBatch& batch, int Bt,
                             int C, int NH, int G, const float* alibi_slopes, stream_t stream);

/// The embeddings of a batch of rows, each at its own position (rows of many sequences):
/// `out[r] = wte[tokens[r]] + wpe[positions[r]]`, as attn::encoder_forward row by row.
/// @param out (R, C) device memory  @param tokens (R) device ids in [0, V)
/// @param positions (R) device positions, below block_size  @param wte (V, C)
/// @param wpe (block_size, C), or null for a model without learned positions
/// @param R rows  @param C channels  @param stream the stream
void rows_encoder_forward(float* out, const int* tokens, const int* positions, const float* wte,
                          const float* wpe, int R, int C, stream_t stream);

/// RoPE on a batch of rows, each at its own position, as attn::rope_forward row by row: every
/// pair (2i, 2i+1) of each query head and key head of row r rotated by the angle of
/// (positions[r], i), whose cosine and sine the host computed (attn::rope_angle, in double,
/// then rounded to float as the CPU's rope_forward rounds them).
/// @param qkv (R, C + 2·G·hs) device memory, changed in place  @param positions (R) device
/// @param cos_sin (block_size, hs/2, 2) device: cos, sin of each position's angles
/// @param R rows  @param C channels  @param NH query heads  @param G key/value heads
/// @param stream the stream
void rows_rope_forward(float* qkv, const int* positions, const float* cos_sin, int R, int C,
                       int NH, int G, stream_t stream);

/// Stores each row's key and value in its slot of a paged pool, as attn::PagedKVCache::write:
/// key head g of row r goes to row slots[2r + 1] of block slots[2r] (keys (g, offset, :)).
/// @param key_pool one layer's keys, (num_blocks, G, Bt, hs) device memory
/// @param value_pool one layer's values, same layout  @param qkv (R, C + 2·G·hs) device: q,
/// then G keys, then G values per row  @param slots (R, 2) device: block, offset
/// @param R rows  @param C channels  @param G key/value heads  @param hs head size
/// @param Bt positions per block  @param stream the stream
void rows_store_keys_values(float* key_pool, float* value_pool, const float* qkv, const int* slots,
                            int R, int C, int G, int hs, int Bt, stream_t stream);

}  // namespace attn::cuda
