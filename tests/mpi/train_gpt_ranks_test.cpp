// train_gpt with ranks (data parallelism over MPI, lesson 19) against train_gpt alone.
//
//   train_gpt_ranks_test TRAIN_GPT WORK_DIR options
//       Every option `train_gpt --help` lists, each alone on a tiny run: with --ranks 2 the
//       run must be one process's where both are in the same state (the first step and the
//       evaluation before it; one process's evaluation and sample from the run's last
//       checkpoint; see "How two runs are compared" below), or be refused in one line before
//       any work where the ranks do not implement the option; the base run also on 4 ranks,
//       with the gradients summed after the backward pass, and with other gradient buckets
//       (capped, a small first one, summed in place); each also with --ranks 2 --shard
//       optimizer (ZeRO stage 1), --shard gradients (stage 2), --shard parameters (stage 3)
//       and --tensor-parallel 2, the base run on 3 and 4 ranks too (tensor parallelism on the
//       2 x 2 grid); the base run on every one of them also takes one step more, against one
//       process's from its checkpoint. The options come from --help: one this test's table
//       does not know (or the reverse) fails it.
//   train_gpt_ranks_test TRAIN_GPT WORK_DIR refusals MPIRUN
//       Bad uses of ranks get one line on stderr and exit status 1 or 2 (under mpirun, one
//       line from train_gpt before mpirun's own report).
//   train_gpt_ranks_test TRAIN_GPT WORK_DIR kill
//       A rank of a 4-rank run is killed (SIGKILL) after its first checkpoints: every rank
//       stops, the job ends with one line naming the rank and the checkpoint, the checkpoint
//       resumes on 2 ranks, its first step one process's from the checkpoint, and the run goes
//       on to its end.
//   train_gpt_ranks_test TRAIN_GPT WORK_DIR kill-sharded
//       The same with the optimizer's state sharded (--shard optimizer) on 4 ranks, resumed
//       sharded on 3.
//   train_gpt_ranks_test TRAIN_GPT WORK_DIR kill-sharded-gradients
//       The same with the gradients sharded too (--shard gradients) on 4 ranks, resumed so on 3.
//   train_gpt_ranks_test TRAIN_GPT WORK_DIR kill-sharded-parameters
//       The same with the parameters sharded too (--shard parameters) on 4 ranks, resumed so on 3.
//   train_gpt_ranks_test TRAIN_GPT WORK_DIR kill-tensor-parallel
//       The same with --tensor-parallel 2 on 4 ranks (a 2 x 2 grid), resumed on one pair.
//   train_gpt_ranks_test TRAIN_GPT WORK_DIR stop
//       SIGTERM to the launcher of a 2-rank run: every rank ends its step, the checkpoint is
//       saved, one line, exit 0, no process left, and the run resumes from it; two signals
//       end the job at once; the launcher killed (SIGKILL) takes mpirun and the ranks along.
//   train_gpt_ranks_test TRAIN_GPT WORK_DIR faults
//       A rank that fails mid-run (ATTN_FAULT, attn/fault.hpp: an exception on the main
//       thread, in an OpenMP region's master thread, on stage 3's communication thread), in
//       generated cases (place, scheme, ranks, the failing rank and call): the job ends with
//       exit status 1 and one line that names the rank, the cause and the checkpoint to
//       resume from, never a backtrace, an Open MPI report or a hang.
//   train_gpt_ranks_test TRAIN_GPT WORK_DIR freeze
//       A rank frozen mid-run (SIGSTOP), in generated cases: the collective watchdog
//       (--collective-timeout 5) ends the job within its timeout and 10 s more, with exit
//       status 1 and one line naming the frozen rank and the checkpoint; no process is left.
//   train_gpt_ranks_test compare RUN REFERENCE_RUN CORPUS [TRAIN_GPT_FLAGS...]
//       The same comparison of two run folders (for the test across network namespaces).
#include "step_bounds.hpp"

#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/npy.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"
#include "attn/trainer.hpp"

#include <nlohmann/json.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// How two runs are compared. A run with ranks and one without sum the same terms in other
// orders, and the gap grows with the steps (a gradient at rounding level can flip its AdamW
// step): no bound holds for a whole run, so the floats are compared where both runs are in the
// same state, with step_bounds.hpp's bounds for one pass or one step (derived there):
//   - the first step a run takes (both start from the seed's weights or from copies of one
//     checkpoint): its loss and gradient norm, and the evaluation made before it;
//   - the end: one process loads the ranked run's last checkpoint here, evaluates as the
//     ranked run's last evaluation did (one pass's bound) and samples its text (the same
//     weights and the same code: exactly);
//   - for the runs next_step() is given, one step more: the ranked run resumed for one step
//     from its checkpoint against one process's step from the same checkpoint here (loss,
//     norm, AdamW's moments, weights, step count);
// and every other step and evaluation is logged by both, each finite.
//
// With 16-bit products (--precision bf16 or fp16) a product's input that lies within
// float32's reduction-order rounding of a 16-bit rounding boundary rounds to the other
// neighbour in one of the runs, and that element moves by a whole 16-bit step (2^-8 of it in
// bfloat16): no bound on a pass follows from the order of its sums alone. Those runs' first
// step and evaluations get the option matrix's allowance (tests/cuda/train_gpt_matrix.cpp):
// losses and evaluations to 1e-3 relative, gradient norms to 2e-2. A wrong share of the batch
// or a missing gradient still misses them by far (1e-2 and more in the loss).
struct Half16 {
    double values = 1e-3, norm = 2e-2;
};

int failures = 0;
void fail(const std::string& where, const std::string& what) {
    std::cout << "FAIL: " << where << ": " << what << "\n";
    ++failures;
}

std::string read_text(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

struct Outcome {
    int status = -1;  // exit status; 128 + the signal that ended it
    std::string out, err;
    double seconds = 0.0;
};

// Starts `program args` with its output in dir/stdout and dir/stderr; returns its pid.
pid_t start(const std::string& program, std::vector<std::string> args, const fs::path& dir) {
    fs::create_directories(dir);
    const std::string out = (dir / "stdout").string(), err = (dir / "stderr").string();
    std::vector<char*> argv;
    std::string argv0 = program;
    argv.push_back(argv0.data());
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t pid = fork();
    if (pid == 0) {
        const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        dup2(o, STDOUT_FILENO);
        dup2(e, STDERR_FILENO);
        execv(argv[0], argv.data());
        _exit(127);
    }
    return pid;
}

// Waits for a started program; a job that has not ended after `hang_guard` seconds is a
// hang (a rank waiting for ever) and is killed: status 128 + 9.
Outcome finish(pid_t pid, const fs::path& dir, double hang_guard = 300.0) {
    const auto begin = std::chrono::steady_clock::now();
    Outcome o;
    int status = 0;
    while (true) {
        const pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) break;
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count() > hang_guard) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    o.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    o.out = read_text(dir / "stdout");
    o.err = read_text(dir / "stderr");
    return o;
}

Outcome run(const std::string& program, const std::vector<std::string>& args, const fs::path& dir) {
    return finish(start(program, args, dir), dir);
}

// The lines of stderr that are not progress lines ("step   100/3000 | loss ...").
std::vector<std::string> message_lines(const std::string& err) {
    std::vector<std::string> lines;
    std::istringstream in(err);
    for (std::string line; std::getline(in, line);) {
        const bool progress = line.rfind("step ", 0) == 0 && line.find('/') != std::string::npos &&
                              line.find(" | loss ") != std::string::npos;
        if (!progress) lines.push_back(line);
    }
    return lines;
}

// A refusal: exit status 1 or 2 and one line on stderr.
std::string refusal_problem(const Outcome& o) {
    const std::vector<std::string> lines = message_lines(o.err);
    if ((o.status == 1 || o.status == 2) && lines.size() == 1) return "";
    return "expected a refusal in one line, got exit status " + std::to_string(o.status) + " and " +
           std::to_string(lines.size()) + " lines on stderr: " + o.err.substr(0, 600);
}

// The step of a run's checkpoint (-1: none).
long long checkpoint_step(const fs::path& run) {
    std::ifstream in(run / "checkpoint" / "trainer.json");
    try {
        return json::parse(in).at("step").get<long long>();
    } catch (const std::exception&) {
        return -1;
    }
}

// A sharded checkpoint's weights and moments in the flat order, read here from the bytes of
// shards.json and the ranks' files (each: its runs' weights, then m, then v, float32), not by
// the library's reader.
struct Flat {
    std::vector<float> weights, m, v;
};
Flat flat_of_shards(const fs::path& dir) {
    std::ifstream in(dir / "shards.json");
    const json layout = json::parse(in);
    const std::size_t P = layout.at("parameters").get<std::size_t>();
    Flat flat;
    flat.weights.assign(P, std::nanf(""));
    flat.m = flat.v = flat.weights;
    for (const json& f : layout.at("files")) {
        std::size_t n = 0;
        for (const json& s : f.at("segments")) n += s.at(1).get<std::size_t>();
        std::vector<float> all(3 * n);
        std::ifstream bin(dir / f.at("name").get<std::string>(), std::ios::binary);
        bin.read(reinterpret_cast<char*>(all.data()), static_cast<std::streamsize>(all.size() * sizeof(float)));
        std::size_t at = 0;
        for (const json& s : f.at("segments")) {
            const std::size_t offset = s.at(0).get<std::size_t>(), size = s.at(1).get<std::size_t>();
            for (std::size_t i = 0; i < size; ++i) {
                flat.weights.at(offset + i) = all.at(at + i);
                flat.m.at(offset + i) = all.at(n + at + i);
                flat.v.at(offset + i) = all.at(2 * n + at + i);
            }
            at += size;
        }
    }
    return flat;
}

// A run's numbers: metrics.jsonl's steps and evaluations, the sample, and from its
// checkpoint's trainer.json the sizes its bounds depend on.
struct Results {
    std::map<long long, std::vector<double>> steps;  // step → loss, grad norm
    std::map<long long, std::vector<double>> evals;  // step → train loss, val loss
    std::string sample;
    long long checkpoint_step = -1;
    std::size_t weights = 0;  // floats in the checkpoint
    TrainConfig config;       // the sizes and eval_iters, from trainer.json
    std::size_t vocab = 0;
    bool float32 = true;
};

Results results_of(const fs::path& out) {
    Results r;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
        const json j = json::parse(line);
        const long long step = j.at("step").get<long long>();
        // A step that loss scaling skipped has no norm (it was infinite): -1 stands for it.
        if (j.contains("loss")) r.steps[step] = {j.at("loss").get<double>(), j.value("grad_norm", -1.0)};
        else r.evals[step] = {j.at("train_loss").get<double>(), j.at("val_loss").get<double>()};
    }
    if (fs::exists(out / "checkpoint" / "trainer.json")) {
        std::ifstream t(out / "checkpoint" / "trainer.json");
        const json j = json::parse(t);
        r.checkpoint_step = j.at("step").get<long long>();
        const json& c = j.at("config");
        r.config.n_layer = c.at("n_layer").get<int>();
        r.config.n_head = c.at("n_head").get<int>();
        r.config.n_embd = c.at("n_embd").get<int>();
        r.config.block_size = c.at("block_size").get<int>();
        r.config.batch_size = c.at("batch_size").get<int>();
        r.config.grad_accum = c.value("grad_accum", 1);
        r.config.eval_iters = c.at("eval_iters").get<std::int64_t>();
        r.float32 = c.at("precision").get<std::string>() == "fp32";
        std::ifstream m(out / "checkpoint" / "config.json");
        r.vocab = json::parse(m).at("vocab_size").get<std::size_t>();
        for (const auto& entry : fs::directory_iterator(out / "checkpoint")) {
            if (entry.path().extension() == ".npy") r.weights += read_npy(entry.path()).data.size();
        }
        if (fs::exists(out / "checkpoint" / "shards.json")) {  // the ranks' files: P, and the tied LM head
            const Flat flat = flat_of_shards(out / "checkpoint");
            r.weights += flat.weights.size() + static_cast<std::size_t>(r.vocab) * r.config.n_embd;
        }
    }
    r.sample = read_text(out / "sample.txt");
    return r;
}

// What the runs were given that one process here must do alike: the sample's flags (train_gpt's
// defaults where not given) and the attention.
struct RunFlags {
    int sample = 500;
    float temperature = 0.8f;
    int top_k = 0;
    std::string prompt;
    bool fused = false;
};
RunFlags flags_of(const std::vector<std::string>& args) {
    RunFlags f;
    for (std::size_t i = 0; i + 1 < args.size(); ++i) {
        const std::string& a = args[i];
        const std::string& v = args[i + 1];
        if (a == "--sample") f.sample = std::stoi(v);
        else if (a == "--temperature") f.temperature = std::stof(v);
        else if (a == "--top-k") f.top_k = std::stoi(v);
        else if (a == "--prompt") f.prompt = v;
        else if (a == "--attention") f.fused = v == "fused";
    }
    return f;
}

// Whether `got` lies within `bound` of `expected`, relative; a line for a problem.
std::string gap_problem(const char* what, long long step, double got, double expected, double bound) {
    const double gap = std::fabs(got - expected);
    if (gap <= bound * std::fabs(expected)) return "";
    char buf[240];
    std::snprintf(buf, sizeof buf, "%s at step %lld: %.9g, one process %.9g (%.2g of its bound %.2g relative)", what,
                  step, got, expected, gap / (bound * std::fabs(expected)), bound);
    return buf;
}

// The problems in the ranked run `got_dir` against one process's `expected_dir`, both started
// at step `from` from the same state (see the top of this file). `corpus` and `flags`: for one
// process here, from the ranked run's last checkpoint.
std::vector<std::string> compare(const fs::path& got_dir, const fs::path& expected_dir, const fs::path& corpus,
                                 const RunFlags& flags, long long from = 0) {
    const Results got = results_of(got_dir), expected = results_of(expected_dir);
    std::vector<std::string> problems;
    const auto add = [&](const std::string& p) {
        if (!p.empty()) problems.push_back(p);
    };
    if (expected.vocab == 0 || got.vocab == 0) {
        problems.push_back("a run without a checkpoint");
        return problems;
    }
    // One pass: the loss to 2γ of its chain of sums (a mean of positive terms last), the norm
    // to 2γ_backward and both floats' ½ulp, an evaluation to 2γ of forward + eval_iters.
    const mpi_test::SumChains chains = mpi_test::sum_chains(expected.config, expected.vocab);
    const double u = mpi_test::unit_roundoff;
    const Half16 half16;
    const double loss_bound = expected.float32 ? 2 * mpi_test::gamma_of(chains.forward) + u : half16.values;
    const double norm_bound = expected.float32 ? 2 * mpi_test::gamma_of(chains.backward) + 2 * u : half16.norm;
    const double eval_bound = expected.float32
                                  ? 2 * mpi_test::gamma_of(chains.forward + double(expected.config.eval_iters)) + u
                                  : half16.values;
    auto logged = [&](const char* what, const std::map<long long, std::vector<double>>& a,
                      const std::map<long long, std::vector<double>>& b) {
        std::size_t seen = 0;
        for (const auto& [step, values] : b) {
            if (step < from) continue;
            const auto it = a.find(step);
            if (it == a.end()) {
                problems.push_back(std::string(what) + " of step " + std::to_string(step) + " missing");
                continue;
            }
            ++seen;
            for (double x : it->second) {
                if (!std::isfinite(x) && x != -1.0) problems.push_back(std::string(what) + " of step " + std::to_string(step) + " not finite");
            }
        }
        if (seen == 0) problems.push_back(std::string("no ") + what + " to compare");
    };
    logged("the step's loss and gradient norm", got.steps, expected.steps);
    logged("the evaluation", got.evals, expected.evals);
    // The first step from the same state, and the evaluation before it.
    const auto first = expected.steps.find(from);
    const auto mine = got.steps.find(from);
    if (first == expected.steps.end() || mine == got.steps.end()) {
        problems.push_back("no step " + std::to_string(from) + " to compare");
    } else {
        add(gap_problem("the first step's loss", from, mine->second[0], first->second[0], loss_bound));
        add(gap_problem("the first step's gradient norm", from, mine->second[1], first->second[1], norm_bound));
    }
    const auto e0 = expected.evals.find(from), g0 = got.evals.find(from);
    if (e0 != expected.evals.end() && g0 != got.evals.end()) {
        add(gap_problem("the train loss of the evaluation before the first step", from, g0->second[0], e0->second[0], eval_bound));
        add(gap_problem("the val loss of the evaluation before the first step", from, g0->second[1], e0->second[1], eval_bound));
    }
    if (got.weights != expected.weights) {
        problems.push_back("the checkpoint holds " + std::to_string(got.weights) + " weights, one process's " +
                           std::to_string(expected.weights));
    }
    // The end: one process here, from the ranked run's last checkpoint.
    std::ifstream text(corpus);
    std::ostringstream all;
    all << text.rdbuf();
    Trainer one = Trainer::load(got_dir / "checkpoint", make_dataset(all.str()));
    if (flags.fused) one.model().set_attention(AttentionKind::fused);
    const auto last = got.evals.find(got.checkpoint_step);
    if (last == got.evals.end()) {
        problems.push_back("no evaluation at the checkpoint's step " + std::to_string(got.checkpoint_step));
    } else {
        const EvalRecord e = one.evaluate();
        add(gap_problem("the last evaluation's train loss, against one process's from the run's checkpoint",
                        got.checkpoint_step, last->second[0], e.train_loss, eval_bound));
        add(gap_problem("the last evaluation's val loss, against one process's from the run's checkpoint",
                        got.checkpoint_step, last->second[1], e.val_loss, eval_bound));
    }
    if (!got.sample.empty() || !expected.sample.empty()) {
        SampleOptions s;
        s.max_new_tokens = flags.sample;
        s.temperature = flags.temperature;
        s.top_k = flags.top_k;
        s.seed = one.config().seed;
        const std::string sample = generate_text(one.model(), one.data().vocab, flags.prompt, s) + "\n";
        if (got.sample != sample) {
            problems.push_back("the sample differs from one process's from the run's checkpoint: '" +
                               got.sample.substr(0, 60) + "' against '" + sample.substr(0, 60) + "'");
        }
    }
    return problems;
}

// One step more of a ranked run, against one process's from the same checkpoint: the run's
// checkpoint copied to `work`, one process's step from the copy here, then the run resumed for
// one step by `program resume_args...` (which must name the run's folder with --resume); the
// problems, and a line of the worst gaps.
std::vector<std::string> next_step(const std::string& program, const fs::path& run_dir,
                                   const std::vector<std::string>& resume_args, const fs::path& corpus,
                                   const fs::path& work, std::string& summary) {
    std::vector<std::string> problems;
    fs::remove_all(work);
    fs::create_directories(work);
    fs::copy(run_dir / "checkpoint", work / "before", fs::copy_options::recursive);
    std::ifstream text(corpus);
    std::ostringstream all;
    all << text.rdbuf();
    const TextDataset data = make_dataset(all.str());
    Trainer one = Trainer::load(work / "before", data);
    // The state before the step as the files hold it: the moments, the step and AdamW's count
    // read here, so that a load that loses them fails (one process and the run load alike).
    mpi_test::detail::State before = mpi_test::detail::state_of(one);
    if (fs::exists(work / "before" / "shards.json")) {
        const Flat flat = flat_of_shards(work / "before");
        before.m = flat.m;
        before.v = flat.v;
    } else {
        before.m = read_npy(work / "before" / "optimizer" / "m.npy").data;
        before.v = read_npy(work / "before" / "optimizer" / "v.npy").data;
    }
    {
        std::ifstream t(work / "before" / "trainer.json");
        const json j = json::parse(t);
        before.step = j.at("step").get<std::int64_t>();
        before.count = j.at("adamw_step_count").get<long>();
    }
    const StepRecord r = one.train_step();
    const std::vector<float> g = one.model().gradients();  // after clipping: AdamW's input
    const mpi_test::detail::State ref = mpi_test::detail::state_of(one);
    std::vector<std::string> args = resume_args;
    args.insert(args.end(), {"--max-iters", std::to_string(before.step + 1)});
    const Outcome o = run(program, args, work / "log");
    if (o.status != 0) {
        problems.push_back("resumed for one step: exit " + std::to_string(o.status) + ": " + o.err.substr(0, 400));
        return problems;
    }
    const Results after_run = results_of(run_dir);
    const auto logged = after_run.steps.find(before.step);
    if (logged == after_run.steps.end()) {
        problems.push_back("resumed for one step: step " + std::to_string(before.step) + " not logged");
        return problems;
    }
    StepRecord s;
    s.loss = static_cast<float>(logged->second[0]);  // logged from the float: exact
    s.grad_norm = static_cast<float>(logged->second[1]);
    Trainer next = Trainer::load(run_dir / "checkpoint", data);
    mpi_test::StepGaps gaps;
    mpi_test::detail::compare_step(gaps, static_cast<int>(before.step), before, r, g, ref, s,
                                   mpi_test::detail::state_of(next), one,
                                   mpi_test::sum_chains(one.config(), data.vocab.size()));
    summary = mpi_test::worst("loss", gaps.loss) + "; " + mpi_test::worst("norm", gaps.norm) + "; " +
              mpi_test::worst("m", gaps.m) + "; " + mpi_test::worst("v", gaps.v) + "; " +
              mpi_test::worst("weights", gaps.weights);
    const bool ok = gaps.loss.ratio <= 1 && gaps.norm.ratio <= 1 && gaps.m.ratio <= 1 && gaps.v.ratio <= 1 &&
                    gaps.weights.ratio <= 1 && gaps.mismatches.empty();
    if (!ok) {
        std::string counts;
        for (const std::string& m : gaps.mismatches) counts += "; " + m;
        problems.push_back("one step more, against one process's from the same checkpoint: " + summary + counts);
    }
    return problems;
}

// Words of a small alphabet, deterministic: vocabulary 31, 20 000 characters.
void write_corpus(const fs::path& path) {
    std::string text = "to be, or not to be.\n";
    std::uint64_t x = 2024;
    auto next = [&x](std::uint64_t n) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        return (x >> 33) % n;
    };
    const std::string letters = "abcdefghijklmnopqrstuvwxyz", separators = ",.;\n";
    while (text.size() < 20000) {
        const std::uint64_t n = 1 + next(7);
        for (std::uint64_t i = 0; i < n; ++i) text += letters[next(letters.size())];
        text += next(5) == 0 ? separators[next(separators.size())] : ' ';
    }
    std::ofstream(path) << text;
}

// ---------------------------------------------------------------------------------------
// Every option with --ranks 2 against one process.

enum class Role {
    help,      // --help: read by this test
    axis,      // --ranks, --allreduce: the comparison itself
    plumbing,  // where the run's files come from and go
    varied,    // tried alone on the base run, with and without ranks
};

struct Use {
    std::string name;
    Role role;
    std::vector<std::string> values;  // "" for a flag
    std::string note = "";            // why an option or value is not tried
};

const std::string resume_value = "@resume", init_value = "@init", dump_value = "@dump";

std::vector<Use> option_table() {
    const std::string flag;
    return {
        {"--help", Role::help, {}, "its text is what this test reads"},
        {"--data", Role::plumbing, {}, "every run reads the test's corpus"},
        {"--out", Role::plumbing, {}, "every run writes its own folder"},
        {"--overwrite", Role::plumbing, {}, "every run writes its own, new folder"},
        {"--ranks", Role::axis, {}, "1 (no ranks) against 2; the base run also on 4"},
        {"--allreduce", Role::axis, {}, "overlapped (the default) on every run; after on the base run"},
        {"--bucket-cap-mb", Role::axis, {}, "on the base run with 2 ranks (0.06: the two blocks in one "
                                             "bucket) and 4 ranks (25 after a first of 0.03)"},
        {"--first-bucket-mb", Role::axis, {}, "with --bucket-cap-mb on the base run, 4 ranks"},
        {"--bucket-view", Role::axis, {}, "on the base run with 2 ranks, alone and with --bucket-cap-mb 0.06"},
        {"--shard", Role::axis, {}, "optimizer, gradients and parameters with 2 ranks on every run beside "
                                    "plain data parallelism; the base run also on 3 and 4 ranks"},
        {"--tensor-parallel", Role::axis, {}, "2 with 2 ranks on every run; the base run also on 4 ranks (a 2 x 2 "
                                              "grid)"},
        {"--batch-per-rank", Role::axis, {}, "2 ranks of the base's batch of 8 each against one process "
                                              "of --batch-size 16; refused without ranks"},
        {"--collective-timeout", Role::axis, {}, "every ranked run here has its default; a frozen rank in the "
                                                 "freeze part, refused without ranks"},
        {"--batch-size", Role::varied, {"6"}, ""},
        {"--grad-accum", Role::varied, {"2"}, ""},
        {"--recompute", Role::varied, {"attention", "blocks"}, ""},
        {"--recipe", Role::varied, {"cpu"}, "shakespeare not tried: its 10.7M parameters take seconds a step"},
        {"--consolidate", Role::plumbing, {}, "runs alone (the sharded part of this test)"},
        {"--resume", Role::varied, {resume_value}, ""},
        {"--init", Role::varied, {init_value}, ""},
        {"--max-iters", Role::varied, {"5"}, ""},
        {"--eval-interval", Role::varied, {"1"}, ""},
        {"--eval-iters", Role::varied, {"3"}, ""},
        {"--learning-rate", Role::varied, {"0.01"}, ""},
        {"--dropout", Role::varied, {"0.2"}, ""},
        {"--seed", Role::varied, {"7"}, ""},
        {"--no-causal-mask", Role::varied, {flag}, ""},
        {"--position", Role::varied, {"rope", "alibi"}, ""},
        {"--no-attention-scale", Role::varied, {flag}, ""},
        {"--kv-heads", Role::varied, {"1"}, ""},
        {"--window", Role::varied, {"8"}, ""},
        {"--dump-grads", Role::varied, {dump_value}, ""},
        {"--sample", Role::varied, {"40"}, ""},
        {"--temperature", Role::varied, {"0.5"}, ""},
        {"--top-k", Role::varied, {"3"}, ""},
        {"--prompt", Role::varied, {"to be"}, ""},
        {"--device", Role::varied, {"auto", "cuda", "sim"}, ""},
        {"--tf32", Role::varied, {flag}, ""},
        {"--attention", Role::varied, {"fused"}, ""},
        {"--bench", Role::varied, {"2"}, ""},
        {"--threads", Role::varied, {"2"}, ""},
        {"--threads-info", Role::varied, {flag}, ""},
        {"--precision", Role::varied, {"bf16", "fp16"}, ""},
    };
}

// The options --help lists: "  --name ..." (or "  -h,--help") at the start of a line.
std::set<std::string> listed_options(const std::string& help) {
    std::set<std::string> names;
    std::istringstream in(help);
    for (std::string line; std::getline(in, line);) {
        const std::size_t start = line.find_first_not_of(' ');
        if (start == 0 || start == std::string::npos) continue;  // not an option's line
        std::size_t at = line.compare(start, 3, "-h,") == 0 ? start + 3 : start;
        if (line.compare(at, 2, "--") != 0) continue;
        const std::size_t end = line.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789-", at + 2);
        names.insert(line.substr(at, end == std::string::npos ? std::string::npos : end - at));
    }
    return names;
}

int test_options(const std::string& program, const fs::path& root) {
    set_num_threads(1, "the runs' --threads 1");  // one process here computes as they do
    const Outcome help = run(program, {"--help"}, root / "help");
    const std::set<std::string> listed = listed_options(help.out);
    const std::vector<Use> table = option_table();
    std::set<std::string> known;
    for (const Use& u : table) known.insert(u.name);
    for (const std::string& name : listed) {
        if (!known.count(name)) fail("train_gpt --help", "lists " + name + ", which this test's table does not know");
    }
    for (const std::string& name : known) {
        if (!listed.count(name)) fail("the table", name + " is not in train_gpt --help");
    }
    if (failures) return 1;
    for (const Use& u : table) {
        if (u.role != Role::varied) std::cout << "not varied: " << u.name << ": " << u.note << "\n";
        else if (!u.note.empty()) std::cout << "not tried: " << u.name << ": " << u.note << "\n";
    }

    const fs::path corpus = root / "corpus.txt";
    write_corpus(corpus);
    // The base run: the tiny recipe (batch 8, shared 4 + 4 by 2 ranks), 4 steps, evaluated at
    // 0, 2 and 4, a sample of 16 characters, one thread per process.
    const std::vector<std::string> base = {"--recipe", "tiny", "--max-iters", "4", "--eval-interval", "2",
                                           "--eval-iters", "2", "--sample", "16", "--threads", "1",
                                           "--data", corpus.string()};
    // What --resume and --init start from.
    const fs::path resume_source = root / "resume_source";
    {
        std::vector<std::string> args = base;
        args[3] = "2";
        args.insert(args.end(), {"--out", resume_source.string()});
        const Outcome o = run(program, args, root / "resume_source_log");
        if (o.status != 0) {
            fail("the run to resume", o.err);
            return 1;
        }
    }
    const fs::path init = resume_source / "checkpoint";

    struct Entry {
        std::string label;
        std::vector<std::string> args;  // without --out and --ranks
        fs::path dump;                  // --dump-grads' folder, if any
    };
    std::vector<Entry> entries = {{"the base run", base, {}}};
    for (const Use& u : table) {
        if (u.role != Role::varied) continue;
        for (const std::string& value : u.values) {
            Entry e{u.name + (value.empty() ? "" : " " + value), {}, {}};
            // --resume keeps its checkpoint's settings: it takes none of the base's recipe.
            if (value == resume_value) {
                e.args = {"--max-iters", "4", "--sample", "16", "--threads", "1", "--data", corpus.string()};
            } else {
                e.args = base;
            }
            e.args.push_back(u.name);
            if (value == resume_value) {
                e.args.push_back("@copy");  // each run resumes its own copy
            } else if (value == init_value) {
                e.args.push_back(init.string());
            } else if (value == dump_value) {
                e.args.push_back("@dump");
            } else if (!value.empty()) {
                e.args.push_back(value);
            }
            entries.push_back(e);
        }
    }

    int compared = 0, refused = 0;
    for (std::size_t i = 0; i < entries.size(); ++i) {
        const Entry& e = entries[i];
        std::vector<Outcome> outcomes;
        std::vector<fs::path> outs;
        // One process, then 2 ranks (and for the base run 4 ranks, and the other schedule).
        std::vector<std::vector<std::string>> extra = {{}, {"--ranks", "2"}, {"--ranks", "2", "--shard", "optimizer"},
                                                       {"--ranks", "2", "--shard", "gradients"},
                                                       {"--ranks", "2", "--shard", "parameters"},
                                                       {"--ranks", "2", "--tensor-parallel", "2"}};
        if (i == 0) {
            extra.push_back({"--ranks", "3", "--shard", "optimizer"});
            extra.push_back({"--ranks", "4", "--shard", "optimizer"});
            extra.push_back({"--ranks", "3", "--shard", "gradients"});
            extra.push_back({"--ranks", "4", "--shard", "gradients"});
            extra.push_back({"--ranks", "3", "--shard", "parameters"});
            extra.push_back({"--ranks", "4", "--shard", "parameters"});
            extra.push_back({"--ranks", "4", "--tensor-parallel", "2"});
            extra.push_back({"--ranks", "4"});
            extra.push_back({"--ranks", "2", "--allreduce", "after"});
            extra.push_back({"--ranks", "4", "--allreduce", "after"});
            extra.push_back({"--ranks", "2", "--bucket-cap-mb", "0.06"});
            extra.push_back({"--ranks", "4", "--bucket-cap-mb", "25", "--first-bucket-mb", "0.03"});
            extra.push_back({"--ranks", "2", "--bucket-view"});
            extra.push_back({"--ranks", "2", "--bucket-view", "--bucket-cap-mb", "0.06"});
        }
        for (std::size_t k = 0; k < extra.size(); ++k) {
            const fs::path dir = root / ("entry" + std::to_string(i)) / ("run" + std::to_string(k));
            fs::create_directories(dir);
            std::vector<std::string> args;
            for (const std::string& a : e.args) {
                if (a == "@copy") {
                    fs::copy(resume_source, dir / "out", fs::copy_options::recursive);
                    args.push_back((dir / "out").string());
                } else if (a == "@dump") {
                    args.push_back((dir / "dump").string());
                } else {
                    args.push_back(a);
                }
            }
            if (std::find(args.begin(), args.end(), "--resume") == args.end()) {
                args.insert(args.end(), {"--out", (dir / "out").string()});
            }
            args.insert(args.end(), extra[k].begin(), extra[k].end());
            outcomes.push_back(run(program, args, dir / "log"));
            outs.push_back(dir / "out");
        }
        const Outcome& alone = outcomes[0];
        for (std::size_t k = 1; k < outcomes.size(); ++k) {
            std::string where = e.label + " with";
            for (const std::string& a : extra[k]) where += " " + a;
            const Outcome& ranked = outcomes[k];
            if (alone.status != 0) {
                // Refused alone (--tf32 on the CPU, --device cuda without a GPU): refused with
                // ranks too, in one line.
                const std::string problem = refusal_problem(ranked);
                if (!refusal_problem(alone).empty()) fail(e.label + " alone", refusal_problem(alone));
                if (!problem.empty()) fail(where, problem);
                ++refused;
                continue;
            }
            if (ranked.status != 0) {
                // The ranks do not implement it: a refusal in one line, before any work.
                const std::string problem = refusal_problem(ranked);
                if (!problem.empty()) fail(where, problem);
                else if (fs::exists(outs[k] / "metrics.jsonl")) fail(where, "refused after training began");
                else std::cout << "refused: " << where << ": " << message_lines(ranked.err)[0] << "\n";
                ++refused;
                continue;
            }
            if (!fs::exists(outs[0] / "metrics.jsonl")) {
                // An option that ends the program before training (--bench, --threads-info).
                if (fs::exists(outs[k] / "metrics.jsonl")) fail(where, "trained where one process did not");
                continue;
            }
            // A resumed run starts at its checkpoint's step; the lines before it are the copy's.
            const bool resumed = std::find(e.args.begin(), e.args.end(), "--resume") != e.args.end();
            const long long from = resumed ? checkpoint_step(resume_source) : 0;
            for (const std::string& problem : compare(outs[k], outs[0], corpus, flags_of(e.args), from)) {
                fail(where, problem);
            }
            // The base run on every scheme: one step more, from the ranked run's checkpoint.
            if (i == 0) {
                std::vector<std::string> resume = {"--resume", outs[k].string(), "--sample", "0", "--threads", "1",
                                                   "--data", corpus.string()};
                resume.insert(resume.end(), extra[k].begin(), extra[k].end());
                std::string summary;
                const std::vector<std::string> problems =
                    next_step(program, outs[k], resume, corpus, outs[k].parent_path() / "next", summary);
                for (const std::string& problem : problems) fail(where, problem);
                if (problems.empty()) std::cout << "ok: " << where << ": one step more is one process's from its checkpoint: " << summary << "\n";
            }
            ++compared;
        }
    }
    // --batch-per-rank: each of 2 ranks trains on the base's whole batch of 8, so a step is
    // one process's step on 16 sequences (the ranks draw one batch of 16 and take 8 each).
    {
        const fs::path dir = root / "batch_per_rank";
        fs::create_directories(dir);
        std::vector<std::string> alone = base, ranked = base, lone = base;
        alone.insert(alone.end(), {"--batch-size", "16", "--out", (dir / "alone").string()});
        ranked.insert(ranked.end(), {"--batch-per-rank", "--ranks", "2", "--out", (dir / "ranked").string()});
        lone.insert(lone.end(), {"--batch-per-rank", "--out", (dir / "lone").string()});
        const Outcome a = run(program, alone, dir / "alone_log");
        const Outcome r = run(program, ranked, dir / "ranked_log");
        if (a.status != 0) {
            fail("--batch-size 16", a.err);
        } else if (r.status != 0) {
            fail("--batch-per-rank with --ranks 2", r.err);
        } else {
            for (const std::string& problem : compare(dir / "ranked", dir / "alone", corpus, flags_of(base))) {
                fail("--batch-per-rank with --ranks 2 against --batch-size 16", problem);
            }
            ++compared;
        }
        const Outcome l = run(program, lone, dir / "lone_log");
        if (const std::string problem = refusal_problem(l); !problem.empty()) fail("--batch-per-rank alone", problem);
        else ++refused;
    }
    std::cout << "options: " << entries.size() << " runs of one process, each with ranks: " << compared
              << " compared, " << refused << " refused in one line\n";
    return failures ? 1 : 0;
}

// ---------------------------------------------------------------------------------------
// Bad uses of ranks: one line each.

int test_refusals(const std::string& program, const fs::path& root, const std::string& mpirun) {
    const fs::path corpus = root / "corpus.txt";
    write_corpus(corpus);
    const std::vector<std::string> base = {"--recipe", "tiny", "--max-iters", "2", "--threads", "1",
                                           "--sample", "0", "--data", corpus.string()};
    struct Case {
        std::string what;
        std::vector<std::string> args;
    };
    const std::vector<Case> cases = {
        {"--ranks 0", {"--ranks", "0"}},
        {"more ranks than sequences in a batch", {"--ranks", "9"}},
        {"--allreduce without ranks", {"--allreduce", "after"}},
        {"--allreduce with a schedule that does not exist", {"--ranks", "2", "--allreduce", "sometimes"}},
        {"--bucket-cap-mb without ranks", {"--bucket-cap-mb", "1"}},
        {"--bucket-view without ranks", {"--bucket-view"}},
        {"--bucket-view with --allreduce after", {"--ranks", "2", "--allreduce", "after", "--bucket-view"}},
        {"--bucket-cap-mb with --allreduce after", {"--ranks", "2", "--allreduce", "after", "--bucket-cap-mb", "1"}},
        {"--first-bucket-mb without --bucket-cap-mb", {"--ranks", "2", "--first-bucket-mb", "1"}},
        {"a negative bucket cap", {"--ranks", "2", "--bucket-cap-mb", "-1"}},
        {"--shard without ranks", {"--shard", "optimizer"}},
        {"--shard of something not sharded", {"--ranks", "2", "--shard", "activations"}},
        {"--shard with --allreduce", {"--ranks", "2", "--shard", "optimizer", "--allreduce", "after"}},
        {"--shard with --bucket-cap-mb", {"--ranks", "2", "--shard", "optimizer", "--bucket-cap-mb", "1"}},
        {"--shard with fp16's loss scaling", {"--ranks", "2", "--shard", "optimizer", "--precision", "fp16"}},
        {"--shard gradients without ranks", {"--shard", "gradients"}},
        {"--shard gradients with --bucket-view", {"--ranks", "2", "--shard", "gradients", "--bucket-view"}},
        {"--shard gradients with fp16's loss scaling", {"--ranks", "2", "--shard", "gradients", "--precision", "fp16"}},
        {"--shard parameters without ranks", {"--shard", "parameters"}},
        {"--shard parameters with mixed precision", {"--ranks", "2", "--shard", "parameters", "--precision", "bf16"}},
        {"--grad-accum with --shard gradients", {"--ranks", "2", "--shard", "gradients", "--grad-accum", "2"}},
        {"--grad-accum with --shard parameters", {"--ranks", "2", "--shard", "parameters", "--grad-accum", "2"}},
        {"--grad-accum with --tensor-parallel", {"--ranks", "2", "--tensor-parallel", "2", "--grad-accum", "2"}},
        {"--tensor-parallel without ranks", {"--tensor-parallel", "2"}},
        {"--tensor-parallel that does not divide the ranks", {"--ranks", "3", "--tensor-parallel", "2"}},
        {"--tensor-parallel with heads that do not divide", {"--ranks", "4", "--tensor-parallel", "4"}},
        {"--tensor-parallel with --shard", {"--ranks", "2", "--tensor-parallel", "2", "--shard", "optimizer"}},
        {"--tensor-parallel with dropout", {"--ranks", "2", "--tensor-parallel", "2", "--dropout", "0.1"}},
        {"--tensor-parallel with mixed precision", {"--ranks", "2", "--tensor-parallel", "2", "--precision", "bf16"}},
        {"--tensor-parallel 0", {"--ranks", "2", "--tensor-parallel", "0"}},
        {"--tensor-parallel with the fused attention", {"--ranks", "2", "--tensor-parallel", "2", "--attention", "fused"}},
        {"--collective-timeout without ranks", {"--collective-timeout", "5"}},
        {"a negative --collective-timeout", {"--ranks", "2", "--collective-timeout", "-1"}},
        {"a corpus that does not exist, with ranks", {"--ranks", "2", "--data", (root / "missing.txt").string()}},
        {"a checkpoint that does not exist, with ranks", {"--ranks", "2", "--resume", (root / "nothing").string()}},
        {"--device sim with ranks", {"--ranks", "2", "--device", "sim"}},
        {"--dump-grads with ranks", {"--ranks", "2", "--dump-grads", (root / "dump").string()}},
        {"a run folder that holds a run, with ranks", {"--ranks", "2", "--out", "@existing"}},
    };
    // A run to refuse to replace.
    const fs::path existing = root / "existing";
    {
        std::vector<std::string> args = base;
        args.insert(args.end(), {"--out", existing.string()});
        if (run(program, args, root / "existing_log").status != 0) fail("the existing run", "did not train");
    }
    int n = 0;
    for (const Case& c : cases) {
        // The base's options, except those the case gives itself or that exclude its own.
        const auto has = [&c](const char* option) {
            return std::find(c.args.begin(), c.args.end(), option) != c.args.end();
        };
        std::vector<std::string> args;
        for (std::size_t i = 0; i < base.size(); i += 2) {
            if ((base[i] == "--data" && has("--data")) || (base[i] == "--recipe" && has("--resume"))) continue;
            args.insert(args.end(), {base[i], base[i + 1]});
        }
        for (const std::string& a : c.args) args.push_back(a == "@existing" ? existing.string() : a);
        if (std::find(c.args.begin(), c.args.end(), "--out") == c.args.end()) {
            args.insert(args.end(), {"--out", (root / ("out" + std::to_string(n))).string()});
        }
        const Outcome o = run(program, args, root / ("case" + std::to_string(n++)));
        const std::string problem = refusal_problem(o);
        if (!problem.empty()) fail(c.what, problem);
        else std::cout << "ok: " << c.what << ": " << message_lines(o.err)[0] << "\n";
    }
    // --shard on one rank runs, with one line that says it shares nothing.
    for (const char* scheme : {"optimizer", "gradients", "parameters"}) {
        std::vector<std::string> args = base;
        args.insert(args.end(), {"--ranks", "1", "--shard", scheme, "--out", (root / (std::string("one_") + scheme)).string()});
        const Outcome o = run(program, args, root / (std::string("one_") + scheme + "_log"));
        const std::vector<std::string> lines = message_lines(o.err);
        const std::string expected = std::string("train_gpt: note: --shard ") + scheme + " on one rank";
        if (o.status != 0 || lines.size() != 1 || lines[0].rfind(expected, 0) != 0) {
            fail(std::string("--ranks 1 --shard ") + scheme, "expected exit 0 and one line '" + expected + " …', got exit " +
                 std::to_string(o.status) + ": " + o.err.substr(0, 600));
        } else {
            std::cout << "ok: --ranks 1 --shard " << scheme << ": " << lines[0] << "\n";
        }
    }
    // Started by mpirun with another number of processes than --ranks says.
    std::vector<std::string> args = {"-np", "2", "--oversubscribe", "--allow-run-as-root", program};
    args.insert(args.end(), base.begin(), base.end());
    args.insert(args.end(), {"--ranks", "3", "--out", (root / "mismatch").string()});
    const Outcome o = run(mpirun, args, root / "mismatch_log");
    // mpirun adds its own report of the exit status; the job's own line is the first.
    const std::vector<std::string> lines = message_lines(o.err);
    if (o.status == 0 || lines.empty() || lines[0].find("--ranks 3") == std::string::npos ||
        std::count_if(lines.begin(), lines.end(), [](const std::string& l) { return l.rfind("train_gpt:", 0) == 0; }) != 1) {
        fail("mpirun -np 2 train_gpt --ranks 3", "expected one line from train_gpt, got: " + o.err.substr(0, 600));
    } else {
        std::cout << "ok: mpirun -np 2 train_gpt --ranks 3: " << lines[0] << "\n";
    }
    // mpirun's MPMD form: rank 1 given other arguments than rank 0. Each ends within 60 s
    // with one line from train_gpt naming the rank, its host and the cause, never a hang or
    // an MPI error in place of the cause.
    struct Mpmd {
        std::string what;
        std::vector<std::string> rank1;  // added to rank 1's arguments
        std::string expected;            // in train_gpt's line
        int status;
    };
    const std::vector<Mpmd> mpmd = {
        {"rank 1 cannot read its corpus", {"--data", (root / "missing.txt").string()}, "rank 1 on ", 1},
        {"rank 1's corpus is a folder", {"--data", root.string()}, "is a directory", 1},
        {"rank 1 sums its gradients after the backward pass, rank 0 during it", {"--allreduce", "after"},
         "--allreduce", 1},
        {"rank 1 sums its gradients in place, rank 0 copies them", {"--bucket-view"}, "--bucket-view", 1},
        {"rank 1 caps its buckets, rank 0 does not", {"--bucket-cap-mb", "0.06"}, "--bucket-cap-mb", 1},
        {"rank 1 shards the optimizer, rank 0 does not", {"--shard", "optimizer"}, "--shard", 1},
        {"rank 1's corpus differs", {"--data", (root / "other.txt").string()}, "do not start from the same state", 1},
        {"an option rank 1 cannot parse", {"--max-iters", "x"}, "rank 1 on ", 2},
    };
    {
        std::ofstream other(root / "other.txt");
        other << read_text(corpus) << "\nAnother line, on rank 1 only.\n";
    }
    for (std::size_t i = 0; i < mpmd.size(); ++i) {
        const Mpmd& c = mpmd[i];
        const std::string out = (root / ("mpmd" + std::to_string(i))).string();
        std::vector<std::string> a = {"-np", "1", "--oversubscribe", "--allow-run-as-root", program};
        a.insert(a.end(), base.begin(), base.end());
        a.insert(a.end(), {"--ranks", "2", "--out", out, ":", "-np", "1", program});
        for (std::size_t j = 0; j < base.size(); j += 2) {  // the base, less what rank 1 is given
            if (std::find(c.rank1.begin(), c.rank1.end(), base[j]) == c.rank1.end()) {
                a.insert(a.end(), {base[j], base[j + 1]});
            }
        }
        a.insert(a.end(), {"--ranks", "2", "--out", out});
        a.insert(a.end(), c.rank1.begin(), c.rank1.end());
        const fs::path log = root / ("mpmd" + std::to_string(i) + "_log");
        const Outcome m = finish(start(mpirun, a, log), log, 90.0);  // a hang is killed at 90 s
        const std::vector<std::string> said = message_lines(m.err);
        const auto ours = std::count_if(said.begin(), said.end(),
                                        [](const std::string& l) { return l.rfind("train_gpt:", 0) == 0; });
        if (m.status != c.status || said.empty() || ours != 1 || said[0].find(c.expected) == std::string::npos ||
            m.seconds > 60) {
            fail("mpmd: " + c.what, "expected exit " + std::to_string(c.status) + " within 60 s and one line from "
                 "train_gpt saying '" + c.expected + "', got exit " + std::to_string(m.status) + " after " +
                 std::to_string(static_cast<int>(m.seconds)) + " s: " + m.err.substr(0, 600));
        } else {
            std::cout << "ok: mpmd: " << c.what << ": " << said[0] << "\n";
        }
    }
    return failures ? 1 : 0;
}

// ---------------------------------------------------------------------------------------
// A rank killed mid-run.

// The processes whose parent is `parent`.
std::vector<pid_t> children_of(pid_t parent) {
    std::vector<pid_t> children;
    DIR* proc = opendir("/proc");
    if (!proc) return children;
    while (dirent* entry = readdir(proc)) {
        const std::string name = entry->d_name;
        if (name.find_first_not_of("0123456789") != std::string::npos) continue;
        std::ifstream stat("/proc/" + name + "/stat");
        std::string line;
        std::getline(stat, line);
        const std::size_t close = line.rfind(')');
        if (close == std::string::npos) continue;
        std::istringstream rest(line.substr(close + 2));
        char state = 0;
        long long ppid = 0;
        rest >> state >> ppid;
        if (ppid == parent) children.push_back(static_cast<pid_t>(std::stoll(name)));
    }
    closedir(proc);
    std::sort(children.begin(), children.end());
    return children;
}

// `scheme`: what the killed run on 4 ranks and the resumed one on `resume_ranks` add to the
// flags: nothing (plain data parallelism), --shard optimizer|gradients|parameters (ZeRO stage
// 1, 2 or 3) or --tensor-parallel 2 (a 2 x 2 grid, resumed on one pair).
int test_kill(const std::string& program, const fs::path& root, const std::vector<std::string>& scheme,
              const std::string& resume_ranks) {
    const fs::path corpus = root / "corpus.txt";
    write_corpus(corpus);
    // nanoGPT's CPU recipe for 80 steps (seconds a run), a checkpoint every 10 steps.
    const std::vector<std::string> base = {"--recipe", "cpu", "--max-iters", "80", "--eval-interval", "10",
                                           "--eval-iters", "2", "--sample", "0", "--data", corpus.string()};
    std::vector<std::string> args;
    const fs::path killed = root / "killed";
    args = base;
    args.insert(args.end(), {"--out", killed.string(), "--ranks", "4"});
    args.insert(args.end(), scheme.begin(), scheme.end());
    const pid_t launcher = start(program, args, root / "killed_log");
    // Once the checkpoint of step 20 is written, kill rank 2 (the launcher's child is mpirun,
    // whose children are the ranks, in the order it started them).
    std::vector<pid_t> ranks;
    for (int waited = 0; waited < 6000 && checkpoint_step(killed) < 20; ++waited) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const std::vector<pid_t> mpirun = children_of(launcher);
    if (!mpirun.empty()) ranks = children_of(mpirun[0]);
    if (checkpoint_step(killed) < 20 || ranks.size() != 4) {
        kill(launcher, SIGKILL);
        finish(launcher, root / "killed_log");
        fail("the run to kill", "no checkpoint at step 20, or not 4 ranks (" + std::to_string(ranks.size()) + ")");
        return 1;
    }
    const pid_t victim = ranks[2];
    kill(victim, SIGKILL);
    const Outcome o = finish(launcher, root / "killed_log", 120.0);
    const long long step = checkpoint_step(killed);
    std::cout << "killed rank process " << victim << "; the job ended " << o.seconds
              << " s later with exit status " << o.status << "; checkpoint at step " << step << "\n";
    // Every rank has ended: mpirun stopped the three others. A rank that mpirun has just
    // signalled may still be exiting when mpirun returns (the kernel tears it down after):
    // it is given 10 s to be gone; one still running then was left behind.
    const auto running = [](pid_t p) {
        if (kill(p, 0) != 0 || !fs::exists("/proc/" + std::to_string(p))) return false;
        std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
        std::string line;
        std::getline(stat, line);
        return line.find(") Z") == std::string::npos;  // a zombie has ended
    };
    for (pid_t p : ranks) {
        for (int waited = 0; waited < 1000 && running(p); ++waited) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        if (running(p)) fail("the killed job", "rank process " + std::to_string(p) + " still runs 10 s after mpirun ended");
    }
    const std::vector<std::string> lines = message_lines(o.err);
    if (o.status == 0 || lines.size() != 1) {
        fail("the killed job", "expected a non-zero exit and one line, got " + std::to_string(o.status) +
                                   " and: " + o.err.substr(0, 800));
    } else {
        std::cout << "its one line: " << lines[0] << "\n";
        const std::string expected = "rank 2 of 4 was killed (signal 9, SIGKILL)";
        if (lines[0].find(expected) == std::string::npos) fail("the killed job's line", "does not say '" + expected + "'");
        if (lines[0].find("(step " + std::to_string(step) + "), is intact") == std::string::npos) {
            fail("the killed job's line", "does not name the checkpoint's step " + std::to_string(step));
        }
    }
    if (step < 20 || step % 10 != 0) fail("the checkpoint", "at step " + std::to_string(step));

    // The checkpoint resumes on another number of ranks: its first step is one process's from
    // the checkpoint (step_bounds.hpp's bounds for one step), and the run goes on to its end,
    // every step and evaluation logged, the last evaluation one process's from its checkpoint.
    std::string again = resume_ranks + " ranks";
    for (const std::string& a : scheme) again += " " + a;
    args = {"--resume", killed.string(), "--ranks", resume_ranks, "--sample", "0", "--data", corpus.string()};
    args.insert(args.end(), scheme.begin(), scheme.end());
    std::string summary;
    const std::vector<std::string> first = next_step(program, killed, args, corpus, root / "next", summary);
    for (const std::string& problem : first) fail("resumed on " + again, problem);
    if (first.empty()) {
        std::cout << "ok: the checkpoint of step " << step << " resumed on " << again
                  << ": its first step is one process's from the checkpoint: " << summary << "\n";
    }
    args.insert(args.end(), {"--max-iters", "80"});  // the checkpoint of one step more says 21
    const Outcome resumed = run(program, args, root / "resumed_log");
    if (resumed.status != 0) {
        fail("resuming on " + again, resumed.err);
        return 1;
    }
    const Results a = results_of(killed);
    const EvalRecord end = [&] {
        Trainer one = Trainer::load(killed / "checkpoint", make_dataset(read_text(corpus)));
        return one.evaluate();
    }();
    std::vector<std::string> problems;
    for (long long t = step; t < 80; ++t) {
        const auto it = a.steps.find(t);
        if (it == a.steps.end() || !std::isfinite(it->second[0]) || !std::isfinite(it->second[1])) {
            problems.push_back("step " + std::to_string(t) + " missing or not finite");
        }
    }
    for (long long t = step; t <= 80; t += 10) {
        if (!a.evals.count(t)) problems.push_back("no evaluation at step " + std::to_string(t));
    }
    if (a.checkpoint_step != 80) problems.push_back("the checkpoint at step " + std::to_string(a.checkpoint_step));
    // One pass: an evaluation to 2γ of its chain of sums (step_bounds.hpp).
    const double bound = 2 * mpi_test::gamma_of(mpi_test::sum_chains(a.config, a.vocab).forward +
                                                 double(a.config.eval_iters)) + mpi_test::unit_roundoff;
    if (a.evals.count(80)) {
        const std::vector<double>& e = a.evals.at(80);
        for (const std::string& p : {gap_problem("the last evaluation's train loss, against one process's from the run's "
                                                  "checkpoint", 80, e[0], end.train_loss, bound),
                                     gap_problem("the last evaluation's val loss, against one process's from the run's "
                                                 "checkpoint", 80, e[1], end.val_loss, bound)}) {
            if (!p.empty()) problems.push_back(p);
        }
    }
    for (const std::string& problem : problems) fail("resumed on " + again, problem);
    if (problems.empty()) {
        std::cout << "resumed at step " << step << " on " << again << ": every step to 80 and every evaluation "
                  << "logged, the last one process's from the run's checkpoint\n";
    }
    return failures ? 1 : 0;
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Stopping a job: a signal to the launcher, two signals, the launcher killed.

// Whether process `p` still runs (a zombie has ended).
bool still_running(pid_t p) {
    if (kill(p, 0) != 0 || !fs::exists("/proc/" + std::to_string(p))) return false;
    std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
    std::string line;
    std::getline(stat, line);
    return line.find(") Z") == std::string::npos;
}

// The steps metrics.jsonl records so far.
long long logged_steps(const fs::path& run) {
    std::ifstream in(run / "metrics.jsonl");
    long long n = 0;
    for (std::string line; std::getline(in, line);) n += line.find("\"loss\"") != std::string::npos ? 1 : 0;
    return n;
}

int test_stop(const std::string& program, const fs::path& root) {
    const fs::path corpus = root / "corpus.txt";
    write_corpus(corpus);
    const std::vector<std::string> base = {"--recipe", "tiny", "--max-iters", "100000", "--eval-interval", "100000",
                                           "--eval-iters", "1", "--sample", "0", "--threads", "1",
                                           "--ranks", "2", "--data", corpus.string()};
    // Starts a job in `run` and waits until it has logged 5 steps; returns the launcher, its
    // mpirun and the ranks.
    struct Job {
        pid_t launcher = -1, mpirun = -1;
        std::vector<pid_t> ranks;
    };
    const auto start_job = [&](const fs::path& run, const fs::path& log) {
        std::vector<std::string> args = base;
        args.insert(args.end(), {"--out", run.string()});
        Job j;
        j.launcher = start(program, args, log);
        for (int waited = 0; waited < 6000 && logged_steps(run) < 5; ++waited) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        const std::vector<pid_t> m = children_of(j.launcher);
        if (!m.empty()) {
            j.mpirun = m[0];
            j.ranks = children_of(m[0]);
        }
        return j;
    };
    const auto all_gone = [](const std::vector<pid_t>& ps, double seconds) {
        for (int waited = 0; waited < seconds * 100; ++waited) {
            if (std::none_of(ps.begin(), ps.end(), still_running)) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return std::none_of(ps.begin(), ps.end(), still_running);
    };

    // 1. SIGTERM to the launcher: every rank ends its step, a checkpoint, one line, exit 0.
    const fs::path stopped = root / "stopped";
    Job j = start_job(stopped, root / "stopped_log");
    if (logged_steps(stopped) < 5 || j.ranks.size() != 2) {
        kill(j.launcher, SIGKILL);
        finish(j.launcher, root / "stopped_log");
        fail("the run to stop", "fewer than 5 steps logged, or not 2 ranks");
        return 1;
    }
    kill(j.launcher, SIGTERM);
    Outcome o = finish(j.launcher, root / "stopped_log", 60.0);
    const long long step = checkpoint_step(stopped);
    const std::vector<std::string> said = message_lines(o.err);
    if (o.status != 0 || step < 5 || o.out.find("stopped at step " + std::to_string(step) + ":") == std::string::npos ||
        said.size() != 1 || said[0].rfind("train_gpt: stopping", 0) != 0) {
        fail("SIGTERM to the launcher", "expected exit 0, 'stopped at step N' with the checkpoint's step (" +
             std::to_string(step) + ") and one line, got exit " + std::to_string(o.status) + ": " +
             o.err.substr(0, 600) + " / " + o.out.substr(o.out.size() > 300 ? o.out.size() - 300 : 0));
    } else {
        std::cout << "ok: SIGTERM to the launcher: exit 0 after " << o.seconds << " s, " << said[0]
                  << "; checkpoint at step " << step << "\n";
    }
    if (!all_gone(j.ranks, 10)) fail("SIGTERM to the launcher", "a rank still runs 10 s after the job ended");
    // It goes on from there.
    std::vector<std::string> args = {"--resume", stopped.string(), "--max-iters", std::to_string(step + 3),
                                     "--ranks", "2", "--threads", "1", "--sample", "0", "--data", corpus.string()};
    o = run(program, args, root / "resumed_log");
    if (o.status != 0 || checkpoint_step(stopped) != step + 3) {
        fail("the stopped run resumed", "exit " + std::to_string(o.status) + ", checkpoint at step " +
             std::to_string(checkpoint_step(stopped)) + ": " + o.err.substr(0, 400));
    } else {
        std::cout << "ok: the stopped run resumes at step " << step << " and ends at " << step + 3 << "\n";
    }

    // 2. Two signals: the second ends the job at once, every process with it.
    const fs::path twice = root / "twice";
    j = start_job(twice, root / "twice_log");
    kill(j.launcher, SIGINT);
    kill(j.launcher, SIGINT);
    o = finish(j.launcher, root / "twice_log", 60.0);
    std::vector<pid_t> everyone = j.ranks;
    if (j.mpirun > 0) everyone.push_back(j.mpirun);
    if (o.seconds > 30 || !all_gone(everyone, 10)) {
        fail("two Ctrl-Cs", "the job took " + std::to_string(o.seconds) + " s to end, or left a process running");
    } else {
        std::cout << "ok: two Ctrl-Cs end the job in " << o.seconds << " s (exit " << o.status << ")\n";
    }

    // 3. The launcher killed (SIGKILL, which it cannot catch): mpirun and the ranks go too.
    const fs::path orphaned = root / "orphaned";
    j = start_job(orphaned, root / "orphaned_log");
    everyone = j.ranks;
    if (j.mpirun > 0) everyone.push_back(j.mpirun);
    kill(j.launcher, SIGKILL);
    finish(j.launcher, root / "orphaned_log", 10.0);
    if (everyone.size() != 3 || !all_gone(everyone, 15)) {
        fail("the launcher killed", "mpirun or a rank still runs 15 s later (" + std::to_string(everyone.size()) +
             " processes watched)");
        for (pid_t p : everyone) kill(p, SIGKILL);
    } else {
        std::cout << "ok: the launcher killed: mpirun and both ranks ended with it\n";
    }
    return failures ? 1 : 0;
}

// ---------------------------------------------------------------------------------------
// A rank that fails, or freezes, mid-run: one line, the checkpoint to resume from.

namespace {

// The problem with a failed job's one line about `run`: it must name the checkpoint the run
// left (the step its trainer.json says) and how to go on from it, or say that none was written.
std::string resume_hint_problem(const std::string& line, const fs::path& run) {
    const long long step = checkpoint_step(run);
    const std::string expected = step >= 0 ? "(step " + std::to_string(step) + "), is intact: go on with --resume " + run.string()
                                           : "no checkpoint had been written in " + (run / "checkpoint").string();
    return line.find(expected) == std::string::npos ? "does not say '" + expected + "'" : "";
}

// Which rank a rank process is (Open MPI's OMPI_COMM_WORLD_RANK in its environment), or −1.
int rank_of(pid_t p) {
    std::ifstream in("/proc/" + std::to_string(p) + "/environ", std::ios::binary);
    const std::string key = "OMPI_COMM_WORLD_RANK=";
    for (std::string var; std::getline(in, var, '\0');) {
        if (var.rfind(key, 0) == 0) return std::atoi(var.c_str() + key.size());
    }
    return -1;
}

// Whether process p still runs (a zombie has ended).
bool process_runs(pid_t p) {
    if (kill(p, 0) != 0 || !fs::exists("/proc/" + std::to_string(p))) return false;
    std::ifstream stat("/proc/" + std::to_string(p) + "/stat");
    std::string line;
    std::getline(stat, line);
    return line.find(") Z") == std::string::npos;
}

// How many ranks a drawn case has: 2, 3 or 4, an even number with tensor parallelism.
int drawn_ranks(Rng& rng, const std::vector<std::string>& scheme) {
    const bool paired = !scheme.empty() && scheme[0] == "--tensor-parallel";
    return paired ? 2 * (1 + static_cast<int>(rng.below(2))) : 2 + static_cast<int>(rng.below(3));
}

int test_faults(const std::string& program, const fs::path& root) {
    const fs::path corpus = root / "corpus.txt";
    write_corpus(corpus);
    const std::vector<std::string> base = {"--recipe", "tiny", "--max-iters", "12", "--eval-interval", "3",
                                           "--eval-iters", "1", "--sample", "0", "--threads", "1",
                                           "--data", corpus.string()};
    // Each place, the schemes that reach it, and how many calls of it a rank makes at least in
    // the 12 steps (the tiny recipe's 2 blocks: 3 gradient buckets a backward pass, 3 weight
    // gathers a pass of stage 3, a hook call per block in plain data parallelism): the
    // failing call is drawn from them.
    struct Place {
        std::string where;
        std::vector<std::vector<std::string>> schemes;
        int calls;
    };
    const std::vector<Place> places = {
        {"step", {{}, {"--shard", "optimizer"}, {"--shard", "parameters"}, {"--tensor-parallel", "2"}}, 12},
        {"take", {{"--shard", "gradients"}, {"--shard", "parameters"}}, 36},
        {"gather", {{"--shard", "parameters"}}, 72},
        {"bucket", {{}}, 24},
    };
    Rng rng(21);
    for (int k = 0; k < 12; ++k) {
        // Every place in turn, the rest drawn.
        const Place& place = places[static_cast<std::size_t>(k) % places.size()];
        const std::vector<std::string>& scheme = place.schemes[rng.below(place.schemes.size())];
        const int ranks = drawn_ranks(rng, scheme);
        const int rank = static_cast<int>(rng.below(static_cast<std::uint64_t>(ranks)));
        const int call = 1 + static_cast<int>(rng.below(static_cast<std::uint64_t>(place.calls)));
        const std::string fault = place.where + ":" + std::to_string(rank) + ":" + std::to_string(call);
        std::string what = "ATTN_FAULT=" + fault + ", --ranks " + std::to_string(ranks);
        for (const std::string& a : scheme) what += " " + a;
        const fs::path run = root / ("run" + std::to_string(k)), log = root / ("log" + std::to_string(k));
        std::vector<std::string> args = base;
        args.insert(args.end(), {"--ranks", std::to_string(ranks), "--out", run.string()});
        args.insert(args.end(), scheme.begin(), scheme.end());
        setenv("ATTN_FAULT", fault.c_str(), 1);  // the launcher passes its environment on to the ranks
        const Outcome o = finish(start(program, args, log), log, 120.0);  // a hang is killed at 120 s
        unsetenv("ATTN_FAULT");
        const std::vector<std::string> lines = message_lines(o.err);
        const std::string expected = "train_gpt: error: rank " + std::to_string(rank) + ": injected fault at " +
                                     place.where + ", call " + std::to_string(call) + " (ATTN_FAULT)";
        if (o.status != 1 || lines.size() != 1 || lines[0].rfind(expected, 0) != 0) {
            fail(what, "expected exit status 1 and one line '" + expected + "; …', got exit " + std::to_string(o.status) +
                           " after " + std::to_string(static_cast<int>(o.seconds)) + " s and " +
                           std::to_string(lines.size()) + " lines: " + o.err.substr(0, 800));
        } else if (const std::string problem = resume_hint_problem(lines[0], run); !problem.empty()) {
            fail(what, "its line " + problem + ": " + lines[0]);
        } else {
            std::cout << "ok: " << what << ": " << lines[0] << "\n";
        }
    }
    return failures ? 1 : 0;
}

int test_freeze(const std::string& program, const fs::path& root) {
    const fs::path corpus = root / "corpus.txt";
    write_corpus(corpus);
    const double timeout = 5.0;  // --collective-timeout below
    const std::vector<std::string> base = {"--recipe", "tiny", "--max-iters", "100000", "--eval-interval", "40",
                                           "--eval-iters", "1", "--sample", "0", "--threads", "1",
                                           "--collective-timeout", "5", "--data", corpus.string()};
    const std::vector<std::vector<std::string>> schemes = {{}, {"--shard", "gradients"}, {"--shard", "parameters"},
                                                           {"--tensor-parallel", "2"}};
    Rng rng(9);
    for (int k = 0; k < 3; ++k) {
        const std::vector<std::string>& scheme = schemes[rng.below(schemes.size())];
        const int ranks = drawn_ranks(rng, scheme);
        const int frozen = static_cast<int>(rng.below(static_cast<std::uint64_t>(ranks)));
        std::string what = "rank " + std::to_string(frozen) + " of --ranks " + std::to_string(ranks);
        for (const std::string& a : scheme) what += " " + a;
        what += " frozen";
        const fs::path run = root / ("run" + std::to_string(k)), log = root / ("log" + std::to_string(k));
        std::vector<std::string> args = base;
        args.insert(args.end(), {"--ranks", std::to_string(ranks), "--out", run.string()});
        args.insert(args.end(), scheme.begin(), scheme.end());
        const pid_t launcher = start(program, args, log);
        for (int waited = 0; waited < 6000 && logged_steps(run) < 50; ++waited) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        // The launcher's child is mpirun, whose children are the ranks.
        const std::vector<pid_t> mpirun = children_of(launcher);
        const std::vector<pid_t> processes = mpirun.empty() ? std::vector<pid_t>{} : children_of(mpirun[0]);
        pid_t victim = -1;
        for (pid_t p : processes) {
            if (rank_of(p) == frozen) victim = p;
        }
        if (logged_steps(run) < 50 || victim < 0) {
            kill(launcher, SIGKILL);
            finish(launcher, log);
            fail(what, "the run logged no 50 steps, or rank " + std::to_string(frozen) + "'s process was not found");
            continue;
        }
        kill(victim, SIGSTOP);
        const Outcome o = finish(launcher, log, 120.0);  // timed from the SIGSTOP; a hang is killed at 120 s
        const std::vector<std::string> lines = message_lines(o.err);
        const std::string expected = "rank " + std::to_string(frozen) + " of " + std::to_string(ranks) + " did not arrive";
        // The watchdog's bound and 10 s for the job to end: a guard against a hang, not a
        // timing (the watchdog itself decides after its timeout of no progress).
        if (o.status != 1 || lines.size() != 1 || lines[0].find(expected) == std::string::npos ||
            lines[0].find("--collective-timeout 5") == std::string::npos || o.seconds > timeout + 10) {
            fail(what, "expected exit status 1 within " + std::to_string(static_cast<int>(timeout + 10)) +
                           " s and one line saying '" + expected + "', got exit " + std::to_string(o.status) +
                           mpi_test::format(" after %.1f s: ", o.seconds) + o.err.substr(0, 800));
        } else if (const std::string problem = resume_hint_problem(lines[0], run); !problem.empty()) {
            fail(what, "its line " + problem + ": " + lines[0]);
        } else {
            std::cout << "ok: " << what << mpi_test::format(": the job ended %.1f s later: ", o.seconds) << lines[0] << "\n";
        }
        // No process is left: mpirun ended every rank, the frozen one too (10 s to be gone).
        for (pid_t p : processes) {
            for (int waited = 0; waited < 1000 && process_runs(p); ++waited) {
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            }
            if (process_runs(p)) {
                fail(what, "rank process " + std::to_string(p) + " still runs 10 s after the job ended");
                kill(p, SIGKILL);
            }
        }
    }
    return failures ? 1 : 0;
}


// Sharded checkpoints.

// The bytes of every file under `dir`, by relative path.
std::map<std::string, std::string> files_of(const fs::path& dir) {
    std::map<std::string, std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(dir)) {
        if (e.is_regular_file()) files[e.path().lexically_relative(dir).generic_string()] = read_text(e.path());
    }
    return files;
}

// Bitwise equality of two float vectors (NaN never equal: a parameter no file held).
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(a[i]) || std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
    }
    return true;
}

int test_sharded(const std::string& program, const fs::path& root) {
    const fs::path corpus = root / "corpus.txt";
    write_corpus(corpus);
    const TextDataset data = make_dataset(read_text(corpus));
    const std::vector<std::string> base = {"--recipe", "tiny", "--max-iters", "3", "--eval-interval", "3",
                                           "--eval-iters", "1", "--sample", "0", "--threads", "1",
                                           "--data", corpus.string()};
    // The layouts: saved by each ZeRO stage, on 2, 3 and 4 ranks in a drawn order; resumed on
    // three layouts each, drawn without repeats from every other one (one process, plain data
    // parallelism, the three stages on 2 to 4 ranks, tensor parallelism).
    std::mt19937 draw(20261128);
    const std::vector<std::string> stages = {"optimizer", "gradients", "parameters"};
    std::vector<std::string> saving_ranks = {"2", "3", "4"};  // one each, in a drawn order
    std::shuffle(saving_ranks.begin(), saving_ranks.end(), draw);
    std::vector<std::vector<std::string>> layouts = {{}, {"--ranks", "2"}, {"--ranks", "3"},
                                                     {"--ranks", "2", "--tensor-parallel", "2"},
                                                     {"--ranks", "4", "--tensor-parallel", "2"}};
    for (const std::string& s : stages) {
        for (const char* n : {"2", "3", "4"}) layouts.push_back({"--ranks", n, "--shard", s});
    }
    auto name_of = [](const std::vector<std::string>& flags) {
        std::string name;
        for (const std::string& f : flags) name += (name.empty() ? "" : " ") + f;
        return name.empty() ? std::string("one process") : name;
    };
    std::shuffle(layouts.begin(), layouts.end(), draw);  // taken in turn: no layout twice
    std::size_t next_layout = 0;
    int pairs = 0;
    for (const std::string& stage : stages) {
        const std::string ranks = saving_ranks[static_cast<std::size_t>(&stage - stages.data())];
        const std::vector<std::string> saved_as = {"--ranks", ranks, "--shard", stage};
        const fs::path run_dir = root / ("saved-" + stage);
        std::vector<std::string> args = base;
        args.insert(args.end(), {"--out", run_dir.string()});
        args.insert(args.end(), saved_as.begin(), saved_as.end());
        const Outcome o = run(program, args, root / ("saved-" + stage + "-log"));
        if (o.status != 0 || !fs::exists(run_dir / "checkpoint" / "shards.json")) {
            fail(name_of(saved_as), "no sharded checkpoint (exit " + std::to_string(o.status) + "): " + o.err.substr(0, 300));
            continue;
        }
        // Its layout: one file per rank, and the runs of the flat buffer every parameter in one.
        const Flat flat = flat_of_shards(run_dir / "checkpoint");
        {
            std::ifstream in(run_dir / "checkpoint" / "shards.json");
            const json layout = json::parse(in);
            if (std::to_string(layout.at("ranks").get<int>()) != ranks ||
                layout.at("files").size() != static_cast<std::size_t>(std::stoi(ranks))) {
                fail(name_of(saved_as), "shards.json names " + layout.at("ranks").dump() + " ranks");
            }
        }
        // The library reads what the bytes say: one process's load of it holds those weights.
        Trainer one = Trainer::load(run_dir / "checkpoint", data);
        if (!same_bits(flat.weights, one.model().parameters()) || !same_bits(flat.m, one.optimizer().m) ||
            !same_bits(flat.v, one.optimizer().v)) {
            fail(name_of(saved_as), "one process's load differs from the weights and moments its files hold");
        }
        // Consolidated, it is byte for byte what one process writes of the same state, and every
        // tensor and moment is the files' own.
        const fs::path whole = root / ("consolidated-" + stage), reference = root / ("one-" + stage);
        const Outcome c = run(program, {"--consolidate", run_dir.string(), whole.string()}, root / ("consolidate-" + stage));
        one.save(reference);
        if (c.status != 0) {
            fail("--consolidate of " + name_of(saved_as), "exit " + std::to_string(c.status) + ": " + c.err);
        } else {
            const auto got = files_of(whole), expected = files_of(reference);
            std::vector<std::string> differ;
            for (const auto& [name, bytes] : expected) {
                if (!got.count(name) || got.at(name) != bytes) differ.push_back(name);
            }
            if (got.size() != expected.size() || !differ.empty()) {
                fail("--consolidate of " + name_of(saved_as), std::to_string(differ.size()) + " of " +
                     std::to_string(expected.size()) + " files differ from one process's checkpoint (" +
                     (differ.empty() ? "another file count" : differ[0]) + ")");
            }
            GPT model = load_checkpoint(whole);
            const bool weights = same_bits(flat.weights, model.parameters());
            if (!weights || !same_bits(flat.m, read_npy(whole / "optimizer" / "m.npy").data) ||
                !same_bits(flat.v, read_npy(whole / "optimizer" / "v.npy").data)) {
                fail("--consolidate of " + name_of(saved_as), "its tensors are not those of the ranks' files");
            } else if (differ.empty()) {
                std::cout << "ok: " << name_of(saved_as) << ": the sharded checkpoint consolidated is one process's, "
                          << expected.size() << " files byte for byte\n";
            }
        }
        // Resumed on other layouts: the first step is one process's step from the checkpoint.
        for (int k = 0; k < 3; ++k) {
            std::vector<std::string> as = layouts[next_layout++ % layouts.size()];
            if (as == saved_as) as = layouts[next_layout++ % layouts.size()];
            std::vector<std::string> resume = {"--resume", run_dir.string(), "--sample", "0", "--threads", "1",
                                               "--data", corpus.string()};
            resume.insert(resume.end(), as.begin(), as.end());
            std::string summary;
            const fs::path copy = root / ("resumed-" + stage + "-" + std::to_string(k));
            fs::remove_all(copy);
            fs::copy(run_dir, copy, fs::copy_options::recursive);
            resume[1] = copy.string();
            const std::vector<std::string> problems = next_step(program, copy, resume, corpus, copy.string() + "-next", summary);
            ++pairs;
            for (const std::string& p : problems) fail(name_of(saved_as) + " resumed as " + name_of(as), p);
            if (problems.empty()) {
                std::cout << "ok: saved by " << name_of(saved_as) << ", resumed as " << name_of(as)
                          << ": its step is one process's from the checkpoint: " << summary << "\n";
            }
        }
    }
    // Every kind of file, one byte changed at a drawn place: refused in one line naming it.
    const fs::path sharded = root / "saved-parameters", single = root / "single";
    {
        std::vector<std::string> args = base;
        args.insert(args.end(), {"--out", single.string()});
        const Outcome o = run(program, args, root / "single-log");
        if (o.status != 0) fail("one process's run", o.err);
    }
    struct Damage {
        fs::path run;
        std::string file;
        std::vector<std::string> flags;
    };
    const std::vector<std::string> two = {"--ranks", "2", "--shard", "parameters"};
    const std::vector<Damage> damages = {{sharded, "shard-00001.bin", two}, {sharded, "shards.json", two},
                                         {sharded, "trainer.json", two},    {sharded, "config.json", {}},
                                         {sharded, "checksums.json", {}},   {single, "transformer.h.0.mlp.c_fc.weight.npy", {}},
                                         {single, "lm_head.weight.npy", {}}, {single, "optimizer/m.npy", {}},
                                         {single, "optimizer/v.npy", two},  {single, "trainer.json", {}},
                                         {single, "config.json", {}},       {single, "checksums.json", {}}};
    int refused = 0;
    for (std::size_t i = 0; i < damages.size(); ++i) {
        const Damage& d = damages[i];
        const fs::path copy = root / ("damaged-" + std::to_string(i)), dir = copy / "checkpoint";
        const fs::path source = d.run / "checkpoint" / d.file;
        if (!fs::exists(source) || fs::file_size(source) == 0) {
            fail(d.file, "no such file to damage: " + source.string());
            continue;
        }
        fs::remove_all(copy);
        fs::create_directories(copy);
        fs::copy(d.run / "checkpoint", dir, fs::copy_options::recursive);
        fs::copy(d.run / "metrics.jsonl", copy / "metrics.jsonl");
        std::string bytes = read_text(dir / d.file);
        const std::size_t at = draw() % bytes.size();
        bytes[at] = static_cast<char>(bytes[at] ^ (1 << (draw() % 8)));
        std::ofstream(dir / d.file, std::ios::binary | std::ios::trunc) << bytes;
        std::vector<std::string> args = {"--resume", copy.string(), "--max-iters", "5", "--sample", "0",
                                         "--threads", "1", "--data", corpus.string()};
        args.insert(args.end(), d.flags.begin(), d.flags.end());
        const Outcome o = run(program, args, root / ("damaged-" + std::to_string(i) + "-log"));
        const std::vector<std::string> lines = message_lines(o.err);
        const std::string where = d.file + " with byte " + std::to_string(at) + " changed (" + name_of(d.flags) + ")";
        if (o.status == 0 || lines.size() != 1 || lines[0].find(fs::path(d.file).filename().string()) == std::string::npos) {
            fail(where, "expected a non-zero exit and one line naming the file, got exit " + std::to_string(o.status) +
                            " and: " + o.err.substr(0, 400));
        } else {
            ++refused;
        }
    }
    // --consolidate's bad uses: one line each, a non-zero exit, nothing written.
    const std::vector<std::vector<std::string>> bad = {
        {"--consolidate", single.string(), (root / "c1").string()},              // already one process's
        {"--consolidate", (root / "nothing").string(), (root / "c2").string()},  // no such folder
        {"--consolidate", sharded.string(), (root / "c3").string(), "--max-iters", "3"},  // another option
        {"--consolidate", sharded.string()}};                                    // no OUT
    for (std::size_t i = 0; i < bad.size(); ++i) {
        const Outcome o = run(program, bad[i], root / ("bad-consolidate-" + std::to_string(i)));
        if (o.status == 0 || message_lines(o.err).size() != 1 || fs::exists(root / ("c" + std::to_string(i + 1)))) {
            fail("--consolidate, bad use " + std::to_string(i), "expected one line and a non-zero exit, got exit " +
                                                                    std::to_string(o.status) + " and: " + o.err);
        }
    }
    std::cout << pairs << " saved and resumed layouts; " << refused << " of " << damages.size()
              << " damaged files refused in one line naming the file\n";
    return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
    if (argc >= 5 && std::string(argv[1]) == "compare") {
        // Two run folders, the second the reference, their corpus and the flags they were run
        // with (tests/mpi/multihost_netns.sh).
        for (const std::string& problem : compare(argv[2], argv[3], argv[4], flags_of({argv + 5, argv + argc}))) {
            fail(argv[2], problem);
        }
        std::cout << (failures ? "FAILED" : "the same run") << ": " << argv[2] << " against " << argv[3] << "\n";
        return failures ? 1 : 0;
    }
    if (argc != 4 && argc != 5) {
        std::cerr << "usage: train_gpt_ranks_test TRAIN_GPT WORK_DIR options|refusals|kill|kill-sharded|kill-sharded-gradients|kill-sharded-parameters|kill-tensor-parallel|stop|faults|freeze|sharded [MPIRUN]\n"
                     "       train_gpt_ranks_test compare RUN REFERENCE_RUN CORPUS [TRAIN_GPT_FLAGS...]\n";
        return 2;
    }
    const std::string program = fs::absolute(argv[1]).string(), part = argv[3];
    const fs::path root = fs::absolute(argv[2]) / part;
    fs::remove_all(root);
    fs::create_directories(root);
    int status = 2;
    if (part == "options") status = test_options(program, root);
    else if (part == "refusals") status = test_refusals(program, root, argc == 5 ? argv[4] : "mpirun");
    else if (part == "kill") status = test_kill(program, root, {}, "2");
    else if (part == "kill-sharded") status = test_kill(program, root, {"--shard", "optimizer"}, "3");
    else if (part == "kill-sharded-gradients") status = test_kill(program, root, {"--shard", "gradients"}, "3");
    else if (part == "kill-sharded-parameters") status = test_kill(program, root, {"--shard", "parameters"}, "3");
    else if (part == "kill-tensor-parallel") status = test_kill(program, root, {"--tensor-parallel", "2"}, "2");
    else if (part == "stop") status = test_stop(program, root);
    else if (part == "faults") status = test_faults(program, root);
    else if (part == "freeze") status = test_freeze(program, root);
    else if (part == "sharded") status = test_sharded(program, root);
    else std::cerr << "unknown part '" << part << "'\n";
    std::cout << (status == 0 ? "passed" : "FAILED") << " (" << failures << " failures)\n";
    return status;
}
