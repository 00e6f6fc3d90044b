// nanoGPT's GPT on the GPU: device buffers laid out as the CPU model's, and the forward and
// backward passes as the CPU's GPT::forward/backward, line for line, with the ops of
// gpt_ops.hpp. Plain C++: the kernels are behind those host functions.
#include "attn/cuda/gpt.hpp"

#include "attn/cuda/attention.hpp"
#include "attn/cuda/device.hpp"
#include "attn/cuda/gpt_ops.hpp"
#include "attn/dropout_mask.hpp"
#include "check.cuh"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

namespace attn::cuda {

namespace {
using std::size_t;

// One cudaMalloc'd block of floats carved into named buffers.
class DeviceArena {
public:
    DeviceArena() = default;
    DeviceArena(const DeviceArena&) = delete;
    DeviceArena& operator=(const DeviceArena&) = delete;
    ~DeviceArena() { release(); }
    // Allocates `total` floats, uninitialised, and frees the previous block. Every buffer
    // carved from it is written before it is read, or zeroed on the model's stream by its
    // owner (gradients, AdamW's moments, the backward's accumulators): no zeroing on the
    // legacy default stream, which nothing would order with the model's non-blocking one.
    // (The CUDA simulator fills new device memory with NaN, so its tests would show a read
    // before a write.)
    void allocate(size_t total) {
        release();
        if (total == 0) return;
        CUDA_CHECK(cudaMalloc(&base_, total * sizeof(float)));
        size_ = total;
    }
    float* base() const { return base_; }
    size_t size() const { return size_; }

private:
    void release() {
        if (base_) cudaFree(base_);  // in a destructor: nothing to report to
        base_ = nullptr;
        size_ = 0;
    }
    float* base_ = nullptr;
    size_t size_ = 0;
};

// Hands out consecutive slices of an arena; first pass counts, second pass assigns.
// Slices are rounded up to 64 floats (256 bytes), which also keeps the doubles aligned.
class Carver {
public:
    explicit Carver(float* base) : base_(base) {}
    float* take(size_t n) {
        if (n == 0) return nullptr;
        float* p = base_ ? base_ + used_ : nullptr;
        used_ += (n + 63) / 64 * 64;
        return p;
    }
    size_t used() const { return used_; }

private:
    float* base_;
    size_t used_ = 0;
};

// A contiguous range of the flat parameter buffer with one weight-decay setting.
struct DecayRun {
    size_t offset, size;
    bool decay;
};

// The device's activations, the same tensors as attn::Activations without the dropout
// masks (recomputed from their seeds), plus the backward pass's scratch buffers.
struct DeviceActivations {
    // att and att_dropped: the materialised attention's weights; lse: the fused one's
    // log-sum-exps (B, NH, T) per layer. Each kind allocates only its own.
    float *encoded, *ln1, *ln1_mean, *ln1_rstd, *qkv, *atty, *att, *att_dropped, *lse, *attproj,
        *residual2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu, *fcproj, *residual3, *lnf,
        *lnf_mean, *lnf_rstd, *logits, *probs, *losses;
    float *dresidual, *dln, *dqkv, *datty, *dfch, *dfch_gelu, *dlogits, *dinner;
    float* reduce_scratch;  // column reductions (bias and LayerNorm weight gradients)
    AttentionScratch attention;
    // Mixed precision (bf16): the bfloat16 copies of a product's two activations, the
    // input's (N, 4C at most) and the output gradient's (N, max(V, 4C)); nullptr in fp32.
    std::uint16_t *inp16, *dout16;
};

// n bfloat16 values' room, carved in floats (two to a float).
std::uint16_t* take_bf16(Carver& c, size_t n) { return reinterpret_cast<std::uint16_t*>(c.take((n + 1) / 2)); }

void carve(Carver& c, DeviceActivations& a, const GPTConfig& cfg, int B, int T, bool dropout,
           AttentionKind kind, bool bf16) {
    const bool fused = kind == AttentionKind::fused;
    const size_t BT = static_cast<size_t>(B) * T, C = cfg.n_embd, L = cfg.n_layer,
                 V = cfg.vocab_size, NH = cfg.n_head;
    const size_t BTC = BT * C, att = L * B * NH * static_cast<size_t>(T) * T;
    a.encoded = c.take(BTC);
    a.ln1 = c.take(L * BTC);
    a.ln1_mean = c.take(L * BT);
    a.ln1_rstd = c.take(L * BT);
    a.qkv = c.take(L * 3 * BTC);
    a.atty = c.take(L * BTC);
    a.att = fused ? nullptr : c.take(att);
    a.att_dropped = dropout && !fused ? c.take(att) : nullptr;
    a.lse = fused ? c.take(L * BT * NH) : nullptr;
    a.attproj = c.take(L * BTC);
    a.residual2 = c.take(L * BTC);
    a.ln2 = c.take(L * BTC);
    a.ln2_mean = c.take(L * BT);
    a.ln2_rstd = c.take(L * BT);
    a.fch = c.take(L * 4 * BTC);
    a.fch_gelu = c.take(L * 4 * BTC);
    a.fcproj = c.take(L * BTC);
    a.residual3 = c.take(L * BTC);
    a.lnf = c.take(BTC);
    a.lnf_mean = c.take(BT);
    a.lnf_rstd = c.take(BT);
    a.logits = c.take(BT * V);
    a.probs = c.take(BT * V);
    a.losses = c.take(BT);
    a.dresidual = c.take(BTC);
    a.dln = c.take(BTC);
    a.dqkv = c.take(3 * BTC);
    a.datty = c.take(BTC);
    a.dfch = c.take(4 * BTC);
    a.dfch_gelu = c.take(4 * BTC);
    a.dlogits = c.take(BT * V);
    a.dinner = c.take(BTC);
    const int N = static_cast<int>(BT), Ci = cfg.n_embd;
    a.reduce_scratch = c.take(std::max({2 * column_reduce_scratch(N, Ci),
                                        column_reduce_scratch(N, 4 * Ci),
                                        column_reduce_scratch(N, static_cast<int>(V))}));
    const size_t heads = attention_scratch_heads(B, T, Ci);
    a.attention.q = c.take(heads);
    a.attention.k = c.take(heads);
    a.attention.v = c.take(heads);
    a.attention.y = c.take(heads);
    if (fused) {
        a.attention.dy = c.take(heads);
        a.attention.dq = c.take(heads);
        a.attention.dk = c.take(heads);
        a.attention.dv = c.take(heads);
        a.attention.delta = c.take(BT * NH);
    } else {
        a.attention.scores = c.take(static_cast<size_t>(B) * NH * T * T);
    }
    a.inp16 = bf16 ? take_bf16(c, 4 * BTC) : nullptr;
    a.dout16 = bf16 ? take_bf16(c, BT * std::max(V, 4 * C)) : nullptr;
}

void zero_async(float* p, size_t n, cudaStream_t s) {
    if (n) CUDA_CHECK(cudaMemsetAsync(p, 0, n * sizeof(float), s));
}

}  // namespace

// The buffers of one cached generation step (one token), and the key/value cache.
struct DecodeBuffers {
    float *keys, *values;  // (L, NH, block_size, hs) each
    float *x, *residual2, *ln, *mean, *rstd, *qkv, *atty, *proj, *fch, *fch_gelu, *logits;
    int* token;  // (1) on the device
};

void carve(Carver& c, DecodeBuffers& b, const GPTConfig& cfg) {
    const size_t C = cfg.n_embd, cache = static_cast<size_t>(cfg.n_layer) * cfg.block_size * C;
    b.keys = c.take(cache);
    b.values = c.take(cache);
    b.x = c.take(C);
    b.residual2 = c.take(C);
    b.ln = c.take(C);
    b.mean = c.take(1);
    b.rstd = c.take(1);
    b.qkv = c.take(3 * C);
    b.atty = c.take(C);
    b.proj = c.take(C);
    b.fch = c.take(4 * C);
    b.fch_gelu = c.take(4 * C);
    b.logits = c.take(static_cast<size_t>(cfg.vocab_size));
    b.token = reinterpret_cast<int*>(c.take(1));  // a float's room holds an int
}

struct CudaGPT::Impl {
    GPTConfig cfg;
    CudaOptions options;
    cudaStream_t stream = nullptr;
    std::unique_ptr<Blas> blas;
    DeviceArena state;  // parameters, gradients, AdamW m and v, scalars
    DeviceArena acts_memory;
    float *params = nullptr, *grads = nullptr, *m = nullptr, *v = nullptr;
    std::uint16_t* params16 = nullptr;  // bf16: the weights' bfloat16 copy, made each forward pass
    float* mean_loss = nullptr;  // (1)
    float* norm = nullptr;       // (1)
    float* norm_scratch = nullptr;
    ParameterTensors p, g;  // device pointers, same offsets as the CPU model's
    std::vector<DecayRun> runs;
    DeviceActivations a{};
    int* d_tokens = nullptr;   // (2, B, T): inputs then targets
    int* h_tokens = nullptr;   // pinned staging for the upload
    cudaEvent_t uploaded = nullptr;
    DeviceArena decode_memory;  // allocated by the first decode_step or prefill
    DecodeBuffers dec{};

    void ensure_decode_buffers() {
        if (decode_memory.base()) return;
        Carver count(nullptr);
        DecodeBuffers sizes{};
        carve(count, sizes, cfg);
        decode_memory.allocate(count.used());
        Carver assign(decode_memory.base());
        carve(assign, dec, cfg);
    }
    int decoded = 0;  // positions in the key/value cache
    int B = 0, T = 0;          // the last forward call's sizes
    int cap_B = 0, cap_T = 0;  // the sizes the activations were allocated for (T ≤ cap_T)
    bool has_targets = false, dropout_applied = false, dropout_allocated = false;
    std::uint64_t seed = 0, forward_calls = 0;

    ~Impl() {
        // Destructors must not throw: release what was acquired, ignoring errors.
        if (uploaded) cudaEventDestroy(uploaded);
        if (h_tokens) cudaFreeHost(h_tokens);
        if (d_tokens) cudaFree(d_tokens);
        blas.reset();
        if (stream) cudaStreamDestroy(stream);
    }

    // The seed of a dropout site's mask in this pass, the CPU model's (dropout_mask.hpp).
    std::uint64_t site_seed(int layer, int part) const {
        return dropout_site_seed(seed, forward_calls, dropout_site(layer, part));
    }

    void allocate(int newB, int newT, bool dropout) {
        CUDA_CHECK(cudaStreamSynchronize(stream));  // nothing may still use the old buffers
        DeviceActivations sizes{};
        Carver count(nullptr);
        const bool bf16 = options.precision == Precision::bf16;
        carve(count, sizes, cfg, newB, newT, dropout, options.attention, bf16);
        acts_memory.allocate(count.used());
        Carver assign(acts_memory.base());
        carve(assign, a, cfg, newB, newT, dropout, options.attention, bf16);
        if (h_tokens) CUDA_CHECK(cudaFreeHost(h_tokens));
        if (d_tokens) CUDA_CHECK(cudaFree(d_tokens));
        h_tokens = nullptr;
        d_tokens = nullptr;
        const size_t BT = static_cast<size_t>(newB) * newT;
        CUDA_CHECK(cudaMallocHost(&h_tokens, 2 * BT * sizeof(int)));
        CUDA_CHECK(cudaMalloc(&d_tokens, 2 * BT * sizeof(int)));
        cap_B = newB;
        cap_T = newT;
        dropout_allocated = dropout;
    }

    // The bfloat16 copy of the weight tensor at `w` (a pointer into params).
    const std::uint16_t* weight16(const float* w) const { return params16 + (w - params); }

    // out = inp · weightᵀ + bias: in fp32, or (bf16) with inp rounded in place and its copy
    // and the weights' copy multiplied, as the CPU model's products round them.
    void product_forward(float* out, float* inp, const float* weight, const float* bias, int N, int C,
                         int OC) {
        if (options.precision != Precision::bf16) {
            matmul_forward(out, inp, weight, bias, N, C, OC, *blas, stream);
            return;
        }
        round_to_bf16(inp, a.inp16, static_cast<size_t>(N) * C, stream);
        matmul_forward_bf16(out, a.inp16, weight16(weight), bias, N, C, OC, *blas, stream);
    }

    // The backward of product_forward: in bf16 dout is rounded in place (the bias's gradient
    // reads the rounded values, as the CPU's does), and inp, rounded by the forward pass,
    // copied exactly.
    void product_backward(float* dinp, float* dweight, float* dbias, float* dout, const float* inp,
                          const float* weight, int N, int C, int OC) {
        if (options.precision != Precision::bf16) {
            matmul_backward(dinp, dweight, dbias, dout, inp, weight, a.reduce_scratch, N, C, OC, *blas, stream);
            return;
        }
        round_to_bf16(dout, a.dout16, static_cast<size_t>(N) * OC, stream);
        to_bf16(a.inp16, inp, static_cast<size_t>(N) * C, stream);
        matmul_backward_bf16(dinp, dweight, dbias, dout, a.dout16, a.inp16, weight16(weight), a.reduce_scratch,
                             N, C, OC, *blas, stream);
    }
};

std::string unsupported_on_gpu(const GPTConfig& c, const CudaOptions& options) {
    if (c.position != Position::learned) {
        return std::string("the GPU model has learned positions only; this model's are ") +
               position_name(c.position) + ": train it on the CPU";
    }
    if (c.kv_heads() != c.n_head || c.window != 0) {
        return "the GPU model has multi-head attention over the whole context only; this model "
               "has " + std::to_string(c.kv_heads()) + " key/value heads and window " +
               std::to_string(c.window) + ": train it on the CPU";
    }
    if (options.precision == Precision::fp16) {
        return "the GPU model's mixed precision is bf16: fp16 needs loss scaling, which the CPU "
               "model's trainer does: train in bf16 or on the CPU";
    }
    if (options.precision == Precision::bf16 && options.tf32) {
        return "TF32 with bf16 products: the attention's float32 products would round its weights "
               "to TF32 where the CPU model keeps them float32: choose one";
    }
    if (options.attention == AttentionKind::fused) {
        const int hs = c.n_embd / c.n_head;
        if (!flash_attention_supports(static_cast<size_t>(hs))) {
            return "the fused attention kernels need a head size of 64 or 128; this model's is " +
                   std::to_string(hs) + " (n_embd " + std::to_string(c.n_embd) + " / n_head " +
                   std::to_string(c.n_head) + "): use the materialised attention";
        }
        if (!c.scaled_attention) {
            return "the fused attention kernels always divide the scores by √hs, as the CPU's "
                   "fused attention does: use the materialised attention for a model without "
                   "the scale";
        }
    }
    return "";
}

CudaGPT::CudaGPT(const GPT& model, const CudaOptions& options, std::uint64_t seed)
    : impl_(std::make_unique<Impl>()), config_(model.config()),
      num_parameters_(model.parameters().size()) {
    const std::string unsupported = unsupported_on_gpu(config_, options);
    if (!unsupported.empty()) throw std::invalid_argument("CudaGPT: " + unsupported);
    std::string why;
    if (!device_available(&why)) throw std::runtime_error("CudaGPT: no usable CUDA device (" + why + ")");
    Impl& d = *impl_;
    d.cfg = config_;
    d.options = options;
    d.seed = seed;
    CUDA_CHECK(cudaStreamCreateWithFlags(&d.stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&d.uploaded, cudaEventDisableTiming));
    d.blas = std::make_unique<Blas>(options.tf32);
    d.blas->set_stream(d.stream);

    // parameters, gradients, m, v, then the two scalars and the norm's partial sums
    const size_t n = num_parameters_;
    const bool bf16 = options.precision == Precision::bf16;
    Carver count(nullptr);
    for (int i = 0; i < 4; ++i) count.take(n);
    count.take(1);
    count.take(1);
    count.take(clip_scratch_size());
    if (bf16) take_bf16(count, n);
    d.state.allocate(count.used());
    Carver assign(d.state.base());
    d.params = assign.take(n);
    d.grads = assign.take(n);
    d.m = assign.take(n);
    d.v = assign.take(n);
    d.mean_loss = assign.take(1);
    d.norm = assign.take(1);
    d.norm_scratch = assign.take(clip_scratch_size());
    d.params16 = bf16 ? take_bf16(assign, n) : nullptr;
    // The accumulators start at zero, as the CPU model's do.
    zero_async(d.grads, n, d.stream);
    zero_async(d.m, n, d.stream);
    zero_async(d.v, n, d.stream);

    // The same tensors at the same offsets as the CPU model's ParameterTensors.
    const float* host_base = model.parameters().data();
    auto place = [&](float* ParameterTensors::*member) {
        const float* hp = model.params().*member;
        d.p.*member = hp ? d.params + (hp - host_base) : nullptr;
        d.g.*member = hp ? d.grads + (hp - host_base) : nullptr;
    };
    for (auto member : {&ParameterTensors::wte, &ParameterTensors::wpe, &ParameterTensors::ln1w,
                        &ParameterTensors::ln1b, &ParameterTensors::qkvw, &ParameterTensors::qkvb,
                        &ParameterTensors::attprojw, &ParameterTensors::attprojb,
                        &ParameterTensors::ln2w, &ParameterTensors::ln2b, &ParameterTensors::fcw,
                        &ParameterTensors::fcb, &ParameterTensors::fcprojw,
                        &ParameterTensors::fcprojb, &ParameterTensors::lnfw,
                        &ParameterTensors::lnfb}) {
        place(member);
    }

    // AdamW's decay runs: the table sorted by offset, neighbours with the same setting merged.
    std::vector<ParameterInfo> table = model.parameter_table();
    std::sort(table.begin(), table.end(),
              [](const ParameterInfo& x, const ParameterInfo& y) { return x.offset < y.offset; });
    for (const ParameterInfo& info : table) {
        if (!d.runs.empty() && d.runs.back().decay == info.decay &&
            d.runs.back().offset + d.runs.back().size == info.offset) {
            d.runs.back().size += info.size;
        } else {
            d.runs.push_back({info.offset, info.size, info.decay});
        }
    }
    copy_parameters_from(model);
}

CudaGPT::~CudaGPT() = default;

void CudaGPT::forward_async(const int* inputs, const int* targets, int B, int T) {
    Impl& d = *impl_;
    const int V = config_.vocab_size, C = config_.n_embd, L = config_.n_layer,
              NH = config_.n_head;
    if (B <= 0) throw std::invalid_argument("CudaGPT::forward: B must be positive, got " + std::to_string(B));
    if (T <= 0 || T > config_.block_size) {
        throw std::invalid_argument("CudaGPT::forward: T must be in [1, block_size = " +
                                    std::to_string(config_.block_size) + "], got " +
                                    std::to_string(T));
    }
    const size_t BT = static_cast<size_t>(B) * T;
    for (size_t i = 0; i < BT; ++i) {
        if (inputs[i] < 0 || inputs[i] >= V || (targets && (targets[i] < 0 || targets[i] >= V))) {
            throw std::invalid_argument("CudaGPT::forward: a token id at position " +
                                        std::to_string(i) + " is outside [0, " +
                                        std::to_string(V) + ")");
        }
    }
    const float pdrop = config_.dropout;
    const bool dropout = training_ && pdrop > 0.0f;
    // Activations are laid out for the call's T but allocated for the whole block, so that
    // a growing context (generation) or a shorter batch reuses them instead of reallocating.
    if (B != d.cap_B || T > d.cap_T || (dropout && !d.dropout_allocated)) {
        d.allocate(B, std::max(T, config_.block_size), dropout);
    }
    d.B = B;
    d.T = T;

    // Upload: the pinned staging buffer may still be read by the previous copy.
    CUDA_CHECK(cudaEventSynchronize(d.uploaded));
    std::copy(inputs, inputs + BT, d.h_tokens);
    if (targets) std::copy(targets, targets + BT, d.h_tokens + BT);
    CUDA_CHECK(cudaMemcpyAsync(d.d_tokens, d.h_tokens, (targets ? 2 : 1) * BT * sizeof(int),
                               cudaMemcpyHostToDevice, d.stream));
    CUDA_CHECK(cudaEventRecord(d.uploaded, d.stream));
    const int* d_inputs = d.d_tokens;
    const int* d_targets = d.d_tokens + BT;

    ++d.forward_calls;
    d.dropout_applied = dropout;
    const ParameterTensors& p = d.p;
    DeviceActivations& a = d.a;
    cudaStream_t s = d.stream;
    Blas& blas = *d.blas;
    const bool bf16 = d.options.precision == Precision::bf16;
    const int N = static_cast<int>(BT);
    const size_t BTC = BT * C;
    const size_t att_size = static_cast<size_t>(B) * NH * T * T;

    // Mixed precision: the weights the products read, a bfloat16 copy made once per pass
    // (the float32 weights stay as they are: AdamW updates those).
    if (bf16) to_bf16(d.params16, d.params, num_parameters_, s);

    // x = drop(wte[idx] + wpe[pos])                                     (B, T, C)
    encoder_forward(a.encoded, d_inputs, p.wte, p.wpe, B, T, C, s);
    if (dropout) dropout_forward(a.encoded, pdrop, d.site_seed(-1, 0), BTC, s);

    for (int l = 0; l < L; ++l) {
        const size_t lc = static_cast<size_t>(l) * C;
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BTC;
        float* ln1 = a.ln1 + l * BTC;
        float* qkv = a.qkv + l * BTC * 3;
        float* atty = a.atty + l * BTC;
        float* att = a.att ? a.att + l * att_size : nullptr;
        float* att_dropped = a.att_dropped && dropout ? a.att_dropped + l * att_size : nullptr;
        float* lse = a.lse ? a.lse + l * BT * NH : nullptr;
        float* attproj = a.attproj + l * BTC;
        float* residual2 = a.residual2 + l * BTC;
        float* ln2 = a.ln2 + l * BTC;
        float* fch = a.fch + l * BTC * 4;
        float* fch_gelu = a.fch_gelu + l * BTC * 4;
        float* fcproj = a.fcproj + l * BTC;
        float* residual3 = a.residual3 + l * BTC;

        // x = x + drop(c_proj(attention(c_attn(ln_1(x)))))
        layernorm_forward(ln1, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, residual, p.ln1w + lc,
                          p.ln1b ? p.ln1b + lc : nullptr, B, T, C, s);
        d.product_forward(qkv, ln1, p.qkvw + lc * 3 * C, p.qkvb ? p.qkvb + 3 * lc : nullptr, N, C, 3 * C);
        // q, k, v rounded as the CPU model rounds them; the attention's products and P float32
        if (bf16) round_to_bf16(qkv, nullptr, 3 * BTC, s);
        switch (d.options.attention) {
        case AttentionKind::materialised:
            attention_forward(atty, att, att_dropped, qkv, dropout ? pdrop : 0.0f,
                              d.site_seed(l, 0), a.attention, B, T, C, NH, blas, s,
                              config_.causal, config_.scaled_attention);
            break;
        case AttentionKind::fused:
            fused_attention_forward(atty, lse, qkv, dropout ? pdrop : 0.0f, d.site_seed(l, 0),
                                    a.attention, B, T, C, NH, s, config_.causal);
            break;
        }
        d.product_forward(attproj, atty, p.attprojw + lc * C, p.attprojb ? p.attprojb + lc : nullptr, N, C, C);
        if (dropout) dropout_forward(attproj, pdrop, d.site_seed(l, 1), BTC, s);
        residual_forward(residual2, residual, attproj, BTC, s);

        // x = x + drop(c_proj(gelu(c_fc(ln_2(x)))))
        layernorm_forward(ln2, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, residual2, p.ln2w + lc,
                          p.ln2b ? p.ln2b + lc : nullptr, B, T, C, s);
        d.product_forward(fch, ln2, p.fcw + lc * 4 * C, p.fcb ? p.fcb + 4 * lc : nullptr, N, C, 4 * C);
        gelu_forward(fch_gelu, fch, BTC * 4, s);
        d.product_forward(fcproj, fch_gelu, p.fcprojw + lc * 4 * C, p.fcprojb ? p.fcprojb + lc : nullptr, N,
                          4 * C, C);
        if (dropout) dropout_forward(fcproj, pdrop, d.site_seed(l, 2), BTC, s);
        residual_forward(residual3, residual2, fcproj, BTC, s);
    }

    // logits = ln_f(x) · wteᵀ                                           (B, T, V)
    const float* last = a.residual3 + (L - 1) * BTC;
    layernorm_forward(a.lnf, a.lnf_mean, a.lnf_rstd, last, p.lnfw, p.lnfb, B, T, C, s);
    d.product_forward(a.logits, a.lnf, p.wte, nullptr, N, C, V);

    d.has_targets = targets != nullptr;
    if (targets) crossentropy_forward(a.probs, a.losses, d.mean_loss, a.logits, d_targets, B, T, V, s);
}

float CudaGPT::forward(const int* inputs, const int* targets, int B, int T) {
    forward_async(inputs, targets, B, T);
    return loss();
}

float CudaGPT::loss() {
    Impl& d = *impl_;
    if (!d.has_targets) return std::numeric_limits<float>::quiet_NaN();
    float value = 0.0f;
    CUDA_CHECK(cudaMemcpyAsync(&value, d.mean_loss, sizeof(float), cudaMemcpyDeviceToHost, d.stream));
    CUDA_CHECK(cudaStreamSynchronize(d.stream));
    return value;
}

void CudaGPT::seed_dropout(std::uint64_t seed) {
    impl_->seed = seed;
    impl_->forward_calls = 0;
}

void CudaGPT::zero_grad() { zero_async(impl_->grads, num_parameters_, impl_->stream); }

void CudaGPT::backward() {
    Impl& d = *impl_;
    if (!d.has_targets) {
        throw std::invalid_argument("CudaGPT::backward: the last forward call had no targets, so no loss");
    }
    const int B = d.B, T = d.T;
    const int V = config_.vocab_size, C = config_.n_embd, L = config_.n_layer,
              NH = config_.n_head;
    const size_t BT = static_cast<size_t>(B) * T;
    const int N = static_cast<int>(BT);
    const size_t BTC = BT * C;
    const size_t att_size = static_cast<size_t>(B) * NH * T * T;
    const ParameterTensors& p = d.p;
    const ParameterTensors& g = d.g;
    DeviceActivations& a = d.a;
    cudaStream_t s = d.stream;
    Blas& blas = *d.blas;
    const bool dropout = d.dropout_applied;
    const float pdrop = dropout ? config_.dropout : 0.0f;
    const int* d_inputs = d.d_tokens;
    const int* d_targets = d.d_tokens + BT;
    float* rs = a.reduce_scratch;

    // loss = mean cross-entropy(softmax(logits), targets)
    zero_async(a.dlogits, BT * V, s);
    crossentropy_backward(a.dlogits, a.probs, d_targets, B, T, V, s);
    // logits = lnf · wteᵀ (the tied LM head: its gradient adds to the embedding's)
    zero_async(a.dln, BTC, s);
    d.product_backward(a.dln, g.wte, nullptr, a.dlogits, a.lnf, p.wte, N, C, V);
    // lnf = ln_f(residual3[L-1])
    zero_async(a.dresidual, BTC, s);
    layernorm_backward(a.dresidual, g.lnfw, g.lnfb, a.dln, a.residual3 + (L - 1) * BTC, p.lnfw,
                       a.lnf_mean, a.lnf_rstd, rs, B, T, C, s);

    // a.dresidual holds d(residual3[l]) on entry to each block and d(block input) on exit.
    for (int l = L - 1; l >= 0; --l) {
        const size_t lc = static_cast<size_t>(l) * C;
        const float* residual = l == 0 ? a.encoded : a.residual3 + (l - 1) * BTC;
        const float* ln1 = a.ln1 + l * BTC;
        const float* qkv = a.qkv + l * BTC * 3;
        const float* atty = a.atty + l * BTC;
        const float* att = a.att ? a.att + l * att_size : nullptr;
        const float* att_dropped = a.att_dropped && dropout ? a.att_dropped + l * att_size : nullptr;
        const float* lse = a.lse ? a.lse + l * BT * NH : nullptr;
        const float* residual2 = a.residual2 + l * BTC;
        const float* ln2 = a.ln2 + l * BTC;
        const float* fch = a.fch + l * BTC * 4;
        const float* fch_gelu = a.fch_gelu + l * BTC * 4;

        // residual3 = residual2 + fcproj: d(fcproj) = dresidual
        CUDA_CHECK(cudaMemcpyAsync(a.dinner, a.dresidual, BTC * sizeof(float),
                                   cudaMemcpyDeviceToDevice, s));
        // fcproj = drop(fch_gelu · c_projᵀ + b)
        if (dropout) dropout_backward(a.dinner, pdrop, d.site_seed(l, 2), BTC, s);
        zero_async(a.dfch_gelu, 4 * BTC, s);
        d.product_backward(a.dfch_gelu, g.fcprojw + lc * 4 * C, g.fcprojb ? g.fcprojb + lc : nullptr, a.dinner,
                           fch_gelu, p.fcprojw + lc * 4 * C, N, 4 * C, C);
        // fch_gelu = gelu(fch)
        zero_async(a.dfch, 4 * BTC, s);
        gelu_backward(a.dfch, fch, a.dfch_gelu, 4 * BTC, s);
        // fch = ln2 · c_fcᵀ + b
        zero_async(a.dln, BTC, s);
        d.product_backward(a.dln, g.fcw + lc * 4 * C, g.fcb ? g.fcb + 4 * lc : nullptr, a.dfch, ln2,
                           p.fcw + lc * 4 * C, N, C, 4 * C);
        // ln2 = ln_2(residual2)
        layernorm_backward(a.dresidual, g.ln2w + lc, g.ln2b ? g.ln2b + lc : nullptr, a.dln,
                           residual2, p.ln2w + lc, a.ln2_mean + l * BT, a.ln2_rstd + l * BT, rs, B,
                           T, C, s);

        // residual2 = residual + attproj
        CUDA_CHECK(cudaMemcpyAsync(a.dinner, a.dresidual, BTC * sizeof(float),
                                   cudaMemcpyDeviceToDevice, s));
        // attproj = drop(atty · c_projᵀ + b)
        if (dropout) dropout_backward(a.dinner, pdrop, d.site_seed(l, 1), BTC, s);
        zero_async(a.datty, BTC, s);
        d.product_backward(a.datty, g.attprojw + lc * C, g.attprojb ? g.attprojb + lc : nullptr, a.dinner,
                           atty, p.attprojw + lc * C, N, C, C);
        // atty = attention(qkv)
        zero_async(a.dqkv, 3 * BTC, s);
        switch (d.options.attention) {
        case AttentionKind::materialised:
            attention_backward(a.dqkv, a.datty, qkv, att, att_dropped, pdrop, a.attention, B, T,
                               C, NH, blas, s, config_.causal, config_.scaled_attention);
            break;
        case AttentionKind::fused:
            fused_attention_backward(a.dqkv, a.datty, qkv, atty, lse, pdrop,
                                     d.site_seed(l, 0), a.attention, B, T, C, NH, s,
                                     config_.causal);
            break;
        }
        // qkv = ln1 · c_attnᵀ + b
        zero_async(a.dln, BTC, s);
        d.product_backward(a.dln, g.qkvw + lc * 3 * C, g.qkvb ? g.qkvb + 3 * lc : nullptr, a.dqkv, ln1,
                           p.qkvw + lc * 3 * C, N, C, 3 * C);
        // ln1 = ln_1(residual)
        layernorm_backward(a.dresidual, g.ln1w + lc, g.ln1b ? g.ln1b + lc : nullptr, a.dln,
                           residual, p.ln1w + lc, a.ln1_mean + l * BT, a.ln1_rstd + l * BT, rs, B,
                           T, C, s);
    }

    // encoded = drop(wte[idx] + wpe[pos])
    if (dropout) dropout_backward(a.dresidual, pdrop, d.site_seed(-1, 0), BTC, s);
    encoder_backward(g.wte, g.wpe, a.dresidual, d_inputs, B, T, C, V, s);
}

void CudaGPT::clip_grad_norm_async(float max_norm) {
    Impl& d = *impl_;
    attn::cuda::clip_grad_norm(d.grads, d.norm, d.norm_scratch, num_parameters_, max_norm, d.stream);
}

float CudaGPT::clip_grad_norm(float max_norm) {
    clip_grad_norm_async(max_norm);
    return grad_norm();
}

float CudaGPT::grad_norm() {
    Impl& d = *impl_;
    float value = 0.0f;
    CUDA_CHECK(cudaMemcpyAsync(&value, d.norm, sizeof(float), cudaMemcpyDeviceToHost, d.stream));
    CUDA_CHECK(cudaStreamSynchronize(d.stream));
    return value;
}

void CudaGPT::adamw_step(AdamW& opt, float lr) {
    Impl& d = *impl_;
    ++opt.step_count;
    for (const DecayRun& run : d.runs) {
        adamw_update(d.params + run.offset, d.grads + run.offset, d.m + run.offset,
                     d.v + run.offset, run.size, lr, opt.beta1, opt.beta2, opt.eps,
                     run.decay ? opt.weight_decay : 0.0f, opt.step_count, d.stream);
    }
}

namespace {
void check_same_config(const GPTConfig& a, const GPTConfig& b, const char* where) {
    if (a.vocab_size != b.vocab_size || a.block_size != b.block_size || a.n_layer != b.n_layer ||
        a.n_head != b.n_head || a.n_embd != b.n_embd || a.bias != b.bias ||
        a.causal != b.causal || a.scaled_attention != b.scaled_attention ||
        a.position != b.position || a.kv_heads() != b.kv_heads() || a.window != b.window) {
        throw std::invalid_argument(std::string(where) +
                                    ": the CPU model's sizes or attention differ from the "
                                                  "GPU model's");
    }
}

void download(float* host, const float* device, size_t n, cudaStream_t s) {
    CUDA_CHECK(cudaMemcpyAsync(host, device, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
}

void upload(float* device, const float* host, size_t n, cudaStream_t s) {
    CUDA_CHECK(cudaMemcpyAsync(device, host, n * sizeof(float), cudaMemcpyHostToDevice, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
}
}  // namespace

void CudaGPT::copy_parameters_to(GPT& model) const {
    check_same_config(model.config(), config_, "CudaGPT::copy_parameters_to");
    download(model.parameters().data(), impl_->params, num_parameters_, impl_->stream);
}

void CudaGPT::copy_parameters_from(const GPT& model) {
    check_same_config(model.config(), config_, "CudaGPT::copy_parameters_from");
    upload(impl_->params, model.parameters().data(), num_parameters_, impl_->stream);
}

void CudaGPT::copy_gradients_to(std::vector<float>& out) const {
    out.resize(num_parameters_);
    download(out.data(), impl_->grads, num_parameters_, impl_->stream);
}

void CudaGPT::copy_optimizer_to(AdamW& opt) const {
    opt.m.resize(num_parameters_);
    opt.v.resize(num_parameters_);
    download(opt.m.data(), impl_->m, num_parameters_, impl_->stream);
    download(opt.v.data(), impl_->v, num_parameters_, impl_->stream);
}

void CudaGPT::copy_optimizer_from(const AdamW& opt) {
    Impl& d = *impl_;
    if (opt.m.empty() && opt.v.empty()) {
        zero_async(d.m, num_parameters_, d.stream);
        zero_async(d.v, num_parameters_, d.stream);
        CUDA_CHECK(cudaStreamSynchronize(d.stream));
        return;
    }
    if (opt.m.size() != num_parameters_ || opt.v.size() != num_parameters_) {
        throw std::invalid_argument("CudaGPT::copy_optimizer_from: m and v must hold " +
                                    std::to_string(num_parameters_) + " floats, got " +
                                    std::to_string(opt.m.size()) + " and " +
                                    std::to_string(opt.v.size()));
    }
    upload(d.m, opt.m.data(), num_parameters_, d.stream);
    upload(d.v, opt.v.data(), num_parameters_, d.stream);
}

void CudaGPT::copy_logits_to(std::vector<float>& out) const {
    const Impl& d = *impl_;
    out.resize(static_cast<size_t>(d.B) * d.T * config_.vocab_size);
    if (!out.empty()) download(out.data(), d.a.logits, out.size(), d.stream);
}

void CudaGPT::copy_logits_row_to(std::vector<float>& out, int b, int t) const {
    const Impl& d = *impl_;
    if (b < 0 || b >= d.B || t < 0 || t >= d.T) {
        throw std::invalid_argument("CudaGPT::copy_logits_row_to: (" + std::to_string(b) + ", " +
                                    std::to_string(t) + ") is outside the last forward call's (" +
                                    std::to_string(d.B) + ", " + std::to_string(d.T) + ")");
    }
    const size_t V = config_.vocab_size;
    out.resize(V);
    download(out.data(), d.a.logits + (static_cast<size_t>(b) * d.T + t) * V, V, d.stream);
}

namespace {
// The key/value cache keeps a position's key and value as they were when it was the newest:
// right for a causal model (no later token changes them), as the CPU's cache requires.
void require_cacheable(const GPTConfig& c, const char* who) {
    if (!c.causal) {
        throw std::invalid_argument(std::string(who) + ": the model is not causal, so an earlier "
                                    "position's key and value change with every new token: "
                                    "generate without the cache");
    }
    if (!c.scaled_attention) {
        throw std::invalid_argument(std::string(who) + ": the cached attention divides the "
                                    "scores by √hs, as the CPU's cache does; this model has no "
                                    "scale: generate without the cache");
    }
}
void require_float32(const CudaOptions& options, const char* who) {
    if (options.precision != Precision::fp32) {
        throw std::invalid_argument(std::string(who) + ": the cached decoding computes in float32, and this "
                                    "model's products are in " + precision_name(options.precision) +
                                    ": generate without the cache");
    }
}
}  // namespace

void CudaGPT::decode_step(std::vector<float>& logits, int token, int pos) {
    require_cacheable(config_, "CudaGPT::decode_step");
    Impl& d = *impl_;
    require_float32(d.options, "CudaGPT::decode_step");
    const int V = config_.vocab_size, C = config_.n_embd, L = config_.n_layer,
              NH = config_.n_head, block = config_.block_size, hs = C / NH;
    if (token < 0 || token >= V) {
        throw std::invalid_argument("CudaGPT::decode_step: token " + std::to_string(token) +
                                    " is outside [0, " + std::to_string(V) + ")");
    }
    if (pos < 0 || pos >= block || (pos != 0 && pos != d.decoded)) {
        throw std::invalid_argument("CudaGPT::decode_step: position " + std::to_string(pos) +
                                    " must be 0 or the " + std::to_string(d.decoded) +
                                    " positions cached so far, and below block_size = " +
                                    std::to_string(block));
    }
    d.ensure_decode_buffers();
    const DecodeBuffers& b = d.dec;
    const ParameterTensors& p = d.p;
    cudaStream_t s = d.stream;
    Blas& blas = *d.blas;
    const size_t layer_cache = static_cast<size_t>(block) * C;  // NH·block·hs per layer

    // x = wte[token] + wpe[pos]: the encoder for one token, its position table shifted.
    CUDA_CHECK(cudaMemcpyAsync(b.token, &token, sizeof(int), cudaMemcpyHostToDevice, s));
    encoder_forward(b.x, b.token, p.wte, p.wpe + static_cast<size_t>(pos) * C, 1, 1, C, s);
    for (int l = 0; l < L; ++l) {
        const size_t lc = static_cast<size_t>(l) * C;
        float* keys = b.keys + l * layer_cache;
        float* values = b.values + l * layer_cache;
        layernorm_forward(b.ln, b.mean, b.rstd, b.x, p.ln1w + lc, p.ln1b ? p.ln1b + lc : nullptr,
                          1, 1, C, s);
        matmul_forward(b.qkv, b.ln, p.qkvw + lc * 3 * C, p.qkvb ? p.qkvb + 3 * lc : nullptr, 1, C,
                       3 * C, blas, s);
        // Append: head h's key (hs floats at qkv[C + h·hs]) to row pos of its (block, hs) slab.
        const size_t row = static_cast<size_t>(hs) * sizeof(float);
        const size_t slab = static_cast<size_t>(block) * row;
        CUDA_CHECK(cudaMemcpy2DAsync(keys + static_cast<size_t>(pos) * hs, slab, b.qkv + C, row,
                                     row, NH, cudaMemcpyDeviceToDevice, s));
        CUDA_CHECK(cudaMemcpy2DAsync(values + static_cast<size_t>(pos) * hs, slab, b.qkv + 2 * C,
                                     row, row, NH, cudaMemcpyDeviceToDevice, s));
        cached_attention_forward(b.atty, b.qkv, keys, values, pos + 1, block, C, NH, s);
        matmul_forward(b.proj, b.atty, p.attprojw + lc * C, p.attprojb ? p.attprojb + lc : nullptr,
                       1, C, C, blas, s);
        residual_forward(b.residual2, b.x, b.proj, static_cast<size_t>(C), s);
        layernorm_forward(b.ln, b.mean, b.rstd, b.residual2, p.ln2w + lc,
                          p.ln2b ? p.ln2b + lc : nullptr, 1, 1, C, s);
        matmul_forward(b.fch, b.ln, p.fcw + lc * 4 * C, p.fcb ? p.fcb + 4 * lc : nullptr, 1, C,
                       4 * C, blas, s);
        gelu_forward(b.fch_gelu, b.fch, 4 * static_cast<size_t>(C), s);
        matmul_forward(b.proj, b.fch_gelu, p.fcprojw + lc * 4 * C,
                       p.fcprojb ? p.fcprojb + lc : nullptr, 1, 4 * C, C, blas, s);
        residual_forward(b.x, b.residual2, b.proj, static_cast<size_t>(C), s);
    }
    layernorm_forward(b.ln, b.mean, b.rstd, b.x, p.lnfw, p.lnfb, 1, 1, C, s);
    matmul_forward(b.logits, b.ln, p.wte, nullptr, 1, C, V, blas, s);
    d.decoded = pos + 1;
    logits.resize(static_cast<size_t>(V));
    download(logits.data(), b.logits, logits.size(), s);
}

void CudaGPT::prefill(std::vector<float>& logits, const int* tokens, int T) {
    require_cacheable(config_, "CudaGPT::prefill");
    require_float32(impl_->options, "CudaGPT::prefill");
    train(false);
    forward_async(tokens, nullptr, 1, T);
    Impl& d = *impl_;
    d.ensure_decode_buffers();
    const int C = config_.n_embd, NH = config_.n_head, L = config_.n_layer,
              block = config_.block_size, hs = C / NH;
    const size_t row = static_cast<size_t>(hs) * sizeof(float);
    const size_t layer_cache = static_cast<size_t>(block) * C;
    // qkv of layer l is (T, 3, NH, hs); head h's keys are rows of hs floats, 3C apart,
    // copied to the (block, hs) slab of (layer l, head h). Likewise the values.
    for (int l = 0; l < L; ++l) {
        const float* qkv = d.a.qkv + static_cast<size_t>(l) * T * 3 * C;
        for (int h = 0; h < NH; ++h) {
            const size_t slab = l * layer_cache + static_cast<size_t>(h) * block * hs;
            CUDA_CHECK(cudaMemcpy2DAsync(d.dec.keys + slab, row, qkv + C + h * hs, 3 * C * sizeof(float),
                                         row, static_cast<size_t>(T), cudaMemcpyDeviceToDevice, d.stream));
            CUDA_CHECK(cudaMemcpy2DAsync(d.dec.values + slab, row, qkv + 2 * C + h * hs,
                                         3 * C * sizeof(float), row, static_cast<size_t>(T),
                                         cudaMemcpyDeviceToDevice, d.stream));
        }
    }
    d.decoded = T;
    copy_logits_row_to(logits, 0, T - 1);
}

void CudaGPT::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(impl_->stream)); }

}  // namespace attn::cuda
