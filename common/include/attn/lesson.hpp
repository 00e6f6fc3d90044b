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
    /// `--quick`: the smallest run that still goes through every step of the lesson (a few
    /// training steps, short texts), for the test suite's sanitizer pass; its numbers mean
    /// nothing.
    bool quick = false;
    /// `--data FILE`: the text the lesson trains or evaluates on; empty for the course's
    /// corpus (tiny shakespeare).
    std::filesystem::path data;

    /// The corpus to read: `--data FILE`, else tiny shakespeare (attn::course_corpus()).
    std::filesystem::path corpus() const;
};

/// Whether a lesson reads a text: the lessons that train or evaluate a language model read
/// one (tiny shakespeare, or `--data FILE`); the others refuse `--data`.
enum class LessonText { none, corpus };

/// Runs a lesson's body: parses `--figures DIR`, `--full`, `--quick`, `--data FILE`,
/// `--threads N` (attn/threads.hpp), `--threads-info` and `--help`, and turns any exception into
/// one line on stderr and exit status 1 (bad flags: status 2), so a learner never sees a
/// crash or a stack of templates.
///
/// @param argc   the program's argument count, from main
/// @param argv   the program's arguments, from main
/// @param title  the lesson's title, for `--help`
/// @param body   the lesson itself
/// @param text   LessonText::corpus for a lesson that reads a text: it accepts `--data FILE`
/// @return the process exit status
int run_lesson(int argc, char** argv, const std::string& title,
               const std::function<void(const LessonOptions&)>& body,
               LessonText text = LessonText::none);

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
