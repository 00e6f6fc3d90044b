#include "attn/fixtures.hpp"

namespace attn {

const std::filesystem::path& fixtures_dir() {
    static const std::filesystem::path dir(ATTN_FIXTURES_DIR);
    return dir;
}

}  // namespace attn
