/// @file watchdog.hpp
/// @brief A watchdog for a job's collective calls (lesson 21): a rank that stops arriving
/// (frozen, stuck, or its machine gone quiet) ends the job with a line that names it,
/// instead of leaving every other rank waiting in a collective call for ever. PyTorch's
/// process-group timeout and NCCL's watchdog do the same.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <mpi.h>

namespace attn::mpi {

/// Watches this rank's progress, a count its main thread raises at each point that every
/// rank reaches (a training step's end), and the other ranks' signs of life.
///
/// How: a thread of its own sends this rank's progress to every other rank a few times per
/// `timeout` (non-blocking sends on a communicator of its own, each sent only once the one
/// before has gone, so that a frozen receiver holds at most one per sender) and receives
/// theirs (a receive from any rank, polled with MPI_Test). Polling needs no call of the
/// main thread, which may sit inside a blocking collective call all the while; it needs
/// MPI_THREAD_MULTIPLE, which Open MPI gives (attn::mpi::World asks for it). When this
/// rank's progress has not moved for `timeout` seconds, the ranks that did not arrive are
/// those whose last sign of life is older than half the timeout (a frozen process sends
/// none: SIGSTOP, a machine that hangs), or, when every rank is alive, those whose progress
/// is furthest behind (a rank stuck outside the collective calls). The lowest rank not
/// among them reports; the others wait a grace period more, in case it cannot.
class Watchdog {
public:
    /// Starts watching. Every rank of MPI_COMM_WORLD makes one at the same point (it
    /// duplicates the communicator).
    /// @param timeout_seconds how long this rank's progress may stand still, positive
    /// @param on_timeout called once, on the watchdog's thread, with one sentence naming the
    ///        ranks that did not arrive; it must end the job (abort_job)
    /// @throws std::invalid_argument for a timeout that is not positive, std::runtime_error
    ///         when this MPI does not allow calls from a second thread
    Watchdog(double timeout_seconds, std::function<void(const std::string&)> on_timeout);
    /// Stops watching (stop()).
    ~Watchdog();
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;

    /// This rank reached its next point: its progress goes up by one.
    void progress() { progress_.fetch_add(1, std::memory_order_relaxed); }
    /// Stops the thread and lets go of its messages; every rank calls it (not a collective
    /// call: no rank waits for another).
    void stop();

    /// The sentence for a timeout, as the watchdog words it (for the checks).
    /// @param timeout_seconds the timeout @param late the ranks that did not arrive, in order
    /// @param ranks the job's ranks
    static std::string describe(double timeout_seconds, const std::vector<int>& late, int ranks);

private:
    void run();

    double timeout_;
    std::function<void(const std::string&)> on_timeout_;
    MPI_Comm comm_ = MPI_COMM_NULL;
    int rank_ = 0, size_ = 1;
    std::atomic<long long> progress_{0};
    std::atomic<bool> stop_{false};
    std::thread thread_;  // last: started once the rest is ready
};

}  // namespace attn::mpi
