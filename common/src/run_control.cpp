#include "attn/run_control.hpp"

#include <atomic>
#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <system_error>
#include <unistd.h>

namespace attn {

namespace fs = std::filesystem;

void write_directory_atomically(const fs::path& target,
                                const std::function<void(const fs::path&)>& write) {
    const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
    fs::create_directories(parent);
    const std::string base = target.filename().string();
    const fs::path tmp = parent / ("." + base + ".tmp-" + std::to_string(::getpid()));
    const fs::path old = parent / ("." + base + ".old-" + std::to_string(::getpid()));
    fs::remove_all(tmp);
    fs::create_directory(tmp);
    try {
        write(tmp);
    } catch (...) {
        std::error_code ignore;
        fs::remove_all(tmp, ignore);
        throw;
    }
    // Two renames: the old directory steps aside, the new one takes its name. Between them
    // a crash leaves the old one complete under .old-*, never a half-written target.
    std::error_code ec;
    const bool had_old = fs::exists(target);
    if (had_old) fs::rename(target, old);
    fs::rename(tmp, target, ec);
    if (ec) {
        if (had_old) fs::rename(old, target);
        throw std::runtime_error(target.string() + ": cannot be replaced: " + ec.message());
    }
    if (had_old) fs::remove_all(old, ec);
}

namespace {
std::atomic<int> g_stops{0};
void on_signal(int sig) {
    if (g_stops.fetch_add(1) >= 1) {
        std::signal(sig, SIG_DFL);
        std::raise(sig);
    }
}
struct sigaction g_old_int, g_old_term;
}  // namespace

StopRequest::StopRequest() {
    g_stops = 0;
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
}

StopRequest::~StopRequest() {
    sigaction(SIGINT, &g_old_int, nullptr);
    sigaction(SIGTERM, &g_old_term, nullptr);
}

bool StopRequest::requested() const { return g_stops.load() > 0; }

ProgressLine::ProgressLine(std::int64_t total_steps, std::int64_t tokens_per_step)
    : total_steps_(total_steps), tokens_per_step_(tokens_per_step),
      last_time_(std::chrono::steady_clock::now()) {}

std::string ProgressLine::format(std::int64_t step, double loss, double lr) {
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - last_time_).count();
    const std::int64_t steps = last_step_ < 0 ? step + 1 : step - last_step_;
    if (dt > 0 && steps > 0) tokens_per_second_ = static_cast<double>(steps * tokens_per_step_) / dt;
    last_step_ = step;
    last_time_ = now;
    const double left = tokens_per_second_ > 0
                            ? static_cast<double>((total_steps_ - step - 1) * tokens_per_step_) / tokens_per_second_
                            : 0.0;
    char buf[160];
    std::snprintf(buf, sizeof buf, "step %5lld/%lld | loss %.4f | lr %.2e | %7.0f tok/s | ETA %s",
                  static_cast<long long>(step + 1), static_cast<long long>(total_steps_), loss, lr,
                  tokens_per_second_, format_duration(left).c_str());
    return buf;
}

std::string format_duration(double seconds) {
    const long s = static_cast<long>(seconds + 0.5);
    char buf[32];
    if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
    else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
    else std::snprintf(buf, sizeof buf, "%lds", s);
    return buf;
}

}  // namespace attn
