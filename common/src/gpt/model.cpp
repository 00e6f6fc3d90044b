// nanoGPT's GPT: parameter layout, initialisation, forward and backward passes.
#include "attn/gpt.hpp"

#include "attn/gpt_layers.hpp"
#include "attn/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace attn {

namespace {
using std::size_t;

// Sets a buffer to n zeros (std::vector reuses its storage when it is large enough).
void resize_zero(std::vector<float>& v, size_t n) { v.assign(n, 0.0f); }

void zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }
}  // namespace

void GPTConfig::validate() const {
    require(vocab_size > 0,
            "GPT config: vocab_size must be positive, got " + std::to_string(vocab_size));
    require(block_size > 0,
            "GPT config: block_size must be positive, got " + std::to_string(block_size));
    require(n_layer > 0, "GPT config: n_layer must be positive, got " + std::to_string(n_layer));
    require(n_head > 0, "GPT config: n_head must be positive, got " + std::to_string(n_head));
    require(n_embd > 0 && n_embd % n_head == 0,
            "GPT config: n_embd must be a positive multiple of n_head, got n_embd " +
                std::to_string(n_embd) + " and n_head " + std::to_string(n_head));
    require(dropout >= 0.0f && dropout < 1.0f,
            "GPT config: dropout must be in [0, 1), got " + std::to_string(dropout));
}

std::size_t GPTConfig::num_parameters() const {
    const size_t V = vocab_size, C = n_embd, L = n_layer, Tb = block_size;
    size_t per_layer = 2 * C + 3 * C * C + C * C + 2 * C + 4 * C * C + 4 * C * C;
    if (bias) per_layer += 3 * C + C + 4 * C + C;
    return V * C + Tb * C + L * per_layer + C + (bias ? C : 0);
}

GPT::GPT(const GPTConfig& config, std::uint64_t seed)
    : config_(config), dropout_rng_(seed ^ 0x5eed) {
    config_.validate();
    const size_t V = config_.vocab_size, C = config_.n_embd, L = config_.n_layer,
                 Tb = config_.block_size;
    const bool bias = config_.bias;

    // The state_dict's tensors in nanoGPT's order; `float* ParameterTensors::*` says where
    // each kind lives, and per-layer tensors are slices of one stacked (L, ...) tensor.
    struct Kind {
        const char* suffix;  // the key after "transformer.h.<l>." (or the whole key)
        float* ParameterTensors::*member;
        std::vector<size_t> shape;
        bool present;
    };
    const std::vector<Kind> embeddings = {
        {"transformer.wte.weight", &ParameterTensors::wte, {V, C}, true},
        {"transformer.wpe.weight", &ParameterTensors::wpe, {Tb, C}, true}};
    const std::vector<Kind> per_layer = {
        {"ln_1.weight", &ParameterTensors::ln1w, {C}, true},
        {"ln_1.bias", &ParameterTensors::ln1b, {C}, bias},
        {"attn.c_attn.weight", &ParameterTensors::qkvw, {3 * C, C}, true},
        {"attn.c_attn.bias", &ParameterTensors::qkvb, {3 * C}, bias},
        {"attn.c_proj.weight", &ParameterTensors::attprojw, {C, C}, true},
        {"attn.c_proj.bias", &ParameterTensors::attprojb, {C}, bias},
        {"ln_2.weight", &ParameterTensors::ln2w, {C}, true},
        {"ln_2.bias", &ParameterTensors::ln2b, {C}, bias},
        {"mlp.c_fc.weight", &ParameterTensors::fcw, {4 * C, C}, true},
        {"mlp.c_fc.bias", &ParameterTensors::fcb, {4 * C}, bias},
        {"mlp.c_proj.weight", &ParameterTensors::fcprojw, {C, 4 * C}, true},
        {"mlp.c_proj.bias", &ParameterTensors::fcprojb, {C}, bias}};
    const std::vector<Kind> final_norm = {
        {"transformer.ln_f.weight", &ParameterTensors::lnfw, {C}, true},
        {"transformer.ln_f.bias", &ParameterTensors::lnfb, {C}, bias}};

    auto product = [](const std::vector<size_t>& s) {
        size_t n = 1;
        for (size_t d : s) n *= d;
        return n;
    };
    // First the offsets of each kind (stacked over layers), then the table in state_dict order.
    struct Placed {
        const Kind* kind;
        size_t offset;
    };
    std::vector<Placed> placed;
    size_t total = 0;
    auto place = [&](const Kind& k, size_t copies) {
        placed.push_back({&k, total});
        if (k.present) total += copies * product(k.shape);
    };
    for (const Kind& k : embeddings) place(k, 1);
    for (const Kind& k : per_layer) place(k, L);
    for (const Kind& k : final_norm) place(k, 1);
    params_memory_.assign(total, 0.0f);
    grads_memory_.assign(total, 0.0f);
    for (const Placed& p : placed) {
        if (!p.kind->present) continue;
        params_.*(p.kind->member) = params_memory_.data() + p.offset;
        grads_.*(p.kind->member) = grads_memory_.data() + p.offset;
    }
    auto add = [&](const std::string& name, const Kind& k, size_t offset) {
        table_.push_back({name, k.shape, offset, product(k.shape), k.shape.size() >= 2});
    };
    for (size_t i = 0; i < embeddings.size(); ++i)
        add(embeddings[i].suffix, embeddings[i], placed[i].offset);
    for (size_t l = 0; l < L; ++l) {
        for (size_t i = 0; i < per_layer.size(); ++i) {
            const Kind& k = per_layer[i];
            if (!k.present) continue;
            add("transformer.h." + std::to_string(l) + "." + k.suffix, k,
                placed[embeddings.size() + i].offset + l * product(k.shape));
        }
    }
    for (size_t i = 0; i < final_norm.size(); ++i) {
        if (final_norm[i].present) {
            add(final_norm[i].suffix, final_norm[i],
                placed[embeddings.size() + per_layer.size() + i].offset);
        }
    }

    // nanoGPT's _init_weights, then the scaled init of the residual projections.
    Rng rng(seed);
    const float std_residual = 0.02f / std::sqrt(2.0f * static_cast<float>(L));
    for (const ParameterInfo& p : table_) {
        float* w = params_memory_.data() + p.offset;
        const bool is_norm = p.name.find("ln_") != std::string::npos;
        const bool is_bias =
            p.name.size() >= 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
        if (is_bias) continue;  // already 0
        if (is_norm) {
            std::fill(w, w + p.size, 1.0f);
            continue;
        }
        const bool residual = p.name.find("c_proj.weight") != std::string::npos;
        const float stddev = residual ? std_residual : 0.02f;
        for (size_t i = 0; i < p.size; ++i) w[i] = stddev * rng.normal();
    }
}

void GPT::allocate_activations(int B, int T) {
    const size_t BT = static_cast<size_t>(B) * T;
    const size_t C = config_.n_embd, L = config_.n_layer, V = config_.vocab_size,
                 NH = config_.n_head;
    const size_t TT = static_cast<size_t>(T) * T;
    Activations& a = acts_;
    resize_zero(a.encoded, BT * C);
    resize_zero(a.ln1, L * BT * C);
    resize_zero(a.ln1_mean, L * BT);
    resize_zero(a.ln1_rstd, L * BT);
    resize_zero(a.qkv, L * BT * 3 * C);
    resize_zero(a.atty, L * BT * C);
    resize_zero(a.att, L * B * NH * TT);
    resize_zero(a.attproj, L * BT * C);
    resize_zero(a.residual2, L * BT * C);
    resize_zero(a.ln2, L * BT * C);
    resize_zero(a.ln2_mean, L * BT);
    resize_zero(a.ln2_rstd, L * BT);
    resize_zero(a.fch, L * BT * 4 * C);
    resize_zero(a.fch_gelu, L * BT * 4 * C);
    resize_zero(a.fcproj, L * BT * C);
    resize_zero(a.residual3, L * BT * C);
    resize_zero(a.lnf, BT * C);
    resize_zero(a.lnf_mean, BT);
    resize_zero(a.lnf_rstd, BT);
    resize_zero(a.logits, BT * V);
    resize_zero(a.probs, BT * V);
    resize_zero(a.losses, BT);
    const bool dropout = config_.dropout > 0.0f;
    resize_zero(a.att_dropped, dropout ? L * B * NH * TT : 0);
    resize_zero(a.encoded_mask, dropout ? BT * C : 0);
    resize_zero(a.attproj_mask, dropout ? L * BT * C : 0);
    resize_zero(a.fcproj_mask, dropout ? L * BT * C : 0);

    GradientScratch& s = scratch_;
    resize_zero(s.dresidual, BT * C);
    resize_zero(s.dln, BT * C);
    resize_zero(s.dqkv, BT * 3 * C);
    resize_zero(s.datty, BT * C);
    resize_zero(s.dfch, BT * 4 * C);
    resize_zero(s.dfch_gelu, BT * 4 * C);
    resize_zero(s.dlogits, BT * V);
    resize_zero(s.datt, TT);
    resize_zero(s.dinner, BT * C);
    inputs_.assign(BT, 0);
    targets_.assign(BT, 0);
    B_ = B;
    T_ = T;
}

float GPT::forward(const std::vector<int>& inputs, const std::vector<int>& targets, int B, int T) {
    const size_t BT = static_cast<size_t>(B) * static_cast<size_t>(T);
    require(B > 0 && T > 0 && inputs.size() == BT,
            "GPT::forward: inputs must hold B*T = " + std::to_string(BT) + " ids, got " +
                std::to_string(inputs.size()));
    require(targets.empty() || targets.size() == BT,
            "GPT::forward: targets must hold B*T = " + std::to_string(BT) + " ids or none, got " +
                std::to_string(targets.size()));
    return forward(inputs.data(), targets.empty() ? nullptr : targets.data(), B, T);
}

float GPT::forward(const int* inputs, const int* targets, int B, int T) {
    const int V = config_.vocab_size, C = config_.n_embd, L = config_.n_layer, NH = config_.n_head;
    require(B > 0, "GPT::forward: B must be positive, got " + std::to_string(B));
    require(T > 0 && T <= config_.block_size,
            "GPT::forward: T must be in [1, block_size = " + std::to_string(config_.block_size) +
                "], got " + std::to_string(T));
    const size_t BT = static_cast<size_t>(B) * T;
    for (size_t i = 0; i < BT; ++i) {
        require(inputs[i] >= 0 && inputs[i] < V,
                "GPT::forward: token id " + std::to_string(inputs[i]) + " at position " +
                    std::to_string(i) + " is outside [0, " + std::to_string(V) + ")");
        require(!targets || (targets[i] >= 0 && targets[i] < V),
                "GPT::forward: target id " + std::to_string(targets ? targets[i] : 0) +
                    " at position " + std::to_string(i) + " is outside [0, " + std::to_string(V) +
                    ")");
    }
    if (B != B_ || T != T_) allocate_activations(B, T);

    const ParameterTensors& p = params_;
    Activations& a = acts_;
    const float pdrop = config_.dropout;
    const bool dropout = training_ && pdrop > 0.0f;
    dropout_applied_ = dropout;
    const int N = static_cast<int>(BT);
    const size_t BTC = BT * C;
    const size_t TT = static_cast<size_t>(T) * T;

    // x = drop(wte[idx] + wpe[pos])                                     (B, T, C)
    encoder_forward(a.encoded.data(), inputs, p.wte, p.wpe, B, T, C);
    if (dropout)
        dropout_forward(a.encoded.data(), a.encoded_mask.data(), pdrop, dropout_rng_, N * C);

    for (int l = 0; l < L; ++l) {
        const size_t lc = static_cast<size_t>(l) * C;
        const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * BTC;
        float* ln1 = a.ln1.data() + l * BTC;
        float* qkv = a.qkv.data() + l * BTC * 3;
        float* atty = a.atty.data() + l * BTC;
        float* att = a.att.data() + l * B * NH * TT;
        float* att_dropped = dropout ? a.att_dropped.data() + l * B * NH * TT : nullptr;
        float* attproj = a.attproj.data() + l * BTC;
        float* residual2 = a.residual2.data() + l * BTC;
        float* ln2 = a.ln2.data() + l * BTC;
        float* fch = a.fch.data() + l * BTC * 4;
        float* fch_gelu = a.fch_gelu.data() + l * BTC * 4;
        float* fcproj = a.fcproj.data() + l * BTC;
        float* residual3 = a.residual3.data() + l * BTC;

        // x = x + drop(c_proj(attention(c_attn(ln_1(x)))))
        layernorm_forward(ln1, a.ln1_mean.data() + l * BT, a.ln1_rstd.data() + l * BT, residual,
                          p.ln1w + lc, p.ln1b ? p.ln1b + lc : nullptr, B, T, C);
        matmul_forward(qkv, ln1, p.qkvw + lc * 3 * C, p.qkvb ? p.qkvb + 3 * lc : nullptr, N, C,
                       3 * C);
        attention_forward(atty, att, att_dropped, qkv, dropout ? pdrop : 0.0f, &dropout_rng_, B, T,
                          C, NH, config_.causal);
        matmul_forward(attproj, atty, p.attprojw + lc * C, p.attprojb ? p.attprojb + lc : nullptr,
                       N, C, C);
        if (dropout)
            dropout_forward(attproj, a.attproj_mask.data() + l * BTC, pdrop, dropout_rng_, N * C);
        residual_forward(residual2, residual, attproj, N * C);

        // x = x + drop(c_proj(gelu(c_fc(ln_2(x)))))
        layernorm_forward(ln2, a.ln2_mean.data() + l * BT, a.ln2_rstd.data() + l * BT, residual2,
                          p.ln2w + lc, p.ln2b ? p.ln2b + lc : nullptr, B, T, C);
        matmul_forward(fch, ln2, p.fcw + lc * 4 * C, p.fcb ? p.fcb + 4 * lc : nullptr, N, C, 4 * C);
        gelu_forward(fch_gelu, fch, N * 4 * C);
        matmul_forward(fcproj, fch_gelu, p.fcprojw + lc * 4 * C,
                       p.fcprojb ? p.fcprojb + lc : nullptr, N, 4 * C, C);
        if (dropout)
            dropout_forward(fcproj, a.fcproj_mask.data() + l * BTC, pdrop, dropout_rng_, N * C);
        residual_forward(residual3, residual2, fcproj, N * C);
    }

    // logits = ln_f(x) · wteᵀ                                           (B, T, V)
    const float* last = a.residual3.data() + (L - 1) * BTC;
    layernorm_forward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), last, p.lnfw, p.lnfb, B,
                      T, C);
    matmul_forward(a.logits.data(), a.lnf.data(), p.wte, nullptr, N, C, V);

    std::copy(inputs, inputs + BT, inputs_.begin());
    has_targets_ = targets != nullptr;
    if (!targets) return std::numeric_limits<float>::quiet_NaN();
    std::copy(targets, targets + BT, targets_.begin());
    return crossentropy_forward(a.probs.data(), a.losses.data(), a.logits.data(), targets, B, T, V);
}

void GPT::zero_grad() { zero(grads_memory_); }

void GPT::backward() {
    require(has_targets_, "GPT::backward: the last forward call had no targets, so no loss");
    const int B = B_, T = T_;
    const int V = config_.vocab_size, C = config_.n_embd, L = config_.n_layer, NH = config_.n_head;
    const size_t BT = static_cast<size_t>(B) * T;
    const int N = static_cast<int>(BT);
    const size_t BTC = BT * C;
    const size_t TT = static_cast<size_t>(T) * T;
    const ParameterTensors& p = params_;
    const ParameterTensors& g = grads_;
    const Activations& a = acts_;
    GradientScratch& s = scratch_;
    const bool dropout = dropout_applied_;
    const float pdrop = dropout ? config_.dropout : 0.0f;

    // loss = mean cross-entropy(softmax(logits), targets)
    zero(s.dlogits);
    crossentropy_backward(s.dlogits.data(), a.probs.data(), targets_.data(), B, T, V);
    // logits = lnf · wteᵀ (the tied LM head: its gradient adds to the embedding's)
    zero(s.dln);
    matmul_backward(s.dln.data(), g.wte, nullptr, s.dlogits.data(), a.lnf.data(), p.wte, N, C, V);
    // lnf = ln_f(residual3[L-1])
    zero(s.dresidual);
    layernorm_backward(s.dresidual.data(), g.lnfw, g.lnfb, s.dln.data(),
                       a.residual3.data() + (L - 1) * BTC, p.lnfw, a.lnf_mean.data(),
                       a.lnf_rstd.data(), B, T, C);

    // s.dresidual holds d(residual3[l]) on entry to each block and d(block input) on exit:
    // the identity path of both residual connections adds dout to the input unchanged, so
    // only the branches are added into it.
    for (int l = L - 1; l >= 0; --l) {
        const size_t lc = static_cast<size_t>(l) * C;
        const float* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * BTC;
        const float* ln1 = a.ln1.data() + l * BTC;
        const float* qkv = a.qkv.data() + l * BTC * 3;
        const float* atty = a.atty.data() + l * BTC;
        const float* att = a.att.data() + l * B * NH * TT;
        const float* att_dropped = dropout ? a.att_dropped.data() + l * B * NH * TT : nullptr;
        const float* residual2 = a.residual2.data() + l * BTC;
        const float* ln2 = a.ln2.data() + l * BTC;
        const float* fch = a.fch.data() + l * BTC * 4;
        const float* fch_gelu = a.fch_gelu.data() + l * BTC * 4;

        // residual3 = residual2 + fcproj: d(residual2) = dresidual (kept in place),
        // d(fcproj) = dresidual
        std::copy(s.dresidual.begin(), s.dresidual.end(), s.dinner.begin());
        // fcproj = drop(fch_gelu · c_projᵀ + b)
        if (dropout) dropout_backward(s.dinner.data(), a.fcproj_mask.data() + l * BTC, N * C);
        zero(s.dfch_gelu);
        matmul_backward(s.dfch_gelu.data(), g.fcprojw + lc * 4 * C,
                        g.fcprojb ? g.fcprojb + lc : nullptr, s.dinner.data(), fch_gelu,
                        p.fcprojw + lc * 4 * C, N, 4 * C, C);
        // fch_gelu = gelu(fch)
        zero(s.dfch);
        gelu_backward(s.dfch.data(), fch, s.dfch_gelu.data(), N * 4 * C);
        // fch = ln2 · c_fcᵀ + b
        zero(s.dln);
        matmul_backward(s.dln.data(), g.fcw + lc * 4 * C, g.fcb ? g.fcb + 4 * lc : nullptr,
                        s.dfch.data(), ln2, p.fcw + lc * 4 * C, N, C, 4 * C);
        // ln2 = ln_2(residual2)
        layernorm_backward(s.dresidual.data(), g.ln2w + lc, g.ln2b ? g.ln2b + lc : nullptr,
                           s.dln.data(), residual2, p.ln2w + lc, a.ln2_mean.data() + l * BT,
                           a.ln2_rstd.data() + l * BT, B, T, C);

        // residual2 = residual + attproj
        std::copy(s.dresidual.begin(), s.dresidual.end(), s.dinner.begin());
        // attproj = drop(atty · c_projᵀ + b)
        if (dropout) dropout_backward(s.dinner.data(), a.attproj_mask.data() + l * BTC, N * C);
        zero(s.datty);
        matmul_backward(s.datty.data(), g.attprojw + lc * C, g.attprojb ? g.attprojb + lc : nullptr,
                        s.dinner.data(), atty, p.attprojw + lc * C, N, C, C);
        // atty = attention(qkv)
        zero(s.dqkv);
        attention_backward(s.dqkv.data(), s.datt.data(), s.datty.data(), qkv, att, att_dropped,
                           pdrop, B, T, C, NH, config_.causal);
        // qkv = ln1 · c_attnᵀ + b
        zero(s.dln);
        matmul_backward(s.dln.data(), g.qkvw + lc * 3 * C, g.qkvb ? g.qkvb + 3 * lc : nullptr,
                        s.dqkv.data(), ln1, p.qkvw + lc * 3 * C, N, C, 3 * C);
        // ln1 = ln_1(residual)
        layernorm_backward(s.dresidual.data(), g.ln1w + lc, g.ln1b ? g.ln1b + lc : nullptr,
                           s.dln.data(), residual, p.ln1w + lc, a.ln1_mean.data() + l * BT,
                           a.ln1_rstd.data() + l * BT, B, T, C);
    }

    // encoded = drop(wte[idx] + wpe[pos])
    if (dropout) dropout_backward(s.dresidual.data(), a.encoded_mask.data(), N * C);
    // The inputs were not kept: the token ids are needed to scatter into wte.
    encoder_backward(g.wte, g.wpe, s.dresidual.data(), inputs_.data(), B, T, C);
}

}  // namespace attn
