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

/// Prints `claim <name> = <value>`: a number the lesson's page quotes. The docs build puts
/// it in place of `@claim{name}` on the page, or checks it against `@claim{name=value}`
/// (cmake/fill_claims.cmake), so the page says what the program printed.
/// @param name letters, digits and underscores
/// @param value the text the page shows, e.g. "3.40" or "below"
/// @throws std::invalid_argument for an empty name or one with other characters
void print_claim(const std::string& name, const std::string& value);

/// print_claim() of a number with a fixed number of decimals: `print_claim("loss", 3.4, 2)`
/// prints `claim loss = 3.40`.
/// @param name as print_claim() @param value the number @param decimals digits after the point
void print_claim(const std::string& name, double value, int decimals);

}  // namespace attn
