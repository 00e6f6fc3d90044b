// nanoGPT's GPT: parameter layout, initialisation, forward and backward passes.
#include "attn/gpt.hpp"

#include "attn/gpt_layers.hpp"
#include "attn/tensor.hpp"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace attn {

namespace {
using std::size_t;

// Sets a buffer to n zeros (std::vector reuses its storage when it is large enough).
void resize_zero(std::vector<float>& v, size_t n) { v.assign(n, 0.0f); }

void zero(std::vector<float>& v) { std::fill(v.begin(), v.end(), 0.0f); }

// The calling OpenMP thread's slice [begin, end) of the B sequences of a batch: B split
// into as many nearly equal consecutive parts as there are threads in the team.
int batch_slice_begin(int B) { return B * omp_get_thread_num() / omp_get_num_threads(); }
int batch_slice_end(int B) { return B * (omp_get_thread_num() + 1) / omp_get_num_threads(); }

// The same tensors as `p`, which points into the buffer at `from`, in the buffer at `to`.
ParameterTensors shifted(const ParameterTensors& p, const float* from, float* to) {
    ParameterTensors q = p;
    for (float* ParameterTensors::*m :
         {&ParameterTensors::wte, &ParameterTensors::wpe, &ParameterTensors::ln1w,
          &ParameterTensors::ln1b, &ParameterTensors::qkvw, &ParameterTensors::qkvb,
          &ParameterTensors::attprojw, &ParameterTensors::attprojb, &ParameterTensors::ln2w,
          &ParameterTensors::ln2b, &ParameterTensors::fcw, &ParameterTensors::fcb,
          &ParameterTensors::fcprojw, &ParameterTensors::fcprojb, &ParameterTensors::lnfw,
          &ParameterTensors::lnfb}) {
        if (p.*m) q.*m = to + (p.*m - from);
    }
    return q;
}
}  // namespace

const char* position_name(Position p) {
    switch (p) {
        case Position::rope: return "rope";
        case Position::alibi: return "alibi";
        case Position::learned: break;
    }
    return "learned";
}

Position parse_position(const std::string& name) {
    if (name == "learned") return Position::learned;
    if (name == "rope") return Position::rope;
    if (name == "alibi") return Position::alibi;
    throw std::invalid_argument("unknown position scheme '" + name +
                                "' (the schemes are: learned, rope, alibi)");
}

const char* recompute_name(Recompute r) {
    switch (r) {
        case Recompute::attention: return "attention";
        case Recompute::blocks: return "blocks";
        case Recompute::none: break;
    }
    return "none";
}

Recompute parse_recompute(const std::string& name) {
    if (name == "none") return Recompute::none;
    if (name == "attention") return Recompute::attention;
    if (name == "blocks") return Recompute::blocks;
    throw std::invalid_argument("unknown recomputation '" + name +
                                "' (the modes are: none, attention, blocks)");
}

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
    require(position != Position::rope || (n_embd / n_head) % 2 == 0,
            "GPT config: rope rotates pairs of channels, so the head size n_embd/n_head must be "
            "even, got " + std::to_string(n_embd / n_head));
    require(n_kv_head >= 0 && n_kv_head <= n_head && (n_kv_head == 0 || n_head % n_kv_head == 0),
            "GPT config: the key/value heads n_kv_head must divide n_head = " +
                std::to_string(n_head) + " (each group of n_head/n_kv_head query heads shares "
                "one), got " + std::to_string(n_kv_head));
    require(window >= 0, "GPT config: the attention window must be at least 1 (0: the whole "
                         "context), got " + std::to_string(window));
    require(window == 0 || causal,
            "GPT config: a sliding window is a causal mask; it cannot be used without one");
}

std::size_t GPTConfig::num_parameters() const {
    const size_t V = vocab_size, C = n_embd, L = n_layer, Tb = block_size;
    const size_t QKV = static_cast<size_t>(qkv_channels());  // 3C for multi-head attention
    // ln_1 and ln_2 weights, c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj
    size_t per_layer = C + QKV * C + C * C + C + 4 * C * C + 4 * C * C;
    // with biases: ln_1's and ln_2's too, and each Linear's (a bias-free model has neither)
    if (bias) per_layer += 2 * C + QKV + C + 4 * C + C;
    const size_t wpe = position == Position::learned ? Tb * C : 0;
    return V * C + wpe + L * per_layer + C + (bias ? C : 0);
}

namespace {
// nanoGPT's _init_weights for one tensor: 0 (biases), 1 (LayerNorm weights) or N(0, std²).
struct InitRule {
    enum { zero, one, normal } kind;
    float stddev;
};
InitRule init_rule(const ParameterInfo& p, std::size_t L) {
    const bool is_norm = p.name.find("ln_") != std::string::npos;
    const bool is_bias = p.name.size() >= 5 && p.name.compare(p.name.size() - 5, 5, ".bias") == 0;
    if (is_bias) return {InitRule::zero, 0.0f};
    if (is_norm) return {InitRule::one, 0.0f};
    // the scaled init of the residual projections
    const float std_residual = 0.02f / std::sqrt(2.0f * static_cast<float>(L));
    const bool residual = p.name.find("c_proj.weight") != std::string::npos;
    return {InitRule::normal, residual ? std_residual : 0.02f};
}
}  // namespace

GPT::GPT(const GPTConfig& config, std::uint64_t seed, GPTBuffers buffers)
    : config_(config), init_seed_(seed), dropout_seed_(seed ^ 0x5eed) {
    config_.validate();
    const size_t V = config_.vocab_size, C = config_.n_embd, L = config_.n_layer,
                 Tb = config_.block_size;
    const size_t QKV = static_cast<size_t>(config_.qkv_channels());  // 3C for multi-head
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
        {"transformer.wpe.weight", &ParameterTensors::wpe, {Tb, C},
         config_.position == Position::learned}};
    const std::vector<Kind> per_layer = {
        {"ln_1.weight", &ParameterTensors::ln1w, {C}, true},
        {"ln_1.bias", &ParameterTensors::ln1b, {C}, bias},
        {"attn.c_attn.weight", &ParameterTensors::qkvw, {QKV, C}, true},
        {"attn.c_attn.bias", &ParameterTensors::qkvb, {QKV}, bias},
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
    if (buffers.weights) params_memory_.assign(total, 0.0f);
    if (buffers.gradients) grads_memory_.assign(total, 0.0f);
    for (const Placed& p : placed) {
        if (p.kind->present) whole_layout_.emplace_back(p.kind->member, p.offset);
    }
    if (buffers.weights) params_ = whole_at(params_memory_.data());
    if (buffers.gradients) grads_ = whole_at(grads_memory_.data());
    auto add = [&](const std::string& name, const Kind& k, size_t offset) {
        table_.push_back({name, k.shape, offset, product(k.shape), k.shape.size() >= 2});
    };
    for (size_t i = 0; i < embeddings.size(); ++i) {
        if (embeddings[i].present) add(embeddings[i].suffix, embeddings[i], placed[i].offset);
    }
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

    // nanoGPT's _init_weights, then the scaled init of the residual projections: one random
    // stream drawn tensor after tensor in the table's order (initial_values skips into it).
    Rng rng(seed);
    for (const ParameterInfo& p : table_) {
        if (!buffers.weights) break;  // initial_values() gives a shard of them
        float* w = params_memory_.data() + p.offset;
        const InitRule rule = init_rule(p, L);
        if (rule.kind == InitRule::zero) continue;  // already 0
        if (rule.kind == InitRule::one) {
            std::fill(w, w + p.size, 1.0f);
            continue;
        }
        for (size_t i = 0; i < p.size; ++i) w[i] = rule.stddev * rng.normal();
    }
    if (config_.position == Position::alibi) alibi_slopes_ = alibi_slopes(config_.n_head);

    // The gradient buckets, in the order backward() completes them: the blocks from the
    // last to the first, then everything outside the blocks.
    buckets_.resize(L + 1);
    for (size_t l = 0; l < L; ++l) buckets_[l].name = "transformer.h." + std::to_string(L - 1 - l);
    buckets_[L].name = "embeddings and ln_f";
    for (const ParameterInfo& p : table_) {
        const std::string prefix = "transformer.h.";
        size_t bucket = L;
        if (p.name.compare(0, prefix.size(), prefix) == 0) {
            bucket = L - 1 - std::stoul(p.name.substr(prefix.size()));
        }
        buckets_[bucket].ranges.emplace_back(p.offset, p.size);
        buckets_[bucket].size += p.size;
    }
    // Where each tensor lies in a bucket's buffer of set_gradient_sink(): its ranges one after
    // the other, in the table's order (every block's are laid out alike).
    for (const Kind& k : per_layer) {
        if (!k.present) continue;
        block_layout_.emplace_back(k.member, block_floats_);
        block_floats_ += product(k.shape);
    }
    for (const std::vector<Kind>* kinds : {&embeddings, &final_norm}) {
        for (const Kind& k : *kinds) {
            if (!k.present) continue;
            rest_layout_.emplace_back(k.member, rest_floats_);
            rest_floats_ += product(k.shape);
        }
    }
}

std::vector<float> GPT::initial_values(const std::vector<std::pair<std::size_t, std::size_t>>& runs) const {
    const std::size_t L = static_cast<std::size_t>(config_.n_layer);
    // The normals the constructor draws before each tensor (in the table's order), and the
    // tensors by offset (the table's order is not the buffer's).
    std::vector<std::size_t> normals_before(table_.size()), by_offset(table_.size());
    std::size_t drawn = 0;
    for (std::size_t i = 0; i < table_.size(); ++i) {
        normals_before[i] = drawn;
        if (init_rule(table_[i], L).kind == InitRule::normal) drawn += table_[i].size;
        by_offset[i] = i;
    }
    std::sort(by_offset.begin(), by_offset.end(),
              [this](std::size_t a, std::size_t b) { return table_[a].offset < table_[b].offset; });
    std::size_t total = 0;
    for (const auto& [offset, size] : runs) total += size;
    std::vector<float> out;
    out.reserve(total);
    for (const auto& [offset, size] : runs) {
        require(offset + size <= config_.num_parameters() && offset + size >= offset,
                "GPT::initial_values: a run outside the parameters");
        std::size_t a = offset;
        const std::size_t end = offset + size;
        while (a < end) {
            // The tensor that holds parameter a: the last one starting at or before it.
            const auto it = std::upper_bound(by_offset.begin(), by_offset.end(), a,
                                             [this](std::size_t x, std::size_t i) { return x < table_[i].offset; });
            const std::size_t t = *(it - 1);
            const ParameterInfo& p = table_[t];
            const std::size_t b = std::min(end, p.offset + p.size);
            const InitRule rule = init_rule(p, L);
            if (rule.kind != InitRule::normal) {
                out.insert(out.end(), b - a, rule.kind == InitRule::one ? 1.0f : 0.0f);
            } else {
                //! [initial_values]
                // normal() draws two at a time from two words: normal q is the pair q/2's
                // first (cosine) or second (sine).
                const std::size_t q = normals_before[t] + (a - p.offset);
                Rng rng(init_seed_);
                rng.advance(2 * static_cast<std::uint64_t>(q / 2));
                if (q % 2) rng.normal();
                for (std::size_t i = a; i < b; ++i) out.push_back(rule.stddev * rng.normal());
                //! [initial_values]
            }
            a = b;
        }
    }
    return out;
}

void GPT::set_kept_weights(std::vector<std::pair<std::size_t, std::size_t>> runs, std::vector<float> values) {
    std::size_t n = 0;
    for (const auto& r : runs) n += r.second;
    require(n == values.size(), "GPT::set_kept_weights: " + std::to_string(values.size()) + " values for runs of " +
                                    std::to_string(n));
    kept_runs_ = std::move(runs);
    kept_values_ = std::move(values);
}

std::vector<float> GPT::take_kept_weights(const std::vector<std::pair<std::size_t, std::size_t>>& runs) {
    if (!kept_values_.empty() && kept_runs_ == runs) {
        std::vector<float> values = std::move(kept_values_);
        std::vector<float>().swap(kept_values_);
        kept_runs_.clear();
        return values;
    }
    return initial_values(runs);
}

void GPT::set_gradient_ready_hook(std::function<void(int bucket)> ready) {
    require(!(ready && sink_), "GPT::set_gradient_ready_hook: a gradient sink is set (set_gradient_sink), "
                               "which hands every bucket over itself");
    gradient_ready_ = std::move(ready);
}

void GPT::set_gradient_sink(std::function<void(int bucket, float* gradients)> sink) {
    require(!(sink && gradient_ready_), "GPT::set_gradient_sink: a gradient hook is set "
                                        "(set_gradient_ready_hook); the sink would take its place");
    const bool had = static_cast<bool>(sink_);
    sink_ = std::move(sink);
    if (sink_ && !had) {  // no whole buffer from now on
        std::vector<float>().swap(grads_memory_);
        std::vector<std::vector<float>>().swap(slice_grads_);
        grads_ = ParameterTensors{};
    } else if (!sink_ && had) {
        std::vector<std::vector<float>>().swap(sink_blocks_);
        std::vector<std::vector<float>>().swap(sink_rests_);
        grads_memory_.assign(config_.num_parameters(), 0.0f);
        grads_ = whole_at(grads_memory_.data());
    }
}

ParameterTensors GPT::whole_at(float* base) const {
    ParameterTensors t;
    for (const auto& [member, offset] : whole_layout_) t.*member = base + offset;
    return t;
}

void GPT::set_weight_source(WeightSource source) {
    require(source.start || !source.wait, "GPT::set_weight_source: a source that waits must start too");
    const bool had = has_weight_source();
    if (source.start && !had) {  // no whole buffer from now on: two blocks' and the embeddings'
        source_rest_.assign(rest_floats_, 0.0f);
        for (int i = 0; i < 2; ++i) {
            source_blocks_[i].assign(block_floats_, 0.0f);
            ParameterTensors& t = source_params_[i];
            t = ParameterTensors{};
            for (const auto& [member, offset] : block_layout_) t.*member = source_blocks_[i].data() + offset;
            for (const auto& [member, offset] : rest_layout_) t.*member = source_rest_.data() + offset;
        }
        std::vector<float>().swap(params_memory_);
        std::vector<float>().swap(product_weights_);
        params_ = product_params_ = ParameterTensors{};
    } else if (!source.start && had) {  // the whole buffer again, every bucket asked for once
        params_memory_ = gather_parameters();
        for (int i = 0; i < 2; ++i) {
            std::vector<float>().swap(source_blocks_[i]);
            source_params_[i] = ParameterTensors{};
        }
        std::vector<float>().swap(source_rest_);
        params_ = whole_at(params_memory_.data());
    }
    source_ = std::move(source);
}

std::vector<float> GPT::gather_parameters() const {
    if (!has_weight_source()) return params_memory_;
    std::vector<float> whole(config_.num_parameters(), 0.0f), bucket;
    for (size_t b = 0; b < buckets_.size(); ++b) {
        bucket.assign(buckets_[b].size, 0.0f);
        source_.start(static_cast<int>(b), bucket.data());
        if (source_.wait) source_.wait(static_cast<int>(b));
        size_t at = 0;
        for (const auto& [offset, size] : buckets_[b].ranges) {
            std::copy(bucket.begin() + static_cast<std::ptrdiff_t>(at),
                      bucket.begin() + static_cast<std::ptrdiff_t>(at + size),
                      whole.begin() + static_cast<std::ptrdiff_t>(offset));
            at += size;
        }
    }
    return whole;
}

void GPT::start_block(int layer) {
    source_.start(config_.n_layer - 1 - layer, source_blocks_[layer % 2].data());
}

void GPT::start_pass_weights(int first) {
    const int L = config_.n_layer;
    source_.start(L, source_rest_.data());
    start_block(first);
    if (source_.wait) source_.wait(L);
}

//! [prefetch]
void GPT::fetch_block(int layer, int next) {
    // Every slice is done with the block before, whose buffer the next block's weights may now
    // fill: one thread waits for this block's weights and starts the next one's while the
    // others wait; then all of them compute this block as the next one's arrive.
#pragma omp barrier
    on_master([&] {
        if (source_.wait) source_.wait(config_.n_layer - 1 - layer);
        if (next >= 0 && next < config_.n_layer) start_block(next);
    });
#pragma omp barrier
}
//! [prefetch]

ParameterTensors GPT::block_weights(const ParameterTensors& t, int layer) const {
    return has_weight_source() ? source_params_[layer % 2] : layer_view(t, layer);
}

ParameterTensors GPT::layer_view(const ParameterTensors& t, int layer) const {
    const size_t l = static_cast<size_t>(layer), C = static_cast<size_t>(config_.n_embd), lc = l * C;
    const size_t QKV = static_cast<size_t>(config_.qkv_channels());
    const auto at = [](float* x, size_t offset) { return x ? x + offset : nullptr; };
    ParameterTensors v = t;
    v.ln1w = at(t.ln1w, lc);
    v.ln1b = at(t.ln1b, lc);
    v.qkvw = at(t.qkvw, l * QKV * C);
    v.qkvb = at(t.qkvb, l * QKV);
    v.attprojw = at(t.attprojw, lc * C);
    v.attprojb = at(t.attprojb, lc);
    v.ln2w = at(t.ln2w, lc);
    v.ln2b = at(t.ln2b, lc);
    v.fcw = at(t.fcw, lc * 4 * C);
    v.fcb = at(t.fcb, 4 * lc);
    v.fcprojw = at(t.fcprojw, lc * 4 * C);
    v.fcprojb = at(t.fcprojb, lc);
    return v;
}

void GPT::set_batch_offset(int first_sequence) {
    require(first_sequence >= 0, "GPT::set_batch_offset: the first sequence's index must not be "
                                 "negative, got " + std::to_string(first_sequence));
    batch_offset_ = first_sequence;
}

void GPT::set_whole_batch(int sequences) {
    require(sequences >= 0, "GPT::set_whole_batch: the whole batch's sequences must not be negative, got " +
                                std::to_string(sequences));
    whole_batch_ = sequences;
}

// Called by every thread of a parallel region: the master runs `work` unless an earlier
// call failed (what it would do, a collective call included, no longer matters: the pass
// ends in an error), keeping the first error for rethrow_master_error().
template <class Work>
void GPT::on_master(Work work) {
#pragma omp master
    {
        if (!master_error_) {
            try {
                work();
            } catch (...) {
                master_error_ = std::current_exception();
            }
        }
    }
}

void GPT::rethrow_master_error() {
    if (!master_error_) return;
    std::exception_ptr error = master_error_;
    master_error_ = nullptr;
    std::rethrow_exception(error);
}

MemoryUse GPT::memory_use() const {
    const auto bytes = [](const std::vector<float>& v) { return v.capacity() * sizeof(float); };
    MemoryUse use;
    use.weights = bytes(params_memory_) + bytes(kept_values_) + bytes(product_weights_) + bytes(source_blocks_[0]) +
                  bytes(source_blocks_[1]) + bytes(source_rest_);
    use.gradients = bytes(grads_memory_);
    for (const std::vector<float>& g : slice_grads_) use.gradients += bytes(g);
    for (const std::vector<float>& g : sink_blocks_) use.gradients += bytes(g);
    for (const std::vector<float>& g : sink_rests_) use.gradients += bytes(g);
    const Activations& a = acts_;
    // Every buffer of Activations and GradientScratch: a member added there and not here
    // fails the static_asserts.
    const std::vector<float>* kept[] = {
        &a.encoded, &a.ln1, &a.ln1_mean, &a.ln1_rstd, &a.qkv, &a.atty, &a.att, &a.att_lse,
        &a.att_dropped, &a.attproj, &a.residual2, &a.ln2, &a.ln2_mean, &a.ln2_rstd, &a.fch,
        &a.fch_gelu, &a.fcproj, &a.residual3, &a.lnf, &a.lnf_mean, &a.lnf_rstd, &a.logits,
        &a.probs, &a.losses, &a.encoded_mask, &a.attproj_mask, &a.fcproj_mask};
    static_assert(sizeof(Activations) == sizeof(kept) / sizeof(kept[0]) * sizeof(std::vector<float>),
                  "memory_use() lists every buffer of Activations");
    const GradientScratch& g = scratch_;
    const std::vector<float>* scratch[] = {&g.dresidual, &g.dln, &g.dqkv, &g.datty, &g.dfch,
                                           &g.dfch_gelu, &g.dlogits, &g.datt, &g.dinner};
    static_assert(sizeof(GradientScratch) == sizeof(scratch) / sizeof(scratch[0]) * sizeof(std::vector<float>),
                  "memory_use() lists every buffer of GradientScratch");
    for (const std::vector<float>* v : kept) use.activations += bytes(*v);
    for (const std::vector<float>* v : scratch) use.activations += bytes(*v);
    return use;
}

void GPT::allocate_activations(int B, int T) {
    const size_t BT = static_cast<size_t>(B) * T;
    const size_t C = config_.n_embd, V = config_.vocab_size;
    const size_t TT = static_cast<size_t>(T) * T;
    // The blocks whose tensors are kept: all L, or one at a time where the backward pass
    // recomputes them (set_recompute); the attention weights, also with Recompute::attention.
    const size_t L = config_.n_layer, NH = config_.n_head;
    const size_t LB = recompute_applied_ == Recompute::blocks ? 1 : L;
    const size_t LA = recompute_applied_ == Recompute::none ? L : 1;
    Activations& a = acts_;
    if (recompute_applied_ != recompute_allocated_) {  // another mode: nothing of the old sizes kept
        a = Activations{};
        recompute_allocated_ = recompute_applied_;
    }
    resize_zero(a.encoded, BT * C);
    resize_zero(a.ln1, LB * BT * C);
    resize_zero(a.ln1_mean, LB * BT);
    resize_zero(a.ln1_rstd, LB * BT);
    const size_t QKV = static_cast<size_t>(config_.qkv_channels());
    resize_zero(a.qkv, LB * BT * QKV);
    resize_zero(a.atty, LB * BT * C);
    // The (T, T) weights only for the materialised attention (forward() reallocates when a
    // later pass needs them).
    resize_zero(a.att, fused_applied_ ? 0 : LA * B * NH * TT);
    resize_zero(a.att_lse, LB * B * NH * T);
    resize_zero(a.attproj, LB * BT * C);
    resize_zero(a.residual2, LB * BT * C);
    resize_zero(a.ln2, LB * BT * C);
    resize_zero(a.ln2_mean, LB * BT);
    resize_zero(a.ln2_rstd, LB * BT);
    resize_zero(a.fch, LB * BT * 4 * C);
    resize_zero(a.fch_gelu, LB * BT * 4 * C);
    resize_zero(a.fcproj, LB * BT * C);
    resize_zero(a.residual3, L * BT * C);
    resize_zero(a.lnf, BT * C);
    resize_zero(a.lnf_mean, BT);
    resize_zero(a.lnf_rstd, BT);
    resize_zero(a.logits, BT * V);
    resize_zero(a.probs, BT * V);
    resize_zero(a.losses, BT);
    const bool dropout = config_.dropout > 0.0f;
    resize_zero(a.att_dropped, dropout && !fused_applied_ ? LA * B * NH * TT : 0);
    resize_zero(a.encoded_mask, dropout ? BT * C : 0);
    resize_zero(a.attproj_mask, dropout ? LB * BT * C : 0);
    resize_zero(a.fcproj_mask, dropout ? LB * BT * C : 0);

    GradientScratch& s = scratch_;
    resize_zero(s.dresidual, BT * C);
    resize_zero(s.dln, BT * C);
    resize_zero(s.dqkv, BT * QKV);
    resize_zero(s.datty, BT * C);
    resize_zero(s.dfch, BT * 4 * C);
    resize_zero(s.dfch_gelu, BT * 4 * C);
    resize_zero(s.dlogits, BT * V);
    resize_zero(s.datt, fused_applied_ ? 0 : B * NH * TT);
    resize_zero(s.dinner, BT * C);
    inputs_.assign(BT, 0);
    targets_.assign(BT, 0);
    B_ = B;
    T_ = T;
}

std::string fused_attention_unsupported(const GPTConfig& c) {
    if (c.position == Position::alibi) {
        return "the fused attention adds no bias to its scores, so it cannot run an ALiBi model: "
               "use the materialised attention";
    }
    if (c.kv_heads() != c.n_head || c.window != 0) {
        return "the fused attention has one key/value head per query head and no window: use "
               "the materialised attention for grouped keys and values or a sliding window";
    }
    if (!c.scaled_attention) {
        return "the fused attention always divides the scores by the square root of the head "
               "size: use the materialised attention for a model without the scale";
    }
    return "";
}

void GPT::set_attention(AttentionKind kind) {
    if (kind == AttentionKind::fused) {
        const std::string why = fused_attention_unsupported(config_);
        if (!why.empty()) throw std::invalid_argument(why);
    }
    attention_ = kind;
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
    const int V = config_.vocab_size;
    require(B > 0, "GPT::forward: B must be positive, got " + std::to_string(B));
    require(T > 0, "GPT::forward: T must be positive, got " + std::to_string(T));
    // Only a learned embedding has a last row; rope and alibi compute any position.
    require(T <= config_.block_size || config_.position != Position::learned,
            "GPT::forward: a model with learned positions has embeddings for positions 0 to " +
                std::to_string(config_.block_size - 1) + " only (block_size " +
                std::to_string(config_.block_size) + "), so T = " + std::to_string(T) +
                " is too long; rope and alibi models can read longer contexts");
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
    require(!has_weight_source() || precision_ == Precision::fp32,
            std::string("GPT::forward: a model whose weights come from a source (ZeRO stage 3) computes in "
                        "float32 only, not ") + precision_name(precision_));
    dropout_applied_ = training_ && config_.dropout > 0.0f;
    fused_applied_ = attention_ == AttentionKind::fused && !dropout_applied_;
    recompute_applied_ = recompute_;
    const bool weights_missing =
        !fused_applied_ && (acts_.att.empty() || (dropout_applied_ && acts_.att_dropped.empty()));
    if (B != B_ || T != T_ || weights_missing || recompute_applied_ != recompute_allocated_) {
        allocate_activations(B, T);
    }
    std::copy(inputs, inputs + BT, inputs_.begin());
    has_targets_ = targets != nullptr;
    if (targets) std::copy(targets, targets + BT, targets_.begin());

    // The sequences of a batch never meet in the forward pass, so each thread runs the
    // whole pass on its own slice of the batch, with no waiting between layers. A dropout
    // mask is a hash of each element's index in the whole batch: the same in every slicing.
    ++forward_calls_;
    // Mixed precision: the weights the products read, rounded once per pass (the float32
    // parameters stay as they are: the optimizer updates those).
    if (precision_ != Precision::fp32) {  // never with a weight source (refused above)
        product_weights_ = params_memory_;
        round_in_place(product_weights_.data(), product_weights_.size(), precision_);
        product_params_ = shifted(params_, params_memory_.data(), product_weights_.data());
    }
    // ZeRO stage 3: the embeddings' weights now, each block's as the slices reach it (every
    // slice waits until the others are done with the block before, and for its weights), the
    // next block's on their way meanwhile.
    const int L = config_.n_layer;
    const bool sourced = has_weight_source();
    if (sourced) start_pass_weights(0);
    const std::function<void(int)> fetch = [this](int l) { fetch_block(l, l + 1); };
    const int slices = std::min(B, omp_get_max_threads());
#pragma omp parallel num_threads(slices)
    {
        const int b0 = batch_slice_begin(B);
        const int b1 = batch_slice_end(B);
        if (b1 > b0) {
            forward_slice(b0, b1 - b0, sourced ? &fetch : nullptr);
        } else if (sourced) {
            for (int l = 0; l < L; ++l) fetch(l);  // every barrier, with nothing to compute
        }
    }
    rethrow_master_error();  // a weight gather's, from fetch_block

    if (!targets) return std::numeric_limits<float>::quiet_NaN();
    // the mean over every position, summed in order whatever the slices were
    double total = 0.0;
    for (size_t i = 0; i < BT; ++i) total += acts_.losses[i];
    return static_cast<float>(total / static_cast<double>(BT));
}

void GPT::round_for_product(float* x, std::size_t n, RoundingCounts& counts) const {
    if (precision_ != Precision::fp32) counts += round_in_place(x, n, precision_);
}

// Block l's saved tensors, at the first row of the slice that starts at sequence b0.
struct GPT::BlockTensors {
    float* ln1;           // (B, T, C)
    float* ln1_mean;      // (B, T)
    float* ln1_rstd;      // (B, T)
    float* qkv;           // (B, T, C + 2·G·hs)
    float* atty;          // (B, T, C)
    float* att;           // (B, NH, T, T); nullptr with the fused attention
    float* att_dropped;   // (B, NH, T, T); nullptr without dropout
    float* att_lse;       // (B, NH, T)
    float* attproj;       // (B, T, C)
    float* residual2;     // (B, T, C)
    float* ln2;           // (B, T, C)
    float* ln2_mean;      // (B, T)
    float* ln2_rstd;      // (B, T)
    float* fch;           // (B, T, 4C)
    float* fch_gelu;      // (B, T, 4C)
    float* fcproj;        // (B, T, C)
    float* attproj_mask;  // (B, T, C); nullptr without dropout
    float* fcproj_mask;   // (B, T, C); nullptr without dropout
};

GPT::BlockTensors GPT::block_tensors(int l, int b0) {
    // The stacked buffers are laid out for the whole batch B_: a block's tensor starts at
    // k · BTC and the slice at row b0 · T, where k is the block, or 0 where only one block's
    // tensors are kept at a time (allocate_activations).
    const int T = T_, NH = config_.n_head;
    const size_t C = static_cast<size_t>(config_.n_embd);
    const size_t QKV = static_cast<size_t>(config_.qkv_channels());
    const size_t BT = static_cast<size_t>(B_) * T, BTC = BT * C, TT = static_cast<size_t>(T) * T;
    const size_t row0 = static_cast<size_t>(b0) * T;
    const size_t kept = recompute_applied_ == Recompute::blocks ? 0 : static_cast<size_t>(l);
    const size_t kept_att = recompute_applied_ == Recompute::none ? static_cast<size_t>(l) : 0;
    const size_t at = kept * BTC + row0 * C;  // this block's (B, T, C) tensors, at the slice
    const size_t stats = kept * BT + row0;     // its (B, T) statistics
    const size_t att_at = (kept_att * B_ + b0) * NH * TT;
    Activations& a = acts_;
    const bool dropout = dropout_applied_;
    return {a.ln1.data() + at,
            a.ln1_mean.data() + stats,
            a.ln1_rstd.data() + stats,
            a.qkv.data() + kept * BT * QKV + row0 * QKV,
            a.atty.data() + at,
            fused_applied_ ? nullptr : a.att.data() + att_at,
            dropout ? a.att_dropped.data() + att_at : nullptr,
            a.att_lse.data() + (kept * B_ + b0) * NH * T,
            a.attproj.data() + at,
            a.residual2.data() + at,
            a.ln2.data() + at,
            a.ln2_mean.data() + stats,
            a.ln2_rstd.data() + stats,
            a.fch.data() + 4 * at,
            a.fch_gelu.data() + 4 * at,
            a.fcproj.data() + at,
            dropout ? a.attproj_mask.data() + at : nullptr,
            dropout ? a.fcproj_mask.data() + at : nullptr};
}

DropoutSite GPT::dropout_site_of(int layer, int part, std::size_t first) const {
    return DropoutSite{dropout_site_seed(dropout_seed_, forward_calls_, dropout_site(layer, part)), first};
}

void GPT::forward_slice(int b0, int B, const std::function<void(int)>* layer_start) {
    // B is this slice's batch size; the stacked per-layer buffers are laid out for the
    // whole batch B_, so a layer's tensor starts at l * BTC and the slice at row b0 * T.
    const int T = T_;
    const int V = config_.vocab_size, C = config_.n_embd, L = config_.n_layer;
    // the weights: the whole model's, or the embeddings' from a weight source
    const ParameterTensors& p = has_weight_source() ? source_params_[0] : params_;
    // the weights the matrix products read: float32, or rounded (set_precision)
    const ParameterTensors& w = precision_ == Precision::fp32 ? p : product_params_;
    RoundingCounts rounded;  // this slice's, added to forward_rounding_ at the end
    Activations& a = acts_;
    const size_t BT = static_cast<size_t>(B_) * T;  // rows of the whole batch
    const size_t BTC = BT * C;
    const size_t row0 = static_cast<size_t>(b0) * T;       // the slice's first row
    // The same in the whole batch that several processes may share (set_batch_offset), for
    // the dropout masks' element indices.
    const size_t mask_row0 = static_cast<size_t>(b0 + batch_offset_) * T;
    const int N = B * T;  // rows of the slice
    const size_t NC = static_cast<size_t>(N) * C;
    const int* inputs = inputs_.data() + row0;

    // x = drop(wte[idx] + wpe[pos]), or drop(wte[idx]) without wpe       (B, T, C)
    float* encoded = a.encoded.data() + row0 * C;
    encoder_forward(encoded, inputs, p.wte, p.wpe, B, T, C);
    if (dropout_applied_)
        dropout_forward(encoded, a.encoded_mask.data() + row0 * C, config_.dropout,
                        dropout_site_of(-1, 0, mask_row0 * C), N * C);

    // the blocks, each from the output of the one before           (L × (B, T, C))
    for (int l = 0; l < L; ++l) {
        if (layer_start) (*layer_start)(l);
        const size_t at = l * BTC + row0 * C;
        const float* residual = l == 0 ? encoded : a.residual3.data() + at - BTC;
        block_forward(b0, B, l, residual, a.residual3.data() + at, rounded);
    }

    // logits = ln_f(x) · wteᵀ                                           (B, T, V)
    const float* last = a.residual3.data() + (L - 1) * BTC + row0 * C;
    float* lnf = a.lnf.data() + row0 * C;
    layernorm_forward(lnf, a.lnf_mean.data() + row0, a.lnf_rstd.data() + row0, last, p.lnfw,
                      p.lnfb, B, T, C);
    round_for_product(lnf, NC, rounded);
    float* logits = a.logits.data() + row0 * V;
    matmul_forward(logits, lnf, w.wte, nullptr, N, C, V);
    if (has_targets_) {
        crossentropy_forward(a.probs.data() + row0 * V, a.losses.data() + row0, logits,
                             targets_.data() + row0, B, T, V);
    }
    if (precision_ != Precision::fp32) {
#pragma omp critical(attn_forward_rounding)
        forward_rounding_ += rounded;
    }
}

void GPT::block_forward(int b0, int B, int l, const float* residual, float* out, RoundingCounts& rounded) {
    const int T = T_, C = config_.n_embd, NH = config_.n_head, G = config_.kv_heads();
    const size_t QKV = static_cast<size_t>(config_.qkv_channels());  // c_attn's output width
    const ParameterTensors& p = has_weight_source() ? source_params_[0] : params_;
    const ParameterTensors& w = precision_ == Precision::fp32 ? p : product_params_;
    const ParameterTensors pl = block_weights(p, l), wl = block_weights(w, l);  // block l's
    const BlockTensors k = block_tensors(l, b0);
    const float pdrop = config_.dropout;
    const bool dropout = dropout_applied_;
    const int N = B * T;  // rows of the slice
    const size_t NC = static_cast<size_t>(N) * C;
    // the slice's first element in the whole batch, for the dropout masks (set_batch_offset)
    const size_t mask_row0 = static_cast<size_t>(b0 + batch_offset_) * T;
    const size_t mask_att0 = static_cast<size_t>(b0 + batch_offset_) * NH * T * T;

    // x = x + drop(c_proj(attention(c_attn(ln_1(x)))))
    layernorm_forward(k.ln1, k.ln1_mean, k.ln1_rstd, residual, pl.ln1w, pl.ln1b, B, T, C);
    round_for_product(k.ln1, NC, rounded);
    matmul_forward(k.qkv, k.ln1, wl.qkvw, pl.qkvb, N, C, static_cast<int>(QKV));
    if (config_.position == Position::rope) rope_forward(k.qkv, B, T, C, NH, 0, G);
    round_for_product(k.qkv, static_cast<size_t>(N) * QKV, rounded);  // q, k, v
    if (fused_applied_) {  // full multi-head attention only: set_attention refuses the others
        attention_fused_forward(k.atty, k.att_lse, k.qkv, B, T, C, NH, config_.causal);
    } else {
        const DropoutSite weights_site = dropout_site_of(l, 0, mask_att0);
        attention_forward(k.atty, k.att, k.att_dropped, k.qkv, dropout ? pdrop : 0.0f, &weights_site,
                          B, T, C, NH, config_.causal, config_.scaled_attention,
                          alibi_slopes_.empty() ? nullptr : alibi_slopes_.data(), G, config_.window);
    }
    round_for_product(k.atty, NC, rounded);
    matmul_forward(k.attproj, k.atty, wl.attprojw, pl.attprojb, N, C, C);
    if (dropout) dropout_forward(k.attproj, k.attproj_mask, pdrop, dropout_site_of(l, 1, mask_row0 * C), N * C);
    residual_forward(k.residual2, residual, k.attproj, N * C);

    // x = x + drop(c_proj(gelu(c_fc(ln_2(x)))))
    layernorm_forward(k.ln2, k.ln2_mean, k.ln2_rstd, k.residual2, pl.ln2w, pl.ln2b, B, T, C);
    round_for_product(k.ln2, NC, rounded);
    matmul_forward(k.fch, k.ln2, wl.fcw, pl.fcb, N, C, 4 * C);
    gelu_forward(k.fch_gelu, k.fch, N * 4 * C);
    round_for_product(k.fch_gelu, 4 * NC, rounded);
    matmul_forward(k.fcproj, k.fch_gelu, wl.fcprojw, pl.fcprojb, N, 4 * C, C);
    if (dropout) dropout_forward(k.fcproj, k.fcproj_mask, pdrop, dropout_site_of(l, 2, mask_row0 * C), N * C);
    if (out) residual_forward(out, k.residual2, k.fcproj, N * C);
}

void GPT::zero_grad() { zero(grads_memory_); }

void GPT::backward() { backward(1.0f); }

void GPT::backward(float loss_scale) {
    require(has_targets_, "GPT::backward: the last forward call had no targets, so no loss");
    require(loss_scale > 0.0f && std::isfinite(loss_scale),
            "GPT::backward: the loss scale must be positive and finite, got " +
                std::to_string(loss_scale));
    require(!has_weight_source() || sink_, "GPT::backward: a model whose weights come from a source (ZeRO stage 3) "
                                           "needs a gradient sink (set_gradient_sink): it has no whole gradient buffer");
    loss_scale_ = loss_scale;
    if (sink_) {
        backward_to_sink();
        return;
    }
    // As in the forward pass, each thread takes a slice of the batch. The slices share the
    // parameters, whose gradients are sums over the whole batch: the first slice adds into
    // the model's gradients, every other slice into a zeroed buffer of its own, and those
    // are added to the model's afterwards, in slice order, so that the result depends on the
    // number of threads only through that order.
    const int B = B_;
    const int slices = std::min(B, omp_get_max_threads());
    if (slice_grads_.size() < static_cast<size_t>(slices - 1)) slice_grads_.resize(slices - 1);
    const int L = config_.n_layer;
#pragma omp parallel num_threads(slices)
    {
        const int id = omp_get_thread_num();
        const int team = omp_get_num_threads();
        const int b0 = batch_slice_begin(B);
        const int b1 = batch_slice_end(B);
        // With a gradient hook: after each block, every slice waits for the others, the
        // block's gradients are summed over the slices (in slice order, as below, and cleared
        // in the slices' buffers so that the sum below adds nothing more to them), and the
        // hook hears that the block's bucket is complete.
        const std::function<void(int)> layer_done = [&](int l) {
#pragma omp barrier
            for (const auto& [offset, size] : buckets_[static_cast<size_t>(L - 1 - l)].ranges) {
                float* g = grads_memory_.data() + offset;
                const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(size);
#pragma omp for schedule(static) nowait
                for (std::ptrdiff_t i = 0; i < n; ++i) {
                    for (int s = 0; s < team - 1; ++s) {
                        g[i] += slice_grads_[s][offset + i];
                        slice_grads_[s][offset + i] = 0.0f;
                    }
                }
            }
#pragma omp barrier
            on_master([&] { gradient_ready_(L - 1 - l); });
        };
        const std::function<void(int)>* hook = gradient_ready_ ? &layer_done : nullptr;
        if (id == 0) {
            backward_slice(b0, b1 - b0, grads_, hook);
        } else {
            std::vector<float>& own = slice_grads_[id - 1];
            resize_zero(own, grads_memory_.size());
            if (b1 > b0) {
                backward_slice(b0, b1 - b0, shifted(grads_, grads_memory_.data(), own.data()), hook);
            } else if (hook) {
                for (int l = L - 1; l >= 0; --l) layer_done(l);  // every barrier, with nothing to add
            }
        }
        // In the same parallel region, after every slice is done: a new region would have
        // to wake the threads again, which on a busy machine can cost a scheduler time slice.
#pragma omp barrier
        // With a hook, the blocks' gradients are summed already and may be in the hands of
        // the hook's owner (an in-place allreduce in flight must not be read or written):
        // only the embeddings' and ln_f's ranges are left.
        const std::vector<std::pair<std::size_t, std::size_t>> whole = {{0, grads_memory_.size()}};
        for (const auto& [offset, size] : hook ? buckets_[static_cast<size_t>(L)].ranges : whole) {
            float* g = grads_memory_.data() + offset;
            const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(size);
#pragma omp for schedule(static)
            for (std::ptrdiff_t i = 0; i < n; ++i) {
                for (int s = 0; s < team - 1; ++s) g[i] += slice_grads_[s][offset + i];
            }
        }
    }
    rethrow_master_error();  // the gradient hook's
    if (gradient_ready_) gradient_ready_(L);  // the embeddings and ln_f
}

// backward() with a sink: the same passes and the same sums over the slices, in the same
// order, into a block's buffer per slice (reused block after block) and a buffer per slice
// for the embeddings and ln_f, so that the gradients are those of backward() bit for bit.
void GPT::backward_to_sink() {
    const int B = B_;
    const int slices = std::min(B, omp_get_max_threads());
    const int L = config_.n_layer;
    sink_blocks_.resize(static_cast<size_t>(slices));
    sink_rests_.resize(static_cast<size_t>(slices));
    for (std::vector<float>& b : sink_blocks_) resize_zero(b, block_floats_);
    for (std::vector<float>& r : sink_rests_) resize_zero(r, rest_floats_);
    // ZeRO stage 3: the embeddings' weights now, each block's before its backward pass (the
    // last block's on their way during the LM head's, the one before's during each block's).
    if (has_weight_source()) start_pass_weights(L - 1);
    const std::function<void(int)> fetch = [this](int l) { fetch_block(l, l - 1); };
    const std::function<void(int)>* layer_start = has_weight_source() ? &fetch : nullptr;
#pragma omp parallel num_threads(slices)
    {
        const int id = omp_get_thread_num();
        const int team = omp_get_num_threads();
        const int b0 = batch_slice_begin(B);
        const int b1 = batch_slice_end(B);
        float* own = sink_blocks_[static_cast<size_t>(id)].data();
        // After each block: every slice waits for the others, the block is summed over the
        // slices into slice 0's buffer (in slice order), the sink takes it, and every slice
        // clears its buffer for the next block.
        const std::function<void(int)> layer_done = [&](int l) {
#pragma omp barrier
            float* sum = sink_blocks_[0].data();
            const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(block_floats_);
#pragma omp for schedule(static)
            for (std::ptrdiff_t i = 0; i < n; ++i) {
                for (int s = 1; s < team; ++s) sum[i] += sink_blocks_[static_cast<size_t>(s)][i];
            }
            on_master([&] { sink_(L - 1 - l, sum); });
#pragma omp barrier
            std::fill(own, own + block_floats_, 0.0f);
        };
        ParameterTensors rest;  // the embeddings' and ln_f's gradients in this slice's buffer
        for (const auto& [member, offset] : rest_layout_) rest.*member = sink_rests_[static_cast<size_t>(id)].data() + offset;
        if (b1 > b0) {
            backward_slice(b0, b1 - b0, rest, &layer_done, own, layer_start);
        } else {
            for (int l = L - 1; l >= 0; --l) {  // every barrier, with nothing to add
                if (layer_start) (*layer_start)(l);
                layer_done(l);
            }
        }
#pragma omp barrier
        float* sum = sink_rests_[0].data();
        const std::ptrdiff_t n = static_cast<std::ptrdiff_t>(rest_floats_);
#pragma omp for schedule(static)
        for (std::ptrdiff_t i = 0; i < n; ++i) {
            for (int s = 1; s < team; ++s) sum[i] += sink_rests_[static_cast<size_t>(s)][i];
        }
    }
    rethrow_master_error();  // the sink's, or a weight gather's from fetch_block
    sink_(L, sink_rests_[0].data());  // the embeddings and ln_f
}

void GPT::backward_slice(int b0, int B, const ParameterTensors& g,
                         const std::function<void(int)>* layer_done, float* block,
                         const std::function<void(int)>* layer_start) {
    // B is this slice's batch size; offsets as in forward_slice. The scratch buffers are
    // (B_, T, ...) for the whole batch: each slice works in its own rows of them.
    const int T = T_;
    const int V = config_.vocab_size, C = config_.n_embd, L = config_.n_layer, NH = config_.n_head;
    const int G = config_.kv_heads();
    const size_t QKV = static_cast<size_t>(config_.qkv_channels());  // c_attn's output width
    const size_t BT = static_cast<size_t>(B_) * T;
    const size_t BTC = BT * C;
    const size_t TT = static_cast<size_t>(T) * T;
    const size_t row0 = static_cast<size_t>(b0) * T;
    const size_t att0 = static_cast<size_t>(b0) * NH * TT;
    const bool fused = fused_applied_;
    const Recompute recompute = recompute_applied_;
    const int N = B * T;
    const size_t NC = static_cast<size_t>(N) * C;
    // the weights: the whole model's, or the embeddings' (and the blocks', block_weights()) from
    // a weight source
    const ParameterTensors& p = has_weight_source() ? source_params_[0] : params_;
    // the weights the forward pass's products read (float32, or rounded: set_precision)
    const ParameterTensors& w = precision_ == Precision::fp32 ? p : product_params_;
    RoundingCounts rounded;  // this slice's, added to gradient_rounding_ at the end
    const Activations& a = acts_;
    GradientScratch& s = scratch_;
    const bool dropout = dropout_applied_;
    const float pdrop = dropout ? config_.dropout : 0.0f;
    // this slice's rows of the scratch buffers, zeroed where a backward adds into them
    float* dresidual = s.dresidual.data() + row0 * C;  // (B, T, C)
    float* dln = s.dln.data() + row0 * C;              // (B, T, C)
    float* dqkv = s.dqkv.data() + row0 * QKV;          // (B, T, C + 2·G·hs)
    float* datty = s.datty.data() + row0 * C;          // (B, T, C)
    float* dfch = s.dfch.data() + 4 * row0 * C;        // (B, T, 4C)
    float* dfch_gelu = s.dfch_gelu.data() + 4 * row0 * C;
    float* dlogits = s.dlogits.data() + row0 * V;      // (B, T, V)
    float* datt = fused ? nullptr : s.datt.data() + att0;  // (B, NH, T, T)
    float* dinner = s.dinner.data() + row0 * C;        // (B, T, C)
    auto clear = [](float* x, size_t n) { std::fill(x, x + n, 0.0f); };

    // loss = mean cross-entropy(softmax(logits), targets), the mean over the whole batch
    clear(dlogits, static_cast<size_t>(N) * V);
    crossentropy_backward(dlogits, a.probs.data() + row0 * V, targets_.data() + row0, B, T, V,
                          whole_batch_ > 0 ? whole_batch_ * T : static_cast<int>(BT));
    // loss_scale · loss: every gradient below is loss_scale times larger
    if (loss_scale_ != 1.0f) {
        for (size_t i = 0; i < static_cast<size_t>(N) * V; ++i) dlogits[i] *= loss_scale_;
    }
    // logits = lnf · wteᵀ (the tied LM head: its gradient adds to the embedding's)
    clear(dln, NC);
    round_for_product(dlogits, static_cast<size_t>(N) * V, rounded);
    matmul_backward(dln, g.wte, nullptr, dlogits, a.lnf.data() + row0 * C, w.wte, N, C, V);
    // lnf = ln_f(residual3[L-1])
    clear(dresidual, NC);
    const float* last = a.residual3.data() + (L - 1) * BTC + row0 * C;
    layernorm_backward(dresidual, g.lnfw, g.lnfb, dln, last, p.lnfw, a.lnf_mean.data() + row0,
                       a.lnf_rstd.data() + row0, B, T, C);

    // dresidual holds d(residual3[l]) on entry to each block and d(block input) on exit:
    // the identity path of both residual connections adds dout to the input unchanged, so
    // only the branches are added into it.
    for (int l = L - 1; l >= 0; --l) {
        if (layer_start) (*layer_start)(l);
        const ParameterTensors pl = block_weights(p, l), wl = block_weights(w, l);  // block l's
        const size_t at = l * BTC + row0 * C;  // block l's output, residual3[l], at the slice
        const float* residual =
            l == 0 ? a.encoded.data() + row0 * C : a.residual3.data() + at - BTC;
        //! [recompute]
        // Activation checkpointing: what the forward pass did not keep, computed again as it
        // computed it (the same functions on the same inputs, the same dropout masks), into
        // the one block's buffers, before block l's backward pass reads it.
        if (recompute == Recompute::blocks) {
            RoundingCounts again;  // counted once, by the forward pass
            block_forward(b0, B, l, residual, nullptr, again);
        }
        const BlockTensors k = block_tensors(l, b0);
        if (recompute == Recompute::attention && !fused) {
            // att = softmax(q·kᵀ/√hs), drop(att): the attention's output goes to datty, which
            // c_proj's backward clears before it writes there
            const DropoutSite weights_site =
                dropout_site_of(l, 0, static_cast<size_t>(b0 + batch_offset_) * NH * TT);
            attention_forward(datty, k.att, k.att_dropped, k.qkv, pdrop, &weights_site, B, T, C, NH,
                              config_.causal, config_.scaled_attention,
                              alibi_slopes_.empty() ? nullptr : alibi_slopes_.data(), G, config_.window);
        }
        //! [recompute]
        const float* ln1 = k.ln1;
        const float* qkv = k.qkv;
        const float* atty = k.atty;
        const float* att = k.att;
        const float* att_dropped = k.att_dropped;
        const float* att_lse = k.att_lse;
        const float* residual2 = k.residual2;
        const float* ln2 = k.ln2;
        const float* fch = k.fch;
        const float* fch_gelu = k.fch_gelu;
        // block l's gradients: its slices of the stacked tensors, or a sink's block buffer
        ParameterTensors gl;
        if (block) {
            for (const auto& [member, offset] : block_layout_) gl.*member = block + offset;
        } else {
            gl = layer_view(g, l);
        }

        // residual3 = residual2 + fcproj: d(residual2) = dresidual (kept in place),
        // d(fcproj) = dresidual
        std::copy(dresidual, dresidual + NC, dinner);
        // fcproj = drop(fch_gelu · c_projᵀ + b)
        if (dropout) dropout_backward(dinner, k.fcproj_mask, N * C);
        clear(dfch_gelu, 4 * NC);
        round_for_product(dinner, NC, rounded);
        matmul_backward(dfch_gelu, gl.fcprojw, gl.fcprojb,
                        dinner, fch_gelu, wl.fcprojw, N, 4 * C, C);
        // fch_gelu = gelu(fch)
        clear(dfch, 4 * NC);
        gelu_backward(dfch, fch, dfch_gelu, N * 4 * C);
        // fch = ln2 · c_fcᵀ + b
        clear(dln, NC);
        round_for_product(dfch, 4 * NC, rounded);
        matmul_backward(dln, gl.fcw, gl.fcb, dfch, ln2,
                        wl.fcw, N, C, 4 * C);
        // ln2 = ln_2(residual2)
        layernorm_backward(dresidual, gl.ln2w, gl.ln2b, dln, residual2,
                           pl.ln2w, k.ln2_mean, k.ln2_rstd, B,
                           T, C);

        // residual2 = residual + attproj
        std::copy(dresidual, dresidual + NC, dinner);
        // attproj = drop(atty · c_projᵀ + b)
        if (dropout) dropout_backward(dinner, k.attproj_mask, N * C);
        clear(datty, NC);
        round_for_product(dinner, NC, rounded);
        matmul_backward(datty, gl.attprojw, gl.attprojb, dinner,
                        atty, wl.attprojw, N, C, C);
        // atty = attention(qkv)
        clear(dqkv, static_cast<size_t>(N) * QKV);
        if (fused) {
            attention_fused_backward(dqkv, datty, qkv, atty, att_lse, B, T, C, NH, config_.causal);
        } else {
            attention_backward(dqkv, datt, datty, qkv, att, att_dropped, pdrop, B, T, C, NH,
                               config_.causal, config_.scaled_attention, G, config_.window);
        }
        // qkv = rope(qkv) (the activation holds the rotated q and k that attention read)
        if (config_.position == Position::rope) rope_backward(dqkv, B, T, C, NH, 0, G);
        // qkv = ln1 · c_attnᵀ + b
        clear(dln, NC);
        round_for_product(dqkv, static_cast<size_t>(N) * QKV, rounded);
        matmul_backward(dln, gl.qkvw, gl.qkvb, dqkv, ln1,
                        wl.qkvw, N, C, static_cast<int>(QKV));
        // ln1 = ln_1(residual)
        layernorm_backward(dresidual, gl.ln1w, gl.ln1b, dln, residual,
                           pl.ln1w, k.ln1_mean, k.ln1_rstd, B,
                           T, C);
        if (layer_done) (*layer_done)(l);  // block l's gradients are this slice's final share
    }

    // encoded = drop(wte[idx] + wpe[pos]) (g.wpe is nullptr without learned positions)
    if (dropout) dropout_backward(dresidual, a.encoded_mask.data() + row0 * C, N * C);
    // The inputs were not kept: the token ids are needed to scatter into wte.
    encoder_backward(g.wte, g.wpe, dresidual, inputs_.data() + row0, B, T, C);
    if (precision_ != Precision::fp32) {
#pragma omp critical(attn_gradient_rounding)
        gradient_rounding_ += rounded;
    }
}

}  // namespace attn
