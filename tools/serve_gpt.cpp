// serve_gpt: serves a trained GPT to many clients at once over HTTP, with the paged cache
// and continuous batching of lesson 20.
//
//   serve_gpt out                       a train_gpt run folder (or a weights directory)
//   serve_gpt out --port 0              any free port; the URL line says which
//
//   curl -s localhost:8000/v1/completions -d '{"prompt": "ROMEO:", "max_tokens": 40}'
//   curl -sN localhost:8000/v1/completions -d '{"prompt": "ROMEO:", "stream": true}'
//   curl -s localhost:8000/health        curl -s localhost:8000/metrics
//
// GET /health: {"status": "ok" or "draining", "context": the model's block size,
// "vocabulary": its characters}, 200 while serving, 503 while draining.
//
// POST /v1/completions takes the fields of the OpenAI-style completions endpoint that apply
// to a character model: prompt, max_tokens, temperature (0: greedy), top_k, seed, stream,
// and model (any name; there is one). With "stream": true the tokens come as server-sent
// events, one character each, then `data: [DONE]`. A bad request is answered 400 with a
// JSON error naming the field; a full queue 503 with Retry-After; the server goes on.
// SIGINT or SIGTERM drains: new requests get 503, the accepted ones finish, exit status 0.
#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/error.hpp"
#include "attn/paged_cache.hpp"
#include "attn/scheduler.hpp"

#include "tool_main.hpp"

#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <deque>
#include <functional>
#include <future>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;
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
    int step_ms = 0;
};

// An answer the client gets for a request it should change: the OpenAI error body, with
// the field it is about (`param`).
struct BadRequest : std::runtime_error {
    BadRequest(std::string field, const std::string& message)
        : std::runtime_error(message), param(std::move(field)) {}
    std::string param;
};

json error_body(const std::string& message, const std::string& type, const std::string& param) {
    return {{"error", {{"message", message}, {"type", type},
                       {"param", param.empty() ? json(nullptr) : json(param)}, {"code", nullptr}}}};
}

// A latency histogram in Prometheus's form (cumulative buckets, sum, count).
struct Histogram {
    static constexpr std::array<double, 10> bounds = {0.001, 0.0025, 0.005, 0.01, 0.025,
                                                      0.05,  0.1,    0.25,  0.5,  1.0};
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
            os << name << "_bucket{le=\"" << bounds[i] << "\"} " << counts[i] << "\n";
        os << name << "_bucket{le=\"+Inf\"} " << count << "\n"
           << name << "_sum " << sum << "\n" << name << "_count " << count << "\n";
    }
};

// What the engine hands a request's handler: the tokens so far, and whether it is done.
struct Channel {
    std::condition_variable cv;
    std::vector<int> tokens;
    bool finished = false;
    Clock::time_point submitted, last;
};

// The model, the cache, the scheduler and the thread that steps it. Only that thread touches
// the scheduler and the cache: a handler hands it a task (`call`), which it runs between two
// steps, so a request joins the batch at the next step however busy the server is (the
// continuous batching of lesson 20), and a step never waits for a handler. What the steps
// produce goes to the handlers through their channels, guarded by `stream_m`, which a step
// holds only to hand over its tokens.
class Engine {
public:
    Engine(GPT model, CharVocab vocab, const Flags& f)
        : model_(std::move(model)), vocab_(std::move(vocab)),
          cache_(model_.config(), f.blocks, f.block_tokens),
          scheduler_(model_, cache_, SchedulerOptions{f.max_running, f.max_waiting, f.step_tokens}),
          step_time_(std::chrono::milliseconds(f.step_ms)) {
        model_.train(false);
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

    // Runs f() on the engine's thread between two steps and returns its result (or throws
    // what it threw).
    template <class F>
    auto call(F f) -> decltype(f()) {
        auto task = std::make_shared<std::packaged_task<decltype(f())()>>(std::move(f));
        auto result = task->get_future();
        {
            std::lock_guard<std::mutex> lock(inbox_m_);
            inbox_.push_back([task] { (*task)(); });
        }
        work_.notify_all();
        return result.get();
    }

    // Queues a parsed request; throws std::invalid_argument (a bad field) or QueueFull.
    std::pair<int, std::shared_ptr<Channel>> submit(const CompletionRequest& r) {
        return call([&] {
            if (draining_) throw QueueFull("the server is shutting down");
            const int id = scheduler_.submit(r);
            auto ch = std::make_shared<Channel>();
            ch->submitted = ch->last = Clock::now();
            std::lock_guard<std::mutex> lock(stream_m);
            channels_[id] = ch;
            ++accepted_;
            return std::make_pair(id, ch);
        });
    }
    // A client went away: its sequence ends now, its blocks return to the pool.
    void cancel(int id) {
        call([&] {
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
    // Refuse new requests from now on, and wait until the accepted ones are done.
    void drain() {
        call([&] {
            draining_ = true;
            std::lock_guard<std::mutex> lock(inbox_m_);
            idle_ = scheduler_.idle();  // not the value from before this step's submissions
        });
        std::unique_lock<std::mutex> lock(inbox_m_);
        idle_cv_.wait(lock, [&] { return idle_; });
    }
    bool draining() {
        return call([&] { return draining_; });
    }
    std::string metrics();
    // The pool and every running request's block table, for the playground page.
    json blocks() {
        return call([&] {
            json seqs = json::array();
            for (int id : scheduler_.running_requests()) {
                const int seq = scheduler_.sequence_of(id);
                seqs.push_back({{"request", "cmpl-" + std::to_string(id)},
                                {"length", cache_.length(seq)},
                                {"table", cache_.block_table(seq)}});
            }
            return json{{"block_tokens", cache_.block_tokens()}, {"num_blocks", cache_.num_blocks()},
                        {"free", cache_.free_blocks()}, {"waiting", scheduler_.waiting()},
                        {"sequences", seqs}};
        });
    }
    void count_response(int status) {
        std::lock_guard<std::mutex> lock(stream_m);
        ++responses_[status];
    }

    const GPT& model() const { return model_; }
    const CharVocab& vocab() const { return vocab_; }
    std::mutex stream_m;  // the channels and the counters below

private:
    void loop() {
        while (true) {
            std::deque<std::function<void()>> tasks;
            {
                std::unique_lock<std::mutex> lock(inbox_m_);
                idle_ = scheduler_.idle();
                if (idle_) idle_cv_.notify_all();
                work_.wait(lock, [&] { return stop_ || !inbox_.empty() || !idle_; });
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
            std::lock_guard<std::mutex> lock(stream_m);
            for (const StepEvent& e : events) {
                ++tokens_;
                auto it = channels_.find(e.request);
                if (it == channels_.end()) continue;
                Channel& ch = *it->second;
                const double gap = std::chrono::duration<double>(now - ch.last).count();
                (ch.tokens.empty() ? first_token_ : per_token_).add(gap);
                ch.last = now;
                ch.tokens.push_back(e.token);
                ch.finished = e.finished;
                ch.cv.notify_all();
            }
        }
    }

    GPT model_;
    CharVocab vocab_;
    PagedKVCache cache_;
    Scheduler scheduler_;
    bool draining_ = false;  // the engine's thread only
    std::mutex inbox_m_;     // the tasks, stop_ and idle_
    std::deque<std::function<void()>> inbox_;
    std::condition_variable work_, idle_cv_;
    bool stop_ = false, idle_ = true;
    std::map<int, std::shared_ptr<Channel>> channels_;
    long accepted_ = 0, tokens_ = 0, disconnects_ = 0;
    std::map<int, long> responses_;
    Histogram first_token_, per_token_;
    std::chrono::milliseconds step_time_;
    std::thread thread_;
};

std::string Engine::metrics() {
    struct State {
        long preemptions, steps;
        int running, waiting, free, total;
    };
    const State s = call([&] {
        return State{scheduler_.stats().preemptions, scheduler_.stats().steps, scheduler_.running(),
                     scheduler_.waiting(), cache_.free_blocks(), cache_.num_blocks()};
    });
    std::lock_guard<std::mutex> lock(stream_m);
    std::ostringstream os;
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
       << "# HELP serve_steps_total Batched forward passes.\n"
          "# TYPE serve_steps_total counter\nserve_steps_total " << s.steps << "\n"
       << "# HELP serve_running_sequences Sequences in the batch.\n"
          "# TYPE serve_running_sequences gauge\nserve_running_sequences " << s.running << "\n"
       << "# HELP serve_waiting_requests Requests in the queue.\n"
          "# TYPE serve_waiting_requests gauge\nserve_waiting_requests " << s.waiting << "\n"
       << "# HELP serve_kv_blocks_free Blocks of the KV cache's pool not in use.\n"
          "# TYPE serve_kv_blocks_free gauge\nserve_kv_blocks_free " << s.free << "\n"
       << "# HELP serve_kv_blocks_total Blocks in the KV cache's pool.\n"
          "# TYPE serve_kv_blocks_total gauge\nserve_kv_blocks_total " << s.total << "\n";
    first_token_.write(os, "serve_time_to_first_token_seconds",
                       "From a request's arrival to its first token.");
    per_token_.write(os, "serve_time_per_output_token_seconds",
                     "Between two tokens of one request.");
    return os.str();
}

// The request's JSON, checked field by field against the model.
struct Parsed {
    CompletionRequest request;
    std::string prompt;
    bool stream = false;
};

Parsed parse_completion(const std::string& body, const GPT& model, const CharVocab& vocab) {
    json j;
    try {
        j = json::parse(body);
    } catch (const json::parse_error& e) {
        throw BadRequest("", std::string("the body is not valid JSON: ") + e.what());
    }
    if (!j.is_object()) throw BadRequest("", "the body must be a JSON object");
    const GPTConfig& cfg = model.config();
    Parsed p;
    SampleOptions& o = p.request.options;
    o.max_new_tokens = 16;  // OpenAI's default
    o.seed = 1337;
    for (const auto& [key, value] : j.items()) {
        if (key == "prompt") {
            if (!value.is_string()) throw BadRequest(key, "prompt: must be a string");
            p.prompt = value.get<std::string>();
        } else if (key == "max_tokens") {
            if (!value.is_number_integer() || value.get<long long>() < 1)
                throw BadRequest(key, "max_tokens: must be a whole number ≥ 1");
            if (value.get<long long>() > cfg.block_size)
                throw BadRequest(key, "max_tokens: " + value.dump() + " is past the model's context of " +
                                          std::to_string(cfg.block_size));
            o.max_new_tokens = value.get<int>();
        } else if (key == "temperature") {
            if (!value.is_number() || !(value.get<double>() >= 0.0) || value.get<double>() > 100.0)
                throw BadRequest(key, "temperature: must be a number in [0, 100] (0: greedy)");
            const double t = value.get<double>();
            if (t == 0.0) {
                o.top_k = 1;  // greedy: the most likely token every time
                o.temperature = 1.0f;
            } else {
                o.temperature = static_cast<float>(t);
            }
        } else if (key == "top_k") {
            if (!value.is_number_integer() || value.get<long long>() < 0 ||
                value.get<long long>() > cfg.vocab_size)
                throw BadRequest(key, "top_k: must be a whole number in [0, " +
                                          std::to_string(cfg.vocab_size) + "] (0: all)");
            if (j.contains("temperature") && j["temperature"].is_number() && j["temperature"] == 0) continue;
            o.top_k = value.get<int>();
        } else if (key == "seed") {
            if (!value.is_number_integer() || value.get<long long>() < 0)
                throw BadRequest(key, "seed: must be a whole number ≥ 0");
            o.seed = value.get<std::uint64_t>();
        } else if (key == "stream") {
            if (!value.is_boolean()) throw BadRequest(key, "stream: must be true or false");
            p.stream = value.get<bool>();
        } else if (key == "model") {
            if (!value.is_string()) throw BadRequest(key, "model: must be a string");
        } else {
            throw BadRequest(key, key + ": not a field of this endpoint (prompt, max_tokens, "
                                        "temperature, top_k, seed, stream, model)");
        }
    }
    try {
        p.request.prompt = start_tokens(vocab, cfg.vocab_size, p.prompt, o);
    } catch (const std::invalid_argument& e) {
        std::string what = e.what();  // "the prompt: …" from start_tokens
        if (what.rfind("the prompt: ", 0) == 0) what = what.substr(12);
        throw BadRequest("prompt", "prompt: " + what);
    }
    if (static_cast<int>(p.request.prompt.size()) > cfg.block_size)
        throw BadRequest("prompt", "prompt: " + std::to_string(p.request.prompt.size()) +
                                       " characters, past the model's context of " +
                                       std::to_string(cfg.block_size));
    return p;
}

std::string completion_json(const std::string& id, const std::string& text, bool last,
                            int prompt_tokens, int completion_tokens) {
    json j = {{"id", id},
              {"object", "text_completion"},
              {"created", std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count()},
              {"model", "attention-from-scratch"},
              {"choices", json::array({{{"text", text},
                                        {"index", 0},
                                        {"logprobs", nullptr},
                                        {"finish_reason", last ? json("length") : json(nullptr)}}})}};
    if (completion_tokens >= 0) {
        j["usage"] = {{"prompt_tokens", prompt_tokens},
                      {"completion_tokens", completion_tokens},
                      {"total_tokens", prompt_tokens + completion_tokens}};
    }
    return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& type, const std::string& param) {
    res.status = status;
    // replace: a parse error's message may quote the body's bytes, which need not be UTF-8
    res.set_content(error_body(message, type, param).dump(-1, ' ', false, json::error_handler_t::replace) + "\n",
                    "application/json");
}

void handle_completion(Engine& engine, const httplib::Request& req, httplib::Response& res,
                       std::size_t max_body) {
    if (req.body.size() > max_body) {
        send_error(res, 413, "body: " + std::to_string(req.body.size()) + " bytes, over the limit of " +
                                 std::to_string(max_body), "invalid_request_error", "body");
        return;
    }
    Parsed p;
    int id = -1;
    std::shared_ptr<Channel> ch;
    try {
        p = parse_completion(req.body, engine.model(), engine.vocab());
        std::tie(id, ch) = engine.submit(p.request);
    } catch (const BadRequest& e) {
        send_error(res, 400, e.what(), "invalid_request_error", e.param);
        return;
    } catch (const QueueFull& e) {
        res.set_header("Retry-After", "1");
        send_error(res, 503, e.what(), "server_busy", "");
        return;
    } catch (const std::invalid_argument& e) {
        // the scheduler's own checks name the field first: "max_tokens: …"
        const std::string what = e.what();
        send_error(res, 400, what, "invalid_request_error", what.substr(0, what.find(':')));
        return;
    }
    const std::string name = "cmpl-" + std::to_string(id);
    const int prompt_tokens = static_cast<int>(p.request.prompt.size());
    const CharVocab& vocab = engine.vocab();
    if (!p.stream) {
        std::vector<int> tokens;
        {
            std::unique_lock<std::mutex> lock(engine.stream_m);
            ch->cv.wait(lock, [&] { return ch->finished; });
            tokens = ch->tokens;
        }
        engine.forget(id);
        std::string text;
        for (int t : tokens) text += vocab.at(t);
        res.set_content(completion_json(name, text, true, prompt_tokens,
                                        static_cast<int>(tokens.size())) + "\n",
                        "application/json");
        return;
    }
    // Server-sent events: one per token as it comes, then [DONE]. A write that fails (the
    // client went away) ends the request at once and frees its blocks.
    auto sent = std::make_shared<std::size_t>(0);
    auto done = std::make_shared<bool>(false);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [&engine, &vocab, ch, id, name, sent, done](std::size_t, httplib::DataSink& sink) {
            std::vector<int> fresh;
            bool finished = false;
            {
                std::unique_lock<std::mutex> lock(engine.stream_m);
                ch->cv.wait_for(lock, std::chrono::milliseconds(200),
                                [&] { return ch->tokens.size() > *sent || ch->finished; });
                fresh.assign(ch->tokens.begin() + static_cast<long>(*sent), ch->tokens.end());
                finished = ch->finished;
            }
            if (fresh.empty() && !finished) return sink.is_writable();  // waiting in the queue
            for (std::size_t i = 0; i < fresh.size(); ++i) {
                const bool last = finished && i + 1 == fresh.size();
                const std::string event = "data: " + completion_json(name, vocab.at(fresh[i]), last, 0, -1) + "\n\n";
                if (!sink.write(event.data(), event.size())) return false;
                ++*sent;
            }
            if (finished) {
                const std::string end = "data: [DONE]\n\n";
                if (!sink.write(end.data(), end.size())) return false;
                *done = true;
                sink.done();
            }
            return true;
        },
        [&engine, id, done](bool) {
            if (*done) engine.forget(id);
            else engine.cancel(id);  // the stream ended early: the client is gone
        });
}

// Debian's cpp-httplib 0.11 is compiled with a listen backlog of 5 connections
// (CPPHTTPLIB_LISTEN_BACKLOG): a burst of clients connecting at once would overflow it and
// be reset. Calling listen() again on a listening socket sets a new backlog (Linux's
// listen(2)); the server's socket is the one listening on `port`.
void widen_backlog(int port) {
    for (int fd = 3; fd < 1024; ++fd) {
        int listening = 0;
        socklen_t len = sizeof listening;
        if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
        sockaddr_storage addr{};
        socklen_t alen = sizeof addr;
        if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
        const int bound = addr.ss_family == AF_INET
                              ? ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port)
                              : addr.ss_family == AF_INET6
                                    ? ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port)
                                    : -1;
        if (bound == port) ::listen(fd, SOMAXCONN);
    }
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

    // SIGINT and SIGTERM are taken by one thread (sigwait), not by a handler: blocked here,
    // before any thread starts, so that every thread inherits the mask.
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is a failed write, not a signal

    Engine engine(std::move(model), std::move(vocab), g);
    httplib::Server server;
    const int threads = g.max_running + g.max_waiting + 8;  // a waiting handler holds one
    server.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<std::size_t>(threads)); };
    server.set_payload_max_length(4 * f.max_body);  // larger ones: httplib's own 413
    server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
        handle_completion(engine, req, res, f.max_body);
    });
    server.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
        const bool draining = engine.draining();
        res.status = draining ? 503 : 200;
        // the model's context and characters: what a client (tools/load_gpt) may send
        json body = {{"status", draining ? "draining" : "ok"},
                     {"context", engine.model().config().block_size},
                     {"vocabulary", engine.vocab().chars()}};
        res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace) + "\n", "application/json");
    });
    server.Get("/v1/blocks", [&](const httplib::Request&, httplib::Response& res) {
        res.set_content(engine.blocks().dump() + "\n", "application/json");
    });
    // Pages elsewhere (the course site's serving page, opened from a file) may call the API:
    // every answer allows any origin, and the preflight of a JSON POST is answered.
    server.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
    server.Options("/v1/completions", [](const httplib::Request&, httplib::Response& res) {
        res.set_header("Access-Control-Allow-Methods", "POST, OPTIONS");
        res.set_header("Access-Control-Allow-Headers", "Content-Type");
        res.status = 204;
    });
    server.Get("/metrics", [&](const httplib::Request&, httplib::Response& res) {
        res.set_content(engine.metrics(), "text/plain; version=0.0.4");
    });
    server.set_logger([&](const httplib::Request&, const httplib::Response& res) {
        engine.count_response(res.status);
    });
    server.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
            std::rethrow_exception(ep);
        } catch (const std::exception& e) {
            what = e.what();
        } catch (...) {
        }
        send_error(res, 500, what, "server_error", "");
    });

    const int port = f.port == 0 ? server.bind_to_any_port(f.host) : (server.bind_to_port(f.host, f.port) ? f.port : -1);
    if (port < 0) throw std::runtime_error("cannot listen on " + f.host + ":" + std::to_string(f.port) +
                                           " (in use? --port 0 takes any free port)");
    widen_backlog(port);
    std::printf("serving %s (%d layers, %d heads, C %d, context %d) at http://%s:%d/\n",
                weights.string().c_str(), cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size,
                f.host.c_str(), port);
    std::printf("KV cache: %d blocks of %d positions (%.1f MiB); up to %d sequences at once, %d waiting; "
                "Ctrl-C drains and stops\n",
                g.blocks, g.block_tokens,
                static_cast<double>(PagedKVCache(cfg, 1, g.block_tokens).bytes_per_block()) * g.blocks / (1 << 20),
                g.max_running, g.max_waiting);
    std::fflush(stdout);

    std::thread stopper([&] {
        int sig = 0;
        sigwait(&stop_signals, &sig);
        std::printf("%s: draining (new requests get 503), then stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
        std::fflush(stdout);
        engine.drain();
        server.stop();
    });
    server.listen_after_bind();
    stopper.join();
    std::printf("stopped: every accepted request was answered\n");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Flags f;
    CLI::App app{"Serves a trained GPT over HTTP to many clients at once (a paged KV cache, "
                 "continuous batching)."};
    app.add_option("checkpoint", f.checkpoint, "a train_gpt run folder, or a weights directory")->required();
    app.add_option("--host", f.host, "the address to listen on (127.0.0.1: this machine only)");
    app.add_option("--port", f.port, "the port (0: any free one)")->check(CLI::Range(0, 65535));
    app.add_option("--blocks", f.blocks, "blocks in the KV cache's pool (0: room for --max-running full contexts)")
        ->check(CLI::NonNegativeNumber);
    app.add_option("--block-tokens", f.block_tokens, "positions per block")->check(CLI::Range(1, 4096));
    app.add_option("--max-running", f.max_running, "sequences decoded together")->check(CLI::Range(1, 4096));
    app.add_option("--max-waiting", f.max_waiting, "requests queued beyond them (more get 503)")
        ->check(CLI::Range(0, 4096));
    app.add_option("--step-ms", f.step_ms, "make each step take at least this long, so that a person "
                                           "can watch the batch and the blocks (0: as fast as it goes)")
        ->check(CLI::Range(0, 10000));
    app.add_option("--step-tokens", f.step_tokens, "rows of one forward pass (at least --max-running)")
        ->check(CLI::Range(1, 65536));
    const auto check = [&] {
        if (f.step_tokens < f.max_running)
            throw CLI::ValidationError("--step-tokens", "must be at least --max-running (" +
                                                            std::to_string(f.max_running) + ")");
    };
    return attn_tools::tool_main("serve_gpt", app, argc, argv, check, [&] { return run(f); });
}
