// Lesson 20's batched step on the GPU: forward_paged's rows through the device's layers, the
// keys and values in a device pool that mirrors the CPU cache's block tables. Plain C++: the
// kernels are behind the host functions of gpt_ops.hpp and paged_attention.hpp.
#include "attn/cuda/paged_engine.hpp"

#include "attn/cuda/buffer.hpp"
#include "attn/cuda/device.hpp"
#include "attn/cuda/gpt_ops.hpp"
#include "attn/cuda/paged_attention.hpp"
#include "attn/gpt_layers.hpp"
#include "check.cuh"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace attn::cuda {

namespace {
using std::size_t;

// n ints of device memory, freed by the destructor.
class DeviceInts {
public:
    DeviceInts() = default;
    DeviceInts(const DeviceInts&) = delete;
    DeviceInts& operator=(const DeviceInts&) = delete;
    ~DeviceInts() { cudaFree(data_); }
    // Makes room for at least n ints (the contents are not kept) and copies `host` there.
    void upload(const std::vector<int>& host) {
        if (host.size() > size_) {
            cudaFree(data_);
            data_ = nullptr;
            CUDA_CHECK(cudaMalloc(&data_, host.size() * sizeof(int)));
            size_ = host.size();
        }
        CUDA_CHECK(cudaMemcpy(data_, host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice));
    }
    int* data() { return data_; }

private:
    int* data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace

struct PagedEngine::Impl {
    DeviceBuffer params;       // the model's parameters, laid out as GPT::parameters()
    ParameterTensors p;        // pointers into params, as GPT::params() into the host's
    DeviceBuffer key_pool;     // (L, num_blocks, G, Bt, hs)
    DeviceBuffer value_pool;   // (L, num_blocks, G, Bt, hs)
    DeviceBuffer cos_sin{1};   // RoPE: (block_size, hs/2, 2)
    DeviceBuffer slopes{1};    // ALiBi: (NH)
    Blas blas{false};          // plain fp32 products
    // The step's buffers, for up to `rows` rows
    int rows = 0;
    DeviceBuffer x{1}, ln{1}, qkv{1}, atty{1}, proj{1}, residual{1}, fch{1}, fch_gelu{1};
    DeviceBuffer logits{1}, mean{1}, rstd{1};
    DeviceInts ints;           // tokens (R), positions (R), slots (R, 2)
    DevicePagedBatch batch;    // the rows' tables and position ranges
    std::vector<float> host_logits;

    Impl(const GPT& model, const PagedKVCache& cache)
        : params(model.parameters()),
          key_pool(static_cast<size_t>(cache.n_layer()) * cache.num_blocks() * cache.n_kv_head() *
                   cache.block_tokens() * cache.head_size()),
          value_pool(key_pool.size()) {}

    void reserve(int R, const GPTConfig& c) {
        if (R <= rows) return;
        const size_t uR = static_cast<size_t>(R), C = static_cast<size_t>(c.n_embd);
        x = DeviceBuffer(uR * C);
        ln = DeviceBuffer(uR * C);
        qkv = DeviceBuffer(uR * static_cast<size_t>(c.qkv_channels()));
        atty = DeviceBuffer(uR * C);
        proj = DeviceBuffer(uR * C);
        residual = DeviceBuffer(uR * C);
        fch = DeviceBuffer(uR * 4 * C);
        fch_gelu = DeviceBuffer(uR * 4 * C);
        logits = DeviceBuffer(uR * static_cast<size_t>(c.vocab_size));
        mean = DeviceBuffer(uR);
        rstd = DeviceBuffer(uR);
        rows = R;
    }
};

namespace {
// The refusals forward_paged makes of a model, at construction rather than at the first step.
void check_model(const GPT& model, const PagedKVCache& cache) {
    const GPTConfig& c = model.config();
    if (!c.causal || !c.scaled_attention)
        throw std::invalid_argument("PagedEngine: the model must be causal with scaled attention, "
                                    "as for forward_paged");
    if (model.has_weight_source() || model.parameters().empty())
        throw std::invalid_argument("PagedEngine: the model's parameters must be in its own memory "
                                    "(a model with a weight source has none to upload)");
    if (c.position == Position::rope && (c.n_embd / c.n_head) % 2 != 0)
        throw std::invalid_argument("PagedEngine: RoPE needs an even head size, got " +
                                    std::to_string(c.n_embd / c.n_head));
    if (cache.n_layer() != c.n_layer || cache.n_head() != c.n_head ||
        cache.n_kv_head() != c.kv_heads() || cache.head_size() != c.n_embd / c.n_head)
        throw std::invalid_argument("PagedEngine: the cache is (L, NH, G, hs) = (" +
                                    std::to_string(cache.n_layer()) + ", " + std::to_string(cache.n_head()) +
                                    ", " + std::to_string(cache.n_kv_head()) + ", " +
                                    std::to_string(cache.head_size()) + "), the model (" +
                                    std::to_string(c.n_layer) + ", " + std::to_string(c.n_head) + ", " +
                                    std::to_string(c.kv_heads()) + ", " +
                                    std::to_string(c.n_embd / c.n_head) + ")");
    if (cache.sequences() != 0)
        throw std::invalid_argument("PagedEngine: the cache must be empty (its rows are on the host, "
                                    "not in the device's pool)");
}

// The device's counterpart of a host pointer into `base` (null stays null).
float* on_device(const float* host, const float* base, float* device) {
    return host ? device + (host - base) : nullptr;
}
}  // namespace

PagedEngine::PagedEngine(const GPT& model, PagedKVCache& cache) : model_(model), cache_(cache) {
    check_model(model, cache);
    std::string why;
    if (!device_available(&why)) throw std::runtime_error("PagedEngine: no usable CUDA device (" + why + ")");
    impl_ = std::make_unique<Impl>(model, cache);
    Impl& d = *impl_;
    const GPTConfig& c = model.config();
    const ParameterTensors& h = model.params();
    const float* base = model.parameters().data();
    float* dev = d.params.data();
    d.p = {on_device(h.wte, base, dev),      on_device(h.wpe, base, dev),
           on_device(h.ln1w, base, dev),     on_device(h.ln1b, base, dev),
           on_device(h.qkvw, base, dev),     on_device(h.qkvb, base, dev),
           on_device(h.attprojw, base, dev), on_device(h.attprojb, base, dev),
           on_device(h.ln2w, base, dev),     on_device(h.ln2b, base, dev),
           on_device(h.fcw, base, dev),      on_device(h.fcb, base, dev),
           on_device(h.fcprojw, base, dev),  on_device(h.fcprojb, base, dev),
           on_device(h.lnfw, base, dev),     on_device(h.lnfb, base, dev)};
    d.key_pool.zero();
    d.value_pool.zero();
    if (c.position == Position::rope) {
        // the angles as rope_forward computes them: in double, cos and sin rounded to float
        const int hs = c.n_embd / c.n_head, pairs = hs / 2;
        std::vector<float> table(static_cast<size_t>(c.block_size) * pairs * 2);
        for (int pos = 0; pos < c.block_size; ++pos) {
            for (int i = 0; i < pairs; ++i) {
                const double angle = rope_angle(pos, i, hs);
                table[(static_cast<size_t>(pos) * pairs + i) * 2] = static_cast<float>(std::cos(angle));
                table[(static_cast<size_t>(pos) * pairs + i) * 2 + 1] = static_cast<float>(std::sin(angle));
            }
        }
        d.cos_sin = DeviceBuffer(table);
    }
    if (c.position == Position::alibi) d.slopes = DeviceBuffer(alibi_slopes(c.n_head));
    d.blas.set_stream(nullptr);
    // a block the cache copies on write is copied here too, before the step that wrote it
    // into the copy runs; the copy runs on the default stream, in order with the step's work
    cache_.set_block_copy_hook([this](int from, int to) {
        const PagedKVCache& k = cache_;
        const size_t block = static_cast<size_t>(k.n_kv_head()) * k.block_tokens() * k.head_size();
        for (int l = 0; l < k.n_layer(); ++l) {
            const size_t layer = static_cast<size_t>(l) * k.num_blocks() * block;
            for (DeviceBuffer* pool : {&impl_->key_pool, &impl_->value_pool}) {
                CUDA_CHECK(cudaMemcpy(pool->data() + layer + static_cast<size_t>(to) * block,
                                      pool->data() + layer + static_cast<size_t>(from) * block,
                                      block * sizeof(float), cudaMemcpyDeviceToDevice));
            }
        }
    });
}

PagedEngine::~PagedEngine() { cache_.set_block_copy_hook({}); }

std::string PagedEngine::device() const {
#if ATTN_CUDA_SIMULATED
    return "gpu, simulated: this build has no GPU, so the CUDA simulator runs the device code on "
           "the CPU (it checks the code; its times are not a GPU's)";
#else
    return "gpu: " + device_summary();
#endif
}

const std::vector<float>& PagedEngine::forward(PagedKVCache& cache, const std::vector<PagedRow>& rows) {
    if (&cache != &cache_)
        throw std::invalid_argument("PagedEngine: this cache is not the one whose blocks the device's "
                                    "pool mirrors");
    const GPTConfig& cfg = model_.config();
    check_paged_rows(cfg, cache, rows, "PagedEngine");
    const int R = static_cast<int>(rows.size()), C = cfg.n_embd, NH = cfg.n_head;
    const int G = cfg.kv_heads(), hs = C / NH, QKV = cfg.qkv_channels(), V = cfg.vocab_size;
    const int L = cfg.n_layer, Bt = cache.block_tokens(), blocks = cache.num_blocks();
    // the slots (a block the cache copies on write is copied on the device at once)
    std::vector<int> ints(static_cast<size_t>(4) * R);  // tokens, positions, slots (R, 2)
    for (int r = 0; r < R; ++r) {
        const PagedRow& row = rows[static_cast<size_t>(r)];
        const BlockSlot slot = cache.append_slot(row.seq);
        ints[static_cast<size_t>(r)] = row.token;
        ints[static_cast<size_t>(R + r)] = row.pos;
        ints[static_cast<size_t>(2 * R + 2 * r)] = slot.block;
        ints[static_cast<size_t>(2 * R + 2 * r + 1)] = slot.offset;
    }
    // each row a query over its sequence's table, positions first … pos
    PagedBatch batch;
    for (const PagedRow& row : rows)
        batch.max_blocks = std::max(batch.max_blocks, static_cast<int>(cache.block_table(row.seq).size()));
    batch.tables.assign(static_cast<size_t>(R) * batch.max_blocks, 0);
    for (int r = 0; r < R; ++r) {
        const PagedRow& row = rows[static_cast<size_t>(r)];
        const std::vector<int>& table = cache.block_table(row.seq);
        std::copy(table.begin(), table.end(), batch.tables.begin() + static_cast<long>(r) * batch.max_blocks);
        batch.first.push_back(cfg.window > 0 ? std::max(0, row.pos + 1 - cfg.window) : 0);
        batch.pos.push_back(row.pos);
    }

    Impl& d = *impl_;
    d.reserve(R, cfg);
    d.batch.upload(batch, blocks, Bt);  // checked and copied once for every layer
    d.ints.upload(ints);
    const int* tokens = d.ints.data();
    const int* positions = tokens + R;
    const int* slots = tokens + 2 * R;
    const ParameterTensors& p = d.p;
    const size_t uC = static_cast<size_t>(C), uQKV = static_cast<size_t>(QKV);
    const size_t pool_layer = static_cast<size_t>(blocks) * G * Bt * hs;
    auto layer_ptr = [](const float* w, size_t per_layer, int l) {
        return w ? w + per_layer * static_cast<size_t>(l) : nullptr;  // a missing bias stays null
    };
    const stream_t s = nullptr;

    // x[r] = wte[token r] + wpe[position r] (learned positions; RoPE and ALiBi add none)
    rows_encoder_forward(d.x.data(), tokens, positions, p.wte, p.wpe, R, C, s);
    for (int l = 0; l < L; ++l) {
        // x = x + c_proj(attention(c_attn(ln_1(x)))), with the rows' k, v stored first
        layernorm_forward(d.ln.data(), d.mean.data(), d.rstd.data(), d.x.data(), p.ln1w + l * uC,
                          layer_ptr(p.ln1b, uC, l), 1, R, C, s);
        matmul_forward(d.qkv.data(), d.ln.data(), p.qkvw + l * uQKV * uC, layer_ptr(p.qkvb, uQKV, l),
                       R, C, QKV, d.blas, s);
        if (cfg.position == Position::rope)
            rows_rope_forward(d.qkv.data(), positions, d.cos_sin.data(), R, C, NH, G, s);
        float* keys = d.key_pool.data() + l * pool_layer;
        float* values = d.value_pool.data() + l * pool_layer;
        // every row's key and value first: a chunk's later rows read its earlier ones
        rows_store_keys_values(keys, values, d.qkv.data(), slots, R, C, G, hs, Bt, s);
        paged_attention_forward(d.atty.data(), d.qkv.data(), QKV, keys, values, d.batch, Bt, C, NH, G,
                                cfg.position == Position::alibi ? d.slopes.data() : nullptr, s);
        matmul_forward(d.proj.data(), d.atty.data(), p.attprojw + l * uC * uC,
                       layer_ptr(p.attprojb, uC, l), R, C, C, d.blas, s);
        residual_forward(d.residual.data(), d.x.data(), d.proj.data(), static_cast<size_t>(R) * uC, s);
        std::swap(d.x, d.residual);

        // x = x + c_proj(gelu(c_fc(ln_2(x))))
        layernorm_forward(d.ln.data(), d.mean.data(), d.rstd.data(), d.x.data(), p.ln2w + l * uC,
                          layer_ptr(p.ln2b, uC, l), 1, R, C, s);
        matmul_forward(d.fch.data(), d.ln.data(), p.fcw + l * 4 * uC * uC, layer_ptr(p.fcb, 4 * uC, l),
                       R, C, 4 * C, d.blas, s);
        gelu_forward(d.fch_gelu.data(), d.fch.data(), static_cast<size_t>(R) * 4 * uC, s);
        matmul_forward(d.proj.data(), d.fch_gelu.data(), p.fcprojw + l * 4 * uC * uC,
                       layer_ptr(p.fcprojb, uC, l), R, 4 * C, C, d.blas, s);
        residual_forward(d.residual.data(), d.x.data(), d.proj.data(), static_cast<size_t>(R) * uC, s);
        std::swap(d.x, d.residual);
    }
    // logits = ln_f(x) · wteᵀ, for these R positions                          (R, V)
    layernorm_forward(d.ln.data(), d.mean.data(), d.rstd.data(), d.x.data(), p.lnfw, p.lnfb, 1, R, C, s);
    matmul_forward(d.logits.data(), d.ln.data(), p.wte, nullptr, R, C, V, d.blas, s);
    d.host_logits.resize(static_cast<size_t>(R) * V);
    CUDA_CHECK(cudaMemcpy(d.host_logits.data(), d.logits.data(), d.host_logits.size() * sizeof(float),
                          cudaMemcpyDeviceToHost));
    return d.host_logits;
}

std::vector<float> PagedEngine::block_keys(int layer, int block) const {
    const PagedKVCache& k = cache_;
    if (layer < 0 || layer >= k.n_layer() || block < 0 || block >= k.num_blocks())
        throw std::invalid_argument("PagedEngine::block_keys: layer " + std::to_string(layer) + " or block " +
                                    std::to_string(block) + " is outside the pool");
    const size_t n = static_cast<size_t>(k.n_kv_head()) * k.block_tokens() * k.head_size();
    std::vector<float> out(n);
    CUDA_CHECK(cudaMemcpy(out.data(), impl_->key_pool.data() + (static_cast<size_t>(layer) * k.num_blocks() + block) * n,
                          n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
}

std::vector<float> PagedEngine::block_values(int layer, int block) const {
    const PagedKVCache& k = cache_;
    if (layer < 0 || layer >= k.n_layer() || block < 0 || block >= k.num_blocks())
        throw std::invalid_argument("PagedEngine::block_values: layer " + std::to_string(layer) + " or block " +
                                    std::to_string(block) + " is outside the pool");
    const size_t n = static_cast<size_t>(k.n_kv_head()) * k.block_tokens() * k.head_size();
    std::vector<float> out(n);
    CUDA_CHECK(cudaMemcpy(out.data(), impl_->value_pool.data() + (static_cast<size_t>(layer) * k.num_blocks() + block) * n,
                          n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
}

}  // namespace attn::cuda
