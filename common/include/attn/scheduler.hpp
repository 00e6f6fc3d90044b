/// @file scheduler.hpp
/// @brief Continuous batching: many requests decoded together, admitted and finished at
/// every step.
///
/// A server that runs one request at a time reads every weight once per token per user;
/// one that batches requests statically waits for the longest of a batch before starting
/// the next. Orca (Yu et al., OSDI 2022) schedules at the granularity of one step instead:
/// at every step the scheduler admits waiting requests while the paged cache has blocks for
/// them, runs one batched forward pass (forward_paged) over one row for each decoding
/// sequence and a chunk of each new prompt (chunked prefill), samples, and retires the
/// finished sequences, whose blocks the next step can give to someone else. When a step
/// needs more blocks than are free, the newest running sequence is preempted: its blocks
/// are freed and it goes back to the head of the queue, to be recomputed from its prompt and
/// the tokens it already produced (vLLM's recompute preemption). Admission is first come,
/// first served and preemption takes the newest, so the oldest request always advances: no
/// request starves.
#pragma once

#include "attn/gpt.hpp"
#include "attn/paged_cache.hpp"
#include "attn/random.hpp"
#include "attn/trainer.hpp"

#include <deque>
#include <map>
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
};

/// Continuous batching over a paged cache.
class Scheduler {
public:
    /// @param model a causal model (its weights are read, never changed)
    /// @param cache an empty pool of the model's sizes, used by this scheduler alone
    /// @param options the step's limits
    /// @throws std::invalid_argument for limits that are not positive or step_tokens below
    ///         max_running
    Scheduler(const GPT& model, PagedKVCache& cache, SchedulerOptions options = {});

    /// Takes a request: into the batch at once when it has room (a free place among
    /// max_running and blocks for the prompt), else into the queue.
    /// @return its id
    /// @throws std::invalid_argument for an empty prompt, a token outside the vocabulary,
    ///         max_new_tokens below 1, bad sampling options, a prompt plus max_new_tokens past
    ///         the model's context (block_size + 1 tokens: the last one is never fed back),
    ///         or more blocks than the whole pool has; QueueFull when the queue is full
    int submit(const CompletionRequest& request);
    /// Drops a request, waiting or running: its blocks return to the pool at once (a client
    /// that went away). @return false if the id is not queued or running
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
    const SchedulerStats& stats() const { return stats_; }             ///< counts so far
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
    };
    /// @endcond
    void admit();
    void preempt(int request);
    void finish(int request);

    const GPT& model_;
    PagedKVCache& cache_;
    SchedulerOptions options_;
    std::map<int, Request> requests_;
    std::deque<int> waiting_;
    std::vector<int> running_;  // admission order, oldest first
    int next_id_ = 0;
    SchedulerStats stats_;
    DecodeScratch scratch_;
};

}  // namespace attn
