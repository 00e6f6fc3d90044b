// Looking inside a GPT: attention weights and queries read back from the forward pass, the
// previous-token detector and switching a head off.
#include "attn/gpt_inspect.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <vector>

using namespace attn;

namespace {

GPTConfig small_config() {
    GPTConfig c;
    c.vocab_size = 11;
    c.block_size = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 16;
    c.bias = false;
    return c;
}

const std::vector<int> tokens = {1, 5, 2, 9, 3, 3, 7, 0, 4, 10, 6, 8, 2, 2, 1, 5};  // (2, 8)

}  // namespace

TEST_CASE("the attention weights read back are causal rows that sum to one") {
    GPT model(small_config(), 3);
    CHECK_THROWS_AS(attention_weights(model, 0), std::invalid_argument);  // no forward yet
    model.forward(tokens, {}, 2, 8);
    const Tensor4 w = attention_weights(model, 1);
    REQUIRE(w.shape() == std::array<std::size_t, 4>{2, 2, 8, 8});
    for (std::size_t b = 0; b < 2; ++b)
        for (std::size_t h = 0; h < 2; ++h)
            for (std::size_t i = 0; i < 8; ++i) {
                double sum = 0.0;
                for (std::size_t j = 0; j < 8; ++j) {
                    sum += w(b, h, i, j);
                    if (j > i) CHECK(w(b, h, i, j) == 0.0f);
                }
                CHECK(sum == doctest::Approx(1.0).epsilon(1e-6));
            }
    CHECK_THROWS_AS(attention_weights(model, 2), std::invalid_argument);
    CHECK_THROWS_AS(attention_queries_or_keys(model, 0, 2), std::invalid_argument);
}

TEST_CASE("the weights are the softmax of the queries and keys read back, scaled by 1/sqrt(hs)") {
    GPT model(small_config(), 3);
    model.forward(tokens, {}, 2, 8);
    const Tensor4 q = attention_queries_or_keys(model, 0, 0), k = attention_queries_or_keys(model, 0, 1);
    const Tensor4 w = attention_weights(model, 0);
    // Row 5 of batch 1, head 1, recomputed by hand in double.
    const std::size_t b = 1, h = 1, i = 5, hs = 8;
    std::vector<double> s(i + 1);
    double mx = -1e30, z = 0.0;
    for (std::size_t j = 0; j <= i; ++j) {
        double dot = 0.0;
        for (std::size_t c = 0; c < hs; ++c) dot += double(q(b, h, i, c)) * k(b, h, j, c);
        s[j] = dot / std::sqrt(double(hs));
        mx = std::max(mx, s[j]);
    }
    for (double& x : s) z += (x = std::exp(x - mx));
    for (std::size_t j = 0; j <= i; ++j) CHECK(w(b, h, i, j) == doctest::Approx(s[j] / z).epsilon(1e-5));
}

TEST_CASE("the previous-token weight averages w[i, i-1] over the batch and positions") {
    Tensor4 w = xt::zeros<float>({1, 2, 3, 3});
    // head 0 always looks at the previous token; head 1 at the first token.
    w(0, 0, 0, 0) = 1; w(0, 0, 1, 0) = 1; w(0, 0, 2, 1) = 1;
    w(0, 1, 0, 0) = 1; w(0, 1, 1, 0) = 1; w(0, 1, 2, 0) = 1;
    const Tensor1 p = previous_token_weight(w);
    CHECK(p(0) == doctest::Approx(1.0));
    CHECK(p(1) == doctest::Approx(0.5));  // rows 1 and 2: 1 and 0
    CHECK_THROWS_AS(previous_token_weight(Tensor4(xt::zeros<float>({1, 1, 1, 1}))), std::invalid_argument);
}

TEST_CASE("a head switched off no longer reaches the output, and the other head still does") {
    const GPTConfig config = small_config();
    const int C = config.n_embd, hs = C / config.n_head;
    GPT model(config, 3);
    zero_head(model, 0, 1);
    model.forward(tokens, {}, 2, 8);
    const std::vector<float> before = model.logits();
    // Change the value weights (rows 2C..3C of c_attn) of head 1, then of head 0, in layer 0.
    const auto perturb_values_of = [&](int head) {
        for (int row = 2 * C + head * hs; row < 2 * C + (head + 1) * hs; ++row)
            for (int c = 0; c < C; ++c) model.params().qkvw[row * C + c] += 0.5f;
        model.forward(tokens, {}, 2, 8);
        return model.logits();
    };
    CHECK(perturb_values_of(1) == before);  // head 1's values: switched off, nothing changes
    CHECK(perturb_values_of(0) != before);  // head 0's values: still on
    CHECK_THROWS_AS(zero_head(model, 0, 2), std::invalid_argument);
    CHECK_THROWS_AS(zero_head(model, -1, 0), std::invalid_argument);
}
