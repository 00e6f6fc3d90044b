// The encoder–decoder of encoder_decoder.hpp: against PyTorch's nn.Transformer
// (tools/reference/make_cross_attention_fixtures.py), against finite differences, the
// padded-equals-alone rule, a context that is all padding, cached against uncached greedy
// decoding, and its checkpoints.
#include "attn/fixtures.hpp"
#include "attn/checkpoint.hpp"
#include "attn/encoder_decoder.hpp"
#include "attn/gradcheck.hpp"
#include "attn/npy.hpp"
#include "attn/threads.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;

namespace {

const fs::path fixture = attn::fixtures_dir() / "cross_attention" / "model";

std::vector<int> ids_of(const fs::path& file) {
    const NpyArray a = read_npy(file);
    return std::vector<int>(a.data.begin(), a.data.end());
}

EncoderDecoderConfig small_config() {
    EncoderDecoderConfig c;
    c.vocab_size = 12;
    c.max_source = 7;
    c.max_target = 6;
    c.n_encoder_layer = 2;
    c.n_decoder_layer = 2;
    c.n_head = 2;
    c.n_embd = 8;
    return c;
}

// A model whose weights are far from their N(0, 0.02) start, so that every nonlinearity and
// every greedy choice is decided by clear margins (norm weights around 1).
EncoderDecoder sharp_model(const EncoderDecoderConfig& c, std::uint64_t seed) {
    EncoderDecoder model(c, seed);
    Rng rng(seed + 1);
    for (float& w : model.parameters()) w += 0.3f * rng.normal();
    return model;
}

// Four sources of 7, 3, 5 and 1 tokens and targets of 2, 4, 1 and 3 characters.
std::vector<std::vector<int>> sources() { return {{3, 4, 5, 6, 7, 8, 9}, {10, 11, 3}, {5, 5, 6, 7, 4}, {9}}; }
std::vector<std::vector<int>> targets() { return {{4, 5}, {6, 7, 8, 9}, {10}, {11, 3, 4}}; }

}  // namespace

TEST_CASE("make_batch pads right, and the decoder reads bos + target and predicts target + eos") {
    const Seq2SeqBatch b = make_batch({{5, 6, 7}, {8}}, {{3}, {4, 9}});
    CHECK(b.B == 2);
    CHECK(b.S == 3);
    CHECK(b.T == 3);
    CHECK(b.source == std::vector<int>{5, 6, 7, 8, 0, 0});
    CHECK(b.source_lengths == std::vector<int>{3, 1});
    CHECK(b.target_in == std::vector<int>{1, 3, 0, 1, 4, 9});
    CHECK(b.target_out == std::vector<int>{3, 2, 0, 4, 9, 2});
    CHECK(b.target_lengths == std::vector<int>{2, 3});
    CHECK_THROWS_AS(make_batch({{5}}, {{3}, {4}}), std::invalid_argument);
    CHECK_THROWS_AS(make_batch({}, {}), std::invalid_argument);
}

TEST_CASE("the encoder-decoder matches PyTorch's nn.Transformer on a padded batch: logits, loss and every gradient") {
    Seq2SeqVocab vocab;
    EncoderDecoder model = load_encoder_decoder(fixture / "weights", vocab);
    Seq2SeqBatch b;
    const NpyArray src = read_npy(fixture / "source.npy"), tgt = read_npy(fixture / "target_in.npy");
    b.B = static_cast<int>(src.shape[0]);
    b.S = static_cast<int>(src.shape[1]);
    b.T = static_cast<int>(tgt.shape[1]);
    b.source = ids_of(fixture / "source.npy");
    b.source_lengths = ids_of(fixture / "source_lengths.npy");
    b.target_in = ids_of(fixture / "target_in.npy");
    b.target_out = ids_of(fixture / "target_out.npy");
    b.target_lengths = ids_of(fixture / "target_lengths.npy");
    const float loss = model.forward(b);
    model.zero_grad();
    model.backward();
    // 1e-5 (absolute, loss, logits and gradients): llm.c's bar for float32 against PyTorch.
    // The references are float64, rounded to float32 (u of each value), so only our own
    // rounding counts: γ_n Σ|a_i b_i| per n-term sum against the exact value (Higham,
    // γ_n = n u/(1 − n u), u = 2^-24), adding to first order over the products in a row.
    // Sizes (tests/fixtures/cross_attention/model): C = 8, FFN 32, V = 19, 2 + 2 layers,
    // B = 3, S = 6, T = 4; logits up to 11.5, loss 8.0, gradients up to 1.85. The logits' sum
    // (n = C = 8) has Σ_c |norm_c emb_vc| ≤ √C ‖g ⊙ emb_v‖₂ + Σ|b_c emb_vc| = 17.0 (these
    // weights are large: |g| ≤ 1.4, |emb| ≤ 3.0), so γ_8·17 = 8.1e-6 for that product alone and
    // 33 products (encoder 2×6, decoder 2×10, the logits) give 2.7e-4 worst case. With random
    // signs, √8 u · 17 · √33 / 2 ≈ 8.3e-6 (the Cauchy–Schwarz Σ above overestimates the
    // actual Σ|terms|), and u·11.5 ≈ 6.9e-7 from rounding the reference: 1e-5 is only just
    // above this estimate for the logits, so it is tight here (a random-sign estimate, not a
    // bound); the loss (mean of 9 values ≈ 8: √9 u·8 ≈ 1.4e-6) and the gradients have more room.
    CHECK(std::fabs(loss - read_npy(fixture / "loss.npy").data[0]) <= 1e-5);
    const NpyArray logits = read_npy(fixture / "logits.npy");
    REQUIRE(logits.data.size() == model.logits().size());
    double worst = 0.0;
    for (std::size_t i = 0; i < logits.data.size(); ++i)
        worst = std::max(worst, std::fabs(double(model.logits()[i]) - logits.data[i]));
    CHECK(worst <= 1e-5);
    double worst_gradient = 0.0;
    for (const ParameterInfo& p : model.parameter_table()) {
        CAPTURE(p.name);
        const NpyArray g = read_npy(fixture / "grad" / (p.name + ".npy"));
        REQUIRE(g.shape == p.shape);
        double d = 0.0;
        for (std::size_t i = 0; i < p.size; ++i)
            d = std::max(d, std::fabs(double(model.gradients()[p.offset + i]) - g.data[i]));
        CHECK(d <= 1e-5);
        worst_gradient = std::max(worst_gradient, d);
    }
    MESSAGE("|loss - torch| = " << std::fabs(loss - read_npy(fixture / "loss.npy").data[0])
                                << ", max |logits - torch| = " << worst
                                << ", worst gradient difference " << worst_gradient);
}

TEST_CASE("every gradient of the encoder-decoder agrees with finite differences, padding on both sides") {
    // One thread: thousands of tiny forward passes, each of which would otherwise wake a
    // team of threads (on a busy machine a scheduler slice each). The threaded passes are
    // checked against PyTorch above and against each sequence alone below.
    const int threads = num_threads();
    set_num_threads(1);
    // sources of 7, 3 and 0 tokens (the last is all padding), targets of 2, 4 and 1
    EncoderDecoder model = sharp_model(small_config(), 5);
    const Seq2SeqBatch b = make_batch({{3, 4, 5, 6, 7, 8, 9}, {10, 11, 3}, {}}, {{4, 5}, {6, 7, 8, 9}, {10}});
    auto objective = [&] {
        model.forward(b);
        double s = 0.0;  // the mean over the real positions, in double
        for (float l : model.losses()) s += l;
        int n = 0;
        for (int len : b.target_lengths) n += len;
        return s / n;
    };
    objective();
    model.zero_grad();
    model.backward();
    const std::vector<float> analytic = model.gradients();
    // tests/gpt_checks.hpp's step and tolerance: a float loss of size ~2.5 is exact to ~2.4e-7,
    // divided by 2h = 2e-3 that is ~1.2e-4 per derivative; a wrong path is off by O(0.01-1).
    // That counts only the last rounding. The forward's own (u = 2^-24): 33 products of n ≤
    // 4C = 32 terms, each ≈ √32 u·Σ|terms| with random signs; with Σ|terms| taken as the
    // logits' size (~2) and the mean over 9 positions, the two evaluations differ by ≈ 2.6e-6,
    // 1.3e-3 per derivative, an overestimate (Σ|terms| ≫ |value| assumed) that 5e-4 does not
    // cover: the tolerance rests on the error measured, ~1.2e-4.
    const GradCheck r = finite_difference(model.parameters().data(), analytic.data(), analytic.size(),
                                          1e-3f, objective);
    MESSAGE("max |analytic - numeric| = " << r.max_abs_error << " (largest gradient " << r.max_abs_grad << ")");
    set_num_threads(threads);
    CHECK(r.max_abs_error <= 5e-4);
    CHECK(r.max_abs_grad > 1e-2);
}

TEST_CASE("a padded batch gives each sequence what it gets alone: logits and loss") {
    EncoderDecoder model = sharp_model(small_config(), 6);
    const auto src = sources(), tgt = targets();
    Seq2SeqBatch batch = make_batch(src, tgt);
    // what the padding holds must not matter either
    for (int b = 0; b < batch.B; ++b)
        for (int j = batch.source_lengths[static_cast<std::size_t>(b)]; j < batch.S; ++j)
            batch.source[static_cast<std::size_t>(b * batch.S + j)] = 7;
    const float batch_loss = model.forward(batch);
    const std::vector<float> batched = model.logits();  // (B, T, V)
    const int T = batch.T, V = model.config().vocab_size;
    double total = 0.0;
    int positions = 0;
    for (std::size_t b = 0; b < src.size(); ++b) {
        CAPTURE(b);
        const Seq2SeqBatch one = make_batch({src[b]}, {tgt[b]});
        const float loss = model.forward(one);
        total += static_cast<double>(loss) * one.target_lengths[0];
        positions += one.target_lengths[0];
        double worst = 0.0;
        for (int t = 0; t < one.target_lengths[0]; ++t)
            for (int v = 0; v < V; ++v)
                worst = std::max(worst, std::fabs(double(model.logits()[static_cast<std::size_t>(t * V + v)]) -
                                                  batched[(b * static_cast<std::size_t>(T) + t) * V + v]));
        // the same sums over the same real keys, in another batch layout: float rounding only.
        // Padded keys get weight exactly 0, so only the order can differ: 2γ_n Σ|a_i b_i| per
        // sum (n ≤ FFN 32, 2γ_32 ≈ 3.8e-6 worst case, √32 u ≈ 3.4e-7 with random signs),
        // relative to logits of size ~3 after four layers and 33 products: random-sign estimate
        // √33·3.4e-7·3 ≈ 5.8e-6 (worst case 33·3.8e-6·3 ≈ 3.8e-4); 2e-5 is 3.4× above the
        // estimate. A padded key that is attended to moves the logits by O(0.1).
        CHECK(worst <= 2e-5);
    }
    // the batch's loss is the mean over its real positions: the length-weighted mean of the
    // sequences' own losses
    // relative 1e-5 ≈ 168 u: the batch's mean over ≤ 9 positions (2γ_9 ≈ 1.1e-6) plus each
    // loss's change through the logits (≤ 2 × 2e-5 absolute, above, on a loss of ≈ 3..8)
    CHECK(batch_loss == doctest::Approx(total / positions).epsilon(1e-5));
}

TEST_CASE("targets at padded decoder positions never reach the loss or the gradients") {
    EncoderDecoder model = sharp_model(small_config(), 7);
    Seq2SeqBatch batch = make_batch(sources(), targets());
    const float loss = model.forward(batch);
    model.zero_grad();
    model.backward();
    const std::vector<float> grads = model.gradients();
    for (int b = 0; b < batch.B; ++b)  // garbage targets where there is no target
        for (int t = batch.target_lengths[static_cast<std::size_t>(b)]; t < batch.T; ++t)
            batch.target_out[static_cast<std::size_t>(b * batch.T + t)] = 9;
    CHECK(model.forward(batch) == loss);
    model.zero_grad();
    model.backward();
    CHECK(model.gradients() == grads);
}

TEST_CASE("a source that is all padding gives finite logits and gradients, and cross-attention weights of zero") {
    EncoderDecoder model = sharp_model(small_config(), 8);
    const Seq2SeqBatch batch = make_batch({{3, 4, 5}, {}}, {{4, 5}, {6, 7}});
    const float loss = model.forward(batch);
    CHECK(std::isfinite(loss));
    for (float x : model.logits()) REQUIRE(std::isfinite(x));
    model.zero_grad();
    model.backward();
    for (float g : model.gradients()) REQUIRE(std::isfinite(g));
    // sequence 1's queries saw no key in any layer: every cross-attention weight is 0
    for (int l = 0; l < model.config().n_decoder_layer; ++l) {
        const std::vector<float>& w = model.attention_weights(2, l);  // (B, NH, T, S)
        const std::size_t per = w.size() / 2;
        for (std::size_t i = per; i < w.size(); ++i) CHECK(w[i] == 0.0f);
        double row = 0.0;  // while sequence 0's rows are distributions
        for (int j = 0; j < batch.S; ++j) row += w[static_cast<std::size_t>(j)];
        // Σ_j e_j·(1/Z), Z summed from the same rounded e_j (their errors cancel): Z's γ_S, the
        // reciprocal's and the products' u, ≤ (S + 2)u (u = 2^-24; row summed in double): with
        // S = 3 here 3e-7, and Approx allows 1e-6·(1 + 1) = 2e-6, 6.7× above.
        CHECK(row == doctest::Approx(1.0).epsilon(1e-6));
    }
}

TEST_CASE("greedy decoding with cached keys and values equals decoding the whole prefix every step") {
    // Two paths to one answer, on several models and every source length from 0 to 7.
    for (std::uint64_t seed : {11u, 12u, 13u}) {
        CAPTURE(seed);
        EncoderDecoder model = sharp_model(small_config(), seed);
        std::vector<std::vector<int>> src;
        for (int n = 0; n <= 7; ++n) {
            std::vector<int> s;
            for (int j = 0; j < n; ++j) s.push_back(3 + (j * 5 + n + static_cast<int>(seed)) % 9);
            src.push_back(s);
        }
        const auto cached = model.greedy_decode(src, 6);
        const auto uncached = model.greedy_decode_uncached(src, 6);
        CHECK(cached == uncached);
        // the step's causal mask has T_q = 1 query over t + 1 keys: top-left alignment would
        // show each new token only the first position, and the text changes
        const auto top_left = model.greedy_decode(src, 6, CausalAlignment::top_left);
        CHECK(top_left != cached);
    }
}

TEST_CASE("an encoder-decoder checkpoint loads back to the same logits, and a broken one is refused in one line") {
    const fs::path dir = attn_test::scratch("attn_test_encoder_decoder_checkpoint");
    fs::remove_all(dir);
    EncoderDecoder model = sharp_model(small_config(), 9);
    const Seq2SeqVocab vocab(CharVocab::from_chars("abcdefghi"));
    REQUIRE(vocab.size() == model.config().vocab_size);
    save_encoder_decoder(dir, model, vocab, 42);
    CHECK(is_encoder_decoder_checkpoint(dir));
    Seq2SeqVocab loaded_vocab;
    std::int64_t step = 0;
    EncoderDecoder loaded = load_encoder_decoder(dir, loaded_vocab, &step);
    CHECK(step == 42);
    CHECK(loaded_vocab.chars().chars() == "abcdefghi");
    CHECK(loaded.parameters() == model.parameters());
    CHECK(vocab.decode(vocab.encode("cab")) == "cab");
    CHECK(vocab.token(Seq2SeqVocab::eos) == "<eos>");
    fs::remove(dir / "transformer.decoder.norm.bias.npy");
    CHECK_THROWS_WITH_AS(load_encoder_decoder(dir, loaded_vocab), doctest::Contains("transformer.decoder.norm.bias"),
                         CheckpointError);
    std::ofstream(dir / "config.json") << "{\"model\": \"encoder_decoder\", \"vocab_size\": 12}";
    CHECK_THROWS_WITH_AS(load_encoder_decoder(dir, loaded_vocab), doctest::Contains("max_source"), CheckpointError);
    std::ofstream(dir / "config.json") << "{\"vocab_size\": 65}";  // a GPT's
    CHECK_FALSE(is_encoder_decoder_checkpoint(dir));
    fs::remove_all(dir);
}

TEST_CASE("bad batches are refused naming what is wrong") {
    EncoderDecoder model(small_config(), 1);
    Seq2SeqBatch b = make_batch({{3, 4}}, {{5}});
    b.source_lengths[0] = 3;  // more than S = 2
    CHECK_THROWS_WITH_AS(model.forward(b), doctest::Contains("length 3"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(model.forward(make_batch({{3, 4, 5, 6, 7, 8, 9, 10}}, {{5}})),
                         doctest::Contains("max_source = 7"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(model.forward(make_batch({{3, 40}}, {{5}})), doctest::Contains("outside [0, 12)"),
                         std::invalid_argument);
    CHECK_THROWS_AS(model.greedy_decode({{3}}, 7), std::invalid_argument);  // max_target = 6
    CHECK_THROWS_AS(model.backward(), std::invalid_argument);  // no forward with a loss yet
}
