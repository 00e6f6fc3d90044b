// inspect_attention: the attention weights of every layer and head of a trained GPT on one
// prompt, written as a page that shows them (tools/inspector/: vanilla JavaScript, offline).
//
//   inspect_attention CHECKPOINT [--prompt TEXT] --out DIR [--corpus NAME]
//
// CHECKPOINT is a weights directory (config.json + .npy files) or a train_gpt run folder
// holding checkpoint/. The weights come from the library's own forward pass, which keeps
// them in GPT::activations().att; nothing here recomputes attention. The page's files go to
// DIR: index.html, inspector.js, inspector.css and attention_data.js (the weights).
//
// An encoder-decoder checkpoint (lesson 17's, config.json "model": "encoder_decoder") is
// shown the same way, with the prompt as its input: the model writes its answer greedily,
// then reads it back, and the page shows the three attentions of that pass, the encoder's
// self-attention, the decoder's and the cross-attention of each output character over the
// input's characters (EncoderDecoder::attention_weights).
//
// Bad input (no checkpoint, a prompt with characters outside the vocabulary or longer than
// the block) is one line on stderr and a non-zero exit status.
#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/encoder_decoder.hpp"
#include "attn/entropy.hpp"
#include "attn/gpt.hpp"

#include "tool_main.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>

using namespace attn;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The prompt the course site shows: a line every character of which tiny shakespeare has.
const char* const default_prompt = "ROMEO:\nBut soft, what light through yonder window breaks?";
// The input an encoder-decoder gets when none is given: a date, lesson 17's task.
const char* const default_source = "the 23rd of November, 2026";

struct Flags {
    fs::path checkpoint;
    std::string prompt = default_prompt;
    fs::path out;
    std::string corpus;  // the corpus's name; default: corpus.txt in the checkpoint, if any
    fs::path assets = ATTN_INSPECTOR_ASSETS;
    bool prompt_given = false;
};

// The corpus the model learnt from, when its folder records it (lesson 11 writes corpus.txt).
std::string corpus_of(const fs::path& weights, const fs::path& given) {
    for (const fs::path& dir : {weights, given, given.parent_path()}) {
        std::ifstream in(dir / "corpus.txt");
        std::string name;
        if (in && std::getline(in, name) && !name.empty()) return name;
    }
    return "";
}

// Rounds to 4 decimals: the page shows 2, and 4 keep the JSON small.
double rounded(float x) { return std::round(static_cast<double>(x) * 1e4) / 1e4; }

void copy_asset(const fs::path& assets, const std::string& name, const fs::path& out) {
    if (!fs::exists(assets / name))
        throw std::runtime_error((assets / name).string() + ": the inspector's page is missing");
    fs::copy_file(assets / name, out / name, fs::copy_options::overwrite_existing);
}

// One attention of the encoder-decoder for the page: [layer][head][query][key] over the keys
// each query may see (all of them, or 0..query when causal; none past the real length), and
// each head's mean entropy.
json attention_json(const EncoderDecoder& model, int which, int layers, int T_q, int T_k, bool causal) {
    json weights = json::array(), entropy = json::array();
    const int NH = model.config().n_head;
    for (int l = 0; l < layers; ++l) {
        const std::vector<float>& att = model.attention_weights(which, l);  // (1, NH, T_q, T_k)
        json heads = json::array(), per_head = json::array();
        for (int h = 0; h < NH; ++h) {
            json rows = json::array();
            double total = 0.0;
            for (int i = 0; i < T_q; ++i) {
                json row = json::array();
                for (int j = 0; j < (causal ? i + 1 : T_k); ++j) {
                    const float w = att[(static_cast<std::size_t>(h) * T_q + i) * T_k + j];
                    row.push_back(rounded(w));
                    if (w > 0) total -= static_cast<double>(w) * std::log(static_cast<double>(w));
                }
                rows.push_back(std::move(row));
            }
            heads.push_back(std::move(rows));
            per_head.push_back(rounded(static_cast<float>(total / T_q)));
        }
        weights.push_back(std::move(heads));
        entropy.push_back(std::move(per_head));
    }
    return {{"weights", weights}, {"entropy", entropy}, {"causal", causal}};
}

json encoder_decoder_data(const Flags& f, const fs::path& weights) {
    Seq2SeqVocab vocab;
    std::int64_t step = 0;
    EncoderDecoder model = load_encoder_decoder(weights, vocab, &step);
    const EncoderDecoderConfig& c = model.config();
    const std::string source = f.prompt_given ? f.prompt : default_source;
    if (source.empty()) throw std::invalid_argument("the prompt is empty");
    std::vector<int> ids;
    try {
        ids = vocab.encode(source);
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("the prompt: " + std::string(e.what()) + " (this model's " +
                                    std::to_string(vocab.chars().size()) + " characters)");
    }
    const int S = static_cast<int>(ids.size());
    if (S > c.max_source) {
        throw std::invalid_argument("the prompt has " + std::to_string(S) +
                                    " characters; this model reads at most " +
                                    std::to_string(c.max_source) + " (its max_source)");
    }
    // The answer, written greedily, then read back: the decoder's pass over <bos> + answer
    // holds the weights of every query that wrote a character (and the one that wrote <eos>).
    const std::vector<int> answer = model.greedy_decode({ids}, c.max_target - 1)[0];
    model.forward(make_batch({ids}, {answer}), false);
    const int T = static_cast<int>(answer.size()) + 1;
    json source_chars = json::array(), decoder_in = json::array(), written = json::array();
    for (int id : ids) source_chars.push_back(vocab.token(id));
    decoder_in.push_back(vocab.token(Seq2SeqVocab::bos));
    for (int id : answer) {
        decoder_in.push_back(vocab.token(id));
        written.push_back(vocab.token(id));
    }
    written.push_back(vocab.token(Seq2SeqVocab::eos));
    json cross = attention_json(model, 2, c.n_decoder_layer, T, S, false);
    cross["name"] = "cross-attention";
    cross["rows"] = "written";
    cross["cols"] = "source";
    json encoder = attention_json(model, 0, c.n_encoder_layer, S, S, false);
    encoder["name"] = "encoder self-attention";
    encoder["rows"] = "source";
    encoder["cols"] = "source";
    json decoder = attention_json(model, 1, c.n_decoder_layer, T, T, true);
    decoder["name"] = "decoder self-attention";
    decoder["rows"] = "decoder_input";
    decoder["cols"] = "decoder_input";
    return {{"kind", "encoder_decoder"},
            {"checkpoint", fs::absolute(f.checkpoint).lexically_normal().string()},
            {"step", step},
            {"n_encoder_layer", c.n_encoder_layer}, {"n_decoder_layer", c.n_decoder_layer},
            {"n_head", c.n_head}, {"n_embd", c.n_embd}, {"vocab_size", c.vocab_size},
            {"source", source_chars}, {"decoder_input", decoder_in}, {"written", written},
            {"answer", vocab.decode(answer)},
            {"attentions", json::array({cross, encoder, decoder})}};
}

void write_page(const Flags& f, const json& data) {
    fs::create_directories(f.out);
    {
        std::ofstream js(f.out / "attention_data.js");
        js << "// Written by inspect_attention: the attention weights of one prompt.\n"
           << "window.ATTN_INSPECTOR_DATA = " << data.dump() << ";\n";
        if (!js) throw std::runtime_error((f.out / "attention_data.js").string() + ": cannot be written");
    }
    for (const char* name : {"index.html", "inspector.js", "inspector.css"}) copy_asset(f.assets, name, f.out);
    std::cout << fs::absolute(f.out / "index.html").lexically_normal().string() << "\n";
}

int run(const Flags& f) {
    const fs::path weights = weights_dir_of(f.checkpoint);
    if (is_encoder_decoder_checkpoint(weights)) {
        write_page(f, encoder_decoder_data(f, weights));
        return 0;
    }
    CheckpointInfo info;
    GPT model = load_checkpoint(weights, &info);
    const GPTConfig& c = model.config();
    if (info.vocab.empty())
        throw std::runtime_error((weights / "config.json").string() + ": records no vocabulary");
    const CharVocab vocab = CharVocab::from_chars(info.vocab);
    if (f.prompt.empty()) throw std::invalid_argument("the prompt is empty");
    std::vector<int> ids;
    try {
        ids = vocab.encode(f.prompt);
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("the prompt: " + std::string(e.what()) + " (its " +
                                    std::to_string(vocab.size()) + " characters)");
    }
    const int T = static_cast<int>(ids.size());
    if (T > c.block_size) {
        throw std::invalid_argument("the prompt has " + std::to_string(T) +
                                    " characters; this model reads at most " +
                                    std::to_string(c.block_size) + " (its block size)");
    }

    // The forward pass, in evaluation mode; its activations keep every layer's weights.
    model.train(false);
    model.forward(ids.data(), nullptr, 1, T);
    const std::vector<float>& att = model.activations().att;  // (L, B=1, NH, T, T)
    const std::size_t L = static_cast<std::size_t>(c.n_layer), NH = static_cast<std::size_t>(c.n_head);
    const std::size_t TT = static_cast<std::size_t>(T) * static_cast<std::size_t>(T);

    json layers = json::array();
    json entropy = json::array();
    for (std::size_t l = 0; l < L; ++l) {
        Tensor4 w = xt::zeros<float>({std::size_t{1}, NH, std::size_t(T), std::size_t(T)});
        json heads = json::array();
        for (std::size_t h = 0; h < NH; ++h) {
            const float* a = att.data() + (l * NH + h) * TT;  // (T, T)
            json rows = json::array();
            for (int i = 0; i < T; ++i) {
                json row = json::array();  // the keys 0..i this query may see
                for (int j = 0; j <= (c.causal ? i : T - 1); ++j) {
                    row.push_back(rounded(a[i * T + j]));
                    w(0, h, static_cast<std::size_t>(i), static_cast<std::size_t>(j)) = a[i * T + j];
                }
                rows.push_back(std::move(row));
            }
            heads.push_back(std::move(rows));
        }
        const Tensor1 mean = mean_entropy_per_head(w);  // (NH) nats
        json per_head = json::array();
        for (std::size_t h = 0; h < NH; ++h) per_head.push_back(rounded(mean(h)));
        layers.push_back(std::move(heads));
        entropy.push_back(std::move(per_head));
    }
    json chars = json::array();
    for (const std::string& ch : utf8_characters(f.prompt)) chars.push_back(ch);

    const std::string corpus = f.corpus.empty() ? corpus_of(weights, f.checkpoint) : f.corpus;
    json data = {
        {"checkpoint", fs::absolute(f.checkpoint).lexically_normal().string()},
        {"corpus", corpus},
        {"step", info.step},
        {"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_embd", c.n_embd},
        {"block_size", c.block_size}, {"vocab_size", c.vocab_size}, {"causal", c.causal},
        {"prompt", chars},
        {"weights", layers},          // [layer][head][query][key]
        {"entropy", entropy},         // [layer][head], mean over the queries, nats
        {"max_entropy", rounded(static_cast<float>(uniform_causal_entropy(static_cast<std::size_t>(T))))},
    };

    write_page(f, data);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Flags f;
    CLI::App app{"Writes a page showing the attention weights of every layer and head of a "
                 "trained GPT on one prompt."};
    app.add_option("checkpoint", f.checkpoint, "a weights directory, or a train_gpt run folder")
        ->required();
    CLI::Option* prompt = app.add_option("--prompt", f.prompt, "the text to look at (at most the model's "
                                                               "block size; an encoder-decoder's input)");
    app.add_option("--out", f.out, "the folder the page is written to")->required();
    app.add_option("--corpus", f.corpus, "the corpus's name, for the page (default: corpus.txt "
                                         "beside the weights)");
    app.add_option("--assets", f.assets, "the folder of the page's files");
    return attn_tools::tool_main(
        "inspect_attention", app, argc, argv, [&] { f.prompt_given = prompt->count() > 0; },
        [&] { return run(f); });
}
