// Attention without the causal mask (GPTConfig::causal = false): the model lesson 08 trains
// to show why the mask is needed.
#include "attn/checkpoint.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"

#include "attn/gradcheck.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>

using namespace attn;

TEST_CASE("unmasked attention's rows cover every position and its backward agrees with finite differences") {
    const int B = 2, T = 5, C = 8, NH = 2;
    Rng rng(4);
    std::vector<float> qkv = normal_vector(rng, B * T * 3 * C);
    std::vector<float> out(B * T * C), att(B * NH * T * T), scratch(att.size());  // (B, NH, T, T)
    std::vector<float> w = normal_vector(rng, out.size());
    attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, B, T, C, NH, false);
    // Row 0 of head 0 now spreads over all T positions (a softmax of random scores is never 0).
    for (int j = 0; j < T; ++j) CHECK(att[j] > 0.0f);
    std::vector<float> dqkv(qkv.size(), 0.0f);
    attention_backward(dqkv.data(), scratch.data(), w.data(), qkv.data(), att.data(), nullptr, 0.0f,
                       B, T, C, NH, false);
    // h = 1e-2 and 1e-3: the tolerance argument of test_gpt_layers.cpp, the same sizes.
    const auto r = finite_difference(qkv.data(), dqkv.data(), dqkv.size(), 1e-2f, [&] {
        attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, B, T, C, NH, false);
        return weighted_sum(out, w);
    });
    CHECK(r.max_abs_error <= 1e-3);
    CHECK(r.max_abs_grad > 1e-3);
}

TEST_CASE("without the mask an early position's output depends on later tokens, and a checkpoint keeps the setting") {
    GPTConfig config;
    config.vocab_size = 7;
    config.block_size = 6;
    config.n_layer = 1;
    config.n_head = 2;
    config.n_embd = 8;
    config.causal = false;
    GPT model(config, 1);
    std::vector<int> a{1, 2, 3, 4, 5, 6}, b{1, 2, 3, 4, 5, 0};  // differ in the last token only
    model.forward(a, {}, 1, 6);
    const std::vector<float> first_a(model.logits().begin(), model.logits().begin() + 7);
    model.forward(b, {}, 1, 6);
    const std::vector<float> first_b(model.logits().begin(), model.logits().begin() + 7);
    CHECK(first_a != first_b);  // position 0 saw position 5: it can read the answer

    const auto dir = attn_test::scratch("attn_unmasked");
    save_checkpoint(dir, model, {});
    CHECK_FALSE(load_config(dir).causal);
    std::filesystem::remove_all(dir);
}
