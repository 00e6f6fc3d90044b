// What the cached decoders share (kv_cache.cpp's contiguous cache, paged_cache.cpp's blocks):
// one head's query over runs of cached rows, and the forward pass of R new tokens that reads
// and writes its keys and values through a caller's function. Internal to the library.
#pragma once

#include "attn/gpt.hpp"
#include "attn/kv_cache.hpp"

#include <cstddef>
#include <functional>

namespace attn::detail {

// A run of consecutive cached rows of one key/value head: `rows` keys and values of hs floats.
struct RowRun {
    const float* keys;
    const float* values;
    int rows;
};

// One head's query over the rows of `runs`, oldest first (T rows in all; the query is the
// last position): a (T) receives the softmax weights of q_h·k/√hs (plus ALiBi's
// slope·distance when slope ≠ 0), out_h (hs) their blend of the values. The scores, the row
// sum and the blend are added in the same order however the rows are split into runs, so a
// paged cache and a contiguous one give the same bits.
void attend_one_query(float* out_h, float* a, const float* q_h, const RowRun* runs, int n_runs,
                      std::size_t hs, float scale, float slope);

// Per layer, after the R rows' qkv (R, C + 2·G·hs) are computed (RoPE applied at each row's
// position): store the rows' keys and values, then write each row's attention output into
// atty (R, C) and its weights (NH, T) anywhere in scratch.att.
using AttendLayer = std::function<void(int layer, const float* qkv, float* atty)>;

// The forward pass, in evaluation mode, of R tokens at the given absolute positions, each
// row on its own: embeddings, per layer LayerNorm, c_attn, `attend`, c_proj, residual and
// MLP, then the final LayerNorm and the LM head. The products run over the R rows at once.
// Returns scratch.logits, (R, V). The caller has checked tokens and positions.
const std::vector<float>& decode_rows(DecodeScratch& s, const GPT& model, int R,
                                      const int* tokens, const int* positions,
                                      const AttendLayer& attend);

}  // namespace attn::detail
