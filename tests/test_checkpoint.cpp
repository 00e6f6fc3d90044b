// The weights directory: round trips, nanoGPT's names and shapes, and clear errors.
#include "attn/checkpoint.hpp"
#include "attn/npy.hpp"
#include "scratch.hpp"

#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

using namespace attn;

namespace {
namespace fs = std::filesystem;

GPTConfig small_config(bool bias = true) {
    GPTConfig c;
    c.vocab_size = 13;
    c.block_size = 8;
    c.n_layer = 2;
    c.n_head = 2;
    c.n_embd = 8;
    c.bias = bias;
    return c;
}

// A fresh copy of a model's weights directory, for a test to damage. Without its
// checksums.json (as nanoGPT's export has none), so that each damage meets its own check;
// with it, any changed byte is refused first (the checksum tests below).
fs::path fresh_dir(const std::string& name, bool checksums = false) {
    const fs::path dir = attn_test::scratch("attn_checkpoint_" + name);
    fs::remove_all(dir);
    GPT model(small_config(), 3);
    save_checkpoint(dir, model, {"abcdefghijklm", 0});
    if (!checksums) fs::remove(dir / "checksums.json");
    return dir;
}

// The message of the CheckpointError that loading `dir` throws, or "" if it loads.
std::string load_error(const fs::path& dir) {
    try {
        load_checkpoint(dir);
    } catch (const CheckpointError& e) {
        return e.what();
    }
    return "";
}

void write_text(const fs::path& file, const std::string& text) { std::ofstream(file) << text; }
}  // namespace

TEST_CASE("a checkpoint written and reloaded gives bit-identical logits and its metadata") {
    for (bool bias : {true, false}) {
        CAPTURE(bias);
        GPT model(small_config(bias), 7);
        const fs::path dir = attn_test::scratch("attn_checkpoint_roundtrip");
        fs::remove_all(dir);
        save_checkpoint(dir, model, {"abcdefghijklm", 1234});
        CheckpointInfo info;
        GPT loaded = load_checkpoint(dir, &info);
        CHECK(info.vocab == "abcdefghijklm");
        CHECK(info.step == 1234);
        CHECK(loaded.parameters() == model.parameters());
        const std::vector<int> x = {1, 2, 3, 4, 5, 6, 7, 8, 12, 0, 1, 2};
        model.forward(x, {}, 2, 6);
        loaded.forward(x, {}, 2, 6);
        CHECK(loaded.logits() == model.logits());
    }
}

TEST_CASE("a model without the attention scale keeps it through a checkpoint, and others omit the key") {
    for (bool scaled : {true, false}) {
        CAPTURE(scaled);
        GPTConfig config = small_config();
        config.scaled_attention = scaled;
        GPT model(config, 7);
        const fs::path dir = attn_test::scratch("attn_checkpoint_unscaled");
        fs::remove_all(dir);
        save_checkpoint(dir, model, {"abcdefghijklm", 0});
        std::ifstream in(dir / "config.json");
        const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        // nanoGPT's config has no such key: it is written only for the unscaled model.
        CHECK((json.find("scaled_attention") != std::string::npos) == !scaled);
        GPT loaded = load_checkpoint(dir);
        CHECK(loaded.config().scaled_attention == scaled);
        const std::vector<int> x = {1, 2, 3, 4, 5, 6, 7, 8};
        model.forward(x, {}, 1, 8);
        loaded.forward(x, {}, 1, 8);
        CHECK(loaded.logits() == model.logits());
        fs::remove_all(dir);
    }
}

TEST_CASE("training resumed from a checkpoint and optimizer state repeats the losses bit for bit") {
    GPTConfig config = small_config();
    config.dropout = 0.1f;
    GPT model(config, 5);
    AdamW optimizer;
    const std::vector<int> x = {1, 2, 3, 4, 5, 6, 7, 8, 12, 0, 1, 2};
    const std::vector<int> y = {2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3};
    auto step = [&](GPT& m, AdamW& opt) {
        const float loss = m.forward(x, y, 2, 6);
        m.zero_grad();
        m.backward();
        clip_grad_norm(m, 1.0f);
        opt.step(m, 1e-2f);
        return loss;
    };
    for (int i = 0; i < 3; ++i) step(model, optimizer);
    const fs::path dir = attn_test::scratch("attn_checkpoint_resume");
    fs::remove_all(dir);
    save_checkpoint(dir, model, {"", 3});
    save_optimizer(dir, optimizer);
    GPT resumed = load_checkpoint(dir);
    AdamW resumed_optimizer = load_optimizer(dir, resumed);
    CHECK(resumed_optimizer.step_count == 3);
    for (int i = 0; i < 3; ++i) {
        CAPTURE(i);
        model.seed_dropout(100 + i);  // the same dropout masks on both sides
        resumed.seed_dropout(100 + i);
        CHECK(step(resumed, resumed_optimizer) == step(model, optimizer));
    }
    CHECK(resumed.parameters() == model.parameters());
    fs::remove(dir / "adamw.v.npy");
    CHECK_THROWS_AS(load_optimizer(dir, resumed), CheckpointError);
}

TEST_CASE("a checkpoint has one file per state_dict key with PyTorch's shapes") {
    const fs::path dir = fresh_dir("names");
    const std::vector<std::pair<std::string, std::vector<std::size_t>>> expected = {
        {"transformer.wte.weight", {13, 8}},
        {"transformer.wpe.weight", {8, 8}},
        {"transformer.h.0.ln_1.weight", {8}},
        {"transformer.h.0.ln_1.bias", {8}},
        {"transformer.h.0.attn.c_attn.weight", {24, 8}},
        {"transformer.h.0.attn.c_attn.bias", {24}},
        {"transformer.h.0.attn.c_proj.weight", {8, 8}},
        {"transformer.h.1.ln_2.weight", {8}},
        {"transformer.h.1.mlp.c_fc.weight", {32, 8}},
        {"transformer.h.1.mlp.c_proj.weight", {8, 32}},
        {"transformer.h.1.mlp.c_proj.bias", {8}},
        {"transformer.ln_f.weight", {8}},
        {"lm_head.weight", {13, 8}},
    };
    for (const auto& [name, shape] : expected) {
        CAPTURE(name);
        CHECK(read_npy(dir / (name + ".npy")).shape == shape);
    }
    CHECK(read_npy(dir / "lm_head.weight.npy").data ==
          read_npy(dir / "transformer.wte.weight.npy").data);
}

TEST_CASE("a missing parameter file is named in the error") {
    const fs::path dir = fresh_dir("missing");
    fs::remove(dir / "transformer.h.1.mlp.c_fc.bias.npy");
    const std::string e = load_error(dir);
    CHECK(e.find("transformer.h.1.mlp.c_fc.bias.npy") != std::string::npos);
}

TEST_CASE("a parameter of the wrong shape is named with the expected and the actual shape") {
    const fs::path dir = fresh_dir("shape");
    const std::vector<float> zeros(24 * 8, 0.0f);
    const fs::path file = dir / "transformer.h.0.attn.c_attn.weight.npy";
    write_npy(file, {8, 24}, zeros.data());
    CHECK(load_error(dir) == file.string() + ": expected shape (24, 8), got (8, 24)");
}

TEST_CASE("a truncated parameter file is reported, naming the file") {
    const fs::path dir = fresh_dir("truncated");
    const fs::path file = dir / "transformer.wpe.weight.npy";
    const auto size = fs::file_size(file);
    fs::resize_file(file, size - 10);
    const std::string e = load_error(dir);
    CHECK(e.find("transformer.wpe.weight.npy") != std::string::npos);
}

TEST_CASE("a NaN or an infinity in a parameter is refused, naming the file and the index") {
    // Such weights make every loss NaN: found at load time, before a run writes a null loss.
    const fs::path dir = fresh_dir("nonfinite");
    const fs::path file = dir / "transformer.h.1.ln_2.bias.npy";
    std::vector<float> values(8, 0.5f);
    values[5] = std::numeric_limits<float>::quiet_NaN();
    write_npy(file, {8}, values.data());
    CHECK(load_error(dir) == file.string() + ": holds NaN at index 5");
    values[5] = 0.0f;
    values[2] = -std::numeric_limits<float>::infinity();
    write_npy(file, {8}, values.data());
    CHECK(load_error(dir) == file.string() + ": holds an infinity at index 2");
}

TEST_CASE("an LM head that differs from the tied embedding is rejected") {
    const fs::path dir = fresh_dir("untied");
    const std::vector<float> ones(13 * 8, 1.0f);
    write_npy(dir / "lm_head.weight.npy", {13, 8}, ones.data());
    CHECK(load_error(dir).find("tied") != std::string::npos);
}

TEST_CASE("a config that is missing a size, malformed or inconsistent is rejected") {
    const fs::path dir = fresh_dir("config");
    const fs::path file = dir / "config.json";
    SUBCASE("missing size") {
        write_text(file, R"({"vocab_size": 13, "block_size": 8, "n_layer": 2, "n_head": 2})");
        CHECK(load_error(dir) == file.string() + ": missing \"n_embd\"");
    }
    SUBCASE("wrong type") {
        write_text(file, R"({"vocab_size": "13", "block_size": 8, "n_layer": 2, "n_head": 2,
                             "n_embd": 8})");
        CHECK(load_error(dir) == file.string() + ": \"vocab_size\" has the wrong type: \"13\"");
    }
    SUBCASE("heads do not divide the width") {
        write_text(file, R"({"vocab_size": 13, "block_size": 8, "n_layer": 2, "n_head": 3,
                             "n_embd": 8})");
        CHECK(load_error(dir) == file.string() +
                                     ": GPT config: n_embd must be a positive multiple of "
                                     "n_head, got n_embd 8 and n_head 3");
    }
    SUBCASE("not JSON") {
        write_text(file, "n_embd = 8\n");
        CHECK(load_error(dir).find(file.string() + ": not valid JSON") == 0);
    }
    SUBCASE("a config that disagrees with the weights: the first mis-shaped tensor is named") {
        write_text(file, R"({"vocab_size": 13, "block_size": 8, "n_layer": 2, "n_head": 2,
                             "n_embd": 16})");
        CHECK(load_error(dir) == (dir / "transformer.wte.weight.npy").string() +
                                     ": expected shape (13, 16), got (13, 8)");
    }
    SUBCASE("no config at all") {
        fs::remove(file);
        CHECK(load_error(dir).find(file.string() + ": cannot open") == 0);
    }
}

TEST_CASE("weights_dir_of takes a run folder or a weights directory, and names a folder that is neither") {
    const fs::path run = attn_test::scratch("attn_checkpoint_run_folder");
    fs::create_directories(run / "checkpoint");
    std::ofstream(run / "checkpoint" / "config.json") << "{}";
    CHECK(attn::weights_dir_of(run) == run / "checkpoint");                 // a train_gpt run
    CHECK(attn::weights_dir_of(run / "checkpoint") == run / "checkpoint");  // the weights themselves
    const fs::path empty = attn_test::scratch("attn_checkpoint_empty_folder");
    fs::create_directories(empty);
    CHECK_THROWS_WITH_AS(attn::weights_dir_of(empty),
                         doctest::Contains("not a checkpoint (no config.json in it"), std::runtime_error);
    CHECK_THROWS_WITH_AS(attn::weights_dir_of(empty / "nothing"),
                         doctest::Contains("no such checkpoint or run folder"), std::runtime_error);
}

TEST_CASE("a changed byte in any file of a checkpoint is refused by its checksum, naming the file") {
    // Every file, one byte at a drawn place changed by a drawn bit: the load names that file.
    std::mt19937 draw(53);
    const fs::path good = fresh_dir("checksummed", true);
    REQUIRE(fs::exists(good / "checksums.json"));
    CHECK(load_error(good).empty());
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(good)) names.push_back(e.path().filename().string());
    REQUIRE(names.size() >= 10);
    for (const std::string& name : names) {
        const fs::path dir = attn_test::scratch("attn_checkpoint_flipped");
        fs::remove_all(dir);
        fs::copy(good, dir);
        std::ifstream in(dir / name, std::ios::binary);
        std::string bytes((std::istreambuf_iterator<char>(in)), {});
        in.close();
        const std::size_t at = draw() % bytes.size();
        bytes[at] = static_cast<char>(bytes[at] ^ (1 << (draw() % 8)));
        std::ofstream(dir / name, std::ios::binary | std::ios::trunc) << bytes;
        const std::string e = load_error(dir);
        INFO(name, " byte ", at, ": ", e);
        // checksums.json itself: no longer JSON, or an entry that no longer matches its file.
        CHECK(e.find(name == "checksums.json" ? std::string("checksums.json") : (dir / name).string()) !=
              std::string::npos);
        CHECK(e.find('\n') == std::string::npos);
    }
}

TEST_CASE("file_checksum is FNV-1a 64 of the file's bytes") {
    // Independent reference: FNV-1a's published test vectors (Fowler, Noll, Vo): "" and "a".
    const fs::path dir = attn_test::scratch("attn_checkpoint_fnv");
    fs::create_directories(dir);
    std::ofstream(dir / "empty", std::ios::binary).close();
    std::ofstream(dir / "a", std::ios::binary) << "a";
    CHECK(file_checksum(dir / "empty") == 0xcbf29ce484222325ull);
    CHECK(file_checksum(dir / "a") == 0xaf63dc4c8601ec8cull);
}

TEST_CASE("initial_values gives the constructor's weights of any runs, bit for bit") {
    // Generated models (biases or not, learned or rotary positions, 1 to 3 layers) and runs
    // across tensor boundaries, each compared with the whole model the constructor makes.
    std::mt19937 draw(2026);
    for (int trial = 0; trial < 24; ++trial) {
        GPTConfig c = small_config(trial % 2 == 0);
        c.n_layer = 1 + trial % 3;
        if (trial % 4 == 1) c.position = Position::rope;
        const std::uint64_t seed = draw();
        const GPT whole(c, seed);
        const GPT empty(c, seed, GPTBuffers{false, false});
        CHECK(empty.parameters().empty());
        const std::size_t P = c.num_parameters();
        std::vector<std::pair<std::size_t, std::size_t>> runs;
        for (int k = 0; k < 6; ++k) {
            const std::size_t offset = draw() % P;
            runs.emplace_back(offset, 1 + draw() % (P - offset));
        }
        runs.emplace_back(0, P);
        const std::vector<float> got = empty.initial_values(runs);
        std::size_t at = 0, differ = 0;
        for (const auto& [offset, size] : runs) {
            for (std::size_t i = 0; i < size; ++i) differ += got[at + i] != whole.parameters()[offset + i];
            at += size;
        }
        CHECK(at == got.size());
        CHECK(differ == 0);
    }
}
