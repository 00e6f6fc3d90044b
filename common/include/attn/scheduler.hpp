/// @file scheduler.hpp
/// @brief Continuous batching: many requests decoded together, admitted and finished at
/// every step.
///
/// A server that runs one request at a time reads every weight once per token per user;
/// one that batches requests statically waits for the longest of a batch before starting
/// the next. Orca (Yu et al., OSDI 2022) schedules at the granularity of one step instead:
/// at every step the scheduler admits waiting requests while the paged cache has blocks for
/// them, runs one batched forward pass (a PagedStep: forward_paged on the CPU,
/// attn::cuda::PagedEngine on a GPU) over one row for each decoding
/// sequence and a chunk of each new prompt (chunked prefill), samples, and retires the
/// finished sequences, whose blocks the next step can give to someone else. When a step
/// needs more blocks than are free, the newest running sequence is preempted: its blocks
/// are freed and it goes back to the head of the queue, to be recomputed from its prompt and
/// the tokens it already produced (vLLM's recompute preemption). Admission is first come,
/// first served and preemption takes the newest, so the oldest request always advances: no
/// request starves.
///
/// With prefix caching (on by default), a request starts from the cache's registered blocks
/// of its prompt's longest cached prefix (PagedKVCache::add_sequence(tokens)) and computes
/// only the positions after them; after every step the full blocks just written are
/// registered. This is exact for every model forward_paged runs: it is causal, so keys and
/// values at position p depend on tokens 0 … p alone (learned positions, RoPE and ALiBi all
/// depend on p itself, which a shared prefix shares; a sliding window only narrows which of
/// tokens 0 … p a layer reads; dropout is off in evaluation). submit(request, n) samples n
/// continuations of one prompt, computed once and forked when it is done.
#pragma once

#include "attn/gpt.hpp"
#include "attn/paged_cache.hpp"
#include "attn/random.hpp"
#include "attn/trainer.hpp"

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <vector>

namespace attn {

/// Thrown by Scheduler::submit when the queue already holds max_waiting requests.
struct QueueFull : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// One completion to compute: a prompt's token ids and how to sample after it.
struct CompletionRequest {
    std::vector<int> prompt;  ///< token ids, at least one
    SampleOptions options;    ///< max_new_tokens (≥ 1), temperature, top_k, top_p, penalties,
                              ///< top_logprobs, seed
};

/// How much a step may do.
struct SchedulerOptions {
    int max_running = 16;  ///< sequences in the batch at once
    int max_waiting = 64;  ///< requests queued while the batch is full; one more is refused
                           ///< (QueueFull)
    int step_tokens = 64;  ///< rows of one forward pass (decode rows first, then prefill
                           ///< chunks); at least max_running
    bool prefix_caching = true;  ///< reuse the cache's registered blocks of a prompt's prefix
};

/// What one step produced for one request.
struct StepEvent {
    int request;    ///< the id submit returned
    int token;      ///< the token sampled
    bool finished;  ///< it was the request's last: its blocks are free again
    /// The token's log-probability and the most likely alternatives, when the request's
    /// options ask for them (top_logprobs ≥ 0); empty otherwise, at no cost.
    std::optional<TokenLogprobs> logprobs = {};
};

/// Counts since the scheduler was made.
struct SchedulerStats {
    long steps = 0;         ///< forward passes
    long decode_rows = 0;   ///< rows that produced a sequence's next token from its last one
    long prefill_rows = 0;  ///< rows of prompts (and of recomputed sequences)
    long preemptions = 0;   ///< sequences sent back to the queue for want of blocks
    long finished = 0;      ///< requests completed
    long cancelled = 0;     ///< requests cancelled
    long forks = 0;         ///< continuations forked from a computed prompt (submit with n > 1)
    long prefix_cache_queries = 0;    ///< full prompt blocks looked up at admission
    long prefix_cache_hits = 0;       ///< of those, found registered and reused
    long prefix_cache_evictions = 0;  ///< registered blocks evicted to make room
};

/// Continuous batching over a paged cache.
class Scheduler {
public:
    /// @param model a causal model (its weights are read, never changed)
    /// @param cache an empty pool of the model's sizes, used by this scheduler alone (the
    ///        blocks it has registered before are forgotten)
    /// @param options the step's limits
    /// @throws std::invalid_argument for limits that are not positive or step_tokens below
    ///         max_running
    Scheduler(const GPT& model, PagedKVCache& cache, SchedulerOptions options = {});
    /// The same on any device: every step's forward pass is `step`'s (CpuPagedStep is the
    /// constructor above's; attn::cuda::PagedEngine runs it on a GPU), everything else (the
    /// plan, preemption, prefix caching, sampling) is this class's, the same for every device.
    /// @param step the batched step, used by this scheduler alone while it lives
    /// @param cache an empty pool of the model's sizes (the one `step` writes, for a GPU's)
    /// @param options the step's limits
    Scheduler(PagedStep& step, PagedKVCache& cache, SchedulerOptions options = {});

    /// Takes a request: into the batch at once when it has room (a free place among
    /// max_running and blocks for the prompt), else into the queue.
    /// @return its id
    /// @throws std::invalid_argument for an empty prompt, a token outside the vocabulary,
    ///         max_new_tokens below 1, bad sampling options, a prompt plus max_new_tokens past
    ///         the model's context (block_size + 1 tokens: the last one is never fed back),
    ///         or more blocks than the whole pool has; QueueFull when the queue is full
    int submit(const CompletionRequest& request);
    /// Takes n continuations of one prompt: the prompt is queued and computed once, and when
    /// it is, its sequence is forked n − 1 times (the blocks shared, a partial last block
    /// copied on the first write). Continuation i (0 … n − 1) samples with the seed
    /// request.options.seed + i (mod 2⁶⁴), so its tokens are those of a request of that seed
    /// alone. Each continuation has its own id: cancelling one leaves the others; a
    /// continuation preempted later is recomputed on its own.
    /// @param request the prompt and the sampling options @param n continuations, in
    ///        [1, max_running] (the group is admitted when the batch has room for all n)
    /// @return the n ids, continuation i's at index i
    /// @throws as submit; std::invalid_argument naming `n` for n outside [1, max_running]
    std::vector<int> submit(const CompletionRequest& request, int n);
    /// Drops a request, waiting or running: the blocks no other sequence holds return to the
    /// pool at once (a client that went away; registered ones as evictable). Cancelling the
    /// first of a group whose prompt is still being computed hands the prompt to the next
    /// continuation. @return false if the id is not queued or running
    bool cancel(int request);

    /// One step: admit, plan the rows (preempting the newest sequences while the blocks do
    /// not suffice), run forward_paged, sample. @return a token for every sequence whose
    /// prompt is now fully computed, in the order the requests were admitted; nothing when
    /// idle
    std::vector<StepEvent> step();

    bool idle() const { return running_.empty() && waiting_.empty(); }  ///< nothing to do
    int running() const { return static_cast<int>(running_.size()); }  ///< sequences batched
    /// The running requests' ids, oldest first.
    const std::vector<int>& running_requests() const { return running_; }
    int waiting() const { return static_cast<int>(waiting_.size()); }  ///< requests queued
    SchedulerStats stats() const;  ///< counts so far
    /// The tokens a request has produced so far. @param request a queued or running id
    const std::vector<int>& generated(int request) const;
    /// The cache's sequence of a running request, or −1 when it waits.
    int sequence_of(int request) const;

private:
    /// @cond INTERNAL
    struct Request {
        std::vector<int> tokens;  // prompt, then every token sampled
        int prompt_length = 0;
        std::vector<int> generated;
        SampleOptions options;
        Rng rng;
        int seq = -1;       // the cache's sequence while running
        int computed = 0;   // positions whose keys and values are in the cache
        std::vector<int> forks;  // continuations to fork when the prompt is computed
        int forked_from = -1;    // a continuation not yet forked: the request it waits on
    };
    /// @endcond
    Scheduler(std::unique_ptr<PagedStep> own, PagedStep* step, PagedKVCache& cache,
              SchedulerOptions options);
    void validate(const CompletionRequest& request) const;
    void admit();
    void preempt(int request);
    void finish(int request);

    std::unique_ptr<PagedStep> own_step_;  // the CPU's, when made from a model
    PagedStep& step_;
    const GPT& model_;
    PagedKVCache& cache_;
    SchedulerOptions options_;
    std::map<int, Request> requests_;
    std::deque<int> waiting_;
    std::vector<int> running_;  // admission order, oldest first
    int next_id_ = 0;
    SchedulerStats stats_;
    long evictions_before_ = 0;  // the cache's count when this scheduler took it
};

}  // namespace attn
