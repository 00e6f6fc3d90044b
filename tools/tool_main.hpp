// The end of a tool's main(): its command line parsed, then its work run, each failure one
// line on stderr that starts with the tool's name, and the exit status the course's tools
// share: 0 done, 1 an error while working, 2 a bad command line.
#pragma once

#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>

namespace attn_tools {

constexpr int exit_error = 1, exit_usage = 2;

/// Parses `argc`/`argv` with `app`, then calls `check()` (further checks of the flags, which
/// throw CLI::ValidationError) and returns what `work()` returns. `--help` prints the help.
template <class Check, class Work>
int tool_main(const char* name, CLI::App& app, int argc, char** argv, Check check, Work work) {
    try {
        app.parse(argc, argv);
        check();
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::cerr << name << ": " << e.what() << " (see --help)\n";
        return exit_usage;
    }
    try {
        return work();
    } catch (const std::exception& e) {
        std::cout.flush();
        std::cerr << name << ": " << e.what() << "\n";
        return exit_error;
    }
}

}  // namespace attn_tools
