// A folder of the test process's own for the files a test writes: made with mkdtemp under
// the temp directory on first use (attn_tests_XXXXXX, a name no other process has), removed
// with everything in it when the process ends. Two copies of the suite running side by side,
// or the same test case run twice at once, never share a file.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

namespace attn_test {

class ScratchFolder {
public:
    ScratchFolder() {
        std::string pattern = (std::filesystem::temp_directory_path() / "attn_tests_XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) {
            throw std::runtime_error("cannot make a scratch folder like " + pattern);
        }
        path_ = pattern;
    }
    ~ScratchFolder() {
        std::error_code ignored;
        std::filesystem::remove_all(path_, ignored);
    }
    ScratchFolder(const ScratchFolder&) = delete;
    ScratchFolder& operator=(const ScratchFolder&) = delete;
    const std::filesystem::path& path() const { return path_; }

private:
    std::filesystem::path path_;
};

// This process's scratch folder.
inline const std::filesystem::path& scratch_folder() {
    static const ScratchFolder folder;
    return folder.path();
}

// A path in it: scratch("ckpt") for a file or folder the test makes there.
inline std::filesystem::path scratch(const std::string& name) { return scratch_folder() / name; }

}  // namespace attn_test
