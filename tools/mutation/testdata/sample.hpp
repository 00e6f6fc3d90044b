// A small solution for the mutation tool's own test (tools/mutation/test_mutate.py): one of
// each construct the operators rewrite, on plain types, so that each mutant can be built on
// its own in a second or so and compared with the schema's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace exercise {
struct Range {
    std::size_t begin, end;
};
double mean_checked(const std::vector<float>& x, float bound);
float softmax_top(const std::vector<float>& s, bool causal);
Range part_of(std::size_t n, int rank, int ranks);
void axpy(std::vector<float>& y, const std::vector<float>& x, float a);
int clamp_index(int i, int n);
float pick(const std::vector<float>& m, int rows, int r, int c);
}  // namespace exercise
