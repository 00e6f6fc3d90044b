// Where position enters attention (lesson 15): learned positions, RoPE and ALiBi in the GPT,
// against PyTorch (fixtures from tools/reference/make_position_fixtures.py), against finite
// differences, and the shift property that makes RoPE relative.
#include "attn/fixtures.hpp"
#include "attn/checkpoint.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/kv_cache.hpp"
#include "attn/npy.hpp"
#include "attn/trainer.hpp"

#include "attn/gradcheck.hpp"
#include "gpt_checks.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

using namespace attn;
using namespace attn::gpt_checks;

namespace {
namespace fs = std::filesystem;
const fs::path fixtures = attn::fixtures_dir() / "positions";

GPTConfig small_config(Position position) {
    GPTConfig config;
    config.vocab_size = 11;
    config.block_size = 8;
    config.n_layer = 2;
    config.n_head = 2;
    config.n_embd = 8;
    config.position = position;
    return config;
}

// The first layer's raw scores q·kᵀ (B = 1, NH, T, T) of a model for tokens `ids`, with
// the positions starting at `shift`: for learned positions the embedding rows shift..shift+T-1,
// for RoPE the rotation from pos0 = shift.
std::vector<float> first_layer_scores(const GPT& model, const std::vector<int>& ids, int shift) {
    const GPTConfig& c = model.config();
    const int T = static_cast<int>(ids.size()), C = c.n_embd, NH = c.n_head, hs = C / NH;
    const ParameterTensors& p = model.params();
    std::vector<float> x(static_cast<std::size_t>(T) * C), ln(x.size()), mean(T), rstd(T);
    std::vector<float> qkv(static_cast<std::size_t>(T) * 3 * C);
    encoder_forward(x.data(), ids.data(), p.wte,
                    p.wpe ? p.wpe + static_cast<std::size_t>(shift) * C : nullptr, 1, T, C);
    layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), p.ln1w, p.ln1b, 1, T, C);
    matmul_forward(qkv.data(), ln.data(), p.qkvw, p.qkvb, T, C, 3 * C);
    if (c.position == Position::rope) rope_forward(qkv.data(), 1, T, C, NH, shift);
    std::vector<float> scores(static_cast<std::size_t>(NH) * T * T);
    for (int h = 0; h < NH; ++h)
        for (int i = 0; i < T; ++i)
            for (int j = 0; j < T; ++j) {
                float s = 0.0f;
                for (int d = 0; d < hs; ++d)
                    s += qkv[static_cast<std::size_t>(i) * 3 * C + h * hs + d] *
                         qkv[static_cast<std::size_t>(j) * 3 * C + C + h * hs + d];
                scores[(static_cast<std::size_t>(h) * T + i) * T + j] = s;
            }
    return scores;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    return worst;
}

}  // namespace

TEST_CASE("RoPE and ALiBi models match PyTorch on logits, loss and every gradient") {
    for (const std::string name : {"rope", "alibi"}) {
        CAPTURE(name);
        const fs::path dir = fixtures / name;
        GPT model = load_checkpoint(dir / "weights");
        CHECK(model.config().position == parse_position(name));
        CHECK(model.params().wpe == nullptr);
        const Parity r = check_against_torch(model, dir);
        CHECK(r.T > model.config().block_size);  // these schemes read past the training block
        MESSAGE(name << ": |loss - torch| = " << r.loss_diff << ", max |logits - torch| = "
                     << r.logits_diff << ", worst gradient difference " << r.worst_gradient);
    }
}

TEST_CASE("rope_forward rotates as PyTorch does, and rope_backward is its transpose") {
    const fs::path dir = fixtures / "rotation";
    const NpyArray x = read_npy(dir / "x.npy");
    const int T = static_cast<int>(x.shape[0]), hs = static_cast<int>(x.shape[1]);
    const int pos0 = static_cast<int>(read_npy(dir / "pos0.npy").data[0]);
    // One head, C = hs: q and k hold x, v holds x unchanged.
    std::vector<float> qkv(static_cast<std::size_t>(T) * 3 * hs), dqkv(qkv.size());
    const NpyArray dy = read_npy(dir / "dy.npy");
    for (int t = 0; t < T; ++t)
        for (int d = 0; d < hs; ++d)
            for (int part = 0; part < 3; ++part) {
                qkv[static_cast<std::size_t>(t) * 3 * hs + part * hs + d] = x.data[t * hs + d];
                dqkv[static_cast<std::size_t>(t) * 3 * hs + part * hs + d] = dy.data[t * hs + d];
            }
    rope_forward(qkv.data(), 1, T, hs, 1, pos0);
    rope_backward(dqkv.data(), 1, T, hs, 1, pos0);
    const NpyArray rotated = read_npy(dir / "rotated.npy"), dx = read_npy(dir / "dx.npy");
    double worst_y = 0.0, worst_dx = 0.0, worst_v = 0.0;
    auto gap = [](double a, double b) { return std::fabs(a - b); };
    for (int t = 0; t < T; ++t)
        for (int d = 0; d < hs; ++d)
            for (int part = 0; part < 2; ++part) {
                const std::size_t i = static_cast<std::size_t>(t) * 3 * hs + part * hs + d;
                const std::size_t v = static_cast<std::size_t>(t) * 3 * hs + 2 * hs + d;
                worst_y = std::max(worst_y, gap(qkv[i], rotated.data[t * hs + d]));
                worst_dx = std::max(worst_dx, gap(dqkv[i], dx.data[t * hs + d]));
                worst_v = std::max(worst_v, gap(qkv[v], x.data[t * hs + d]));
            }
    MESSAGE("rotation: max |y - torch| = " << worst_y << ", max |dx - torch| = " << worst_dx);
    // Each output is x0·c ∓ x1·s with the angle, cos and sin in double and c, s rounded to
    // float (u relative each), two float products and one sum (γ_2, Higham): at most
    // (u + γ_2)(|x0| + |x1|) ≈ 3u·(|x0| + |x1|) ≤ 3u·5.6 ≈ 1.0e-6 (|x|, |dy| ≤ 2.8 in the
    // fixture, T = 5, hs = 8, pos0 = 3); the reference is float64 rounded (≤ u·2.4). 1e-5 sits
    // ~9× above; a wrong pairing or sign or a position off by one moves outputs by O(1).
    CHECK(worst_y <= parity_tol);
    CHECK(worst_dx <= parity_tol);
    CHECK(worst_v == 0.0);
}

TEST_CASE("the halves convention of GPT-NeoX and Hugging Face's Llama is the adjacent pairs' "
          "rotation with the channels permuted") {
    // Halves, written here from the rotate_half of GPT-NeoX and of Hugging Face's Llama port
    // (Meta's own Llama code pairs adjacent channels, as this library does):
    // y = x·cos + (−x[hs/2:], x[:hs/2])·sin, with pair i at channels i and i + hs/2.
    // Permuting x so that channel 2i goes to i and 2i+1 to i + hs/2 turns the pairs' rotation
    // into it.
    const int hs = 8, T = 6, pos0 = 2;
    Rng rng(4);
    const std::vector<float> x = normal_vector(rng, static_cast<std::size_t>(T) * hs);
    std::vector<float> qkv(static_cast<std::size_t>(T) * 3 * hs, 0.0f);
    for (int t = 0; t < T; ++t)
        std::copy(x.begin() + t * hs, x.begin() + (t + 1) * hs, qkv.begin() + t * 3 * hs);
    rope_forward(qkv.data(), 1, T, hs, 1, pos0);
    double worst = 0.0;
    for (int t = 0; t < T; ++t) {
        for (int i = 0; i < hs / 2; ++i) {
            const double a = (pos0 + t) * std::pow(10000.0, -2.0 * i / hs);
            const double lo = x[t * hs + 2 * i], hi = x[t * hs + 2 * i + 1];  // permuted x
            const double y_lo = lo * std::cos(a) - hi * std::sin(a);          // halves' y[i]
            const double y_hi = hi * std::cos(a) + lo * std::sin(a);          // y[i + hs/2]
            worst = std::max({worst, std::fabs(y_lo - qkv[t * 3 * hs + 2 * i]),
                              std::fabs(y_hi - qkv[t * 3 * hs + 2 * i + 1])});
        }
    }
    // Against float64 on the same float inputs: c and s are rounded to float (u each) and
    // each output is two float products and a sum (γ_2), so it is off by at most
    // 3u·(|lo| + |hi|) ≈ 1.8e-7·(|lo| + |hi|): under 1e-6 while |lo| + |hi| ≤ 5.5, which these
    // 48 N(0, 1) draws of seed 4 satisfy (a pair both near 2.75 would not: the bound, not the
    // tolerance, is the data's). The permutation or a sign wrong moves outputs by O(1).
    CHECK(worst <= 1e-6);
}

TEST_CASE("with RoPE, shifting every position leaves the scores unchanged, and with learned "
          "positions it does not") {
    const std::vector<int> ids = {1, 4, 2, 9, 0, 3};
    GPTConfig rope_config = small_config(Position::rope);
    rope_config.n_embd = 16;
    GPT rope(rope_config, 3);
    GPT learned(small_config(Position::learned), 3);
    Rng rng(8);  // weights of size ~1, so that the scores are too
    for (GPT* m : {&rope, &learned})
        for (float& p : m->parameters()) p += 0.3f * rng.normal();
    const std::vector<float> rope0 = first_layer_scores(rope, ids, 0);
    const std::vector<float> learned0 = first_layer_scores(learned, ids, 0);
    double rope_scale = 0.0;
    for (float s : rope0) rope_scale = std::max(rope_scale, static_cast<double>(std::fabs(s)));
    for (int shift : {1, 2}) {
        CAPTURE(shift);
        const double rope_change = max_abs_diff(first_layer_scores(rope, ids, shift), rope0);
        const double learned_change =
            max_abs_diff(first_layer_scores(learned, ids, shift), learned0);
        MESSAGE("shift " << shift << ": RoPE scores change by " << rope_change << " (largest "
                         << rope_scale << "), learned by " << learned_change);
        // The scores q·k/√hs with the rotations at shifted positions: the angles are exact
        // in double, c and s round to float differently (u each), the rotated q and k are
        // off by ≈ 3u of |x0| + |x1|, and each score's 8-term sum (hs = 8) by 2γ_8 ≈ 9.5e-7
        // of Σ|q_c k_c|/√hs: together ≲ 1.3e-6 of Σ|terms|, which is of the order of the
        // largest score at weights of size ~1. 1e-5 of max(1, rope_scale) is ~7× that;
        // learned positions change the scores by O(0.1) (checked against 1e-3).
        CHECK(rope_change <= 1e-5 * std::max(1.0, rope_scale));
        CHECK(learned_change > 1e-3);
    }
    // at positions 1000 on, too: the angles are computed in double, so the large angles
    // cost nothing more; the bound is the same ≲ 1.3e-6 of Σ|terms| as above, and 1e-4 of
    // max(1, rope_scale) is a loose (~77×) margin kept for a cos/sin of a large argument
    // computed less accurately by another libm.
    const double far = max_abs_diff(first_layer_scores(rope, ids, 1000), rope0);
    MESSAGE("shift 1000: RoPE scores change by " << far);
    CHECK(far <= 1e-4 * std::max(1.0, rope_scale));
}

TEST_CASE("ALiBi's slopes are Press et al.'s geometric sequences") {
    // 8 heads: 2^-1, 2^-2, ..., 2^-8 (the paper's example)
    const std::vector<float> eight = alibi_slopes(8);
    REQUIRE(eight.size() == 8);
    for (int h = 0; h < 8; ++h) CHECK(eight[h] == std::ldexp(1.0f, -(h + 1)));
    // 4 heads: 2^-2, 2^-4, 2^-6, 2^-8
    const std::vector<float> four = alibi_slopes(4);
    CHECK(four == std::vector<float>{0.25f, 0.0625f, 0.015625f, 0.00390625f});
    // 6 heads: the 4 of 4 heads, then every other of 8 heads: 2^-1, 2^-3
    const std::vector<float> six = alibi_slopes(6);
    CHECK(six == std::vector<float>{0.25f, 0.0625f, 0.015625f, 0.00390625f, 0.5f, 0.125f});
    CHECK_THROWS_AS(alibi_slopes(0), std::invalid_argument);
}

TEST_CASE("ALiBi adds m·(j − i) to the scores before the softmax") {
    // One head of size 2 with q = 0: the scores are only the bias, so the weights of row i
    // are softmax(m·(j − i)) over j ≤ i. With the slope m = 1/2, row 2 is softmax(−1, −½, 0).
    const int T = 3, C = 2;
    std::vector<float> qkv(T * 3 * C, 0.0f), out(T * C), att(T * T);
    for (int t = 0; t < T; ++t) qkv[t * 3 * C + 2 * C] = static_cast<float>(t);  // v = (t, 0)
    const float slope = 0.5f;
    attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, 1, T, C, 1,
                      true, true, &slope);
    const double e0 = std::exp(-1.0), e1 = std::exp(-0.5), e2 = 1.0, z = e0 + e1 + e2;
    CHECK(att[6] == doctest::Approx(e0 / z).epsilon(1e-6));
    CHECK(att[7] == doctest::Approx(e1 / z).epsilon(1e-6));
    CHECK(att[8] == doctest::Approx(e2 / z).epsilon(1e-6));
    CHECK(att[3] == doctest::Approx(std::exp(-0.5) / (std::exp(-0.5) + 1.0)).epsilon(1e-6));
    CHECK(out[4] == doctest::Approx((e1 + 2 * e2) / z).epsilon(1e-6));
}

TEST_CASE("RoPE and ALiBi models' gradients agree with finite differences") {
    const int B = 2, T = 10;  // T beyond block_size 8
    std::vector<int> x(B * T), y(B * T);
    for (int i = 0; i < B * T; ++i) {
        x[i] = (7 * i + 3) % 11;
        y[i] = (5 * i + 1) % 11;
    }
    for (Position position : {Position::rope, Position::alibi}) {
        const std::string scheme = position_name(position);
        CAPTURE(scheme);
        GPTConfig config = small_config(position);
        config.dropout = 0.1f;
        const GradCheck r = check_gradient_numerically(config, x, y, B, T);
        MESSAGE(scheme << ": max |analytic - numeric| = " << r.max_abs_error
                                        << " (largest gradient " << r.max_abs_grad << ")");
    }
}

TEST_CASE("a learned-position model refuses a context beyond its block, and RoPE and ALiBi read it") {
    const std::vector<int> ids(9, 1);
    GPT learned(small_config(Position::learned));
    CHECK_THROWS_WITH_AS(learned.forward(ids, {}, 1, 9),
                         doctest::Contains("learned positions has embeddings for positions 0 to 7"),
                         std::invalid_argument);
    for (Position position : {Position::rope, Position::alibi}) {
        GPT model(small_config(position));
        CHECK(std::isnan(model.forward(ids, {}, 1, 9)));
        for (float v : model.logits()) REQUIRE(std::isfinite(v));
    }
    GPTConfig odd = small_config(Position::rope);
    odd.n_embd = 6;  // head size 3
    CHECK_THROWS_AS(GPT{odd}, std::invalid_argument);
    CHECK_THROWS_AS(parse_position("sinusoidal"), std::invalid_argument);
}

TEST_CASE("checkpoints record the scheme, have no wpe without learned positions, and old ones "
          "load as learned") {
    const fs::path dir = attn_test::scratch("attn_test_positions");
    fs::remove_all(dir);
    for (Position position : {Position::learned, Position::rope, Position::alibi}) {
        const std::string scheme = position_name(position);
        CAPTURE(scheme);
        const GPTConfig config = small_config(position);
        const GPT model(config, 5);
        CHECK(model.parameters().size() == config.num_parameters());
        CHECK((model.params().wpe != nullptr) == (position == Position::learned));
        save_checkpoint(dir, model, {});
        CHECK(fs::exists(dir / "transformer.wpe.weight.npy") == (position == Position::learned));
        std::ifstream in(dir / "config.json");
        const std::string json((std::istreambuf_iterator<char>(in)), {});
        // learned: nanoGPT's keys only
        CHECK((json.find("\"position\"") != std::string::npos) == (position != Position::learned));
        const GPT back = load_checkpoint(dir);
        CHECK(back.config().position == position);
        CHECK(back.parameters() == model.parameters());
        fs::remove_all(dir);
    }
}

TEST_CASE("RoPE and ALiBi runs resume bit for bit, keep their scheme, and generate text") {
    const TextDataset data = repeated_sentences();
    const fs::path dir = attn_test::scratch("attn_test_positions_resume");
    for (Position position : {Position::rope, Position::alibi}) {
        const std::string scheme = position_name(position);
        CAPTURE(scheme);
        TrainConfig c = short_tiny_recipe();
        c.position = position;
        const Trainer second = check_resume(c, data, dir);
        CHECK(second.model().config().position == position);
        CHECK(second.config().position == position);
    }
    fs::remove_all(dir);
}
