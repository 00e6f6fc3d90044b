// The model's passes split the batch between threads: the numbers must not depend on it.
#include "attn/gpt.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

using namespace attn;

namespace {
struct StepResult {
    float loss;
    std::vector<float> logits, grads;
    double logit_terms;  // max over (position, token) of Σ_c |lnf_c wte_c|, the logits' sums
};

StepResult step_with_threads(int threads, const std::vector<int>& x, const std::vector<int>& y,
                             int B, int T) {
    const int before = num_threads();
    set_num_threads(threads);
    GPTConfig config;
    config.vocab_size = 11;
    config.block_size = 8;
    config.n_layer = 2;
    config.n_head = 2;
    config.n_embd = 16;
    GPT model(config, 3);
    const float loss = model.forward(x, y, B, T);
    model.zero_grad();
    model.backward();
    set_num_threads(before);
    const std::vector<float>& lnf = model.activations().lnf;
    const float* wte = model.params().wte;
    const int C = config.n_embd, V = config.vocab_size;
    double terms = 0.0;
    for (std::size_t n = 0; n < static_cast<std::size_t>(B) * T; ++n) {
        for (int v = 0; v < V; ++v) {
            double sum = 0.0;
            for (int c = 0; c < C; ++c)
                sum += std::fabs(static_cast<double>(lnf[n * C + c]) * wte[v * C + c]);
            terms = std::max(terms, sum);
        }
    }
    return {loss, model.logits(), model.gradients(), terms};
}
}  // namespace

TEST_CASE("loss, logits and gradients agree to rounding with 1, 2 and 3 threads") {
    const int B = 5, T = 8;  // 5 sequences: one slice of 5, then 2 + 3, then 1 + 2 + 2
    Rng rng(11);
    std::vector<int> x(B * T), y(B * T);
    for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<int>(rng.below(11));
        y[i] = static_cast<int>(rng.below(11));
    }
    const StepResult one = step_with_threads(1, x, y, B, T);
    for (int threads : {2, 3}) {
        CAPTURE(threads);
        const StepResult many = step_with_threads(threads, x, y, B, T);
        // Each sequence goes through the same operations on any thread, but OpenBLAS may pick
        // another kernel for a product with fewer rows, which sums in another order: a few
        // float roundings of logits of order 1.
        REQUIRE(many.logits.size() == one.logits.size());
        double worst_logit = 0.0;
        for (std::size_t i = 0; i < one.logits.size(); ++i) {
            worst_logit = std::max(
                worst_logit, static_cast<double>(std::fabs(many.logits[i] - one.logits[i])));
        }
        MESSAGE(threads << " threads: max |logit - logit with 1 thread| = " << worst_logit
                        << ", |loss - loss with 1 thread| = " << std::fabs(many.loss - one.loss));
        // The bound: two orders of an n-term sum differ by at most 2γ_n Σ|a_i b_i| (Higham,
        // γ_n = n u/(1 − n u), u = 2^-24). The logits' own product, n = C = 16, gives
        // 2γ_16 Σ_c |lnf_c wte_c|, computed from the data; each of the 6L = 12 products
        // before it (c_attn, q·k, P·v, c_proj, c_fc, mlp's c_proj per layer) can move the
        // logits about as much again, to first order (layer norm rescales the residual
        // stream, so their relative errors arrive as relative errors of lnf): 13 terms. The loss (mean of lse − logit_target) moves by at most
        // twice the largest logit's move, and rounds by u |loss| (~2.4e-7 at ln 11 ≈ 2.4).
        // A sequence run twice or skipped by a thread moves the logits by O(0.1).
        const double u = std::ldexp(1.0, -24), n = 16.0, two_gamma = 2.0 * n * u / (1.0 - n * u);
        const double logit_bound = 13.0 * two_gamma * one.logit_terms;
        CAPTURE(logit_bound);
        CHECK(worst_logit <= logit_bound);
        CHECK(std::fabs(many.loss - one.loss) <= 2.0 * logit_bound + 2.0 * u * std::fabs(one.loss));
        // The parameter gradients are sums over the sequences, added slice by slice: the order
        // of additions differs too, a few float roundings of values of order 1e-2 to 1: a
        // sum of N = B·T = 40 rows' terms differs by at most 2γ_40 ≈ 4.8e-6 of Σ|terms|, so
        // 1e-6 holds while Σ|terms| ≤ 0.2 (not computed here: the per-row terms are not
        // kept; the differences seen are ~3e-8, and a slice added twice moves them by O(1e-2)).
        REQUIRE(many.grads.size() == one.grads.size());
        double worst = 0.0;
        for (std::size_t i = 0; i < one.grads.size(); ++i) {
            worst = std::max(worst, static_cast<double>(std::fabs(many.grads[i] - one.grads[i])));
        }
        MESSAGE(threads << " threads: max |grad - grad with 1 thread| = " << worst);
        CHECK(worst <= 1e-6);
    }
}
