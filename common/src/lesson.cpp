#include "attn/lesson.hpp"

#include <cctype>
#include <cstdio>
#include <exception>
#include <stdexcept>
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
