// The weights directory: config.json plus one float32 .npy per state_dict key.
#include "attn/checkpoint.hpp"

#include "attn/npy.hpp"
#include "attn/run_control.hpp"
#include "attn/tensor.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <array>
#include <map>

namespace attn {

namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* lm_head_key = "lm_head.weight";

// Writes dir/checksums.json listing `sums` (defined with the checksums below).
void write_checksum_file(const fs::path& dir, const std::map<std::string, std::uint64_t>& sums);

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

void save_model_config(const fs::path& dir, const GPT& model, const CheckpointInfo& info) {
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
    out.close();
    if (!out) throw CheckpointError(config_file.string() + ": cannot write");
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
    save_model_config(dir, model, info);
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
    // The files just written, each with its checksum (other files of `dir` are not this save's).
    std::map<std::string, std::uint64_t> sums;
    sums["config.json"] = file_checksum(dir / "config.json");
    for (const ParameterInfo& p : model.parameter_table()) sums[p.name + ".npy"] = file_checksum(dir / (p.name + ".npy"));
    sums[std::string(lm_head_key) + ".npy"] = file_checksum(dir / (std::string(lm_head_key) + ".npy"));
    write_checksum_file(dir, sums);
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

GPT load_checkpoint(const fs::path& dir, CheckpointInfo* info, bool check_sums) {
    if (check_sums) verify_checksums(dir);
    GPT model(load_config(dir, info));
    float* params = model.parameters().data();
    if (is_sharded_checkpoint(dir)) {
        // Tensor by tensor from the ranks' files: a buffer of one tensor beside the model.
        const ShardLayout layout = read_shard_layout(dir, model.parameters().size());
        std::vector<float> tensor;
        for (const ParameterInfo& p : model.parameter_table()) {
            read_shard_ranges(dir, layout, ShardPart::weights, {{p.offset, p.size}}, tensor);
            const auto bad = std::find_if(tensor.begin(), tensor.end(), [](float x) { return !std::isfinite(x); });
            if (bad != tensor.end()) {
                throw CheckpointError((dir / "shards.json").string() + ": " + p.name + " holds " +
                                      (std::isnan(*bad) ? "NaN" : "an infinity") + " at index " +
                                      std::to_string(bad - tensor.begin()));
            }
            std::copy(tensor.begin(), tensor.end(), params + p.offset);
        }
        return model;
    }
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

// ---------------------------------------------------------------------------------------
// Checksums

namespace {
constexpr std::uint64_t fnv_offset = 0xcbf29ce484222325ull, fnv_prime = 0x100000001B3ull;
constexpr const char* checksums_file = "checksums.json";

std::uint64_t fnv1a(std::uint64_t h, const char* p, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * fnv_prime;
    return h;
}

std::string hex64(std::uint64_t h) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    return buf;
}

// A stream that hashes what it writes: a file's checksum without reading it back.
class HashingWriter {
public:
    explicit HashingWriter(const fs::path& file) : file_(file), out_(file, std::ios::binary | std::ios::trunc) {
        if (!out_) throw CheckpointError(file.string() + ": cannot be opened for writing");
    }
    void write(const void* data, std::size_t bytes) {
        const auto* p = static_cast<const char*>(data);
        hash_ = fnv1a(hash_, p, bytes);
        out_.write(p, static_cast<std::streamsize>(bytes));
    }
    void zeros(std::size_t floats) {
        static const std::vector<float> zero(16384, 0.0f);
        while (floats > 0) {
            const std::size_t n = std::min(floats, zero.size());
            write(zero.data(), n * sizeof(float));
            floats -= n;
        }
    }
    std::uint64_t finish() {
        out_.close();
        if (!out_) throw CheckpointError(file_.string() + ": write failed");
        return hash_;
    }

private:
    fs::path file_;
    std::ofstream out_;
    std::uint64_t hash_ = fnv_offset;
};

// The .npy header write_npy() writes for float32 of `shape`.
std::string npy_header(const std::vector<std::size_t>& shape) {
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + format_shape(shape) + ", }";
    const std::size_t total = 10 + header.size() + 1;
    header.append((64 - total % 64) % 64, ' ');
    header += '\n';
    const auto len = static_cast<std::uint16_t>(header.size());
    return std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(len & 0xff) + static_cast<char>(len >> 8) + header;
}
}  // namespace

std::uint64_t file_checksum(const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw CheckpointError(file.string() + ": cannot be read");
    std::vector<char> buf(1 << 16);
    std::uint64_t h = fnv_offset;
    while (in) {
        in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        h = fnv1a(h, buf.data(), static_cast<std::size_t>(in.gcount()));
    }
    if (in.bad()) throw CheckpointError(file.string() + ": cannot be read");
    return h;
}

namespace {
void write_checksum_file(const fs::path& dir, const std::map<std::string, std::uint64_t>& sums) {
    json files = json::object();
    for (const auto& [name, sum] : sums) files[name] = hex64(sum);
    const fs::path file = dir / checksums_file;
    std::ofstream out(file);
    out << json{{"algorithm", "fnv1a-64"}, {"files", files}}.dump(2) << "\n";
    if (!out) throw CheckpointError(file.string() + ": cannot write");
}
}  // namespace

void write_checksums(const fs::path& dir, const std::vector<std::pair<std::string, std::uint64_t>>& known) {
    const std::map<std::string, std::uint64_t> given(known.begin(), known.end());
    std::map<std::string, std::uint64_t> sums;
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
        if (!e.is_regular_file()) continue;
        const std::string name = e.path().lexically_relative(dir).generic_string();
        if (name == checksums_file) continue;
        const auto it = given.find(name);
        sums[name] = it != given.end() ? it->second : file_checksum(e.path());
    }
    write_checksum_file(dir, sums);
}

void verify_checksums(const fs::path& dir) {
    const fs::path file = dir / checksums_file;
    std::error_code ec;
    if (!fs::exists(file, ec)) return;  // written before checksums, or exported: read as it is
    std::ifstream in(file);
    json j;
    try {
        j = json::parse(in);
    } catch (const json::exception& e) {
        throw CheckpointError(file.string() + ": not valid JSON (damaged?): " + e.what());
    }
    if (!j.is_object() || j.value("algorithm", "") != "fnv1a-64" || !j.contains("files") || !j.at("files").is_object()) {
        throw CheckpointError(file.string() + ": not a list of fnv1a-64 checksums (damaged?)");
    }
    for (const auto& [name, value] : j.at("files").items()) {
        const fs::path f = dir / name;
        if (!value.is_string() || name.empty() || name.find("..") != std::string::npos || name[0] == '/') {
            throw CheckpointError(file.string() + ": a malformed entry for \"" + name + "\" (damaged?)");
        }
        if (!fs::exists(f, ec)) throw CheckpointError(f.string() + ": missing (checksums.json lists it)");
        const std::string got = hex64(file_checksum(f));
        if (got != value.get<std::string>()) {
            throw CheckpointError(f.string() + ": damaged: its checksum is " + got + ", checksums.json records " +
                                  value.get<std::string>() + " (the file changed after it was written)");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Sharded checkpoints

namespace {
constexpr const char* layout_file = "shards.json";
constexpr const char* layout_format = "attn sharded checkpoint 1";
}  // namespace

std::size_t ShardLayout::File::floats() const {
    std::size_t n = 0;
    for (const AdamW::Segment& s : segments) n += s.size;
    return n;
}

bool is_sharded_checkpoint(const fs::path& dir) {
    std::error_code ec;
    return fs::exists(dir / layout_file, ec);
}

ShardLayout read_shard_layout(const fs::path& dir, std::size_t parameters) {
    const fs::path file = dir / layout_file;
    std::ifstream in(file);
    if (!in) throw CheckpointError(file.string() + ": cannot open");
    json j;
    try {
        j = json::parse(in);
    } catch (const json::exception& e) {
        throw CheckpointError(file.string() + ": not valid JSON: " + e.what());
    }
    if (!j.is_object() || j.value("format", "") != layout_format) {
        throw CheckpointError(file.string() + ": not a layout of \"" + layout_format + "\"");
    }
    ShardLayout layout;
    layout.scheme = config_field<std::string>(j, "scheme", file);
    layout.ranks = config_field<int>(j, "ranks", file);
    layout.parameters = config_field<std::size_t>(j, "parameters", file);
    if (layout.parameters != parameters) {
        throw CheckpointError(file.string() + ": shards of " + std::to_string(layout.parameters) +
                              " parameters, the model has " + std::to_string(parameters));
    }
    const json files = config_field<json>(j, "files", file);
    if (!files.is_array() || layout.ranks < 1 || files.size() != static_cast<std::size_t>(layout.ranks)) {
        throw CheckpointError(file.string() + ": expected one file for each of its " + std::to_string(layout.ranks) +
                              " ranks");
    }
    std::vector<AdamW::Segment> all;
    for (const json& f : files) {
        ShardLayout::File entry;
        entry.name = config_field<std::string>(f, "name", file);
        if (entry.name.empty() || entry.name.find('/') != std::string::npos || entry.name[0] == '.') {
            throw CheckpointError(file.string() + ": a file name that is not a file of the directory: " + entry.name);
        }
        for (const auto& s : config_field<std::vector<std::array<std::size_t, 2>>>(f, "segments", file)) {
            if (s[1] == 0 || s[0] > parameters || s[1] > parameters - s[0]) {
                throw CheckpointError(file.string() + ": " + entry.name + " holds the run [" + std::to_string(s[0]) +
                                      ", +" + std::to_string(s[1]) + ") outside the " + std::to_string(parameters) +
                                      " parameters");
            }
            entry.segments.push_back({s[0], s[1]});
            all.push_back({s[0], s[1]});
        }
        layout.files.push_back(std::move(entry));
    }
    std::sort(all.begin(), all.end(), [](const AdamW::Segment& a, const AdamW::Segment& b) { return a.offset < b.offset; });
    std::size_t next = 0;
    for (const AdamW::Segment& s : all) {
        if (s.offset != next) {
            throw CheckpointError(file.string() + ": the ranks' runs " +
                                  (s.offset < next ? "overlap" : "leave a gap") + " at parameter " +
                                  std::to_string(std::min(s.offset, next)));
        }
        next = s.offset + s.size;
    }
    if (next != parameters) {
        throw CheckpointError(file.string() + ": the ranks' runs end at parameter " + std::to_string(next) + " of " +
                              std::to_string(parameters));
    }
    return layout;
}

std::uint64_t write_shard_file(const fs::path& file, const std::vector<AdamW::Segment>& segments,
                               const std::function<const float*(std::size_t)>& weights,
                               const std::function<const float*(std::size_t)>& m,
                               const std::function<const float*(std::size_t)>& v) {
    HashingWriter out(file);
    for (const auto* part : {&weights, &m, &v}) {
        for (std::size_t k = 0; k < segments.size(); ++k) {
            const float* data = *part ? (*part)(k) : nullptr;
            if (data) {
                out.write(data, segments[k].size * sizeof(float));
            } else {
                out.zeros(segments[k].size);
            }
        }
    }
    return out.finish();
}

void read_shard_ranges(const fs::path& dir, const ShardLayout& layout, ShardPart part,
                       const std::vector<AdamW::Segment>& wanted, std::vector<float>& out) {
    // Every file's runs, by offset: where each lies in its file.
    struct Run {
        std::size_t offset, size, file, at;  // `at`: the floats before it in its file's part
    };
    std::vector<Run> runs;
    for (std::size_t f = 0; f < layout.files.size(); ++f) {
        std::size_t at = 0;
        for (const AdamW::Segment& s : layout.files[f].segments) {
            runs.push_back({s.offset, s.size, f, at});
            at += s.size;
        }
    }
    std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.offset < b.offset; });
    std::size_t total = 0;
    for (const AdamW::Segment& s : wanted) total += s.size;
    out.resize(total);
    std::vector<std::ifstream> streams(layout.files.size());
    auto open = [&](std::size_t f) -> std::ifstream& {
        std::ifstream& in = streams[f];
        if (in.is_open()) return in;
        const fs::path path = dir / layout.files[f].name;
        in.open(path, std::ios::binary);
        if (!in) throw CheckpointError(path.string() + ": no such file (shards.json lists it)");
        std::error_code ec;
        const std::uintmax_t bytes = fs::file_size(path, ec);
        const std::uintmax_t need = 3u * layout.files[f].floats() * sizeof(float);
        if (ec || bytes != need) {
            throw CheckpointError(path.string() + ": holds " + std::to_string(bytes) + " bytes, its runs need " +
                                  std::to_string(need));
        }
        return in;
    };
    std::size_t filled = 0;
    for (const AdamW::Segment& w : wanted) {
        const std::size_t lo = w.offset, hi = w.offset + w.size;
        if (hi > layout.parameters || hi < lo) {
            throw std::invalid_argument("read_shard_ranges: a run outside the parameters");
        }
        auto it = std::upper_bound(runs.begin(), runs.end(), lo, [](std::size_t x, const Run& r) { return x < r.offset; });
        if (it != runs.begin()) --it;
        for (; it != runs.end() && it->offset < hi; ++it) {
            const std::size_t a = std::max(lo, it->offset), b = std::min(hi, it->offset + it->size);
            if (a >= b) continue;
            std::ifstream& in = open(it->file);
            const std::size_t floats = layout.files[it->file].floats();
            const std::size_t index = static_cast<std::size_t>(part) * floats + it->at + (a - it->offset);
            in.seekg(static_cast<std::streamoff>(index * sizeof(float)));
            in.read(reinterpret_cast<char*>(out.data() + filled + (a - lo)), static_cast<std::streamsize>((b - a) * sizeof(float)));
            if (!in) throw CheckpointError((dir / layout.files[it->file].name).string() + ": cut short");
        }
        filled += w.size;
    }
}

void consolidate_checkpoint(const fs::path& dir, const fs::path& out) {
    if (!fs::is_directory(dir)) throw CheckpointError(dir.string() + ": no such checkpoint directory");
    if (!is_sharded_checkpoint(dir)) {
        throw CheckpointError(dir.string() + ": not a sharded checkpoint (no shards.json): it is already one "
                              "process's");
    }
    verify_checksums(dir);
    CheckpointInfo info;
    const GPTConfig config = load_config(dir, &info);
    if (!fs::exists(dir / "trainer.json")) throw CheckpointError((dir / "trainer.json").string() + ": cannot open");
    // The table of tensors, from a model made without its buffers.
    const GPT model(config, 1337, GPTBuffers{false, false});
    const std::size_t P = config.num_parameters();
    const ShardLayout layout = read_shard_layout(dir, P);
    write_directory_atomically(out, [&](const fs::path& tmp) {
        fs::copy_file(dir / "config.json", tmp / "config.json");
        std::vector<float> tensor;
        auto write_tensor = [&](const fs::path& file, const ParameterInfo& p) {
            read_shard_ranges(dir, layout, ShardPart::weights, {{p.offset, p.size}}, tensor);
            try {
                write_npy(file, p.shape, tensor.data());
            } catch (const NpyError& e) {
                throw CheckpointError(e.what());
            }
        };
        for (const ParameterInfo& p : model.parameter_table()) write_tensor(tmp / (p.name + ".npy"), p);
        write_tensor(tmp / (std::string(lm_head_key) + ".npy"), model.parameter_table()[0]);
        // The moments as m.npy and v.npy of shape (P), a piece of 1 MiB at a time.
        fs::create_directory(tmp / "optimizer");
        for (const auto& [name, part] : {std::pair{"m.npy", ShardPart::m}, {"v.npy", ShardPart::v}}) {
            HashingWriter file(tmp / "optimizer" / name);
            const std::string header = npy_header({P});
            file.write(header.data(), header.size());
            constexpr std::size_t piece = 1 << 18;
            for (std::size_t at = 0; at < P; at += piece) {
                read_shard_ranges(dir, layout, part, {{at, std::min(piece, P - at)}}, tensor);
                file.write(tensor.data(), tensor.size() * sizeof(float));
            }
            file.finish();
        }
        fs::copy_file(dir / "trainer.json", tmp / "trainer.json");
        write_checksums(tmp);
    });
}

}  // namespace attn
