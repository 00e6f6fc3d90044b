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

/// Writes a directory so that it is never seen half-written: `write` fills a temporary
/// directory beside `target`, which then replaces `target` by renames. If `write` throws or
/// the process dies, `target` is left as it was.
/// @param target  the directory to create or replace
/// @param write   fills the directory it is given
void write_directory_atomically(const std::filesystem::path& target,
                                const std::function<void(const std::filesystem::path&)>& write);

/// Turns Ctrl-C (SIGINT) and SIGTERM into a request to stop that a loop polls, so that a
/// training run can save a checkpoint and exit cleanly. A second Ctrl-C stops at once.
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
