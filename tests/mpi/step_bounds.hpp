// The bounds of one training step against one process's from the same state: what the MPI
// training tests (training.hpp) and train_gpt with ranks (train_gpt_ranks_test.cpp) compare.
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

#include "format.hpp"

#include "attn/checkpoint.hpp"
#include "attn/gpt.hpp"
#include "attn/trainer.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace mpi_test {

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
// With gradient accumulation (c.grad_accum = N micro-batches of c.batch_size) the chains are
// those of one batch of N·batch_size: its sum over N·B·T rows is longer than the accumulated
// side's B·T rows and then N more. That side rounds twice more: each pass's loss over N on the
// logits' gradients (one batch divides once, by N·B·T) and each micro-batch's float loss
// before their mean, two more terms of either chain.
inline SumChains sum_chains(const attn::TrainConfig& c, std::size_t vocab) {
    const double V = static_cast<double>(vocab);
    const double C = c.n_embd, T = c.block_size, hs = C / c.n_head, L = c.n_layer;
    const double rows = static_cast<double>(c.batch_size) * c.grad_accum * c.block_size;
    const double accumulated = c.grad_accum > 1 ? 2 : 0;
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
    return {to_probabilities + rows + accumulated, to_probabilities + V + 2 * C + L * block_backward + rows + accumulated};
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
    //
    // In bfloat16 the products' inputs are rounded to 8 bits. Where the two sides' float32
    // values differ in their last bits (an OpenBLAS kernel may give a row other last bits
    // when the rows beside it differ), the two roundings can land one bfloat16 ulp apart,
    // 2^-7 of the value, on each input of a product: 2^-6 of the product, taken here once
    // on the gradient's magnitude (first order, as the γ estimate above).
    const double flip = one.config().precision == attn::Precision::bf16 ? 0x1p-6 : 0.0;
    const double noise = k * (2 * gamma_of(chains.backward) + flip) * g_max * (1 + 2 * u);
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

// `from`, the checkpoint of a run of N micro-batches of B a step (TrainConfig::grad_accum), as
// the checkpoint of the same run taking one batch of N·B a step (the same weights, moments,
// step and batch source: the batches' sequences are the same), written to `to`.
inline void as_one_batch(const std::filesystem::path& from, const std::filesystem::path& to) {
    std::filesystem::remove_all(to);
    std::filesystem::copy(from, to, std::filesystem::copy_options::recursive);
    nlohmann::json j;
    std::ifstream(to / "trainer.json") >> j;
    nlohmann::json& c = j.at("config");
    c["batch_size"] = c.at("batch_size").get<int>() * c.at("grad_accum").get<int>();
    c["grad_accum"] = 1;
    std::ofstream(to / "trainer.json") << j.dump(2);
    // a checkpoint of its own, so its files' checksums are written again
    attn::write_checksums(to);
}

inline std::string worst(const char* name, const Worst& w) {
    return std::string(name) + format(" %.2g of its bound", w.ratio) + (w.where.empty() ? "" : " (" + w.where + ")");
}

}  // namespace mpi_test
