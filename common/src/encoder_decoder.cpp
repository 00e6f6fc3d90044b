// The encoder–decoder of encoder_decoder.hpp: parameters in one flat buffer, the forward
// and backward passes as scripts of gpt_layers.hpp's and cross_attention.hpp's functions,
// greedy decoding with cached keys and values, and its checkpoints.
#include "attn/encoder_decoder.hpp"

#include "attn/checkpoint.hpp"  // CheckpointError
#include "attn/gpt_layers.hpp"
#include "attn/npy.hpp"
#include "attn/tensor.hpp"

#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>

namespace attn {

namespace {
using std::size_t;
namespace fs = std::filesystem;

// The calling thread's slice [begin, end) of B sequences, as the GPT splits its batches.
int slice_begin(int B) { return B * omp_get_thread_num() / omp_get_num_threads(); }
int slice_end(int B) { return B * (omp_get_thread_num() + 1) / omp_get_num_threads(); }

// The slice of a (B, …) buffer that starts at sequence b0, `per` floats per sequence.
float* rows(std::vector<float>& v, int b0, size_t per) { return v.data() + static_cast<size_t>(b0) * per; }
const float* rows(const std::vector<float>& v, int b0, size_t per) {
    return v.data() + static_cast<size_t>(b0) * per;
}
void zero(float* p, size_t n) { std::fill(p, p + n, 0.0f); }

}  // namespace

// ---------------------------------------------------------------------------------------
// The vocabulary and batches

std::vector<int> Seq2SeqVocab::encode(const std::string& text) const {
    std::vector<int> ids = chars_.encode(text);
    for (int& id : ids) id += first_char;
    return ids;
}

std::string Seq2SeqVocab::decode(const std::vector<int>& ids) const {
    std::vector<int> chars;
    for (int id : ids) {
        require(id >= 0 && id < size(), "Seq2SeqVocab: id " + std::to_string(id) +
                                            " is outside the vocabulary [0, " + std::to_string(size()) + ")");
        if (id == eos) break;
        if (id >= first_char) chars.push_back(id - first_char);
    }
    return chars_.decode(chars);
}

std::string Seq2SeqVocab::token(int id) const {
    require(id >= 0 && id < size(), "Seq2SeqVocab: id " + std::to_string(id) +
                                        " is outside the vocabulary [0, " + std::to_string(size()) + ")");
    if (id == pad) return "<pad>";
    if (id == bos) return "<bos>";
    if (id == eos) return "<eos>";
    return chars_.at(id - first_char);
}

Seq2SeqBatch make_batch(const std::vector<std::vector<int>>& sources,
                        const std::vector<std::vector<int>>& targets) {
    require(!sources.empty(), "make_batch: no sequences");
    require(targets.empty() || targets.size() == sources.size(),
            "make_batch: " + std::to_string(sources.size()) + " sources but " +
                std::to_string(targets.size()) + " targets");
    Seq2SeqBatch b;
    b.B = static_cast<int>(sources.size());
    b.S = 1;  // at least one column, even when every source is empty (all padding)
    for (const auto& s : sources) b.S = std::max(b.S, static_cast<int>(s.size()));
    b.T = 1;
    for (const auto& t : targets) b.T = std::max(b.T, static_cast<int>(t.size()) + 1);
    b.source.assign(static_cast<size_t>(b.B) * b.S, Seq2SeqVocab::pad);
    b.target_in.assign(static_cast<size_t>(b.B) * b.T, Seq2SeqVocab::pad);
    b.target_out.assign(static_cast<size_t>(b.B) * b.T, Seq2SeqVocab::pad);
    for (int i = 0; i < b.B; ++i) {
        const auto& s = sources[static_cast<size_t>(i)];
        std::copy(s.begin(), s.end(), b.source.begin() + static_cast<long>(i) * b.S);
        b.source_lengths.push_back(static_cast<int>(s.size()));
        int* in = b.target_in.data() + static_cast<size_t>(i) * b.T;
        int* out = b.target_out.data() + static_cast<size_t>(i) * b.T;
        in[0] = Seq2SeqVocab::bos;
        if (targets.empty()) {
            b.target_lengths.push_back(1);
            continue;
        }
        const auto& t = targets[static_cast<size_t>(i)];
        // the decoder reads bos t0 t1 … and predicts t0 t1 … eos
        for (size_t j = 0; j < t.size(); ++j) {
            in[j + 1] = t[j];
            out[j] = t[j];
        }
        out[t.size()] = Seq2SeqVocab::eos;
        b.target_lengths.push_back(static_cast<int>(t.size()) + 1);
    }
    return b;
}

// ---------------------------------------------------------------------------------------
// The model's sizes and parameters

void EncoderDecoderConfig::validate() const {
    auto positive = [](int v, const char* name) {
        require(v >= 1, std::string("encoder-decoder config: ") + name + " must be at least 1, got " +
                            std::to_string(v));
    };
    positive(vocab_size, "vocab_size");
    positive(max_source, "max_source");
    positive(max_target, "max_target");
    positive(n_encoder_layer, "n_encoder_layer");
    positive(n_decoder_layer, "n_decoder_layer");
    positive(n_head, "n_head");
    positive(n_embd, "n_embd");
    require(n_embd % n_head == 0, "encoder-decoder config: n_head = " + std::to_string(n_head) +
                                      " must divide n_embd = " + std::to_string(n_embd));
}

namespace {

// Lists every parameter (PyTorch's name and shape, in state_dict order) and, given the flat
// buffer's start, points `p` at each. Both the table and the pointers come from this one
// walk, so they cannot disagree.
std::vector<ParameterInfo> walk_parameters(const EncoderDecoderConfig& c, float* base,
                                           EncoderDecoderParams* p) {
    const size_t V = static_cast<size_t>(c.vocab_size), C = static_cast<size_t>(c.n_embd);
    std::vector<ParameterInfo> table;
    size_t offset = 0;
    auto add = [&](const std::string& name, std::vector<size_t> shape) -> float* {
        size_t n = 1;
        for (size_t d : shape) n *= d;
        // nanoGPT's rule: matrices decay, vectors (biases, norms) do not
        const bool decay = shape.size() >= 2;
        table.push_back({name, shape, offset, n, decay});
        float* at = base ? base + offset : nullptr;
        offset += n;
        return at;
    };
    auto block = [&](const std::string& prefix, EncoderLayerParams& e, DecoderLayerParams* d) {
        // state_dict order of nn.TransformerEncoderLayer / nn.TransformerDecoderLayer
        e.in_proj_w = add(prefix + "self_attn.in_proj_weight", {3 * C, C});
        e.in_proj_b = add(prefix + "self_attn.in_proj_bias", {3 * C});
        e.out_proj_w = add(prefix + "self_attn.out_proj.weight", {C, C});
        e.out_proj_b = add(prefix + "self_attn.out_proj.bias", {C});
        if (d) {
            d->cross_in_proj_w = add(prefix + "multihead_attn.in_proj_weight", {3 * C, C});
            d->cross_in_proj_b = add(prefix + "multihead_attn.in_proj_bias", {3 * C});
            d->cross_out_proj_w = add(prefix + "multihead_attn.out_proj.weight", {C, C});
            d->cross_out_proj_b = add(prefix + "multihead_attn.out_proj.bias", {C});
        }
        e.linear1_w = add(prefix + "linear1.weight", {4 * C, C});
        e.linear1_b = add(prefix + "linear1.bias", {4 * C});
        e.linear2_w = add(prefix + "linear2.weight", {C, 4 * C});
        e.linear2_b = add(prefix + "linear2.bias", {C});
        e.norm1_w = add(prefix + "norm1.weight", {C});
        e.norm1_b = add(prefix + "norm1.bias", {C});
        e.norm2_w = add(prefix + "norm2.weight", {C});
        e.norm2_b = add(prefix + "norm2.bias", {C});
        if (d) {
            d->norm3_w = add(prefix + "norm3.weight", {C});
            d->norm3_b = add(prefix + "norm3.bias", {C});
        }
    };
    EncoderDecoderParams q;
    q.embedding = add("embedding.weight", {V, C});
    q.source_position = add("source_position.weight", {static_cast<size_t>(c.max_source), C});
    q.target_position = add("target_position.weight", {static_cast<size_t>(c.max_target), C});
    q.encoder.resize(static_cast<size_t>(c.n_encoder_layer));
    for (int l = 0; l < c.n_encoder_layer; ++l)
        block("transformer.encoder.layers." + std::to_string(l) + ".", q.encoder[static_cast<size_t>(l)], nullptr);
    q.encoder_norm_w = add("transformer.encoder.norm.weight", {C});
    q.encoder_norm_b = add("transformer.encoder.norm.bias", {C});
    q.decoder.resize(static_cast<size_t>(c.n_decoder_layer));
    for (int l = 0; l < c.n_decoder_layer; ++l) {
        DecoderLayerParams& d = q.decoder[static_cast<size_t>(l)];
        block("transformer.decoder.layers." + std::to_string(l) + ".", d.self, &d);
    }
    q.decoder_norm_w = add("transformer.decoder.norm.weight", {C});
    q.decoder_norm_b = add("transformer.decoder.norm.bias", {C});
    if (p) *p = q;
    return table;
}

// The same pointers, moved from one flat buffer to another of the same layout.
EncoderDecoderParams shifted(const EncoderDecoderParams& p, const float* from, float* to) {
    auto move = [&](float* x) { return x ? to + (x - from) : nullptr; };
    auto move_block = [&](EncoderLayerParams e) {
        for (float** f : {&e.norm1_w, &e.norm1_b, &e.in_proj_w, &e.in_proj_b, &e.out_proj_w,
                          &e.out_proj_b, &e.norm2_w, &e.norm2_b, &e.linear1_w, &e.linear1_b,
                          &e.linear2_w, &e.linear2_b})
            *f = move(*f);
        return e;
    };
    EncoderDecoderParams q = p;
    for (float** f : {&q.embedding, &q.source_position, &q.target_position, &q.encoder_norm_w,
                      &q.encoder_norm_b, &q.decoder_norm_w, &q.decoder_norm_b})
        *f = move(*f);
    for (EncoderLayerParams& e : q.encoder) e = move_block(e);
    for (DecoderLayerParams& d : q.decoder) {
        d.self = move_block(d.self);
        for (float** f : {&d.norm3_w, &d.norm3_b, &d.cross_in_proj_w, &d.cross_in_proj_b,
                          &d.cross_out_proj_w, &d.cross_out_proj_b})
            *f = move(*f);
    }
    return q;
}

}  // namespace

std::size_t EncoderDecoderConfig::num_parameters() const {
    const std::vector<ParameterInfo> table = walk_parameters(*this, nullptr, nullptr);
    return table.back().offset + table.back().size;
}

EncoderDecoder::EncoderDecoder(const EncoderDecoderConfig& config, std::uint64_t seed)
    : config_(config) {
    config_.validate();
    table_ = walk_parameters(config_, nullptr, nullptr);
    const size_t n = table_.back().offset + table_.back().size;
    params_.assign(n, 0.0f);
    grads_.assign(n, 0.0f);
    walk_parameters(config_, params_.data(), &p_);
    walk_parameters(config_, grads_.data(), &g_);
    // the GPT's initialisation: N(0, 0.02); the projections that write into the residual
    // stream (out_proj, linear2) scaled by 1/√(2·layers); biases 0, norm weights 1
    Rng rng(seed);
    const float residual_std =
        0.02f / std::sqrt(2.0f * static_cast<float>(config_.n_encoder_layer + config_.n_decoder_layer));
    auto ends_with = [](const std::string& s, const std::string& tail) {
        return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (const ParameterInfo& info : table_) {
        float* at = params_.data() + info.offset;
        if (info.name.find("norm") != std::string::npos && ends_with(info.name, ".weight")) {
            std::fill(at, at + info.size, 1.0f);
        } else if (info.shape.size() >= 2) {
            const bool residual = ends_with(info.name, "out_proj.weight") || ends_with(info.name, "linear2.weight");
            const float std = residual ? residual_std : 0.02f;
            for (size_t i = 0; i < info.size; ++i) at[i] = std * rng.normal();
        }
    }
}

void EncoderDecoder::zero_grad() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

const std::vector<float>& EncoderDecoder::attention_weights(int which, int layer) const {
    require(B_ > 0, "attention_weights: the model has not run forward yet");
    require(which >= 0 && which <= 2, "attention_weights: which must be 0 (encoder self-attention), "
                                      "1 (decoder self-attention) or 2 (cross-attention), got " +
                                          std::to_string(which));
    const int layers = which == 0 ? config_.n_encoder_layer : config_.n_decoder_layer;
    require(layer >= 0 && layer < layers, "attention_weights: layer " + std::to_string(layer) +
                                              " is outside [0, " + std::to_string(layers) + ")");
    const BlockActs& a = which == 0 ? enc_[static_cast<size_t>(layer)] : dec_[static_cast<size_t>(layer)];
    return which == 2 ? a.catt : a.att;
}

// ---------------------------------------------------------------------------------------
// The forward pass

void EncoderDecoder::check_batch(const Seq2SeqBatch& b, bool with_loss) const {
    const int V = config_.vocab_size;
    require(b.B >= 1 && b.S >= 1 && b.T >= 1, "encoder-decoder forward: empty batch (B = " +
                                                  std::to_string(b.B) + ", S = " + std::to_string(b.S) +
                                                  ", T = " + std::to_string(b.T) + ")");
    require(b.S <= config_.max_source, "encoder-decoder forward: sources of " + std::to_string(b.S) +
                                           " tokens; this model reads at most max_source = " +
                                           std::to_string(config_.max_source));
    require(b.T <= config_.max_target, "encoder-decoder forward: decoder inputs of " +
                                           std::to_string(b.T) + " tokens; at most max_target = " +
                                           std::to_string(config_.max_target));
    const size_t B = static_cast<size_t>(b.B);
    require(b.source.size() == B * b.S && b.target_in.size() == B * b.T &&
                b.source_lengths.size() == B && b.target_lengths.size() == B &&
                (!with_loss || b.target_out.size() == B * b.T),
            "encoder-decoder forward: the batch's arrays do not have the sizes B, S and T say");
    auto ids_ok = [V](const std::vector<int>& ids) {
        return std::all_of(ids.begin(), ids.end(), [V](int id) { return id >= 0 && id < V; });
    };
    require(ids_ok(b.source) && ids_ok(b.target_in) && (!with_loss || ids_ok(b.target_out)),
            "encoder-decoder forward: a token id outside [0, " + std::to_string(V) + ")");
    for (size_t i = 0; i < B; ++i) {
        require(b.source_lengths[i] >= 0 && b.source_lengths[i] <= b.S,
                "encoder-decoder forward: source " + std::to_string(i) + " has length " +
                    std::to_string(b.source_lengths[i]) + ", outside [0, S = " + std::to_string(b.S) + "]");
        require(b.target_lengths[i] >= 1 && b.target_lengths[i] <= b.T,
                "encoder-decoder forward: target " + std::to_string(i) + " has length " +
                    std::to_string(b.target_lengths[i]) + ", outside [1, T = " + std::to_string(b.T) + "]");
    }
}

void EncoderDecoder::allocate(int B, int S, int T) {
    if (B == B_ && S == S_ && T == T_) return;
    const size_t C = static_cast<size_t>(config_.n_embd), NH = static_cast<size_t>(config_.n_head),
                 V = static_cast<size_t>(config_.vocab_size);
    const size_t BS = static_cast<size_t>(B) * S, BT = static_cast<size_t>(B) * T;
    auto block = [&](BlockActs& a, size_t N, size_t Tq, bool decoder) {
        // N = B·T rows of this stack; Tq its length
        a.ln1.assign(N * C, 0); a.ln1_mean.assign(N, 0); a.ln1_rstd.assign(N, 0);
        a.qkv.assign(N * 3 * C, 0); a.atty.assign(N * C, 0);
        a.att.assign(static_cast<size_t>(B) * NH * Tq * Tq, 0);
        a.attproj.assign(N * C, 0); a.res2.assign(N * C, 0);
        a.ln2.assign(N * C, 0); a.ln2_mean.assign(N, 0); a.ln2_rstd.assign(N, 0);
        a.res3.assign(N * C, 0);
        const size_t mlp_rows = N;
        a.fch.assign(mlp_rows * 4 * C, 0); a.fch_gelu.assign(mlp_rows * 4 * C, 0);
        a.fcproj.assign(mlp_rows * C, 0);
        if (decoder) {
            a.cq.assign(N * C, 0); a.ckv.assign(BS * 2 * C, 0); a.catty.assign(N * C, 0);
            a.catt.assign(static_cast<size_t>(B) * NH * Tq * S, 0); a.cproj.assign(N * C, 0);
            a.ln3.assign(N * C, 0); a.ln3_mean.assign(N, 0); a.ln3_rstd.assign(N, 0);
            a.res4.assign(N * C, 0);
        }
    };
    enc_.assign(static_cast<size_t>(config_.n_encoder_layer), BlockActs{});
    dec_.assign(static_cast<size_t>(config_.n_decoder_layer), BlockActs{});
    for (BlockActs& a : enc_) block(a, BS, static_cast<size_t>(S), false);
    for (BlockActs& a : dec_) block(a, BT, static_cast<size_t>(T), true);
    src_embedded_.assign(BS * C, 0); memory_.assign(BS * C, 0);
    memory_mean_.assign(BS, 0); memory_rstd_.assign(BS, 0);
    tgt_embedded_.assign(BT * C, 0); final_.assign(BT * C, 0);
    final_mean_.assign(BT, 0); final_rstd_.assign(BT, 0);
    logits_.assign(BT * V, 0); probs_.assign(BT * V, 0); losses_.assign(BT, 0);
    const size_t L = static_cast<size_t>(std::max(S, T));
    const size_t longest = static_cast<size_t>(B) * L;  // rows of the scratch both stacks use
    Scratch& s = scratch_;
    s.dlogits.assign(BT * V, 0); s.dfinal.assign(BT * C, 0); s.ddec.assign(BT * C, 0);
    s.denc.assign(BS * C, 0); s.dmemory.assign(BS * C, 0);
    s.dln.assign(longest * C, 0); s.dqkv.assign(longest * 3 * C, 0); s.datty.assign(longest * C, 0);
    s.dfch.assign(longest * 4 * C, 0); s.dfch_gelu.assign(longest * 4 * C, 0);
    s.datt.assign(static_cast<size_t>(B) * NH * L * L, 0);
    s.dcq.assign(BT * C, 0); s.dckv.assign(BS * 2 * C, 0);
    B_ = B; S_ = S; T_ = T;
}

float EncoderDecoder::forward(const Seq2SeqBatch& batch, bool with_loss) {
    check_batch(batch, with_loss);
    allocate(batch.B, batch.S, batch.T);
    batch_ = batch;
    has_loss_ = with_loss;
    real_targets_ = 0;
    for (int len : batch.target_lengths) real_targets_ += len;
    const int B = batch.B;
    // Each thread runs the whole pass on its own slice of the sequences.
    const int slices = std::min(B, omp_get_max_threads());
#pragma omp parallel num_threads(slices)
    {
        const int b0 = slice_begin(B), b1 = slice_end(B);
        if (b1 > b0) forward_slice(b0, b1 - b0);
    }
    if (!with_loss) return std::numeric_limits<float>::quiet_NaN();
    // the mean over the real target positions, summed in order whatever the slices were
    double total = 0.0;
    for (float l : losses_) total += l;
    return static_cast<float>(total / real_targets_);
}

void EncoderDecoder::forward_slice(int b0, int nb) {
    const int S = S_, T = T_, C = config_.n_embd, NH = config_.n_head, V = config_.vocab_size;
    const size_t SC = static_cast<size_t>(S) * C, TC = static_cast<size_t>(T) * C;
    const int NS = nb * S, NT = nb * T;  // rows of the slice in each stack
    const int* src_len = batch_.source_lengths.data() + b0;
    const int* tgt_len = batch_.target_lengths.data() + b0;

    // The encoder: token + position embeddings, then Le layers of bidirectional
    // self-attention whose keys are masked by the source lengths, then its final norm.
    encoder_forward(rows(src_embedded_, b0, SC), batch_.source.data() + static_cast<size_t>(b0) * S,
                    p_.embedding, p_.source_position, nb, S, C);
    const float* x = rows(src_embedded_, b0, SC);  // (nb, S, C) the residual stream
    for (size_t l = 0; l < enc_.size(); ++l) {
        BlockActs& a = enc_[l];
        const EncoderLayerParams& w = p_.encoder[l];
        float* ln1 = rows(a.ln1, b0, SC);
        float* qkv = rows(a.qkv, b0, 3 * SC);
        layernorm_forward(ln1, rows(a.ln1_mean, b0, S), rows(a.ln1_rstd, b0, S), x, w.norm1_w,
                          w.norm1_b, nb, S, C);
        matmul_forward(qkv, ln1, w.in_proj_w, w.in_proj_b, NS, C, 3 * C);
        masked_attention_forward(rows(a.atty, b0, SC),
                                 rows(a.att, b0, static_cast<size_t>(NH) * S * S),
                                 {qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C}, {src_len, false},
                                 nb, S, S, C, NH);
        matmul_forward(rows(a.attproj, b0, SC), rows(a.atty, b0, SC), w.out_proj_w, w.out_proj_b, NS, C, C);
        residual_forward(rows(a.res2, b0, SC), x, rows(a.attproj, b0, SC), NS * C);
        layernorm_forward(rows(a.ln2, b0, SC), rows(a.ln2_mean, b0, S), rows(a.ln2_rstd, b0, S),
                          rows(a.res2, b0, SC), w.norm2_w, w.norm2_b, nb, S, C);
        matmul_forward(rows(a.fch, b0, 4 * SC), rows(a.ln2, b0, SC), w.linear1_w, w.linear1_b, NS, C, 4 * C);
        gelu_forward(rows(a.fch_gelu, b0, 4 * SC), rows(a.fch, b0, 4 * SC), NS * 4 * C);
        matmul_forward(rows(a.fcproj, b0, SC), rows(a.fch_gelu, b0, 4 * SC), w.linear2_w, w.linear2_b, NS, 4 * C, C);
        residual_forward(rows(a.res3, b0, SC), rows(a.res2, b0, SC), rows(a.fcproj, b0, SC), NS * C);
        x = rows(a.res3, b0, SC);
    }
    float* memory = rows(memory_, b0, SC);  // (nb, S, C) what cross-attention reads
    layernorm_forward(memory, rows(memory_mean_, b0, S), rows(memory_rstd_, b0, S), x,
                      p_.encoder_norm_w, p_.encoder_norm_b, nb, S, C);

    // The decoder: causal self-attention, cross-attention to the memory (keys masked by the
    // source lengths: the encoder's padded positions are not part of the input), MLP.
    encoder_forward(rows(tgt_embedded_, b0, TC), batch_.target_in.data() + static_cast<size_t>(b0) * T,
                    p_.embedding, p_.target_position, nb, T, C);
    const float* y = rows(tgt_embedded_, b0, TC);  // (nb, T, C)
    for (size_t l = 0; l < dec_.size(); ++l) {
        BlockActs& a = dec_[l];
        const DecoderLayerParams& d = p_.decoder[l];
        const EncoderLayerParams& w = d.self;
        float* ln1 = rows(a.ln1, b0, TC);
        float* qkv = rows(a.qkv, b0, 3 * TC);
        layernorm_forward(ln1, rows(a.ln1_mean, b0, T), rows(a.ln1_rstd, b0, T), y, w.norm1_w,
                          w.norm1_b, nb, T, C);
        matmul_forward(qkv, ln1, w.in_proj_w, w.in_proj_b, NT, C, 3 * C);
        // T_q = T_k here, so the causal mask needs no alignment
        masked_attention_forward(rows(a.atty, b0, TC), rows(a.att, b0, static_cast<size_t>(NH) * T * T),
                                 {qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C}, {tgt_len, true},
                                 nb, T, T, C, NH);
        matmul_forward(rows(a.attproj, b0, TC), rows(a.atty, b0, TC), w.out_proj_w, w.out_proj_b, NT, C, C);
        residual_forward(rows(a.res2, b0, TC), y, rows(a.attproj, b0, TC), NT * C);
        // cross-attention: q from the decoder (rows [0, C) of in_proj), k and v from the
        // memory (rows [C, 3C)), T_q = T queries over T_k = S keys
        float* ln2 = rows(a.ln2, b0, TC);
        float* cq = rows(a.cq, b0, TC);
        float* ckv = rows(a.ckv, b0, 2 * SC);
        layernorm_forward(ln2, rows(a.ln2_mean, b0, T), rows(a.ln2_rstd, b0, T),
                          rows(a.res2, b0, TC), w.norm2_w, w.norm2_b, nb, T, C);
        matmul_forward(cq, ln2, d.cross_in_proj_w, d.cross_in_proj_b, NT, C, C);
        matmul_forward(ckv, memory, d.cross_in_proj_w + static_cast<size_t>(C) * C,
                       d.cross_in_proj_b + C, NS, C, 2 * C);
        masked_attention_forward(rows(a.catty, b0, TC), rows(a.catt, b0, static_cast<size_t>(NH) * T * S),
                                 {cq, ckv, ckv + C, C, 2 * C}, {src_len, false}, nb, T, S, C, NH);
        matmul_forward(rows(a.cproj, b0, TC), rows(a.catty, b0, TC), d.cross_out_proj_w,
                       d.cross_out_proj_b, NT, C, C);
        residual_forward(rows(a.res3, b0, TC), rows(a.res2, b0, TC), rows(a.cproj, b0, TC), NT * C);
        layernorm_forward(rows(a.ln3, b0, TC), rows(a.ln3_mean, b0, T), rows(a.ln3_rstd, b0, T),
                          rows(a.res3, b0, TC), d.norm3_w, d.norm3_b, nb, T, C);
        matmul_forward(rows(a.fch, b0, 4 * TC), rows(a.ln3, b0, TC), w.linear1_w, w.linear1_b, NT, C, 4 * C);
        gelu_forward(rows(a.fch_gelu, b0, 4 * TC), rows(a.fch, b0, 4 * TC), NT * 4 * C);
        matmul_forward(rows(a.fcproj, b0, TC), rows(a.fch_gelu, b0, 4 * TC), w.linear2_w, w.linear2_b, NT, 4 * C, C);
        residual_forward(rows(a.res4, b0, TC), rows(a.res3, b0, TC), rows(a.fcproj, b0, TC), NT * C);
        y = rows(a.res4, b0, TC);
    }
    float* final = rows(final_, b0, TC);
    layernorm_forward(final, rows(final_mean_, b0, T), rows(final_rstd_, b0, T), y,
                      p_.decoder_norm_w, p_.decoder_norm_b, nb, T, C);
    float* logits = rows(logits_, b0, static_cast<size_t>(T) * V);
    matmul_forward(logits, final, p_.embedding, nullptr, NT, C, V);  // tied output layer
    if (!has_loss_) return;
    crossentropy_forward(rows(probs_, b0, static_cast<size_t>(T) * V), rows(losses_, b0, T), logits,
                         batch_.target_out.data() + static_cast<size_t>(b0) * T, nb, T, V);
    // The padded decoder positions have outputs too (every row of the batch is computed),
    // but they are not part of any target: their losses are dropped, so they never reach the
    // mean nor, in the backward pass, the gradients.
    for (int b = 0; b < nb; ++b)
        for (int t = tgt_len[b]; t < T; ++t) losses_[static_cast<size_t>(b0 + b) * T + t] = 0.0f;
}

// ---------------------------------------------------------------------------------------
// The backward pass

void EncoderDecoder::backward() {
    require(B_ > 0 && has_loss_, "EncoderDecoder::backward: needs a forward() with a loss first");
    const int B = B_;
    // as the GPT: the first slice adds into the model's gradients, the others into zeroed
    // buffers of their own, added afterwards in slice order
    const int slices = std::min(B, omp_get_max_threads());
    if (slice_grads_.size() < static_cast<size_t>(slices - 1)) slice_grads_.resize(static_cast<size_t>(slices - 1));
#pragma omp parallel num_threads(slices)
    {
        const int id = omp_get_thread_num(), team = omp_get_num_threads();
        const int b0 = slice_begin(B), b1 = slice_end(B);
        if (id == 0) {
            if (b1 > b0) backward_slice(b0, b1 - b0, g_);
        } else {
            std::vector<float>& own = slice_grads_[static_cast<size_t>(id - 1)];
            own.assign(grads_.size(), 0.0f);
            if (b1 > b0) backward_slice(b0, b1 - b0, shifted(g_, grads_.data(), own.data()));
        }
#pragma omp barrier
        float* g = grads_.data();
#pragma omp for schedule(static)
        for (size_t i = 0; i < grads_.size(); ++i)
            for (int s = 0; s < team - 1; ++s) g[i] += slice_grads_[static_cast<size_t>(s)][i];
    }
}

void EncoderDecoder::backward_slice(int b0, int nb, const EncoderDecoderParams& g) {
    const int S = S_, T = T_, C = config_.n_embd, NH = config_.n_head, V = config_.vocab_size;
    const size_t SC = static_cast<size_t>(S) * C, TC = static_cast<size_t>(T) * C;
    const int NS = nb * S, NT = nb * T;
    Scratch& s = scratch_;
    const int* tgt_len = batch_.target_lengths.data() + b0;

    // forward: loss = Σ over real positions of −log softmax(logits)[target] / real_targets;
    // a padded position's loss was dropped, so its logits get no gradient
    float* dlogits = rows(s.dlogits, b0, static_cast<size_t>(T) * V);
    zero(dlogits, static_cast<size_t>(NT) * V);
    for (int b = 0; b < nb; ++b) {
        const size_t row = static_cast<size_t>(b0 + b) * T;
        crossentropy_backward(s.dlogits.data() + row * V, probs_.data() + row * V,
                              batch_.target_out.data() + row, 1, tgt_len[b], V, real_targets_);
    }
    // forward: logits = final · embᵀ (tied)
    float* dfinal = rows(s.dfinal, b0, TC);
    zero(dfinal, static_cast<size_t>(NT) * C);
    matmul_backward(dfinal, g.embedding, nullptr, dlogits, rows(final_, b0, TC), p_.embedding, NT, C, V);
    // forward: final = decoder.norm(y)
    float* ddec = rows(s.ddec, b0, TC);  // (nb, T, C) the gradient of the decoder's stream
    zero(ddec, static_cast<size_t>(NT) * C);
    const float* y_last = dec_.empty() ? rows(tgt_embedded_, b0, TC) : rows(dec_.back().res4, b0, TC);
    layernorm_backward(ddec, g.decoder_norm_w, g.decoder_norm_b, dfinal, y_last, p_.decoder_norm_w,
                       rows(final_mean_, b0, T), rows(final_rstd_, b0, T), nb, T, C);
    float* dmemory = rows(s.dmemory, b0, SC);  // every decoder layer's k and v read the memory
    zero(dmemory, static_cast<size_t>(NS) * C);
    const float* memory = rows(memory_, b0, SC);
    // The scratch that the decoder and then the encoder use: a slice's rows there are laid out
    // for the longer of S and T, so that one thread's decoder rows never overlap another's
    // encoder rows while both run.
    const size_t LC = static_cast<size_t>(std::max(S, T)) * C;
    const size_t att_per = static_cast<size_t>(NH) * std::max(S, T) * std::max(S, T);
    float* dln = rows(s.dln, b0, LC);
    float* datty = rows(s.datty, b0, LC);
    float* dqkv = rows(s.dqkv, b0, 3 * LC);
    float* dfch = rows(s.dfch, b0, 4 * LC);
    float* dfch_gelu = rows(s.dfch_gelu, b0, 4 * LC);
    float* datt = rows(s.datt, b0, att_per);

    // A residual branch's backward: the stream's gradient passes through unchanged, and the
    // branch adds its own into the same buffer (every backward function adds).
    auto mlp_backward = [&](float* dstream, const BlockActs& a, const EncoderLayerParams& w,
                            const EncoderLayerParams& gw, const float* ln_out, const float* ln_in,
                            const float* ln_w, float* gln_w, float* gln_b, const float* mean,
                            const float* rstd, int N, int Tlen, size_t per) {
        // forward: fcproj = linear2(gelu(linear1(ln)))
        zero(dfch_gelu, static_cast<size_t>(N) * 4 * C);
        matmul_backward(dfch_gelu, gw.linear2_w, gw.linear2_b, dstream, rows(a.fch_gelu, b0, 4 * per),
                        w.linear2_w, N, 4 * C, C);
        zero(dfch, static_cast<size_t>(N) * 4 * C);
        gelu_backward(dfch, rows(a.fch, b0, 4 * per), dfch_gelu, N * 4 * C);
        zero(dln, static_cast<size_t>(N) * C);
        matmul_backward(dln, gw.linear1_w, gw.linear1_b, dfch, ln_out, w.linear1_w, N, C, 4 * C);
        layernorm_backward(dstream, gln_w, gln_b, dln, ln_in, ln_w, mean, rstd, nb, Tlen, C);
    };
    auto self_attention_backward = [&](float* dstream, const BlockActs& a, const EncoderLayerParams& w,
                                       const EncoderLayerParams& gw, const float* x_in, int Tlen,
                                       size_t per) {
        const int N = nb * Tlen;
        // forward: attproj = out_proj(atty)
        zero(datty, static_cast<size_t>(N) * C);
        matmul_backward(datty, gw.out_proj_w, gw.out_proj_b, dstream, rows(a.atty, b0, per),
                        w.out_proj_w, N, C, C);
        // forward: atty = attention(q, k, v of qkv), weights in att
        zero(dqkv, static_cast<size_t>(N) * 3 * C);
        const float* qkv = rows(a.qkv, b0, 3 * per);
        masked_attention_backward({dqkv, dqkv + C, dqkv + 2 * C}, datt, datty, {qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C},
                                  rows(a.att, b0, static_cast<size_t>(NH) * Tlen * Tlen), nb, Tlen,
                                  Tlen, C, NH);
        // forward: qkv = in_proj(ln1(x))
        zero(dln, static_cast<size_t>(N) * C);
        matmul_backward(dln, gw.in_proj_w, gw.in_proj_b, dqkv, rows(a.ln1, b0, per), w.in_proj_w, N, C, 3 * C);
        layernorm_backward(dstream, gw.norm1_w, gw.norm1_b, dln, x_in, w.norm1_w,
                           rows(a.ln1_mean, b0, static_cast<size_t>(Tlen)),
                           rows(a.ln1_rstd, b0, static_cast<size_t>(Tlen)), nb, Tlen, C);
    };

    for (size_t l = dec_.size(); l-- > 0;) {
        const BlockActs& a = dec_[l];
        const DecoderLayerParams& d = p_.decoder[l];
        const DecoderLayerParams& gd = g.decoder[l];
        const float* y_in = l == 0 ? rows(tgt_embedded_, b0, TC) : rows(dec_[l - 1].res4, b0, TC);
        // forward: res4 = res3 + mlp(norm3(res3))
        mlp_backward(ddec, a, d.self, gd.self, rows(a.ln3, b0, TC), rows(a.res3, b0, TC), d.norm3_w,
                     gd.norm3_w, gd.norm3_b, rows(a.ln3_mean, b0, T), rows(a.ln3_rstd, b0, T), NT, T, TC);
        // forward: res3 = res2 + cross_out_proj(attention(cq, ckv)), cq = Wq·norm2(res2),
        // ckv = Wkv·memory
        zero(datty, static_cast<size_t>(NT) * C);
        matmul_backward(datty, gd.cross_out_proj_w, gd.cross_out_proj_b, ddec, rows(a.catty, b0, TC),
                        d.cross_out_proj_w, NT, C, C);
        float* dcq = rows(s.dcq, b0, TC);
        float* dckv = rows(s.dckv, b0, 2 * SC);
        zero(dcq, static_cast<size_t>(NT) * C);
        zero(dckv, static_cast<size_t>(NS) * 2 * C);
        const float* cq = rows(a.cq, b0, TC);
        const float* ckv = rows(a.ckv, b0, 2 * SC);
        masked_attention_backward({dcq, dckv, dckv + C}, datt, datty, {cq, ckv, ckv + C, C, 2 * C},
                                  rows(a.catt, b0, static_cast<size_t>(NH) * T * S), nb, T, S, C, NH);
        matmul_backward(dmemory, gd.cross_in_proj_w + static_cast<size_t>(C) * C, gd.cross_in_proj_b + C,
                        dckv, memory, d.cross_in_proj_w + static_cast<size_t>(C) * C, NS, C, 2 * C);
        zero(dln, static_cast<size_t>(NT) * C);
        matmul_backward(dln, gd.cross_in_proj_w, gd.cross_in_proj_b, dcq, rows(a.ln2, b0, TC),
                        d.cross_in_proj_w, NT, C, C);
        layernorm_backward(ddec, gd.self.norm2_w, gd.self.norm2_b, dln, rows(a.res2, b0, TC),
                           d.self.norm2_w, rows(a.ln2_mean, b0, T), rows(a.ln2_rstd, b0, T), nb, T, C);
        // forward: res2 = y + out_proj(causal self-attention(norm1(y)))
        self_attention_backward(ddec, a, d.self, gd.self, y_in, T, TC);
    }
    // forward: y0 = emb[target_in] + target_position
    encoder_backward(g.embedding, g.target_position, ddec,
                     batch_.target_in.data() + static_cast<size_t>(b0) * T, nb, T, C);

    // forward: memory = encoder.norm(x_last)
    float* denc = rows(s.denc, b0, SC);
    zero(denc, static_cast<size_t>(NS) * C);
    const float* x_last = enc_.empty() ? rows(src_embedded_, b0, SC) : rows(enc_.back().res3, b0, SC);
    layernorm_backward(denc, g.encoder_norm_w, g.encoder_norm_b, dmemory, x_last, p_.encoder_norm_w,
                       rows(memory_mean_, b0, S), rows(memory_rstd_, b0, S), nb, S, C);
    for (size_t l = enc_.size(); l-- > 0;) {
        const BlockActs& a = enc_[l];
        const EncoderLayerParams& w = p_.encoder[l];
        const EncoderLayerParams& gw = g.encoder[l];
        const float* x_in = l == 0 ? rows(src_embedded_, b0, SC) : rows(enc_[l - 1].res3, b0, SC);
        // forward: res3 = res2 + mlp(norm2(res2))
        mlp_backward(denc, a, w, gw, rows(a.ln2, b0, SC), rows(a.res2, b0, SC), w.norm2_w, gw.norm2_w,
                     gw.norm2_b, rows(a.ln2_mean, b0, S), rows(a.ln2_rstd, b0, S), NS, S, SC);
        // forward: res2 = x + out_proj(self-attention(norm1(x)), keys masked by the lengths)
        self_attention_backward(denc, a, w, gw, x_in, S, SC);
    }
    // forward: x0 = emb[source] + source_position
    encoder_backward(g.embedding, g.source_position, denc,
                     batch_.source.data() + static_cast<size_t>(b0) * S, nb, S, C);
}

// ---------------------------------------------------------------------------------------
// Greedy decoding

namespace {
int argmax(const float* x, int n) {
    return static_cast<int>(std::max_element(x, x + n) - x);
}
}  // namespace

std::vector<std::vector<int>> EncoderDecoder::greedy_decode(const std::vector<std::vector<int>>& sources,
                                                            int max_length, CausalAlignment step) {
    require(max_length >= 1 && max_length <= config_.max_target,
            "greedy_decode: max_length " + std::to_string(max_length) + " is outside [1, max_target = " +
                std::to_string(config_.max_target) + "]");
    // The encoder, once: a forward pass with the decoder reading bos alone leaves the memory.
    forward(make_batch(sources, {}), false);
    const int B = B_, S = S_, C = config_.n_embd, NH = config_.n_head, V = config_.vocab_size;
    const size_t BC = static_cast<size_t>(B) * C, Ld = dec_.size();
    const std::vector<int> src_len = batch_.source_lengths;
    // Each decoder layer's cross-attention keys and values, (B, S, 2C): computed once here,
    // read by every step.
    std::vector<std::vector<float>> cross_kv(Ld);
    for (size_t l = 0; l < Ld; ++l) {
        const DecoderLayerParams& d = p_.decoder[l];
        cross_kv[l].assign(static_cast<size_t>(B) * S * 2 * C, 0.0f);
        matmul_forward(cross_kv[l].data(), memory_.data(), d.cross_in_proj_w + static_cast<size_t>(C) * C,
                       d.cross_in_proj_b + C, B * S, C, 2 * C);
    }
    // The self-attention cache, (B, max_length, 2C) per layer: k and v of every position so far.
    std::vector<std::vector<float>> cache(Ld, std::vector<float>(static_cast<size_t>(B) * max_length * 2 * C));
    std::vector<float> x(BC), ln(BC), qkv(BC * 3), atty(BC), proj(BC), cq(BC), fch(BC * 4),
        fch_gelu(BC * 4), mean(static_cast<size_t>(B)), rstd(static_cast<size_t>(B)),
        logits(static_cast<size_t>(B) * V);
    std::vector<float> att(static_cast<size_t>(NH) * max_length), catt(static_cast<size_t>(B) * NH * S);
    std::vector<int> token(static_cast<size_t>(B), Seq2SeqVocab::bos);
    std::vector<std::vector<int>> out(static_cast<size_t>(B));
    std::vector<bool> done(static_cast<size_t>(B), false);
    int running = B;
    for (int t = 0; t < max_length && running > 0; ++t) {
        // x (B, 1, C) = emb[token] + target_position[t]
        encoder_forward(x.data(), token.data(), p_.embedding, p_.target_position + static_cast<size_t>(t) * C,
                        B, 1, C);
        for (size_t l = 0; l < Ld; ++l) {
            const DecoderLayerParams& d = p_.decoder[l];
            const EncoderLayerParams& w = d.self;
            layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), w.norm1_w, w.norm1_b, B, 1, C);
            matmul_forward(qkv.data(), ln.data(), w.in_proj_w, w.in_proj_b, B, C, 3 * C);
            // one query against the t + 1 cached positions: T_q = 1, T_k = t + 1
            for (int b = 0; b < B; ++b) {
                float* kv = cache[l].data() + static_cast<size_t>(b) * max_length * 2 * C;  // (max_length, 2C)
                const float* row = qkv.data() + static_cast<size_t>(b) * 3 * C;
                std::copy(row + C, row + 3 * C, kv + static_cast<size_t>(t) * 2 * C);
                masked_attention_forward(atty.data() + static_cast<size_t>(b) * C, att.data(),
                                         {row, kv, kv + C, 3 * C, 2 * C}, {nullptr, true, step}, 1, 1,
                                         t + 1, C, NH);
            }
            matmul_forward(proj.data(), atty.data(), w.out_proj_w, w.out_proj_b, B, C, C);
            residual_forward(x.data(), x.data(), proj.data(), static_cast<int>(BC));
            layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), w.norm2_w, w.norm2_b, B, 1, C);
            matmul_forward(cq.data(), ln.data(), d.cross_in_proj_w, d.cross_in_proj_b, B, C, C);
            const float* ckv = cross_kv[l].data();
            masked_attention_forward(atty.data(), catt.data(), {cq.data(), ckv, ckv + C, C, 2 * C},
                                     {src_len.data(), false}, B, 1, S, C, NH);
            matmul_forward(proj.data(), atty.data(), d.cross_out_proj_w, d.cross_out_proj_b, B, C, C);
            residual_forward(x.data(), x.data(), proj.data(), static_cast<int>(BC));
            layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), d.norm3_w, d.norm3_b, B, 1, C);
            matmul_forward(fch.data(), ln.data(), w.linear1_w, w.linear1_b, B, C, 4 * C);
            gelu_forward(fch_gelu.data(), fch.data(), static_cast<int>(BC) * 4);
            matmul_forward(proj.data(), fch_gelu.data(), w.linear2_w, w.linear2_b, B, 4 * C, C);
            residual_forward(x.data(), x.data(), proj.data(), static_cast<int>(BC));
        }
        layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), p_.decoder_norm_w,
                          p_.decoder_norm_b, B, 1, C);
        matmul_forward(logits.data(), ln.data(), p_.embedding, nullptr, B, C, V);
        for (int b = 0; b < B; ++b) {
            const size_t bi = static_cast<size_t>(b);
            if (done[bi]) continue;
            token[bi] = argmax(logits.data() + bi * V, V);
            if (token[bi] == Seq2SeqVocab::eos) {
                done[bi] = true;
                --running;
            } else {
                out[bi].push_back(token[bi]);
            }
        }
    }
    return out;
}

std::vector<std::vector<int>> EncoderDecoder::greedy_decode_uncached(
    const std::vector<std::vector<int>>& sources, int max_length) {
    require(max_length >= 1 && max_length <= config_.max_target,
            "greedy_decode_uncached: max_length " + std::to_string(max_length) +
                " is outside [1, max_target = " + std::to_string(config_.max_target) + "]");
    const size_t B = sources.size();
    const int V = config_.vocab_size;
    std::vector<std::vector<int>> out(B);
    std::vector<bool> done(B, false);
    size_t running = B;
    for (int t = 0; t < max_length && running > 0; ++t) {
        // the whole model on bos + the tokens so far; the prediction is at position t
        // (a finished sequence's shorter prefix is padded and its prediction ignored)
        forward(make_batch(sources, out), false);
        for (size_t b = 0; b < B; ++b) {
            if (done[b]) continue;
            const int next = argmax(logits_.data() + (b * static_cast<size_t>(T_) + static_cast<size_t>(t)) * V, V);
            if (next == Seq2SeqVocab::eos) {
                done[b] = true;
                --running;
            } else {
                out[b].push_back(next);
            }
        }
    }
    return out;
}

// ---------------------------------------------------------------------------------------
// Checkpoints

namespace {
using json = nlohmann::json;
constexpr const char* model_kind = "encoder_decoder";

json read_config_json(const fs::path& dir) {
    const fs::path file = dir / "config.json";
    std::ifstream in(file);
    if (!in) throw CheckpointError(file.string() + ": cannot open (is this a weights directory?)");
    try {
        json j = json::parse(in);
        if (!j.is_object()) throw CheckpointError(file.string() + ": expected a JSON object");
        return j;
    } catch (const json::exception& e) {
        throw CheckpointError(file.string() + ": not valid JSON: " + e.what());
    }
}
}  // namespace

void save_encoder_decoder(const fs::path& dir, const EncoderDecoder& model, const Seq2SeqVocab& vocab,
                          std::int64_t step) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw CheckpointError(dir.string() + ": cannot create the directory: " + ec.message());
    const EncoderDecoderConfig& c = model.config();
    const json j = {{"model", model_kind},
                    {"vocab_size", c.vocab_size},
                    {"max_source", c.max_source},
                    {"max_target", c.max_target},
                    {"n_encoder_layer", c.n_encoder_layer},
                    {"n_decoder_layer", c.n_decoder_layer},
                    {"n_head", c.n_head},
                    {"n_embd", c.n_embd},
                    {"special_tokens", {"<pad>", "<bos>", "<eos>"}},
                    {"vocab", vocab.chars().chars()},
                    {"step", step}};
    const fs::path file = dir / "config.json";
    std::ofstream out(file);
    out << j.dump(2) << "\n";
    if (!out) throw CheckpointError(file.string() + ": cannot write");
    out.close();
    try {
        for (const ParameterInfo& p : model.parameter_table())
            write_npy(dir / (p.name + ".npy"), p.shape, model.parameters().data() + p.offset);
    } catch (const NpyError& e) {
        throw CheckpointError(e.what());
    }
}

bool is_encoder_decoder_checkpoint(const fs::path& dir) {
    try {
        const json j = read_config_json(dir);
        return j.contains("model") && j["model"] == model_kind;
    } catch (const CheckpointError&) {
        return false;
    }
}

EncoderDecoder load_encoder_decoder(const fs::path& dir, Seq2SeqVocab& vocab, std::int64_t* step) {
    const json j = read_config_json(dir);
    const fs::path file = dir / "config.json";
    auto field = [&](const char* key) -> const json& {
        if (!j.contains(key)) throw CheckpointError(file.string() + ": missing \"" + key + "\"");
        return j.at(key);
    };
    EncoderDecoderConfig c;
    try {
        if (field("model") != model_kind)
            throw CheckpointError(file.string() + ": \"model\" is " + field("model").dump() +
                                  ", not \"" + model_kind + "\"");
        c.vocab_size = field("vocab_size").get<int>();
        c.max_source = field("max_source").get<int>();
        c.max_target = field("max_target").get<int>();
        c.n_encoder_layer = field("n_encoder_layer").get<int>();
        c.n_decoder_layer = field("n_decoder_layer").get<int>();
        c.n_head = field("n_head").get<int>();
        c.n_embd = field("n_embd").get<int>();
        vocab = Seq2SeqVocab(CharVocab::from_chars(field("vocab").get<std::string>()));
        if (step) *step = j.contains("step") ? j.at("step").get<std::int64_t>() : 0;
        c.validate();
    } catch (const json::exception& e) {
        throw CheckpointError(file.string() + ": a field has the wrong type: " + e.what());
    } catch (const std::invalid_argument& e) {
        throw CheckpointError(file.string() + ": " + e.what());
    }
    if (vocab.size() != c.vocab_size)
        throw CheckpointError(file.string() + ": \"vocab\" holds " + std::to_string(vocab.size() - 3) +
                              " characters + 3 special tokens, but vocab_size is " +
                              std::to_string(c.vocab_size));
    EncoderDecoder model(c);
    for (const ParameterInfo& p : model.parameter_table()) {
        const fs::path npy = dir / (p.name + ".npy");
        NpyArray a;
        try {
            a = read_npy(npy);
        } catch (const NpyError& e) {
            throw CheckpointError(e.what());
        }
        if (a.shape != p.shape)
            throw CheckpointError(npy.string() + ": expected shape " + format_shape(p.shape) + ", got " +
                                  format_shape(a.shape));
        std::copy(a.data.begin(), a.data.end(), model.parameters().begin() + static_cast<long>(p.offset));
    }
    return model;
}

}  // namespace attn
