/// @file zero.hpp
/// @brief ZeRO stages 1, 2 and 3 over MPI (lesson 21; Rajbhandari et al., "ZeRO: Memory
/// Optimizations Toward Training Trillion Parameter Models", SC 2020): data parallelism in
/// which each rank keeps AdamW's moments (stage 1), the summed gradients too (stage 2), and
/// the parameters too (stage 3, what PyTorch's FSDP does) for its shard of the parameters
/// only. The gradients are summed by ring reduce-scatters (each rank ends with the whole
/// batch's gradient of its shard), each rank updates its shard, and ring all-gathers give
/// every rank every shard's new parameters: after the step (stages 1 and 2), or a block at a
/// time just before each pass uses it (stage 3).
#pragma once

#include "attn/mpi/data_parallel.hpp"
#include "attn/shard.hpp"

#include <cstddef>
#include <memory>
#include <vector>

namespace attn::mpi {

/// What one rank sent in the last step, counted by the ring collectives themselves.
struct ZeroTraffic {
    std::size_t reduce_scatter_bytes = 0;  ///< the gradients' reduce-scatter
    std::size_t all_gather_bytes = 0;      ///< the parameters' all-gather
    std::size_t norm_bytes = 0;            ///< the clipping norm's sum of squares (one double)
    /// Everything. @return the sum of the three
    std::size_t total() const { return reduce_scatter_bytes + all_gather_bytes + norm_bytes; }
};

/// What both ZeRO stages share: data parallelism over MPI's world communicator in which each
/// rank keeps its shard of the summed gradients, counts what its rings send, and clips by
/// the norm of the shards' squares summed over the ranks.
class ZeroGroup : public DataParallel {
public:
    ZeroGroup();
    bool holds_whole_gradients() const override { return false; }
    /// What this rank sent in the last step (its forward pass, backward pass and update).
    const ZeroTraffic& last_traffic() const { return last_; }

protected:
    /// clip_grad_norm()'s rule on this rank's shard of the gradients, with the norm of every
    /// rank's: each sums its squares, the sums are added over the ranks (one double each,
    /// counted). @param g the shard @param n its floats @param max_norm as clip_grad_norm()'s
    /// @return the norm before clipping, the same on every rank
    float clip_shard(float* g, std::size_t n, float max_norm);

    float share_ = 1.0f;          ///< this rank's part of the batch (begin_gradients)
    std::vector<float> scratch_;  ///< a piece received (the rings move 64 KiB at a time)
    ZeroTraffic traffic_;         ///< what this rank's rings have sent in the step under way
    ZeroTraffic last_;            ///< traffic_ of the last step, kept by update()
};

/// ZeRO stage 1 over MPI's world communicator (Trainer::use_group), with the ranks' shards
/// from shard_of() over the model's flat parameter buffer. MPI must be initialised.
///
/// Each rank still computes its share of the batch's gradients into a whole gradient buffer
/// (the model's backward pass writes one), so what the sharding saves is AdamW's moments:
/// 8 bytes per parameter become 8 per parameter of the shard. The collectives are written
/// out as rings of MPI_Sendrecv, in pieces of at most 64 KiB (so that a rank receives into a
/// buffer of one piece, not of a shard), and each rank counts the bytes it sends: (P −
/// |shard r|) floats for the reduce-scatter and (P − |shard r + 1|) for the all-gather,
/// together 2(N − 1)/N of the parameters' bytes, what the ring allreduce of plain data
/// parallelism sends (the paper: stage 1 moves what data parallelism moves).
class ShardedOptimizer : public ZeroGroup {
public:
    void begin_gradients(GPT& model, double share) override;
    void finish_gradients(GPT& model) override;
    float clip_gradients(GPT& model, float max_norm) override;
    void update(GPT& model, AdamW& optimizer, float lr) override;
    void whole_moments(const GPT& model, const AdamW& optimizer, std::vector<float>& m, std::vector<float>& v) override;
    /// Its shard's weights and moments ("zero-1"). @return true
    bool owned_state(const GPT& model, const AdamW& optimizer, OwnedState& out) const override;
    /// The ring's buffer for a piece received (at most 64 KiB). @return its bytes
    std::size_t gradient_bytes() const override { return scratch_.capacity() * sizeof(float); }

    /// This rank's shard of a model's parameters. @param model the model @return its range
    Shard shard(const GPT& model) const { return shard_of(model.parameters().size(), rank(), size()); }
};

/// ZeRO stage 2 over MPI's world communicator: the gradients sharded as well as AdamW's
/// moments. The model hands its gradients over one bucket at a time while the backward pass
/// runs (GPT::set_gradient_sink: one block's buffer instead of a whole gradient buffer), each
/// bucket is reduce-scattered round the ring at once, and each rank keeps only its piece of
/// every bucket: shard_of() over that bucket's floats. After the clipping norm and AdamW on
/// the pieces (AdamW::step_segments), a ring all-gather per bucket gives every rank every
/// piece's new parameters.
///
/// Per rank it holds 4P of weights, 4P/N of gradients (its pieces) plus one block's buffer
/// and the embeddings' (the model's, per thread), and 8P/N of moments. What it sends per
/// step is what stage 1 sends, 2(N − 1)/N of the parameters' bytes, in a ring per bucket.
class ShardedGradients : public ZeroGroup {
public:
    void begin_gradients(GPT& model, double share) override;
    void finish_gradients(GPT& model) override;
    float clip_gradients(GPT& model, float max_norm) override;
    void update(GPT& model, AdamW& optimizer, float lr) override;
    void whole_moments(const GPT& model, const AdamW& optimizer, std::vector<float>& m, std::vector<float>& v) override;
    /// False: the backward pass hands each block's gradients to the ring as it finishes them,
    /// with no whole buffer to add several passes' gradients in. @return false
    bool accumulates_in_model() const override { return false; }
    /// Its pieces' weights and moments ("zero-2"; stage 3's "zero-3"). @return true
    bool owned_state(const GPT& model, const AdamW& optimizer, OwnedState& out) const override;
    /// Its pieces of the summed gradients and the rings' buffers (a piece received; in stage 2 a piece sent too). @return their bytes
    std::size_t gradient_bytes() const override;

    /// This rank's parameters, a piece of every bucket in the model's bucket order, as
    /// runs of the flat buffer. @param model the model @return the runs
    std::vector<AdamW::Segment> segments(const GPT& model) const;

protected:
    /// AdamW's moments as this rank's pieces: a checkpoint's whole state is cut to them, once.
    /// @param model the model @param optimizer its AdamW @param mine segments(model)
    void cut_moments(const GPT& model, AdamW& optimizer, const std::vector<AdamW::Segment>& mine);
    /// The floats of the rings' buffers: the largest piece of any bucket. @param model the
    /// model @return ring_buffer_floats() of its largest bucket
    std::size_t largest_piece(const GPT& model) const;

    bool moments_cut_ = false;           ///< whether AdamW's moments are this rank's pieces (else whole or none)
    std::vector<float> shard_;           ///< this rank's gradients: its piece of every bucket, in order
    std::vector<std::size_t> piece_at_;  ///< where each bucket's piece starts in shard_
    std::vector<float> sending_;         ///< a piece of parameters sent, packed

private:
    // A bucket's gradients from the model's backward pass: reduce-scattered, this rank's
    // piece kept.
    void take(const GPT& model, int bucket, float* gradients);
};

/// ZeRO stage 3 over MPI's world communicator, which PyTorch's FSDP implements (Zhao et al.,
/// "PyTorch FSDP", VLDB 2023): the parameters sharded as well as the gradients and AdamW's
/// moments. Each rank keeps its piece of every bucket's parameters (the same pieces as its
/// gradients in stage 2) and the model keeps no whole parameter buffer: a weight source
/// (GPT::set_weight_source) gathers each block's parameters round a ring while the forward
/// pass computes the block before, and again while the backward pass computes the block
/// after, into one of two block buffers that the blocks take in turn; the embeddings and ln_f
/// are gathered at the start of each pass. The gradients are reduce-scattered bucket by bucket as in stage 2, and AdamW updates
/// this rank's pieces where they lie (AdamW::step_packed), with no all-gather after the step.
///
/// Per rank it holds 4P/N of weights, 4P/N of gradients and 8P/N of moments, plus two
/// blocks' and the embeddings' buffers of weights and one block's and the embeddings' of
/// gradients. What it sends per step is three
/// rings' worth, (N − 1)/N of the parameters' bytes each (two all-gathers and a
/// reduce-scatter): 1.5 times what data parallelism's allreduce sends, as the paper says.
///
/// The gathers overlap the compute as FSDP's prefetch does: a communication thread of each
/// rank runs them, on a duplicate of the world communicator, while the passes compute; the
/// model starts block l + 1's gather (l − 1's going back) as soon as block l's weights have
/// arrived. So MPI must provide MPI_THREAD_MULTIPLE (World asks for it; attach() refuses without it). Float32
/// only (mixed precision rounds a copy of the whole weights, which no rank holds).
class ShardedParameters : public ShardedGradients {
public:
    /// How long a step's gathers took and how long the passes waited for them.
    struct GatherTimes {
        double gathering = 0.0;  ///< seconds the communication thread spent in the rings
        double waiting = 0.0;    ///< seconds the passes' thread spent waiting for their weights
    };

    ShardedParameters();
    ~ShardedParameters() override;
    /// Starts the communication thread (once) and hands the model a weight source.
    /// @param model the model, in float32 @throws std::invalid_argument for another precision
    /// @throws std::runtime_error when MPI does not provide MPI_THREAD_MULTIPLE
    void attach(GPT& model) override;
    void begin_gradients(GPT& model, double share) override;
    void update(GPT& model, AdamW& optimizer, float lr) override;
    /// Its pieces' weights (where it keeps them) and moments ("zero-3"). @return true
    bool owned_state(const GPT& model, const AdamW& optimizer, OwnedState& out) const override;
    /// This rank's pieces of the parameters. @return their bytes
    std::size_t weight_bytes() const override { return weights_.capacity() * sizeof(float); }
    /// The gathers' times in the last step (its forward and backward passes).
    const GatherTimes& last_gather_times() const { return last_times_; }

private:
    class Gatherer;  // the communication thread (zero.cpp)
    // Bucket b's parameters: this rank's piece into its place in `weights` (the bucket's
    // ranges one after the other), and the ring that brings every other rank's started.
    void start(int bucket, float* weights);
    // Returns once the oldest bucket started is gathered.
    void wait(int bucket);

    std::vector<float> weights_;             // this rank's piece of every bucket's parameters, in order
    std::vector<std::size_t> bucket_sizes_;  // the floats of each bucket
    bool in_backward_ = false;               // between begin_gradients() and update()
    GatherTimes times_, last_times_;         // the step under way's, and the last step's
    std::unique_ptr<Gatherer> gatherer_;     // made by the first attach()
};

/// The runs of a model's flat parameter buffer whose moments rank `rank` of `ranks` keeps under
/// ZeRO stage `stage`, in the order it keeps them: its shard of the whole buffer (stage 1), its
/// piece of every bucket (stages 2 and 3: ShardedGradients::segments). What Trainer::load
/// reads of a sharded checkpoint for that rank. @param model the model @param stage 1, 2 or 3
/// @param rank the rank @param ranks the ranks @return the runs
std::vector<AdamW::Segment> kept_segments(const GPT& model, int stage, int rank, int ranks);

/// The floats of the buffer a ring collective over `n` floats on `ranks` ranks receives into
/// (the rings of ShardedOptimizer and ShardedGradients move a shard in pieces of at most 64
/// KiB): the largest piece, or 0 on one rank. @param n the floats @param ranks the ranks
/// @return its size
std::size_t ring_buffer_floats(std::size_t n, int ranks);

}  // namespace attn::mpi
