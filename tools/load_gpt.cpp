// load_gpt: many clients at once against a running serve_gpt, over HTTP on this machine, and
// what they measured: throughput, time to the first token and between tokens (lesson 20).
//
//   load_gpt                                      1, 4 and 16 clients against 127.0.0.1:8000
//   load_gpt http://127.0.0.1:8123 --clients 1,2,4,8,16,32 --requests 64
//   load_gpt --rounds                             clients send together and wait for the slowest
//
// Each client sends its next request as soon as its last is answered (streamed: one server-sent
// event per token), so `--clients N` keeps N requests in the server. With --rounds the N clients
// send at once and none sends again until all N are answered: static batching, as a server
// that takes a batch and finishes it before the next would see it. One request at a time is a
// server matter: `serve_gpt --max-running 1`. Prompts are passages of a text (the course's
// corpus unless --text), of lengths and answer lengths drawn from the ranges given, the same
// for the same --seed; a server that answers 503 (queue full) is waited for as its Retry-After
// says. Every level stops sending after --requests or --seconds, whichever comes first.
// Only this machine's servers are loaded: the URL's host must be 127.0.0.1 or localhost.
#include "attn/data.hpp"
#include "attn/random.hpp"

#include "tool_main.hpp"

#include <CLI/CLI.hpp>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Range {
    int lo, hi;
};

struct Flags {
    std::string url = "http://127.0.0.1:8000";
    std::vector<int> clients = {1, 4, 16};
    int requests = 32;
    double seconds = 120;
    std::string prompt_chars = "16:32", max_tokens = "16:64";
    fs::path text;
    std::uint64_t seed = 1;
    bool rounds = false;
    double temperature = 1.0;
};

// A whole number of 1 to `digits` digits, or -1.
int whole_number(const std::string& s, std::size_t digits) {
    if (s.empty() || s.size() > digits) return -1;
    for (char c : s) {
        if (c < '0' || c > '9') return -1;
    }
    return std::stoi(s);
}

Range parse_range(const std::string& s, const char* flag) {
    const std::size_t colon = s.find(':');
    const int lo = whole_number(s.substr(0, colon), 6);
    const int hi = colon == std::string::npos ? lo : whole_number(s.substr(colon + 1), 6);
    if (lo < 0 || hi < 0) {
        throw CLI::ValidationError(flag, "'" + s + "' is not a count or a range LO:HI (e.g. 16:64)");
    }
    if (lo < 1 || hi < lo) throw CLI::ValidationError(flag, "'" + s + "': need 1 ≤ LO ≤ HI");
    return {lo, hi};
}

struct Target {
    std::string host;
    int port;
};

// http://HOST:PORT, with an optional closing slash.
Target parse_url(const std::string& url) {
    const std::string scheme = "http://";
    std::string rest = url.rfind(scheme, 0) == 0 ? url.substr(scheme.size()) : "";
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    const std::size_t colon = rest.rfind(':');
    const std::string host = colon == std::string::npos ? "" : rest.substr(0, colon);
    const int port = colon == std::string::npos ? -1 : whole_number(rest.substr(colon + 1), 5);
    if (host.empty() || port < 0 || host.find('/') != std::string::npos) {
        throw std::runtime_error("'" + url + "' is not a server's address: http://127.0.0.1:PORT");
    }
    if (host != "127.0.0.1" && host != "localhost") {
        throw std::runtime_error("'" + url + "': load is only sent to a server on this machine "
                                 "(host 127.0.0.1 or localhost)");
    }
    if (port < 1 || port > 65535) throw std::runtime_error("'" + url + "': the port must be in 1..65535");
    return {"127.0.0.1", port};
}

// One request: a prompt and how many tokens to ask for.
struct Job {
    std::string prompt;
    int max_tokens;
};

// Whether byte i of s starts a UTF-8 character (or is the end).
bool starts_char(const std::string& s, std::size_t i) {
    return i >= s.size() || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
}

// `n` requests, the same for the same seed: passages of `text` that the model can read.
std::vector<Job> make_jobs(int n, const std::string& text, const CharVocab& vocab, int context,
                           Range prompt, Range tokens, std::uint64_t seed) {
    Rng rng(seed);
    std::vector<Job> jobs;
    for (int i = 0; i < n; ++i) {
        const int p = std::min(context, prompt.lo + static_cast<int>(rng.below(
                                            static_cast<std::uint64_t>(prompt.hi - prompt.lo + 1))));
        int t = tokens.lo + static_cast<int>(rng.below(static_cast<std::uint64_t>(tokens.hi - tokens.lo + 1)));
        t = std::max(1, std::min(t, context - p + 1));  // the answer within the context, as in lesson 20
        if (text.size() <= static_cast<std::size_t>(p)) {
            throw std::runtime_error("the text has " + std::to_string(text.size()) +
                                     " bytes, too few for a prompt of " + std::to_string(p));
        }
        bool found = false;
        for (int tries = 0; tries < 2000 && !found; ++tries) {
            const std::size_t at = rng.below(text.size() - static_cast<std::size_t>(p));
            if (!starts_char(text, at) || !starts_char(text, at + static_cast<std::size_t>(p))) continue;
            std::string passage = text.substr(at, static_cast<std::size_t>(p));
            if (vocab.can_encode(passage)) {
                jobs.push_back({std::move(passage), t});
                found = true;
            }
        }
        if (!found) {
            throw std::runtime_error("no passage of " + std::to_string(p) +
                                     " characters of the text is in the model's vocabulary: "
                                     "pass --text with text like the one it was trained on");
        }
    }
    return jobs;
}

// What one request measured: the seconds to its first token and between the next ones.
struct Answer {
    double first = -1;
    std::vector<double> gaps;
    int tokens = 0;
    int rejected = 0;  // 503s before it was taken
};

struct Failure : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Sends `job` streamed and reads its events; a 503 is waited for (Retry-After) and tried again
// until `deadline`; anything but 200 and 503 throws Failure.
Answer send(const Target& target, const Job& job, double temperature, std::uint64_t seed,
            Clock::time_point deadline) {
    Answer a;
    const json body = {{"prompt", job.prompt}, {"max_tokens", job.max_tokens},
                       {"temperature", temperature}, {"seed", seed}, {"stream", true}};
    while (true) {
        httplib::Client client(target.host, target.port);
        client.set_connection_timeout(5);
        client.set_read_timeout(600);
        httplib::Request req;
        req.method = "POST";
        req.path = "/v1/completions";
        req.body = body.dump();
        req.set_header("Content-Type", "application/json");
        httplib::Response res;
        std::string pending, error_text;
        bool done = false;
        const Clock::time_point sent = Clock::now();
        Clock::time_point last = sent;
        req.content_receiver = [&](const char* data, std::size_t n, std::uint64_t, std::uint64_t) {
            if (res.status != 200) {
                error_text.append(data, n);
                return error_text.size() < 65536;
            }
            pending.append(data, n);
            std::size_t end;
            while ((end = pending.find("\n\n")) != std::string::npos) {
                const std::string event = pending.substr(0, end);
                pending.erase(0, end + 2);
                if (event.rfind("data: ", 0) != 0) continue;
                if (event == "data: [DONE]") {
                    done = true;
                    continue;
                }
                const Clock::time_point now = Clock::now();
                const double gap = std::chrono::duration<double>(now - last).count();
                if (a.tokens == 0) a.first = gap; else a.gaps.push_back(gap);
                last = now;
                ++a.tokens;
            }
            return true;
        };
        httplib::Error err = httplib::Error::Success;
        if (!client.send(req, res, err)) {
            throw Failure(err == httplib::Error::Connection
                              ? "no server answers at http://127.0.0.1:" + std::to_string(target.port) +
                                    "/ (start one: ./workbook serve)"
                              : "the request failed: " + httplib::to_string(err));
        }
        if (res.status == 503 && Clock::now() < deadline) {
            ++a.rejected;
            double wait = 1.0;
            if (res.has_header("Retry-After")) wait = std::max(0.05, std::atof(res.get_header_value("Retry-After").c_str()));
            std::this_thread::sleep_for(std::chrono::duration<double>(std::min(wait, 5.0)));
            a = Answer{-1, {}, 0, a.rejected};
            continue;
        }
        if (res.status != 200) {
            std::string message = error_text.empty() ? res.body : error_text;
            try {
                message = json::parse(message).at("error").at("message").get<std::string>();
            } catch (const std::exception&) {
            }
            throw Failure("the server answered " + std::to_string(res.status) + ": " + message);
        }
        if (!done) throw Failure("a stream ended without its closing [DONE]");
        return a;
    }
}

double percentile(std::vector<double> v, double p) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    const std::size_t i = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
    return v[std::min(i == 0 ? 0 : i - 1, v.size() - 1)];
}

struct Level {
    int clients = 0, answered = 0, tokens = 0, rejected = 0;
    double seconds = 0;
    std::vector<double> first, gaps;
    bool timed_out = false;
};

// `clients` threads share `jobs`: each takes the next one as soon as its last is answered
// (or, with `rounds`, when every client's last is answered).
Level run_level(const Target& target, const std::vector<Job>& jobs, int clients, bool rounds,
                double temperature, double seconds) {
    Level level;
    level.clients = clients;
    std::mutex m;
    std::condition_variable round_done;
    std::size_t next = 0;
    int in_round = 0, round = 0;
    std::string failure;
    const Clock::time_point start = Clock::now();
    const Clock::time_point deadline = start + std::chrono::duration_cast<Clock::duration>(
                                                   std::chrono::duration<double>(seconds));
    auto client = [&](int) {
        int my_round = 0;
        while (true) {
            std::size_t i;
            {
                std::unique_lock<std::mutex> lock(m);
                if (rounds) {
                    round_done.wait(lock, [&] { return round >= my_round || !failure.empty(); });
                }
                if (!failure.empty() || next >= jobs.size() || Clock::now() >= deadline) {
                    if (next < jobs.size() && Clock::now() >= deadline) level.timed_out = true;
                    // a client that stops still counts as done for its round
                    if (rounds && ++in_round == clients) { in_round = 0; ++round; round_done.notify_all(); }
                    return;
                }
                i = next++;
            }
            try {
                Answer a = send(target, jobs[i], temperature, i, deadline);
                std::lock_guard<std::mutex> lock(m);
                ++level.answered;
                level.tokens += a.tokens;
                level.rejected += a.rejected;
                if (a.first >= 0) level.first.push_back(a.first);
                level.gaps.insert(level.gaps.end(), a.gaps.begin(), a.gaps.end());
            } catch (const Failure& e) {
                std::lock_guard<std::mutex> lock(m);
                if (failure.empty()) failure = e.what();
                round_done.notify_all();
                return;
            }
            ++my_round;
            if (rounds) {
                std::lock_guard<std::mutex> lock(m);
                if (++in_round == clients) { in_round = 0; ++round; round_done.notify_all(); }
            }
        }
    };
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c) threads.emplace_back(client, c);
    for (std::thread& t : threads) t.join();
    if (!failure.empty()) throw std::runtime_error(failure);
    level.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    return level;
}

int run(const Flags& f, Range prompt, Range tokens) {
    const Target target = parse_url(f.url);
    const std::string text = read_corpus(f.text.empty() ? course_corpus() : f.text);

    httplib::Client probe(target.host, target.port);
    probe.set_connection_timeout(5);
    auto health = probe.Get("/health");
    if (!health) {
        throw std::runtime_error("no server answers at http://127.0.0.1:" + std::to_string(target.port) +
                                 "/ (start one: ./workbook serve)");
    }
    json h;
    try {
        h = json::parse(health->body);
        (void)h.at("context").get<int>();
        (void)h.at("vocabulary").get<std::string>();
    } catch (const std::exception&) {
        throw std::runtime_error("http://127.0.0.1:" + std::to_string(target.port) +
                                 "/health is not serve_gpt's (no context or vocabulary in it)");
    }
    if (health->status != 200) throw std::runtime_error("the server is draining (GET /health: 503)");
    const int context = h["context"].get<int>();
    const CharVocab vocab = CharVocab::from_chars(h["vocabulary"].get<std::string>());

    std::printf("load on http://127.0.0.1:%d/ (a model of context %d, %zu characters): %d requests per "
                "level, prompts of %d-%d characters, %d-%d new tokens, temperature %g, seed %llu%s\n",
                target.port, context, vocab.size(), f.requests, prompt.lo, prompt.hi, tokens.lo, tokens.hi,
                f.temperature, static_cast<unsigned long long>(f.seed),
                f.rounds ? ", in rounds (static batching)" : "");
    std::printf("%8s %9s %8s %8s %10s %12s %12s %12s %12s %6s\n", "clients", "requests", "tokens", "seconds",
                "tokens/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "503s");
    std::fflush(stdout);
    const std::vector<Job> jobs = make_jobs(f.requests, text, vocab, context, prompt, tokens, f.seed);
    bool any_timed_out = false;
    for (int c : f.clients) {
        std::fprintf(stderr, "load_gpt: %d client%s sending %d requests...\n", c, c == 1 ? "" : "s", f.requests);
        const Level l = run_level(target, jobs, c, f.rounds, f.temperature, f.seconds);
        std::printf("%8d %9d %8d %8.2f %10.1f %12.1f %12.1f %12.2f %12.2f %6d%s\n", l.clients, l.answered,
                    l.tokens, l.seconds, l.tokens / l.seconds, percentile(l.first, 50) * 1e3,
                    percentile(l.first, 99) * 1e3, percentile(l.gaps, 50) * 1e3, percentile(l.gaps, 99) * 1e3,
                    l.rejected, l.timed_out ? "  (stopped at --seconds)" : "");
        std::fflush(stdout);
        any_timed_out = any_timed_out || l.timed_out;
    }
    std::printf("TTFT: from sending a request to its first token; TPOT: between two tokens of one "
                "request (as this client received them)\n");
    if (any_timed_out) std::printf("a level stopped at --seconds before all its requests were sent\n");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Flags f;
    CLI::App app{"Sends many concurrent streamed completions to a serve_gpt on this machine and "
                 "prints throughput and latency (lesson 20)."};
    app.add_option("url", f.url, "the server (http://127.0.0.1:PORT)");
    app.add_option("--clients", f.clients, "concurrent clients, one level each (e.g. 1,4,16)")
        ->delimiter(',')->check(CLI::Range(1, 256));
    app.add_option("--requests", f.requests, "requests per level")->check(CLI::Range(1, 100000));
    app.add_option("--seconds", f.seconds, "stop sending after this long, per level")->check(CLI::Range(1.0, 86400.0));
    app.add_option("--prompt-chars", f.prompt_chars, "a prompt's length, LO:HI characters");
    app.add_option("--max-tokens", f.max_tokens, "tokens asked for, LO:HI (within the model's context)");
    app.add_option("--temperature", f.temperature, "the requests' temperature (0: greedy; at most 2, as the API allows)")->check(CLI::Range(0.0, 2.0));
    app.add_option("--text", f.text, "where prompts come from (default: data/tinyshakespeare.txt)");
    app.add_option("--seed", f.seed, "the same seed, the same requests");
    app.add_flag("--rounds", f.rounds, "clients send together and wait for the slowest (static batching)");
    Range prompt{}, tokens{};
    const auto check = [&] {
        prompt = parse_range(f.prompt_chars, "--prompt-chars");
        tokens = parse_range(f.max_tokens, "--max-tokens");
    };
    return attn_tools::tool_main("load_gpt", app, argc, argv, check, [&] { return run(f, prompt, tokens); });
}
