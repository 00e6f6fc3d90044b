#include "attn/data.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <fstream>

using namespace attn;

namespace {
std::filesystem::path write_temp(const std::string& name, const std::string& bytes) {
    const auto p = attn_test::scratch(name);
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
    CHECK(v.can_encode("row, row\n"));
    CHECK_FALSE(v.can_encode("rows"));
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
    CHECK_THROWS_WITH_AS(read_corpus(attn_test::scratch_folder()),
                         doctest::Contains("is a directory"), std::runtime_error);
    // Unreadable: opening fails where permissions stop it (not for root, who reads anything),
    // and a file whose reads fail part of the way (the process's own memory at address 0,
    // which is unmapped) is refused rather than read as a shorter text, for root too.
    const auto locked = write_temp("attn_locked.txt", "To be.\n");
    std::filesystem::permissions(locked, std::filesystem::perms::none);
    if (!std::ifstream(locked)) {
        CHECK_THROWS_WITH_AS(read_corpus(locked), doctest::Contains("cannot be read"), std::runtime_error);
    }
    CHECK_THROWS_WITH_AS(read_corpus("/proc/self/mem"), doctest::Contains("/proc/self/mem"),
                         std::runtime_error);
    CHECK(read_corpus(write_temp("attn_ok.txt", "To be.\n")) == "To be.\n");
}

TEST_CASE("the course's corpus is tiny shakespeare, in the course's own folder") {
    const std::filesystem::path p = course_corpus();
    CHECK(p.filename() == "tinyshakespeare.txt");
    CHECK(p.parent_path().filename() == "data");
    CHECK(std::filesystem::exists(p.parent_path().parent_path() / "workbook"));  // the course's root
    const std::string text = read_corpus(p);
    CHECK(text.size() == 1115394);  // nanoGPT's figure for the file, and the sha256 workbook data checks
    CHECK(CharVocab::from_text(text).size() == 65);
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

TEST_CASE("a window holds T tokens and the T that follow each, and a window past the end is refused") {
    std::vector<int> tokens(20);
    for (int i = 0; i < 20; ++i) tokens[static_cast<std::size_t>(i)] = 100 + i;
    std::vector<int> x(8), y(8);
    token_window(tokens, 11, 8, x.data(), y.data());  // the last window that fits: y ends at 19
    CHECK(x.front() == 111);
    CHECK(x.back() == 118);
    CHECK(y.front() == 112);
    CHECK(y.back() == 119);
    CHECK_THROWS_WITH_AS(token_window(tokens, 12, 8, x.data(), y.data(), "the validation split"),
                         "the validation split has 20 tokens; a window of T = 8 from position 12 needs at least 21",
                         std::invalid_argument);
    CHECK_THROWS_AS(token_window(tokens, 0, 20, x.data(), y.data()), std::invalid_argument);
    CHECK_THROWS_AS(token_window(tokens, 0, 25, x.data(), y.data()), std::invalid_argument);
    CHECK_THROWS_AS(token_window(tokens, static_cast<std::size_t>(-1), 8, x.data(), y.data()),
                    std::invalid_argument);
    CHECK_THROWS_AS(token_window({}, 0, 0, x.data(), y.data()), std::invalid_argument);
}

TEST_CASE("consecutive windows score the same first n targets at every T that divides n") {
    std::vector<int> tokens(33);
    for (int i = 0; i < 33; ++i) tokens[static_cast<std::size_t>(i)] = i;
    for (std::size_t T : {1u, 2u, 4u, 8u, 16u, 32u}) {
        CAPTURE(T);
        std::vector<int> x, y;
        consecutive_windows(tokens, 32, T, x, y, "the text");
        REQUIRE(x.size() == 32);
        for (std::size_t i = 0; i < 32; ++i) {
            CHECK(x[i] == static_cast<int>(i));  // windows laid end to end: the first 32 tokens
            CHECK(y[i] == static_cast<int>(i) + 1);
        }
    }
    std::vector<int> x, y;
    CHECK_THROWS_WITH_AS(consecutive_windows(tokens, 64, 16, x, y, "the validation split"),
                         "the validation split has 33 tokens; scoring 64 targets at T = 16 needs at least 65",
                         std::invalid_argument);
    CHECK_THROWS_AS(consecutive_windows(tokens, 33, 32, x, y, "the text"), std::invalid_argument);  // 33 = 32 + 1: no target for the last
    CHECK_THROWS_AS(consecutive_windows(tokens, 24, 16, x, y, "the text"), std::invalid_argument);  // not whole windows
    CHECK_THROWS_AS(consecutive_windows(tokens, 0, 0, x, y, "the text"), std::invalid_argument);
}

TEST_CASE("a short text scores fewer targets, a multiple of the longest window, or is refused") {
    CHECK(targets_to_score(std::vector<int>(5000), 4096, 512, "v") == 4096);
    CHECK(targets_to_score(std::vector<int>(4097), 4096, 512, "v") == 4096);
    CHECK(targets_to_score(std::vector<int>(4096), 4096, 512, "v") == 3584);  // 4096 targets need 4097 tokens
    CHECK(targets_to_score(std::vector<int>(2452), 4096, 512, "v") == 2048);
    CHECK(targets_to_score(std::vector<int>(513), 4096, 512, "v") == 512);
    CHECK_THROWS_WITH_AS(targets_to_score(std::vector<int>(512), 4096, 512, "the validation split"),
                         "the validation split has 512 tokens; scoring one window of T = 512 needs at least 513",
                         std::invalid_argument);
    CHECK_THROWS_AS(targets_to_score({}, 4096, 512, "v"), std::invalid_argument);
}

TEST_CASE("a prompt the corpus cannot spell is replaced by as many of the corpus's own characters") {
    const TextDataset d = make_dataset("the quick brown fox jumps over the lazy dog\n");
    CHECK(fitting_prompt(d.vocab, "the", d.val) == "the");
    REQUIRE(d.val.size() == 4);  // 44 characters: 40 to train on, 4 to validate on
    CHECK(fitting_prompt(d.vocab, "ROMEO:", d.val) == d.vocab.decode(d.val));  // 6 wanted, 4 there
    CHECK(fitting_prompt(d.vocab, "RO", d.val) ==
          d.vocab.decode(std::vector<int>(d.val.begin(), d.val.begin() + 2)));
    CHECK(fitting_prompt(d.vocab, "ïé", d.train) == "th");  // counted in characters, not bytes
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
