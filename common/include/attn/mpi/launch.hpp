/// @file launch.hpp
/// @brief Starting a program as N ranks on this machine through mpirun, and saying in one
/// line how the job ended (lesson 19: `train_gpt --ranks N`, and the lesson itself).
#pragma once

#include <string>
#include <vector>

namespace attn::mpi {

/// How to start the ranks.
struct LaunchOptions {
    int ranks = 2;  ///< N, processes on this machine (more than its cores is allowed)
    /// NAME=VALUE pairs set in every rank's environment (and nowhere else).
    std::vector<std::string> environment;
    /// Keep the ranks' standard output in LaunchResult::output instead of passing it on.
    bool capture_output = false;
    /// What the first Ctrl-C (SIGINT) or SIGTERM to this process does. Empty: mpirun is told
    /// to end the job (SIGTERM). Otherwise the ranks get SIGUSR1 (mpirun passes it on without
    /// ending them), which a program that handles it (attn::StopRequest) takes as a request
    /// to stop cleanly, and this line is printed. A second signal ends the job at once.
    std::string stop_line;
};

/// How a job ended.
struct LaunchResult {
    int status = 0;        ///< mpirun's exit status: 0 when every rank ended with 0
    int failed_rank = -1;  ///< the rank mpirun named as ended abnormally, or −1
    /// The signal that ended that rank (9: killed), or 0. A rank that ends by a signal
    /// cannot explain itself, so the launcher does; a rank that fails otherwise has printed
    /// its own line.
    int signal = 0;
    std::string output;    ///< the ranks' standard output, when captured
};

/// The mpirun this build found (Open MPI's), as a path.
std::string mpirun_path();

/// The options every launch gives mpirun on this machine: as many ranks as asked even on
/// fewer cores (`--oversubscribe`), ranks not pinned to a core (`--bind-to none`: two pinned
/// to one core would share it while another idles), and `--allow-run-as-root` when running
/// as root (as CI does).
/// @return the options, in the order mpirun takes them
std::vector<std::string> local_mpirun_options();

/// Runs `program args…` as `options.ranks` processes under mpirun on this machine and waits
/// for it. The ranks' standard error is passed on line by line; mpirun's own reports
/// (framed in dashed lines) are read for the rank and signal that ended the job instead.
/// Ctrl-C and SIGTERM reach mpirun, which stops the ranks.
/// @param program the program each rank runs (a path)
/// @param args its arguments
/// @param options ranks, environment, output
/// @return how it ended
/// @throws std::runtime_error when mpirun cannot be started
LaunchResult run_ranks(const std::string& program, const std::vector<std::string>& args,
                       const LaunchOptions& options);

/// One sentence on how a job that did not succeed ended, e.g. "rank 2 of 4 was killed
/// (signal 9, SIGKILL) and mpirun stopped the other ranks".
/// @param result the job's end @param ranks how many it had @return the sentence
std::string describe_end(const LaunchResult& result, int ranks);

/// This program's own path (/proc/self/exe), for a program that starts itself as ranks.
std::string this_program();

}  // namespace attn::mpi
