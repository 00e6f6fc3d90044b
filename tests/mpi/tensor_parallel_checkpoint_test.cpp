// Tensor parallelism's checkpoints on N ranks: sharded, resumed on any other layout, and never
// the whole model on a rank.
//
// Resumes across schemes. The schemes a job of N ranks can run are generated: one process (on
// every rank alone), plain data parallelism and ZeRO stages 1, 2 and 3 on the N ranks, and
// tensor parallelism of every width t that divides N (groups of t ranks splitting every block,
// N / t copies sharing each batch), each rank set up as train_gpt sets it up (a tensor-parallel
// or stage 3 rank from a model made without whole weights, reading only its runs). Each scheme
// takes 4 steps and saves; then for every pair (saver, resumer) with tensor parallelism on
// either side and the two different, the resumer loads the saver's checkpoint and takes 2
// steps, each compared with one process's step from the checkpoint before it (training.hpp's
// bounds: loss, gradient norm, AdamW's moments, weights, step counts), the first from the
// saver's own checkpoint: the checkpoint held the whole state, and the resumer read its part.
//
// Memory. For drawn widths t and a model whose tensors are small beside a rank's state, a
// tensor-parallel rank's peak of bytes live through `new` (attn/live_bytes.hpp, exact) above
// what it held before is bounded at each phase by what it keeps plus one largest tensor:
//   - the start from the seed and from a weights folder (train_gpt --init: only its runs read),
//     and the resume from a checkpoint (Trainer::load and the device's adopt, as train_gpt
//     --resume does them): at most its state once started, 4 bytes a parameter it holds for
//     the weights, 4 for the gradients and 8 for AdamW's moments after a step (16 in all; 8
//     before any step), plus one largest tensor (a tensor read is one buffer beside the
//     slices) and the bookkeeping below;
//   - the save: at most one largest tensor and the bookkeeping above what it held just before
//     (the slices and moments are written where they lie).
// The bookkeeping: 64 KiB (the parameter tables' names, the corpus' sample of a batch), and
// per run of the flat buffer that the checkpoint lists, over every rank's files, 512 bytes: a
// rank's lists of its runs (an offset and a size, 16 bytes, in at most 4 lists while it starts)
// and shards.json's JSON of a run (a two-number array of nlohmann values, 16 bytes each, in a
// vector of its own; each rank's list parsed and copied once into the layout; the text, about
// 40 characters a run indented, doubled by a string's growth) stay below it. The bound is
// checked to lie below the whole model's weights (4 bytes a parameter): a rank that gathered or
// built the whole model at any phase would exceed it.
//
// Run as `mpirun -np N tensor_parallel_checkpoint_test` (CTest: N = 1, 2, 3, 4).
#include "mpi_test.hpp"
#include "training.hpp"

#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/live_bytes.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"
#include "attn/mpi/data_parallel.hpp"
#include "attn/mpi/tensor_parallel.hpp"
#include "attn/mpi/world.hpp"
#include "attn/mpi/zero.hpp"
#include "attn/trainer.hpp"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace attn;
using namespace mpi_test;
namespace fs = std::filesystem;

namespace {

constexpr std::size_t bookkeeping = 64 * 1024;  // see the top
constexpr std::size_t per_run = 512;           // see the top

// A scheme a job of N ranks runs: "one", "plain", "stage s" or tensor parallelism of width t.
struct Scheme {
    std::string kind;  // one, plain, zero, tp
    int stage = 0;     // zero: 1 to 3
    int width = 0;     // tp: t
    std::string name() const {
        if (kind == "zero") return "stage " + std::to_string(stage);
        if (kind == "tp") return "tensor parallel " + std::to_string(width);
        return kind == "one" ? "one process" : "plain";
    }
};

// Every width's communicators, made once: ranks r / t split every block, ranks r % t share the batch.
struct Splits {
    std::map<int, std::pair<MPI_Comm, MPI_Comm>> comms;
    std::pair<MPI_Comm, MPI_Comm> of(int t) {
        auto it = comms.find(t);
        if (it != comms.end()) return it->second;
        int r = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        MPI_Comm tensor = MPI_COMM_NULL, data = MPI_COMM_NULL;
        MPI_Comm_split(MPI_COMM_WORLD, r / t, r, &tensor);
        MPI_Comm_split(MPI_COMM_WORLD, r % t, r, &data);
        return comms[t] = {tensor, data};
    }
    ~Splits() {
        for (auto& [t, c] : comms) {
            MPI_Comm_free(&c.first);
            MPI_Comm_free(&c.second);
        }
    }
};

std::shared_ptr<DataParallelGroup> group_of(int stage) {
    if (stage == 1) return std::make_shared<mpi::ShardedOptimizer>();
    if (stage == 2) return std::make_shared<mpi::ShardedGradients>();
    if (stage == 3) return std::make_shared<mpi::ShardedParameters>();
    return std::make_shared<mpi::DataParallel>();
}

// What a rank of the scheme keeps whole, and the runs it reads, as train_gpt sets it up.
GPTBuffers buffers_of(const Scheme& s) {
    GPTBuffers b;
    if (s.kind == "zero") {
        b.gradients = s.stage == 1;
        b.weights = s.stage < 3;
    } else if (s.kind == "tp") {
        b.gradients = b.weights = false;
    }
    return b;
}
std::function<std::vector<AdamW::Segment>(const GPT&)> kept_of(const Scheme& s, int rank, int ranks) {
    if (s.kind == "zero") return [s, rank, ranks](const GPT& m) { return mpi::kept_segments(m, s.stage, rank, ranks); };
    if (s.kind == "tp") {
        return [t = s.width, rank](const GPT& m) { return mpi::TensorParallelGPT::runs_of(m, rank % t, t); };
    }
    return {};
}

// Joins the scheme's group or device (every rank of the job calls it).
void join(Trainer& t, const Scheme& s, Splits& splits) {
    if (s.kind == "plain" || s.kind == "zero") t.use_group(group_of(s.kind == "zero" ? s.stage : 0));
    if (s.kind == "tp") {
        const auto [tensor, data] = splits.of(s.width);
        t.use_device(std::make_unique<mpi::TensorParallelDevice>(tensor, data));
    }
}

std::size_t largest(std::size_t mine) {
    unsigned long long value = mine, all = 0;
    MPI_Allreduce(&value, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    return static_cast<std::size_t>(all);
}

// The runs a checkpoint of width t lists, over every rank's file: each rank's split runs, and
// the whole tensors once.
std::size_t listed_runs(const GPT& model, int t) {
    std::size_t n = 0;
    for (int r = 0; r < t; ++r) n += mpi::TensorParallelGPT::runs_of(model, r, t).size();
    return n;
}

}  // namespace

int main(int argc, char** argv) {
    mpi::World world(argc, argv);
    set_num_threads(1);
    Checks checks;
    const int N = world.size(), r = world.rank();
    const TextDataset data = make_dataset(generated_text());
    const fs::path dir = job_folder("attn_tp_checkpoint_test");
    if (r == 0) fs::create_directories(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    Rng(1).advance(1);  // Rng::advance's table, made once in a process: before any peak
    Splits splits;

    // Resumes across schemes: 12 heads and 4C = 192 hidden units divide among 1 to 4 ranks,
    // and a batch of 12 among the copies.
    {
        TrainConfig config = tiny_recipe(12, 8, 0.0f);
        config.n_head = 12;
        config.n_embd = 48;
        config.block_size = 16;
        std::vector<Scheme> schemes = {{"one"}, {"plain"}, {"zero", 1}, {"zero", 2}, {"zero", 3}};
        for (int t = 1; t <= N; ++t) {
            if (N % t == 0) schemes.push_back({"tp", 0, t});
        }
        // A trainer of the scheme, fresh or from a checkpoint, in place (a group keeps pointers
        // into the model it joined: the trainer is not moved after).
        const auto make = [&](std::optional<Trainer>& t, const Scheme& s, const fs::path& from) {
            if (from.empty()) {
                t.emplace(config, data, buffers_of(s));
            } else {
                t.emplace(Trainer::load(from, data, kept_of(s, r, N), buffers_of(s)));
            }
            join(*t, s, splits);
        };
        const auto saved = [&](const Scheme& s) { return dir / ("saved by " + s.name()); };
        for (const Scheme& s : schemes) {
            if (s.kind == "one") {  // rank 0 alone writes one process's
                if (r == 0) {
                    std::optional<Trainer> alone;
                    make(alone, s, {});
                    take_steps(*alone, 4);
                    alone->save(saved(s));
                }
                MPI_Barrier(MPI_COMM_WORLD);
                continue;
            }
            std::optional<Trainer> t;
            make(t, s, {});
            take_steps(*t, 4);
            t->save(saved(s));
            if (s.kind == "tp") {
                checks.check(is_sharded_checkpoint(saved(s)),
                             std::to_string(N) + " ranks, " + s.name() + ": the checkpoint is sharded (shards.json)");
            }
        }
        int pairs = 0;
        for (const Scheme& from : schemes) {
            for (const Scheme& to : schemes) {
                if (from.name() == to.name() || (from.kind != "tp" && to.kind != "tp")) continue;
                ++pairs;
                // One process alone: on every rank, each its own run in a folder of its own.
                const fs::path own = dir / ("resumed_" + std::to_string(to.kind == "one" ? r : 0));
                std::optional<Trainer> resumed;
                make(resumed, to, saved(from));
                check_resumed(checks, compare_resumed(*resumed, 2, own, saved(from)),
                              std::to_string(N) + " ranks: the checkpoint of " + from.name() + " at step 4 resumed by " +
                                  to.name() + ": 2 steps, each one process's from the checkpoint before it");
            }
        }
        checks.note(std::to_string(pairs) + " pairs of schemes resumed on " + std::to_string(N) + " ranks");
    }

    // Memory: a model of 4 layers, 12 heads, C drawn among 144 and 192 (the seed is printed),
    // whose largest tensor (an MLP matrix, 4C x C) is small beside a rank's slices.
    const std::uint64_t draw_seed = 7;
    Rng draw(draw_seed);
    TrainConfig config = tiny_recipe(12, 8, 0.0f);
    config.n_layer = 4;
    config.n_head = 12;
    config.n_embd = 144 + 48 * static_cast<int>(draw.below(2));
    config.block_size = 16;
    config.bias = draw.below(2) == 1;
    config.seed = 1 + draw.below(1u << 30);
    const GPTConfig model_config = config.model_config(static_cast<int>(data.vocab.size()));
    const GPT table(model_config, config.seed, GPTBuffers{false, false});  // the parameter table alone
    const std::size_t P = model_config.num_parameters();
    std::size_t tensor = 0;
    for (const ParameterInfo& p : table.parameter_table()) tensor = std::max(tensor, p.size);
    checks.note("memory: models drawn with seed " + std::to_string(draw_seed) + ": C=" + std::to_string(config.n_embd) +
                (config.bias ? ", biases" : ", no biases") + ", " + std::to_string(P) + " parameters");
    const fs::path weights = dir / "weights";
    if (r == 0) save_checkpoint(weights, GPT(model_config, config.seed + 1));
    MPI_Barrier(MPI_COMM_WORLD);
    for (int t = 1; t <= N; ++t) {
        if (N % t != 0) continue;
        const Scheme s{"tp", 0, t};
        const std::string what = std::to_string(N) + " ranks, tensor parallel " + std::to_string(t);
        const std::size_t runs = listed_runs(table, t);
        const std::size_t mine = [&] {
            std::size_t n = 0;
            for (const AdamW::Segment& run : mpi::TensorParallelGPT::runs_of(table, r % t, t)) n += run.size;
            return n;
        }();
        const std::size_t extra = sizeof(float) * tensor + bookkeeping + per_run * runs;
        const auto bound_line = [&](std::size_t peak, std::size_t bound) {
            return format("largest over the ranks: peak %.0f bytes, bound %.0f, whole weights %.0f", double(largest(peak)),
                          double(largest(bound)), double(sizeof(float) * P));
        };
        checks.check(extra < 4 * P, what + ": the bounds leave less than the whole model's weights above a rank's "
                                           "state (a whole copy cannot fit under them)",
                     format("%.0f bytes against %.0f", double(extra), double(4 * P)));
        // The start from the seed, then 2 steps and the save.
        std::optional<Trainer> trainer;
        {
            TextDataset copy = data;
            MPI_Barrier(MPI_COMM_WORLD);
            const std::size_t before = live_bytes();
            reset_peak_bytes();
            trainer.emplace(config, std::move(copy), buffers_of(s));
            join(*trainer, s, splits);
            const std::size_t peak = peak_bytes() - before, bound = 8 * mine + extra;
            checks.check(peak <= bound, what + ": a rank's peak while it starts from the seed is at most its slices' "
                                               "weights and gradients, one tensor and the bookkeeping",
                         bound_line(peak, bound));
        }
        take_steps(*trainer, 2);
        const fs::path checkpoint = dir / ("tp" + std::to_string(t));
        {
            MPI_Barrier(MPI_COMM_WORLD);
            const std::size_t before = live_bytes();
            reset_peak_bytes();
            trainer->save(checkpoint);
            const std::size_t peak = peak_bytes() - before, bound = extra;
            checks.check(peak <= bound, what + ": a rank's peak while it saves is at most one tensor and the "
                                               "bookkeeping above what it holds",
                         bound_line(peak, bound));
        }
        trainer.reset();
        // The resume, as train_gpt --resume: only this rank's runs read.
        {
            TextDataset copy = data;
            MPI_Barrier(MPI_COMM_WORLD);
            const std::size_t before = live_bytes();
            reset_peak_bytes();
            trainer.emplace(Trainer::load(checkpoint, std::move(copy), kept_of(s, r, N), buffers_of(s)));
            join(*trainer, s, splits);
            const std::size_t peak = peak_bytes() - before, bound = 16 * mine + extra;
            checks.check(peak <= bound, what + ": a rank's peak while it resumes is at most its slices' weights, "
                                               "gradients and moments, one tensor and the bookkeeping",
                         bound_line(peak, bound));
        }
        trainer.reset();
        // The start from a weights folder, as train_gpt --init: only this rank's runs read.
        {
            TextDataset copy = data;
            MPI_Barrier(MPI_COMM_WORLD);
            const std::size_t before = live_bytes();
            reset_peak_bytes();
            trainer.emplace(config, std::move(copy), load_kept_weights(weights, model_config, buffers_of(s), kept_of(s, r, N)));
            join(*trainer, s, splits);
            const std::size_t peak = peak_bytes() - before, bound = 8 * mine + extra;
            checks.check(peak <= bound, what + ": a rank's peak while it starts from a weights folder is at most its "
                                               "slices' weights and gradients, one tensor and the bookkeeping",
                         bound_line(peak, bound));
            const std::vector<float> got = trainer->whole_parameters();
            const GPT want(model_config, config.seed + 1);
            checks.check(got == want.parameters(), what + ": started from a weights folder, the slices gathered are "
                                                          "its weights");
        }
        trainer.reset();
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 0) fs::remove_all(dir);
    return checks.finish();
}
