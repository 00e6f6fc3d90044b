// Continuous batching: admission, the plan of one step's rows, preemption, sampling.
#include "attn/scheduler.hpp"

#include "attn/error.hpp"

#include <algorithm>
#include <cmath>
#include <string>

namespace attn {

using std::to_string;

namespace {
// Inserts id into a list kept in ascending order (ids grow with arrival: oldest first).
template <class List>
void insert_sorted(List& list, int id) {
    list.insert(std::lower_bound(list.begin(), list.end(), id), id);
}
}  // namespace

Scheduler::Scheduler(const GPT& model, PagedKVCache& cache, SchedulerOptions options)
    : Scheduler(std::make_unique<CpuPagedStep>(model), nullptr, cache, options) {}

Scheduler::Scheduler(PagedStep& step, PagedKVCache& cache, SchedulerOptions options)
    : Scheduler(nullptr, &step, cache, options) {}

Scheduler::Scheduler(std::unique_ptr<PagedStep> own, PagedStep* step, PagedKVCache& cache,
                     SchedulerOptions options)
    : own_step_(std::move(own)), step_(step ? *step : *own_step_), model_(step_.model()),
      cache_(cache), options_(options) {
    require(options.max_running > 0 && options.max_waiting >= 0 && options.step_tokens > 0,
            "Scheduler: max_running and step_tokens must be positive and max_waiting ≥ 0, got " +
                to_string(options.max_running) + ", " + to_string(options.step_tokens) + ", " +
                to_string(options.max_waiting));
    require(options.step_tokens >= options.max_running,
            "Scheduler: step_tokens " + to_string(options.step_tokens) +
                " must be at least max_running " + to_string(options.max_running) +
                " (every running sequence needs its row)");
    require(cache.sequences() == 0, "Scheduler: the cache must be empty");
    // blocks registered before (by another model, perhaps) are forgotten
    cache_.set_prefix_caching(false);
    cache_.set_prefix_caching(options.prefix_caching);
    evictions_before_ = cache_.evictions();
}

SchedulerStats Scheduler::stats() const {
    SchedulerStats s = stats_;
    s.prefix_cache_evictions = cache_.evictions() - evictions_before_;
    return s;
}

int Scheduler::submit(const CompletionRequest& request) { return submit(request, 1).front(); }

void Scheduler::validate(const CompletionRequest& request) const {
    const GPTConfig& cfg = model_.config();
    const SampleOptions& o = request.options;
    const int n = static_cast<int>(request.prompt.size());
    require(n >= 1, "prompt: empty (give at least one token)");
    for (int t : request.prompt) {
        require(t >= 0 && t < cfg.vocab_size, "prompt: token id " + to_string(t) +
                                                  " is outside [0, " + to_string(cfg.vocab_size) + ")");
    }
    require(o.max_new_tokens >= 1,
            "max_tokens: must be at least 1, got " + to_string(o.max_new_tokens));
    check_sample_options(o, cfg.vocab_size);  // "temperature: …", "top_p: …"
    // the prompt and every sampled token but the last are fed to the model: each needs a
    // position below block_size
    const int positions = n + o.max_new_tokens - 1;
    require(positions <= cfg.block_size,
            "max_tokens: the prompt's " + to_string(n) + " tokens and " +
                to_string(o.max_new_tokens) + " new ones need " + to_string(positions) +
                " positions, past the model's context of " + to_string(cfg.block_size));
    require(cache_.blocks_for(positions) <= cache_.num_blocks(),
            "max_tokens: the request needs " + to_string(cache_.blocks_for(positions)) +
                " blocks, the pool has " + to_string(cache_.num_blocks()));
}

std::vector<int> Scheduler::submit(const CompletionRequest& request, int n) {
    validate(request);
    require(n >= 1 && n <= options_.max_running,
            "n: must be in [1, " + to_string(options_.max_running) + "] (the batch's size), got " +
                to_string(n));
    const int prompt = static_cast<int>(request.prompt.size());
    // admitted at once when the batch has room, else queued while the queue has room
    if (static_cast<int>(waiting_.size()) >= options_.max_waiting &&
        (!waiting_.empty() || static_cast<int>(running_.size()) >= options_.max_running ||
         static_cast<int>(running_.size()) + n > options_.max_running ||
         cache_.blocks_to_add(request.prompt) + static_cast<int>(running_.size()) + n - 1 >
             cache_.free_blocks()))
        throw QueueFull("the queue holds its " + to_string(options_.max_waiting) +
                        " requests and the batch its " + to_string(options_.max_running) +
                        "; try again later");
    std::vector<int> ids;
    for (int i = 0; i < n; ++i) {
        const int id = next_id_++;
        Request r;
        r.tokens = request.prompt;
        r.prompt_length = prompt;
        r.options = request.options;
        r.options.seed = request.options.seed + static_cast<std::uint64_t>(i);  // wraps mod 2⁶⁴
        r.rng = Rng(r.options.seed);
        if (i > 0) {
            r.forked_from = ids.front();
            requests_.at(ids.front()).forks.push_back(id);
        }
        requests_.emplace(id, std::move(r));
        ids.push_back(id);
    }
    waiting_.push_back(ids.front());  // ids grow: the queue stays in arrival order
    admit();
    return ids;
}

bool Scheduler::cancel(int request) {
    auto it = requests_.find(request);
    if (it == requests_.end()) return false;
    Request& r = it->second;
    if (r.forked_from >= 0) {
        // a continuation not yet forked: the prompt goes on for the others
        std::vector<int>& forks = requests_.at(r.forked_from).forks;
        forks.erase(std::remove(forks.begin(), forks.end(), request), forks.end());
        requests_.erase(it);
        ++stats_.cancelled;
        return true;
    }
    if (!r.forks.empty()) {
        // the prompt of a group, still being computed: the next continuation takes it over,
        // its place in the queue or the batch, its sequence and what is computed
        const int heir = r.forks.front();
        Request& h = requests_.at(heir);
        h.seq = r.seq;
        h.computed = r.computed;
        h.forked_from = -1;
        h.forks.assign(r.forks.begin() + 1, r.forks.end());
        for (int f : h.forks) requests_.at(f).forked_from = heir;
        std::replace(running_.begin(), running_.end(), request, heir);
        std::replace(waiting_.begin(), waiting_.end(), request, heir);
        std::sort(running_.begin(), running_.end());
        std::sort(waiting_.begin(), waiting_.end());
        requests_.erase(it);
        ++stats_.cancelled;
        return true;
    }
    if (r.seq >= 0) cache_.free_sequence(r.seq);
    running_.erase(std::remove(running_.begin(), running_.end(), request), running_.end());
    waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), request), waiting_.end());
    requests_.erase(it);
    ++stats_.cancelled;
    return true;
}

const std::vector<int>& Scheduler::generated(int request) const {
    auto it = requests_.find(request);
    require(it != requests_.end(),
            "Scheduler::generated: request " + to_string(request) + " is not queued or running");
    return it->second.generated;
}

int Scheduler::sequence_of(int request) const {
    auto it = requests_.find(request);
    return it == requests_.end() ? -1 : it->second.seq;
}

void Scheduler::admit() {
    // First come, first served, never skipping: a request that does not fit holds the
    // queue until blocks free up. Each running sequence may take a block this step, so
    // that many stay in reserve.
    while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_running) {
        const int id = waiting_.front();
        Request& r = requests_.at(id);
        // a group needs a place for each continuation, and each a block for its first write
        const int group = 1 + static_cast<int>(r.forks.size());
        if (static_cast<int>(running_.size()) + group > options_.max_running) break;
        const int need = cache_.blocks_to_add(r.tokens);  // less what is cached
        if (need + static_cast<int>(running_.size()) + group - 1 > cache_.free_blocks()) break;
        waiting_.pop_front();
        if (cache_.prefix_caching()) {
            stats_.prefix_cache_queries += static_cast<long>(r.tokens.size()) / cache_.block_tokens();
            stats_.prefix_cache_hits += cache_.match_prefix(r.tokens).blocks;
        }
        r.seq = cache_.add_sequence(r.tokens);
        r.computed = cache_.length(r.seq);  // the cached prefix is not computed again
        insert_sorted(running_, id);
    }
}

void Scheduler::preempt(int id) {
    Request& r = requests_.at(id);
    cache_.free_sequence(r.seq);
    r.seq = -1;
    r.computed = 0;  // recomputed from its prompt and the tokens it produced
    running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
    insert_sorted(waiting_, id);
    ++stats_.preemptions;
}

void Scheduler::finish(int id) {
    Request& r = requests_.at(id);
    cache_.free_sequence(r.seq);
    running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
    requests_.erase(id);
    ++stats_.finished;
}

std::vector<StepEvent> Scheduler::step() {
    admit();
    // The plan: one row for every sequence with one token to compute (decoding), then the
    // next chunk of every prompt still being computed, oldest first, within step_tokens.
    struct Share {
        int id;
        int rows;
    };
    std::vector<Share> plan;
    while (!running_.empty()) {
        plan.clear();
        int budget = options_.step_tokens;
        for (int id : running_) {
            const Request& r = requests_.at(id);
            if (static_cast<int>(r.tokens.size()) - r.computed == 1 && budget > 0) {
                plan.push_back({id, 1});
                --budget;
            }
        }
        for (int id : running_) {
            const Request& r = requests_.at(id);
            const int pending = static_cast<int>(r.tokens.size()) - r.computed;
            if (pending > 1 && budget > 0) {
                const int n = std::min(pending, budget);
                plan.push_back({id, n});
                budget -= n;
            }
        }
        int needed = 0;
        for (const Share& s : plan) needed += cache_.blocks_needed(requests_.at(s.id).seq, s.rows);
        if (needed <= cache_.free_blocks()) break;
        preempt(running_.back());  // the newest goes back to the queue
    }
    if (plan.empty()) return {};

    std::vector<PagedRow> rows;
    std::vector<int> last_row;  // per share: the row whose logits give its next token
    for (const Share& s : plan) {
        const Request& r = requests_.at(s.id);
        for (int k = 0; k < s.rows; ++k) {
            const int pos = r.computed + k;
            rows.push_back({r.seq, r.tokens[static_cast<std::size_t>(pos)], pos});
        }
        last_row.push_back(static_cast<int>(rows.size()) - 1);
        if (s.rows == 1 && static_cast<int>(r.tokens.size()) - r.computed == 1)
            ++stats_.decode_rows;
        else
            stats_.prefill_rows += s.rows;
    }
    const std::vector<float>& logits = step_.forward(cache_, rows);
    ++stats_.steps;

    const int V = model_.config().vocab_size;
    std::vector<StepEvent> events;
    std::vector<float> row(static_cast<std::size_t>(V));
    for (std::size_t i = 0; i < plan.size(); ++i) {
        const int id = plan[i].id;
        Request& r = requests_.at(id);
        r.computed += plan[i].rows;
        cache_.register_full_blocks(r.seq, r.tokens);  // the blocks this step filled
        if (r.computed < static_cast<int>(r.tokens.size())) continue;  // a prompt chunk
        const float* l = logits.data() + static_cast<std::size_t>(last_row[i]) * V;
        // the prompt of a group is computed: each continuation gets a fork of its sequence
        // and samples its first token from the same logits with its own seed
        std::vector<int> group = {id};
        for (int f : r.forks) {
            Request& c = requests_.at(f);
            c.seq = cache_.fork(r.seq);
            c.computed = r.computed;
            c.forked_from = -1;
            insert_sorted(running_, f);
            group.push_back(f);
            ++stats_.forks;
        }
        r.forks.clear();
        for (int member : group) {
            Request& m = requests_.at(member);
            row.assign(l, l + V);
            const int token = sample_token(row, m.options, m.generated, m.rng);
            std::optional<TokenLogprobs> logprobs;
            if (m.options.top_logprobs >= 0)
                logprobs = token_logprobs(log_softmax(row), token, m.options.top_logprobs);
            m.tokens.push_back(token);
            m.generated.push_back(token);
            const bool done = static_cast<int>(m.generated.size()) >= m.options.max_new_tokens;
            events.push_back({member, token, done, std::move(logprobs)});
            if (done) finish(member);
        }
    }
    return events;
}

}  // namespace attn
