// The model's passes split the batch between threads: the numbers must not depend on it.
#include "attn/gpt.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

using namespace attn;

namespace {
struct StepResult {
    float loss;
    std::vector<float> logits, grads;
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
    return {loss, model.logits(), model.gradients()};
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
        CHECK(worst_logit <= 1e-6);
        CHECK(std::fabs(many.loss - one.loss) <= 1e-6);
        // The parameter gradients are sums over the sequences, added slice by slice: the order
        // of additions differs too, a few float roundings of values of order 1e-2 to 1.
        REQUIRE(many.grads.size() == one.grads.size());
        double worst = 0.0;
        for (std::size_t i = 0; i < one.grads.size(); ++i) {
            worst = std::max(worst, static_cast<double>(std::fabs(many.grads[i] - one.grads[i])));
        }
        MESSAGE(threads << " threads: max |grad - grad with 1 thread| = " << worst);
        CHECK(worst <= 1e-6);
    }
}
