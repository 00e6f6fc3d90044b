#include "attn/lesson.hpp"

#include "attn/data.hpp"
#include "attn/threads.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <iostream>
#include <string_view>

namespace attn {

int run_lesson(int argc, char** argv, const std::string& title,
               const std::function<void(const LessonOptions&)>& body, LessonText text) {
    const std::string program = std::filesystem::path(argv[0]).filename().string();
    LessonOptions options;
    const bool reads_text = text == LessonText::corpus;
    const std::string usage = "usage: " + program + " [--figures DIR] [--full | --quick]" +
                              (reads_text ? " [--data FILE]" : "") + " [--threads N] [--threads-info]";
    bool threads_info = false;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            std::cout << title << "\n\n" << usage << "\n"
                      << "  --figures DIR   also write the lesson's pictures (PNG) into DIR\n"
                      << "  --full          the full experiment, where the lesson runs a short one\n"
                      << "  --quick         the smallest run through every step (for testing; its\n"
                      << "                  numbers mean nothing)\n"
                      << (reads_text ? "  --data FILE     train and evaluate on FILE, a UTF-8 text (default: tiny\n"
                                       "                  shakespeare, data/tinyshakespeare.txt)\n"
                                     : "")
                      << "  --threads N     CPU threads for the library (default: OMP_NUM_THREADS,\n"
                      << "                  else every CPU this process may use)\n"
                      << "  --threads-info  print the thread settings in force and exit\n";
            return 0;
        }
        if ((arg == "--figures" || arg == "--threads" || arg == "--data") && i + 1 == argc) {
            std::cerr << program << ": " << arg << " expects a value (" << usage << ")\n";
            return 2;
        }
        if (arg == "--figures" && i + 1 < argc) {
            options.figures = argv[++i];
        } else if (arg == "--threads" && i + 1 < argc) {
            char* end = nullptr;
            const long n = std::strtol(argv[++i], &end, 10);
            if (*end != '\0' || n < 1 || n > 4096) {
                std::cerr << program << ": --threads expects a whole number of at least 1, got '"
                          << argv[i] << "'\n";
                return 2;
            }
            set_num_threads(static_cast<int>(n), "--threads");
        } else if (arg == "--full") {
            options.full = true;
        } else if (arg == "--quick") {
            options.quick = true;
        } else if (arg == "--data" && i + 1 < argc) {
            if (!reads_text) {
                std::cerr << program << ": --data: this lesson reads no text (--data is for the "
                                        "lessons that train or evaluate on one)\n";
                return 2;
            }
            options.data = argv[++i];
        } else if (arg == "--threads-info") {
            threads_info = true;
        } else {
            std::cerr << program << ": unknown option '" << arg << "' (" << usage << ")\n";
            return 2;
        }
    }
    if (options.full && options.quick) {
        std::cerr << program << ": --full and --quick ask for opposite things: give one\n";
        return 2;
    }
    if (threads_info) {
        std::cout << describe_threads() << "\n";
        return 0;
    }
    try {
        if (!options.figures.empty()) std::filesystem::create_directories(options.figures);
        body(options);
        std::cout.flush();
        return 0;
    } catch (const std::exception& e) {
        std::cout.flush();
        std::cerr << program << ": error: " << e.what() << "\n";
        return 1;
    }
}

std::filesystem::path LessonOptions::corpus() const { return data.empty() ? course_corpus() : data; }

void print_claim(const std::string& name, const std::string& value) {
    bool ok = !name.empty();
    for (char c : name) ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_');
    if (!ok) {
        throw std::invalid_argument("print_claim: the name '" + name +
                                    "' must be letters, digits and underscores");
    }
    std::cout << "claim " << name << " = " << value << "\n";
}

void print_claim(const std::string& name, double value, int decimals) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
    print_claim(name, std::string(buf));
}

}  // namespace attn
