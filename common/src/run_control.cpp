#include "attn/run_control.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <system_error>
#include <utility>
#include <vector>

namespace attn {

namespace fs = std::filesystem;

namespace {

// The temporaries a save of `target` leaves beside it: `.NAME.tmp-PID` (being written, or a
// complete new version kept when a kill stopped the swap) and `.NAME.old-PID` (the previous
// version, stepped aside). Their prefixes:
std::string tmp_prefix(const fs::path& target) { return "." + target.filename().string() + ".tmp-"; }
std::string old_prefix(const fs::path& target) { return "." + target.filename().string() + ".old-"; }
constexpr const char* complete_marker = ".complete";  // in a temporary once it is written and synced

fs::path parent_of(const fs::path& target) {
    return target.parent_path().empty() ? fs::path(".") : target.parent_path();
}

void fsync_path(const fs::path& p, bool directory) {
    const int fd = ::open(p.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(p.string() + ": cannot be opened to sync: " + std::strerror(errno));
    const int rc = ::fsync(fd);
    const int saved = errno;
    ::close(fd);
    if (rc != 0 && saved != EINVAL && saved != EROFS)  // EINVAL: a file system without fsync
        throw std::runtime_error(p.string() + ": cannot be synced: " + std::strerror(saved));
}

// Every file and folder under dir, then dir itself, on disk.
void fsync_tree(const fs::path& dir) {
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
        if (entry.is_regular_file()) fsync_path(entry.path(), false);
        else if (entry.is_directory()) fsync_path(entry.path(), true);
    }
    fsync_path(dir, true);
}

// Test-only fault injection: ATTN_CHECKPOINT_FAULT=POINT:N kills this process (SIGKILL, as
// a kill -9 or a lost machine would) at POINT of its N-th save: written (files written, not
// synced), synced (complete, not yet in place), stepped-aside (without an atomic exchange:
// the old version moved aside, the new not yet in place), swapped (the new version in place,
// the old not yet removed).
void fault_point(const char* point) {
    static int saves = 0;
    const char* spec = std::getenv("ATTN_CHECKPOINT_FAULT");
    if (spec == nullptr || *spec == '\0') return;
    const std::string s = spec;
    const std::size_t colon = s.find(':');
    const std::string name = s.substr(0, colon);
    const int nth = colon == std::string::npos ? 1 : std::atoi(s.c_str() + colon + 1);
    if (std::string(point) == "written") ++saves;
    if (name == point && saves == nth) ::raise(SIGKILL);
}

// Entries of the parent whose name starts with prefix, newest first.
std::vector<fs::path> leftovers(const fs::path& parent, const std::string& prefix) {
    std::vector<std::pair<fs::file_time_type, fs::path>> found;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(parent, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind(prefix, 0) == 0) found.emplace_back(fs::last_write_time(entry.path(), ec), entry.path());
    }
    std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    std::vector<fs::path> out;
    for (auto& f : found) out.push_back(std::move(f.second));
    return out;
}

}  // namespace

bool recover_directory(const fs::path& target) {
    const fs::path parent = parent_of(target);
    std::error_code ec;
    if (fs::exists(target, ec)) return false;
    // Newest first: a complete new version (a kill between its sync and its rename), else
    // the previous version stepped aside (a kill between the two renames).
    for (const fs::path& tmp : leftovers(parent, tmp_prefix(target))) {
        if (fs::exists(tmp / complete_marker, ec)) {
            fs::rename(tmp, target);
            fs::remove(target / complete_marker, ec);
            fsync_path(parent, true);
            return true;
        }
    }
    for (const fs::path& old : leftovers(parent, old_prefix(target))) {
        fs::rename(old, target);
        fs::remove(target / complete_marker, ec);
        fsync_path(parent, true);
        return true;
    }
    return false;
}

void write_directory_atomically(const fs::path& target,
                                const std::function<void(const fs::path&)>& write) {
    const fs::path parent = parent_of(target);
    fs::create_directories(parent);
    // Whatever an earlier save that was killed left: its version recovered if the target is
    // missing, then its temporaries removed.
    recover_directory(target);
    std::error_code ec;
    for (const std::string& prefix : {tmp_prefix(target), old_prefix(target)})
        for (const fs::path& stale : leftovers(parent, prefix)) fs::remove_all(stale, ec);
    const fs::path tmp = parent / (tmp_prefix(target) + std::to_string(::getpid()));
    const fs::path old = parent / (old_prefix(target) + std::to_string(::getpid()));
    fs::create_directory(tmp);
    try {
        write(tmp);
        fault_point("written");
        // On disk before it takes the target's name: a rename can reach the disk before the
        // data it names, and a crash would then leave a checkpoint of empty files.
        std::ofstream(tmp / complete_marker) << "complete\n";
        fsync_tree(tmp);
        fault_point("synced");
    } catch (...) {
        fs::remove_all(tmp, ec);
        throw;
    }
    const bool had_old = fs::exists(target);
    bool exchanged = false;
#ifdef RENAME_EXCHANGE
    // One atomic step where the file system has it: the new version takes the name, the old
    // one takes the temporary's.
    const char* no_exchange = std::getenv("ATTN_CHECKPOINT_NO_EXCHANGE");  // tests the fallback
    if (had_old && !(no_exchange && *no_exchange && std::string(no_exchange) != "0"))
        exchanged = ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0;
#endif
    if (exchanged) {
        fsync_path(parent, true);
        fault_point("swapped");
        fs::remove(target / complete_marker, ec);
        fs::remove_all(tmp, ec);  // the old version
        return;
    }
    // Two renames: the old version steps aside, the new one takes its name. A kill between
    // them leaves both whole, and recover_directory() puts the newer in place.
    if (had_old) {
        fs::rename(target, old);
        fault_point("stepped-aside");
    }
    fs::rename(tmp, target, ec);
    if (ec) {
        if (had_old) fs::rename(old, target);
        throw std::runtime_error(target.string() + ": cannot be replaced: " + ec.message());
    }
    fsync_path(parent, true);
    fault_point("swapped");
    fs::remove(target / complete_marker, ec);
    if (had_old) fs::remove_all(old, ec);
}

namespace {
std::atomic<int> g_stops{0};
void on_signal(int sig) {
    if (g_stops.fetch_add(1) >= 1) {
        // SIGUSR1's default would end the process too, but say "User defined signal 1"
        std::signal(sig == SIGUSR1 ? SIGTERM : sig, SIG_DFL);
        std::raise(sig == SIGUSR1 ? SIGTERM : sig);
    }
}
struct sigaction g_old_int, g_old_term, g_old_usr1;
int g_depth = 0;  // StopRequests alive: the outermost installs and restores the handlers
}  // namespace

StopRequest::StopRequest() {
    if (g_depth++ > 0) return;  // an outer one already listens, and keeps what it heard
    g_stops = 0;
    struct sigaction sa{};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &g_old_int);
    sigaction(SIGTERM, &sa, &g_old_term);
    sigaction(SIGUSR1, &sa, &g_old_usr1);
}

StopRequest::~StopRequest() {
    if (--g_depth > 0) return;
    sigaction(SIGINT, &g_old_int, nullptr);
    sigaction(SIGTERM, &g_old_term, nullptr);
    sigaction(SIGUSR1, &g_old_usr1, nullptr);
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
