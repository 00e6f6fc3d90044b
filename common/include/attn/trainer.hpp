/// @file trainer.hpp
/// @brief Training the GPT of gpt.hpp on a character corpus: recipes, the training loop,
/// evaluation, checkpoints that resume exactly, and sampling with temperature and top-k.
///
/// A checkpoint is a directory written atomically (write_directory_atomically):
/// the weights directory of checkpoint.hpp (`config.json` + one `.npy` per parameter), plus
/// `optimizer/m.npy` and `optimizer/v.npy` (AdamW's moments, the flat parameter layout) and
/// `trainer.json` (the TrainConfig, the step, the best validation loss, AdamW's step count
/// and the batch sampler's random state), and `checksums.json` (checkpoint.hpp), checked on
/// load. Loading it and training on gives the same losses, bit for bit, as a run that never
/// stopped. Ranks that keep shards (ZeRO, tensor parallelism) write it sharded instead: each rank its own
/// weights and moments, `shards.json` the layout (checkpoint.hpp's ShardLayout).
#pragma once

#include "attn/data.hpp"
#include "attn/gpt.hpp"
#include "attn/random.hpp"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace attn {

/// Everything that defines a training run, with nanoGPT's names where it has them.
struct TrainConfig {
    std::string recipe = "cpu";  ///< the recipe these values started from (for the record)
    // The model.
    int n_layer = 4;         ///< transformer blocks
    int n_head = 4;          ///< heads per attention layer
    int n_embd = 128;        ///< channels of the residual stream
    int block_size = 64;     ///< T, the context length trained on
    float dropout = 0.0f;    ///< dropout probability while training
    bool bias = false;       ///< biases in Linear layers and LayerNorms (nanoGPT's default: none)
    /// The causal mask; false lets every position see the whole window, future included
    /// (the model then "cheats": low training loss, useless generation).
    bool causal = true;
    Position position = Position::learned;  ///< where position enters (gpt.hpp's Position)
    /// Divide the attention scores by √hs; false trains without the factor (lesson 08).
    bool scaled_attention = true;
    int n_kv_head = 0;  ///< G, key/value heads (0: n_head, multi-head attention; gpt.hpp)
    int window = 0;     ///< W, the sliding attention window (0: the whole context; gpt.hpp)
    // The optimisation.
    int batch_size = 12;                ///< B, sequences per micro-batch (per step when grad_accum is 1)
    /// N, micro-batches per step (nanoGPT's gradient_accumulation_steps): each step runs N
    /// batches of batch_size sequences forward and backward, adding their gradients (each
    /// pass's loss scaled by 1/N), then clips and takes one AdamW step: the step of one batch
    /// of N·batch_size sequences, with the activations of batch_size. In a data-parallel group
    /// the gradients are summed over the processes once, after the last micro-batch.
    int grad_accum = 1;
    std::int64_t max_iters = 2000;      ///< steps in the whole run
    double learning_rate = 1e-3;        ///< peak learning rate, reached after warm-up
    double min_lr = 1e-4;               ///< the learning rate the cosine decays to
    std::int64_t warmup_iters = 100;    ///< linear warm-up steps
    std::int64_t lr_decay_iters = 2000; ///< the step at which the cosine reaches min_lr
    float weight_decay = 0.1f;          ///< AdamW's decoupled decay (matrices only)
    float beta1 = 0.9f;                 ///< AdamW's first-moment decay
    float beta2 = 0.99f;                ///< AdamW's second-moment decay
    float grad_clip = 1.0f;             ///< the largest gradient norm; 0 turns clipping off
    // Evaluation and randomness.
    std::int64_t eval_interval = 250;  ///< evaluate (and checkpoint) every this many steps
    std::int64_t eval_iters = 20;      ///< batches per split in one evaluation
    std::uint64_t seed = 1337;         ///< seeds the initial weights, batches and dropout
    // Mixed precision (lesson 18).
    /// The format of the matrix products' inputs (GPT::set_precision); the weights, AdamW
    /// and everything else stay float32. bf16 and fp16 train on the CPU only.
    Precision precision = Precision::fp32;
    /// With fp16: dynamic loss scaling (LossScaler), without which small gradients flush to
    /// zero when the products round them; ignored for fp32 and bf16 (bfloat16 has float32's
    /// exponent range).
    bool loss_scaling = true;
    /// The loss scale a run starts from (PyTorch's GradScaler: 2^16); LossScaler adjusts it.
    double initial_loss_scale = 65536.0;
    /// What the backward pass computes again instead of keeping it (GPT::set_recompute,
    /// lesson 21): the same steps, bit for bit, with less memory; the CPU model only.
    Recompute recompute = Recompute::none;

    /// A named recipe: "cpu" (nanoGPT's CPU recipe for tiny shakespeare: 4 layers, 4 heads,
    /// 128 channels, block 64, batch 12, 2000 steps) or "tiny" (2 layers, 32 channels,
    /// 200 steps: trains in seconds, for tests).
    /// @throws std::invalid_argument for any other name
    static TrainConfig named(const std::string& recipe);
    /// Shortens the run to `steps` steps: the cosine decays over them, and the warm-up is at
    /// most that long. Everything else (the model, the batches) stays as it was.
    void shorten_to(std::int64_t steps);
    /// The smallest run that still takes every step of training: 3 steps, evaluated every
    /// 2 on 2 batches, with the model's sizes as they are (a lesson's `--quick`).
    void make_quick();
    /// Throws std::invalid_argument naming the first field that is out of range.
    void validate() const;
    /// The model's sizes for a vocabulary of `vocab_size` characters.
    /// @param vocab_size V
    /// @return the GPTConfig with this recipe's sizes
    GPTConfig model_config(int vocab_size) const;
};

/// One training step's numbers.
struct StepRecord {
    std::int64_t step = 0;   ///< 0-based
    float loss = 0.0f;       ///< the training batch's mean cross-entropy (over its micro-batches)
    double lr = 0.0;         ///< the learning rate used
    float grad_norm = 0.0f;  ///< the gradient norm before clipping (not finite when skipped)
    /// With loss scaling: the step's gradients held an infinity or a NaN, so no update was
    /// made (and the scale was halved)
    bool skipped = false;
    double loss_scale = 1.0;  ///< the factor the loss was multiplied by (1 without scaling)
    /// Mixed precision: gradient values rounded where they entered the products in this
    /// step's backward passes, and how many of them were flushed to zero (GPT::gradient_rounding)
    std::uint64_t rounded_gradients = 0;
    std::uint64_t flushed_gradients = 0;    ///< see rounded_gradients
    std::uint64_t subnormal_gradients = 0;  ///< of rounded_gradients, made subnormal
};

/// One evaluation: the mean loss over TrainConfig::eval_iters batches of each split.
struct EvalRecord {
    std::int64_t step = 0;    ///< steps taken when it ran
    double train_loss = 0.0;  ///< on batches of the training split
    double val_loss = 0.0;    ///< on batches of the validation split
};

/// Thrown when the loss or the gradient stops being finite: the step is not applied, and
/// the message says at which step and what was found.
class TrainingDiverged : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// What one process writes of a sharded checkpoint (checkpoint.hpp's ShardLayout): the runs
/// of the flat parameter buffer it keeps, and where each run's weights and moments lie here.
/// Written by the processes of a group that each keep a shard (ZeRO) and by those of a device
/// split over processes (tensor parallelism), so that none gathers the whole state.
struct ShardedState {
    std::string scheme;                    ///< e.g. "zero-3", recorded in shards.json
    std::vector<AdamW::Segment> segments;  ///< its runs, in the order it keeps them
    /// Run k's weights.
    std::function<const float*(std::size_t k)> weights;
    /// Run k's first moments (nullptr: zeros, no step taken yet).
    std::function<const float*(std::size_t k)> m;
    /// Run k's second moments (nullptr: zeros, no step taken yet).
    std::function<const float*(std::size_t k)> v;
    /// Which of the checkpoint's files this process writes (0 … files − 1; −1: none, a copy
    /// of another process's state) and how many there are. A group's processes write one
    /// each: its rank and size (Trainer::save sets them).
    int file = 0;
    int files = 1;  ///< see file
};

/// A device that runs the training step in place of the CPU, such as a CUDA GPU.
///
/// The Trainer keeps the model and optimizer on the host as the reference copy: it pushes
/// them to the device when the device is attached and pulls them back before a checkpoint
/// or sampling, so checkpoints are the same files whichever device trained. A device split
/// over processes (tensor parallelism) may keep the only copy instead: the host model is then
/// made without whole weights, the device writes its parts of a sharded checkpoint itself
/// (owned_state) and gathers the weights on request (gather_parameters).
class TrainingDevice {
public:
    virtual ~TrainingDevice() = default;
    /// A one-line description, e.g. the GPU's name.
    virtual std::string name() const = 0;
    /// Copies the host model's parameters and the optimizer's moments to the device.
    /// @param model the host model @param optimizer its optimizer (empty moments = zero)
    virtual void push(const GPT& model, const AdamW& optimizer) = 0;
    /// Copies the device's parameters and moments back into the host model and optimizer.
    /// @param model the host model @param optimizer its optimizer
    virtual void pull(GPT& model, AdamW& optimizer) = 0;
    /// The forward pass with targets. @param x (B·T) inputs @param y (B·T) targets
    /// @param B batch @param T time @param training dropout on or off
    /// @param dropout_seed seeds this pass's dropout masks @return the mean loss
    virtual float loss(const int* x, const int* y, int B, int T, bool training,
                       std::uint64_t dropout_seed) = 0;
    /// The backward pass of the last loss() call and the gradient clipping.
    /// @param max_norm the clipping norm @return the gradient norm before clipping
    virtual float backward_and_clip(float max_norm) = 0;
    /// One AdamW update with the gradients of the last backward_and_clip() call.
    /// @param optimizer the hyper-parameters (its step count advances) @param lr the rate
    virtual void adamw_step(AdamW& optimizer, float lr) = 0;
    /// The gradients of the last backward_and_clip() call, in GPT::gradients()'s layout.
    /// @param out resized to the number of parameters
    virtual void copy_gradients_to(std::vector<float>& out) = 0;
    /// A device spread over several processes (tensor parallelism over MPI) says which one
    /// writes the run's files, and lets them agree: whether this process writes them.
    /// @return true by default (one process)
    virtual bool writes_files() const { return true; }
    /// Whether `flag` is true in any of the device's processes (a stop asked of one, all make
    /// at the same step). @param flag this process's @return `flag` by default
    virtual bool any(bool flag) { return flag; }
    /// Returns when every process of the device has called it. Nothing by default.
    virtual void barrier() {}
    /// Takes the host's model and optimizer when the device is attached: push() by default. A
    /// device that keeps the training state itself may take the host's buffers instead: a
    /// model made without whole weights hands over the runs it was given
    /// (GPT::take_kept_weights), and the moments move. @param model the host model
    /// @param optimizer its optimizer
    virtual void adopt(GPT& model, AdamW& optimizer) { push(model, optimizer); }
    /// Fills `out` and returns true when each process of the device writes its own part of
    /// a checkpoint (tensor parallelism: no process holds the whole state, and the host keeps
    /// no copy of it); false by default: the host's copy is pulled and written whole.
    /// @param out this process's part
    virtual bool owned_state(ShardedState& out) const {
        (void)out;
        return false;
    }
    /// Every parameter, flat, in GPT::parameters()' layout, from the device's processes (a
    /// collective call), for a host that keeps no copy of them. @return them; empty by
    /// default (the host's copy is pulled instead)
    virtual std::vector<float> gather_parameters() { return {}; }
    /// The format of the device's matrix products' inputs (GPT::set_precision): the
    /// trainer's precision must be it. @return fp32 by default
    virtual Precision precision() const { return Precision::fp32; }
};

/// The processes that train one model together, each on its own consecutive share of every
/// batch (data parallelism, lesson 19). Every process holds the whole model and optimizer,
/// draws the same batches, runs its share forward and backward, and the group sums the
/// gradients, so that every process takes the same AdamW step. attn/mpi/data_parallel.hpp
/// implements it with MPI; the Trainer only calls it.
class DataParallelGroup {
public:
    virtual ~DataParallelGroup() = default;
    /// This process's place in the group, 0 … size() − 1; rank 0 writes the files.
    virtual int rank() const = 0;
    /// The number of processes.
    virtual int size() const = 0;
    /// Called before a backward pass whose gradients are this process's share of the
    /// batch: the sum over the processes of share × gradient is the whole batch's mean
    /// gradient. The Trainer passes 1: its backward passes divide by the whole batch's
    /// positions already (GPT::set_whole_batch), which keeps mixed-precision runs on any
    /// number of processes one process's; a caller whose passes take their own batch's mean
    /// passes its positions over the whole batch's. The group may
    /// install a hook on the model (GPT::set_gradient_ready_hook) to start summing buckets
    /// while the pass goes on. @param model the model @param share this process's part
    virtual void begin_gradients(GPT& model, double share) = 0;
    /// Called after that backward pass: waits for every sum, leaves the whole batch's
    /// gradients in the model, the same bits in every process, and removes any hook.
    /// @param model the model
    virtual void finish_gradients(GPT& model) = 0;
    /// The sum over the processes of one number from each, the same in every process.
    /// @param value this process's number @return the sum
    virtual double sum(double value) = 0;
    /// Whether `flag` is true in any process: a stop that one process is asked for, every
    /// process makes at the same step. @param flag this process's @return their "or"
    virtual bool any(bool flag) = 0;
    /// Throws std::runtime_error in every process unless every process passed the same
    /// fingerprint. @param fingerprint a hash of this process's state
    /// @param what what the fingerprint summarises, for the message
    virtual void check_same(std::uint64_t fingerprint, const std::string& what) = 0;
    /// Returns when every process has called it.
    virtual void barrier() = 0;

    /// Clips the gradients that finish_gradients() left to their global norm, as
    /// clip_grad_norm(), and returns that norm, the same in every process. A group whose
    /// processes each hold a shard of the summed gradients (ZeRO, attn/mpi/zero.hpp) sums the
    /// shards' squares across the processes. @param model the model @param max_norm as
    /// clip_grad_norm()'s @return the norm before clipping
    virtual float clip_gradients(GPT& model, float max_norm) { return clip_grad_norm(model, max_norm); }
    /// One AdamW step of the model's parameters, which leaves the same parameters in every
    /// process: by default each process updates them all; ZeRO's each its shard, then
    /// gathers the others'. @param model the model @param optimizer its AdamW
    /// @param lr the learning rate
    virtual void update(GPT& model, AdamW& optimizer, float lr) { optimizer.step(model, lr); }
    /// Whether finish_gradients() leaves every summed gradient in every process (false for
    /// ZeRO: a shard each). Loss scaling (float16) needs them all, to find an overflow.
    /// @return true by default
    virtual bool holds_whole_gradients() const { return true; }
    /// The bytes of gradients the group keeps beside the model's own buffers (ZeRO stage 2:
    /// each process's shard of the summed gradients). @return 0 by default
    virtual std::size_t gradient_bytes() const { return 0; }
    /// The bytes of weights the group keeps beside the model's own buffers (ZeRO stage 3:
    /// each process's shard of the parameters). @return 0 by default
    virtual std::size_t weight_bytes() const { return 0; }
    /// Whether the model's own gradient buffer holds this process's gradients until
    /// finish_gradients() sums them, so that the gradients of several backward passes can be
    /// added there first and summed once (gradient accumulation, TrainConfig::grad_accum; DDP's
    /// no_sync). False for a group whose begin_gradients() has the backward pass hand its
    /// gradients over as it finishes them (ZeRO stages 2 and 3). @return true by default
    virtual bool accumulates_in_model() const { return true; }
    /// Called by Trainer::use_group once the group is the trainer's, on every process: a group
    /// that keeps the parameters itself (ZeRO stage 3) takes its shard of them here and gives
    /// the model a weight source (GPT::set_weight_source); use_group takes the whole
    /// parameters back from that source when the trainer leaves the group. Nothing by default.
    /// @param model the model, with its whole parameters
    virtual void attach(GPT& model) { (void)model; }
    /// The whole optimizer state for a checkpoint, into `m` and `v` in process 0 (a collective
    /// call: every process makes it). By default each process holds it all; ZeRO gathers the
    /// shards. Empty when no step was taken. @param model the model @param optimizer this
    /// process's AdamW @param m the first moments of every parameter @param v the second moments
    virtual void whole_moments(const GPT& model, const AdamW& optimizer, std::vector<float>& m,
                               std::vector<float>& v) {
        (void)model;
        m = optimizer.m;
        v = optimizer.v;
    }
    /// What this process writes of a sharded checkpoint (ShardedState).
    using OwnedState = ShardedState;
    /// Fills `out` and returns true when each process writes its own part of a checkpoint
    /// (ZeRO: none holds the whole state); false by default: process 0 writes it whole.
    /// @param model the model @param optimizer this process's AdamW @param out its part
    virtual bool owned_state(const GPT& model, const AdamW& optimizer, OwnedState& out) const {
        (void)model;
        (void)optimizer;
        (void)out;
        return false;
    }
};

/// The sequences [begin, end) of a batch of B that process `rank` of `ranks` runs: B split
/// into nearly equal consecutive parts. @param B the batch @param rank the process
/// @param ranks the processes @return {begin, end}
std::pair<int, int> batch_share(int B, int rank, int ranks);

/// The model, its optimizer, the data and the position in the run.
class Trainer {
public:
    /// A fresh run: a model initialised from config.seed.
    /// @param config the recipe; validated
    /// @param data the encoded corpus; each split must hold more than block_size tokens
    /// @param buffers the model's whole buffers (GPTBuffers): a process of a group that keeps
    /// the weights or gradients in shards (ZeRO stages 2 and 3) starts without them, and the
    /// group takes its shard of the seed's weights (GPT::initial_values) when it is joined
    Trainer(const TrainConfig& config, TextDataset data, GPTBuffers buffers = {});
    /// A run that starts from given weights (e.g. exported from PyTorch); the model's sizes
    /// replace the recipe's.
    /// @param config the recipe (its model sizes are overwritten by the model's)
    /// @param data the encoded corpus; its vocabulary size must be the model's
    /// @param model the starting weights
    Trainer(const TrainConfig& config, TextDataset data, GPT model);

    /// Resumes from a checkpoint written by save().
    /// @param dir the checkpoint directory
    /// @param data the corpus; its vocabulary must be the one the checkpoint records
    /// Every file is first checked against the checkpoint's `checksums.json`. A sharded
    /// checkpoint (checkpoint.hpp) may be read by a process that will keep only some of
    /// AdamW's moments (ZeRO): it reads only those.
    /// @param kept the runs of the flat buffer whose moments this process keeps, in the order
    /// it keeps them (empty function, or runs covering every parameter: all of them, in the
    /// flat order)
    /// @throws CheckpointError for a missing, incomplete, inconsistent or damaged checkpoint
    /// @param buffers the model's whole buffers, as for a fresh run: without whole weights,
    /// only the weights of `kept` are read, and left in the model for the group
    /// (GPT::set_kept_weights)
    static Trainer load(const std::filesystem::path& dir, TextDataset data,
                        const std::function<std::vector<AdamW::Segment>(const GPT&)>& kept = {},
                        GPTBuffers buffers = {});

    /// Writes a checkpoint atomically (the old one stays until the new one is complete),
    /// first bringing the host copy up to date when a device is training. In a
    /// data-parallel group rank 0 writes it and every process returns once it is written;
    /// in a group whose processes each keep a shard (DataParallelGroup::owned_state) each
    /// writes its own file of a sharded checkpoint, and nothing is gathered (the processes
    /// must see the same folder, as one machine or a shared file system gives them).
    /// @param dir the checkpoint directory to create or replace
    void save(const std::filesystem::path& dir);

    /// One step: a batch from the training split, forward, backward, clipping, AdamW. With
    /// TrainConfig::grad_accum N, N micro-batches of batch_size sequences drawn one after the
    /// other (the sequences of one batch of N·batch_size), their gradients added, then one
    /// clipping and one AdamW step; the loss is their mean.
    /// @return the step's numbers
    /// @throws TrainingDiverged (before changing anything) if the loss or gradient norm is
    /// not finite
    StepRecord train_step();

    /// The mean loss of each split over eval_iters batches, in evaluation mode (no
    /// dropout). The batches depend only on the seed and the step, so evaluation never
    /// changes the training run.
    EvalRecord evaluate();

    /// The learning rate of a step under this run's schedule.
    /// @param step 0-based step
    double learning_rate(std::int64_t step) const;

    /// Draws the first training batch of a run that starts at step 0 (the batch the first
    /// train_step() uses), without changing the trainer.
    /// @param x (B·T) inputs @param y (B·T) targets
    void first_batch(std::vector<int>& x, std::vector<int>& y) const;

    /// The loss and the gradients of the first batch (first_batch()) in evaluation mode (no
    /// dropout, nothing clipped), on the device when one is attached; no weight changes.
    /// @param x receives the (B·T) inputs @param y receives the (B·T) targets
    /// @param grads receives every gradient, in GPT::gradients()'s layout
    /// @return the batch's loss
    /// @throws std::invalid_argument in a data-parallel group, or with grad_accum above 1 (a
    /// step is then several batches)
    float first_batch_gradients(std::vector<int>& x, std::vector<int>& y,
                                std::vector<float>& grads);

    std::int64_t step() const { return step_; }                 ///< steps taken so far
    bool done() const { return step_ >= config_.max_iters; }    ///< whether max_iters is reached
    double best_val_loss() const { return best_val_loss_; }     ///< lowest val loss seen (inf before any)
    const TrainConfig& config() const { return config_; }       ///< the run's settings
    /// Changes the number of steps of the run (e.g. a resumed run told to go on longer).
    /// @param max_iters the new total, at least 1
    void set_max_iters(std::int64_t max_iters);
    const TextDataset& data() const { return data_; }           ///< the corpus
    /// The host model, first brought up to date when a device is training (a host model made
    /// without whole weights, whose device keeps the state, holds its settings and table only).
    GPT& model() {
        sync_from_device();
        return model_;
    }
    const GPT& model() const { return model_; }                 ///< the model, read-only
    const AdamW& optimizer() const { return optimizer_; }       ///< AdamW and its moments
    /// Every parameter, flat, as GPT::parameters() lays them out: a copy of the model's, or in
    /// a group that keeps only a shard of them in each process (ZeRO stage 3) the shards
    /// gathered (a collective call: every process makes it). @return the parameters
    std::vector<float> whole_parameters();
    /// What this process holds for training, as allocated: the model's weights, gradients
    /// and activations (GPT::memory_use), AdamW's moments, and the gradients a data-parallel
    /// group keeps beside the model's (ZeRO stage 2's shard). @return bytes by kind
    MemoryUse memory_use() const;
    /// Whether the steps scale the loss (fp16 with TrainConfig::loss_scaling).
    bool scales_loss() const {
        return config_.precision == Precision::fp16 && config_.loss_scaling;
    }
    const LossScaler& loss_scaler() const { return scaler_; }  ///< the loss scale's state

    /// Runs the steps and evaluations on `device` from now on (nullptr: back to the CPU).
    /// @param device the device; the host model and optimizer are pushed to it
    /// @throws std::invalid_argument for a device with mixed precision or with grad_accum
    /// above 1 (a device's backward pass clips at once: it accumulates nothing)
    void use_device(std::unique_ptr<TrainingDevice> device);
    /// The device in use, or nullptr on the CPU.
    const TrainingDevice* device() const { return device_.get(); }
    /// Trains as one process of a data-parallel group from now on: each step runs this
    /// process's share of the batch (batch_share()), the group sums the gradients and every
    /// process takes the same step; evaluations are shared the same way; save() writes on
    /// rank 0 only. The state of every process must be the same (the same weights, moments,
    /// step, batches and corpus), which is checked here.
    /// @param group the group, or nullptr for a process of its own
    /// @throws std::invalid_argument when a device is attached (data parallelism runs on the
    /// CPU), when the batch has fewer sequences than the group has processes, or with
    /// grad_accum above 1 in a group that does not accumulate in the model (accumulates_in_model);
    /// std::runtime_error when the processes' states differ
    void use_group(std::shared_ptr<DataParallelGroup> group);
    /// The group, or nullptr when this process trains alone.
    const DataParallelGroup* group() const { return group_.get(); }
    /// Whether this process writes the run's files: the only process, rank 0 of a group, or the
    /// writer of a device spread over processes (TrainingDevice::writes_files).
    bool writes_files() const { return (!group_ || group_->rank() == 0) && (!device_ || device_->writes_files()); }
    /// Whether any process of the group asks to stop (this one's `requested` alone without
    /// a group), so that all stop after the same step. @param requested this process's
    /// @return whether to stop
    bool stop_agreed(bool requested);
    /// A hash of everything that decides how the run goes on: the settings, weights,
    /// AdamW's moments and step count, the step, the batch sampler's state and the corpus.
    /// Two processes with the same fingerprint take the same steps.
    std::uint64_t state_fingerprint() const;
    /// Brings the host model and optimizer up to date with the device (no-op on the CPU).
    /// save() does this itself; call it before reading model() after device steps.
    void sync_from_device();

private:
    void finish_setup(bool from_weights);
    // The sharded save: each process writes its part, process 0 the rest and the layout.
    // `barrier` waits for every process that takes part (the group's or the device's).
    void save_sharded(const std::filesystem::path& dir, const ShardedState& own, const std::function<void()>& barrier);
    std::string trainer_json() const;  // trainer.json's text
    // The forward pass of micro-batch k of the step on the host model (this process's share
    // of it in a group): the loss, weighted by the share in a group.
    double cpu_loss(std::uint64_t dropout_seed, int k);
    // The micro-batches before the last one, forward and backward, their gradients added in
    // the model's buffer and summed over no group (DDP's no_sync), then the last one's
    // forward pass; returns the step's mean loss (summed over the group once).
    float cpu_forward_micro_batches(std::uint64_t dropout_seed);
    // The last backward pass (scaled, then unscaled, with loss scaling), the group's sum and
    // the clipping; false when loss scaling skips the step (its gradients held an infinity
    // or a NaN).
    bool cpu_backward_and_clip(float max_norm, StepRecord& record);
    // The backward pass of the last forward call added into the model's gradients, its loss
    // multiplied by `factor` (the loss scale over grad_accum), with the group's sum of them
    // when `sum`.
    void cpu_backward(float factor, bool sum);
    // Divides the gradients by the loss scale `unscale` (after the last backward pass);
    // whether every gradient is finite.
    bool cpu_unscale(float unscale);
    void cpu_adamw_step(float lr);

    TrainConfig config_;
    TextDataset data_;
    GPT model_;
    AdamW optimizer_;
    LossScaler scaler_;
    Rng batch_rng_;
    std::int64_t step_ = 0;
    double best_val_loss_;
    std::vector<int> x_, y_;  // (B·T) the current batch (micro-batch)
    RoundingCounts rounding_at_step_;  // the model's gradient rounding when the step began
    std::unique_ptr<TrainingDevice> device_;
    bool host_stale_ = false;  // the device has taken steps the host model has not seen
    std::shared_ptr<DataParallelGroup> group_;  // use_group()
};

/// How to sample text from a model.
///
/// A token is drawn in this order: the penalties are subtracted from the logits, the logits
/// are divided by the temperature, everything below the top_k largest is dropped, then
/// everything outside the nucleus (top_p) is dropped, and the rest is renormalised. The
/// log-probabilities reported (top_logprobs ≥ 0) are the model's own: the log-softmax of the
/// raw logits, before the penalties, the temperature and the truncations, so they say what
/// the model believes, not how the draw was shaped.
struct SampleOptions {
    int max_new_tokens = 500;   ///< characters to generate
    float temperature = 1.0f;   ///< divides the logits; below 1 sharpens, above 1 flattens
    int top_k = 0;              ///< keep only the k most likely tokens; 0 keeps all
    std::uint64_t seed = 1337;  ///< seeds the draws
    /// Nucleus sampling (Holtzman et al. 2020): after the temperature and top_k, keep the
    /// smallest set of most likely tokens whose probability reaches top_p; 1 keeps all.
    float top_p = 1.0f;
    /// Subtracted once from the logit of every token already generated (not the prompt's).
    float presence_penalty = 0.0f;
    /// Subtracted from a token's logit once for every time it was generated.
    float frequency_penalty = 0.0f;
    /// −1: no log-probabilities; 0 or more: the sampled token's log-probability and this
    /// many most likely alternatives with theirs (TokenLogprobs).
    int top_logprobs = -1;
};

/// Draws one token id from logits: divide by the temperature, keep the top_k largest
/// (ties at the k-th value are kept), softmax, draw. top_k = 1 is greedy decoding.
/// @param logits (V) one position's logits
/// @param temperature positive
/// @param top_k 0 (all) or 1…V
/// @param rng the source of the draw
/// @return a token id in [0, V)
/// @throws std::invalid_argument for a temperature that is not positive and finite, or top_k
/// outside 0…V
int sample_token(const std::vector<float>& logits, float temperature, int top_k, Rng& rng);

/// The unnormalised weights a draw chooses from: exp(z − max z) with z = logits / temperature
/// for the tokens kept by top_k and then top_p, 0 for the tokens dropped. The nucleus is the
/// smallest set of the most likely tokens (ties broken by the lower id) whose share of the
/// top_k weights reaches top_p.
/// @param logits (V) one position's logits
/// @param temperature positive and finite
/// @param top_k 0 (all) or 1…V
/// @param top_p in (0, 1]; 1 keeps all
/// @return (V) weights, at least one of them positive
/// @throws std::invalid_argument for a value outside those ranges
std::vector<double> sampling_weights(const std::vector<float>& logits, float temperature, int top_k,
                                     float top_p);

/// Subtracts OpenAI's penalties from logits: logit[j] −= frequency · count[j] + presence ·
/// (count[j] > 0), where count[j] is how often token j occurs in `generated`.
/// @param logits (V) changed in place
/// @param generated the tokens generated so far (not the prompt), each in [0, V)
/// @param presence_penalty finite
/// @param frequency_penalty finite
void apply_penalties(std::vector<float>& logits, const std::vector<int>& generated,
                     float presence_penalty, float frequency_penalty);

/// Draws one token with all of SampleOptions' settings: the penalties over `generated`, the
/// temperature, top_k and top_p. With top_p 1 and no penalties it draws exactly what the
/// four-argument sample_token draws from the same generator state.
/// @param logits (V) one position's logits
/// @param options temperature, top_k, top_p and the penalties (the length and seed unused)
/// @param generated the tokens generated so far by this sequence
/// @param rng the source of the draw
/// @return a token id in [0, V)
/// @throws std::invalid_argument for bad options (see check_sample_options)
int sample_token(std::vector<float> logits, const SampleOptions& options,
                 const std::vector<int>& generated, Rng& rng);

/// Checks the sampling settings against a vocabulary of V tokens; each message starts with
/// the field's name ("top_p: …").
/// @throws std::invalid_argument for a temperature that is not positive and finite, top_k
/// outside 0…V, top_p outside (0, 1], a penalty that is not finite, or top_logprobs outside
/// −1…V
void check_sample_options(const SampleOptions& options, int V);

/// A sampled token's log-probability under the model and the most likely alternatives.
struct TokenLogprobs {
    double logprob = 0.0;                      ///< log p(the sampled token)
    std::vector<std::pair<int, double>> top;   ///< (id, log p), most likely first, ties by id
};

/// log softmax(logits) in float64: z − max z − log Σ exp(z − max z).
/// @param logits (V)
/// @return (V) log-probabilities
std::vector<double> log_softmax(const std::vector<float>& logits);

/// The log-probability of `token` and the `top` most likely tokens' from a log_softmax.
/// @param log_probs (V) from log_softmax
/// @param token the id sampled
/// @param top how many alternatives, 0…V
/// @return the token's log-probability and `top` pairs, most likely first
TokenLogprobs token_logprobs(const std::vector<double>& log_probs, int token, int top);

/// The checks and the first tokens that every generator (uncached, cached, on the GPU)
/// starts from, so that they fail alike and produce the same text.
/// @param vocab the vocabulary, of `vocab_size` characters
/// @param vocab_size the model's V
/// @param prompt the text to continue; empty starts from a newline (or token 0 if the
///        vocabulary has none)
/// @param options checked: a non-negative length, a valid temperature and top-k, and top_p,
///        the penalties and top_logprobs left as they are (the scheduler applies those)
/// @return the prompt's token ids
/// @throws std::invalid_argument for a vocabulary of another size, a character outside it,
/// or bad options (see sample_token)
std::vector<int> start_tokens(const CharVocab& vocab, int vocab_size, const std::string& prompt,
                              const SampleOptions& options);

/// Generates text after a prompt, as nanoGPT's `generate`: the context is cropped to the
/// last block_size tokens, the model runs in evaluation mode (and is left in it).
/// @param model the model
/// @param vocab its vocabulary
/// @param prompt the text to continue; empty starts from a newline (or token 0 if the
///        vocabulary has none)
/// @param options length, temperature, top-k and seed
/// @return the prompt followed by the generated characters
/// @throws std::invalid_argument if the prompt has a character outside the vocabulary, or
/// for bad options (see sample_token)
std::string generate_text(GPT& model, const CharVocab& vocab, const std::string& prompt,
                          const SampleOptions& options);

/// generate_text()'s loop with the forward pass given: the same checks, context and draws,
/// for a model spread over processes (tensor parallelism: every process of the split calls
/// it alike, and each gets the same text). @param last_logits the forward pass of a context
/// of T tokens, returning the V logits of its last position @param vocab the vocabulary, of
/// `vocab_size` characters @param vocab_size V @param block_size the longest context
/// @param prompt as generate_text @param options as generate_text @return as generate_text
std::string generate_text(const std::function<const float*(const int* context, int T)>& last_logits,
                          const CharVocab& vocab, int vocab_size, int block_size, const std::string& prompt,
                          const SampleOptions& options);

/// What run_training() does around the loop.
struct RunOptions {
    /// The run's folder: `checkpoint/` (written at every evaluation and at the end),
    /// `metrics.jsonl` (one JSON object per step and per evaluation). Empty: no files.
    std::filesystem::path out_dir;
    /// Evaluation lines ("step 250: train loss 2.0123, val loss 2.0876") go here; may be null.
    std::ostream* log = nullptr;
    /// Progress lines (step, loss, lr, tokens/s, ETA) go here, rewritten in place when it is
    /// a terminal; may be null.
    std::ostream* progress = nullptr;
    /// Whether `progress` is a terminal (then the line rewrites itself in place).
    bool progress_is_terminal = false;
    /// On a non-terminal, print a progress line every this many steps.
    std::int64_t progress_interval = 100;
    /// Polled after every step; returning true saves a checkpoint and stops.
    std::function<bool()> stop_requested;
};

/// How a call to run_training() ended.
struct RunSummary {
    bool stopped = false;            ///< true if stop_requested ended it early
    std::int64_t first_step = 0;     ///< the step it started from
    std::vector<StepRecord> steps;   ///< every step taken in this call
    std::vector<EvalRecord> evals;   ///< every evaluation made in this call
    double seconds = 0.0;            ///< wall time of the call
    double step_seconds = 0.0;       ///< of which the training steps (no evaluation, no files)
};

/// Starting weights from a weights directory (load_checkpoint's layouts, whole or sharded)
/// for a process that keeps only its shard of them (ZeRO stage 3), as Trainer::load reads a
/// checkpoint for it: the model is made without the whole buffers `buffers` leaves out, and
/// without whole weights only the runs `kept` names are read, a tensor at a time (one
/// tensor's buffer beside them), and left in the model for its group
/// (GPT::set_kept_weights), so that the process never holds the whole weights. With whole
/// weights every parameter is read into them.
/// @param dir the weights directory (its checksums, where it has them, are checked first)
/// @param config its model (load_config's, with the run's changes such as the dropout)
/// @param buffers the model's whole buffers
/// @param kept the runs of the flat buffer this process keeps, in the order it keeps them
/// @return the model, for Trainer's constructor from weights
/// @throws CheckpointError for a missing, damaged or non-finite tensor
GPT load_kept_weights(const std::filesystem::path& dir, const GPTConfig& config, GPTBuffers buffers,
                      const std::function<std::vector<AdamW::Segment>(const GPT&)>& kept);

/// Trains until max_iters or a stop request, evaluating at step 0, every eval_interval
/// steps and at the end, and writing checkpoints and metrics when out_dir is given. A
/// resumed run appends to metrics.jsonl after dropping lines past its checkpoint's step.
/// In a data-parallel group (Trainer::use_group) every process calls it with the same
/// options: rank 0 writes the files, the log and the progress, and a stop asked of any
/// process stops them all after the same step.
/// @param trainer the run
/// @param options where the output goes
/// @return the steps and evaluations of this call
/// @throws TrainingDiverged when the loss stops being finite, or an evaluation's (before it
/// is written: metrics.jsonl never holds a NaN); the last checkpoint written is left as it was
RunSummary run_training(Trainer& trainer, const RunOptions& options);

/// Writes a loss-curve PNG: the loss of every step, and the train and val losses of every
/// evaluation.
/// @param path the PNG file
/// @param steps the steps' records
/// @param evals the evaluations
/// @param title the chart's title
void plot_losses(const std::filesystem::path& path, const std::vector<StepRecord>& steps,
                 const std::vector<EvalRecord>& evals, const std::string& title);

/// Reads a run's `metrics.jsonl` back (for a loss curve of a run that was resumed).
/// @param path the metrics file written by run_training()
/// @param steps receives the step records, in file order
/// @param evals receives the evaluation records, in file order
/// @throws std::runtime_error if the file cannot be read; lines that are not JSON are skipped
void read_metrics(const std::filesystem::path& path, std::vector<StepRecord>& steps,
                  std::vector<EvalRecord>& evals);

/// Times training steps: `warmup` untimed ones (first-touch allocations), then `steps`
/// timed ones, and returns the median seconds per step (one step delayed by another program
/// moves the median least). The lessons turn it into the time a longer run would take, so
/// that a page's estimate comes from a measurement. The trainer takes warmup + steps steps.
/// @param trainer the run to time
/// @param steps the timed steps, at least 1
/// @param warmup the untimed steps before them
/// @return seconds per step
/// @throws std::invalid_argument if steps < 1 or warmup < 0
double median_step_seconds(Trainer& trainer, int steps, int warmup = 2);

/// Writes one step's gradients for comparison with PyTorch, on the first batch of the run
/// and in evaluation mode (no dropout), computed on the trainer's device when it has one:
/// `DIR/weights/` (the model, which PyTorch can load),
/// `DIR/x.npy`, `DIR/y.npy` (B, T) token ids as float32, `DIR/loss.npy` (1), and
/// `DIR/grad/<state_dict key>.npy` for every parameter.
/// @param trainer a run that has taken no step yet
/// @param dir the folder to write (replaced atomically)
/// @return the loss of that batch
float dump_gradients(Trainer& trainer, const std::filesystem::path& dir);

}  // namespace attn
