// What the GPT's comparisons with PyTorch share. A fixture directory, written by
// tools/reference/make_gpt_fixtures.py, make_position_fixtures.py or make_gqa_fixtures.py,
// holds weights/ (the weights format), x.npy and y.npy (B, T) token ids, logits.npy,
// loss.npy and grad/<parameter name>.npy; check_against_torch runs one forward and backward
// pass on its batch and checks all of them.
#pragma once

#include "attn/gpt.hpp"
#include "attn/npy.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

namespace attn::torch_parity {

namespace fs = std::filesystem;

// Tolerance of the PyTorch comparisons: both sides compute in float32 with sums in a
// different order (BLAS against PyTorch's kernels), so values of size O(1) differ by a few
// ulps, ~1e-7 to 1e-6. 1e-5 on logits, loss and gradients is llm.c's bar for its CPU trainer.
constexpr double parity_tol = 1e-5;

inline std::vector<int> load_ids(const fs::path& file) {
    const NpyArray a = read_npy(file);
    return std::vector<int>(a.data.begin(), a.data.end());
}

// The largest |actual − expected| over a tensor, or infinity if the sizes differ.
inline double max_abs_diff(const float* actual, const NpyArray& expected, std::size_t size) {
    if (expected.data.size() != size) return INFINITY;
    double worst = 0.0;
    for (std::size_t i = 0; i < size; ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(actual[i]) - expected.data[i]));
    }
    return worst;
}

struct Parity {
    int B = 0, T = 0;               // the fixture's batch
    float loss = 0.0f;              // ours
    double loss_diff = 0.0, logits_diff = 0.0, worst_gradient = 0.0;
    std::string worst_name;         // the parameter whose gradient differs most
};

// One forward pass (in evaluation mode) and backward pass of `model` on the fixture's batch;
// CHECKs the loss, the logits and every parameter's gradient against PyTorch's within `tol`.
inline Parity check_against_torch(GPT& model, const fs::path& dir, double tol = parity_tol) {
    Parity r;
    model.train(false);
    const std::vector<int> x = load_ids(dir / "x.npy"), y = load_ids(dir / "y.npy");
    const NpyArray xs = read_npy(dir / "x.npy");
    r.B = static_cast<int>(xs.shape[0]);
    r.T = static_cast<int>(xs.shape[1]);
    r.loss = model.forward(x, y, r.B, r.T);
    model.zero_grad();
    model.backward();
    r.loss_diff = std::fabs(r.loss - read_npy(dir / "loss.npy").data[0]);
    r.logits_diff =
        max_abs_diff(model.logits().data(), read_npy(dir / "logits.npy"), model.logits().size());
    CHECK(r.loss_diff <= tol);
    CHECK(r.logits_diff <= tol);
    for (const ParameterInfo& p : model.parameter_table()) {
        CAPTURE(p.name);
        const NpyArray expected = read_npy(dir / "grad" / (p.name + ".npy"));
        REQUIRE(expected.shape == p.shape);
        const double d = max_abs_diff(model.gradients().data() + p.offset, expected, p.size);
        CHECK(d <= tol);
        if (d >= r.worst_gradient) {
            r.worst_gradient = d;
            r.worst_name = p.name;
        }
    }
    return r;
}

}  // namespace attn::torch_parity
