// train_gpt on the CPU and on the simulated GPU, over every option train_gpt lists in its
// --help and every pair of them: the same model, or a one-line refusal.
//
//   cudasim_train_gpt_matrix TRAIN_GPT WORK_DIR
//
// The options come from `train_gpt --help` (names, listed choices, what excludes what);
// the table below says, for each of them, which value(s) the matrix tries and what the
// option is for. An option --help lists that the table does not know (or the reverse)
// fails the test, so a new option is tried as soon as it exists.
//
// For every option alone and every pair of options, a tiny model trains for a few steps
// with --device cpu and --device sim from the same seed, and the two runs must agree step
// by step: the loss and gradient norm of every step, the evaluations (the one at step 0
// included), the weights and AdamW's moments after the last step, the sample, or the
// dumped gradients. A combination one side does not implement must be refused before any
// work (the same command with a corpus that does not exist gives the same line, and nothing
// is written), in one line naming the option; metrics.jsonl must hold no null (NaN) anywhere.
//
// The same matrix drives the other pairs of paths: an option that picks another path to
// the same function (--attention fused, --threads, --tf32) must agree with the run
// without it on each device; an option that changes the model must change the run (an
// option accepted and silently ignored is caught there); and for each kind of model and
// sample in the matrix, generation with and without the key/value cache is compared on
// both devices, text and logits.
#include "attn/checkpoint.hpp"
#include "attn/cuda/generate.hpp"
#include "attn/cuda/gpt.hpp"
#include "attn/data.hpp"
#include "attn/kv_cache.hpp"
#include "attn/npy.hpp"
#include "attn/random.hpp"
#include "attn/trainer.hpp"

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// ---------------------------------------------------------------------------------------
// The tolerances.
//
// fp32 (two paths to the same function, on one device or two): each side sums in its own
// order (OpenBLAS's blocking for the CPU's row-major products and for the simulated
// cuBLAS's column-major ones, the CPU's loops against the kernels' warp reductions) and
// uses its own exp (the CPU's exp_approx, CUDA's expf) and erf. A sum of K terms then
// differs by about √K·ε relative to its largest term, ε = 2^-24 ≈ 6e-8; the longest sums
// here are over B·T = 256 rows (weight gradients) and 4C = 512 channels, so ≈ 20·6e-8 ≈
// 1e-6 per layer, grown through the layers and the backward pass to ~1e-5. Losses, gradient
// norms, evaluations, gradients (against their tensor's largest magnitude) and logits
// (against the largest logit) must agree to 1e-4: ten times that, and a hundred times
// below what a wrong index, a missed mask or a wrong scale gives (1e-2 and more).
constexpr double fp32_relative = 1e-4;
// TF32 (--tf32 on the GPU against the CPU's fp32): each product's inputs are rounded to a
// 10-bit mantissa, a relative error of up to 2^-11 ≈ 5e-4 per term; over K random-sign terms
// the errors grow like √K as the sum does, so a product is off by ~5e-4 to 1e-3 of its
// result, ~1e-3 after a layer or two. Losses and norms must agree to 1e-2 (ten times that),
// gradients and moments to 3e-2 of their tensor's largest magnitude (some gradients are
// small differences of large terms).
constexpr double tf32_relative = 1e-2;
constexpr double tf32_gradient_relative = 3e-2;
// 16-bit products (--precision bf16 or fp16, compared across the same-function options
// --threads and --attention fused, and bf16 on the CPU against the simulated GPU, which
// rounds the same tensors at the same points): the two paths' float32 values differ
// by float32 rounding, as above, and a value that lies within that distance of a 16-bit
// rounding boundary rounds to the other neighbour on one path: that element moves by one
// step of the format, 2^-8 of itself in bfloat16 (2^-11 in float16), ~6e4 times a float32
// rounding. Few elements are that close to a boundary (a relative distance of ~1e-7 out of
// a step of 4e-3: a few in 1e4), so losses and norms still agree to ~1e-4 and gradients to a
// few 1e-3 of their tensor's largest value; 1e-3 and 2e-2 leave ten times that. Weights: a
// flipped rounding can flip the sign of a near-zero gradient as float32 noise can, but in
// more of them, so only the 2·Σlr bound applies (no 1-in-1000 count).
constexpr double half16_relative = 1e-3;
constexpr double half16_gradient_relative = 2e-2;
// Weights after AdamW: the first update moves each weight by lr·g/(|g| + eps), ±lr whatever
// the gradient's size, so a gradient as small as the rounding noise can take opposite
// signs on the two sides and move its weight by 2·lr the other way; later updates likewise
// by at most about 2·lr each. So no weight may differ by more than 2·Σ lr, and (in fp32)
// only weights whose gradients were at the noise level may differ by more than rounding:
// at most 1 in 1000 may differ by more than 1e-5 (the weights are ~0.02 to 1; an update's
// rounding is ~1e-9, a wrong gradient moves thousands of weights by ~lr ≥ 1e-4).
constexpr double weight_rounding = 1e-5;
constexpr double far_weights_fraction = 1e-3;

struct Tolerance {
    double relative;           // losses, norms, evaluations
    double tensor_relative;    // gradients, moments, logits: of the tensor's largest magnitude
    bool count_far_weights;    // whether the 1-in-1000 rule applies (fp32 only)
    const char* name;
    bool same_sample = true;   // the sample's text, character for character
};
constexpr Tolerance fp32{fp32_relative, fp32_relative, true, "fp32"};
constexpr Tolerance tf32{tf32_relative, tf32_gradient_relative, false, "TF32"};
constexpr Tolerance half16{half16_relative, half16_gradient_relative, false, "16-bit products"};
// bf16 on the CPU against the simulated GPU: the 16-bit tolerances, and the sample's length
// but not its text. The sample comes after the steps, whose weights may differ by up to 2·Σlr
// where a gradient near zero took opposite signs (in 16 bits more of them, as above), and
// each character is a draw that compares one uniform number with the cumulative
// probabilities: a draw that lands within that change of a boundary picks the neighbouring
// character on one side. Which sample a checkpoint gives is checked on its own below
// (generation). On one device (--threads, --attention fused) the samples stay the same.
constexpr Tolerance bf16_devices{half16_relative, half16_gradient_relative, false, "bf16 on two devices", false};

// ---------------------------------------------------------------------------------------
// train_gpt's options, as its --help lists them.

struct ListedOption {
    std::string name;                  // "--recipe"
    bool takes_value = false;          // "--recipe TEXT", not "--tf32"
    std::vector<std::string> choices;  // "TEXT:{cpu,tiny,shakespeare}"
    std::set<std::string> excludes;    // "Excludes: --resume"
};

// CLI11's help: one line per option, "  --name TYPE:{a,b} Excludes: --x --y   description",
// the description on the same line or the next ones (indented further, starting lower case).
std::map<std::string, ListedOption> parse_help(const std::string& help) {
    std::map<std::string, ListedOption> options;
    std::istringstream lines(help);
    for (std::string line; std::getline(lines, line);) {
        const std::size_t start = line.find_first_not_of(' ');
        if (start == std::string::npos || line[start] != '-') continue;
        std::istringstream words(line.substr(start));
        std::string first;
        words >> first;
        const std::size_t comma = first.rfind(',');  // "-h,--help"
        ListedOption o;
        o.name = comma == std::string::npos ? first : first.substr(comma + 1);
        if (o.name.rfind("--", 0) != 0) continue;
        std::string rest;
        std::getline(words, rest);
        rest.erase(0, rest.find_first_not_of(' '));
        // A value's type is an upper-case word (TEXT, INT, UINT, FLOAT); a description is not.
        std::size_t type_end = 0;
        while (type_end < rest.size() && std::isupper(static_cast<unsigned char>(rest[type_end]))) ++type_end;
        o.takes_value = type_end >= 3 && (type_end == rest.size() || rest[type_end] == ':' ||
                                          rest[type_end] == ' ');
        const std::size_t excludes = rest.find("Excludes:");
        const std::string type = rest.substr(0, excludes);
        const std::size_t open = type.find(":{"), close = type.find('}');
        if (o.takes_value && open != std::string::npos && close != std::string::npos) {
            std::istringstream choices(type.substr(open + 2, close - open - 2));
            for (std::string c; std::getline(choices, c, ',');) o.choices.push_back(c);
        }
        if (excludes != std::string::npos) {
            std::istringstream names(rest.substr(excludes + 9));
            for (std::string n; names >> n && n.rfind("--", 0) == 0;) o.excludes.insert(n);
        }
        options[o.name] = o;
    }
    return options;
}

// ---------------------------------------------------------------------------------------
// What the matrix does with each option.

enum class Role {
    help,      // --help: read by this test
    axis,      // --device: the two sides compared
    plumbing,  // where the run's files come from and go: every run has its own
    varied,    // tried alone and with every other varied option
};

enum class Effect {
    trains,         // changes the model or the run: the run must differ from the one without it
    same_function,  // another path to the same function: must agree with the run without it
    generation,     // changes the sample only
    exits,          // ends the program before training: its own output is compared
};

// Placeholders for values made by this test: the run folder to resume (a copy per run), the
// weights to start from, the folder to dump gradients into.
const std::string resume_value = "@resume", init_value = "@init", dump_value = "@dump";

struct Use {
    std::string name;
    Role role;
    Effect effect = Effect::trains;
    // The values tried. For an option whose --help lists choices, empty means every choice
    // except `base` and those in `skipped`.
    std::vector<std::string> values;
    std::string base;  // the value of every run that does not set another ("" for none)
    // A same-function option that rounds differently by design (TF32's 10-bit inputs): the
    // run with it must differ from the run without it in its last bits, else it was ignored.
    // (Not --threads or --attention fused: at these sizes they may give the very same bits,
    // e.g. the CPU's fused attention over one tile sums as the materialised one does.)
    bool rounds_differently = false;
    std::map<std::string, std::string> skipped;  // choices not tried, and why
    std::string note;  // for the roles that are not varied: why
};

Use fixed(const std::string& name, Role role, const std::string& note) {
    Use u;
    u.name = name;
    u.role = role;
    u.note = note;
    return u;
}

Use varied(const std::string& name, Effect effect, std::vector<std::string> values,
           const std::string& base = "", std::map<std::string, std::string> skipped = {}) {
    Use u;
    u.name = name;
    u.role = Role::varied;
    u.effect = effect;
    u.values = std::move(values);
    u.base = base;
    u.skipped = std::move(skipped);
    return u;
}

Use rounds_differently(Use u) {
    u.rounds_differently = true;
    return u;
}

// The base run: nanoGPT's recipe shrunk to seconds (--recipe tiny: 2 layers, 2 heads of 16,
// 32 channels, block 32, batch 8), two steps (the second sees the first's AdamW update),
// one batch per evaluation, a short sample, one thread.
std::vector<Use> option_table() {
    const Effect trains = Effect::trains, same = Effect::same_function, sample = Effect::generation,
                 exits = Effect::exits;
    const std::string flag;  // a flag's value
    return {
        fixed("--help", Role::help, "its text is what this test reads"),
        fixed("--device", Role::axis,
              "the comparison itself, cpu against sim; in this build, without a GPU, auto must "
              "train the base run on the CPU (bit for bit) and cuda must be refused"),
        fixed("--data", Role::plumbing, "every run reads the test's corpus"),
        fixed("--out", Role::plumbing, "every run writes its own folder"),
        fixed("--overwrite", Role::plumbing, "every run writes its own, new folder"),
        varied("--recipe", trains, {}, "tiny",
               {{"shakespeare", "its 10.7M parameters take minutes per step in the simulator; "
                                "what it adds to the other recipes (head size 64, dropout) runs "
                                "here through --init and --dropout"}}),
        varied("--resume", trains, {resume_value}),
        varied("--init", trains, {init_value}),
        varied("--max-iters", trains, {"3"}, "2"),
        varied("--eval-interval", trains, {"1"}),
        varied("--eval-iters", trains, {"2"}, "1"),
        varied("--batch-size", trains, {"4"}),
        varied("--learning-rate", trains, {"0.01"}),
        varied("--dropout", trains, {"0.2"}),
        varied("--seed", trains, {"7"}),
        varied("--no-causal-mask", trains, {flag}),
        varied("--position", trains, {}, "learned"),
        varied("--no-attention-scale", trains, {flag}),
        varied("--kv-heads", trains, {"1"}),
        varied("--window", trains, {"8"}),
        varied("--dump-grads", exits, {dump_value}),
        varied("--sample", sample, {"40"}, "8"),  // past block 32: the context is cropped
        varied("--temperature", sample, {"0.5"}),
        varied("--top-k", sample, {"3"}),
        varied("--prompt", sample, {"to be"}),
        rounds_differently(varied("--tf32", same, {flag})),
        varied("--attention", same, {}, "materialised"),
        varied("--precision", trains, {}, "fp32"),
        varied("--bench", exits, {"2"}),
        varied("--threads", same, {"2"}, "1"),
        varied("--threads-info", exits, {flag}),
        fixed("--ranks", Role::plumbing,
              "data parallelism over MPI ranks, the CPU model only (with --device sim or cuda it is "
              "refused in one line); tests/mpi/train_gpt_ranks_test runs every option with --ranks "
              "against one process"),
        fixed("--allreduce", Role::plumbing,
              "how --ranks sums the gradients (refused without ranks); tests/mpi/train_gpt_ranks_test "
              "compares both schedules with one process"),
        fixed("--grad-accum", Role::plumbing,
              "micro-batches whose gradients the CPU model adds before one step (with --device sim or "
              "cuda it is refused in one line); tests/test_grad_accum.cpp and tests/mpi/grad_accum_test "
              "compare it with one batch as many times larger, step by step"),
        fixed("--collective-timeout", Role::plumbing,
              "the watchdog of --ranks' collective calls (refused without ranks); "
              "tests/mpi/train_gpt_ranks_test freezes a rank to show it end the job in one line"),
        fixed("--recompute", Role::plumbing,
              "activations the CPU model recomputes in the backward pass instead of keeping (with "
              "--device sim or cuda it is refused in one line); tests/test_recompute.cpp and "
              "tools/test_train_gpt_recompute.sh compare it with none, bit for bit"),
        fixed("--batch-per-rank", Role::plumbing,
              "gives each of --ranks its own batch (refused without ranks); "
              "tests/mpi/train_gpt_ranks_test compares 2 ranks with one process of twice the batch"),
        fixed("--bucket-cap-mb", Role::plumbing,
              "how --ranks groups its gradient sums (refused without ranks); "
              "tests/mpi/train_gpt_ranks_test compares capped buckets with one process"),
        fixed("--first-bucket-mb", Role::plumbing,
              "the first bucket's cap with --bucket-cap-mb (refused without ranks); "
              "tests/mpi/train_gpt_ranks_test compares it with one process"),
        fixed("--bucket-view", Role::plumbing,
              "--ranks sums the gradients in place (refused without ranks); "
              "tests/mpi/train_gpt_ranks_test compares it with one process"),
        fixed("--shard", Role::plumbing,
              "--ranks keeps the training state sharded, ZeRO stage 1, 2 or 3 (refused without ranks); "
              "tests/mpi/train_gpt_ranks_test runs every option with each stage against one process"),
        fixed("--consolidate", Role::plumbing,
              "converts a --shard run's sharded checkpoint and does nothing else (refused with any "
              "other option); tests/mpi/train_gpt_ranks_test compares its output with one process's "
              "checkpoint byte for byte"),
        fixed("--tensor-parallel", Role::plumbing,
              "--ranks split every block over groups of ranks, on the CPU (refused without ranks); "
              "tests/mpi/train_gpt_ranks_test runs every option with it against one process"),
    };
}

// One option set to one value ("" for a flag).
struct Setting {
    std::string name, value;
    bool operator<(const Setting& o) const {
        return name != o.name ? name < o.name : value < o.value;
    }
    bool operator==(const Setting& o) const { return name == o.name && value == o.value; }
};
using Config = std::vector<Setting>;  // sorted

std::string describe(const Config& c) {
    if (c.empty()) return "(the base run)";
    std::string s;
    for (const Setting& x : c) s += (s.empty() ? "" : " ") + x.name + (x.value.empty() ? "" : " " + x.value);
    return s;
}

bool has(const Config& c, const std::string& name, const std::string& value = "\x01") {
    for (const Setting& s : c) {
        if (s.name == name && (value == "\x01" || s.value == value)) return true;
    }
    return false;
}

std::string value_of(const Config& c, const std::string& name, const std::string& otherwise) {
    for (const Setting& s : c) {
        if (s.name == name) return s.value;
    }
    return otherwise;
}

Config without(const Config& c, const Setting& s) {
    Config out;
    for (const Setting& x : c) {
        if (!(x == s)) out.push_back(x);
    }
    return out;
}

// ---------------------------------------------------------------------------------------
// What each side implements. The rules are the library's and train_gpt's; the test states
// them to know which refusals to expect (any other refusal fails).

// Combinations the CPU refuses: the fused attention's limits (GPT::set_attention) and a
// window, which is a causal mask (GPTConfig::validate).
std::vector<std::string> cpu_refusal(const Config& c) {
    if (has(c, "--attention", "fused")) {
        for (const char* lacking : {"--kv-heads", "--window", "--no-attention-scale"}) {
            if (has(c, lacking)) return {"--attention", lacking};
        }
        if (has(c, "--position", "alibi")) return {"--attention", "--position"};
    }
    if (has(c, "--window") && has(c, "--no-causal-mask")) return {"--window", "--no-causal-mask"};
    return {};
}

// What the GPU model lacks (cuda::unsupported_on_gpu): positions other than learned,
// grouped keys and values, a window, fused kernels for head sizes other than 64 and 128,
// fp16 products (loss scaling is the CPU trainer's) and bf16 products with TF32 (bf16 it
// trains); and the simulator does not time (--bench).
std::vector<std::string> gpu_refusal(const Config& c, int head_size) {
    std::vector<std::string> names;
    for (const char* lacking : {"--position", "--kv-heads", "--window", "--bench"}) {
        if (has(c, lacking)) names.push_back(lacking);
    }
    if (has(c, "--precision", "fp16")) names.push_back("--precision");
    if (has(c, "--precision", "bf16") && has(c, "--tf32")) {
        names.push_back("--precision");
        names.push_back("--tf32");
    }
    if (has(c, "--attention", "fused") && head_size != 64 && head_size != 128) {
        names.push_back("--attention");
    }
    return names;
}

// Options only a GPU takes: the CPU side of the comparison runs without them.
bool device_only(const Setting& s) { return s.name == "--tf32"; }

// ---------------------------------------------------------------------------------------
// Running train_gpt.

enum class Side { cpu, sim };
const char* side_name(Side s) { return s == Side::cpu ? "cpu" : "sim"; }

struct Outcome {
    int status = -1;  // exit status; 128 + the signal that killed it
    std::string out, err;
};

std::string read_text(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

struct Job {
    std::vector<std::string> args;
    fs::path dir;  // stdout and stderr go here
    std::map<std::string, std::string> env;
    Outcome* outcome;
};

// Runs the jobs, at most `parallel` at a time.
void run_all(const std::string& program, std::vector<Job>& jobs, int parallel) {
    std::map<pid_t, Job*> running;
    std::size_t next = 0;
    auto reap = [&] {
        int status = 0;
        const pid_t pid = waitpid(-1, &status, 0);
        if (pid <= 0) return;
        Job* job = running.at(pid);
        running.erase(pid);
        job->outcome->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        job->outcome->out = read_text(job->dir / "stdout");
        job->outcome->err = read_text(job->dir / "stderr");
    };
    while (next < jobs.size() || !running.empty()) {
        if (next < jobs.size() && static_cast<int>(running.size()) < parallel) {
            Job& job = jobs[next++];
            fs::create_directories(job.dir);
            const std::string out = (job.dir / "stdout").string(), err = (job.dir / "stderr").string();
            std::vector<char*> argv;
            std::string argv0 = program;
            argv.push_back(argv0.data());
            for (std::string& a : job.args) argv.push_back(a.data());
            argv.push_back(nullptr);
            const pid_t pid = fork();
            if (pid == 0) {
                const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
                const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
                if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(126);
                for (const auto& [k, v] : job.env) setenv(k.c_str(), v.c_str(), 1);
                execv(program.c_str(), argv.data());
                _exit(127);
            }
            if (pid < 0) {
                std::perror("fork");
                std::exit(2);
            }
            running[pid] = &job;
        } else {
            reap();
        }
    }
}

// ---------------------------------------------------------------------------------------
// What a run left behind.

struct StepRow {
    std::int64_t step;
    double loss, lr, grad_norm;
};
struct EvalRow {
    std::int64_t step;
    double train_loss, val_loss;
};

struct RunFiles {
    bool has_metrics = false;
    std::vector<StepRow> steps;
    std::vector<EvalRow> evals;
    std::vector<std::string> bad_metrics;  // null, NaN, non-numbers, torn lines
    std::map<std::string, std::vector<float>> weights;  // checkpoint/<name>.npy
    std::vector<float> m, v;                            // checkpoint/optimizer
    bool has_sample = false;
    std::string sample;
    std::map<std::string, std::vector<float>> dump;  // --dump-grads: grad/*, loss, x, y
};

std::map<std::string, std::vector<float>> read_npy_folder(const fs::path& dir) {
    std::map<std::string, std::vector<float>> out;
    if (!fs::is_directory(dir)) return out;
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() == ".npy") out[e.path().stem().string()] = read_npy(e.path()).data;
    }
    return out;
}

RunFiles read_run(const fs::path& out_dir, const fs::path& dump_dir, bool keep_weights) {
    RunFiles r;
    const fs::path metrics = out_dir / "metrics.jsonl";
    if (fs::exists(metrics)) {
        r.has_metrics = true;
        std::ifstream in(metrics);
        for (std::string line; std::getline(in, line);) {
            // JSON has no NaN: nlohmann writes a NaN or an infinity as null.
            if (line.find("null") != std::string::npos || line.find("NaN") != std::string::npos ||
                line.find("nan") != std::string::npos || line.find("Infinity") != std::string::npos) {
                r.bad_metrics.push_back(line);
                continue;
            }
            try {
                const json j = json::parse(line);
                auto number = [&](const char* key) {
                    const json& x = j.at(key);
                    if (!x.is_number()) throw std::runtime_error(std::string(key) + " is not a number");
                    const double d = x.get<double>();
                    if (!std::isfinite(d)) throw std::runtime_error(std::string(key) + " is not finite");
                    return d;
                };
                if (j.contains("loss")) {
                    r.steps.push_back({j.at("step").get<std::int64_t>(), number("loss"), number("lr"),
                                       number("grad_norm")});
                } else {
                    r.evals.push_back({j.at("step").get<std::int64_t>(), number("train_loss"),
                                       number("val_loss")});
                }
            } catch (const std::exception& e) {
                r.bad_metrics.push_back(line + " (" + e.what() + ")");
            }
        }
    }
    if (keep_weights) {
        r.weights = read_npy_folder(out_dir / "checkpoint");
        if (fs::exists(out_dir / "checkpoint" / "optimizer" / "m.npy")) {
            r.m = read_npy(out_dir / "checkpoint" / "optimizer" / "m.npy").data;
            r.v = read_npy(out_dir / "checkpoint" / "optimizer" / "v.npy").data;
        }
    }
    if (fs::exists(out_dir / "sample.txt")) {
        r.has_sample = true;
        r.sample = read_text(out_dir / "sample.txt");
    }
    if (fs::is_directory(dump_dir)) {
        r.dump = read_npy_folder(dump_dir / "grad");
        for (const char* name : {"loss", "x", "y"}) r.dump[name] = read_npy(dump_dir / (std::string(name) + ".npy")).data;
        for (auto& [name, w] : read_npy_folder(dump_dir / "weights")) r.dump["weights/" + name] = w;
    }
    return r;
}

// ---------------------------------------------------------------------------------------
// Comparisons: each returns what disagrees, one line each (nothing: they agree).

using Problems = std::vector<std::string>;

std::string fmt(double x) {
    char b[32];
    std::snprintf(b, sizeof b, "%.9g", x);
    return b;
}

void close_scalar(Problems& p, const std::string& what, double a, double b, double relative) {
    if (!(std::fabs(a - b) <= relative * std::max(std::fabs(a), std::fabs(b)))) {
        p.push_back(what + ": " + fmt(a) + " against " + fmt(b));
    }
}

void close_tensor(Problems& p, const std::string& what, const std::vector<float>& a,
                  const std::vector<float>& b, double relative) {
    if (a.size() != b.size()) {
        p.push_back(what + ": " + std::to_string(a.size()) + " values against " + std::to_string(b.size()));
        return;
    }
    double worst = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
    }
    if (!(worst <= relative * std::max(scale, 1e-6))) {
        p.push_back(what + ": differs by up to " + fmt(worst) + " on values up to " + fmt(scale));
    }
}

// The weights after the last step: see weight_rounding above.
void close_weights(Problems& p, const RunFiles& a, const RunFiles& b, const Tolerance& tol) {
    if (a.weights.size() != b.weights.size()) {
        p.push_back("the checkpoints hold " + std::to_string(a.weights.size()) + " and " +
                    std::to_string(b.weights.size()) + " tensors");
        return;
    }
    double lr_sum = 0.0;
    for (const StepRow& s : a.steps) lr_sum += s.lr;
    std::size_t far = 0, total = 0;
    for (const auto& [name, wa] : a.weights) {
        const auto it = b.weights.find(name);
        if (it == b.weights.end() || it->second.size() != wa.size()) {
            p.push_back("weights " + name + ": missing or of another size on one side");
            continue;
        }
        double worst = 0.0;
        for (std::size_t i = 0; i < wa.size(); ++i) {
            const double d = std::fabs(wa[i] - it->second[i]);
            worst = std::max(worst, d);
            far += d > weight_rounding;
        }
        total += wa.size();
        if (!(worst <= 2.0 * lr_sum + weight_rounding)) {
            p.push_back("weights " + name + ": differ by " + fmt(worst) + ", more than 2·Σlr = " +
                        fmt(2.0 * lr_sum));
        }
    }
    if (tol.count_far_weights && static_cast<double>(far) > far_weights_fraction * static_cast<double>(total)) {
        p.push_back(std::to_string(far) + " of " + std::to_string(total) +
                    " weights differ by more than " + fmt(weight_rounding));
    }
    close_tensor(p, "AdamW's m", a.m, b.m, 10 * tol.tensor_relative);
    close_tensor(p, "AdamW's v", a.v, b.v, 20 * tol.tensor_relative);
}

Problems compare_runs(const RunFiles& a, const RunFiles& b, const Tolerance& tol) {
    Problems p;
    if (a.has_metrics != b.has_metrics) p.push_back("metrics.jsonl on one side only");
    if (a.steps.size() != b.steps.size() || a.evals.size() != b.evals.size()) {
        p.push_back("metrics.jsonl: " + std::to_string(a.steps.size()) + " steps and " +
                    std::to_string(a.evals.size()) + " evaluations against " +
                    std::to_string(b.steps.size()) + " and " + std::to_string(b.evals.size()));
    } else {
        for (std::size_t i = 0; i < a.steps.size(); ++i) {
            const StepRow &x = a.steps[i], &y = b.steps[i];
            const std::string at = "step " + std::to_string(x.step);
            if (x.step != y.step || x.lr != y.lr) p.push_back(at + ": another step number or learning rate");
            close_scalar(p, at + " loss", x.loss, y.loss, tol.relative);
            close_scalar(p, at + " gradient norm", x.grad_norm, y.grad_norm, tol.relative);
        }
        for (std::size_t i = 0; i < a.evals.size(); ++i) {
            const EvalRow &x = a.evals[i], &y = b.evals[i];
            const std::string at = "evaluation at step " + std::to_string(x.step);
            if (x.step != y.step) p.push_back(at + ": at another step on one side");
            close_scalar(p, at + ": train loss", x.train_loss, y.train_loss, tol.relative);
            close_scalar(p, at + ": val loss", x.val_loss, y.val_loss, tol.relative);
        }
    }
    if (!a.weights.empty() || !b.weights.empty()) close_weights(p, a, b, tol);
    if (a.has_sample != b.has_sample || a.sample.size() != b.sample.size() ||
        (tol.same_sample && a.sample != b.sample)) {
        p.push_back("the samples differ: \"" + a.sample.substr(0, 60) + "\" against \"" +
                    b.sample.substr(0, 60) + "\"");
    }
    if (a.dump.size() != b.dump.size()) {
        p.push_back("the gradient dumps hold " + std::to_string(a.dump.size()) + " and " +
                    std::to_string(b.dump.size()) + " arrays");
    }
    for (const auto& [name, x] : a.dump) {
        const auto it = b.dump.find(name);
        if (it == b.dump.end()) {
            p.push_back("dump: " + name + " on one side only");
        } else if (name == "x" || name == "y" || name.rfind("weights/", 0) == 0) {
            if (x != it->second) p.push_back("dump: " + name + " differs (the same batch and weights are dumped)");
        } else {
            close_tensor(p, "dump: " + name, x, it->second, tol.tensor_relative);
        }
    }
    return p;
}

// Whether two runs on one device wrote the same bits: the metrics (but the step times),
// the weights kept, the sample, the dump. An option that is silently ignored leaves them
// so, since a run repeats itself bit for bit; one that changes the computation does not,
// however little (a tolerance would miss a small change).
bool identical(const RunFiles& a, const RunFiles& b) {
    auto same_steps = [](const StepRow& x, const StepRow& y) {
        return x.step == y.step && x.loss == y.loss && x.lr == y.lr && x.grad_norm == y.grad_norm;
    };
    auto same_evals = [](const EvalRow& x, const EvalRow& y) {
        return x.step == y.step && x.train_loss == y.train_loss && x.val_loss == y.val_loss;
    };
    return a.steps.size() == b.steps.size() && a.evals.size() == b.evals.size() &&
           std::equal(a.steps.begin(), a.steps.end(), b.steps.begin(), same_steps) &&
           std::equal(a.evals.begin(), a.evals.end(), b.evals.begin(), same_evals) &&
           (a.weights.empty() || b.weights.empty() || a.weights == b.weights) &&
           a.sample == b.sample && a.dump == b.dump;
}

// ---------------------------------------------------------------------------------------
// Generation: with and without the key/value cache, on both devices, for one model.

std::vector<float> cpu_logits(GPT& model, const std::vector<int>& ids) {
    model.train(false);
    model.forward(ids.data(), nullptr, 1, static_cast<int>(ids.size()));
    return model.logits();
}

// The four generators give the same text, and at every position of it the cached logits
// (one token at a time) are the uncached ones (the whole context at once).
// `sample` is train_gpt's, from the same checkpoint on the CPU: the uncached text again
// (else the test's sample options are not train_gpt's).
Problems compare_generation(const fs::path& checkpoint, bool fused, const SampleOptions& s,
                            const std::string& prompt, const std::string& sample,
                            std::string* paths_run) {
    Problems p;
    CheckpointInfo info;
    GPT model = load_checkpoint(checkpoint, &info);
    const CharVocab vocab = CharVocab::from_chars(info.vocab);
    if (fused) model.set_attention(AttentionKind::fused);
    const GPTConfig& c = model.config();
    const std::string text = generate_text(model, vocab, prompt, s);
    if (text != sample) p.push_back("the checkpoint does not give train_gpt's sample: \"" + text + "\"");
    std::vector<int> ids = vocab.encode(text);
    ids.resize(std::min<std::size_t>(ids.size(), static_cast<std::size_t>(c.block_size)));
    const std::vector<float> reference = cpu_logits(model, ids);  // (n, V)
    const std::size_t V = static_cast<std::size_t>(c.vocab_size);
    auto row = [&](const std::vector<float>& all, std::size_t t) {
        return std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(t * V),
                                  all.begin() + static_cast<std::ptrdiff_t>((t + 1) * V));
    };
    *paths_run = "cpu uncached";

    std::string cpu_cache_refusal;
    try {
        const std::string cached = generate_cached(model, vocab, prompt, s);
        if (cached != text) p.push_back("cpu: the cached text differs from the uncached one");
        KVCache cache(c);
        DecodeScratch scratch;
        for (std::size_t t = 0; t < ids.size(); ++t) {
            const std::vector<float>& l = forward_cached(scratch, model, cache, ids[t], static_cast<int>(t));
            close_tensor(p, "cpu: cached logits at position " + std::to_string(t), l, row(reference, t),
                         fp32.tensor_relative);
        }
        *paths_run += ", cpu cached";
    } catch (const std::invalid_argument& e) {
        cpu_cache_refusal = e.what();
    }

    cuda::CudaOptions options;
    options.attention = fused ? cuda::AttentionKind::fused : cuda::AttentionKind::materialised;
    if (!cuda::unsupported_on_gpu(c, options).empty()) return p;  // the GPU refused to train it too
    cuda::CudaGPT gpu(model, options);
    gpu.train(false);
    gpu.forward(ids.data(), nullptr, 1, static_cast<int>(ids.size()));
    std::vector<float> gpu_all;
    gpu.copy_logits_to(gpu_all);
    close_tensor(p, "sim: uncached logits", gpu_all, reference, fp32.tensor_relative);
    *paths_run += ", sim uncached";
    try {
        const std::string cached = cuda::generate_text(gpu, vocab, prompt, s, true);
        if (!cpu_cache_refusal.empty()) p.push_back("sim: the cache runs a model the CPU's cache refuses");
        if (cached != text) p.push_back("sim: the cached text differs from the CPU's uncached one");
        std::vector<float> l;
        for (std::size_t t = 0; t < ids.size(); ++t) {
            gpu.decode_step(l, ids[t], static_cast<int>(t));
            close_tensor(p, "sim: cached logits at position " + std::to_string(t), l, row(reference, t),
                         fp32.tensor_relative);
        }
        *paths_run += ", sim cached";
    } catch (const std::invalid_argument& e) {
        if (cpu_cache_refusal.empty()) p.push_back(std::string("sim: the cache refuses what the CPU's runs: ") + e.what());
    }
    return p;
}

// ---------------------------------------------------------------------------------------
// The matrix.

struct Entry {
    Config config;
    bool excluded = false;  // by --help's Excludes: both sides must refuse
    std::vector<std::string> excluded_names;
    std::vector<std::string> expected[2];  // a refusal naming one of these, or a run
    Outcome outcome[2];
    Outcome probe[2];  // the same command with a corpus that does not exist, when refused
    RunFiles files[2];
    bool ran[2] = {false, false};  // trained (or dumped, or timed) to the end
    int head_size = 0;
};

// Whether a refusal is the one line that names one of `names`, before any work.
Problems check_refusal(const Outcome& o, const std::vector<std::string>& names, bool wrote) {
    Problems p;
    std::size_t lines = 0;
    for (char ch : o.err) lines += ch == '\n';
    if (o.status == 0 || o.status >= 128) p.push_back("exit status " + std::to_string(o.status));
    if (lines != 1) p.push_back(std::to_string(lines) + " lines on stderr: " + o.err.substr(0, 300));
    bool named = false;
    for (const std::string& n : names) named = named || o.err.find(n) != std::string::npos;
    if (!named) {
        std::string list;
        for (const std::string& n : names) list += " " + n;
        p.push_back("the refusal names none of" + list + ": " + o.err);
    }
    if (o.out.find("\ncorpus ") != std::string::npos || o.out.find("device: ") != std::string::npos) {
        p.push_back("refused after starting the work");
    }
    if (wrote) p.push_back("refused after writing into the run folder");
    return p;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 3) {
        std::cerr << "usage: cudasim_train_gpt_matrix TRAIN_GPT WORK_DIR\n";
        return 2;
    }
    const auto started = std::chrono::steady_clock::now();
    const std::string program = fs::absolute(argv[1]).string();
    const fs::path root = fs::absolute(argv[2]);
    fs::remove_all(root);
    fs::create_directories(root);
    const int parallel = 2;  // CI's two cores
    int failures = 0;
    auto fail = [&failures](const std::string& where, const Problems& p) {
        for (const std::string& line : p) {
            std::cout << "FAIL: " << where << ": " << line << "\n";
            ++failures;
        }
    };

    // --- The options, from train_gpt --help, against the table.
    Outcome help;
    {
        std::vector<Job> jobs{{{"--help"}, root / "help", {}, &help}};
        run_all(program, jobs, 1);
    }
    const std::map<std::string, ListedOption> listed = parse_help(help.out);
    if (help.status != 0 || listed.size() < 10) {
        std::cout << "FAIL: train_gpt --help (exit " << help.status << ") lists " << listed.size()
                  << " options\n";
        return 1;
    }
    std::vector<Use> table = option_table();
    std::map<std::string, const Use*> use_of;
    for (const Use& u : table) use_of[u.name] = &u;
    for (const auto& [name, o] : listed) {
        if (!use_of.count(name)) fail("train_gpt --help", {"lists " + name + ", which this test's table does not know: give it a role and values"});
    }
    for (const Use& u : table) {
        if (!listed.count(u.name)) fail("the table", {u.name + " is not in train_gpt --help"});
    }
    if (failures) return 1;

    // Every value the matrix tries, per option.
    std::vector<Setting> values;
    std::set<std::string> exits_options;
    for (Use& u : table) {
        if (u.role != Role::varied) continue;
        if (u.effect == Effect::exits) exits_options.insert(u.name);
        const ListedOption& o = listed.at(u.name);
        if (u.values.empty()) {
            for (const std::string& c : o.choices) {
                if (c != u.base && !u.skipped.count(c)) u.values.push_back(c);
            }
            for (const auto& [c, why] : u.skipped) {
                if (std::find(o.choices.begin(), o.choices.end(), c) == o.choices.end()) {
                    fail("the table", {u.name + " skips " + c + ", which --help does not list"});
                }
                std::cout << "not tried: " << u.name << " " << c << ": " << why << "\n";
            }
            if (u.values.empty()) fail("the table", {u.name + ": no value to try"});
        }
        if (o.takes_value == (u.values.size() == 1 && u.values[0].empty())) {
            fail("the table", {u.name + (o.takes_value ? " takes a value" : " is a flag") + " in --help"});
        }
        for (const std::string& v : u.values) values.push_back({u.name, v});
    }
    for (const Use& u : table) {
        if (u.role == Role::help || u.role == Role::axis || u.role == Role::plumbing) {
            std::cout << "not varied: " << u.name << ": " << u.note << "\n";
        }
    }

    // --- The corpus, the weights for --init and the run for --resume.
    // Words of a small alphabet, deterministic: vocabulary 31, 20 000 characters.
    const fs::path corpus = root / "corpus.txt";
    {
        Rng rng(2024);
        const std::string letters = "abcdefghijklmnopqrstuvwxyz";
        std::string text = "to be, or not to be.\n";
        const std::string separators = ",.;\n";
        while (text.size() < 20000) {
            const std::uint64_t n = 1 + rng.below(7);
            for (std::uint64_t i = 0; i < n; ++i) text += letters[rng.below(letters.size())];
            text += rng.below(5) == 0 ? separators[rng.below(separators.size())] : ' ';
        }
        std::ofstream(corpus) << text;
    }
    const std::string vocab = make_dataset(read_text(corpus)).vocab.chars();
    // --init: one layer of two heads of 64 (the GPU's fused kernels take head size 64),
    // biases (no recipe has them), block 16.
    const fs::path init = root / "init";
    {
        GPTConfig g;
        g.vocab_size = static_cast<int>(vocab.size());
        g.block_size = 16;
        g.n_layer = 1;
        g.n_head = 2;
        g.n_embd = 128;
        g.bias = true;
        save_checkpoint(init, GPT(g, 99), {vocab, 0});
    }
    const std::vector<std::string> base_args = {"--recipe", "tiny", "--max-iters", "2", "--eval-iters",
                                                "1", "--sample", "8", "--threads", "1"};
    const fs::path resume_source = root / "resume_source";
    {
        Outcome o;
        std::vector<std::string> args = base_args;
        args[3] = "1";  // one step: the resumed runs take the second
        for (const char* a : {"--data", corpus.c_str(), "--out", resume_source.c_str()}) args.push_back(a);
        std::vector<Job> jobs{{args, root / "resume_source_log", {}, &o}};
        run_all(program, jobs, 1);
        if (o.status != 0) {
            std::cout << "FAIL: the run to resume: " << o.err;
            return 1;
        }
    }

    // --- The matrix: the base run, every value alone, every pair of values of two options.
    std::vector<Entry> entries(1);  // the base run
    auto add_entry = [&entries](Config c) {
        entries.emplace_back();
        entries.back().config = std::move(c);
    };
    for (const Setting& v : values) add_entry({v});
    for (std::size_t i = 0; i < values.size(); ++i) {
        for (std::size_t j = i + 1; j < values.size(); ++j) {
            if (values[i].name == values[j].name) continue;
            Config c{values[i], values[j]};
            std::sort(c.begin(), c.end());
            add_entry(c);
        }
    }
    std::map<Config, std::size_t> index;
    for (std::size_t i = 0; i < entries.size(); ++i) index[entries[i].config] = i;

    // The command line of one entry on one side, and its jobs.
    std::vector<Job> jobs;
    for (std::size_t e = 0; e < entries.size(); ++e) {
        Entry& entry = entries[e];
        const Config& c = entry.config;
        for (std::size_t i = 0; i < c.size(); ++i) {
            for (std::size_t j = 0; j < c.size(); ++j) {
                if (i != j && listed.at(c[i].name).excludes.count(c[j].name)) {
                    entry.excluded = true;
                    entry.excluded_names = {c[i].name, c[j].name};
                }
            }
        }
        // The model's head size, for the fused kernels' rule.
        if (has(c, "--init")) {
            const GPTConfig g = load_config(init);
            entry.head_size = g.n_embd / g.n_head;
        } else {
            const TrainConfig t = TrainConfig::named(value_of(c, "--recipe", "tiny"));
            entry.head_size = t.n_embd / t.n_head;
        }
        if (entry.excluded) {
            entry.expected[0] = entry.expected[1] = entry.excluded_names;
        } else if (!has(c, "--threads-info")) {  // it prints the threads and exits, first
            entry.expected[0] = cpu_refusal(c);
            entry.expected[1] = !entry.expected[0].empty() ? entry.expected[0] : gpu_refusal(c, entry.head_size);
        }
        // A refusal comes before any work: the same command with a corpus that does not exist
        // must give the same line, not the missing corpus's.
        for (int run = 0; run < 4; ++run) {
            const Side side = run % 2 ? Side::sim : Side::cpu;
            const bool probe = run >= 2;
            if (probe && entry.expected[side == Side::sim].empty()) continue;
            const fs::path dir = root / ("c" + std::to_string(e)) / side_name(side) / (probe ? "probe" : "");
            const fs::path out = dir / "run";
            std::vector<std::string> args;
            // The base's options, unless the entry sets them or excludes them.
            for (std::size_t k = 0; k < base_args.size(); k += 2) {
                bool keep = !has(c, base_args[k]);
                for (const Setting& s : c) keep = keep && !listed.at(s.name).excludes.count(base_args[k]);
                if (keep) {
                    args.push_back(base_args[k]);
                    args.push_back(base_args[k + 1]);
                }
            }
            for (const Setting& s : c) {
                if (side == Side::cpu && device_only(s)) continue;
                args.push_back(s.name);
                if (s.value == resume_value) {
                    fs::create_directories(dir);
                    fs::copy(resume_source, out, fs::copy_options::recursive);
                    args.push_back(out.string());
                } else if (s.value == init_value) {
                    args.push_back(init.string());
                } else if (s.value == dump_value) {
                    args.push_back((dir / "grads").string());
                } else if (!s.value.empty()) {
                    args.push_back(s.value);
                }
            }
            const fs::path data = probe ? root / "no_such_corpus.txt" : corpus;
            for (const std::string& a : {std::string("--data"), data.string(), std::string("--out"),
                                         out.string(), std::string("--device"), std::string(side_name(side))}) {
                args.push_back(a);
            }
            // The race check is the other cudasim tests' (each kernel at its shapes); here the
            // question is agreement, and each launch once is enough.
            Outcome* outcome = probe ? &entry.probe[side == Side::sim] : &entry.outcome[side == Side::sim];
            jobs.push_back({args, dir, {{"CUDA_SIM_RACECHECK", "0"}}, outcome});
        }
    }
    std::set<std::string> varied_options;
    for (const Setting& v : values) varied_options.insert(v.name);
    std::cout << "matrix: " << values.size() << " values of " << varied_options.size()
              << " options; " << entries.size() << " entries (the base, " << values.size()
              << " alone, " << entries.size() - 1 - values.size() << " pairs), " << jobs.size()
              << " runs of train_gpt\n"
              << std::flush;
    // --device's other choices, on the base run: in a build without a GPU, auto trains on
    // the CPU (saying so) and cuda is refused.
    std::map<std::string, Outcome> other_devices;
    for (const std::string& d : listed.at("--device").choices) {
        if (d == "cpu" || d == "sim") continue;
        if (d != "auto" && d != "cuda") fail("the table", {"--device " + d + " is new: say what it does here"});
        std::vector<std::string> args = jobs[0].args;
        const fs::path dir = root / ("device_" + d);
        for (std::size_t k = 0; k + 1 < args.size(); ++k) {
            if (args[k] == "--out") args[k + 1] = (dir / "run").string();
            if (args[k] == "--device") args[k + 1] = d;
        }
        jobs.push_back({args, dir, {}, &other_devices[d]});
    }
    run_all(program, jobs, parallel);
    const double run_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();

    // Entries whose runs another comparison needs: keep their weights in memory.
    std::set<std::size_t> keep;
    for (std::size_t e = 0; e < entries.size(); ++e) {
        for (const Setting& s : entries[e].config) {
            if (use_of.at(s.name)->effect == Effect::same_function) {
                keep.insert(e);
                keep.insert(index.at(without(entries[e].config, s)));
            }
        }
    }

    // --- Each entry: the two sides agree, or refuse as expected.
    std::size_t refused[2] = {0, 0}, compared = 0, cli_refused = 0;
    double worst_step0 = 0.0;
    std::set<std::string> refusal_lines;
    for (std::size_t e = 0; e < entries.size(); ++e) {
        Entry& entry = entries[e];
        const Config& c = entry.config;
        const std::string where = describe(c);
        const fs::path base_dir = root / ("c" + std::to_string(e));
        const bool resumed = has(c, "--resume");
        for (int side = 0; side < 2; ++side) {
            const fs::path dir = base_dir / side_name(static_cast<Side>(side));
            entry.files[side] = read_run(dir / "run", dir / "grads", keep.count(e) > 0);
            fail(where + " (" + side_name(static_cast<Side>(side)) + ")", [&] {
                Problems p;
                for (const std::string& l : entry.files[side].bad_metrics) p.push_back("metrics.jsonl holds " + l);
                return p;
            }());
        }
        // Whether a refused run wrote anything: a new folder, or (resumed) new metrics.
        auto wrote = [&](int side) {
            const fs::path out = base_dir / side_name(static_cast<Side>(side)) / "run";
            if (resumed) return read_text(out / "metrics.jsonl") != read_text(resume_source / "metrics.jsonl");
            return fs::exists(out) || fs::exists(base_dir / side_name(static_cast<Side>(side)) / "grads");
        };

        auto first_line = [](const std::string& text) { return text.substr(0, text.find('\n')); };
        for (int side = 0; side < 2; ++side) {
            std::string probe = first_line(entry.probe[side].err);  // its folders are probe/...
            for (std::size_t at; (at = probe.find("/probe/")) != std::string::npos;) probe.erase(at, 6);
            if (!entry.expected[side].empty() && probe != first_line(entry.outcome[side].err)) {
                fail(where + " (" + side_name(static_cast<Side>(side)) + ")",
                     {"refused after reading the corpus: without one it says \"" + probe + "\""});
            }
        }
        if (entry.excluded) {
            ++cli_refused;
            for (int side = 0; side < 2; ++side) {
                fail(where + " (" + side_name(static_cast<Side>(side)) + ", excluded by --help)",
                     check_refusal(entry.outcome[side], entry.excluded_names, wrote(side)));
            }
            continue;
        }
        if (has(c, "--threads-info")) {  // prints the threads and exits, before anything else
            for (int side = 0; side < 2; ++side) {
                if (entry.outcome[side].status != 0 || wrote(side)) {
                    fail(where, {std::string(side_name(static_cast<Side>(side))) + ": --threads-info exited " +
                                 std::to_string(entry.outcome[side].status) + ": " + entry.outcome[side].err});
                }
            }
            if (entry.outcome[0].out != entry.outcome[1].out) fail(where, {"--threads-info prints other settings on the two sides"});
            continue;
        }
        const std::vector<std::string>* expected = entry.expected;
        for (int side = 0; side < 2; ++side) {
            const Outcome& o = entry.outcome[side];
            const std::string at = where + " (" + side_name(static_cast<Side>(side)) + ")";
            if (!expected[side].empty()) {
                ++refused[side];
                fail(at, check_refusal(o, expected[side], wrote(side)));
                refusal_lines.insert(first_line(o.err));
            } else if (o.status != 0) {
                fail(at, {"exit " + std::to_string(o.status) + ": " + o.err});
            } else {
                entry.ran[side] = true;
            }
        }
        if (entry.ran[0] && has(c, "--bench") && entry.outcome[0].out.find("bench: ") == std::string::npos) {
            fail(where + " (cpu)", {"--bench printed no timing"});
        }
        bool exits = false;
        for (const Setting& x : c) exits = exits || exits_options.count(x.name) > 0;
        for (int side = 0; side < 2; ++side) {  // what every run leaves, so that comparing means something
            const RunFiles& f = entry.files[side];
            const bool complete = has(c, "--dump-grads") ? !f.dump.empty()
                                  : exits                ? true
                                                         : f.has_metrics && !f.steps.empty() && f.has_sample;
            if (entry.ran[side] && !complete) {
                fail(where + " (" + side_name(static_cast<Side>(side)) + ")",
                     {"exited 0 without its metrics, sample or gradients"});
            }
        }
        if (!entry.ran[0] || !entry.ran[1]) continue;
        ++compared;
        const bool tf32_run = has(c, "--tf32");
        // bf16 on both sides, rounded at the same points: the 16-bit products' tolerance
        const bool bf16_run = has(c, "--precision", "bf16");
        const Tolerance& tol = tf32_run ? tf32 : bf16_run ? bf16_devices : fp32;
        Problems p = compare_runs(entry.files[0], entry.files[1], tol);
        fail(where + " (cpu against sim, " + tol.name + ")", p);
        const RunFiles &a = entry.files[0], &b = entry.files[1];
        if (!a.evals.empty() && !b.evals.empty()) {
            worst_step0 = std::max({worst_step0, std::fabs(a.evals[0].train_loss - b.evals[0].train_loss) / a.evals[0].train_loss,
                                    std::fabs(a.evals[0].val_loss - b.evals[0].val_loss) / a.evals[0].val_loss});
        }
    }

    for (const auto& [d, o] : other_devices) {
        const fs::path out = root / ("device_" + d) / "run";
        if (d == "cuda") {
            fail("--device cuda", check_refusal(o, {"--device cuda"}, fs::exists(out)));
        } else if (o.status != 0 || o.err.find("--device auto") == std::string::npos) {
            fail("--device auto", {"exit " + std::to_string(o.status) + ", without the note: " + o.err});
        } else if (!identical(read_run(out, {}, true), entries[0].files[0])) {
            fail("--device auto", {"does not train the base run as --device cpu does"});
        }
    }

    // --- Across entries: another path to the same function agrees; an option that changes
    // the model changes the run.
    std::size_t same_checked = 0, change_checked = 0;
    for (std::size_t e = 0; e < entries.size(); ++e) {
        const Entry& entry = entries[e];
        for (const Setting& s : entry.config) {
            const Effect effect = use_of.at(s.name)->effect;
            const Entry& other = entries[index.at(without(entry.config, s))];
            if (effect == Effect::same_function) {
                for (int side = 0; side < 2; ++side) {
                    if (!entry.ran[side] || !other.ran[side]) continue;
                    if (side == 0 && device_only(s)) continue;  // the CPU ran without it
                    ++same_checked;
                    const bool sixteen_bit = has(entry.config, "--precision") &&
                                             value_of(entry.config, "--precision", "fp32") != "fp32";
                    const Tolerance& tol = device_only(s) || has(entry.config, "--tf32") ? tf32
                                           : sixteen_bit                                  ? half16
                                                                                          : fp32;
                    Problems p = compare_runs(entry.files[side], other.files[side], tol);
                    const RunFiles& f = entry.files[side];
                    const bool computed = f.has_metrics || !f.dump.empty();  // not --bench's timing
                    if (use_of.at(s.name)->rounds_differently && computed && identical(f, other.files[side])) {
                        p.push_back(s.name + " " + s.value + " gives the same bits as the run without it: it was ignored");
                    }
                    fail(describe(entry.config) + " against " + describe(other.config) + " (" +
                             side_name(static_cast<Side>(side)) + ", the same function)", p);
                }
            } else if (effect == Effect::trains && entry.ran[0] && other.ran[0]) {
                bool exits = false;
                for (const Setting& x : entry.config) exits = exits || exits_options.count(x.name) > 0;
                if (exits) continue;  // a run that ends before training ignores how it would train
                ++change_checked;
                if (identical(entry.files[0], other.files[0])) {
                    fail(describe(entry.config), {s.name + " " + s.value + " changes nothing: the run equals " + describe(other.config) + "'s"});
                }
            }
        }
    }

    // --- Generation with and without the cache, on both devices: once per kind of model
    // (its config.json but the step), attention and sample in the matrix.
    std::set<std::string> kinds;
    std::size_t generation_checked = 0;
    std::map<std::string, int> paths_compared;
    for (std::size_t e = 0; e < entries.size(); ++e) {
        const Entry& entry = entries[e];
        const Config& c = entry.config;
        if (!entry.ran[0] || !entry.files[0].has_sample) continue;
        const fs::path checkpoint = root / ("c" + std::to_string(e)) / "cpu" / "run" / "checkpoint";
        json model = json::parse(read_text(checkpoint / "config.json"));
        model.erase("step");
        const json trainer = json::parse(read_text(checkpoint / "trainer.json"));
        SampleOptions s;
        s.max_new_tokens = std::stoi(value_of(c, "--sample", "8"));
        s.temperature = std::stof(value_of(c, "--temperature", "0.8"));
        s.top_k = std::stoi(value_of(c, "--top-k", "0"));
        s.seed = trainer.at("config").at("seed").get<std::uint64_t>();
        const std::string prompt = value_of(c, "--prompt", "");
        const bool fused = has(c, "--attention", "fused");
        const std::string kind = model.dump() + (fused ? " fused " : " ") + std::to_string(s.max_new_tokens) +
                                 " " + fmt(s.temperature) + " " + std::to_string(s.top_k) + " " + prompt;
        if (!kinds.insert(kind).second) continue;
        ++generation_checked;
        std::string paths;
        const std::string& sample = entry.files[0].sample;  // the text and a newline
        fail(describe(c) + " (generation)",
             compare_generation(checkpoint, fused, s, prompt, sample.substr(0, sample.size() - 1), &paths));
        ++paths_compared[paths];
    }

    // --- The report.
    std::cout << "generation, the paths compared:\n";
    for (const auto& [paths, n] : paths_compared) std::cout << "  " << n << " models: " << paths << "\n";
    std::cout << "refusals, one line each:\n";
    for (const std::string& line : refusal_lines) std::cout << "  " << line << "\n";
    std::cout << "compared cpu against sim: " << compared << " entries; refused by the CPU "
              << refused[0] << ", by the simulated GPU " << refused[1] << ", by --help's Excludes "
              << cli_refused << "; same-function pairs " << same_checked << ", options that must "
              << "change the run " << change_checked << ", generation checks " << generation_checked
              << "; largest relative difference of a step-0 evaluation " << fmt(worst_step0) << "\n";
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    std::cout << "train_gpt runs: " << fmt(run_seconds) << " s; in all " << fmt(seconds) << " s\n";
    if (failures == 0) fs::remove_all(root);
    std::cout << (failures ? std::to_string(failures) + " problems\n" : std::string("all agree\n"));
    return failures ? 1 : 0;
}
