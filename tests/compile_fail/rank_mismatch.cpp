// Must NOT compile: a Tensor3 passed where matmul_transposed takes a Tensor2 (line 6). xtensor
// would convert it and fail at run time with a made-up shape; attn/linalg.hpp deletes the
// overload that matches, so the compiler names this line.
#include "attn/linalg.hpp"

attn::Tensor2 scores(const attn::Tensor2& q, const attn::Tensor3& k3) { return attn::matmul_transposed(q, k3); }
