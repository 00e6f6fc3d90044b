/// @file head_fixtures.hpp
/// @brief The PyTorch reference cases for one head of attention (tests/fixtures/head),
/// written by tools/reference/make_head_fixtures.py, for the library's tests and the checks.
#pragma once

#include "attn/fixtures.hpp"
#include "attn/npy.hpp"
#include "attn/tensor.hpp"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace attn::check {

/// One reference case: PyTorch's head in evaluation mode on random weights and input.
struct HeadCase {
    std::string name;            ///< e.g. `b2_t5_c8_hs4_block8`
    std::size_t block_size = 0;  ///< the size the PyTorch head built its mask at
    Tensor2 w_key;               ///< (hs, C)
    Tensor2 w_query;             ///< (hs, C)
    Tensor2 w_value;             ///< (hs, C)
    Tensor3 x;                   ///< (B, T, C)
    Tensor3 weights;             ///< (B, T, T) PyTorch's attention weights
    Tensor3 out;                 ///< (B, T, hs) PyTorch's output
};

/// Every case listed in tests/fixtures/head/cases.txt, loaded.
inline std::vector<HeadCase> load_head_cases() {
    const std::filesystem::path dir = attn::fixtures_dir() / "head";
    std::ifstream list(dir / "cases.txt");
    if (!list) throw NpyError((dir / "cases.txt").string() + ": cannot read the list of cases");
    std::vector<HeadCase> cases;
    HeadCase c;
    std::size_t B = 0, T = 0, C = 0, hs = 0;
    while (list >> c.name >> B >> T >> C >> hs >> c.block_size) {
        c.w_key = load_npy<2>(dir / (c.name + "_key.npy"));
        c.w_query = load_npy<2>(dir / (c.name + "_query.npy"));
        c.w_value = load_npy<2>(dir / (c.name + "_value.npy"));
        c.x = load_npy<3>(dir / (c.name + "_x.npy"));
        c.weights = load_npy<3>(dir / (c.name + "_weights.npy"));
        c.out = load_npy<3>(dir / (c.name + "_out.npy"));
        cases.push_back(c);
    }
    return cases;
}

}  // namespace attn::check
