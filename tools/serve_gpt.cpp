// serve_gpt: serves a trained GPT to many clients at once over HTTP, with the paged cache
// and continuous batching of lesson 20.
//
//   serve_gpt out                       a train_gpt run folder (or a weights directory)
//   serve_gpt out --port 0              any free port; the URL line says which
//   serve_gpt out --device gpu          every step on the GPU (the URL line names the device)
//
//   curl -s localhost:8000/v1/completions -d '{"prompt": "ROMEO:", "max_tokens": 40}'
//   curl -sN localhost:8000/v1/completions -d '{"prompt": "ROMEO:", "stream": true}'
//   curl -s localhost:8000/v1/chat/completions -d '{"messages": [{"role": "user", "content": "Hi"}]}'
//   curl -s localhost:8000/v1/models
//   curl -s localhost:8000/health        curl -s localhost:8000/metrics
//
// GET /health: {"status": "ok" or "draining", "context": the model's block size,
// "vocabulary": its characters}, 200 while serving, 503 while draining.
//
// The OpenAI API, as the official clients call it (tools/serve/openai.hpp lists every
// field): POST /v1/completions and POST /v1/chat/completions (the chat template writes the
// conversation in the play's speaker style), GET /v1/models and GET /v1/models/{id}. The
// served model's id is --served-model-name; a request naming another gets 404
// model_not_found. A request asks for n samples of each prompt (each prompt computed once
// and forked), top_p, penalties, stop strings, echo, the model's log-probabilities, a seed
// (absent: a fresh one per request). With "stream": true the text comes as server-sent
// events as it is produced (never past a stop string), then the usage when
// stream_options.include_usage, then `data: [DONE]`. A bad request is answered 400 with a
// JSON error naming the field; a full queue 503 with Retry-After; the server goes on.
//
// --device gpu runs each step's forward pass on CUDA device 0 (attn::cuda::PagedEngine): the
// weights uploaded once, the KV cache's blocks in device memory, the attention by the paged
// kernel; the logits come back for sampling, and the scheduler, the block tables, prefix
// caching and everything above them are the CPU's, the same code as with --device cpu. In a
// build configured without a GPU the device is the CUDA simulator, which runs the same device
// code on the CPU to check it: the URL line says so, and its times are not a GPU's.
//
// The HTTP side is one event loop (Boost.Beast over Asio) on one thread, which holds every
// socket; the model runs on the engine's own thread, and the two hand each other work
// through queues, so neither ever waits for the other. The loop sheds load instead of
// queueing it: past --max-connections open connections a new one is answered 503 with
// Retry-After and closed; a request's header must arrive within --header-timeout, its body
// within --body-timeout, and a kept-alive connection with no request is closed after
// --idle-timeout. Every error is the OpenAI error body {"error": {message, type, param,
// code}}. The Host header must name this server (127.0.0.1, localhost, [::1], an address
// or --host, with the port): a web page cannot reach it through a DNS name it controls. A
// request from a web page (an Origin header) is refused unless --allow-origin names that
// origin, which then gets CORS headers and its preflight answered. A client that goes away
// ends its request at once, streamed or not, and its blocks return to the pool.
// SIGINT or SIGTERM drains: new requests get 503, idle connections are closed, the
// accepted requests finish, exit status 0. A second signal stops at once (status 128 + the
// signal's number).
#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/error.hpp"
#include "attn/paged_cache.hpp"
#include "attn/scheduler.hpp"
#if ATTN_HAVE_CUDA
#include "attn/cuda/device.hpp"
#include "attn/cuda/paged_engine.hpp"
#endif

#include "openai.hpp"
#include "tool_main.hpp"

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <pthread.h>
#include <random>
#include <sstream>
#include <string>
#include <sys/resource.h>
#include <thread>
#include <unistd.h>
#include <unordered_map>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;
namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Flags {
    fs::path checkpoint;
    std::string host = "127.0.0.1";
    int port = 8000;
    int blocks = 0;  // 0: room for max_running full contexts
    int block_tokens = 16;
    int max_running = 16;
    int max_waiting = 64;
    int step_tokens = 64;
    std::size_t max_body = 64 * 1024;
    std::size_t max_header = 16 * 1024;
    int step_ms = 0;
    int max_connections = 256;
    double header_timeout = 10.0;  // seconds
    double body_timeout = 10.0;
    double idle_timeout = 5.0;
    std::vector<std::string> allow_origins;
    std::string served_name = "attention-from-scratch";
    std::string device = "cpu";  // cpu or gpu
};

// The step the scheduler calls: forward_paged on the CPU, or the whole step on the GPU
// (attn::cuda::PagedEngine: the weights, the key/value blocks and the attention on the device,
// the logits back for sampling). The CPU cache keeps the block tables either way.
std::unique_ptr<PagedStep> make_step(const GPT& model, PagedKVCache& cache, const std::string& device) {
    if (device == "cpu") return std::make_unique<CpuPagedStep>(model);
#if ATTN_HAVE_CUDA
    std::string why;
    if (!cuda::device_available(&why)) throw std::runtime_error("--device gpu: no usable CUDA device (" + why + ")");
    return std::make_unique<cuda::PagedEngine>(model, cache);
#else
    (void)cache;
    throw std::runtime_error("--device gpu: this build has no CUDA code (neither the CUDA Toolkit "
                             "nor the CUDA simulator was built); serve on the CPU");
#endif
}

using serve::error_body;

// A completion's id: 96 random bits from the system's entropy source (std::random_device,
// /dev/urandom on Linux), so that ids do not repeat across restarts of the server.
std::string completion_id(const char* prefix) {
    static std::random_device entropy;
    static std::mutex m;
    std::lock_guard<std::mutex> lock(m);
    char out[48];
    std::snprintf(out, sizeof out, "%s-%08x%08x%08x", prefix, static_cast<unsigned>(entropy()),
                  static_cast<unsigned>(entropy()), static_cast<unsigned>(entropy()));
    return out;
}

// A latency histogram in Prometheus's form (cumulative buckets, sum, count). The buckets
// reach past the longest wait the server allows (its timeouts, a full queue) so that a
// slow tail is measured, not lumped into +Inf.
struct Histogram {
    static constexpr std::array<const char*, 15> labels = {"0.001", "0.0025", "0.005", "0.01", "0.025",
                                                          "0.05",  "0.1",    "0.25",  "0.5",  "1",
                                                          "2.5",   "5",      "10",    "30",   "60"};
    static constexpr std::array<double, 15> bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                      0.5,   1.0,    2.5,   5.0,  10.0,  30.0, 60.0};
    std::array<long, bounds.size()> counts{};
    double sum = 0.0;
    long count = 0;
    void add(double seconds) {
        for (std::size_t i = 0; i < bounds.size(); ++i) counts[i] += seconds <= bounds[i] ? 1 : 0;
        sum += seconds;
        ++count;
    }
    void write(std::ostream& os, const std::string& name, const std::string& help) const {
        os << "# HELP " << name << " " << help << "\n# TYPE " << name << " histogram\n";
        for (std::size_t i = 0; i < bounds.size(); ++i)
            os << name << "_bucket{le=\"" << labels[i] << "\"} " << counts[i] << "\n";
        os << name << "_bucket{le=\"+Inf\"} " << count << "\n"
           << name << "_sum " << std::setprecision(std::numeric_limits<double>::max_digits10) << sum
           << "\n" << name << "_count " << count << "\n";
    }
};

// What the engine hands a request's connection: the tokens so far, and whether it is done.
// `wake` is the connection's: the engine calls it (holding stream_m) when tokens arrive, at
// most once until the connection has taken them (`wake_pending`).
struct Channel {
    std::string name;  // the completion's id
    std::vector<int> tokens;
    std::vector<std::optional<TokenLogprobs>> logprobs;  // per token, when asked
    bool finished = false, admitted = false, wake_pending = false;
    std::function<void()> wake;
    Clock::time_point submitted, last;
};

// The model, the cache, the scheduler and the thread that steps it. Only that thread touches
// the scheduler and the cache: a connection hands it a task (`post`), which it runs between
// two steps, so a request joins the batch at the next step however busy the server is (the
// continuous batching of lesson 20), and a step never waits for a connection. A task's
// result goes back through its `done`, which the connection gives (it posts the result to
// the event loop). What the steps produce goes to the connections through their channels,
// guarded by `stream_m`, which a step holds only to hand over its tokens.
class Engine {
public:
    Engine(GPT model, CharVocab vocab, const Flags& f)
        : model_(std::move(model)), vocab_(std::move(vocab)),
          cache_(model_.config(), f.blocks, f.block_tokens),
          step_(make_step(model_, cache_, f.device)),
          scheduler_(*step_, cache_, SchedulerOptions{f.max_running, f.max_waiting, f.step_tokens}),
          step_time_(std::chrono::milliseconds(f.step_ms)) {
        model_.train(false);
        device_ = step_->device();
        thread_ = std::thread([this] { loop(); });
    }
    ~Engine() {
        {
            std::lock_guard<std::mutex> lock(inbox_m_);
            stop_ = true;
        }
        work_.notify_all();
        thread_.join();
    }

    // Where the steps run, in one line (set before the engine's thread starts).
    const std::string& device() const { return device_; }

    // Runs f() on the engine's thread between two steps, then done(error, result) there.
    template <class F, class Done>
    void post(F f, Done done) {
        push([f = std::move(f), done = std::move(done)]() mutable {
            std::exception_ptr error;
            decltype(f()) result{};
            try {
                result = f();
            } catch (...) {
                error = std::current_exception();
            }
            done(error, std::move(result));
        });
    }

    // Queues a request's choices, one channel each: each prompt once, forked into its n
    // samples (submissions[p · n] is prompt p's). done gets the ids in choice order, or
    // QueueFull or std::invalid_argument (a bad field), having queued none.
    template <class Done>
    void submit(std::vector<CompletionRequest> submissions, int n, std::vector<std::shared_ptr<Channel>> chs,
                Done done) {
        post([this, submissions = std::move(submissions), n, chs = std::move(chs)] {
                 if (draining_) throw QueueFull("the server is shutting down");
                 std::vector<int> ids;
                 try {
                     for (std::size_t p = 0; p < submissions.size(); p += static_cast<std::size_t>(n)) {
                         const std::vector<int> group = scheduler_.submit(submissions[p], n);
                         ids.insert(ids.end(), group.begin(), group.end());
                     }
                 } catch (...) {
                     for (int id : ids) scheduler_.cancel(id);
                     throw;
                 }
                 std::lock_guard<std::mutex> lock(stream_m);
                 for (std::size_t c = 0; c < ids.size(); ++c) {
                     chs[c]->submitted = chs[c]->last = Clock::now();
                     channels_[ids[c]] = chs[c];
                     ++accepted_;
                 }
                 return ids;
             },
             std::move(done));
    }
    // A choice met a stop string: its sequence ends now, its blocks return to the pool.
    void end_early(int id) {
        push([this, id] {
            scheduler_.cancel(id);
            std::lock_guard<std::mutex> lock(stream_m);
            channels_.erase(id);
        });
    }
    // A client went away: its sequence ends now, its blocks return to the pool.
    void cancel(int id) {
        push([this, id] {
            const bool cancelled = scheduler_.cancel(id);
            std::lock_guard<std::mutex> lock(stream_m);
            if (cancelled) ++disconnects_;
            channels_.erase(id);
        });
    }
    void forget(int id) {
        std::lock_guard<std::mutex> lock(stream_m);
        channels_.erase(id);
    }
    // Refuse new requests from now on; on_idle() (on the engine's thread) once the accepted
    // ones are done.
    void drain(std::function<void()> on_idle) {
        push([this, on_idle = std::move(on_idle)] {
            draining_ = true;
            on_idle_ = on_idle;
        });
    }
    struct State {
        long preemptions = 0, steps = 0;
        int running = 0, waiting = 0, free = 0, total = 0;
        long prefix_queries = 0, prefix_hits = 0, prefix_evictions = 0;  // automatic prefix caching
    };
    template <class Done>
    void state(Done done) {
        post([this] {
                 const SchedulerStats st = scheduler_.stats();
                 return State{st.preemptions, st.steps, scheduler_.running(), scheduler_.waiting(),
                              cache_.free_blocks(), cache_.num_blocks(), st.prefix_cache_queries,
                              st.prefix_cache_hits, st.prefix_cache_evictions};
             },
             std::move(done));
    }
    // The counters and histograms below, in Prometheus's text format.
    void write_metrics(std::ostream& os, const State& s);
    // The pool and every running request's block table, for the playground page.
    template <class Done>
    void blocks(Done done) {
        post([this] {
                 json seqs = json::array();
                 std::lock_guard<std::mutex> lock(stream_m);
                 for (int id : scheduler_.running_requests()) {
                     const int seq = scheduler_.sequence_of(id);
                     auto it = channels_.find(id);
                     seqs.push_back({{"request", it == channels_.end() ? std::to_string(id) : it->second->name},
                                     {"length", cache_.length(seq)},
                                     {"table", cache_.block_table(seq)}});
                 }
                 return json{{"block_tokens", cache_.block_tokens()}, {"num_blocks", cache_.num_blocks()},
                             {"free", cache_.free_blocks()}, {"waiting", scheduler_.waiting()},
                             {"sequences", seqs}};
             },
             std::move(done));
    }
    void count_response(int status) {
        std::lock_guard<std::mutex> lock(stream_m);
        ++responses_[status];
    }

    const GPT& model() const { return model_; }
    const CharVocab& vocab() const { return vocab_; }
    std::mutex stream_m;  // the channels and the counters below

private:
    void push(std::function<void()> task) {
        {
            std::lock_guard<std::mutex> lock(inbox_m_);
            inbox_.push_back(std::move(task));
        }
        work_.notify_all();
    }
    void loop() {
        while (true) {
            if (on_idle_ && scheduler_.idle()) std::exchange(on_idle_, nullptr)();
            std::deque<std::function<void()>> tasks;
            {
                std::unique_lock<std::mutex> lock(inbox_m_);
                work_.wait(lock, [&] { return stop_ || !inbox_.empty() || !scheduler_.idle(); });
                if (stop_) return;
                tasks.swap(inbox_);
            }
            for (auto& task : tasks) task();
            if (scheduler_.idle()) continue;
            const Clock::time_point start = Clock::now();
            const std::vector<StepEvent> events = scheduler_.step();
            // paced (--step-ms): the rest of the step's time asleep
            if (step_time_.count() > 0) std::this_thread::sleep_until(start + step_time_);
            const Clock::time_point now = Clock::now();
            const std::vector<int>& running = scheduler_.running_requests();
            std::lock_guard<std::mutex> lock(stream_m);
            for (auto& [id, ch] : channels_) {  // the queue's wait ends when the batch takes it
                if (ch->admitted || std::find(running.begin(), running.end(), id) == running.end()) continue;
                ch->admitted = true;
                queued_.add(std::chrono::duration<double>(now - ch->submitted).count());
            }
            for (const StepEvent& e : events) {
                ++tokens_;
                auto it = channels_.find(e.request);
                if (it == channels_.end()) continue;
                Channel& ch = *it->second;
                if (!ch.admitted) {  // admitted and finished in one step
                    ch.admitted = true;
                    queued_.add(std::chrono::duration<double>(now - ch.submitted).count());
                }
                const double gap = std::chrono::duration<double>(now - ch.last).count();
                (ch.tokens.empty() ? first_token_ : per_token_).add(gap);
                ch.last = now;
                ch.tokens.push_back(e.token);
                ch.logprobs.push_back(e.logprobs);
                ch.finished = e.finished;
                if (e.finished) end_to_end_.add(std::chrono::duration<double>(now - ch.submitted).count());
                if (!ch.wake_pending && ch.wake) {
                    ch.wake_pending = true;
                    ch.wake();
                }
            }
        }
    }

    GPT model_;
    CharVocab vocab_;
    PagedKVCache cache_;
    std::unique_ptr<PagedStep> step_;  // where the forward passes run
    Scheduler scheduler_;
    std::string device_;
    bool draining_ = false;  // the engine's thread only, as on_idle_
    std::function<void()> on_idle_;
    std::mutex inbox_m_;  // the tasks and stop_
    std::deque<std::function<void()>> inbox_;
    std::condition_variable work_;
    bool stop_ = false;
    std::map<int, std::shared_ptr<Channel>> channels_;
    long accepted_ = 0, tokens_ = 0, disconnects_ = 0;
    std::map<int, long> responses_;
    Histogram first_token_, per_token_, queued_, end_to_end_;
    std::chrono::milliseconds step_time_;
    std::thread thread_;
};

void Engine::write_metrics(std::ostream& os, const State& s) {
    std::lock_guard<std::mutex> lock(stream_m);
    os << "# HELP serve_requests_total Completion requests accepted.\n"
          "# TYPE serve_requests_total counter\nserve_requests_total " << accepted_ << "\n"
       << "# HELP serve_responses_total Responses by HTTP status.\n"
          "# TYPE serve_responses_total counter\n";
    for (const auto& [status, n] : responses_)
        os << "serve_responses_total{code=\"" << status << "\"} " << n << "\n";
    os << "# HELP serve_tokens_total Tokens generated.\n"
          "# TYPE serve_tokens_total counter\nserve_tokens_total " << tokens_ << "\n"
       << "# HELP serve_disconnects_total Requests whose client went away before the end.\n"
          "# TYPE serve_disconnects_total counter\nserve_disconnects_total " << disconnects_ << "\n"
       << "# HELP serve_preemptions_total Sequences sent back to the queue for want of blocks.\n"
          "# TYPE serve_preemptions_total counter\nserve_preemptions_total " << s.preemptions << "\n"
       << "# HELP serve_prefix_cache_queries_total Full prompt blocks looked up in the prefix cache.\n"
          "# TYPE serve_prefix_cache_queries_total counter\nserve_prefix_cache_queries_total " << s.prefix_queries << "\n"
       << "# HELP serve_prefix_cache_hits_total Prompt blocks found in the prefix cache, not computed again.\n"
          "# TYPE serve_prefix_cache_hits_total counter\nserve_prefix_cache_hits_total " << s.prefix_hits << "\n"
       << "# HELP serve_prefix_cache_evictions_total Cached blocks given to other sequences.\n"
          "# TYPE serve_prefix_cache_evictions_total counter\nserve_prefix_cache_evictions_total " << s.prefix_evictions << "\n"
       << "# HELP serve_steps_total Batched forward passes.\n"
          "# TYPE serve_steps_total counter\nserve_steps_total " << s.steps << "\n"
       << "# HELP serve_running_sequences Sequences in the batch.\n"
          "# TYPE serve_running_sequences gauge\nserve_running_sequences " << s.running << "\n"
       << "# HELP serve_waiting_requests Requests in the queue.\n"
          "# TYPE serve_waiting_requests gauge\nserve_waiting_requests " << s.waiting << "\n"
       << "# HELP serve_kv_blocks_free Blocks of the KV cache's pool not in use.\n"
          "# TYPE serve_kv_blocks_free gauge\nserve_kv_blocks_free " << s.free << "\n"
       << "# HELP serve_kv_blocks_capacity Blocks in the KV cache's pool.\n"
          "# TYPE serve_kv_blocks_capacity gauge\nserve_kv_blocks_capacity " << s.total << "\n";
    queued_.write(os, "serve_queue_time_seconds", "From a request's arrival to its place in the batch.");
    first_token_.write(os, "serve_time_to_first_token_seconds",
                       "From a request's arrival to its first token.");
    per_token_.write(os, "serve_time_per_output_token_seconds",
                     "Between two tokens of one request.");
    end_to_end_.write(os, "serve_request_duration_seconds", "From a request's arrival to its last token.");
}

std::string dump(const json& j) {
    // replace: a parse error's message may quote the body's bytes, which need not be UTF-8
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string error_type(int status) {
    return status == 503 ? "server_busy" : status >= 500 ? "server_error" : "invalid_request_error";
}

using Seconds = std::chrono::duration<double>;
Clock::duration timeout(double seconds) {
    return std::chrono::duration_cast<Clock::duration>(Seconds(seconds));
}

// The endpoints and the one method each takes.
struct Route {
    const char* path;
    http::verb method;
};
constexpr std::array<Route, 6> routes = {{{"/health", http::verb::get},
                                          {"/metrics", http::verb::get},
                                          {"/v1/blocks", http::verb::get},
                                          {"/v1/completions", http::verb::post},
                                          {"/v1/chat/completions", http::verb::post},
                                          {"/v1/models", http::verb::get}}};

class Session;

// The listening socket and every open connection, on the event loop's one thread: nothing
// here is touched from another thread.
struct Server {
    Server(net::io_context& io, Engine& e, const Flags& f);
    void accept();
    void begin_drain();
    void maybe_stop();
    void forget(Session* s, bool counted);
    bool host_allowed(const std::string& host, unsigned version) const;
    bool origin_allowed(const std::string& origin) const;
    std::string metrics_extra() const;

    net::io_context& ioc;
    Engine& engine;
    const Flags& flags;
    serve::ServedModel served;  // what /v1/models lists and requests must name
    tcp::acceptor acceptor;
    net::steady_timer accept_retry;
    int port = 0;
    // Owners of the open connections: a session lives until it closes and its last handler
    // has run. `connections` are counted against --max-connections; `rejecting` are being
    // answered 503.
    std::unordered_map<Session*, std::shared_ptr<Session>> sessions;
    int connections = 0, rejecting = 0;
    long rejected_total = 0, timeouts_total = 0;
    int in_flight = 0;  // completions accepted and not yet answered in full
    bool draining = false, engine_idle = false;
};

// One connection: reads a request (its header within --header-timeout, its body within
// --body-timeout), answers it, and waits --idle-timeout for the next. While the engine
// works on its completion it watches the socket, so that a client that leaves ends the
// request at once.
class Session : public std::enable_shared_from_this<Session> {
public:
    Session(tcp::socket socket, Server& server) : stream_(std::move(socket)), server_(server) {}
    void start() { read_request(); }
    // Past --max-connections: 503 at once, then closed.
    void reject() {
        counted_ = false;
        busy_ = true;
        fail(503, "too many open connections (" + std::to_string(server_.flags.max_connections) +
                      "); try again later", "", true, {{"Retry-After", "1"}});
    }
    bool busy() const { return busy_; }
    void close();

private:
    using Extra = std::vector<std::pair<std::string, std::string>>;
    void read_request();
    void read_header();
    void on_header(beast::error_code ec);
    void read_body();
    void on_body(beast::error_code ec);
    void dispatch();
    void completion(const std::string& body, serve::Endpoint endpoint);
    void on_submitted(std::exception_ptr error, std::vector<int> ids);
    std::string collect();
    void on_tokens();
    void pump();
    void write_stream(std::string bytes);
    void respond(int status, std::string body, const char* type, bool close_after, const Extra& extra = {});
    void fail(int status, const std::string& message, const std::string& param, bool close_after,
              const Extra& extra = {}) {
        respond(status, dump(error_body(message, error_type(status), param)) + "\n", "application/json",
                close_after, extra);
    }
    void fail_api(const serve::ApiError& e) {
        respond(e.status, dump(error_body(e)) + "\n", "application/json", false);
    }
    void finish();
    void linger();
    void discard();
    void watch();
    void end_work();
    // runs on the event loop, whatever thread `then` is called on
    template <class F>
    std::function<void()> on_loop(F f) {
        return [w = weak_from_this(), f, &ioc = server_.ioc] {
            net::post(ioc, [w, f] {
                if (auto self = w.lock()) f(*self);
            });
        };
    }

    beast::tcp_stream stream_;
    Server& server_;
    beast::flat_buffer buffer_;
    std::optional<http::request_parser<http::string_body>> parser_;
    std::shared_ptr<http::response<http::string_body>> response_;
    std::string out_;             // bytes being written outside a response object
    bool first_ = true;           // no request read yet
    bool counted_ = true;         // against --max-connections (not a rejected one)
    bool busy_ = false;           // a request in hand
    bool closed_ = false;
    bool keep_alive_ = false;
    std::string cors_origin_;     // the request's Origin, when --allow-origin names it
    std::size_t discarded_ = 0;
    // the completion in hand
    bool working_ = false, streamed_ = false, done_ = false, writing_ = false;
    bool watching_ = false;
    std::function<void()> after_watch_;
    std::shared_ptr<serve::Completion> completion_;
    std::vector<int> ids_;                      // the scheduler's, one per choice
    std::vector<std::shared_ptr<Channel>> chs_;  // one per choice
    std::vector<std::size_t> sent_;              // per choice: tokens given to completion_
};

void Session::read_request() {
    if (closed_) return;
    busy_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(server_.flags.max_header));
    parser_->body_limit(server_.flags.max_body);
    if (first_ || buffer_.size() > 0) {
        read_header();
        return;
    }
    // kept alive: the next request's first bytes must come within the idle timeout
    stream_.expires_after(timeout(server_.flags.idle_timeout));
    stream_.async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, std::size_t n) {
        self->buffer_.commit(n);
        if (ec == beast::error::timeout) ++self->server_.timeouts_total;
        if (ec) return self->close();
        self->read_header();
    });
}

void Session::read_header() {
    stream_.expires_after(timeout(server_.flags.header_timeout));
    http::async_read_header(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
        self->on_header(ec);
    });
}

bool is_http_error(const beast::error_code& ec) {
    return ec.category() == beast::http::make_error_code(http::error::bad_method).category();
}

void Session::on_header(beast::error_code ec) {
    first_ = false;
    busy_ = true;
    if (ec == http::error::header_limit)
        return fail(431, "the request's header is over the limit of " + std::to_string(server_.flags.max_header) +
                             " bytes", "header", true);
    if (ec == http::error::body_limit) {  // the Content-Length is past it (the header is not done)
        const std::string length(parser_->get()[http::field::content_length]);
        return fail(413, "body: " + (length.empty() ? std::string("too long") : length + " bytes") +
                             ", over the limit of " + std::to_string(server_.flags.max_body), "body", true);
    }
    if (ec == beast::error::timeout) ++server_.timeouts_total;
    if (ec == http::error::end_of_stream || ec == http::error::partial_message || !is_http_error(ec)) {
        if (ec) return close();
    } else {
        return fail(400, "not an HTTP/1.1 request: " + ec.message(), "", true);
    }
    if (beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
        out_ = "HTTP/1.1 100 Continue\r\n\r\n";
        stream_.expires_after(timeout(server_.flags.body_timeout));
        net::async_write(stream_, net::buffer(out_), [self = shared_from_this()](beast::error_code e, std::size_t) {
            if (e) return self->close();
            self->read_body();
        });
        return;
    }
    read_body();
}

void Session::read_body() {
    stream_.expires_after(timeout(server_.flags.body_timeout));
    http::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, std::size_t) {
        self->on_body(ec);
    });
}

void Session::on_body(beast::error_code ec) {
    if (ec == http::error::body_limit)
        return fail(413, "body: over the limit of " + std::to_string(server_.flags.max_body) + " bytes", "body",
                    true);
    if (ec == beast::error::timeout) ++server_.timeouts_total;
    if (ec) return close();
    try {
        dispatch();
    } catch (const std::exception& e) {
        end_work();
        fail(500, e.what(), "", true);
    }
}

void Session::dispatch() {
    const auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
    cors_origin_.clear();
    const std::string host(req[http::field::host]);
    if (!server_.host_allowed(host, req.version()))
        return fail(400, "Host: '" + host + "' does not name this server (127.0.0.1, localhost, [::1], an "
                         "address or --host, with port " + std::to_string(server_.port) + ")", "Host", false);
    const std::string origin(req[http::field::origin]);
    if (!origin.empty()) {
        if (!server_.origin_allowed(origin))
            return fail(403, "Origin: '" + origin + "' may not use this server (serve_gpt --allow-origin ORIGIN "
                             "lets one in)", "Origin", false);
        cors_origin_ = origin;
    }
    const std::string target(req.target());
    const std::string path = target.substr(0, target.find('?'));
    // /v1/models/{id} takes what /v1/models takes
    const bool model_path = path.rfind("/v1/models/", 0) == 0 && path.size() > 11;
    const auto route = std::find_if(routes.begin(), routes.end(), [&](const Route& r) {
        return path == r.path || (model_path && std::string(r.path) == "/v1/models");
    });
    if (route == routes.end())
        return fail(404, "no endpoint " + path + " (this server has GET /health, GET /metrics, GET /v1/blocks, "
                         "POST /v1/completions, POST /v1/chat/completions, GET /v1/models and "
                         "GET /v1/models/{id})", "", false);
    const std::string allow = std::string(http::to_string(route->method)) + ", OPTIONS";
    if (req.method() == http::verb::options) {
        Extra extra = {{"Allow", allow}};
        if (!cors_origin_.empty()) {
            extra.emplace_back("Access-Control-Allow-Methods", allow);
            extra.emplace_back("Access-Control-Allow-Headers", "Content-Type");
            extra.emplace_back("Access-Control-Max-Age", "600");
        }
        return respond(204, "", nullptr, false, extra);
    }
    if (req.method() != route->method)
        return fail(405, std::string(req.method_string()) + " " + path + ": this endpoint takes " +
                             std::string(http::to_string(route->method)), "", false, {{"Allow", allow}});
    if (path == "/health") {
        // the model's context and characters: what a client (tools/load_gpt) may send
        const json body = {{"status", server_.draining ? "draining" : "ok"},
                           {"context", server_.engine.model().config().block_size},
                           {"vocabulary", server_.engine.vocab().chars()}};
        return respond(server_.draining ? 503 : 200, dump(body) + "\n", "application/json", false);
    }
    if (path == "/metrics") {
        server_.engine.state([w = weak_from_this(), &ioc = server_.ioc](std::exception_ptr, Engine::State st) {
            net::post(ioc, [w, st] {
                auto self = w.lock();
                if (!self || self->closed_) return;
                std::ostringstream os;
                self->server_.engine.write_metrics(os, st);
                os << self->server_.metrics_extra();
                self->respond(200, os.str(), "text/plain; version=0.0.4", false);
            });
        });
        return;
    }
    if (path == "/v1/blocks") {
        server_.engine.blocks([w = weak_from_this(), &ioc = server_.ioc](std::exception_ptr error, json state) {
            net::post(ioc, [w, error, state = std::move(state)] {
                auto self = w.lock();
                if (!self || self->closed_) return;
                if (error) return self->fail(500, "the engine failed to list its blocks", "", true);
                self->respond(200, state.dump() + "\n", "application/json", false);
            });
        });
        return;
    }
    if (path == "/v1/models") return respond(200, dump(serve::model_list(server_.served)) + "\n", "application/json", false);
    if (model_path) {
        try {
            return respond(200, dump(serve::retrieve_model(server_.served, path.substr(11))) + "\n",
                           "application/json", false);
        } catch (const serve::ApiError& e) {
            return fail_api(e);
        }
    }
    completion(req.body(), path == "/v1/chat/completions" ? serve::Endpoint::chat : serve::Endpoint::completions);
}

void Session::completion(const std::string& body, serve::Endpoint endpoint) {
    if (server_.draining) return fail(503, "the server is shutting down", "", true, {{"Retry-After", "1"}});
    std::shared_ptr<serve::Completion> completion;
    const std::string name = completion_id(endpoint == serve::Endpoint::chat ? "chatcmpl" : "cmpl");
    try {
        const serve::Request r = endpoint == serve::Endpoint::chat ? serve::parse_chat(body, server_.served)
                                                                   : serve::parse_completions(body, server_.served);
        const auto created = std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::system_clock::now().time_since_epoch()).count();
        completion = std::make_shared<serve::Completion>(
            r, server_.served, name, created);
    } catch (const serve::ApiError& e) {
        return fail_api(e);
    }
    working_ = true;
    ++server_.in_flight;
    streamed_ = completion->streaming();
    done_ = writing_ = false;
    completion_ = completion;
    ids_.clear();
    chs_.clear();
    sent_.assign(static_cast<std::size_t>(completion->choices()), 0);
    for (int c = 0; c < completion->choices(); ++c) {
        auto ch = std::make_shared<Channel>();
        ch->name = name;
        ch->wake = on_loop([](Session& s) { s.on_tokens(); });
        chs_.push_back(std::move(ch));
    }
    watch();
    server_.engine.submit(completion->submissions(), completion->samples(), chs_,
                          [w = weak_from_this(), &ioc = server_.ioc, &engine = server_.engine](
                              std::exception_ptr error, std::vector<int> ids) {
                              net::post(ioc, [w, error, ids = std::move(ids), &engine] {
                                  auto self = w.lock();
                                  if (self) return self->on_submitted(error, ids);
                                  if (!error)
                                      for (int id : ids) engine.cancel(id);  // the client left meanwhile
                              });
                          });
}

void Session::on_submitted(std::exception_ptr error, std::vector<int> ids) {
    if (error) {
        end_work();
        if (closed_) return;
        try {
            std::rethrow_exception(error);
        } catch (const QueueFull& e) {
            return fail(503, e.what(), "", false, {{"Retry-After", "1"}});
        } catch (const std::invalid_argument& e) {
            // the scheduler's own checks name the field first: "max_tokens: …"
            const std::string what = e.what();
            return fail(400, what, what.substr(0, what.find(':')), false);
        } catch (const std::exception& e) {
            return fail(500, e.what(), "", true);
        }
    }
    ids_ = std::move(ids);
    if (closed_) {
        for (int id : ids_) server_.engine.cancel(id);
        return;
    }
    if (!streamed_) return on_tokens();  // the answer comes whole, when every choice has ended
    // Server-sent events as the text comes, then [DONE], in a chunked body.
    const bool keep = keep_alive_ && !server_.draining;
    std::string head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                       "Transfer-Encoding: chunked\r\n";
    if (!cors_origin_.empty()) head += "Access-Control-Allow-Origin: " + cors_origin_ + "\r\nVary: Origin\r\n";
    if (!keep) head += "Connection: close\r\n";
    keep_alive_ = keep;
    server_.engine.count_response(200);
    write_stream(head + "\r\n");
}

// Gives every choice's new tokens to the completion; returns the events they make (none
// when not streamed). A choice that met a stop string has its sequence ended at once.
std::string Session::collect() {
    std::string events;
    for (std::size_t c = 0; c < chs_.size(); ++c) {
        if (completion_->finished(static_cast<int>(c))) continue;
        Channel& ch = *chs_[c];
        std::vector<int> tokens;
        std::vector<std::optional<TokenLogprobs>> logprobs;
        bool finished = false;
        {
            std::lock_guard<std::mutex> lock(server_.engine.stream_m);
            ch.wake_pending = false;
            tokens.assign(ch.tokens.begin() + static_cast<long>(sent_[c]), ch.tokens.end());
            logprobs.assign(ch.logprobs.begin() + static_cast<long>(sent_[c]), ch.logprobs.end());
            finished = ch.finished;
        }
        for (std::size_t i = 0; i < tokens.size() && !completion_->finished(static_cast<int>(c)); ++i) {
            events += completion_->add(static_cast<int>(c), tokens[i], logprobs[i], finished && i + 1 == tokens.size());
            ++sent_[c];
        }
        if (!completion_->finished(static_cast<int>(c))) continue;
        if (finished)
            server_.engine.forget(ids_[c]);
        else
            server_.engine.end_early(ids_[c]);  // a stop string: the rest is not wanted
    }
    return events;
}

void Session::on_tokens() {
    if (closed_ || ids_.empty() || done_ || !completion_) return;
    if (streamed_) return pump();
    collect();
    if (!completion_->finished()) return;
    done_ = true;
    respond(200, dump(completion_->body()) + "\n", "application/json", false);
}

void append_chunk(std::string& out, const std::string& data) {
    char size[24];  // 16 hex digits at most, and the line's end
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    out += size;
    out += data;
    out += "\r\n";
}

// Writes what the engine has produced since the last write; a write that fails (the client
// went away) closes the connection, which ends the request and frees its blocks.
void Session::pump() {
    if (writing_ || closed_ || done_) return;
    const std::string events = collect();
    const bool finished = completion_->finished();
    if (events.empty() && !finished) return;  // still waiting (in the queue, or behind a stop string's start)
    std::string out;
    if (!events.empty()) append_chunk(out, events);
    if (finished) {
        append_chunk(out, completion_->stream_end());
        out += "0\r\n\r\n";
        done_ = true;
    }
    write_stream(std::move(out));
}

void Session::write_stream(std::string bytes) {
    out_ = std::move(bytes);
    writing_ = true;
    stream_.expires_after(timeout(server_.flags.body_timeout));
    net::async_write(stream_, net::buffer(out_), [self = shared_from_this()](beast::error_code ec, std::size_t) {
        self->writing_ = false;
        if (ec) return self->close();
        if (!self->done_) return self->pump();
        if (self->keep_alive_) return self->finish();
        self->linger();
    });
}

void Session::respond(int status, std::string body, const char* type, bool close_after, const Extra& extra) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(status), 11);
    if (type) res->set(http::field::content_type, type);
    if (!cors_origin_.empty()) {
        res->set(http::field::access_control_allow_origin, cors_origin_);
        res->set(http::field::vary, "Origin");
    }
    for (const auto& [name, value] : extra) res->set(name, value);
    res->body() = std::move(body);
    const bool keep = !close_after && keep_alive_ && !server_.draining;
    res->keep_alive(keep);
    res->prepare_payload();
    server_.engine.count_response(status);
    response_ = res;
    stream_.expires_after(timeout(server_.flags.body_timeout));
    http::async_write(stream_, *response_, [self = shared_from_this(), keep](beast::error_code ec, std::size_t) {
        self->response_.reset();
        if (ec) return self->close();
        if (keep) return self->finish();
        self->linger();
    });
}

// The answer is out: the next request, once the watch on the socket has stopped.
void Session::finish() {
    end_work();
    if (watching_) {
        after_watch_ = [this] { read_request(); };
        beast::error_code ignored;
        stream_.socket().cancel(ignored);
        return;
    }
    read_request();
}

// Closing after an answer: the sending side first, then what the client still sends (a body
// refused as too long, say) is read and dropped, up to 64 times --max-body and within
// --body-timeout, so that the kernel does not reset the connection over unread bytes and
// lose the answer before the client has read it.
void Session::linger() {
    end_work();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    if (watching_) {
        after_watch_ = [this] { discard(); };
        stream_.socket().cancel(ignored);
        return;
    }
    discard();
}

void Session::discard() {
    if (closed_) return;
    if (discarded_ == 0) stream_.expires_after(timeout(server_.flags.body_timeout));  // for all of it
    buffer_.consume(buffer_.size());
    stream_.async_read_some(buffer_.prepare(64 * 1024), [self = shared_from_this()](beast::error_code ec,
                                                                                     std::size_t n) {
        self->discarded_ += n + 1;  // + 1: nonzero from the first read on
        if (ec || self->discarded_ > 64 * self->server_.flags.max_body) return self->close();
        self->discard();
    });
}

// While the engine works, a read on the socket: the end of the stream (or an error) means
// the client has gone. Bytes of a next request are kept for it, and end the watch.
void Session::watch() {
    watching_ = true;
    stream_.socket().async_read_some(buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec,
                                                                                        std::size_t n) {
        self->watching_ = false;
        self->buffer_.commit(n);
        if (self->after_watch_) return std::exchange(self->after_watch_, nullptr)();
        if (ec && ec != net::error::operation_aborted) self->close();
    });
}

void Session::end_work() {
    if (!working_) return;
    working_ = false;
    --server_.in_flight;
    server_.maybe_stop();
}

void Session::close() {
    if (closed_) return;
    auto self = shared_from_this();  // the server's reference goes below
    closed_ = true;
    if (working_ && !done_ && completion_)  // the client left mid-request
        for (std::size_t c = 0; c < ids_.size(); ++c)
            if (!completion_->finished(static_cast<int>(c))) server_.engine.cancel(ids_[c]);
    end_work();
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
    server_.forget(this, counted_);
}

Server::Server(net::io_context& io, Engine& e, const Flags& f)
    : ioc(io), engine(e), flags(f),
      served{f.served_name, e.vocab(), e.model().config().block_size,
             std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                 .count()},
      acceptor(io), accept_retry(io) {
    beast::error_code ec;
    const std::string where = "cannot listen on " + f.host + ":" + std::to_string(f.port);
    tcp::resolver resolver(io);
    const auto found = resolver.resolve(f.host, std::to_string(f.port), tcp::resolver::passive, ec);
    if (ec || found.empty()) throw std::runtime_error(where + " (" + ec.message() + ")");
    const tcp::endpoint at = found.begin()->endpoint();
    acceptor.open(at.protocol(), ec);
    // SO_REUSEADDR only: a restart may bind while old connections linger in TIME_WAIT, and
    // a second server on the port is refused (SO_REUSEPORT would let both in, each getting
    // part of the connections)
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(at, ec);
    if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
    if (ec) throw std::runtime_error(where + " (in use? --port 0 takes any free port)");
    port = acceptor.local_endpoint().port();
}

void Server::accept() {
    acceptor.async_accept([this](beast::error_code ec, tcp::socket socket) {
        if (!acceptor.is_open()) return;
        if (ec) {  // out of file descriptors, or the like: try again shortly
            accept_retry.expires_after(std::chrono::milliseconds(50));
            accept_retry.async_wait([this](beast::error_code e) {
                if (!e) accept();
            });
            return;
        }
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        auto session = std::make_shared<Session>(std::move(socket), *this);
        if (connections < flags.max_connections) {
            ++connections;
            sessions[session.get()] = session;
            session->start();
        } else {
            ++rejected_total;
            if (rejecting < flags.max_connections) {  // else closed at once, unanswered
                ++rejecting;
                sessions[session.get()] = session;
                session->reject();
            }
        }
        accept();
    });
}

void Server::forget(Session* s, bool counted) {
    --(counted ? connections : rejecting);
    sessions.erase(s);
}

// Refuse new requests, close the connections that wait for one (idle, or sending a header
// slowly), and stop once the engine and the accepted requests are done.
void Server::begin_drain() {
    draining = true;
    std::vector<std::shared_ptr<Session>> idle;
    for (const auto& [p, s] : sessions)
        if (!s->busy()) idle.push_back(s);
    for (const auto& s : idle) s->close();
    engine.drain([this] {
        net::post(ioc, [this] {
            engine_idle = true;
            maybe_stop();
        });
    });
}

void Server::maybe_stop() {
    if (!draining || !engine_idle || in_flight > 0) return;
    beast::error_code ignored;
    acceptor.close(ignored);
    ioc.stop();
}

// An IP address in a Host header cannot be rebound by a DNS name; a name must be one of
// this server's.
bool Server::host_allowed(const std::string& host, unsigned version) const {
    if (host.empty()) return version < 11;  // HTTP/1.0 may leave it out
    std::string h = host;
    std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::string name = h, with_port;
    const std::size_t colon = h.rfind(':');
    if (colon != std::string::npos && h.find(']', colon) == std::string::npos) {
        name = h.substr(0, colon);
        with_port = h.substr(colon + 1);
    }
    if (with_port.empty() ? port != 80 : with_port != std::to_string(port)) return false;
    if (name == "localhost") return true;
    std::string flag = flags.host;
    std::transform(flag.begin(), flag.end(), flag.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (name == flag || name == "[" + flag + "]") return true;
    std::string literal = name;
    if (literal.size() > 2 && literal.front() == '[' && literal.back() == ']') literal = literal.substr(1, literal.size() - 2);
    else if (literal.find(':') != std::string::npos) return false;  // IPv6 only in brackets
    beast::error_code ec;
    net::ip::make_address(literal, ec);
    return !ec;
}

bool Server::origin_allowed(const std::string& origin) const {
    return std::find(flags.allow_origins.begin(), flags.allow_origins.end(), origin) != flags.allow_origins.end();
}

std::string Server::metrics_extra() const {
    std::ostringstream os;
    os << "# HELP serve_open_connections Connections open, at most --max-connections.\n"
          "# TYPE serve_open_connections gauge\nserve_open_connections " << connections << "\n"
       << "# HELP serve_rejected_connections_total Connections answered 503 because --max-connections were open.\n"
          "# TYPE serve_rejected_connections_total counter\nserve_rejected_connections_total " << rejected_total << "\n"
       << "# HELP serve_timeouts_total Connections closed for a header, body or idle timeout.\n"
          "# TYPE serve_timeouts_total counter\nserve_timeouts_total " << timeouts_total << "\n";
    return os.str();
}

int run(const Flags& f) {
    CheckpointInfo info;
    const fs::path weights = weights_dir_of(f.checkpoint);
    GPT model = load_checkpoint(weights, &info);
    const GPTConfig& cfg = model.config();
    if (info.vocab.empty())
        throw std::runtime_error(weights.string() + ": the checkpoint records no vocabulary, so "
                                                    "text cannot be turned into tokens");
    require(cfg.causal && cfg.scaled_attention,
            weights.string() + ": the model must be causal with scaled attention to be served "
                               "with a cache");
    CharVocab vocab = CharVocab::from_chars(info.vocab);
    Flags g = f;
    const int per_context = (cfg.block_size + f.block_tokens - 1) / f.block_tokens;
    if (g.blocks == 0) g.blocks = g.max_running * per_context;

    // Each connection is a file descriptor, and so is each rejected one while it is
    // answered: the soft limit goes up to the hard one, and must leave room for both.
    rlimit files{};
    getrlimit(RLIMIT_NOFILE, &files);
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
    getrlimit(RLIMIT_NOFILE, &files);
    const rlim_t needed = 2 * static_cast<rlim_t>(g.max_connections) + 64;
    if (files.rlim_cur != RLIM_INFINITY && files.rlim_cur < needed)
        throw std::runtime_error("--max-connections " + std::to_string(g.max_connections) + " needs " +
                                 std::to_string(needed) + " file descriptors; this process may open " +
                                 std::to_string(files.rlim_cur) + " (ulimit -n)");

    // SIGINT and SIGTERM are taken by one thread (sigwait), not by a handler: blocked here,
    // before any thread starts, so that every thread inherits the mask.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not a signal

    net::io_context ioc{1};  // the event loop: this thread alone runs it
    Engine engine(std::move(model), std::move(vocab), g);
    Server server(ioc, engine, g);
    std::printf("serving %s (%d layers, %d heads, C %d, context %d) at http://%s:%d/ on %s\n",
                weights.string().c_str(), cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size,
                f.host.c_str(), server.port, engine.device().c_str());
    std::printf("KV cache: %d blocks of %d positions (%.1f MiB); up to %d sequences at once, %d waiting, "
                "%d connections; Ctrl-C drains and stops\n",
                g.blocks, g.block_tokens,
                static_cast<double>(PagedKVCache(cfg, 1, g.block_tokens).bytes_per_block()) * g.blocks / (1 << 20),
                g.max_running, g.max_waiting, g.max_connections);
    std::fflush(stdout);

    std::thread([&ioc, &server, stop_signals] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        std::printf("%s: draining (new requests get 503), then stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        std::fflush(stdout);
        net::post(ioc, [&server] { server.begin_drain(); });
        sigwait(&stop_signals, &sig);
        std::fprintf(stderr, "serve_gpt: a second %s: stopping now, the requests in flight cut off\n",
                     sig == SIGINT ? "SIGINT" : "SIGTERM");
        std::fflush(stderr);
        _exit(128 + sig);
    }).detach();

    server.accept();
    while (true) {
        try {
            ioc.run();
            break;
        } catch (const std::exception& e) {  // one connection's failure; the others go on
            std::fprintf(stderr, "serve_gpt: %s\n", e.what());
        }
    }
    std::printf("stopped: every accepted request was answered\n");
    std::fflush(stdout);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Flags f;
    CLI::App app{"Serves a trained GPT over HTTP to many clients at once (a paged KV cache, "
                 "continuous batching), on one event loop that sheds load with 503."};
    app.add_option("checkpoint", f.checkpoint, "a train_gpt run folder, or a weights directory")->required();
    app.add_option("--host", f.host, "the address to listen on (127.0.0.1: this machine only)")->capture_default_str();
    app.add_option("--port", f.port, "the port (0: any free one)")->capture_default_str()->check(CLI::Range(0, 65535));
    app.add_option("--blocks", f.blocks, "blocks in the KV cache's pool (0: room for --max-running full contexts)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--block-tokens", f.block_tokens, "positions per block")->capture_default_str()->check(CLI::Range(1, 4096));
    app.add_option("--max-running", f.max_running, "sequences decoded together")->capture_default_str()->check(CLI::Range(1, 4096));
    app.add_option("--max-waiting", f.max_waiting, "requests queued beyond them (more get 503)")->capture_default_str()
        ->check(CLI::Range(0, 4096));
    app.add_option("--step-ms", f.step_ms, "make each step take at least this long, so that a person "
                                           "can watch the batch and the blocks (0: as fast as it goes)")
        ->check(CLI::Range(0, 10000));
    app.add_option("--step-tokens", f.step_tokens, "rows of one forward pass (at least --max-running)")->capture_default_str()
        ->check(CLI::Range(1, 65536));
    app.add_option("--max-connections", f.max_connections,
                   "open connections; past them a new one is answered 503 with Retry-After and closed")->capture_default_str()
        ->check(CLI::Range(1, 1000000));
    app.add_option("--header-timeout", f.header_timeout,
                   "seconds a request's whole header may take to arrive (then the connection is closed)")->capture_default_str()
        ->check(CLI::Range(0.001, 3600.0));
    app.add_option("--body-timeout", f.body_timeout,
                   "seconds a request's body, or one write of an answer, may take")->capture_default_str()
        ->check(CLI::Range(0.001, 3600.0));
    app.add_option("--idle-timeout", f.idle_timeout,
                   "seconds a kept-alive connection may wait for its next request")->capture_default_str()
        ->check(CLI::Range(0.001, 3600.0));
    app.add_option("--allow-origin", f.allow_origins,
                   "a web page's origin that may call the server (CORS), e.g. http://127.0.0.1:8080, or "
                   "null for a page opened from a file (file:// where the browser was started with "
                   "--allow-file-access-from-files); repeatable (none: requests with an Origin get 403)")
        ->expected(1)
        ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
        ->check([](const std::string& origin) { return origin.empty() ? std::string("an empty origin") : std::string(); });
    app.add_option("--served-model-name", f.served_name,
                   "the model's id in /v1/models, which a request's \"model\" must name (or leave out)")
        ->capture_default_str();
    app.add_option("--device", f.device,
                   "cpu (the default), or gpu: every step on CUDA device 0 (the weights, the KV cache's "
                   "blocks, the attention; the logits come back for sampling). In a build configured "
                   "without a GPU, gpu is the CUDA simulator, which runs the device code on the CPU to "
                   "check it (slowly: its times are not a GPU's)")
        ->capture_default_str()
        ->check(CLI::IsMember({"cpu", "gpu"}));
    const auto check = [&] {
        if (f.step_tokens < f.max_running)
            throw CLI::ValidationError("--step-tokens", "must be at least --max-running (" +
                                                            std::to_string(f.max_running) + ")");
    };
    return attn_tools::tool_main("serve_gpt", app, argc, argv, check, [&] { return run(f); });
}
