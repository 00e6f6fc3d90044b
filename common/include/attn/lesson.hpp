/// @file lesson.hpp
/// @brief What every lesson program shares: its command line and its error handling.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace attn {

/// The options every lesson program accepts.
struct LessonOptions {
    /// Where the lesson writes its pictures (PNG); empty when none were asked for.
    std::filesystem::path figures;
    /// `--full`: run the full experiment where a lesson runs a shorter one by default.
    bool full = false;
};

/// Runs a lesson's body: parses `--figures DIR`, `--threads N` (attn/threads.hpp),
/// `--threads-info` and `--help`, and turns any exception into
/// one line on stderr and exit status 1 (bad flags: status 2), so a learner never sees a
/// crash or a stack of templates.
///
/// @param argc   the program's argument count, from main
/// @param argv   the program's arguments, from main
/// @param title  the lesson's title, for `--help`
/// @param body   the lesson itself
/// @return the process exit status
int run_lesson(int argc, char** argv, const std::string& title,
               const std::function<void(const LessonOptions&)>& body);

}  // namespace attn
