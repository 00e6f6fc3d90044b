#include "attn/data.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>

using namespace attn;

namespace {
std::filesystem::path write_temp(const std::string& name, const std::string& bytes) {
    const auto p = std::filesystem::temp_directory_path() / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
}
}  // namespace

TEST_CASE("the vocabulary is the sorted distinct characters, and encoding round-trips") {
    const auto v = CharVocab::from_text("hello, world\n");
    CHECK(v.chars() == "\n ,dehlorw");
    CHECK(v.size() == 10);
    CHECK(v.encode("hello") == std::vector<int>{5, 4, 6, 6, 7});
    CHECK(v.decode(v.encode("low, row\n")) == "low, row\n");
}

TEST_CASE("characters are code points, so UTF-8 text encodes one id per character") {
    const auto v = CharVocab::from_text("naïve café");
    CHECK(v.encode("ï").size() == 1);
    CHECK(v.decode(v.encode("café")) == "café");
    CHECK(CharVocab::from_chars(v.chars()).chars() == v.chars());
}

TEST_CASE("characters outside the vocabulary and bad ids are clear errors") {
    const auto v = CharVocab::from_text("abc");
    CHECK_THROWS_WITH_AS(v.encode("abz"), "the character 'z' is not in the model's vocabulary",
                         std::invalid_argument);
    CHECK_THROWS_AS(v.decode({0, 3}), std::invalid_argument);
    CHECK_THROWS_AS(CharVocab::from_chars("aba"), std::invalid_argument);
    CHECK_THROWS_AS(CharVocab::from_chars(""), std::invalid_argument);
}

TEST_CASE("a bad corpus gives one clear error naming the file") {
    CHECK_THROWS_WITH_AS(read_corpus("/nonexistent/corpus.txt"), doctest::Contains("no such file"),
                         std::runtime_error);
    CHECK_THROWS_WITH_AS(read_corpus(write_temp("attn_empty.txt", "")), doctest::Contains("empty"),
                         std::runtime_error);
    CHECK_THROWS_WITH_AS(read_corpus(write_temp("attn_nul.txt", std::string("ab\0cd", 5))),
                         doctest::Contains("NUL"), std::runtime_error);
    CHECK_THROWS_WITH_AS(read_corpus(write_temp("attn_latin1.txt", "caf\xe9!")),
                         doctest::Contains("not UTF-8"), std::runtime_error);
    CHECK(read_corpus(write_temp("attn_ok.txt", "To be.\n")) == "To be.\n");
}

TEST_CASE("the split keeps the first 90 percent for training, in order") {
    std::string text;
    for (int i = 0; i < 100; ++i) text += static_cast<char>('a' + i % 26);
    const auto d = make_dataset(text);
    CHECK(d.train.size() == 90);
    CHECK(d.val.size() == 10);
    CHECK(d.vocab.decode(d.train).substr(0, 3) == "abc");
    CHECK(d.vocab.decode(d.val) == text.substr(90));
    CHECK_THROWS_AS(make_dataset("abcdefghij", 0.1, 8), std::invalid_argument);
}

TEST_CASE("targets are the inputs shifted by one token") {
    std::vector<int> data(50);
    for (int i = 0; i < 50; ++i) data[static_cast<std::size_t>(i)] = i;
    Rng rng(9);
    std::vector<int> x, y;
    sample_batch(data, 4, 8, rng, x, y);
    REQUIRE(x.size() == 32);
    for (std::size_t i = 0; i < 32; ++i) {
        CAPTURE(i);
        CHECK(y[i] == x[i] + 1);  // data[k] = k, so the next token is one more
        if (i % 8) CHECK(x[i] == x[i - 1] + 1);
    }
    CHECK_THROWS_AS(sample_batch(data, 1, 50, rng, x, y), std::invalid_argument);
}

TEST_CASE("the learning rate warms up linearly, then decays along a cosine to its floor") {
    // nanoGPT's recipe: warm-up 100, decay to step 5000, from 1e-3 to 1e-4. Hand values:
    // step 0 is lr/(warmup+1); step 100 is the peak; halfway through the decay, at step
    // 2550, the cosine is 0 so the rate is the mean of peak and floor; from 5000 on, the floor.
    CHECK(cosine_lr(0, 100, 5000, 1e-3, 1e-4) == doctest::Approx(1e-3 / 101));
    CHECK(cosine_lr(50, 100, 5000, 1e-3, 1e-4) == doctest::Approx(1e-3 * 51 / 101));
    CHECK(cosine_lr(100, 100, 5000, 1e-3, 1e-4) == doctest::Approx(1e-3));
    CHECK(cosine_lr(2550, 100, 5000, 1e-3, 1e-4) == doctest::Approx(5.5e-4));
    CHECK(cosine_lr(5000, 100, 5000, 1e-3, 1e-4) == doctest::Approx(1e-4));
    CHECK(cosine_lr(9000, 100, 5000, 1e-3, 1e-4) == doctest::Approx(1e-4));
}
