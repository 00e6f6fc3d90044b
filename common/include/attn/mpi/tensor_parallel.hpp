/// @file tensor_parallel.hpp
/// @brief Tensor parallelism over MPI (lesson 21; Shoeybi et al., "Megatron-LM: Training
/// Multi-Billion Parameter Language Models Using Model Parallelism", 2019): every block of
/// the GPT split over the ranks of a communicator. Each rank holds a share of every block's
/// heads and of its MLP's hidden units: the QKV projection and the MLP's first layer split
/// by output rows (column-parallel in Megatron's terms, which writes y = xA), the attention
/// output projection and the MLP's second layer by input columns (row-parallel). A rank
/// then computes its heads and hidden units on its own, and one allreduce after each
/// attention and each MLP joins the ranks' partial outputs in the forward pass, one before
/// each LayerNorm's backward joins the partial gradients in the backward pass. The
/// embeddings, the LayerNorms, the biases added after an allreduce and the LM head are kept
/// whole on every rank, which computes them alike.
#pragma once

#include "attn/gpt.hpp"
#include "attn/trainer.hpp"

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace attn::mpi {

/// What one rank gave to MPI_Allreduce in the last forward and backward pass.
struct TensorParallelTraffic {
    int allreduces = 0;          ///< calls: two per block forward, two per block backward
    std::size_t floats = 0;      ///< floats summed over the calls (each (B, T, C))
};

/// The forward and backward pass of a GPT's weights split over the ranks of `comm`. Built
/// from a whole model (each rank takes its slices); the gradients come back in the whole
/// model's layout, so that they can be compared with one process's and summed over
/// data-parallel copies. Implements the model lesson 21 trains: learned positions,
/// multi-head attention, no dropout, float32, with biases or without; anything else is
/// refused in one line.
class TensorParallelGPT {
public:
    /// @param whole the model to split: its weights are copied (it is not kept), or, where it
    /// was made without whole weights (GPTBuffers), each rank computes its slices of the
    /// seed's initial weights alone (GPT::initial_values), bit for bit the whole model's, and
    /// no rank ever holds the whole weights
    /// @param comm the ranks that share every block (MPI must be initialised)
    /// @param mine this rank's parameters in parameters()' order, where the caller has them
    /// already (read from a checkpoint: runs_of()); empty: taken as above
    /// @throws std::invalid_argument when the heads or the MLP's 4C hidden units do not
    ///         divide among the ranks, or for a setting this split does not implement
    TensorParallelGPT(const GPT& whole, MPI_Comm comm, std::vector<float> mine = {});

    /// One run of the whole model's flat buffer that a rank holds.
    struct Run {
        std::size_t whole = 0;    ///< its first float in the whole model's buffer
        std::size_t local = 0;    ///< its first float in parameters()
        std::size_t size = 0;     ///< its floats
        bool replicated = false;  ///< a whole tensor, the same on every rank
    };
    /// The runs rank `rank` of `ranks` holds, in parameters()' order, without any MPI call:
    /// what it reads of a checkpoint or a weights folder before the split is made.
    /// @param model the model (its parameter table; it may hold no whole weights)
    /// @param rank the rank @param ranks the ranks @return the runs as (offset, floats)
    /// @throws std::invalid_argument as the constructor, for a split it does not implement
    static std::vector<AdamW::Segment> runs_of(const GPT& model, int rank, int ranks);

    /// The forward pass of a batch. @param x (B, T) token ids @param y (B, T) targets
    /// @param B batch size @param T sequence length, at most the block size
    /// @return the mean loss over the B·T positions, the same on every rank; 0 when `y` is
    /// nullptr (logits() only, as for sampling)
    float forward(const int* x, const int* y, int B, int T);
    /// The last forward pass's logits, (B, T, V), whole on every rank (the LM head is).
    const std::vector<float>& logits() const { return logits_; }
    /// The model split. @return its settings
    const GPTConfig& config() const { return config_; }
    /// The backward pass of the last forward pass: the gradients of this rank's slices and
    /// of the whole tensors, cleared first.
    void backward();
    /// Every rank's gradients, gathered into the whole model's layout (GPT::gradients()).
    /// A collective call. @return the gradients of every parameter
    std::vector<float> whole_gradients() const;
    /// This rank's gradients (its slices, then the whole tensors), for a sum over
    /// data-parallel copies. @return them, in place
    std::vector<float>& local_gradients() { return grads_; }
    /// The parameters this rank holds: its slices and the whole tensors. @return floats
    std::size_t local_parameters() const { return params_.size(); }
    /// The contiguous runs of the whole model's buffer that parameters() is made of (a
    /// matrix split by columns is a run per row). @return their count
    std::size_t local_runs() const { return runs_.size(); }
    /// Those runs. @return them, in parameters()' order
    const std::vector<Run>& runs() const { return runs_; }
    /// This rank's parameters, in place (AdamW updates them). @return its slices and the
    /// whole tensors, in the order of local_table()
    std::vector<float>& parameters() { return params_; }
    /// This rank's parameters, read-only. @return parameters()' data
    const float* model_parameters() const { return params_.data(); }
    /// This rank's tensors in parameters(): where each lies and whether AdamW decays it (the
    /// slices of a matrix are matrices, as nanoGPT's rule asks). @return the table
    const std::vector<ParameterInfo>& local_table() const { return table_; }
    /// This rank's part of a buffer laid out as the whole model's parameters (AdamW's moments
    /// from a checkpoint). @param whole the buffer @return its slices and whole tensors
    std::vector<float> local_of(const std::vector<float>& whole) const;
    /// The whole model's buffer from every rank's part, laid out as local_of() cuts it (a
    /// collective call; a whole tensor is taken from this rank, all ranks holding the same).
    /// @param local this rank's part @return the whole buffer, on every rank
    std::vector<float> whole_of(const std::vector<float>& local) const;
    /// The sums of squares of this rank's gradients: over its slices (each a part no other
    /// rank holds) and over the whole tensors (the same on every rank), so that the whole
    /// model's is the first summed over the ranks plus the second once.
    /// @return {slices, whole tensors}
    std::pair<double, double> gradient_square_sums() const;
    /// What the last forward and backward pass gave to MPI_Allreduce.
    const TensorParallelTraffic& last_traffic() const { return traffic_; }

private:
    struct Layout;  // where each rank's slices lie in the whole model's buffer
    Layout layout() const;
    // The layout of a split over `ranks` ranks, checked (the constructor's refusals).
    static Layout layout_of(const GPT& model, int ranks);
    // Tensor `kind` (of block `layer`, or a whole one for −1) in params_ or grads_; nullptr
    // for a bias the model does not have.
    float* at(std::vector<float>& buffer, int kind, int layer);
    void allreduce(float* x, std::size_t n);

    MPI_Comm comm_;
    int rank_ = 0, size_ = 1;
    GPTConfig config_;
    int heads_ = 0;       // heads per rank
    int width_ = 0;       // A = heads_ · hs: the attention's channels per rank
    int hidden_ = 0;      // H = 4C / size_: the MLP's hidden units per rank
    std::size_t whole_size_ = 0;      // the whole model's parameters
    std::vector<std::size_t> bases_;  // where each kind of tensor starts in the whole model's buffer
    std::vector<float> params_, grads_;
    std::vector<std::size_t> offsets_;  // into params_: see Layout in the .cpp
    std::vector<ParameterInfo> table_;  // local_table()
    std::vector<Run> runs_;  // runs()
    // The last forward pass.
    int B_ = 0, T_ = 0;
    std::vector<int> x_, y_;
    std::vector<float> encoded_, ln1_, ln1_mean_, ln1_rstd_, qkv_, att_, atty_, res2_, ln2_, ln2_mean_, ln2_rstd_,
        fch_, fch_gelu_, res3_, lnf_, lnf_mean_, lnf_rstd_, logits_, probs_, losses_;
    TensorParallelTraffic traffic_;
};

/// Training with tensor parallelism (`train_gpt --tensor-parallel N`), as a TrainingDevice
/// of the Trainer: the model split over the ranks of `tensor` (TensorParallelGPT), and
/// optionally copies of that split sharing each batch over `data` (the grid of lesson 21:
/// each copy runs its share of the batch, and the slices' gradients are summed over the
/// copies). AdamW updates each rank's slices and whole tensors with moments of the same
/// layout; the clipping norm sums the slices' squares over the tensor-parallel ranks and
/// counts the whole tensors once. A host model with whole weights gets the whole state back
/// from every rank's part (pull(), a collective call). Float32, no dropout,
/// learned positions and multi-head attention only, as TensorParallelGPT.
/// A host model made without whole weights (GPTBuffers) keeps no copy: adopt() takes its
/// slices, checkpoints are written sharded by the ranks themselves (owned_state), and pull()
/// has nothing to fill.
class TensorParallelDevice : public TrainingDevice {
public:
    /// @param tensor the ranks that split every block @param data the ranks with the same
    /// slices, which share each batch (a communicator of one rank, or MPI_COMM_NULL: none)
    TensorParallelDevice(MPI_Comm tensor, MPI_Comm data);
    std::string name() const override;
    void push(const GPT& model, const AdamW& optimizer) override;
    /// push(), or for a host model made without whole weights: this rank's slices from it
    /// (GPT::take_kept_weights: the runs read of a checkpoint or a weights folder, else the
    /// seed's), and the optimizer's moments moved here (this rank's runs already, or cut from
    /// whole ones). The host then keeps no copy of the state.
    void adopt(GPT& model, AdamW& optimizer) override;
    /// This rank's runs for a sharded checkpoint ("tensor-parallel"): the slices of the ranks
    /// of the first data-parallel copy, one file each, the whole tensors in rank 0's; the
    /// other copies, holding the same, write none. @return true
    bool owned_state(ShardedState& out) const override;
    /// Every rank's slices gathered (a collective call over the split's ranks). @return them
    std::vector<float> gather_parameters() override;
    void pull(GPT& model, AdamW& optimizer) override;
    float loss(const int* x, const int* y, int B, int T, bool training, std::uint64_t dropout_seed) override;
    float backward_and_clip(float max_norm) override;
    void adamw_step(AdamW& optimizer, float lr) override;
    void copy_gradients_to(std::vector<float>& out) override;
    bool writes_files() const override;
    bool any(bool flag) override;
    void barrier() override;
    /// The split model (after push()). @return it
    const TensorParallelGPT& model() const { return *split_; }
    /// Text sampled on the slices, as generate_text() would from the whole model: every rank of
    /// the split must call it alike (each forward pass is collective), and each gets the same
    /// text. No rank gathers the weights. @param vocab the vocabulary @param prompt the text
    /// to continue @param options as generate_text @return as generate_text
    std::string generate(const CharVocab& vocab, const std::string& prompt, const SampleOptions& options);
    /// What the last training step's forward and backward pass gave to MPI_Allreduce (not an
    /// evaluation's). @return the calls and floats
    const TensorParallelTraffic& last_step_traffic() const { return step_traffic_; }

private:
    MPI_Comm tensor_, data_;
    int tensor_rank_ = 0, tensor_size_ = 1, data_rank_ = 0, data_size_ = 1;
    std::unique_ptr<TensorParallelGPT> split_;
    AdamW local_;         // the moments of this rank's parameters, in their layout
    float share_ = 1.0f;  // this copy's part of the last batch
    TensorParallelTraffic step_traffic_;  // last_step_traffic()
};

}  // namespace attn::mpi
