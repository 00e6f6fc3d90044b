// The training loop around the GPT: recipes, steps, evaluation, checkpoints, sampling.
#include "attn/trainer.hpp"

#include "attn/bits.hpp"
#include "attn/checkpoint.hpp"
#include "attn/npy.hpp"
#include "attn/plot.hpp"
#include "attn/run_control.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <ostream>
#include <sstream>

namespace attn {

namespace fs = std::filesystem;
using json = nlohmann::json;

// ---------------------------------------------------------------------------------------
// Recipes

TrainConfig TrainConfig::named(const std::string& recipe) {
    TrainConfig c;  // the defaults are nanoGPT's CPU recipe
    if (recipe == "cpu") return c;
    if (recipe == "tiny") {
        c.recipe = "tiny";
        c.n_layer = 2;
        c.n_head = 2;
        c.n_embd = 32;
        c.block_size = 32;
        c.batch_size = 8;
        c.max_iters = 200;
        c.warmup_iters = 20;
        c.lr_decay_iters = 200;
        c.eval_interval = 50;
        c.eval_iters = 5;
        return c;
    }
    if (recipe == "shakespeare") {
        // nanoGPT's config/train_shakespeare_char.py, the GPU recipe (best val loss 1.4697).
        c.recipe = "shakespeare";
        c.n_layer = 6;
        c.n_head = 6;
        c.n_embd = 384;
        c.block_size = 256;
        c.batch_size = 64;
        c.dropout = 0.2f;
        c.max_iters = 5000;
        c.lr_decay_iters = 5000;
        c.warmup_iters = 100;
        c.eval_interval = 250;
        c.eval_iters = 200;
        return c;
    }
    throw std::invalid_argument("unknown recipe '" + recipe +
                                "' (the recipes are: cpu, tiny, shakespeare)");
}

void TrainConfig::shorten_to(std::int64_t steps) {
    max_iters = lr_decay_iters = steps;
    warmup_iters = std::min(warmup_iters, steps);
}

void TrainConfig::make_quick() {
    shorten_to(3);
    eval_interval = 2;
    eval_iters = 2;
}

void TrainConfig::validate() const {
    auto check = [](bool ok, const std::string& what) {
        if (!ok) throw std::invalid_argument(what);
    };
    check(batch_size >= 1, "batch_size must be at least 1, got " + std::to_string(batch_size));
    check(grad_accum >= 1 && grad_accum <= 65536,
          "grad_accum must be between 1 and 65536, got " + std::to_string(grad_accum));
    check(max_iters >= 1, "max_iters must be at least 1, got " + std::to_string(max_iters));
    check(std::isfinite(learning_rate) && learning_rate >= 0,
          "learning_rate must be finite and not negative");
    check(std::isfinite(min_lr) && min_lr >= 0, "min_lr must be finite and not negative");
    check(warmup_iters >= 0, "warmup_iters must not be negative");
    check(lr_decay_iters >= warmup_iters, "lr_decay_iters must be at least warmup_iters");
    check(weight_decay >= 0 && std::isfinite(weight_decay), "weight_decay must not be negative");
    check(beta1 >= 0 && beta1 < 1, "beta1 must be in [0, 1)");
    check(beta2 >= 0 && beta2 < 1, "beta2 must be in [0, 1)");
    check(grad_clip >= 0 && std::isfinite(grad_clip), "grad_clip must not be negative (0: off)");
    check(eval_interval >= 1, "eval_interval must be at least 1");
    check(eval_iters >= 1, "eval_iters must be at least 1");
    check(initial_loss_scale >= 1.0 && initial_loss_scale <= 0x1p100,
          "initial_loss_scale must be between 1 and 2^100");
    model_config(1).validate();
}

GPTConfig TrainConfig::model_config(int vocab_size) const {
    GPTConfig g;
    g.vocab_size = vocab_size;
    g.block_size = block_size;
    g.n_layer = n_layer;
    g.n_head = n_head;
    g.n_embd = n_embd;
    g.dropout = dropout;
    g.bias = bias;
    g.causal = causal;
    g.position = position;
    g.scaled_attention = scaled_attention;
    g.n_kv_head = n_kv_head;
    g.window = window;
    return g;
}

namespace {

json config_to_json(const TrainConfig& c) {
    return {{"recipe", c.recipe},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_embd", c.n_embd},
            {"block_size", c.block_size},
            {"dropout", c.dropout},
            {"bias", c.bias},
            {"causal", c.causal},
            {"position", position_name(c.position)},
            {"scaled_attention", c.scaled_attention},
            {"n_kv_head", c.n_kv_head},
            {"window", c.window},
            {"batch_size", c.batch_size},
            {"grad_accum", c.grad_accum},
            {"max_iters", c.max_iters},
            {"learning_rate", c.learning_rate},
            {"min_lr", c.min_lr},
            {"warmup_iters", c.warmup_iters},
            {"lr_decay_iters", c.lr_decay_iters},
            {"weight_decay", c.weight_decay},
            {"beta1", c.beta1},
            {"beta2", c.beta2},
            {"grad_clip", c.grad_clip},
            {"eval_interval", c.eval_interval},
            {"eval_iters", c.eval_iters},
            {"seed", c.seed},
            {"precision", precision_name(c.precision)},
            {"loss_scaling", c.loss_scaling},
            {"initial_loss_scale", c.initial_loss_scale},
            {"recompute", recompute_name(c.recompute)}};
}

template <class T>
T field(const json& j, const char* key, const fs::path& file) {
    if (!j.contains(key)) throw CheckpointError(file.string() + ": missing \"" + key + "\"");
    try {
        return j.at(key).get<T>();
    } catch (const json::exception&) {
        throw CheckpointError(file.string() + ": \"" + key + "\" has the wrong type (" +
                              j.at(key).type_name() + ")");
    }
}

TrainConfig config_from_json(const json& j, const fs::path& file) {
    TrainConfig c;
    c.recipe = field<std::string>(j, "recipe", file);
    c.n_layer = field<int>(j, "n_layer", file);
    c.n_head = field<int>(j, "n_head", file);
    c.n_embd = field<int>(j, "n_embd", file);
    c.block_size = field<int>(j, "block_size", file);
    c.dropout = field<float>(j, "dropout", file);
    c.bias = field<bool>(j, "bias", file);
    c.causal = j.contains("causal") ? field<bool>(j, "causal", file) : true;  // optional: masked
    if (j.contains("position")) {  // optional: learned
        try {
            c.position = parse_position(field<std::string>(j, "position", file));
        } catch (const std::invalid_argument& e) {
            throw CheckpointError(file.string() + ": " + e.what());
        }
    }
    c.scaled_attention =
        j.contains("scaled_attention") ? field<bool>(j, "scaled_attention", file) : true;
    // optional: multi-head attention over the whole context
    c.n_kv_head = j.contains("n_kv_head") ? field<int>(j, "n_kv_head", file) : 0;
    c.window = j.contains("window") ? field<int>(j, "window", file) : 0;
    c.batch_size = field<int>(j, "batch_size", file);
    c.grad_accum = j.contains("grad_accum") ? field<int>(j, "grad_accum", file) : 1;  // optional: one batch a step
    c.max_iters = field<std::int64_t>(j, "max_iters", file);
    c.learning_rate = field<double>(j, "learning_rate", file);
    c.min_lr = field<double>(j, "min_lr", file);
    c.warmup_iters = field<std::int64_t>(j, "warmup_iters", file);
    c.lr_decay_iters = field<std::int64_t>(j, "lr_decay_iters", file);
    c.weight_decay = field<float>(j, "weight_decay", file);
    c.beta1 = field<float>(j, "beta1", file);
    c.beta2 = field<float>(j, "beta2", file);
    c.grad_clip = field<float>(j, "grad_clip", file);
    c.eval_interval = field<std::int64_t>(j, "eval_interval", file);
    c.eval_iters = field<std::int64_t>(j, "eval_iters", file);
    c.seed = field<std::uint64_t>(j, "seed", file);
    if (j.contains("precision")) {  // optional: fp32
        try {
            c.precision = parse_precision(field<std::string>(j, "precision", file));
        } catch (const std::invalid_argument& e) {
            throw CheckpointError(file.string() + ": " + e.what());
        }
    }
    c.loss_scaling = j.contains("loss_scaling") ? field<bool>(j, "loss_scaling", file) : true;
    if (j.contains("initial_loss_scale")) c.initial_loss_scale = field<double>(j, "initial_loss_scale", file);
    if (j.contains("recompute")) {  // optional: none
        try {
            c.recompute = parse_recompute(field<std::string>(j, "recompute", file));
        } catch (const std::invalid_argument& e) {
            throw CheckpointError(file.string() + ": " + e.what());
        }
    }
    try {
        c.validate();
    } catch (const std::invalid_argument& e) {
        throw CheckpointError(file.string() + ": " + e.what());
    }
    return c;
}

std::string describe(float x) {
    return std::isnan(x) ? "NaN" : std::isinf(x) ? "infinite" : std::to_string(x);
}

// A random source for the evaluation batches of one split at one step: it depends on
// nothing else, so evaluating never shifts the training batches and a resumed run
// evaluates on the same batches as an uninterrupted one.
Rng eval_rng(std::uint64_t seed, std::int64_t step, int split) {
    return Rng(seed ^ (0x5DEECE66Dull << 20) ^ (static_cast<std::uint64_t>(step) * 2u + split));
}

void check_data(const TextDataset& data, const GPTConfig& g) {
    const auto need = static_cast<std::size_t>(g.block_size) + 1;
    if (data.train.size() < need || data.val.size() < need) {
        throw std::invalid_argument(
            "the corpus is too short for block size " + std::to_string(g.block_size) + ": its splits hold " +
            std::to_string(data.train.size()) + " and " + std::to_string(data.val.size()) +
            " characters, each needs at least " + std::to_string(need));
    }
    if (static_cast<int>(data.vocab.size()) != g.vocab_size) {
        throw std::invalid_argument("the corpus has " + std::to_string(data.vocab.size()) +
                                    " distinct characters, the model's vocabulary " +
                                    std::to_string(g.vocab_size));
    }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Trainer

namespace {
GPT initial_model(const TrainConfig& config, const TextDataset& data, GPTBuffers buffers) {
    config.validate();
    return GPT(config.model_config(static_cast<int>(data.vocab.size())), config.seed, buffers);
}
}  // namespace

Trainer::Trainer(const TrainConfig& config, TextDataset data, GPTBuffers buffers)
    : config_(config), data_(std::move(data)), model_(initial_model(config_, data_, buffers)),
      batch_rng_(config.seed), best_val_loss_(std::numeric_limits<double>::infinity()) {
    finish_setup(false);
}

Trainer::Trainer(const TrainConfig& config, TextDataset data, GPT model)
    : config_(config), data_(std::move(data)), model_(std::move(model)),
      batch_rng_(config.seed), best_val_loss_(std::numeric_limits<double>::infinity()) {
    finish_setup(true);
}

void Trainer::finish_setup(bool from_weights) {
    if (from_weights) {
        const GPTConfig& g = model_.config();
        config_.n_layer = g.n_layer;
        config_.n_head = g.n_head;
        config_.n_embd = g.n_embd;
        config_.block_size = g.block_size;
        config_.bias = g.bias;
        config_.dropout = g.dropout;
        config_.causal = g.causal;
        config_.position = g.position;
        config_.scaled_attention = g.scaled_attention;
        config_.n_kv_head = g.n_kv_head;
        config_.window = g.window;
    }
    config_.validate();
    check_data(data_, model_.config());
    optimizer_.beta1 = config_.beta1;
    optimizer_.beta2 = config_.beta2;
    optimizer_.weight_decay = config_.weight_decay;
    model_.set_precision(config_.precision);
    model_.set_recompute(config_.recompute);
    scaler_.scale = config_.initial_loss_scale;  // Trainer::load then restores the run's
    model_.train(true);
}

void Trainer::set_max_iters(std::int64_t max_iters) {
    if (max_iters < 1) throw std::invalid_argument("max_iters must be at least 1");
    config_.max_iters = max_iters;
}

double Trainer::learning_rate(std::int64_t step) const {
    return cosine_lr(step, config_.warmup_iters, config_.lr_decay_iters, config_.learning_rate,
                     config_.min_lr);
}

void Trainer::first_batch(std::vector<int>& x, std::vector<int>& y) const {
    Rng rng(config_.seed);
    sample_batch(data_.train, static_cast<std::size_t>(config_.batch_size),
                 static_cast<std::size_t>(config_.block_size), rng, x, y);
}

//! [train_step]
StepRecord Trainer::train_step() {
    const int B = config_.batch_size, T = config_.block_size;
    StepRecord r;
    r.step = step_;
    r.lr = learning_rate(step_);
    Rng rng_before = batch_rng_;
    // Dropout masks depend on the seed and the step only, so a resumed run draws the same ones.
    const std::uint64_t dropout_seed =
        config_.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(step_);
    // Each stage runs on the GPU when one is attached (lesson 12), else here on the CPU.
    if (device_) {
        sample_batch(data_.train, static_cast<std::size_t>(B), static_cast<std::size_t>(T),
                     batch_rng_, x_, y_);
        r.loss = device_->loss(x_.data(), y_.data(), B, T, true, dropout_seed);
    } else {
        r.loss = cpu_forward_micro_batches(dropout_seed);
    }
    if (!std::isfinite(r.loss)) {
        batch_rng_ = rng_before;
        throw TrainingDiverged("the loss became " + describe(r.loss) + " at step " +
                               std::to_string(step_) + ": training stopped (a learning rate of " +
                               std::to_string(r.lr) + " may be too large)");
    }
    const float max_norm = config_.grad_clip > 0 ? config_.grad_clip
                                                 : std::numeric_limits<float>::infinity();
    if (device_) {
        r.grad_norm = device_->backward_and_clip(max_norm);
    } else if (!cpu_backward_and_clip(max_norm, r)) {
        ++step_;  // loss scaling skips the update (the scale is halved); the run goes on
        return r;
    }
    if (!std::isfinite(r.grad_norm)) {
        batch_rng_ = rng_before;
        throw TrainingDiverged("the gradient norm became " + describe(r.grad_norm) +
                               " at step " + std::to_string(step_) + ": training stopped");
    }
    if (device_) {
        device_->adamw_step(optimizer_, static_cast<float>(r.lr));
        host_stale_ = true;
    } else {
        cpu_adamw_step(static_cast<float>(r.lr));
    }
    ++step_;
    return r;
}
//! [train_step]

float Trainer::first_batch_gradients(std::vector<int>& x, std::vector<int>& y,
                                     std::vector<float>& grads) {
    if (group_) {
        throw std::invalid_argument("the first batch's gradients are dumped by one process: "
                                    "run it without a data-parallel group");
    }
    if (config_.grad_accum > 1) {
        throw std::invalid_argument("the first batch's gradients are one batch's, and a step of grad_accum " +
                                    std::to_string(config_.grad_accum) + " is " +
                                    std::to_string(config_.grad_accum) + " batches: dump them with grad_accum 1");
    }
    const int B = config_.batch_size, T = config_.block_size;
    first_batch(x, y);
    const float unclipped = std::numeric_limits<float>::infinity();
    float loss = 0.0f;
    if (device_) {
        loss = device_->loss(x.data(), y.data(), B, T, false, 0);
        device_->backward_and_clip(unclipped);
        device_->copy_gradients_to(grads);
        return loss;
    }
    model_.train(false);  // no dropout: PyTorch's model.eval() computes the same gradients
    loss = model_.forward(x.data(), y.data(), B, T);
    const float scale = scales_loss() ? static_cast<float>(scaler_.scale) : 1.0f;
    model_.zero_grad();
    cpu_backward(scale, false);
    cpu_unscale(scale);
    model_.train(true);
    grads = model_.gradients();
    model_.zero_grad();
    return loss;
}

std::pair<int, int> batch_share(int B, int rank, int ranks) {
    if (ranks < 1 || rank < 0 || rank >= ranks || B < 1) {
        throw std::invalid_argument("batch_share: rank " + std::to_string(rank) + " of " +
                                    std::to_string(ranks) + " processes, batch " + std::to_string(B));
    }
    const auto at = [&](int r) { return static_cast<int>(static_cast<long long>(B) * r / ranks); };
    return {at(rank), at(rank + 1)};
}

double Trainer::cpu_loss(std::uint64_t dropout_seed, int k) {
    const int B = config_.batch_size, T = config_.block_size;
    // Micro-batch k: the next B sequences of the batch source, the sequences k·B … k·B + B − 1
    // of the step's N·B.
    sample_batch(data_.train, static_cast<std::size_t>(B), static_cast<std::size_t>(T), batch_rng_, x_, y_);
    // Every micro-batch's dropout masks are those of its sequences in one batch of N·B: the
    // step's seed, and their places in that batch.
    model_.seed_dropout(dropout_seed);
    model_.train(true);
    // The backward pass divides by the whole batch's positions, B·T, in every process (not
    // by its own b·T, then weighted by b/B): the gradients entering the products are one
    // process's, whatever the shares, so that rounding them (mixed precision) rounds alike.
    model_.set_whole_batch(group_ ? B : 0);
    if (!group_) {
        model_.set_batch_offset(k * B);
        return model_.forward(x_.data(), y_.data(), B, T);
    }
    // This process's sequences of the batch, and its mean loss weighted by its share, so
    // that the processes' numbers sum to the whole batch's mean loss.
    const auto [b0, b1] = batch_share(B, group_->rank(), group_->size());
    model_.set_batch_offset(k * B + b0);
    const float local = model_.forward(x_.data() + b0 * T, y_.data() + b0 * T, b1 - b0, T);
    return static_cast<double>(b1 - b0) / B * local;
}

//! [accumulate]
float Trainer::cpu_forward_micro_batches(std::uint64_t dropout_seed) {
    const int N = config_.grad_accum;
    // Each pass's loss is 1/N of the step's, so the gradients added over the N passes are
    // those of the mean over the N·B·T positions (with loss scaling, times the scale).
    const float factor = (scales_loss() ? static_cast<float>(scaler_.scale) : 1.0f) / static_cast<float>(N);
    model_.zero_grad();
    rounding_at_step_ = model_.gradient_rounding();
    double loss = 0.0;
    for (int k = 0; k < N; ++k) {
        loss += cpu_loss(dropout_seed, k);
        // Not the last: its gradients stay in this process (no sum over the group).
        if (k + 1 < N) cpu_backward(factor, false);
    }
    // The processes' losses summed once a step, as their gradients will be.
    if (group_) loss = group_->sum(loss);
    return static_cast<float>(loss / N);
}

bool Trainer::cpu_backward_and_clip(float max_norm, StepRecord& record) {
    const bool scaling = scales_loss();
    const float scale = scaling ? static_cast<float>(scaler_.scale) : 1.0f;
    // The last micro-batch's backward pass, and then the one sum over the group: of every
    // micro-batch's gradients at once.
    cpu_backward(scale / static_cast<float>(config_.grad_accum), true);
    //! [accumulate]
    model_.set_batch_offset(group_ ? batch_share(config_.batch_size, group_->rank(), group_->size()).first : 0);
    const RoundingCounts& now = model_.gradient_rounding();
    record.rounded_gradients = now.values - rounding_at_step_.values;
    record.flushed_gradients = now.flushed - rounding_at_step_.flushed;
    record.subnormal_gradients = now.subnormal - rounding_at_step_.subnormal;
    record.loss_scale = scale;
    const bool finite = cpu_unscale(scale);
    if (scaling && !scaler_.update(finite)) {
        record.skipped = true;
        record.grad_norm = std::numeric_limits<float>::infinity();
        return false;
    }
    record.grad_norm = group_ ? group_->clip_gradients(model_, max_norm) : clip_grad_norm(model_, max_norm);
    return true;
}

void Trainer::cpu_backward(float factor, bool sum) {
    if (sum && group_) {
        // Each process's gradients are its part of the whole batch's mean already (cpu_loss
        // divides by the whole batch's positions): the group sums them as they are.
        group_->begin_gradients(model_, 1.0);
    }
    model_.backward(factor);
    if (sum && group_) group_->finish_gradients(model_);  // the whole batch's, in every process
}

bool Trainer::cpu_unscale(float unscale) {
    if (unscale == 1.0f) return true;
    // Back to the true gradients, in float32 (a power of two: exact). A scale too large
    // shows as an infinity: a product's input beyond float16's 65504.
    std::vector<float>& g = model_.gradients();
    const float inverse = 1.0f / unscale;
    bool finite = true;
    for (float& x : g) {
        x *= inverse;
        finite = finite && std::isfinite(x);
    }
    return finite;
}

void Trainer::cpu_adamw_step(float lr) {
    if (group_) {
        group_->update(model_, optimizer_, lr);
    } else {
        optimizer_.step(model_, lr);
    }
}

void Trainer::use_device(std::unique_ptr<TrainingDevice> device) {
    if (device && group_) {
        throw std::invalid_argument("data parallelism over processes trains on the CPU: a device "
                                    "cannot be attached to a trainer in a group");
    }
    if (device && config_.grad_accum > 1) {
        throw std::invalid_argument("gradient accumulation (grad_accum " + std::to_string(config_.grad_accum) +
                                    ") adds the micro-batches' gradients in the CPU model: a device's backward "
                                    "pass clips its gradients at once");
    }
    if (device && config_.precision != device->precision()) {
        throw std::invalid_argument(std::string("mixed precision (") + precision_name(config_.precision) +
                                    "): the device's products are in " + precision_name(device->precision()) +
                                    (config_.precision == Precision::fp16
                                         ? " (loss scaling, which fp16 needs, is the CPU model's)"
                                         : ""));
    }
    if (device && config_.recompute != Recompute::none) {
        throw std::invalid_argument(std::string("recomputation (") + recompute_name(config_.recompute) +
                                    ") is the CPU model's: a device keeps every activation");
    }
    if (device_ && !device && model_.parameters().empty()) {
        throw std::invalid_argument("the device keeps the only copy of the training state (the host model was made "
                                    "without whole weights): save a checkpoint and load it instead");
    }
    sync_from_device();
    device_ = std::move(device);
    if (device_) device_->adopt(model_, optimizer_);
}

void Trainer::sync_from_device() {
    // A host model made without whole weights keeps no copy: the device holds the state.
    if (device_ && host_stale_ && !model_.parameters().empty()) device_->pull(model_, optimizer_);
    host_stale_ = false;
}

EvalRecord Trainer::evaluate() {
    const int B = config_.batch_size, T = config_.block_size;
    EvalRecord e;
    e.step = step_;
    model_.train(false);
    std::vector<int> x, y;
    // In a group each process evaluates its share of every batch (as in train_step).
    const auto [b0, b1] = group_ ? batch_share(B, group_->rank(), group_->size()) : std::pair{0, B};
    const double share = static_cast<double>(b1 - b0) / B;
    if (group_) model_.set_batch_offset(b0);
    for (int split = 0; split < 2; ++split) {
        const std::vector<int>& data = split == 0 ? data_.train : data_.val;
        Rng rng = eval_rng(config_.seed, step_, split);
        double sum = 0.0;
        for (std::int64_t i = 0; i < config_.eval_iters; ++i) {
            sample_batch(data, static_cast<std::size_t>(B), static_cast<std::size_t>(T), rng, x, y);
            sum += device_ ? device_->loss(x.data(), y.data(), B, T, false, 0)
                           : share * model_.forward(x.data() + b0 * T, y.data() + b0 * T, b1 - b0, T);
        }
        if (group_) sum = group_->sum(sum);
        (split == 0 ? e.train_loss : e.val_loss) = sum / static_cast<double>(config_.eval_iters);
    }
    model_.train(true);
    if (e.val_loss < best_val_loss_) best_val_loss_ = e.val_loss;
    return e;
}

std::string Trainer::trainer_json() const {
    const Rng::State rs = batch_rng_.state();
    const json j = {{"config", config_to_json(config_)},
                    {"step", step_},
                    {"best_val_loss", std::isfinite(best_val_loss_) ? json(best_val_loss_) : json(nullptr)},
                    {"adamw_step_count", optimizer_.step_count},
                    {"loss_scaler", {{"scale", scaler_.scale}, {"good_steps", scaler_.good_steps},
                                     {"skipped_steps", scaler_.skipped_steps}}},
                    {"batch_rng", {{"words", rs.words}, {"has_spare", rs.has_spare},
                                   {"spare_bits", bits_of(rs.spare)}}}};
    return j.dump(2) + "\n";
}

void Trainer::save_sharded(const fs::path& dir, const ShardedState& own, const std::function<void()>& barrier) {
    const fs::path target = dir.filename().empty() ? dir.parent_path() : dir;
    // Each rank's file goes first to a folder beside the checkpoint, then into the new
    // checkpoint directory that rank 0 puts in place atomically.
    const fs::path staging = target.parent_path() / ("." + target.filename().string() + ".shards");
    // A process that writes no file (a copy of another's state) only waits with the others.
    const int rank = own.file, ranks = own.files;
    std::error_code ec;
    if (rank == 0) {
        fs::remove_all(staging, ec);  // what a save killed before it was complete left
        fs::create_directories(staging);
    }
    barrier();
    if (rank < 0) {
        barrier();
        barrier();
        return;
    }
    auto file_of = [](int r) {
        char name[32];
        std::snprintf(name, sizeof name, "shard-%05d.bin", r);
        return std::string(name);
    };
    const std::uint64_t sum = write_shard_file(staging / file_of(rank), own.segments, own.weights, own.m, own.v);
    {
        json runs = json::array();
        for (const AdamW::Segment& s : own.segments) runs.push_back({s.offset, s.size});
        std::ofstream out(staging / (file_of(rank) + ".json"));
        out << json{{"segments", runs}, {"checksum", sum}, {"scheme", own.scheme}}.dump() << "\n";
        if (!out) throw CheckpointError((staging / (file_of(rank) + ".json")).string() + ": cannot write");
    }
    barrier();
    if (rank == 0) {
        write_directory_atomically(target, [&](const fs::path& tmp) {
            save_model_config(tmp, model_, {data_.vocab.chars(), step_});
            json files = json::array();
            std::vector<std::pair<std::string, std::uint64_t>> known;
            for (int r = 0; r < ranks; ++r) {
                const fs::path part = staging / (file_of(r) + ".json");
                std::ifstream in(part);
                json j;
                try {
                    j = json::parse(in);
                } catch (const json::exception& e) {
                    throw CheckpointError(part.string() + ": not valid JSON: " + e.what());
                }
                files.push_back({{"name", file_of(r)}, {"segments", j.at("segments")}});
                known.emplace_back(file_of(r), j.at("checksum").get<std::uint64_t>());
                fs::rename(staging / file_of(r), tmp / file_of(r));
            }
            std::ofstream layout(tmp / "shards.json");
            layout << json{{"format", "attn sharded checkpoint 1"}, {"scheme", own.scheme}, {"ranks", ranks},
                           {"parameters", model_.config().num_parameters()}, {"files", files}}.dump(1) << "\n";
            std::ofstream out(tmp / "trainer.json");
            out << trainer_json();
            layout.close();
            out.close();
            if (!out || !layout) throw CheckpointError(target.string() + ": cannot write trainer.json or shards.json");
            write_checksums(tmp, known);
        });
        fs::remove_all(staging, ec);
    }
    barrier();
}

void Trainer::save(const fs::path& dir) {
    ShardedState own;
    // A device split over processes writes its parts where they lie: nothing is pulled.
    if (device_ && device_->owned_state(own)) {
        save_sharded(dir, own, [this] { device_->barrier(); });
        return;
    }
    sync_from_device();
    if (group_ && group_->owned_state(model_, optimizer_, own)) {
        own.file = group_->rank();
        own.files = group_->size();
        save_sharded(dir, own, [this] { group_->barrier(); });
        return;
    }
    // In a group every process holds the same state: rank 0 writes it once, and the others
    // wait, so that a checkpoint that one process calls written is written for all.
    // A group's shards of the weights gathered (every process takes part), or the model's.
    std::vector<float> gathered;
    if (model_.has_weight_source()) gathered = model_.gather_parameters();
    const std::vector<float>& weights = model_.has_weight_source() ? gathered : model_.parameters();
    // The moments written where they lie when this process holds them whole (no copy);
    // else gathered by the group, or zeros before the first step.
    const std::size_t P = weights.size();
    std::vector<float> m, v;
    const bool whole = optimizer_.m.size() == P && optimizer_.v.size() == P;
    if (!whole && group_) group_->whole_moments(model_, optimizer_, m, v);
    if (!writes_files()) {
        if (group_) group_->barrier();
        if (device_) device_->barrier();
        return;
    }
    write_directory_atomically(dir, [&](const fs::path& tmp) {
        save_checkpoint_weights(tmp, model_, weights, {data_.vocab.chars(), step_});
        fs::create_directory(tmp / "optimizer");
        if (!whole) {
            if (m.empty()) m = optimizer_.m;
            if (v.empty()) v = optimizer_.v;
            m.resize(P, 0.0f);
            v.resize(P, 0.0f);
        }
        write_npy(tmp / "optimizer" / "m.npy", {P}, whole ? optimizer_.m.data() : m.data());
        write_npy(tmp / "optimizer" / "v.npy", {P}, whole ? optimizer_.v.data() : v.data());
        std::ofstream out(tmp / "trainer.json");
        out << trainer_json();
        out.close();
        if (!out) throw CheckpointError((dir / "trainer.json").string() + ": cannot write");
        write_checksums(tmp);
    });
    if (group_) group_->barrier();
    if (device_) device_->barrier();
}

MemoryUse Trainer::memory_use() const {
    MemoryUse use = model_.memory_use();
    use.optimizer = optimizer_.bytes();
    if (group_) {
        use.gradients += group_->gradient_bytes();
        use.weights += group_->weight_bytes();
    }
    return use;
}

std::vector<float> Trainer::whole_parameters() {
    if (device_ && model_.parameters().empty()) return device_->gather_parameters();  // no host copy
    sync_from_device();
    return model_.gather_parameters();
}

void Trainer::use_group(std::shared_ptr<DataParallelGroup> group) {
    if (group && device_) {
        throw std::invalid_argument("data parallelism over processes trains on the CPU: this "
                                    "trainer has a device attached");
    }
    if (group && group->size() > config_.batch_size) {
        throw std::invalid_argument("a batch of " + std::to_string(config_.batch_size) +
                                    " sequences cannot be shared by " + std::to_string(group->size()) +
                                    " processes: each needs at least one (fewer processes, or a "
                                    "larger batch)");
    }
    if (group && !group->holds_whole_gradients() && scales_loss()) {
        throw std::invalid_argument(std::string("loss scaling (") + precision_name(config_.precision) +
                                    ") looks for an overflow in every gradient, and with the optimizer "
                                    "state sharded each process holds only its shard of them: train "
                                    "in bf16 or fp32");
    }
    if (group && config_.grad_accum > 1 && !group->accumulates_in_model()) {
        throw std::invalid_argument("gradient accumulation (grad_accum " + std::to_string(config_.grad_accum) +
                                    ") adds the micro-batches' gradients in the model before one sum, and this "
                                    "group sums each block's as the backward pass finishes it (ZeRO stages 2 "
                                    "and 3): shard the optimizer only, or take one batch a step");
    }
    // The whole weights back from a group that kept them (ZeRO stage 3): a collective call.
    model_.set_weight_source({});
    group_ = std::move(group);
    model_.set_batch_offset(0);
    model_.set_gradient_sink({});  // a group that wants one (ZeRO stage 2) sets its own
    if (group_) {
        group_->check_same(state_fingerprint(),
                           "the run's settings, weights, optimizer, step and corpus (started "
                           "from different checkpoints or corpora?)");
        group_->attach(model_);
    }
}

bool Trainer::stop_agreed(bool requested) {
    if (group_) return group_->any(requested);
    return device_ ? device_->any(requested) : requested;
}

std::uint64_t Trainer::state_fingerprint() const {
    std::uint64_t h = 0x243F6A8885A308D3ull;
    auto add = [&h](const void* data, std::size_t bytes) {
        const auto* p = static_cast<const unsigned char*>(data);
        for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001B3ull;  // FNV-1a
    };
    auto add_floats = [&add](const std::vector<float>& v) { add(v.data(), v.size() * sizeof(float)); };
    const std::string config = config_to_json(config_).dump();
    add(config.data(), config.size());
    add_floats(model_.parameters());
    // The moments when a process holds them whole; a process that read only its shard of a
    // sharded checkpoint (Trainer::load's `kept`) holds its own, which the checksums checked.
    if (optimizer_.m.size() == model_.parameters().size()) {
        add_floats(optimizer_.m);
        add_floats(optimizer_.v);
    }
    add(&optimizer_.step_count, sizeof optimizer_.step_count);
    add(&step_, sizeof step_);
    const Rng::State rs = batch_rng_.state();
    add(rs.words.data(), sizeof rs.words);
    const std::uint32_t spare = rs.has_spare ? bits_of(rs.spare) : 0u;
    add(&spare, sizeof spare);
    add(data_.train.data(), data_.train.size() * sizeof(int));
    add(data_.val.data(), data_.val.size() * sizeof(int));
    const std::string vocab = data_.vocab.chars();
    add(vocab.data(), vocab.size());
    return h;
}

namespace {
// The weights of `runs` of a checkpoint of either layout into `out`, one run after the other,
// a tensor at a time (a buffer of one tensor beside them: each tensor is read once, for every
// run that takes a piece of it, as a tensor-parallel rank's runs of a row each); a NaN or an
// infinity is refused.
void read_weights(const fs::path& dir, const GPT& model, const std::vector<AdamW::Segment>& runs, float* out) {
    const std::size_t P = model.config().num_parameters();
    std::vector<float> tensor;
    const bool sharded = is_sharded_checkpoint(dir);
    const ShardLayout layout = sharded ? read_shard_layout(dir, P) : ShardLayout{};
    std::vector<std::size_t> starts;  // where each run starts in `out`
    std::size_t at = 0;
    for (const AdamW::Segment& run : runs) {
        starts.push_back(at);
        at += run.size;
    }
    std::vector<AdamW::Segment> pieces;  // of one tensor, in the flat buffer
    std::vector<std::size_t> into;       // where each piece goes in `out`
    for (const ParameterInfo& p : model.parameter_table()) {
        pieces.clear();
        into.clear();
        for (std::size_t k = 0; k < runs.size(); ++k) {
            const AdamW::Segment& run = runs[k];
            const std::size_t a = std::max(run.offset, p.offset), b = std::min(run.offset + run.size, p.offset + p.size);
            if (a >= b) continue;
            pieces.push_back({a, b - a});
            into.push_back(starts[k] + (a - run.offset));
        }
        if (pieces.empty()) continue;
        fs::path file = dir / (p.name + ".npy");
        std::size_t from = 0;  // where the pieces are read from, in `tensor`
        if (sharded) {
            file = dir / "shards.json";
            read_shard_ranges(dir, layout, ShardPart::weights, pieces, tensor);  // the pieces one after the other
        } else {
            NpyArray t;
            try {
                t = read_npy(file);
            } catch (const NpyError& e) {
                throw CheckpointError(e.what());
            }
            if (t.dtype != "<f4" || t.shape != p.shape) {
                throw CheckpointError(file.string() + ": expected float32 of shape " + format_shape(p.shape) +
                                      ", the file holds " + t.dtype + " " + format_shape(t.shape));
            }
            tensor = std::move(t.data);
        }
        for (std::size_t i = 0; i < pieces.size(); ++i) {
            const float* first = tensor.data() + (sharded ? from : pieces[i].offset - p.offset);
            const std::size_t n = pieces[i].size;
            from += n;
            const float* bad = std::find_if(first, first + n, [](float x) { return !std::isfinite(x); });
            if (bad != first + n) {
                throw CheckpointError(file.string() + ": " + p.name + " holds " + (std::isnan(*bad) ? "NaN" : "an infinity") +
                                      " at index " + std::to_string(pieces[i].offset - p.offset +
                                                                    static_cast<std::size_t>(bad - first)));
            }
            std::copy(first, first + n, out + into[i]);
        }
    }
}
}  // namespace

GPT load_kept_weights(const fs::path& dir, const GPTConfig& config, GPTBuffers buffers,
                      const std::function<std::vector<AdamW::Segment>(const GPT&)>& kept) {
    verify_checksums(dir);
    GPT m(config, 1337, buffers);  // load_checkpoint's seed (the dropout masks draw from it)
    const std::size_t P = config.num_parameters();
    if (buffers.weights) {
        read_weights(dir, m, {{0, P}}, m.parameters().data());
        return m;
    }
    const std::vector<AdamW::Segment> runs = kept ? kept(m) : std::vector<AdamW::Segment>{{0, P}};
    std::size_t n = 0;
    std::vector<std::pair<std::size_t, std::size_t>> pairs;
    for (const AdamW::Segment& r : runs) {
        n += r.size;
        pairs.emplace_back(r.offset, r.size);
    }
    std::vector<float> values(n);
    read_weights(dir, m, runs, values.data());
    m.set_kept_weights(std::move(pairs), std::move(values));
    return m;
}

Trainer Trainer::load(const fs::path& dir, TextDataset data,
                      const std::function<std::vector<AdamW::Segment>(const GPT&)>& kept, GPTBuffers buffers) {
    recover_directory(dir);  // a save killed between its renames left it beside
    if (!fs::is_directory(dir)) {
        throw CheckpointError(dir.string() + ": no such checkpoint directory");
    }
    verify_checksums(dir);  // every file as it was written, before any is read
    const fs::path file = dir / "trainer.json";
    std::ifstream in(file);
    if (!in) {
        throw CheckpointError(file.string() +
                              ": cannot open (a weights directory without training state? "
                              "start from it with --init instead)");
    }
    json j;
    try {
        in >> j;
    } catch (const json::exception& e) {
        throw CheckpointError(file.string() + ": not valid JSON: " + e.what());
    }
    if (!j.is_object()) throw CheckpointError(file.string() + ": expected a JSON object");
    const TrainConfig config = config_from_json(field<json>(j, "config", file), file);

    CheckpointInfo info;
    GPT model = [&] {
        if (buffers.weights && buffers.gradients) return load_checkpoint(dir, &info, false);
        // A model made without some whole buffers: its weights read into it, or only the runs
        // this process keeps, left for its group.
        GPT m(load_config(dir, &info), config.seed, buffers);
        const std::size_t P = m.config().num_parameters();
        if (buffers.weights) {
            read_weights(dir, m, {{0, P}}, m.parameters().data());
        } else {
            std::vector<AdamW::Segment> runs = kept ? kept(m) : std::vector<AdamW::Segment>{{0, P}};
            std::size_t n = 0;
            std::vector<std::pair<std::size_t, std::size_t>> pairs;
            for (const AdamW::Segment& r : runs) {
                n += r.size;
                pairs.emplace_back(r.offset, r.size);
            }
            std::vector<float> values(n);
            read_weights(dir, m, runs, values.data());
            m.set_kept_weights(std::move(pairs), std::move(values));
        }
        return m;
    }();
    const GPTConfig expected = config.model_config(model.config().vocab_size);
    const GPTConfig& got = model.config();
    if (got.n_layer != expected.n_layer || got.n_head != expected.n_head ||
        got.n_embd != expected.n_embd || got.block_size != expected.block_size ||
        got.bias != expected.bias || got.causal != expected.causal ||
        got.position != expected.position || got.kv_heads() != expected.kv_heads() ||
        got.window != expected.window || got.scaled_attention != expected.scaled_attention) {
        throw CheckpointError(dir.string() + ": config.json and trainer.json describe different models");
    }
    if (info.vocab != data.vocab.chars()) {
        throw CheckpointError(dir.string() + ": the checkpoint's vocabulary (" +
                              std::to_string(got.vocab_size) +
                              " characters) is not this corpus's (" +
                              std::to_string(data.vocab.size()) +
                              "): resume with the corpus it was trained on");
    }
    Trainer t(config, std::move(data), std::move(model));
    t.step_ = field<std::int64_t>(j, "step", file);
    if (t.step_ != info.step || t.step_ < 0) {
        throw CheckpointError(file.string() + ": step " + std::to_string(t.step_) +
                              " disagrees with config.json's " + std::to_string(info.step));
    }
    const json& best = field<json>(j, "best_val_loss", file);
    t.best_val_loss_ = best.is_null() ? std::numeric_limits<double>::infinity()
                                      : field<double>(j, "best_val_loss", file);
    t.optimizer_.step_count = field<long>(j, "adamw_step_count", file);
    if (j.contains("loss_scaler")) {  // optional: a new scaler
        const json& sj = field<json>(j, "loss_scaler", file);
        t.scaler_.scale = field<double>(sj, "scale", file);
        t.scaler_.good_steps = field<long>(sj, "good_steps", file);
        t.scaler_.skipped_steps = field<long>(sj, "skipped_steps", file);
        if (!(t.scaler_.scale > 0.0) || !std::isfinite(t.scaler_.scale)) {
            throw CheckpointError(file.string() + ": the loss scale must be positive and finite");
        }
    }
    const json& rj = field<json>(j, "batch_rng", file);
    Rng::State rs;
    rs.words = field<std::array<std::uint64_t, 4>>(rj, "words", file);
    rs.has_spare = field<bool>(rj, "has_spare", file);
    rs.spare = float_of(field<std::uint32_t>(rj, "spare_bits", file));
    try {
        t.batch_rng_ = Rng::from_state(rs);
    } catch (const std::invalid_argument& e) {
        throw CheckpointError(file.string() + ": " + e.what());
    }
    const std::size_t P = t.model_.config().num_parameters();
    std::vector<AdamW::Segment> runs = kept ? kept(t.model_) : std::vector<AdamW::Segment>{};
    std::size_t n = 0;
    for (const AdamW::Segment& s : runs) n += s.size;
    if (runs.empty() || n == P) runs = {{0, P}};  // all of them, in the flat order
    if (is_sharded_checkpoint(dir)) {
        // Only the moments this process keeps, read from the ranks' files where they lie.
        const ShardLayout layout = read_shard_layout(dir, P);
        read_shard_ranges(dir, layout, ShardPart::m, runs, t.optimizer_.m);
        read_shard_ranges(dir, layout, ShardPart::v, runs, t.optimizer_.v);
        return t;
    }
    for (auto [name, target] : {std::pair{"m.npy", &t.optimizer_.m}, {"v.npy", &t.optimizer_.v}}) {
        const fs::path f = dir / "optimizer" / name;
        NpyArray a;
        try {
            a = read_npy(f);
        } catch (const NpyError& e) {
            throw CheckpointError(e.what());
        }
        if (a.dtype != "<f4" || a.shape != std::vector<std::size_t>{P}) {
            throw CheckpointError(f.string() + ": expected float32 of shape (" + std::to_string(P) +
                                  "), the file holds " + a.dtype + " " + format_shape(a.shape));
        }
        if (runs.size() == 1 && runs[0].size == P) {
            *target = std::move(a.data);
            continue;
        }
        // The runs this process keeps, cut at once: one whole moment at a time.
        target->clear();
        target->reserve(n);
        for (const AdamW::Segment& s : runs) {
            target->insert(target->end(), a.data.begin() + static_cast<std::ptrdiff_t>(s.offset),
                           a.data.begin() + static_cast<std::ptrdiff_t>(s.offset + s.size));
        }
    }
    return t;
}

// ---------------------------------------------------------------------------------------
// Sampling

std::vector<double> sampling_weights(const std::vector<float>& logits, float temperature, int top_k,
                                     float top_p) {
    const int V = static_cast<int>(logits.size());
    if (V == 0) throw std::invalid_argument("sample_token: no logits");
    if (!(temperature > 0.0f) || !std::isfinite(temperature)) {
        throw std::invalid_argument("the temperature must be positive, got " +
                                    std::to_string(temperature) +
                                    " (for the most likely character every time use top-k 1)");
    }
    if (top_k < 0 || top_k > V) {
        throw std::invalid_argument("top-k must be 0 (all) or between 1 and the vocabulary size " +
                                    std::to_string(V) + ", got " + std::to_string(top_k));
    }
    if (!(top_p > 0.0f && top_p <= 1.0f)) {
        throw std::invalid_argument("top-p must be in (0, 1], got " + std::to_string(top_p));
    }
    // logits / temperature; then everything below the k-th largest is dropped (-inf).
    std::vector<double> z(logits.begin(), logits.end());
    for (double& x : z) x /= temperature;
    double kth = -std::numeric_limits<double>::infinity();
    if (top_k > 0) {
        std::vector<double> sorted = z;
        std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(),
                         std::greater<double>());
        kth = sorted[static_cast<std::size_t>(top_k - 1)];
    }
    const double maxval = *std::max_element(z.begin(), z.end());
    double total = 0.0;
    for (double& x : z) {
        x = (top_k > 0 && x < kth) ? 0.0 : std::exp(x - maxval);
        total += x;
    }
    if (top_p < 1.0f) {
        // The nucleus: the most likely tokens in order until their share reaches top_p.
        std::vector<int> order(static_cast<std::size_t>(V));
        for (int i = 0; i < V; ++i) order[static_cast<std::size_t>(i)] = i;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
            return z[static_cast<std::size_t>(a)] > z[static_cast<std::size_t>(b)];
        });
        const double reach = static_cast<double>(top_p) * total;
        double mass = 0.0;
        std::size_t kept = 0;
        while (kept < order.size() && mass < reach) mass += z[static_cast<std::size_t>(order[kept++])];
        kept = std::max<std::size_t>(kept, 1);  // the most likely token is always kept
        for (std::size_t i = kept; i < order.size(); ++i) z[static_cast<std::size_t>(order[i])] = 0.0;
    }
    return z;
}

namespace {

// One uniform draw in [0, total), 53 bits, then the first token whose running sum passes it.
int draw_from_weights(const std::vector<double>& z, Rng& rng) {
    double total = 0.0;
    for (double x : z) total += x;
    const double u = static_cast<double>(rng.next_u64() >> 11) * 0x1.0p-53 * total;
    double running = 0.0;
    int last_possible = 0;
    for (int i = 0; i < static_cast<int>(z.size()); ++i) {
        if (z[static_cast<std::size_t>(i)] <= 0.0) continue;
        last_possible = i;
        running += z[static_cast<std::size_t>(i)];
        if (u < running) return i;
    }
    return last_possible;  // u rounded up to total
}

}  // namespace

int sample_token(const std::vector<float>& logits, float temperature, int top_k, Rng& rng) {
    return draw_from_weights(sampling_weights(logits, temperature, top_k, 1.0f), rng);
}

void apply_penalties(std::vector<float>& logits, const std::vector<int>& generated,
                     float presence_penalty, float frequency_penalty) {
    if (presence_penalty == 0.0f && frequency_penalty == 0.0f) return;
    const int V = static_cast<int>(logits.size());
    std::vector<int> count(logits.size(), 0);
    for (int t : generated) {
        if (t < 0 || t >= V)
            throw std::invalid_argument("apply_penalties: token id " + std::to_string(t) +
                                        " is outside [0, " + std::to_string(V) + ")");
        ++count[static_cast<std::size_t>(t)];
    }
    for (std::size_t j = 0; j < logits.size(); ++j) {
        if (count[j] == 0) continue;
        const double penalty = static_cast<double>(frequency_penalty) * count[j] +
                               static_cast<double>(presence_penalty);
        logits[j] = static_cast<float>(static_cast<double>(logits[j]) - penalty);
    }
}

void check_sample_options(const SampleOptions& o, int V) {
    using std::to_string;
    if (!(std::isfinite(o.temperature) && o.temperature > 0.0f))
        throw std::invalid_argument("temperature: must be positive and finite, got " +
                                    to_string(o.temperature));
    if (o.top_k < 0 || o.top_k > V)
        throw std::invalid_argument("top_k: must be in [0, " + to_string(V) + "], got " +
                                    to_string(o.top_k));
    if (!(o.top_p > 0.0f && o.top_p <= 1.0f))
        throw std::invalid_argument("top_p: must be in (0, 1], got " + to_string(o.top_p));
    if (!std::isfinite(o.presence_penalty))
        throw std::invalid_argument("presence_penalty: must be finite");
    if (!std::isfinite(o.frequency_penalty))
        throw std::invalid_argument("frequency_penalty: must be finite");
    if (o.top_logprobs < -1 || o.top_logprobs > V)
        throw std::invalid_argument("top_logprobs: must be in [-1, " + to_string(V) + "], got " +
                                    to_string(o.top_logprobs));
}

int sample_token(std::vector<float> logits, const SampleOptions& options,
                 const std::vector<int>& generated, Rng& rng) {
    check_sample_options(options, static_cast<int>(logits.size()));
    apply_penalties(logits, generated, options.presence_penalty, options.frequency_penalty);
    return draw_from_weights(
        sampling_weights(logits, options.temperature, options.top_k, options.top_p), rng);
}

std::vector<double> log_softmax(const std::vector<float>& logits) {
    if (logits.empty()) throw std::invalid_argument("log_softmax: no logits");
    const double maxval = *std::max_element(logits.begin(), logits.end());
    double sum = 0.0;
    for (float x : logits) sum += std::exp(static_cast<double>(x) - maxval);
    const double log_total = maxval + std::log(sum);
    std::vector<double> out(logits.size());
    for (std::size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - log_total;
    return out;
}

TokenLogprobs token_logprobs(const std::vector<double>& log_probs, int token, int top) {
    const int V = static_cast<int>(log_probs.size());
    if (token < 0 || token >= V || top < 0 || top > V)
        throw std::invalid_argument("token_logprobs: token " + std::to_string(token) + " and top " +
                                    std::to_string(top) + " must lie in [0, " + std::to_string(V) + ")");
    TokenLogprobs out;
    out.logprob = log_probs[static_cast<std::size_t>(token)];
    if (top == 0) return out;
    std::vector<int> order(static_cast<std::size_t>(V));
    for (int i = 0; i < V; ++i) order[static_cast<std::size_t>(i)] = i;
    std::partial_sort(order.begin(), order.begin() + top, order.end(), [&](int a, int b) {
        const double la = log_probs[static_cast<std::size_t>(a)], lb = log_probs[static_cast<std::size_t>(b)];
        return la > lb || (la == lb && a < b);
    });
    for (int i = 0; i < top; ++i) {
        const int id = order[static_cast<std::size_t>(i)];
        out.top.emplace_back(id, log_probs[static_cast<std::size_t>(id)]);
    }
    return out;
}

std::vector<int> start_tokens(const CharVocab& vocab, int V, const std::string& prompt,
                              const SampleOptions& options) {
    if (static_cast<int>(vocab.size()) != V) {
        throw std::invalid_argument("the vocabulary has " + std::to_string(vocab.size()) +
                                    " characters, the model " + std::to_string(V));
    }
    if (options.max_new_tokens < 0) throw std::invalid_argument("the sample length must not be negative");
    // The generators draw with the temperature and top-k alone; the serving settings are
    // the scheduler's (Scheduler::submit), so here they are refused rather than ignored.
    if (options.top_p != 1.0f || options.presence_penalty != 0.0f || options.frequency_penalty != 0.0f ||
        options.top_logprobs != -1)
        throw std::invalid_argument("top_p, the penalties and log-probabilities are applied by the "
                                    "scheduler (attn::Scheduler), not by this generator");
    // Checked before the first forward pass, so bad options fail at once.
    {
        Rng probe(0);
        (void)sample_token(std::vector<float>(static_cast<std::size_t>(V), 0.0f),
                           options.temperature, options.top_k, probe);
    }
    std::vector<int> ids;
    if (prompt.empty()) {
        int start = 0;
        for (int i = 0; i < V; ++i) {
            if (vocab.at(i) == "\n") start = i;
        }
        ids.push_back(start);
    } else {
        try {
            ids = vocab.encode(prompt);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(std::string("the prompt: ") + e.what());
        }
    }
    return ids;
}

std::string generate_text(GPT& model, const CharVocab& vocab, const std::string& prompt,
                          const SampleOptions& options) {
    const int V = model.config().vocab_size;
    model.train(false);
    return generate_text(
        [&model, V](const int* context, int T) {
            model.forward(context, nullptr, 1, T);
            return model.logits().data() + static_cast<std::size_t>(T - 1) * V;
        },
        vocab, V, model.config().block_size, prompt, options);
}

std::string generate_text(const std::function<const float*(const int* context, int T)>& last_logits,
                          const CharVocab& vocab, int V, int block, const std::string& prompt,
                          const SampleOptions& options) {
    std::vector<int> ids = start_tokens(vocab, V, prompt, options);
    Rng rng(options.seed);
    std::string text = prompt;
    std::vector<float> last(static_cast<std::size_t>(V));
    for (int n = 0; n < options.max_new_tokens; ++n) {
        const int T = std::min(static_cast<int>(ids.size()), block);
        const int* context = ids.data() + (ids.size() - static_cast<std::size_t>(T));
        const float* row = last_logits(context, T);
        std::copy(row, row + V, last.begin());
        const int next = sample_token(last, options.temperature, options.top_k, rng);
        ids.push_back(next);
        text += vocab.at(next);
    }
    return text;
}

// ---------------------------------------------------------------------------------------
// The loop around the steps

namespace {

void rewrite_metrics_before(const fs::path& file, std::int64_t first_step) {
    std::ifstream in(file);
    if (!in) return;
    std::ostringstream kept;
    std::string line;
    while (std::getline(in, line)) {
        try {
            const json j = json::parse(line);
            if (j.contains("step") && j.at("step").get<std::int64_t>() < first_step) kept << line << "\n";
        } catch (const json::exception&) {
            // a torn last line of a killed run: dropped
        }
    }
    in.close();
    std::ofstream(file) << kept.str();
}

}  // namespace

RunSummary run_training(Trainer& trainer, const RunOptions& options) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const TrainConfig& c = trainer.config();
    RunSummary summary;
    summary.first_step = trainer.step();

    std::ofstream metrics;
    const fs::path checkpoint = options.out_dir / "checkpoint";
    // In a data-parallel group rank 0 writes, logs and shows the progress (save() knows).
    const bool writer = trainer.writes_files();
    std::ostream* const log = writer ? options.log : nullptr;
    std::ostream* const progress_out = writer ? options.progress : nullptr;
    if (!options.out_dir.empty() && writer) {
        fs::create_directories(options.out_dir);
        const fs::path file = options.out_dir / "metrics.jsonl";
        rewrite_metrics_before(file, summary.first_step);
        metrics.open(file, std::ios::app);
        if (!metrics) throw std::runtime_error(file.string() + ": cannot write");
    }
    auto evaluate = [&] {
        const EvalRecord e = trainer.evaluate();
        // A NaN or an infinity would be written as JSON's null: a run that cannot evaluate
        // stops here, with the last checkpoint left as it was.
        if (!std::isfinite(e.train_loss) || !std::isfinite(e.val_loss)) {
            throw TrainingDiverged(
                "the evaluation at step " + std::to_string(e.step) + " gave a train loss of " +
                describe(static_cast<float>(e.train_loss)) + " and a val loss of " +
                describe(static_cast<float>(e.val_loss)) + ": training stopped");
        }
        summary.evals.push_back(e);
        if (progress_out && options.progress_is_terminal) *progress_out << "\r\x1b[K" << std::flush;
        if (log) {
            char buf[128];
            std::snprintf(buf, sizeof buf, "step %5lld: train loss %.4f, val loss %.4f\n",
                          static_cast<long long>(e.step), e.train_loss, e.val_loss);
            *log << buf << std::flush;
        }
        if (metrics.is_open()) {
            metrics << json{{"step", e.step}, {"train_loss", e.train_loss}, {"val_loss", e.val_loss}}.dump()
                    << "\n" << std::flush;
        }
        if (!options.out_dir.empty()) trainer.save(checkpoint);
    };

    ProgressLine progress(c.max_iters, static_cast<std::int64_t>(c.grad_accum) * c.batch_size * c.block_size);
    while (!trainer.done()) {
        if (trainer.step() % c.eval_interval == 0) evaluate();
        const auto t0 = clock::now();
        const StepRecord r = trainer.train_step();
        const double dt = std::chrono::duration<double>(clock::now() - t0).count();
        summary.step_seconds += dt;
        summary.steps.push_back(r);
        if (metrics.is_open()) {
            json line{{"step", r.step}, {"loss", r.loss}, {"lr", r.lr}, {"ms", dt * 1e3}};
            // A skipped step's norm is infinite: JSON has no infinity, so it is left out.
            if (r.skipped) line["skipped"] = true;
            else line["grad_norm"] = r.grad_norm;
            if (c.precision != Precision::fp32 && !trainer.device()) {  // the CPU model counts them
                line["flushed_gradients"] = r.flushed_gradients;
                line["rounded_gradients"] = r.rounded_gradients;
            }
            if (trainer.scales_loss()) line["loss_scale"] = r.loss_scale;
            // flushed at each step: a run killed mid-way keeps the log of every step it took
            metrics << line.dump() << "\n" << std::flush;
        }
        if (progress_out) {
            const bool show = options.progress_is_terminal || (r.step + 1) % options.progress_interval == 0;
            const std::string line = progress.format(r.step, r.loss, r.lr);
            if (show && options.progress_is_terminal) {
                *progress_out << "\r\x1b[K" << line << std::flush;
            } else if (show) {
                *progress_out << line << "\n" << std::flush;
            }
        }
        const bool stop = trainer.stop_agreed(options.stop_requested && options.stop_requested());
        if (stop && !trainer.done()) {
            if (progress_out && options.progress_is_terminal) *progress_out << "\n";
            if (!options.out_dir.empty()) trainer.save(checkpoint);
            summary.stopped = true;
            break;
        }
    }
    if (!summary.stopped) evaluate();
    if (progress_out && options.progress_is_terminal) *progress_out << "\r\x1b[K" << std::flush;
    summary.seconds = std::chrono::duration<double>(clock::now() - start).count();
    return summary;
}

void plot_losses(const fs::path& path, const std::vector<StepRecord>& steps,
                 const std::vector<EvalRecord>& evals, const std::string& title) {
    PlotSeries per_step{"train loss (each step)", {}, {}}, train{"train loss (eval)", {}, {}},
        val{"val loss (eval)", {}, {}};
    for (const StepRecord& r : steps) {
        per_step.x.push_back(static_cast<double>(r.step));
        per_step.y.push_back(r.loss);
    }
    for (const EvalRecord& e : evals) {
        train.x.push_back(static_cast<double>(e.step));
        train.y.push_back(e.train_loss);
        val.x.push_back(static_cast<double>(e.step));
        val.y.push_back(e.val_loss);
    }
    line_plot_png(path, {per_step, train, val}, title, "step", "cross-entropy (nats)");
}

void read_metrics(const fs::path& path, std::vector<StepRecord>& steps,
                  std::vector<EvalRecord>& evals) {
    std::ifstream in(path);
    if (!in) throw std::runtime_error(path.string() + ": cannot read");
    steps.clear();
    evals.clear();
    for (std::string line; std::getline(in, line);) {
        try {
            const json j = json::parse(line);
            if (j.contains("loss")) {
                StepRecord r{j.at("step").get<std::int64_t>(), j.at("loss").get<float>(),
                             j.at("lr").get<double>(), 0.0f};
                r.skipped = j.value("skipped", false);
                r.grad_norm = r.skipped ? std::numeric_limits<float>::infinity()
                                        : j.at("grad_norm").get<float>();
                r.loss_scale = j.value("loss_scale", 1.0);
                steps.push_back(r);
            } else if (j.contains("val_loss")) {
                evals.push_back({j.at("step").get<std::int64_t>(), j.at("train_loss").get<double>(),
                                 j.at("val_loss").get<double>()});
            }
        } catch (const json::exception&) {
            // a torn line of a killed run
        }
    }
}

float dump_gradients(Trainer& trainer, const fs::path& dir) {
    if (trainer.step() != 0) {
        throw std::invalid_argument("gradients are dumped for the first batch of a run, before any step");
    }
    const int B = trainer.config().batch_size, T = trainer.config().block_size;
    std::vector<int> x, y;
    std::vector<float> grads;
    const float loss = trainer.first_batch_gradients(x, y, grads);
    const GPT& model = trainer.model();
    write_directory_atomically(dir, [&](const fs::path& tmp) {
        save_checkpoint(tmp / "weights", model, {trainer.data().vocab.chars(), 0});
        const std::vector<std::size_t> bt{static_cast<std::size_t>(B), static_cast<std::size_t>(T)};
        const std::vector<float> xf(x.begin(), x.end()), yf(y.begin(), y.end());
        write_npy(tmp / "x.npy", bt, xf.data());
        write_npy(tmp / "y.npy", bt, yf.data());
        write_npy(tmp / "loss.npy", {1}, &loss);
        fs::create_directory(tmp / "grad");
        for (const ParameterInfo& p : model.parameter_table()) {
            write_npy(tmp / "grad" / (p.name + ".npy"), p.shape, grads.data() + p.offset);
        }
    });
    return loss;
}

double median_step_seconds(Trainer& trainer, int steps, int warmup) {
    if (steps < 1 || warmup < 0) {
        throw std::invalid_argument("median_step_seconds: expected at least 1 timed step and no "
                                    "negative warm-up, got steps = " + std::to_string(steps) +
                                    ", warmup = " + std::to_string(warmup));
    }
    for (int i = 0; i < warmup; ++i) trainer.train_step();
    std::vector<double> seconds(static_cast<std::size_t>(steps));
    for (double& s : seconds) {
        const auto start = std::chrono::steady_clock::now();
        trainer.train_step();
        s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    std::sort(seconds.begin(), seconds.end());
    const std::size_t mid = seconds.size() / 2;
    return seconds.size() % 2 ? seconds[mid] : 0.5 * (seconds[mid - 1] + seconds[mid]);
}

}  // namespace attn
