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
//   - the loss and the gradient norm: the rounding of one pass (sum_chains below);
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
//
// The rounding of a pass is Higham's bound for sums regrouped, 2γ_n of the magnitudes summed,
// with n the terms of the longest chain of sums (sum_chains). The magnitudes are taken as the
// quantity's own scale: the loss for the loss (a mean of positive terms: exact), the norm for
// the norm, the largest gradient for every gradient (the estimate the single-pass gradient
// checks of these tests rest on). A worst case over every order, so it holds for any BLAS
// kernel. The gaps measured (OpenBLAS's Cooperlake, SkylakeX, Haswell and Sandybridge
// kernels) are under 5e-3 of it, and the wrong versions tried moved the checks by 2e2 to 1e6
// times their bounds.
#pragma once

#include "mpi_test.hpp"

#include "attn/random.hpp"
#include "attn/trainer.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
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

// ---------------------------------------------------------------------------------------
// The bounds of one step.

constexpr double unit_roundoff = 0x1p-24;  // u, float32
// Higham's γ_n = n·u/(1 − n·u): a sum of n terms in float32, in any order, is within γ_{n−1}
// of Σ|terms| of the exact sum, so two orders differ by at most 2γ_n of it; a chain of sums
// of n₁, n₂, … terms (each one's result a term of the next) is within γ_{n₁+n₂+…} (Higham,
// Lemma 3.3).
inline double gamma_of(double n) { return n * unit_roundoff / (1.0 - n * unit_roundoff); }

// The terms of the longest chain of sums in a training step of the GPT of `c` (vocabulary V),
// every one of which a scheme or a BLAS kernel may regroup.
struct SumChains {
    double forward;   // to the batch's mean loss
    double backward;  // to a weight's gradient: the forward pass to the probabilities, the
                      // backward pass down to the first block, the sum over the batch's rows
};
inline SumChains sum_chains(const attn::TrainConfig& c, std::size_t vocab) {
    const double V = static_cast<double>(vocab);
    const double C = c.n_embd, T = c.block_size, hs = C / c.n_head, L = c.n_layer;
    const double rows = static_cast<double>(c.batch_size) * c.block_size;
    // A block forward: LayerNorm's mean and variance (2C), a q, k or v (C), a score (hs), the
    // softmax's sum (T), the weighted values (T), c_proj (C), LayerNorm (2C), c_fc (C), the
    // MLP's c_proj (4C).
    const double block_forward = 2 * C + C + hs + T + T + C + 2 * C + C + 4 * C;
    // Then ln_f (2C), a logit (C), the softmax's sum (V).
    const double to_probabilities = L * block_forward + 2 * C + C + V;
    // A block backward: the MLP's c_proj's input gradient (C), c_fc's (4C), LayerNorm's two
    // sums (2C), c_proj's (C), the attention's (the values' T, the weights' hs, the softmax's
    // T, the queries' and keys' T each), q, k, v's (3C), LayerNorm's (2C); before the blocks
    // the logits' input gradient (V) and ln_f's (2C).
    const double block_backward = C + 4 * C + 2 * C + C + (T + hs + T + T + T) + 3 * C + 2 * C;
    return {to_probabilities + rows, to_probabilities + V + 2 * C + L * block_backward + rows};
}

// The largest gap/bound of one comparison over a run's steps, and where it was.
struct Worst {
    double ratio = 0.0;
    std::string where;
    // `at()` names the place (called only for a new worst).
    template <class Place>
    void see(double gap, double bound, Place&& at) {
        const double r = gap == 0.0 ? 0.0 : (std::isnan(gap) || bound <= 0.0) ? INFINITY : gap / bound;
        if (!(r <= ratio)) {
            ratio = std::isnan(r) ? INFINITY : r;
            where = at();
        }
    }
};

// What a run's steps left against one process's, on rank 0.
struct StepGaps {
    int steps = 0;
    Worst loss, norm, m, v, weights, eval;
    std::vector<std::string> mismatches;  // the step or AdamW's step count, exactly
    attn::EvalRecord reference_eval;      // one process's, from the last checkpoint
    bool twin_checked = false, twin_same = false;  // the run without checkpoints, bit for bit
    std::string twin;                              // where it first differed
};

namespace detail {

struct State {  // what a checkpoint holds that a step changes
    std::vector<float> weights, m, v;
    long count = 0;
    std::int64_t step = 0;
};
inline State state_of(attn::Trainer& t) {
    return {t.model().parameters(), t.optimizer().m, t.optimizer().v, t.optimizer().step_count, t.step()};
}

// clip_grad_norm()'s factor for a norm.
inline float clip_factor(float norm, float max_norm) {
    const float coef = max_norm / (norm + 1e-6f);
    return max_norm > 0.0f && std::isfinite(norm) && coef < 1.0f ? coef : 1.0f;
}

inline std::string element(const attn::ParameterInfo& p, std::size_t i) {
    return p.name + "[" + std::to_string(i - p.offset) + "]";
}

// Compares the scheme's step t (its record `s`, its state `after` read from its checkpoint)
// with one process's from the same state (`before`, its record `r`, its clipped gradients `g`
// and its state `ref`).
inline void compare_step(StepGaps& gaps, int t, const State& before, const attn::StepRecord& r,
                         const std::vector<float>& g, const State& ref, const attn::StepRecord& s,
                         const State& after, const attn::Trainer& one, const SumChains& chains) {
    const double u = unit_roundoff;
    const std::string at = "step " + std::to_string(t);
    if (after.step != ref.step || after.count != ref.count) {
        gaps.mismatches.push_back(at + ": step " + std::to_string(after.step) + ", AdamW's count " +
                                  std::to_string(after.count) + " (one process: " + std::to_string(ref.step) + ", " +
                                  std::to_string(ref.count) + ")");
    }
    if (after.weights.size() != ref.weights.size() || after.m.size() != ref.m.size() ||
        after.v.size() != ref.v.size() || before.m.size() != before.weights.size()) {
        gaps.mismatches.push_back(at + ": the checkpoint's buffers have other sizes");
        return;
    }
    // The loss: a chain of chains.forward sums, the batch's mean of positive row losses
    // last, so its magnitudes are the loss's own: 2γ of it, and the float result's ½ulp.
    gaps.loss.see(std::fabs(double(s.loss) - r.loss), (2 * gamma_of(chains.forward) + u) * std::fabs(r.loss),
                  [&] { return at + format(": %.8f against %.8f", s.loss, r.loss); });
    // The norm: every gradient within 2γ_backward of its magnitudes moves ‖g‖ by at most
    // 2γ_backward of the norm of the magnitudes, taken as ‖g‖'s own; its squares are summed in
    // double, and the float norm adds its ½ulp (u of it, for either side).
    gaps.norm.see(std::fabs(double(s.grad_norm) - r.grad_norm),
                  (2 * gamma_of(chains.backward) + 2 * u) * r.grad_norm,
                  [&] { return at + format(": %.8f against %.8f", s.grad_norm, r.grad_norm); });

    const attn::AdamW& opt = one.optimizer();
    const float max_norm = one.config().grad_clip > 0 ? one.config().grad_clip : INFINITY;
    // The scheme clips by its own norm's factor: its gradients are k times one process's
    // (before the gap below), k known from the two norms (the factor is the same float
    // arithmetic on both sides).
    const double k = double(clip_factor(s.grad_norm, max_norm)) / clip_factor(r.grad_norm, max_norm);
    double g_max = 0.0;
    for (float x : g) g_max = std::max(g_max, double(std::fabs(x)));
    // The scheme's clipped gradient x̃ against k·g: the unclipped ones differ by at most
    // 2γ_backward of their magnitudes, taken as the largest gradient's (the estimate the
    // single-pass gradient checks here rest on; clipping scales them all alike), and each
    // side's product with its factor rounds by u of it, a third u for the factor's own ulp:
    //   |x̃ − k·g| ≤ Δ = k·(2γ_backward·max|g|·(1 + 2u) + 3u·|g|).
    const double noise = k * 2 * gamma_of(chains.backward) * g_max * (1 + 2 * u);
    const double b1 = opt.beta1, b2 = opt.beta2;
    const double a1 = double(1.0f - opt.beta1), a2 = double(1.0f - opt.beta2);  // as optim.cpp rounds them
    // The update's constants, as optim.cpp computes them (the bias corrections in double).
    const float lr = static_cast<float>(r.lr);
    const double bc1 = 1.0 - std::pow(b1, double(ref.count)), bc2 = 1.0 - std::pow(b2, double(ref.count));
    const double step_size = static_cast<float>(lr / bc1);
    const double bc2_sqrt = static_cast<float>(std::sqrt(bc2));
    const double decayed = double(1.0f - lr * opt.weight_decay);
    for (const attn::ParameterInfo& p : one.model().parameter_table()) {
        const double decay = p.decay ? decayed : 1.0;
        for (std::size_t i = p.offset; i < p.offset + p.size; ++i) {
            const double m0 = before.m[i], v0 = before.v[i], x = k * g[i];
            const double delta = noise + 3 * u * std::fabs(x);
            // m = β₁m + (1 − β₁)x̃ moves by (1 − β₁)Δ; its two products and sum round by ≤ 3u
            // of the terms (checks/11's property).
            const double m_bound = a1 * delta + 3 * u * (b1 * std::fabs(m0) + a1 * (std::fabs(x) + delta));
            gaps.m.see(std::fabs(after.m[i] - (b1 * m0 + a1 * x)), m_bound, [&] { return at + ", " + element(p, i); });
            // v = β₂v + (1 − β₂)x̃² moves by (1 − β₂)·|x̃² − x²| ≤ (1 − β₂)Δ(2|x| + Δ); 3u of the
            // terms for its rounding.
            const double v_bound =
                a2 * delta * (2 * std::fabs(x) + delta) + 3 * u * (b2 * v0 + a2 * (std::fabs(x) + delta) * (std::fabs(x) + delta));
            gaps.v.see(std::fabs(after.v[i] - (b2 * v0 + a2 * x * x)), v_bound, [&] { return at + ", " + element(p, i); });
            // The update with the scheme's own moments: θ·decay − step_size·m/(√v/√bc₂ + ε).
            // Rounded: the decay's product (u), √, ÷√bc₂ and +ε (u each, all positive: 3u of the
            // denominator), the product with step_size and the quotient (u each), the
            // difference (u of |θ·decay| + |w|): 2u|θ·decay| + 6u|w|, one more u of each for
            // the products of (1 + u) factors.
            const double w = step_size * after.m[i] / (std::sqrt(double(after.v[i])) / bc2_sqrt + opt.eps);
            const double theta = before.weights[i] * decay;
            const double w_bound = 3 * u * std::fabs(theta) + 7 * u * std::fabs(w);
            gaps.weights.see(std::fabs(after.weights[i] - (theta - w)), w_bound, [&] {
                return at + ", " + element(p, i) + format(": %.9g against %.9g", after.weights[i], theta - w);
            });
        }
    }
}

}  // namespace detail

namespace detail {

// The core of compare_steps() and compare_resumed().
inline StepGaps compare_steps_from(attn::Trainer& scheme, int steps, const std::filesystem::path& dir,
                                   const std::filesystem::path& from, attn::Trainer* unsaved) {
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
    if (rank == 0) one.emplace(attn::Trainer::load(start, scheme.data()));
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
            attn::Trainer next = attn::Trainer::load(saved(t + 1), scheme.data());
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
            const attn::EvalRecord x = one->evaluate();
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

inline std::string worst(const char* name, const Worst& w) {
    return std::string(name) + format(" %.2g of its bound", w.ratio) + (w.where.empty() ? "" : " (" + w.where + ")");
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
