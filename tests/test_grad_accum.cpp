// Gradient accumulation (TrainConfig::grad_accum, lesson 19): N micro-batches of B sequences
// take the step of one batch of N·B, compared step by step from the same checkpoint; the sums
// over a group happen once a step; a resumed run goes on at the right micro-batch; what cannot
// accumulate is refused.
#include "attn/trainer.hpp"

#include "mpi/step_bounds.hpp"  // the bounds of one step against another summation order
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

using namespace attn;
namespace fs = std::filesystem;

namespace {

// Words of a small alphabet, deterministic.
std::string corpus_text() {
    Rng rng(2019);
    const std::string letters = "abcdefghijklmnopqrstuvwxyz";
    std::string text = "to be, or not to be.\n";
    while (text.size() < 20000) {
        const std::uint64_t n = 1 + rng.below(7);
        for (std::uint64_t i = 0; i < n; ++i) text += letters[rng.below(letters.size())];
        text += rng.below(6) == 0 ? ".\n" : " ";
    }
    return text;
}

TrainConfig recipe(int B, int N, float dropout, Precision precision = Precision::fp32) {
    TrainConfig c = TrainConfig::named("tiny");
    c.batch_size = B;
    c.grad_accum = N;
    c.shorten_to(8);
    c.warmup_iters = 2;
    c.dropout = dropout;
    c.precision = precision;
    c.initial_loss_scale = 1024.0;
    return c;
}

// The largest gap of the accumulated clipped gradients `acc` against the one batch's `g`
// relative to its bound (as step_bounds.hpp's Δ): the unclipped gradients differ by at most
// 2γ_backward of their magnitudes, taken as the largest gradient's; clipping scales each side
// by its own factor (k of the two is known from the norms), and each product and the factor
// round by u of it: |acc − k·g| ≤ k·(2γ_backward·max|g|·(1 + 2u) + 3u·|g|).
double gradient_ratio(const std::vector<float>& acc, const std::vector<float>& g, double k, double backward_terms) {
    const double u = mpi_test::unit_roundoff;
    double g_max = 0.0;
    for (float x : g) g_max = std::max(g_max, double(std::fabs(x)));
    const double noise = k * 2 * mpi_test::gamma_of(backward_terms) * g_max * (1 + 2 * u);
    double worst = 0.0;
    for (std::size_t i = 0; i < g.size(); ++i) {
        const double gap = std::fabs(double(acc[i]) - k * g[i]);
        worst = std::max(worst, gap / (noise + 3 * u * k * std::fabs(g[i])));
    }
    return worst;
}

struct Gaps {
    mpi_test::StepGaps step;
    double gradients = 0.0;  // gradient_ratio's worst
};

// `steps` steps of `scheme`, each against one batch of N·B taken from the scheme's checkpoint
// before it (step_bounds.hpp's comparison of one step: the loss, the norm, AdamW's moments,
// the weights, the counts) and its gradients against that batch's.
Gaps compare_with_one_batch(Trainer& scheme, int steps, const fs::path& dir) {
    fs::create_directories(dir);
    Gaps gaps;
    // One batch of N·B's chains, two terms longer (step_bounds.hpp's sum_chains).
    const mpi_test::SumChains chains = mpi_test::sum_chains(scheme.config(), scheme.data().vocab.size());
    const int large_batch = scheme.config().batch_size * scheme.config().grad_accum;
    for (int t = 0; t < steps; ++t) {
        scheme.save(dir / "scheme");
        mpi_test::as_one_batch(dir / "scheme", dir / "one");
        Trainer one = Trainer::load(dir / "one", scheme.data());
        REQUIRE(one.config().batch_size == large_batch);
        const mpi_test::detail::State before = mpi_test::detail::state_of(one);
        const StepRecord r = one.train_step();
        const std::vector<float> g = one.model().gradients();  // after clipping
        const mpi_test::detail::State ref = mpi_test::detail::state_of(one);
        const StepRecord s = scheme.train_step();
        const float max_norm = one.config().grad_clip > 0 ? one.config().grad_clip : INFINITY;
        const double k = double(mpi_test::detail::clip_factor(s.grad_norm, max_norm)) /
                         mpi_test::detail::clip_factor(r.grad_norm, max_norm);
        gaps.gradients = std::max(gaps.gradients, gradient_ratio(scheme.model().gradients(), g, k, chains.backward));
        mpi_test::detail::compare_step(gaps.step, t, before, r, g, ref, s, mpi_test::detail::state_of(scheme), one,
                                       chains);
    }
    return gaps;
}

// A group of one process that counts the calls the trainer makes: the gradients are its own
// already, so it sums nothing.
class CountingGroup : public DataParallelGroup {
public:
    explicit CountingGroup(bool in_model = true) : in_model_(in_model) {}
    int rank() const override { return 0; }
    int size() const override { return 1; }
    void begin_gradients(GPT&, double share) override {
        ++begins;
        CHECK(share == 1.0);
    }
    void finish_gradients(GPT&) override { ++finishes; }
    double sum(double value) override {
        ++sums;
        return value;
    }
    bool any(bool flag) override { return flag; }
    void check_same(std::uint64_t, const std::string&) override {}
    void barrier() override {}
    bool accumulates_in_model() const override { return in_model_; }
    int begins = 0, finishes = 0, sums = 0;

private:
    bool in_model_;
};

// A device that is never used: use_device() must refuse it first.
class UnusedDevice : public TrainingDevice {
public:
    std::string name() const override { return "unused"; }
    void push(const GPT&, const AdamW&) override { FAIL("pushed to"); }
    void pull(GPT&, AdamW&) override {}
    float loss(const int*, const int*, int, int, bool, std::uint64_t) override { return 0.0f; }
    float backward_and_clip(float) override { return 0.0f; }
    void adamw_step(AdamW&, float) override {}
    void copy_gradients_to(std::vector<float>&) override {}
};

}  // namespace

TEST_CASE("gradient accumulation: N micro-batches of B take one batch of N·B's step, each of 8 steps from the same checkpoint") {
    const TextDataset data = make_dataset(corpus_text());
    const fs::path dir = attn_test::scratch("grad_accum_steps");
    struct Case {
        int B, N;
        float dropout;
        Precision precision;
    };
    // N a power of two and not; with dropout (the masks of each sequence's place in the N·B);
    // the products in bfloat16, and in float16 with loss scaling (its scale over N a power of
    // two, so each row's rounded gradient is the one batch's bit for bit: only the sums differ).
    for (const Case& c : {Case{4, 2, 0.0f, Precision::fp32}, Case{4, 3, 0.0f, Precision::fp32},
                          Case{3, 4, 0.1f, Precision::fp32}, Case{2, 5, 0.0f, Precision::fp32},
                          Case{4, 2, 0.1f, Precision::bf16}, Case{4, 4, 0.0f, Precision::fp16}}) {
        CAPTURE(c.B);
        CAPTURE(c.N);
        CAPTURE(c.dropout);
        CAPTURE(precision_name(c.precision));
        Trainer scheme(recipe(c.B, c.N, c.dropout, c.precision), data);
        const Gaps g = compare_with_one_batch(scheme, 8, dir);
        INFO(mpi_test::worst("loss", g.step.loss) << "; " << mpi_test::worst("norm", g.step.norm) << "; "
             << mpi_test::worst("m", g.step.m) << "; " << mpi_test::worst("v", g.step.v) << "; "
             << mpi_test::worst("weights", g.step.weights) << "; gradients " << g.gradients << " of their bound");
        CHECK(g.step.mismatches.empty());
        CHECK(g.step.loss.ratio <= 1);
        CHECK(g.step.norm.ratio <= 1);
        CHECK(g.gradients <= 1);
        CHECK(g.step.m.ratio <= 1);
        CHECK(g.step.v.ratio <= 1);
        CHECK(g.step.weights.ratio <= 1);
    }
    fs::remove_all(dir);
}

TEST_CASE("gradient accumulation: random batch sizes, micro-batch counts and seeds take one batch's step") {
    const TextDataset data = make_dataset(corpus_text());
    const fs::path dir = attn_test::scratch("grad_accum_random");
    Rng rng(53);
    for (int trial = 0; trial < 12; ++trial) {
        const int B = 1 + static_cast<int>(rng.below(5)), N = 1 + static_cast<int>(rng.below(6));
        TrainConfig c = recipe(B, N, rng.below(2) ? 0.1f : 0.0f);
        c.seed = rng.next_u64();
        c.learning_rate = 1e-3 * (1 + static_cast<double>(rng.below(30)));  // some steps clipped
        c.grad_clip = rng.below(3) == 0 ? 0.0f : 0.5f;
        CAPTURE(B);
        CAPTURE(N);
        CAPTURE(c.seed);
        CAPTURE(c.dropout);
        CAPTURE(c.grad_clip);
        Trainer scheme(c, data);
        const Gaps g = compare_with_one_batch(scheme, 3, dir);
        INFO(mpi_test::worst("loss", g.step.loss) << "; " << mpi_test::worst("norm", g.step.norm) << "; "
             << mpi_test::worst("weights", g.step.weights) << "; gradients " << g.gradients << " of their bound");
        CHECK(g.step.mismatches.empty());
        CHECK(std::max({g.step.loss.ratio, g.step.norm.ratio, g.gradients, g.step.m.ratio, g.step.v.ratio,
                        g.step.weights.ratio}) <= 1);
    }
    fs::remove_all(dir);
}

TEST_CASE("gradient accumulation in a group: one gradient sum and one loss sum a step, not one per micro-batch") {
    const TextDataset data = make_dataset(corpus_text());
    for (int N : {1, 2, 5}) {
        CAPTURE(N);
        const TrainConfig c = recipe(4, N, 0.1f);
        Trainer alone(c, data), grouped(c, data);
        auto group = std::make_shared<CountingGroup>();
        grouped.use_group(group);
        for (int t = 0; t < 4; ++t) {
            const StepRecord a = alone.train_step(), b = grouped.train_step();
            CHECK(a.loss == b.loss);  // the group of one changes nothing: the same operations
            CHECK(a.grad_norm == b.grad_norm);
        }
        CHECK(grouped.model().parameters() == alone.model().parameters());
        CHECK(group->begins == 4);
        CHECK(group->finishes == 4);
        CHECK(group->sums == 4);
    }
}

TEST_CASE("gradient accumulation: a resumed run goes on at the right micro-batch, bit for bit") {
    const TextDataset data = make_dataset(corpus_text());
    const fs::path dir = attn_test::scratch("grad_accum_resume");
    const TrainConfig c = recipe(3, 3, 0.1f);
    Trainer whole(c, data);
    std::vector<float> expected;
    while (!whole.done()) expected.push_back(whole.train_step().loss);
    Trainer first(c, data);
    for (int i = 0; i < 3; ++i) first.train_step();
    first.evaluate();  // an evaluation in between draws none of the training batches
    first.save(dir);
    Trainer second = Trainer::load(dir, data);
    CHECK(second.config().grad_accum == 3);
    CHECK(second.config().batch_size == 3);
    std::vector<float> resumed;
    while (!second.done()) resumed.push_back(second.train_step().loss);
    REQUIRE(resumed.size() == expected.size() - 3);
    for (std::size_t i = 0; i < resumed.size(); ++i) {
        CAPTURE(i);
        CHECK(resumed[i] == expected[3 + i]);  // exact: the same operations on the same state
    }
    CHECK(second.model().parameters() == whole.model().parameters());
    fs::remove_all(dir);
}

TEST_CASE("gradient accumulation: what cannot accumulate is refused") {
    const TextDataset data = make_dataset(corpus_text());
    TrainConfig bad = recipe(4, 0, 0.0f);
    CHECK_THROWS_AS(bad.validate(), std::invalid_argument);
    bad.grad_accum = 65537;
    CHECK_THROWS_AS(bad.validate(), std::invalid_argument);
    Trainer t(recipe(4, 2, 0.0f), data);
    // ZeRO stages 2 and 3 hand each block's gradients over as the pass finishes them.
    CHECK_THROWS_AS(t.use_group(std::make_shared<CountingGroup>(false)), std::invalid_argument);
    CHECK(t.group() == nullptr);
    CHECK_THROWS_AS(t.use_device(std::make_unique<UnusedDevice>()), std::invalid_argument);
    std::vector<int> x, y;
    std::vector<float> grads;
    CHECK_THROWS_AS(t.first_batch_gradients(x, y, grads), std::invalid_argument);
    // One batch a step accumulates nothing, so those are allowed.
    Trainer one(recipe(4, 1, 0.0f), data);
    one.use_group(std::make_shared<CountingGroup>(false));
    CHECK(one.group() != nullptr);
}
