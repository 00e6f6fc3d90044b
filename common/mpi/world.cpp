// The processes of one MPI job: start, end, agreement on errors.
#include "attn/mpi/world.hpp"

#include "attn/threads.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

namespace attn::mpi {

bool launched_by_mpirun() {
    // Open MPI sets OMPI_COMM_WORLD_SIZE; PMIx and PMI launchers (MPICH's Hydra, Slurm's
    // srun) set these.
    for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
        if (std::getenv(name)) return true;
    }
    return false;
}

World::World(int& argc, char**& argv) {
    // The passes' threads call MPI from the main thread only; ZeRO stage 3's communication
    // thread calls it at the same time (attn/mpi/zero.hpp), which needs MPI_THREAD_MULTIPLE
    // (it refuses when this MPI gives less).
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    if (provided < MPI_THREAD_FUNNELED) {
        MPI_Finalize();
        throw std::runtime_error("this MPI cannot be called from the main thread of a program "
                                 "with other threads (MPI_THREAD_FUNNELED)");
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    // The ranks on this machine: those that can share memory with this one.
    MPI_Comm local;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local);
    MPI_Comm_size(local, &local_size_);
    MPI_Comm_free(&local);
}

World::~World() { MPI_Finalize(); }

void World::share_cpus() const {
    const ThreadConfig threads = thread_config();
    if (threads.threads_from != "CPUs" || local_size_ <= 1) return;  // chosen by the user
    const int share = std::max(1, threads.cpus / local_size_);
    set_num_threads(share, "the CPUs shared by " + std::to_string(local_size_) +
                               " ranks on this machine");
}

void World::quiet_unless_rank0() const {
    if (rank_ == 0) return;
    std::fflush(stdout);
    if (!std::freopen("/dev/null", "w", stdout)) std::fclose(stdout);
}

void run_on_every_rank(const std::function<void()>& work) {
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::string message;
    bool failed = false;
    try {
        work();
    } catch (const std::exception& e) {
        failed = true;
        message = e.what();
    }
    // The lowest failing rank (size when none failed) tells the others what went wrong.
    int mine = failed ? rank : size, first = size;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (first == size) return;
    int failing = failed ? 1 : 0, failures = 0;
    MPI_Allreduce(&failing, &failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    // Its host's name, then a newline, then its message.
    if (rank == first) {
        char host[MPI_MAX_PROCESSOR_NAME] = {};
        int host_length = 0;
        MPI_Get_processor_name(host, &host_length);
        message = std::string(host, static_cast<std::size_t>(host_length)) + "\n" + message;
    }
    int length = static_cast<int>(message.size());
    MPI_Bcast(&length, 1, MPI_INT, first, MPI_COMM_WORLD);
    std::vector<char> text(static_cast<std::size_t>(length));
    if (rank == first) std::copy(message.begin(), message.end(), text.begin());
    MPI_Bcast(text.data(), length, MPI_CHAR, first, MPI_COMM_WORLD);
    const std::string all(text.begin(), text.end());
    const std::size_t newline = all.find('\n');
    throw JobError(all.substr(newline + 1), first, all.substr(0, newline), failures == size);
}

void abort_job(int status) {
    std::fflush(stdout);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
    std::_Exit(status);  // MPI_Abort does not return; this keeps the compiler sure of it
}

double wall_seconds() { return MPI_Wtime(); }

double cpu_seconds() {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

namespace {
// A "Name:   123 kB" line of /proc/self/status, in bytes (0 when absent).
std::size_t status_kib(const std::string& name) {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.compare(0, name.size() + 1, name + ":") == 0) {
            return static_cast<std::size_t>(std::stoull(line.substr(name.size() + 1))) * 1024;
        }
    }
    return 0;
}
}  // namespace

std::size_t peak_resident_bytes() { return status_kib("VmHWM"); }

bool reset_peak_resident() {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // 5: reset the peak resident set to the current one
    clear.flush();
    return static_cast<bool>(clear);
}

std::size_t resident_bytes() { return status_kib("VmRSS"); }

}  // namespace attn::mpi
