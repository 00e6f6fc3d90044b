// Generation with a key/value cache: the cache, one cached step, prefill, and the sampling
// loop that gives the same text as generate_text. Shapes use the axis letters of
// gpt_layers.hpp.
#include "attn/kv_cache.hpp"

#include "decode_rows.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/fast_math.hpp"
#include "attn/tensor.hpp"
#include "lanes.hpp"
#include "simd_clones.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace attn {

namespace {

using std::size_t;

// The cache must have been made for this model: same layers, heads and head size.
void require_fits(const KVCache& cache, const GPTConfig& config, const char* who) {
    require(config.causal, std::string(who) +
                               ": the model is not causal, so an earlier position's key and value "
                               "would change with every new token and cannot be cached");
    require(config.scaled_attention,
            std::string(who) + ": the cached path always divides the scores by √hs; this model "
                               "does not (generate_text, which runs the whole forward pass, samples from it)");
    require(cache.n_layer() == config.n_layer && cache.n_head() == config.n_head &&
                cache.n_kv_head() == config.kv_heads() &&
                cache.head_size() * cache.n_head() == config.n_embd,
            std::string(who) + ": the cache is (L, NH, G, hs) = (" +
                std::to_string(cache.n_layer()) + ", " + std::to_string(cache.n_head()) + ", " +
                std::to_string(cache.n_kv_head()) + ", " + std::to_string(cache.head_size()) +
                "), the model (" + std::to_string(config.n_layer) + ", " +
                std::to_string(config.n_head) + ", " + std::to_string(config.kv_heads()) + ", " +
                std::to_string(config.n_embd / config.n_head) + ")");
    require(!cache.ring() || (config.window > 0 && cache.capacity() >= config.window),
            std::string(who) + ": a ring-buffer cache of " + std::to_string(cache.capacity()) +
                " positions forgets keys that this model's attention (window " +
                std::to_string(config.window) + ", 0: all) still reads");
}

// The positions that a query at `pos` attends over: the last min(pos + 1, W) of them.
int attended(const GPTConfig& config, int pos) {
    return config.window > 0 ? std::min(pos + 1, config.window) : pos + 1;
}

const float* layer_ptr(const float* p, size_t per_layer, int l) {
    return p ? p + per_layer * static_cast<size_t>(l) : nullptr;  // a missing bias stays null
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The cache

KVCache::KVCache(int n_layer, int n_head, int n_embd, int capacity, int n_kv_head, bool ring)
    : L_(n_layer), NH_(n_head), G_(n_kv_head > 0 ? n_kv_head : n_head),
      hs_(n_head > 0 ? n_embd / n_head : 0), capacity_(capacity), ring_(ring) {
    require(n_layer > 0 && n_head > 0 && n_embd > 0 && capacity > 0 && n_kv_head >= 0,
            "KVCache: every size must be positive, got L = " + std::to_string(n_layer) +
                ", NH = " + std::to_string(n_head) + ", C = " + std::to_string(n_embd) +
                ", capacity = " + std::to_string(capacity) + ", G = " + std::to_string(n_kv_head));
    require(n_embd % n_head == 0, "KVCache: NH = " + std::to_string(n_head) +
                                      " does not divide C = " + std::to_string(n_embd));
    require(n_head % G_ == 0, "KVCache: the key/value heads G = " + std::to_string(G_) +
                                  " do not divide NH = " + std::to_string(n_head));
    const size_t n = static_cast<size_t>(L_) * G_ * capacity_ * hs_;
    keys_.assign(n, 0.0f);
    values_.assign(n, 0.0f);
    counts_.assign(static_cast<size_t>(L_), 0);
}

namespace {
// A window shorter than the block needs only its W most recent positions: a ring of W.
int cache_capacity(const GPTConfig& c) {
    return c.window > 0 ? std::min(c.window, c.block_size) : c.block_size;
}
}  // namespace

KVCache::KVCache(const GPTConfig& config)
    : KVCache(config.n_layer, config.n_head, config.n_embd, cache_capacity(config),
              config.kv_heads(), config.window > 0 && config.window < config.block_size) {}

size_t KVCache::layer_offset(int layer) const {
    require(layer >= 0 && layer < L_, "KVCache: layer " + std::to_string(layer) +
                                          " is outside [0, " + std::to_string(L_) + ")");
    return static_cast<size_t>(layer) * G_ * capacity_ * hs_;
}

void KVCache::append(int layer, const float* key, const float* value) {
    const size_t base = layer_offset(layer);
    const int pos = counts_[static_cast<size_t>(layer)];
    require(ring_ || pos < capacity_, "KVCache::append: layer " + std::to_string(layer) +
                                          " already holds its capacity of " +
                                          std::to_string(capacity_) + " positions");
    // a ring overwrites its oldest row: position pos lives in row pos mod capacity
    const int slot = pos % capacity_;
    // key (G·hs) = G rows of hs side by side; head g's row goes to (g, slot, :)
    for (int g = 0; g < G_; ++g) {
        const size_t row = base + (static_cast<size_t>(g) * capacity_ + slot) * hs_;
        std::copy(key + g * hs_, key + (g + 1) * hs_, keys_.begin() + static_cast<long>(row));
        std::copy(value + g * hs_, value + (g + 1) * hs_, values_.begin() + static_cast<long>(row));
    }
    ++counts_[static_cast<size_t>(layer)];
}

void KVCache::clear() { std::fill(counts_.begin(), counts_.end(), 0); }

int KVCache::size() const {
    return std::min(*std::min_element(counts_.begin(), counts_.end()), capacity_);
}

int KVCache::size(int layer) const {
    (void)layer_offset(layer);  // validates the layer
    return std::min(counts_[static_cast<size_t>(layer)], capacity_);
}

int KVCache::positions() const { return *std::min_element(counts_.begin(), counts_.end()); }

std::size_t KVCache::bytes_per_position() const {
    return 2 * static_cast<size_t>(L_) * G_ * hs_ * sizeof(float);
}

const float* KVCache::keys(int layer) const { return keys_.data() + layer_offset(layer); }
const float* KVCache::values(int layer) const { return values_.data() + layer_offset(layer); }

// ---------------------------------------------------------------------------------------
// One row of attention

namespace detail {

// a[t] = lane_dot(q_h, key t, hs) · scale for the T keys of the runs; returns T. HS is hs
// when known at compile time, 0 otherwise: the same sums in the same order either way.
template <size_t HS>
[[gnu::always_inline]] inline size_t lane_scores(float* a, const float* q_h, const RowRun* runs,
                                                 int n_runs, size_t hs_runtime, float scale) {
    const size_t hs = HS > 0 ? HS : hs_runtime;
    constexpr int chunk = 64;
    float part[chunk][8];
    size_t T = 0;
    for (int r = 0; r < n_runs; ++r) {
        const float* k_run = runs[r].keys;
        for (int j0 = 0; j0 < runs[r].rows; j0 += chunk) {
            const int n = std::min(chunk, runs[r].rows - j0);
            for (int jj = 0; jj < n; ++jj) {
                const float* k = k_run + static_cast<size_t>(j0 + jj) * hs;
                float p[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
                size_t i = 0;
                for (; i + 8 <= hs; i += 8)
                    for (size_t u = 0; u < 8; ++u) p[u] += q_h[i + u] * k[i + u];
                if (HS == 0 || HS % 8 != 0)  // lane_dot's tail: the last hs mod 8 terms, one per lane
                    for (size_t u = 0; i < hs && u < 8; ++i, ++u) p[u] += q_h[i] * k[i];
                for (size_t u = 0; u < 8; ++u) part[jj][u] = p[u];
            }
            for (int jj = 0; jj < n; ++jj) a[T + static_cast<size_t>(jj)] = lane_total(part[jj]) * scale;
            T += static_cast<size_t>(n);
        }
    }
    return T;
}

// out_h (hs) = Σ_j a[j] · value j over the runs' rows, added in the order of j. Four value
// rows per pass over out_h: (((out + w0·v0) + w1·v1) + w2·v2) + w3·v3 is the sum of four
// passes, in their order, with a quarter of out_h's loads and stores. HS as lane_scores.
template <size_t HS>
[[gnu::always_inline]] inline void lane_blend(float* out_h, const float* a, const RowRun* runs,
                                              int n_runs, size_t hs_runtime) {
    const size_t hs = HS > 0 ? HS : hs_runtime;
    std::fill(out_h, out_h + hs, 0.0f);
    size_t j = 0;
    for (int r = 0; r < n_runs; ++r) {
        const float* v_row = runs[r].values;
        const int rows = runs[r].rows;
        int i_row = 0;
        for (; i_row + 4 <= rows; i_row += 4, j += 4) {
            const float w0 = a[j], w1 = a[j + 1], w2 = a[j + 2], w3 = a[j + 3];
            const float* v0 = v_row + static_cast<size_t>(i_row) * hs;
            const float* v1 = v0 + hs;
            const float* v2 = v1 + hs;
            const float* v3 = v2 + hs;
            for (size_t i = 0; i < hs; ++i)
                out_h[i] = (((out_h[i] + w0 * v0[i]) + w1 * v1[i]) + w2 * v2[i]) + w3 * v3[i];
        }
        for (; i_row < rows; ++i_row, ++j) {
            const float w = a[j];
            const float* v_j = v_row + static_cast<size_t>(i_row) * hs;
            for (size_t i = 0; i < hs; ++i) out_h[i] += w * v_j[i];
        }
    }
}

// One head's query over its cached rows, in the fast CPU attention's way (flash_cpu.cpp):
// dot products and the row sum in eight lanes, e^x by exp_approx, so that the compiler
// vectorises every loop (AVX2 chosen at load time). The T positions are the rows of the
// runs, oldest first; a (T) gets the weights, out_h (hs) the blend.
ATTN_SIMD_CLONES
void attend_one_query(float* out_h, float* a, const float* q_h, const RowRun* runs, int n_runs,
                      size_t hs, float scale, float slope) {
    // scores (T) = K_h (T, hs) · q_h / √hs, the scale applied after the sum as
    // attention_forward's sgemm does. Plain loops, not BLAS: one query row is a
    // matrix-vector product, T·hs multiply-adds, too small to pay for a BLAS call.
    //
    // Each score is lane_dot's sum, in lane_dot's order, taken apart in two passes over up to
    // 64 keys: first every key's eight lane sums (vector multiply-adds), then the eight of
    // every key added pairwise (lane_total). One key at a time, that last step is a row of
    // shuffles per key; and a head size known to the compiler (16, 32 or 64 here) leaves
    // straight-line code where a run-time one leaves a loop for every key.
    size_t T = 0;
    switch (hs) {
        case 16: T = lane_scores<16>(a, q_h, runs, n_runs, hs, scale); break;
        case 32: T = lane_scores<32>(a, q_h, runs, n_runs, hs, scale); break;
        case 64: T = lane_scores<64>(a, q_h, runs, n_runs, hs, scale); break;
        default: T = lane_scores<0>(a, q_h, runs, n_runs, hs, scale); break;
    }
    // ALiBi: the query is the last of the T positions, position j is T − 1 − j before it
    if (slope != 0.0f) {
        for (size_t j = 0; j < T; ++j) a[j] += slope * static_cast<float>(static_cast<long>(j) - static_cast<long>(T - 1));
    }
    // max-subtracted softmax over all T positions: they are all in the past
    float maxval = a[0];
#pragma omp simd reduction(max : maxval)
    for (size_t j = 1; j < T; ++j) maxval = a[j] > maxval ? a[j] : maxval;
    for (size_t j = 0; j < T; ++j) a[j] = exp_approx(a[j] - maxval);
    const float inv = 1.0f / lane_sum(a, T);
    for (size_t j = 0; j < T; ++j) a[j] *= inv;
    switch (hs) {
        case 16: lane_blend<16>(out_h, a, runs, n_runs, hs); break;
        case 32: lane_blend<32>(out_h, a, runs, n_runs, hs); break;
        case 64: lane_blend<64>(out_h, a, runs, n_runs, hs); break;
        default: lane_blend<0>(out_h, a, runs, n_runs, hs); break;
    }
}

}  // namespace detail

void attention_step_forward(float* out, float* att, const float* q, const float* key_cache,
                            const float* value_cache, int T, int capacity, int C, int NH,
                            int NKV, int first, const float* alibi_slopes) {
    const int G = NKV > 0 ? NKV : NH;
    require(NH % G == 0 && T >= 1 && T <= capacity && first >= 0 && first < capacity,
            "attention_step_forward: need G | NH, 1 ≤ T ≤ capacity and 0 ≤ first < capacity, "
            "got G = " + std::to_string(G) + ", NH = " + std::to_string(NH) + ", T = " +
                std::to_string(T) + ", first = " + std::to_string(first) + ", capacity = " +
                std::to_string(capacity));
    const int hs = C / NH;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
    // Position j of the T, oldest first, is row (first + j) mod capacity: a ring buffer.
    // Those rows are at most two runs of consecutive ones, [first, capacity) and [0, …).
    const int n1 = std::min(T, capacity - first);
    for (int h = 0; h < NH; ++h) {
        const int kvh = kv_head_of(h, NH, G);  // the key/value head of h's group
        const size_t head = static_cast<size_t>(kvh) * capacity * hs;
        const float* k_h = key_cache + head;
        const float* v_h = value_cache + head;
        const size_t f = static_cast<size_t>(first) * hs;
        const detail::RowRun runs[2] = {{k_h + f, v_h + f, n1}, {k_h, v_h, T - n1}};
        detail::attend_one_query(out + h * hs, att + static_cast<size_t>(h) * T, q + h * hs, runs,
                                 2, static_cast<size_t>(hs), scale,
                                 alibi_slopes ? alibi_slopes[h] : 0.0f);
    }
}

// ---------------------------------------------------------------------------------------
// One cached step of the model

namespace detail {

const std::vector<float>& decode_rows(DecodeScratch& s, const GPT& model, int R,
                                      const int* tokens, const int* positions,
                                      const AttendLayer& attend) {
    const GPTConfig& cfg = model.config();
    const int V = cfg.vocab_size, C = cfg.n_embd, L = cfg.n_layer, NH = cfg.n_head;
    const int G = cfg.kv_heads(), QKV = cfg.qkv_channels();
    const size_t uC = static_cast<size_t>(C), uR = static_cast<size_t>(R);
    s.x.resize(uR * uC);
    s.ln.resize(uR * uC);
    s.qkv.resize(uR * static_cast<size_t>(QKV));
    s.atty.resize(uR * uC);
    s.proj.resize(uR * uC);
    s.fch.resize(uR * 4 * uC);
    s.fch_gelu.resize(uR * 4 * uC);
    s.logits.resize(uR * static_cast<size_t>(V));
    s.residual.resize(uR * uC);
    s.mean.resize(uR);  // LayerNorm's saved statistics, unused here
    s.rstd.resize(uR);
    const ParameterTensors& p = model.params();

    // x[r] = wte[token r] + wpe[position r] (learned positions; RoPE and ALiBi add none)
    for (int r = 0; r < R; ++r) {
        encoder_forward(s.x.data() + r * uC, tokens + r, p.wte,
                        p.wpe ? p.wpe + static_cast<size_t>(positions[r]) * C : nullptr, 1, 1, C);
    }
    for (int l = 0; l < L; ++l) {
        // x = x + c_proj(attention(c_attn(ln_1(x)))), with the rows' k, v stored first
        layernorm_forward(s.ln.data(), s.mean.data(), s.rstd.data(), s.x.data(), p.ln1w + l * uC,
                          layer_ptr(p.ln1b, uC, l), 1, R, C);
        // qkv (R, C + 2·G·hs) = q (C), G keys, G values per row
        matmul_forward(s.qkv.data(), s.ln.data(), p.qkvw + static_cast<size_t>(l) * QKV * C,
                       layer_ptr(p.qkvb, static_cast<size_t>(QKV), l), R, C, QKV);
        // RoPE: q and k rotated by each row's absolute position, as the whole forward pass
        // rotates row pos; the cache keeps the rotated key, never rotated again
        if (cfg.position == Position::rope) {
            for (int r = 0; r < R; ++r)
                rope_forward(s.qkv.data() + r * static_cast<size_t>(QKV), 1, 1, C, NH, positions[r], G);
        }
        attend(l, s.qkv.data(), s.atty.data());
        matmul_forward(s.proj.data(), s.atty.data(), p.attprojw + l * uC * C,
                       layer_ptr(p.attprojb, uC, l), R, C, C);
        residual_forward(s.residual.data(), s.x.data(), s.proj.data(), R * C);
        s.x.swap(s.residual);

        // x = x + c_proj(gelu(c_fc(ln_2(x))))
        layernorm_forward(s.ln.data(), s.mean.data(), s.rstd.data(), s.x.data(), p.ln2w + l * uC,
                          layer_ptr(p.ln2b, uC, l), 1, R, C);
        matmul_forward(s.fch.data(), s.ln.data(), p.fcw + l * 4 * uC * C,
                       layer_ptr(p.fcb, 4 * uC, l), R, C, 4 * C);
        gelu_forward(s.fch_gelu.data(), s.fch.data(), R * 4 * C);
        matmul_forward(s.proj.data(), s.fch_gelu.data(), p.fcprojw + l * 4 * uC * C,
                       layer_ptr(p.fcprojb, uC, l), R, 4 * C, C);
        residual_forward(s.residual.data(), s.x.data(), s.proj.data(), R * C);
        s.x.swap(s.residual);
    }
    // logits = ln_f(x) · wteᵀ, for these R positions                          (R, V)
    layernorm_forward(s.ln.data(), s.mean.data(), s.rstd.data(), s.x.data(), p.lnfw, p.lnfb, 1, R, C);
    matmul_forward(s.logits.data(), s.ln.data(), p.wte, nullptr, R, C, V);
    return s.logits;
}

}  // namespace detail

const std::vector<float>& forward_cached(DecodeScratch& s, const GPT& model, KVCache& cache,
                                         int token, int pos) {
    const GPTConfig& cfg = model.config();
    const int V = cfg.vocab_size, C = cfg.n_embd, NH = cfg.n_head;
    require_fits(cache, cfg, "forward_cached");
    require(token >= 0 && token < V, "forward_cached: token id " + std::to_string(token) +
                                         " is outside [0, " + std::to_string(V) + ")");
    const int limit = cache.ring() ? cfg.block_size : std::min(cfg.block_size, cache.capacity());
    require(pos >= 0 && pos < limit,
            "forward_cached: position " + std::to_string(pos) + " is outside [0, " +
                std::to_string(limit) + ") (the block size and the cache's capacity)");
    require(pos == cache.positions(), "forward_cached: position " + std::to_string(pos) +
                                          " must be the next free one, " +
                                          std::to_string(cache.positions()));
    const int G = cfg.kv_heads(), hs = C / NH;
    s.att.resize(static_cast<size_t>(NH) * cache.capacity());
    const int T = attended(cfg, pos);  // positions attended over, this one included
    const int first = (pos + 1 - T) % cache.capacity();  // the row of the oldest of them
    if (cfg.position == Position::alibi && s.slopes.size() != static_cast<size_t>(NH)) {
        s.slopes = alibi_slopes(NH);
    }
    const float* slopes = cfg.position == Position::alibi ? s.slopes.data() : nullptr;
    // Per layer: this token's key and value appended, then its query over the cached rows.
    return detail::decode_rows(s, model, 1, &token, &pos, [&](int l, const float* qkv, float* atty) {
        cache.append(l, qkv + C, qkv + C + G * hs);
        attention_step_forward(atty, s.att.data(), qkv, cache.keys(l), cache.values(l), T,
                               cache.capacity(), C, NH, G, first, slopes);
    });
}

void prefill(std::vector<float>& logits, GPT& model, KVCache& cache, const int* tokens, int T) {
    const GPTConfig& cfg = model.config();
    const int V = cfg.vocab_size, C = cfg.n_embd, L = cfg.n_layer;
    const int G = cfg.kv_heads(), hs = C / cfg.n_head;
    const size_t QKV = static_cast<size_t>(cfg.qkv_channels());
    require_fits(cache, cfg, "prefill");
    const int limit = cache.ring() ? cfg.block_size : std::min(cfg.block_size, cache.capacity());
    require(T >= 1 && T <= limit, "prefill: the context length " + std::to_string(T) +
                                      " is outside [1, " + std::to_string(limit) + "]");
    model.train(false);
    model.forward(tokens, nullptr, 1, T);  // checks the token ids
    // The forward pass saved every layer's qkv (L, 1, T, C + 2·G·hs), with RoPE already
    // rotated by positions 0..T−1: copy out k and v (a ring keeps the last `capacity`).
    const float* qkv = model.activations().qkv.data();
    cache.clear();
    for (int l = 0; l < L; ++l) {
        for (int t = 0; t < T; ++t) {
            const float* row = qkv + (static_cast<size_t>(l) * T + t) * QKV;
            cache.append(l, row + C, row + C + G * hs);
        }
    }
    const float* last = model.logits().data() + static_cast<size_t>(T - 1) * V;
    logits.assign(last, last + V);
}

// ---------------------------------------------------------------------------------------
// Sampling with the cache

std::string generate_cached(GPT& model, const CharVocab& vocab, const std::string& prompt,
                            const SampleOptions& options) {
    const GPTConfig& cfg = model.config();
    const int V = cfg.vocab_size, block = cfg.block_size;
    // The same checks, in the same order, as generate_text, then this path's own.
    std::vector<int> ids = start_tokens(vocab, V, prompt, options);
    require(cfg.causal, "generate_cached: the model is not causal, so its keys and values "
                        "cannot be cached (use generate_text)");
    Rng rng(options.seed);
    std::string text = prompt;
    model.train(false);
    KVCache cache(cfg);
    DecodeScratch scratch;
    std::vector<float> last(static_cast<size_t>(V));
    for (int n = 0; n < options.max_new_tokens; ++n) {
        const int context = static_cast<int>(ids.size());
        if (n == 0 || context > block) {
            // The prompt, or a context the uncached path crops: every position is new.
            const int T = std::min(context, block);
            prefill(last, model, cache, ids.data() + (context - T), T);
        } else {
            // The cache holds positions 0..context−2: one step for the newest token.
            last = forward_cached(scratch, model, cache, ids.back(), context - 1);
        }
        const int next = sample_token(last, options.temperature, options.top_k, rng);
        ids.push_back(next);
        text += vocab.at(next);
    }
    return text;
}

// ---------------------------------------------------------------------------------------
// Operation counts

double uncached_step_flops(const GPTConfig& config, int T) {
    const double L = config.n_layer, C = config.n_embd, V = config.vocab_size, t = T;
    // per layer: qkv 3C², c_proj C², c_fc 4C², mlp c_proj 4C² multiply-adds per position,
    // and q·kᵀ plus att·v over the full T×T square, C multiply-adds per entry each
    return 2.0 * L * (12.0 * t * C * C + 2.0 * t * t * C) + 2.0 * t * C * V;
}

double cached_step_flops(const GPTConfig& config, int T) {
    const double L = config.n_layer, C = config.n_embd, V = config.vocab_size, t = T;
    return 2.0 * L * (12.0 * C * C + 2.0 * t * C) + 2.0 * C * V;
}

}  // namespace attn
