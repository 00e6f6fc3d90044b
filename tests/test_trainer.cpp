#include "attn/trainer.hpp"

#include "attn/checkpoint.hpp"
#include "attn/npy.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>

using namespace attn;
namespace fs = std::filesystem;

namespace {

// A made-up corpus with some structure to learn: random words from a small list.
std::string word_corpus(std::size_t words, std::uint64_t seed = 7) {
    const char* list[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "dog ", "ran\n", "far, ", "away "};
    Rng rng(seed);
    std::string s;
    for (std::size_t i = 0; i < words; ++i) s += list[rng.below(10)];
    return s;
}

TrainConfig tiny(std::int64_t iters = 40) {
    TrainConfig c = TrainConfig::named("tiny");
    c.max_iters = iters;
    c.warmup_iters = 5;
    c.lr_decay_iters = iters;
    c.eval_interval = 10;
    c.eval_iters = 2;
    return c;
}

// A fresh, empty folder under the system's temporary directory, removed at the end.
struct TempDir {
    fs::path path;
    explicit TempDir(const std::string& name)
        : path(attn_test::scratch("attn_trainer_" + name)) {
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
};

}  // namespace

TEST_CASE("a resumed run reproduces the uninterrupted run's losses bit for bit") {
    const TextDataset data = make_dataset(word_corpus(4000));
    TempDir tmp("resume");
    for (float dropout : {0.0f, 0.1f}) {
        CAPTURE(dropout);
        TrainConfig c = tiny(40);
        c.dropout = dropout;
        Trainer whole(c, data);
        std::vector<float> expected;
        while (!whole.done()) expected.push_back(whole.train_step().loss);

        Trainer first(c, data);
        for (int i = 0; i < 20; ++i) first.train_step();
        first.evaluate();  // evaluation in between must not shift the training batches
        first.save(tmp.path / "ckpt");
        Trainer second = Trainer::load(tmp.path / "ckpt", data);
        CHECK(second.step() == 20);
        std::vector<float> resumed;
        while (!second.done()) resumed.push_back(second.train_step().loss);
        REQUIRE(resumed.size() == 20);
        for (std::size_t i = 0; i < 20; ++i) {
            CAPTURE(i);
            CHECK(resumed[i] == expected[20 + i]);  // exact: the same operations on the same state
        }
        CHECK(second.model().parameters() == whole.model().parameters());
    }
}

TEST_CASE("a tiny run learns: the loss falls from about ln V well below it") {
    const TextDataset data = make_dataset(word_corpus(4000));
    TempDir tmp("learns");
    Trainer trainer(tiny(150), data);
    RunOptions options;
    options.out_dir = tmp.path;
    const RunSummary s = run_training(trainer, options);
    REQUIRE(s.evals.size() >= 2);
    // At initialisation the logits are nearly equal (weights N(0, 0.02)), so the loss is
    // close to ln V; 0.1 allows for the small logits' spread (not rounding: logits of spread
    // σ ≈ 0.02·√C·… ≲ 0.2 raise the expected loss by ≈ σ²/2 ≲ 0.02; float error is ~1e-6).
    CHECK(std::fabs(s.evals.front().val_loss - std::log(static_cast<double>(data.vocab.size()))) < 0.1);
    // The corpus is ten words drawn at random, about 2.3 nats per word of 4.6 characters
    // once they are learnt: far below ln V ≈ 3.0 per character.
    CHECK(s.evals.back().val_loss < 2.2);
    CHECK(s.steps.size() == 150);
    CHECK(fs::exists(tmp.path / "checkpoint" / "trainer.json"));
    std::ifstream metrics(tmp.path / "metrics.jsonl");
    std::size_t lines = 0;
    for (std::string line; std::getline(metrics, line);) ++lines;
    CHECK(lines == s.steps.size() + s.evals.size());
}

TEST_CASE("median_step_seconds takes warm-up plus timed steps and refuses no timed step") {
    const TextDataset data = make_dataset(word_corpus(400));
    Trainer trainer(tiny(10), data);
    const double seconds = median_step_seconds(trainer, 3, 2);
    CHECK(trainer.step() == 5);
    CHECK(seconds > 0.0);  // a duration, never a threshold on it
    CHECK_THROWS_AS(median_step_seconds(trainer, 0), std::invalid_argument);
    CHECK_THROWS_AS(median_step_seconds(trainer, 1, -1), std::invalid_argument);
    CHECK(trainer.step() == 5);  // a refused call takes no step
}

TEST_CASE("a loss that stops being finite ends the run and leaves the last checkpoint intact") {
    const TextDataset data = make_dataset(word_corpus(2000));
    TempDir tmp("diverge");
    TrainConfig c = tiny(20);
    c.learning_rate = 1e30;  // the first update throws the weights to ~1e27: logits overflow
    c.min_lr = 1e30;
    Trainer trainer(c, data);
    const std::vector<float> initial = trainer.model().parameters();
    RunOptions options;
    options.out_dir = tmp.path;
    CHECK_THROWS_AS(run_training(trainer, options), TrainingDiverged);
    // The checkpoint of the evaluation at step 0 is still there, whole and finite.
    Trainer restored = Trainer::load(tmp.path / "checkpoint", data);
    CHECK(restored.step() == 0);
    CHECK(restored.model().parameters() == initial);
}

TEST_CASE("an evaluation that is not finite ends the run before metrics.jsonl holds a null") {
    // JSON has no NaN: a NaN loss would be written as null. Weights made NaN after loading
    // (load_checkpoint refuses such files) make the evaluation at step 0 NaN.
    const TextDataset data = make_dataset(word_corpus(2000));
    TempDir tmp("nan_eval");
    Trainer trainer(tiny(5), data);
    trainer.model().parameters()[0] = std::numeric_limits<float>::quiet_NaN();
    RunOptions options;
    options.out_dir = tmp.path;
    CHECK_THROWS_WITH_AS(run_training(trainer, options),
                         doctest::Contains("evaluation at step 0 gave a train loss of NaN"),
                         TrainingDiverged);
    std::ifstream metrics(tmp.path / "metrics.jsonl");
    const std::string text{std::istreambuf_iterator<char>(metrics), std::istreambuf_iterator<char>()};
    CHECK(text.find("null") == std::string::npos);
    CHECK(!fs::exists(tmp.path / "checkpoint"));  // nor a checkpoint of the NaN weights
}

TEST_CASE("a stop request saves a checkpoint that resumes where it stopped") {
    const TextDataset data = make_dataset(word_corpus(2000));
    TempDir tmp("stop");
    Trainer trainer(tiny(30), data);
    RunOptions options;
    options.out_dir = tmp.path;
    options.stop_requested = [&] { return trainer.step() == 7; };
    const RunSummary s = run_training(trainer, options);
    CHECK(s.stopped);
    CHECK(s.steps.size() == 7);
    CHECK(Trainer::load(tmp.path / "checkpoint", data).step() == 7);
}

TEST_CASE("top-k 1 always picks the largest logit, whatever the seed and temperature") {
    const std::vector<float> logits{0.1f, 2.0f, -1.0f, 1.9f};
    for (std::uint64_t seed = 0; seed < 20; ++seed) {
        Rng rng(seed);
        CHECK(sample_token(logits, 1.0f, 1, rng) == 1);
        CHECK(sample_token(logits, 5.0f, 1, rng) == 1);
    }
}

TEST_CASE("draws follow softmax(logits / temperature) restricted to the top k") {
    const int n = 20000;
    // p = 1/4, 3/4 for logits (0, ln 3); at temperature 2 the odds are √3 : 1 → 0.634.
    // Binomial standard error √(p(1-p)/n) ≈ 0.003: 0.015 is five of them.
    const std::vector<float> two{0.0f, std::log(3.0f)};
    for (auto [temperature, expected] : {std::pair{1.0f, 0.75}, {2.0f, std::sqrt(3.0) / (1 + std::sqrt(3.0))}}) {
        CAPTURE(temperature);
        Rng rng(1);
        int ones = 0;
        for (int i = 0; i < n; ++i) ones += sample_token(two, temperature, 0, rng);
        CHECK(std::fabs(ones / double(n) - expected) < 0.015);
    }
    // top-k 2 of (0, ln 3, 5, -1): only ids 1 and 2, with odds 3 : e^5.
    Rng rng(2);
    int twos = 0;
    for (int i = 0; i < n; ++i) {
        const int t = sample_token({0.0f, std::log(3.0f), 5.0f, -1.0f}, 1.0f, 2, rng);
        REQUIRE((t == 1 || t == 2));
        twos += t == 2;
    }
    // p = e^5/(3 + e^5) ≈ 0.980: standard error √(p(1 − p)/n) ≈ 1e-3, so 0.015 is ~15 of them.
    CHECK(std::fabs(twos / double(n) - std::exp(5.0) / (3.0 + std::exp(5.0))) < 0.015);
}

TEST_CASE("the same seed generates the same text") {
    const TextDataset data = make_dataset(word_corpus(2000));
    Trainer trainer(tiny(), data);
    SampleOptions o;
    o.max_new_tokens = 40;
    o.top_k = 5;
    const std::string a = generate_text(trainer.model(), data.vocab, "the ", o);
    const std::string b = generate_text(trainer.model(), data.vocab, "the ", o);
    CHECK(a == b);
    CHECK(a.rfind("the ", 0) == 0);
    o.seed = 99;
    CHECK(generate_text(trainer.model(), data.vocab, "the ", o) != a);
}

TEST_CASE("bad sampling settings and unknown prompt characters are rejected") {
    Rng rng(1);
    const std::vector<float> logits{1.0f, 2.0f, 3.0f};
    CHECK_THROWS_AS(sample_token(logits, 0.0f, 0, rng), std::invalid_argument);
    CHECK_THROWS_AS(sample_token(logits, -1.0f, 0, rng), std::invalid_argument);
    CHECK_THROWS_AS(sample_token(logits, NAN, 0, rng), std::invalid_argument);
    CHECK_THROWS_AS(sample_token(logits, 1.0f, -1, rng), std::invalid_argument);
    CHECK_THROWS_AS(sample_token(logits, 1.0f, 4, rng), std::invalid_argument);
    const TextDataset data = make_dataset(word_corpus(2000));
    Trainer trainer(tiny(), data);
    CHECK_THROWS_AS(generate_text(trainer.model(), data.vocab, "the ZEBRA", {}), std::invalid_argument);
}

TEST_CASE("recipes and bad settings") {
    const TrainConfig cpu = TrainConfig::named("cpu");
    CHECK(cpu.n_layer == 4);
    CHECK(cpu.n_head == 4);
    CHECK(cpu.n_embd == 128);
    CHECK(cpu.block_size == 64);
    CHECK(cpu.batch_size == 12);
    CHECK(cpu.max_iters == 2000);
    CHECK_THROWS_AS(TrainConfig::named("gpu-monster"), std::invalid_argument);
    TrainConfig bad = tiny();
    bad.beta2 = 1.0f;
    CHECK_THROWS_AS(bad.validate(), std::invalid_argument);
    bad = tiny();
    bad.n_head = 3;  // does not divide 32 channels
    CHECK_THROWS_AS(bad.validate(), std::invalid_argument);
    // A corpus whose validation split is shorter than one block.
    CHECK_THROWS_AS(Trainer(tiny(), make_dataset(word_corpus(40))), std::invalid_argument);
}

TEST_CASE("bad checkpoints are rejected with CheckpointError") {
    const TextDataset data = make_dataset(word_corpus(2000));
    TempDir tmp("badckpt");
    Trainer trainer(tiny(), data);
    trainer.train_step();
    const fs::path good = tmp.path / "good";
    trainer.save(good);
    // Each damage below is found by its own check, as in a checkpoint written without
    // checksums; with them, any changed byte is refused first (test_checkpoint.cpp).
    auto broken = [&](const std::string& name) {
        const fs::path dir = tmp.path / name;
        fs::copy(good, dir, fs::copy_options::recursive);
        fs::remove(dir / "checksums.json");
        return dir;
    };
    SUBCASE("missing directory") {
        CHECK_THROWS_AS(Trainer::load(tmp.path / "nothing", data), CheckpointError);
    }
    SUBCASE("weights only, no training state") {
        const fs::path dir = broken("weights_only");
        fs::remove(dir / "trainer.json");
        CHECK_THROWS_AS(Trainer::load(dir, data), CheckpointError);
    }
    SUBCASE("truncated optimizer moments") {
        const fs::path dir = broken("truncated");
        fs::resize_file(dir / "optimizer" / "m.npy", fs::file_size(dir / "optimizer" / "m.npy") / 2);
        CHECK_THROWS_AS(Trainer::load(dir, data), CheckpointError);
    }
    SUBCASE("moments of the wrong size") {
        const fs::path dir = broken("wrong_size");
        const float zeros[3] = {0, 0, 0};
        write_npy(dir / "optimizer" / "v.npy", {3}, zeros);
        CHECK_THROWS_AS(Trainer::load(dir, data), CheckpointError);
    }
    SUBCASE("training state for another model") {
        const fs::path dir = broken("other_model");
        std::ifstream in(dir / "trainer.json");
        std::string text((std::istreambuf_iterator<char>(in)), {});
        in.close();
        const auto at = text.find("\"n_layer\": 2");
        REQUIRE(at != std::string::npos);
        text.replace(at, 12, "\"n_layer\": 3");
        std::ofstream(dir / "trainer.json") << text;
        CHECK_THROWS_AS(Trainer::load(dir, data), CheckpointError);
    }
    SUBCASE("not JSON") {
        const fs::path dir = broken("not_json");
        std::ofstream(dir / "trainer.json") << "{ step: ";
        CHECK_THROWS_AS(Trainer::load(dir, data), CheckpointError);
    }
    SUBCASE("another corpus") {
        CHECK_THROWS_AS(Trainer::load(good, make_dataset(word_corpus(2000) + "XYZ")), CheckpointError);
    }
}

TEST_CASE("dumped gradients are the model's gradients on the first batch, by state_dict name") {
    const TextDataset data = make_dataset(word_corpus(2000));
    TempDir tmp("grads");
    Trainer trainer(tiny(), data);
    const float loss = dump_gradients(trainer, tmp.path / "dump");
    // The same batch through a second, identical model gives the same loss and gradients.
    Trainer twin(tiny(), data);
    std::vector<int> x, y;
    twin.first_batch(x, y);
    twin.model().train(false);
    CHECK(twin.model().forward(x.data(), y.data(), 8, 32) == loss);
    twin.model().zero_grad();
    twin.model().backward();
    for (const ParameterInfo& p : twin.model().parameter_table()) {
        CAPTURE(p.name);
        const NpyArray g = read_npy(tmp.path / "dump" / "grad" / (p.name + ".npy"));
        CHECK(g.shape == p.shape);
        CHECK(std::equal(g.data.begin(), g.data.end(), twin.model().gradients().begin() + static_cast<long>(p.offset)));
    }
    const NpyArray xs = read_npy(tmp.path / "dump" / "x.npy");
    CHECK(xs.shape == std::vector<std::size_t>{8, 32});
    CHECK(xs.data[0] == static_cast<float>(x[0]));
    CHECK(load_config(tmp.path / "dump" / "weights").n_layer == 2);
    // The first real step then uses that same batch.
    CHECK(trainer.train_step().loss == loss);  // dropout is 0, so train and eval mode agree
}
