/// @file run_control.hpp
/// @brief What a long training run needs around the model: checkpoints written atomically,
/// a clean stop on Ctrl-C, and a progress line.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

namespace attn {

/// Writes a directory so that no kill, at any moment, loses it: `write` fills a temporary
/// directory beside `target` (`.NAME.tmp-PID`), whose files are then synced to disk, and
/// which then takes `target`'s place in one atomic exchange (renameat2's RENAME_EXCHANGE),
/// or, on a file system without it, by two renames (the old version stepped aside as
/// `.NAME.old-PID` first). If `write` throws, `target` is left as it was; if the process
/// dies, `target` holds the old or the new version, or recover_directory() puts one back.
/// Temporaries an earlier killed save left are cleaned here.
/// @param target  the directory to create or replace
/// @param write   fills the directory it is given
void write_directory_atomically(const std::filesystem::path& target,
                                const std::function<void(const std::filesystem::path&)>& write);

/// After a save was killed between its two renames (see write_directory_atomically), puts
/// the newest whole version it left back as `target`: the new one if it had been written
/// and synced, else the old one. Does nothing when `target` exists.
/// @param target the directory a save was writing
/// @return whether a version was put back
bool recover_directory(const std::filesystem::path& target);

/// Turns Ctrl-C (SIGINT), SIGTERM and SIGUSR1 (what a launcher of ranks sends them through
/// mpirun, mpi::LaunchOptions::stop_line) into a request to stop that a loop polls, so that
/// a training run can save a checkpoint and exit cleanly. A second signal stops at once.
/// StopRequests may nest: an inner one sees what the outermost has heard since it was made.
class StopRequest {
public:
    /// Installs the signal handlers; the destructor restores the previous ones.
    StopRequest();
    ~StopRequest();
    StopRequest(const StopRequest&) = delete;
    StopRequest& operator=(const StopRequest&) = delete;
    /// Whether a stop was asked for since construction.
    bool requested() const;
};

/// Formats one line of training progress: step, loss, learning rate, tokens per second and
/// the estimated time left. On a terminal the line rewrites itself in place.
class ProgressLine {
public:
    /// @param total_steps      the step count of the whole run, for the ETA
    /// @param tokens_per_step  B·T, for tokens per second
    ProgressLine(std::int64_t total_steps, std::int64_t tokens_per_step);
    /// Formats the line for `step` (0-based, just finished) with its loss and rate; the
    /// speed is measured since the previous call.
    std::string format(std::int64_t step, double loss, double lr);
    /// Tokens per second measured by the last call to format().
    double tokens_per_second() const { return tokens_per_second_; }

private:
    std::int64_t total_steps_, tokens_per_step_, last_step_ = -1;
    std::chrono::steady_clock::time_point last_time_;
    double tokens_per_second_ = 0.0;
};

/// Formats seconds as `1h02m`, `3m05s` or `42s`.
std::string format_duration(double seconds);

}  // namespace attn
