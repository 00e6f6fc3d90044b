// The weights directory: config.json plus one float32 .npy per state_dict key.
#include "attn/checkpoint.hpp"

#include "attn/npy.hpp"
#include "attn/tensor.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>

namespace attn {

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* lm_head_key = "lm_head.weight";

// Reads one .npy as float32 of the expected shape, turning every problem into a
// CheckpointError that names the file.
NpyArray read_parameter(const fs::path& file, const std::vector<std::size_t>& shape) {
    NpyArray a;
    try {
        a = read_npy(file);
    } catch (const NpyError& e) {
        throw CheckpointError(e.what());
    }
    if (a.dtype != "<f4") {
        throw CheckpointError(file.string() + ": expected float32 (<f4) values, the file holds " +
                              a.dtype);
    }
    if (a.shape != shape) {
        throw CheckpointError(file.string() + ": expected shape " + format_shape(shape) + ", got " +
                              format_shape(a.shape));
    }
    // A NaN or an infinity would make every loss NaN: refused here, where it can be named,
    // rather than found as a null in metrics.jsonl.
    const auto bad =
        std::find_if(a.data.begin(), a.data.end(), [](float x) { return !std::isfinite(x); });
    if (bad != a.data.end()) {
        throw CheckpointError(file.string() + ": holds " +
                              (std::isnan(*bad) ? "NaN" : "an infinity") + " at index " +
                              std::to_string(bad - a.data.begin()));
    }
    return a;
}

template <class T>
T config_field(const json& j, const char* key, const fs::path& file) {
    if (!j.contains(key)) throw CheckpointError(file.string() + ": missing \"" + key + "\"");
    try {
        return j.at(key).get<T>();
    } catch (const json::exception&) {
        throw CheckpointError(file.string() + ": \"" + key +
                              "\" has the wrong type: " + j.at(key).dump());
    }
}
}  // namespace

void save_checkpoint(const fs::path& dir, const GPT& model, const CheckpointInfo& info) {
    save_checkpoint_weights(dir, model, model.parameters(), info);
}

void save_checkpoint_weights(const fs::path& dir, const GPT& model, const std::vector<float>& parameters,
                             const CheckpointInfo& info) {
    if (parameters.size() != model.config().num_parameters()) {
        throw CheckpointError(dir.string() + ": " + std::to_string(parameters.size()) + " weights for a model of " +
                              std::to_string(model.config().num_parameters()) + " parameters");
    }
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw CheckpointError(dir.string() + ": cannot create the directory: " + ec.message());
    const GPTConfig& c = model.config();
    json j = {{"vocab_size", c.vocab_size},
              {"block_size", c.block_size},
              {"n_layer", c.n_layer},
              {"n_head", c.n_head},
              {"n_embd", c.n_embd},
              {"dropout", c.dropout},
              {"bias", c.bias},
              {"vocab", info.vocab},
              {"step", info.step}};
    if (!c.causal) j["causal"] = false;  // only then: nanoGPT's config has no such key
    if (c.position != Position::learned) j["position"] = position_name(c.position);  // likewise
    if (!c.scaled_attention) j["scaled_attention"] = false;  // likewise
    if (c.kv_heads() != c.n_head) j["n_kv_head"] = c.kv_heads();                   // likewise
    if (c.window != 0) j["window"] = c.window;                                       // likewise
    const fs::path config_file = dir / "config.json";
    std::ofstream out(config_file);
    out << j.dump(2) << "\n";
    if (!out) throw CheckpointError(config_file.string() + ": cannot write");
    out.close();
    const float* params = parameters.data();
    try {
        for (const ParameterInfo& p : model.parameter_table()) {
            write_npy(dir / (p.name + ".npy"), p.shape, params + p.offset);
        }
        write_npy(dir / (std::string(lm_head_key) + ".npy"), model.parameter_table()[0].shape,
                  params + model.parameter_table()[0].offset);
    } catch (const NpyError& e) {
        throw CheckpointError(e.what());
    }
}

GPTConfig load_config(const fs::path& dir, CheckpointInfo* info) {
    const fs::path file = dir / "config.json";
    std::ifstream in(file);
    if (!in) throw CheckpointError(file.string() + ": cannot open (is this a weights directory?)");
    json j;
    try {
        j = json::parse(in);
    } catch (const json::exception& e) {
        throw CheckpointError(file.string() + ": not valid JSON: " + e.what());
    }
    if (!j.is_object()) throw CheckpointError(file.string() + ": expected a JSON object");
    GPTConfig c;
    c.vocab_size = config_field<int>(j, "vocab_size", file);
    c.block_size = config_field<int>(j, "block_size", file);
    c.n_layer = config_field<int>(j, "n_layer", file);
    c.n_head = config_field<int>(j, "n_head", file);
    c.n_embd = config_field<int>(j, "n_embd", file);
    c.dropout = j.contains("dropout") ? config_field<float>(j, "dropout", file) : 0.0f;
    c.bias = j.contains("bias") ? config_field<bool>(j, "bias", file) : true;
    c.causal = j.contains("causal") ? config_field<bool>(j, "causal", file) : true;
    c.scaled_attention = j.contains("scaled_attention")
                             ? config_field<bool>(j, "scaled_attention", file)
                             : true;
    try {
        // absent: nanoGPT's learned positions
        if (j.contains("position"))
            c.position = parse_position(config_field<std::string>(j, "position", file));
        // absent: one key/value head per query head, attention over the whole context
        if (j.contains("n_kv_head")) c.n_kv_head = config_field<int>(j, "n_kv_head", file);
        if (j.contains("window")) c.window = config_field<int>(j, "window", file);
        c.validate();
    } catch (const std::invalid_argument& e) {
        throw CheckpointError(file.string() + ": " + e.what());
    }
    if (info) {
        info->vocab = j.contains("vocab") ? config_field<std::string>(j, "vocab", file) : "";
        info->step = j.contains("step") ? config_field<std::int64_t>(j, "step", file) : 0;
    }
    return c;
}

fs::path weights_dir_of(const fs::path& dir) {
    if (!fs::exists(dir)) throw std::runtime_error(dir.string() + ": no such checkpoint or run folder");
    if (fs::exists(dir / "checkpoint" / "config.json")) return dir / "checkpoint";
    if (!fs::exists(dir / "config.json")) {
        throw std::runtime_error(dir.string() + ": not a checkpoint (no config.json in it or in " +
                                 (dir / "checkpoint").string() + ")");
    }
    return dir;
}

GPT load_checkpoint(const fs::path& dir, CheckpointInfo* info) {
    GPT model(load_config(dir, info));
    float* params = model.parameters().data();
    for (const ParameterInfo& p : model.parameter_table()) {
        const NpyArray a = read_parameter(dir / (p.name + ".npy"), p.shape);
        std::copy(a.data.begin(), a.data.end(), params + p.offset);
    }
    // The LM head is tied to wte: a file for it, if present, must agree.
    const fs::path head = dir / (std::string(lm_head_key) + ".npy");
    if (fs::exists(head)) {
        const ParameterInfo& wte = model.parameter_table()[0];
        const NpyArray a = read_parameter(head, wte.shape);
        if (!std::equal(a.data.begin(), a.data.end(), params + wte.offset)) {
            throw CheckpointError(head.string() +
                                  ": differs from transformer.wte.weight.npy, but the LM head "
                                  "is tied to the token embedding");
        }
    }
    return model;
}

void save_optimizer(const fs::path& dir, const AdamW& optimizer) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw CheckpointError(dir.string() + ": cannot create the directory: " + ec.message());
    const json j = {{"step_count", optimizer.step_count},
                    {"beta1", optimizer.beta1},
                    {"beta2", optimizer.beta2},
                    {"eps", optimizer.eps},
                    {"weight_decay", optimizer.weight_decay}};
    const fs::path file = dir / "adamw.json";
    std::ofstream out(file);
    out << j.dump(2) << "\n";
    if (!out) throw CheckpointError(file.string() + ": cannot write");
    try {
        write_npy(dir / "adamw.m.npy", {optimizer.m.size()}, optimizer.m.data());
        write_npy(dir / "adamw.v.npy", {optimizer.v.size()}, optimizer.v.data());
    } catch (const NpyError& e) {
        throw CheckpointError(e.what());
    }
}

AdamW load_optimizer(const fs::path& dir, const GPT& model) {
    const fs::path file = dir / "adamw.json";
    std::ifstream in(file);
    if (!in) throw CheckpointError(file.string() + ": cannot open (no optimizer state saved?)");
    json j;
    try {
        j = json::parse(in);
    } catch (const json::exception& e) {
        throw CheckpointError(file.string() + ": not valid JSON: " + e.what());
    }
    AdamW opt;
    opt.step_count = config_field<long>(j, "step_count", file);
    opt.beta1 = config_field<float>(j, "beta1", file);
    opt.beta2 = config_field<float>(j, "beta2", file);
    opt.eps = config_field<float>(j, "eps", file);
    opt.weight_decay = config_field<float>(j, "weight_decay", file);
    if (opt.step_count == 0) return opt;  // no step taken: no moments yet
    const std::vector<std::size_t> shape = {model.parameters().size()};
    opt.m = read_parameter(dir / "adamw.m.npy", shape).data;
    opt.v = read_parameter(dir / "adamw.v.npy", shape).data;
    return opt;
}

}  // namespace attn
