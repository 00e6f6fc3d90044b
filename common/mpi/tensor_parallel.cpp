// Tensor parallelism: each block's heads and MLP hidden units split over the ranks, an
// allreduce after each attention and each MLP forward, one before each LayerNorm backward.
#include "attn/mpi/tensor_parallel.hpp"

#include "attn/gpt_layers.hpp"

#include <algorithm>
#include <climits>
#include <cmath>
#include <stdexcept>
#include <string>

namespace attn::mpi {

namespace {
// The tensors a rank holds, in params_' order: four whole ones, then twelve per block.
enum Whole { wte, wpe, lnfw, lnfb, whole_count };
enum PerBlock { ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w, ln2b, fcw, fcb, fcprojw, fcprojb, block_count };
}  // namespace

// Where rank r's part of every tensor lies in the whole model's flat buffer: calls
// fn(whole offset, local offset, floats, whole tensor) for each run, in params_' order.
struct TensorParallelGPT::Layout {
    std::size_t V, Tb, C, L, A, H;
    bool bias;  // whether the model has biases (LayerNorms' and Linears')
    // The whole model's tensors, by kind: their first float (stacked over the blocks).
    std::size_t whole_base[whole_count] = {};
    std::size_t block_base[block_count] = {};

    template <class Fn>
    void for_each_run(int rank, Fn&& fn) const {
        const std::size_t r = static_cast<std::size_t>(rank);
        std::size_t local = 0;
        const auto run = [&](std::size_t whole, std::size_t n, bool replicated) {
            fn(whole, local, n, replicated);
            local += n;
        };
        const auto bias_run = [&](std::size_t whole, std::size_t n, bool replicated) {
            if (bias) run(whole, n, replicated);
        };
        run(whole_base[wte], V * C, true);
        run(whole_base[wpe], Tb * C, true);
        run(whole_base[lnfw], C, true);
        bias_run(whole_base[lnfb], C, true);
        for (std::size_t l = 0; l < L; ++l) {
            run(block_base[ln1w] + l * C, C, true);
            bias_run(block_base[ln1b] + l * C, C, true);
            // c_attn (3C, C): this rank's heads' rows of q, of k and of v
            const std::size_t qkv = block_base[qkvw] + l * 3 * C * C;
            for (std::size_t part = 0; part < 3; ++part) run(qkv + (part * C + r * A) * C, A * C, false);
            const std::size_t qkv_b = block_base[qkvb] + l * 3 * C;
            for (std::size_t part = 0; part < 3; ++part) bias_run(qkv_b + part * C + r * A, A, false);
            // attn.c_proj (C, C): this rank's heads' columns, row by row
            const std::size_t proj = block_base[attprojw] + l * C * C;
            for (std::size_t row = 0; row < C; ++row) run(proj + row * C + r * A, A, false);
            bias_run(block_base[attprojb] + l * C, C, true);
            run(block_base[ln2w] + l * C, C, true);
            bias_run(block_base[ln2b] + l * C, C, true);
            // mlp.c_fc (4C, C): this rank's hidden units' rows
            run(block_base[fcw] + l * 4 * C * C + r * H * C, H * C, false);
            bias_run(block_base[fcb] + l * 4 * C + r * H, H, false);
            // mlp.c_proj (C, 4C): this rank's hidden units' columns, row by row
            const std::size_t out = block_base[fcprojw] + l * 4 * C * C;
            for (std::size_t row = 0; row < C; ++row) run(out + row * 4 * C + r * H, H, false);
            bias_run(block_base[fcprojb] + l * C, C, true);
        }
    }
};

namespace {
constexpr std::size_t npos = static_cast<std::size_t>(-1);
void require(bool ok, const std::string& why) {
    if (!ok) throw std::invalid_argument("tensor parallelism: " + why);
}
}  // namespace

TensorParallelGPT::Layout TensorParallelGPT::layout_of(const GPT& model, int ranks) {
    const GPTConfig& c = model.config();
    const int N = ranks;
    require(N >= 1, "a split over " + std::to_string(N) + " ranks");
    require(c.n_head % N == 0, "the " + std::to_string(c.n_head) + " heads do not divide among " + std::to_string(N) +
                                   " ranks");
    require(4 * c.n_embd % N == 0, "the MLP's " + std::to_string(4 * c.n_embd) + " hidden units do not divide among " +
                                       std::to_string(N) + " ranks");
    require(c.dropout == 0.0f, "dropout is not implemented (the masks of one head would have to match one process's)");
    require(c.position == Position::learned, std::string("positions ") + position_name(c.position) +
                                                 " are not implemented (learned only)");
    require(c.kv_heads() == c.n_head, "grouped keys and values are not implemented (multi-head attention only)");
    require(c.window == 0, "a sliding window is not implemented");
    const int heads = c.n_head / N;
    Layout layout{static_cast<std::size_t>(c.vocab_size), static_cast<std::size_t>(c.block_size),
                  static_cast<std::size_t>(c.n_embd), static_cast<std::size_t>(c.n_layer),
                  static_cast<std::size_t>(c.n_embd / c.n_head * heads), static_cast<std::size_t>(4 * c.n_embd / N),
                  c.bias};
    // Where each kind of tensor starts in the whole model's flat buffer (the blocks' stacked:
    // block 0's), from its parameter table, which a model made without whole weights has too.
    const char* kinds[whole_count + block_count] = {
        "transformer.wte.weight",           "transformer.wpe.weight",          "transformer.ln_f.weight",
        "transformer.ln_f.bias",            "transformer.h.0.ln_1.weight",     "transformer.h.0.ln_1.bias",
        "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias", "transformer.h.0.attn.c_proj.weight",
        "transformer.h.0.attn.c_proj.bias", "transformer.h.0.ln_2.weight",     "transformer.h.0.ln_2.bias",
        "transformer.h.0.mlp.c_fc.weight",  "transformer.h.0.mlp.c_fc.bias",   "transformer.h.0.mlp.c_proj.weight",
        "transformer.h.0.mlp.c_proj.bias"};
    const auto& table = model.parameter_table();
    for (int k = 0; k < whole_count + block_count; ++k) {
        const char* name = kinds[k];
        const auto it = std::find_if(table.begin(), table.end(), [name](const ParameterInfo& t) { return t.name == name; });
        const std::size_t base = it == table.end() ? 0 : it->offset;  // 0: absent, unused
        (k < whole_count ? layout.whole_base[k] : layout.block_base[k - whole_count]) = base;
    }
    return layout;
}

std::vector<AdamW::Segment> TensorParallelGPT::runs_of(const GPT& model, int rank, int ranks) {
    require(rank >= 0 && rank < ranks, "rank " + std::to_string(rank) + " of " + std::to_string(ranks));
    std::vector<AdamW::Segment> runs;
    layout_of(model, ranks).for_each_run(rank, [&runs](std::size_t from, std::size_t, std::size_t n, bool) {
        runs.push_back({from, n});
    });
    return runs;
}

TensorParallelGPT::TensorParallelGPT(const GPT& whole, MPI_Comm comm, std::vector<float> mine)
    : comm_(comm), config_(whole.config()) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    const GPTConfig& c = config_;
    {
        const Layout split = layout_of(whole, size_);
        heads_ = c.n_head / size_;
        width_ = static_cast<int>(split.A);
        hidden_ = static_cast<int>(split.H);
        for (int k = 0; k < whole_count; ++k) bases_.push_back(split.whole_base[k]);
        for (int k = 0; k < block_count; ++k) bases_.push_back(split.block_base[k]);
    }
    whole_size_ = c.num_parameters();
    const Layout layout = this->layout();
    // This rank's slices: copied from the whole weights, or, from a model made without them
    // (GPTBuffers), the seed's initial values of these runs alone (GPT::initial_values), so
    // that no rank holds the whole model. The start of each tensor noted for the passes.
    std::size_t count = 0;  // the runs, counted first so that their lists take no more
    layout.for_each_run(rank_, [&count](std::size_t, std::size_t, std::size_t, bool) { ++count; });
    std::vector<std::pair<std::size_t, std::size_t>> from_whole;  // (offset, floats) of each run
    from_whole.reserve(count);
    runs_.reserve(count);
    std::size_t size = 0;  // floats of params_
    bool in_order = true;  // the runs fill params_ one after the other
    layout.for_each_run(rank_, [&](std::size_t from, std::size_t local, std::size_t n, bool replicated) {
        in_order = in_order && local == size;
        size = std::max(size, local + n);
        from_whole.emplace_back(from, n);
        runs_.push_back({from, local, n, replicated});
    });
    if (!mine.empty()) {
        require(in_order && mine.size() == size, "a rank's " + std::to_string(mine.size()) + " parameters for its " +
                                                     std::to_string(size) + " floats of runs");
        params_ = std::move(mine);
    } else if (whole.parameters().empty() && in_order) {
        params_ = whole.initial_values(from_whole);  // drawn into place: no second copy
    } else {
        params_.resize(size);
        const std::vector<float> drawn = whole.parameters().empty() ? whole.initial_values(from_whole) : std::vector<float>{};
        std::size_t at = 0;  // in `drawn`
        for (std::size_t i = 0; i < from_whole.size(); ++i) {
            const auto [from, n] = from_whole[i];
            const float* source = whole.parameters().empty() ? drawn.data() + at : whole.parameters().data() + from;
            std::copy(source, source + n, params_.begin() + static_cast<std::ptrdiff_t>(runs_[i].local));
            at += n;
        }
    }
    grads_.assign(params_.size(), 0.0f);
    // The start of each tensor in params_: sizes as in Layout, in its order.
    const std::size_t V = layout.V, Tb = layout.Tb, C = layout.C, A = layout.A, H = layout.H;
    const std::size_t b = c.bias ? 1 : 0;  // a bias's floats count only where the model has one
    const std::size_t whole_sizes[whole_count] = {V * C, Tb * C, C, b * C};
    const std::size_t block_sizes[block_count] = {C, b * C, 3 * A * C, b * 3 * A, C * A, b * C,
                                                  C, b * C, H * C, b * H, C * H, b * C};
    // AdamW decays the matrices (nanoGPT: tensors of two or more dimensions), whole or sliced.
    const bool whole_decays[whole_count] = {true, true, false, false};
    const bool block_decays[block_count] = {false, false, true, false, true, false, false, false, true, false, true, false};
    std::size_t o = 0;
    // An absent bias's offset is npos: P() and G() give nullptr for it.
    for (int k = 0; k < whole_count; ++k) {
        const std::size_t n = whole_sizes[k];
        offsets_.push_back(n ? o : npos);
        if (n) table_.push_back({"whole tensor " + std::to_string(k), {n}, o, n, whole_decays[k]});
        o += n;
    }
    for (std::size_t l = 0; l < layout.L; ++l) {
        for (int k = 0; k < block_count; ++k) {
            const std::size_t n = block_sizes[k];
            offsets_.push_back(n ? o : npos);
            if (n) table_.push_back({"block " + std::to_string(l) + " tensor " + std::to_string(k), {n}, o, n, block_decays[k]});
            o += n;
        }
    }
}

std::vector<float> TensorParallelGPT::local_of(const std::vector<float>& whole) const {
    require(whole.size() == whole_size_, "a buffer of " + std::to_string(whole.size()) + " floats for a model of " +
                                             std::to_string(whole_size_));
    std::vector<float> local(params_.size());
    layout().for_each_run(rank_, [&](std::size_t from, std::size_t at, std::size_t n, bool) {
        std::copy(whole.begin() + static_cast<std::ptrdiff_t>(from), whole.begin() + static_cast<std::ptrdiff_t>(from + n),
                  local.begin() + static_cast<std::ptrdiff_t>(at));
    });
    return local;
}

std::pair<double, double> TensorParallelGPT::gradient_square_sums() const {
    double split = 0.0, whole = 0.0;
    for (const Run& r : runs_) {
        double& sum = r.replicated ? whole : split;
        for (std::size_t i = r.local; i < r.local + r.size; ++i) sum += static_cast<double>(grads_[i]) * grads_[i];
    }
    return {split, whole};
}

float* TensorParallelGPT::at(std::vector<float>& buffer, int kind, int layer) {
    const std::size_t o = offsets_[static_cast<std::size_t>(layer < 0 ? kind : whole_count + layer * block_count + kind)];
    return o == npos ? nullptr : buffer.data() + o;
}

void TensorParallelGPT::allreduce(float* x, std::size_t n) {
    if (size_ == 1) return;  // nothing to join
    if (n > static_cast<std::size_t>(INT_MAX)) throw std::invalid_argument("tensor parallelism: an allreduce too large");
    MPI_Allreduce(MPI_IN_PLACE, x, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm_);
    ++traffic_.allreduces;
    traffic_.floats += n;
}

float TensorParallelGPT::forward(const int* x, const int* y, int B, int T) {
    const GPTConfig& c = config_;
    require(B >= 1 && T >= 1 && T <= c.block_size, "a batch of " + std::to_string(B) + " x " + std::to_string(T) +
                                                       " for a block size of " + std::to_string(c.block_size));
    B_ = B;
    T_ = T;
    const int C = c.n_embd, L = c.n_layer, V = c.vocab_size, A = width_, H = hidden_;
    const std::size_t N = static_cast<std::size_t>(B) * T, NC = N * C;
    x_.assign(x, x + N);
    if (y) y_.assign(y, y + N);
    else y_.clear();
    traffic_ = {};
    const auto grow = [](std::vector<float>& v, std::size_t n) { v.assign(n, 0.0f); };
    grow(encoded_, NC);
    grow(ln1_, L * NC);
    grow(ln1_mean_, L * N);
    grow(ln1_rstd_, L * N);
    grow(qkv_, L * N * 3 * A);
    grow(att_, static_cast<std::size_t>(L) * B * heads_ * T * T);
    grow(atty_, L * N * A);
    grow(res2_, L * NC);
    grow(ln2_, L * NC);
    grow(ln2_mean_, L * N);
    grow(ln2_rstd_, L * N);
    grow(fch_, L * N * H);
    grow(fch_gelu_, L * N * H);
    grow(res3_, L * NC);
    grow(lnf_, NC);
    grow(lnf_mean_, N);
    grow(lnf_rstd_, N);
    grow(logits_, N * V);
    grow(probs_, N * V);
    grow(losses_, N);
    const auto P = [&](int k, int l = -1) { return at(params_, k, l); };
    const int n = static_cast<int>(N);
    std::vector<float> partial(NC);
    encoder_forward(encoded_.data(), x, P(wte), P(wpe), B, T, C);
    //! [tensor_parallel_forward]
    for (int l = 0; l < L; ++l) {
        const std::size_t at = l * NC;
        const float* in = l == 0 ? encoded_.data() : res3_.data() + at - NC;
        float* ln1 = ln1_.data() + at;
        float* qkv = qkv_.data() + l * N * 3 * A;
        float* atty = atty_.data() + l * N * A;
        layernorm_forward(ln1, ln1_mean_.data() + l * N, ln1_rstd_.data() + l * N, in, P(ln1w, l), P(ln1b, l), B, T, C);
        // this rank's heads: their q, k and v, their attention, their share of c_proj
        matmul_forward(qkv, ln1, P(qkvw, l), P(qkvb, l), n, C, 3 * A);
        attention_forward(atty, att_.data() + static_cast<std::size_t>(l) * B * heads_ * T * T, nullptr, qkv, 0.0f,
                          nullptr, B, T, A, heads_, c.causal, c.scaled_attention);
        matmul_forward(partial.data(), atty, P(attprojw, l), nullptr, n, A, C);
        allreduce(partial.data(), NC);  // the heads of every rank, summed
        float* res2 = res2_.data() + at;
        const float* b = P(attprojb, l);
        for (std::size_t i = 0; i < NC; ++i) res2[i] = in[i] + (b ? partial[i] + b[i % C] : partial[i]);
        // this rank's hidden units: their share of c_fc, GELU, their share of c_proj
        float* ln2 = ln2_.data() + at;
        layernorm_forward(ln2, ln2_mean_.data() + l * N, ln2_rstd_.data() + l * N, res2, P(ln2w, l), P(ln2b, l), B, T, C);
        float* fch = fch_.data() + l * N * H;
        float* fch_gelu = fch_gelu_.data() + l * N * H;
        matmul_forward(fch, ln2, P(fcw, l), P(fcb, l), n, C, H);
        gelu_forward(fch_gelu, fch, n * H);
        matmul_forward(partial.data(), fch_gelu, P(fcprojw, l), nullptr, n, H, C);
        allreduce(partial.data(), NC);  // every rank's hidden units, summed
        float* res3 = res3_.data() + at;
        const float* b2 = P(fcprojb, l);
        for (std::size_t i = 0; i < NC; ++i) res3[i] = res2[i] + (b2 ? partial[i] + b2[i % C] : partial[i]);
    }
    //! [tensor_parallel_forward]
    layernorm_forward(lnf_.data(), lnf_mean_.data(), lnf_rstd_.data(), res3_.data() + (L - 1) * NC, P(lnfw), P(lnfb),
                      B, T, C);
    matmul_forward(logits_.data(), lnf_.data(), P(wte), nullptr, n, C, V);
    if (!y) return 0.0f;  // the logits alone (sampling)
    return crossentropy_forward(probs_.data(), losses_.data(), logits_.data(), y, B, T, V);
}

void TensorParallelGPT::backward() {
    require(B_ > 0 && !y_.empty(), "backward() before any forward pass with targets");
    const GPTConfig& c = config_;
    const int B = B_, T = T_, C = c.n_embd, L = c.n_layer, V = c.vocab_size, A = width_, H = hidden_;
    const std::size_t N = static_cast<std::size_t>(B) * T, NC = N * C;
    const int n = static_cast<int>(N);
    std::fill(grads_.begin(), grads_.end(), 0.0f);
    const auto P = [&](int k, int l = -1) { return at(params_, k, l); };
    const auto G = [&](int k, int l = -1) { return at(grads_, k, l); };
    std::vector<float> dlogits(N * V, 0.0f), dln(NC, 0.0f), dres(NC, 0.0f), dgelu(N * H), dfch(N * H), datty(N * A),
        dqkv(N * 3 * A), scratch(static_cast<std::size_t>(B) * heads_ * T * T);
    crossentropy_backward(dlogits.data(), probs_.data(), y_.data(), B, T, V);
    matmul_backward(dln.data(), G(wte), nullptr, dlogits.data(), lnf_.data(), P(wte), n, C, V);
    layernorm_backward(dres.data(), G(lnfw), G(lnfb), dln.data(), res3_.data() + (L - 1) * NC, P(lnfw), lnf_mean_.data(),
                       lnf_rstd_.data(), B, T, C);
    //! [tensor_parallel_backward]
    for (int l = L - 1; l >= 0; --l) {
        const std::size_t at = l * NC;
        const float* in = l == 0 ? encoded_.data() : res3_.data() + at - NC;
        // res3 = res2 + c_proj(gelu(c_fc(ln2))): this rank's hidden units
        std::fill(dgelu.begin(), dgelu.end(), 0.0f);
        matmul_backward(dgelu.data(), G(fcprojw, l), G(fcprojb, l), dres.data(), fch_gelu_.data() + l * N * H,
                        P(fcprojw, l), n, H, C);
        std::fill(dfch.begin(), dfch.end(), 0.0f);
        gelu_backward(dfch.data(), fch_.data() + l * N * H, dgelu.data(), n * H);
        std::fill(dln.begin(), dln.end(), 0.0f);
        matmul_backward(dln.data(), G(fcw, l), G(fcb, l), dfch.data(), ln2_.data() + at, P(fcw, l), n, C, H);
        allreduce(dln.data(), NC);  // every rank's hidden units' share of d(ln2)
        layernorm_backward(dres.data(), G(ln2w, l), G(ln2b, l), dln.data(), res2_.data() + at, P(ln2w, l),
                           ln2_mean_.data() + l * N, ln2_rstd_.data() + l * N, B, T, C);
        // res2 = in + c_proj(attention(c_attn(ln1))): this rank's heads
        std::fill(datty.begin(), datty.end(), 0.0f);
        matmul_backward(datty.data(), G(attprojw, l), G(attprojb, l), dres.data(), atty_.data() + l * N * A,
                        P(attprojw, l), n, A, C);
        std::fill(dqkv.begin(), dqkv.end(), 0.0f);
        attention_backward(dqkv.data(), scratch.data(), datty.data(), qkv_.data() + l * N * 3 * A,
                           att_.data() + static_cast<std::size_t>(l) * B * heads_ * T * T, nullptr, 0.0f, B, T, A,
                           heads_, c.causal, c.scaled_attention);
        std::fill(dln.begin(), dln.end(), 0.0f);
        matmul_backward(dln.data(), G(qkvw, l), G(qkvb, l), dqkv.data(), ln1_.data() + at, P(qkvw, l), n, C, 3 * A);
        allreduce(dln.data(), NC);  // every rank's heads' share of d(ln1)
        layernorm_backward(dres.data(), G(ln1w, l), G(ln1b, l), dln.data(), in, P(ln1w, l), ln1_mean_.data() + l * N,
                           ln1_rstd_.data() + l * N, B, T, C);
    }
    //! [tensor_parallel_backward]
    encoder_backward(G(wte), G(wpe), dres.data(), x_.data(), B, T, C);
}

TensorParallelGPT::Layout TensorParallelGPT::layout() const {
    const GPTConfig& c = config_;
    Layout layout{static_cast<std::size_t>(c.vocab_size), static_cast<std::size_t>(c.block_size),
                  static_cast<std::size_t>(c.n_embd), static_cast<std::size_t>(c.n_layer),
                  static_cast<std::size_t>(width_), static_cast<std::size_t>(hidden_), c.bias};
    for (int k = 0; k < whole_count; ++k) layout.whole_base[k] = bases_[static_cast<std::size_t>(k)];
    for (int k = 0; k < block_count; ++k) layout.block_base[k] = bases_[static_cast<std::size_t>(whole_count + k)];
    return layout;
}

std::vector<float> TensorParallelGPT::whole_gradients() const { return whole_of(grads_); }

std::vector<float> TensorParallelGPT::whole_of(const std::vector<float>& local) const {
    require(local.size() == params_.size(), "a part of " + std::to_string(local.size()) + " floats for a rank's " +
                                                std::to_string(params_.size()));
    const Layout layout = this->layout();
    // Every rank's slices (all of one size: the split divides evenly).
    std::vector<float> every(local.size() * static_cast<std::size_t>(size_));
    MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_FLOAT, every.data(),
                  static_cast<int>(local.size()), MPI_FLOAT, comm_);
    std::vector<float> whole(whole_size_, 0.0f);
    for (int r = 0; r < size_; ++r) {
        const float* theirs = every.data() + static_cast<std::size_t>(r) * local.size();
        layout.for_each_run(r, [&](std::size_t to, std::size_t at, std::size_t n, bool replicated) {
            if (replicated && r != rank_) return;  // the same on every rank: this rank's
            std::copy(theirs + at, theirs + at + n, whole.begin() + static_cast<std::ptrdiff_t>(to));
        });
    }
    return whole;
}

TensorParallelDevice::TensorParallelDevice(MPI_Comm tensor, MPI_Comm data) : tensor_(tensor), data_(data) {
    MPI_Comm_rank(tensor_, &tensor_rank_);
    MPI_Comm_size(tensor_, &tensor_size_);
    if (data_ != MPI_COMM_NULL) {
        MPI_Comm_rank(data_, &data_rank_);
        MPI_Comm_size(data_, &data_size_);
    }
}

std::string TensorParallelDevice::name() const {
    return "the CPU, tensor parallel over " + std::to_string(tensor_size_) + " ranks" +
           (data_size_ > 1 ? " x " + std::to_string(data_size_) + " data-parallel copies" : "");
}

void TensorParallelDevice::push(const GPT& model, const AdamW& optimizer) {
    split_ = std::make_unique<TensorParallelGPT>(model, tensor_);
    local_ = optimizer;  // the hyper-parameters and the step count; the moments cut below
    if (!optimizer.m.empty() && optimizer.m.size() == split_->local_parameters() &&
        optimizer.m.size() != model.config().num_parameters()) {
        // this rank's runs already (Trainer::load of a model with whole weights read them alone)
    } else if (!optimizer.m.empty()) {
        local_.m = split_->local_of(optimizer.m);
        local_.v = split_->local_of(optimizer.v);
    }
}

void TensorParallelDevice::adopt(GPT& model, AdamW& optimizer) {
    if (!model.parameters().empty()) {
        push(model, optimizer);
        return;
    }
    // No whole weights on the host: this rank's runs, read already or drawn from the seed.
    const std::vector<AdamW::Segment> mine = TensorParallelGPT::runs_of(model, tensor_rank_, tensor_size_);
    std::vector<std::pair<std::size_t, std::size_t>> runs;
    std::size_t held = 0;  // this rank's parameters
    for (const AdamW::Segment& r : mine) {
        runs.emplace_back(r.offset, r.size);
        held += r.size;
    }
    // The moments moved, not copied: this rank's runs (Trainer::load read only those), or
    // whole ones in the flat layout (one tensor-parallel rank reads them all) cut to its runs,
    // one moment at a time, before the slices' gradients are made.
    const std::size_t whole = model.config().num_parameters();
    std::vector<float> m = std::move(optimizer.m), v = std::move(optimizer.v);
    std::vector<float>().swap(optimizer.m);
    std::vector<float>().swap(optimizer.v);
    if (!(m.size() == v.size() && (m.empty() || m.size() == whole || m.size() == held))) {
        throw std::invalid_argument("tensor parallelism: AdamW's moments of " + std::to_string(m.size()) + " and " +
                                    std::to_string(v.size()) + " parameters for a rank that holds " +
                                    std::to_string(held) + " of " + std::to_string(whole));
    }
    for (std::vector<float>* moment : {&m, &v}) {
        // Empty, or this rank's runs already; whole ones are in the flat layout (Trainer::load
        // reads runs that cover every parameter in that order), on one rank too.
        if (moment->size() != whole) continue;
        std::vector<float> part;
        part.reserve(held);
        for (const AdamW::Segment& r : mine) {
            part.insert(part.end(), moment->begin() + static_cast<std::ptrdiff_t>(r.offset),
                        moment->begin() + static_cast<std::ptrdiff_t>(r.offset + r.size));
        }
        moment->swap(part);
    }
    local_ = optimizer;  // the hyper-parameters and the step count
    local_.m = std::move(m);
    local_.v = std::move(v);
    split_ = std::make_unique<TensorParallelGPT>(model, tensor_, model.take_kept_weights(runs));
}

bool TensorParallelDevice::owned_state(ShardedState& out) const {
    out.scheme = "tensor-parallel";
    out.files = tensor_size_;
    out.file = data_rank_ == 0 ? tensor_rank_ : -1;  // the other copies hold the same
    out.segments.clear();
    std::vector<std::size_t> at;  // each written run's first float in the rank's buffers
    for (const TensorParallelGPT::Run& r : split_->runs()) {
        if (r.replicated && tensor_rank_ != 0) continue;  // rank 0 writes the whole tensors
        out.segments.push_back({r.whole, r.size});
        at.push_back(r.local);
    }
    const float* w = split_->model_parameters();
    out.weights = [w, at](std::size_t k) { return w + at[k]; };
    if (local_.m.empty()) {
        out.m = out.v = nullptr;
    } else {
        const float* m = local_.m.data();
        const float* v = local_.v.data();
        out.m = [m, at](std::size_t k) { return m + at[k]; };
        out.v = [v, at](std::size_t k) { return v + at[k]; };
    }
    return true;
}

std::string TensorParallelDevice::generate(const CharVocab& vocab, const std::string& prompt,
                                          const SampleOptions& options) {
    const int V = split_->config().vocab_size;
    return generate_text(
        [this, V](const int* context, int T) {
            split_->forward(context, nullptr, 1, T);
            return split_->logits().data() + static_cast<std::size_t>(T - 1) * static_cast<std::size_t>(V);
        },
        vocab, V, split_->config().block_size, prompt, options);
}

std::vector<float> TensorParallelDevice::gather_parameters() { return split_->whole_of(split_->parameters()); }

void TensorParallelDevice::pull(GPT& model, AdamW& optimizer) {
    // Into the model's own buffer: its tensors' pointers point there.
    const std::vector<float> whole = split_->whole_of(split_->parameters());
    std::copy(whole.begin(), whole.end(), model.parameters().begin());
    optimizer.step_count = local_.step_count;
    if (!local_.m.empty()) {
        optimizer.m = split_->whole_of(local_.m);
        optimizer.v = split_->whole_of(local_.v);
    }
}

float TensorParallelDevice::loss(const int* x, const int* y, int B, int T, bool, std::uint64_t) {
    // This copy's sequences of the batch (all of it without data-parallel copies), and the
    // whole batch's mean loss: the copies' means weighted by their shares.
    const auto [b0, b1] = batch_share(B, data_rank_, data_size_);
    share_ = static_cast<float>(b1 - b0) / static_cast<float>(B);
    const float mine = split_->forward(x + b0 * T, y + b0 * T, b1 - b0, T);
    if (data_size_ == 1) return mine;
    double sum = static_cast<double>(b1 - b0) / B * mine;
    MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_DOUBLE, MPI_SUM, data_);
    return static_cast<float>(sum);
}

//! [tensor_parallel_training]
float TensorParallelDevice::backward_and_clip(float max_norm) {
    split_->backward();
    step_traffic_ = split_->last_traffic();  // the step's forward and backward pass
    std::vector<float>& g = split_->local_gradients();
    if (data_size_ > 1) {  // the copies' shares of the batch's mean gradient, summed
        for (float& v : g) v *= share_;
        MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM, data_);
    }
    // The whole model's norm: the slices' squares summed over the ranks, the whole tensors'
    // (the same on every rank) once.
    auto [split, whole] = split_->gradient_square_sums();
    MPI_Allreduce(MPI_IN_PLACE, &split, 1, MPI_DOUBLE, MPI_SUM, tensor_);
    const float norm = static_cast<float>(std::sqrt(split + whole));
    const float coef = max_norm / (norm + 1e-6f);  // clip_grad_norm()'s rule
    if (max_norm > 0.0f && std::isfinite(norm) && coef < 1.0f) {
        for (float& v : g) v *= coef;
    }
    return norm;
}

void TensorParallelDevice::adamw_step(AdamW& optimizer, float lr) {
    local_.beta1 = optimizer.beta1;
    local_.beta2 = optimizer.beta2;
    local_.eps = optimizer.eps;
    local_.weight_decay = optimizer.weight_decay;
    local_.step_count = optimizer.step_count;
    local_.step(split_->parameters(), split_->local_gradients(), split_->local_table(), lr);
    optimizer.step_count = local_.step_count;
}
//! [tensor_parallel_training]

void TensorParallelDevice::copy_gradients_to(std::vector<float>& out) { out = split_->whole_gradients(); }

bool TensorParallelDevice::writes_files() const {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r == 0;
}

bool TensorParallelDevice::any(bool flag) {
    int f = flag ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &f, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    return f != 0;
}

void TensorParallelDevice::barrier() { MPI_Barrier(MPI_COMM_WORLD); }

}  // namespace attn::mpi
