#include "attn/lesson.hpp"

#include <exception>
#include <iostream>
#include <string_view>

namespace attn {

int run_lesson(int argc, char** argv, const std::string& title,
               const std::function<void(const LessonOptions&)>& body) {
    const std::string program = std::filesystem::path(argv[0]).filename().string();
    LessonOptions options;
    for (int i = 1; i < argc; ++i) {
        const std::string_view arg = argv[i];
        if (arg == "--help" || arg == "-h") {
            std::cout << title << "\n\nusage: " << program << " [--figures DIR]\n"
                      << "  --figures DIR  also write the lesson's pictures (PNG) into DIR\n";
            return 0;
        }
        if (arg == "--figures" && i + 1 < argc) {
            options.figures = argv[++i];
        } else {
            std::cerr << program << ": unknown option '" << arg
                      << "' (usage: " << program << " [--figures DIR])\n";
            return 2;
        }
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

}  // namespace attn
