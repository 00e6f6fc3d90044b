// A watchdog for a job's collective calls (attn/mpi/watchdog.hpp).
#include "attn/mpi/watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace attn::mpi {

namespace {
using clock = std::chrono::steady_clock;
double seconds_between(clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
}
}  // namespace

Watchdog::Watchdog(double timeout_seconds, std::function<void(const std::string&)> on_timeout)
    : timeout_(timeout_seconds), on_timeout_(std::move(on_timeout)) {
    if (!(timeout_seconds > 0.0) || !std::isfinite(timeout_seconds)) {
        throw std::invalid_argument("the collective watchdog needs a positive timeout, got " +
                                    std::to_string(timeout_seconds));
    }
    int provided = 0;
    MPI_Query_thread(&provided);
    if (provided < MPI_THREAD_MULTIPLE) {
        throw std::runtime_error("the collective watchdog calls MPI from a thread of its own, which this MPI "
                                 "does not allow (MPI_THREAD_MULTIPLE): turn it off with a timeout of 0");
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() { stop(); }

void Watchdog::stop() {
    if (!thread_.joinable()) return;
    stop_ = true;
    thread_.join();
    MPI_Comm_free(&comm_);
}

std::string Watchdog::describe(double timeout_seconds, const std::vector<int>& late, int ranks) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", timeout_seconds);
    const std::string waited = std::string("no step ended in ") + seconds + " s (--collective-timeout " + seconds + ")";
    if (late.empty()) return waited + " and every rank was waiting";
    std::string who;
    for (std::size_t i = 0; i < late.size(); ++i) {
        who += (i == 0 ? "" : i + 1 == late.size() ? " and " : ", ") + std::to_string(late[i]);
    }
    return waited + ": rank" + (late.size() > 1 ? "s " : " ") + who + " of " + std::to_string(ranks) +
           " did not arrive";
}

void Watchdog::run() {
    // A few signs of life per timeout, at most one a second, at least one per 50 ms.
    const double tick = std::clamp(timeout_ / 10.0, 0.05, 1.0);
    const double grace = std::max(5.0, 2.0 * tick);  // for the ranks that do not report
    const clock::time_point start = clock::now();
    std::vector<clock::time_point> seen(static_cast<std::size_t>(size_), start);
    std::vector<long long> theirs(static_cast<std::size_t>(size_), 0);
    std::vector<long long> outgoing(static_cast<std::size_t>(size_), 0);
    std::vector<MPI_Request> sends(static_cast<std::size_t>(size_), MPI_REQUEST_NULL);
    long long incoming = 0;
    MPI_Request receive = MPI_REQUEST_NULL;
    MPI_Irecv(&incoming, 1, MPI_LONG_LONG, MPI_ANY_SOURCE, 0, comm_, &receive);
    long long mine = progress_.load();
    clock::time_point moved = start, sent = start - std::chrono::hours(1);
    bool reported = false;
    while (!stop_) {
        const clock::time_point now = clock::now();
        // Theirs, as many as have come.
        for (;;) {
            int done = 0;
            MPI_Status status;
            MPI_Test(&receive, &done, &status);
            if (!done) break;
            const auto from = static_cast<std::size_t>(status.MPI_SOURCE);
            seen[from] = now;
            theirs[from] = std::max(theirs[from], incoming);
            MPI_Irecv(&incoming, 1, MPI_LONG_LONG, MPI_ANY_SOURCE, 0, comm_, &receive);
        }
        // Mine, to each rank whose last one has gone.
        const long long p = progress_.load(std::memory_order_relaxed);
        if (p != mine) {
            mine = p;
            moved = now;
        }
        if (seconds_between(sent, now) >= tick) {
            sent = now;
            for (int r = 0; r < size_; ++r) {
                const auto i = static_cast<std::size_t>(r);
                if (r == rank_) continue;
                int done = 1;
                if (sends[i] != MPI_REQUEST_NULL) MPI_Test(&sends[i], &done, MPI_STATUS_IGNORE);
                if (!done) continue;
                outgoing[i] = mine;
                MPI_Isend(&outgoing[i], 1, MPI_LONG_LONG, r, 0, comm_, &sends[i]);
            }
        }
        const double still = seconds_between(moved, now);
        if (!reported && still > timeout_) {
            // The ranks gone quiet; if none, the live ranks furthest behind (a rank waiting
            // for a quiet one may itself be a step behind another that has passed it).
            std::vector<int> late;
            long long least = mine, most = mine;
            for (int r = 0; r < size_; ++r) {
                const auto i = static_cast<std::size_t>(r);
                if (r == rank_) continue;
                if (seconds_between(seen[i], now) > timeout_ / 2) late.push_back(r);
                least = std::min(least, theirs[i]);
                most = std::max(most, theirs[i]);
            }
            for (int r = 0; late.empty() && least < most && r < size_; ++r) {
                if ((r == rank_ ? mine : theirs[static_cast<std::size_t>(r)]) == least) late.push_back(r);
            }
            // The lowest rank that arrived reports; the others only if it has not ended the
            // job after the grace period.
            int reporter = 0;
            while (std::find(late.begin(), late.end(), reporter) != late.end()) ++reporter;
            if (reporter == rank_ || still > timeout_ + grace) {
                reported = true;
                on_timeout_(describe(timeout_, late, size_));  // ends the job
            }
        }
        std::this_thread::sleep_for(std::chrono::duration<double>(std::min(tick, 0.1)));
    }
    // Let go: the pending receive is cancelled; a send not yet gone is left to MPI (a rank
    // that has not received it ends too).
    MPI_Cancel(&receive);
    MPI_Wait(&receive, MPI_STATUS_IGNORE);
    for (MPI_Request& s : sends) {
        if (s == MPI_REQUEST_NULL) continue;
        int done = 0;
        MPI_Test(&s, &done, MPI_STATUS_IGNORE);
        if (!done) MPI_Request_free(&s);
    }
}

}  // namespace attn::mpi
