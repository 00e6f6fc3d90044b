/// @file world.hpp
/// @brief The processes of one MPI job (lesson 19): starting and ending MPI, who is who,
/// errors that every process agrees on, and the one place that ends them all.
///
/// The MPI part of the library (the CMake target `attn_mpi`, built where Open MPI is
/// installed) runs the course's code on several processes, the *ranks* of a job that
/// `mpirun` starts on one machine or on several. Everything here uses MPI's world
/// communicator.
#pragma once

#include <cstddef>
#include <functional>
#include <stdexcept>
#include <string>

namespace attn::mpi {

/// Whether this process was started by mpirun (or another MPI launcher): then it is one rank
/// of a job, and must initialise MPI; a process started plainly runs alone without MPI.
bool launched_by_mpirun();

/// MPI for the lifetime of one process: MPI_Init_thread in the constructor, MPI_Finalize in
/// the destructor. It asks for MPI_THREAD_MULTIPLE, which ZeRO stage 3's communication
/// thread needs (attn/mpi/zero.hpp), and works with MPI_THREAD_FUNNELED otherwise: then only
/// the thread that made it calls MPI; the library's OpenMP threads never do.
class World {
public:
    /// Initialises MPI. @param argc main's argc @param argv main's argv
    /// @throws std::runtime_error when MPI cannot give the thread support it needs
    World(int& argc, char**& argv);
    /// Finalises MPI.
    ~World();
    World(const World&) = delete;             ///< one per process
    World& operator=(const World&) = delete;  ///< one per process

    int rank() const { return rank_; }  ///< this process's rank, 0 … size() − 1
    int size() const { return size_; }  ///< the number of ranks
    /// The ranks of this job on this machine (they share its CPUs).
    int local_size() const { return local_size_; }

    /// Gives this rank its share of the machine's CPUs as the library's threads (the CPUs
    /// this process may use over the ranks on this machine, at least one), unless
    /// `--threads` or OMP_NUM_THREADS chose already: four ranks of two threads each on two
    /// cores would spend their time waiting for each other.
    void share_cpus() const;

    /// Sends this rank's standard output to /dev/null unless it is rank 0, so that a job
    /// prints what one process would. Standard error stays: a rank's own error is its own.
    void quiet_unless_rank0() const;

private:
    int rank_ = 0, size_ = 1, local_size_ = 1;
};

/// An error that every rank of the job raised together, agreed on by
/// run_on_every_rank(): the text is the first failing rank's, the same in every rank.
class JobError : public std::runtime_error {
public:
    /// @param what the first failing rank's message @param rank that rank
    /// @param host the name of the machine that rank runs on
    /// @param every_rank whether the work threw in every rank (a finding about the whole job,
    /// such as ranks that differ, rather than one rank's problem)
    JobError(const std::string& what, int rank, std::string host = "", bool every_rank = false)
        : std::runtime_error(what), rank_(rank), host_(std::move(host)), every_rank_(every_rank) {}
    /// The lowest rank whose work threw.
    int rank() const { return rank_; }
    /// The machine it runs on (MPI_Get_processor_name).
    const std::string& host() const { return host_; }
    /// Whether it threw in every rank.
    bool every_rank() const { return every_rank_; }

private:
    int rank_;
    std::string host_;
    bool every_rank_;
};

/// Runs `work` in every rank (each calls it) and agrees on how it went: if it threw in any
/// rank, it throws JobError in every rank with the lowest failing rank's message, so that a
/// problem one host has (a missing file, a corpus that differs) stops the whole job in one
/// line instead of leaving the others waiting for it.
/// @param work what every rank does, typically its setup
void run_on_every_rank(const std::function<void()>& work);

/// Ends every rank of the job at once with `status` (MPI_Abort): for an error in one rank
/// while the others may be waiting for it inside a collective call.
/// @param status the exit status mpirun reports
[[noreturn]] void abort_job(int status);

/// Seconds of wall clock since an arbitrary start (MPI_Wtime).
double wall_seconds();

/// Seconds of CPU time this process has used, all its threads together: unlike the wall
/// clock, it does not grow while another rank has the core.
double cpu_seconds();

/// The most memory this process has held in RAM (its peak resident set, VmHWM) since it
/// started or since reset_peak_resident(), in bytes.
std::size_t peak_resident_bytes();

/// Starts the peak of peak_resident_bytes() again from the memory held now (Linux's
/// /proc/self/clear_refs), so that the peak of one part of a program can be measured.
/// @return false where the system does not allow it (the peak then goes on from the start)
bool reset_peak_resident();

/// The memory this process holds in RAM now (its resident set), in bytes.
std::size_t resident_bytes();

}  // namespace attn::mpi
