#pragma once
/// @file
/// Where the committed reference fixtures live (tests/fixtures of this checkout).

#include <filesystem>

namespace attn {

/// The folder `tests/fixtures` of the checkout the programs were built from. It is compiled
/// into one small file only (fixtures.cpp), so that the other files' compile lines are the
/// same in every clone and a compiler cache shares their objects between clones.
const std::filesystem::path& fixtures_dir();

}  // namespace attn
