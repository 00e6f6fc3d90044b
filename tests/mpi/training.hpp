// What the MPI training tests share: a corpus made on every host alike, and a scheme's run
// checked step by step against one process.
//
// How a run is compared. Two float32 runs that sum the same terms in other orders (the ranks'
// shares, the split matmuls, another BLAS kernel) drift apart: a weight whose gradient lies
// within rounding of zero can take AdamW's step of either sign, and the gap grows with the
// steps. No bound on a whole run's weights holds for every summation order, so each step is
// compared from the same state instead: before step t the scheme saves a checkpoint
// (Trainer::save gathers the whole state), rank 0 loads it into one process and takes one
// train_step there, the scheme takes its step, and the two are compared with bounds for one
// step, which do not grow with the steps:
//   - the loss and the gradient norm: the rounding of one pass (step_bounds.hpp);
//   - AdamW's moments m and v after the step: those of one process's gradients, moved by the
//     rounding of one backward pass (and scaled by the scheme's own clipping factor);
//   - the weights after the step: AdamW's update of the checkpoint's weights with the
//     scheme's own new moments, at one process's learning rate and step count, to the
//     rounding of the update alone. A gap of the moments is not amplified through 1/√v here:
//     the two checks together bound the weights as tightly as they can be bounded;
//   - the step and AdamW's step count: one process's, exactly;
//   - after the last step, the evaluation: one process's from the last checkpoint;
//   - a twin of the scheme that takes the same steps without checkpoints: the same losses,
//     norms and weights, bit for bit (a checkpoint only looks at the run).
// The scheme's state after step t is read back from its next checkpoint, so every step also
// proves that a checkpoint holds the whole state (weights, moments, step, batch position):
// one step from it in one process is the scheme's own next step.
#pragma once

#include "mpi_test.hpp"
#include "step_bounds.hpp"

#include "attn/random.hpp"
#include "attn/trainer.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <unistd.h>
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

// Takes `steps` steps, unchecked (a run that a checkpoint then continues).
inline void take_steps(attn::Trainer& t, int steps) {
    for (int i = 0; i < steps; ++i) t.train_step();
}

// A folder for the whole job's checkpoints, named by rank 0's process id (every rank calls it):
// in private_tmp.sh's folder in memory where it made one (a checkpoint at every step synced to
// a disk would double the tests' time), else in the temp folder.
inline std::filesystem::path job_folder(const std::string& name) {
    long long pid = static_cast<long long>(::getpid());
    MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    const char* scratch = std::getenv("ATTN_MPI_TEST_SCRATCH");
    const std::filesystem::path root =
        scratch && *scratch ? std::filesystem::path(scratch) : std::filesystem::temp_directory_path();
    return root / (name + "_" + std::to_string(n) + "_" + std::to_string(pid));
}

// The largest difference of two sequences of numbers, relative to the largest of the second.
inline double relative_gap(const std::vector<float>& a, const std::vector<float>& b) {
    const Difference d = difference(a.data(), b.data(), a.size());
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

namespace detail {

// One process's trainer from a checkpoint of the scheme (rank 0 calls it).
using LoadOne = std::function<attn::Trainer(const std::filesystem::path& checkpoint)>;

// The core of compare_steps() and compare_resumed(); `load_one` empty: Trainer::load.
inline StepGaps compare_steps_from(attn::Trainer& scheme, int steps, const std::filesystem::path& dir,
                                   const std::filesystem::path& from, attn::Trainer* unsaved,
                                   const LoadOne& load_one = {}) {
    const auto load = [&](const std::filesystem::path& checkpoint) {
        return load_one ? load_one(checkpoint) : attn::Trainer::load(checkpoint, scheme.data());
    };
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    const auto saved = [&](int t) { return dir / (t % 2 == 0 ? "a" : "b"); };
    std::filesystem::path start = from;
    if (start.empty()) {
        scheme.save(saved(0));
        start = saved(0);
    }
    StepGaps gaps;
    gaps.steps = steps;
    const SumChains chains = sum_chains(scheme.config(), scheme.data().vocab.size());
    std::optional<attn::Trainer> one;
    if (rank == 0) one.emplace(load(start));
    int same = 1;  // the unsaved twin's steps, bit for bit
    for (int t = 0; t < steps; ++t) {
        State before, ref;
        attn::StepRecord r;
        std::vector<float> g;
        if (rank == 0) {
            before = state_of(*one);
            r = one->train_step();
            g = one->model().gradients();  // after clipping: AdamW's input
            ref = state_of(*one);
        }
        const attn::StepRecord s = scheme.train_step();
        if (unsaved) {
            const attn::StepRecord x = unsaved->train_step();
            if (std::memcmp(&x.loss, &s.loss, sizeof s.loss) != 0 ||
                std::memcmp(&x.grad_norm, &s.grad_norm, sizeof s.grad_norm) != 0) {
                if (same) gaps.twin = "step " + std::to_string(s.step) + format(": loss %.9g, norm %.9g", x.loss, x.grad_norm) +
                                      format(" without checkpoints, %.9g, %.9g with", s.loss, s.grad_norm);
                same = 0;
            }
        }
        scheme.save(saved(t + 1));
        if (rank == 0) {
            attn::Trainer next = load(saved(t + 1));
            compare_step(gaps, static_cast<int>(before.step), before, r, g, ref, s, state_of(next), *one, chains);
            one.emplace(std::move(next));
        }
    }
    if (unsaved) {
        // stage 3's shards gathered, a device's state pulled: every rank calls both
        const std::vector<float> with = scheme.whole_parameters(), without = unsaved->whole_parameters();
        if (with.size() != without.size() || std::memcmp(with.data(), without.data(), with.size() * sizeof(float)) != 0) {
            if (same) gaps.twin = "the weights after the last step";
            same = 0;
        }
        MPI_Allreduce(MPI_IN_PLACE, &same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        if (!same && gaps.twin.empty()) gaps.twin = "on another rank";
        gaps.twin_checked = true;
        gaps.twin_same = same == 1;
        const attn::EvalRecord e = scheme.evaluate();
        if (rank == 0) {
            // One process with the scheme's own settings, its evaluation batches (of batch_size
            // sequences) among them, where the steps were compared with another batch.
            std::optional<attn::Trainer> as_saved;
            if (load_one) as_saved.emplace(attn::Trainer::load(saved(steps), scheme.data()));
            const attn::EvalRecord x = (as_saved ? *as_saved : *one).evaluate();
            gaps.reference_eval = x;
            // Each split's loss: eval_iters batch means (each a forward pass) summed: a chain of
            // forward + eval_iters sums of positive terms, 2γ of the loss and its ½ulp.
            const double rel = 2 * gamma_of(chains.forward + double(scheme.config().eval_iters)) + unit_roundoff;
            const std::string at = format("val %.7f against %.7f", e.val_loss, x.val_loss) +
                                   format(", train %.7f against %.7f", e.train_loss, x.train_loss);
            gaps.eval.see(std::fabs(e.val_loss - x.val_loss), rel * x.val_loss, [&] { return at; });
            gaps.eval.see(std::fabs(e.train_loss - x.train_loss), rel * x.train_loss, [&] { return at; });
        }
    }
    return gaps;
}

}  // namespace detail

// Takes `steps` steps of `scheme` (a collective call: every rank of the scheme makes it),
// each compared on rank 0 with one process's step from the scheme's checkpoint before it
// (saved to `dir`/a and `dir`/b in turn), then evaluates it and compares that too. `unsaved`
// is the scheme's twin, started from the same state, which takes the same steps without
// checkpoints: a checkpoint only looks at the run, so the twin's losses, norms and weights
// must be the scheme's bit for bit (a fault that a save repairs, such as a device's step
// count kept only until the next pull, shows there).
inline StepGaps compare_steps(attn::Trainer& scheme, attn::Trainer& unsaved, int steps, const std::filesystem::path& dir) {
    return detail::compare_steps_from(scheme, steps, dir, {}, &unsaved);
}

// The same for a scheme of N micro-batches of B a step (TrainConfig::grad_accum), against one
// process that takes one batch of N·B a step from each checkpoint (as_one_batch).
inline StepGaps compare_steps_with_one_batch(attn::Trainer& scheme, attn::Trainer& unsaved, int steps,
                                             const std::filesystem::path& dir) {
    const attn::TextDataset& data = scheme.data();
    return detail::compare_steps_from(scheme, steps, dir, {}, &unsaved, [&dir, &data](const std::filesystem::path& c) {
        as_one_batch(c, dir / "one_batch");
        return attn::Trainer::load(dir / "one_batch", data);
    });
}

// The same for a scheme just loaded from the checkpoint `from`, which its first step starts
// from (so that step also checks that the scheme took the checkpoint's whole state); no
// evaluation.
inline StepGaps compare_resumed(attn::Trainer& scheme, int steps, const std::filesystem::path& dir,
                                const std::filesystem::path& from) {
    return detail::compare_steps_from(scheme, steps, dir, from, nullptr);
}

// The same for a scheme whose checkpoint one process resumes: the scheme saves its own first.
inline StepGaps compare_resumed(attn::Trainer& scheme, int steps, const std::filesystem::path& dir) {
    return detail::compare_steps_from(scheme, steps, dir, {}, nullptr);
}

// The ratios rank 0 found, on every rank (so that every rank's check agrees).
inline std::vector<double> shared_ratios(const StepGaps& g) {
    std::vector<double> r = {g.loss.ratio, g.norm.ratio,  g.m.ratio, g.v.ratio, g.weights.ratio,
                             g.eval.ratio, g.mismatches.empty() ? 0.0 : INFINITY};
    MPI_Bcast(r.data(), static_cast<int>(r.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    return r;
}

// Checks (collectively) a run compare_steps() made: every step's loss and norm, moments,
// weights and counts, and the evaluation.
inline void check_steps(Checks& checks, const StepGaps& g, const std::string& what) {
    const std::vector<double> r = shared_ratios(g);
    const std::string each = "each of " + std::to_string(g.steps) + " steps from one process's checkpoint";
    checks.check(r[0] <= 1 && r[1] <= 1, what + ": " + each + ": the loss and gradient norm are one process's",
                 worst("loss", g.loss) + "; " + worst("norm", g.norm));
    checks.check(r[2] <= 1 && r[3] <= 1, what + ": " + each + ": AdamW's moments are those of one process's gradients",
                 worst("m", g.m) + "; " + worst("v", g.v));
    std::string counts;
    for (const std::string& s : g.mismatches) counts += "; " + s;
    checks.check(r[4] <= 1 && r[6] <= 1,
                 what + ": " + each + ": the weights are AdamW's update with those moments, at one process's step",
                 worst("weights", g.weights) + counts);
    checks.check(r[5] <= 1, what + ": the evaluation is one process's from the last checkpoint", worst("evaluation", g.eval));
    if (g.twin_checked) {
        checks.check(g.twin_same, what + ": without the checkpoints, the same losses, norms and weights, bit for bit", g.twin);
    }
}

// Checks (collectively) in one line a run resumed from a checkpoint, compare_steps() with
// `from`: every comparison at once.
inline void check_resumed(Checks& checks, const StepGaps& g, const std::string& what) {
    const std::vector<double> r = shared_ratios(g);
    const bool ok = std::all_of(r.begin(), r.end(), [](double x) { return x <= 1; });
    std::string counts;
    for (const std::string& s : g.mismatches) counts += "; " + s;
    checks.check(ok, what, worst("loss", g.loss) + "; " + worst("norm", g.norm) + "; " + worst("m", g.m) + "; " +
                               worst("v", g.v) + "; " + worst("weights", g.weights) + counts);
}

}  // namespace mpi_test
