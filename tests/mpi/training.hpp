// What the MPI training tests share: a corpus made on every host alike, a run of steps and
// what it left, and the comparisons of two runs.
#pragma once

#include "mpi_test.hpp"

#include "attn/random.hpp"
#include "attn/trainer.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace mpi_test {

// Words of a small alphabet, deterministic: no file to read on any host.
inline std::string generated_text() {
    attn::Rng rng(2019);
    const std::string letters = "abcdefghijklmnopqrstuvwxyz";
    std::string text = "to be, or not to be.\n";
    while (text.size() < 20000) {
        const std::uint64_t n = 1 + rng.below(7);
        for (std::uint64_t i = 0; i < n; ++i) text += letters[rng.below(letters.size())];
        text += rng.below(6) == 0 ? ".\n" : " ";
    }
    return text;
}

// The tiny recipe shortened to `steps`, with a batch of `batch` sequences (one the tests' rank
// counts share evenly), evaluated halfway and at the end.
inline attn::TrainConfig tiny_recipe(int batch, int steps, float dropout) {
    attn::TrainConfig c = attn::TrainConfig::named("tiny");
    c.batch_size = batch;
    c.shorten_to(steps);
    c.warmup_iters = 2;
    c.eval_interval = steps / 2;
    c.eval_iters = 2;
    c.dropout = dropout;
    return c;
}

struct Run {
    std::vector<float> losses, norms;
    std::vector<float> weights;
    attn::EvalRecord eval;
};

inline Run train(attn::Trainer& t, int steps) {
    Run r;
    for (int i = 0; i < steps; ++i) {
        const attn::StepRecord s = t.train_step();
        r.losses.push_back(s.loss);
        r.norms.push_back(s.grad_norm);
    }
    r.weights = t.whole_parameters();  // ZeRO stage 3's shards gathered: every rank calls this
    r.eval = t.evaluate();
    return r;
}

// The largest relative difference of two sequences of numbers.
inline double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
    const mpi_test::Difference d = difference(a.data(), b.data(), a.size());
    return a.size() != b.size() ? INFINITY : d.max_abs / std::max(d.scale, 1e-30);
}

// Every rank holds the same weights, bit for bit: the same AdamW step everywhere.
inline bool same_on_every_rank(const std::vector<float>& weights) {
    unsigned long long h = 1469598103934665603ull;
    const auto* p = reinterpret_cast<const unsigned char*>(weights.data());
    for (std::size_t i = 0; i < weights.size() * sizeof(float); ++i) h = (h ^ p[i]) * 1099511628211ull;
    unsigned long long low = 0, high = 0;
    MPI_Allreduce(&h, &low, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&h, &high, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    return low == high;
}

// Checks (collectively) that a run's losses are the reference's within `tolerance`, relative.
inline void check_losses(Checks& checks, const std::vector<float>& losses, const std::vector<float>& reference,
                         double tolerance, const std::string& what) {
    const double gap = relative_gap(losses, reference);
    checks.check(gap <= tolerance, what, format("largest relative gap %.2e", gap));
}

// Checks (collectively) that a run is the reference run of one process within `tolerance`,
// relative: every step's loss and gradient norm, the weights at the end, and the evaluation's
// train and val losses.
inline void check_same_run(Checks& checks, const Run& run, const Run& reference, double tolerance,
                           const std::string& what) {
    const std::string steps = std::to_string(reference.losses.size()) + " steps";
    const double losses = relative_gap(run.losses, reference.losses);
    const double norms = relative_gap(run.norms, reference.norms);
    const double weights = relative_gap(run.weights, reference.weights);
    checks.check(losses <= tolerance && norms <= tolerance, what + ": " + steps + "' losses and gradient norms are one process's",
                 format("largest relative gap %.2e (losses), %.2e (norms)", losses, norms));
    checks.check(weights <= tolerance, what + ": the weights after " + steps + " are one process's",
                 format("largest gap %.2e of the largest weight", weights));
    checks.check(std::abs(run.eval.val_loss - reference.eval.val_loss) <= tolerance * reference.eval.val_loss &&
                     std::abs(run.eval.train_loss - reference.eval.train_loss) <= tolerance * reference.eval.train_loss,
                 what + ": the evaluation is one process's",
                 format("val %.7f against %.7f", run.eval.val_loss, reference.eval.val_loss) +
                     format(", train %.7f against %.7f", run.eval.train_loss, reference.eval.train_loss));
}

}  // namespace mpi_test
