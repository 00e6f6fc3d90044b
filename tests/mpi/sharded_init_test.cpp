// A run's start on N ranks by shard: every scheme's ranks start from one process's weights,
// bit for bit, and a rank that keeps a shard of the weights never holds the whole of them on
// the way.
//
// For drawn models (layers, width, biases, seed) and every scheme on the N ranks of the job
// (plain data parallelism, ZeRO stages 1, 2 and 3, tensor parallelism), the ranks start from
// the seed, and their weights, gathered, are GPT(config, seed)'s in one process, bit for bit.
// Stage 3 and tensor parallelism start from a model made without whole weights (GPTBuffers):
// each rank computes its own ranges of the seed's random stream alone (GPT::initial_values,
// Rng::advance). Stage 3 starts from a weights folder too, as `train_gpt --init DIR --shard
// parameters` does (load_kept_weights: only the rank's runs are read), and its gathered
// weights are the folder's.
//
// At each such start the rank's peak of bytes live through `new` (attn/live_bytes.hpp, exact),
// above what it held before the start, is held to what it keeps afterwards plus one largest
// tensor: the bytes it holds as state once started (Trainer::memory_use: its weights,
// gradients and AdamW's moments; tensor parallelism: its slices' weights and gradients), plus
// the model's largest tensor (a tensor read from the folder is one buffer beside the shard),
// plus 64 KiB for the bookkeeping (the parameter table's names, the lists of runs of a ZeRO
// shard; a tensor-parallel rank's lists of runs, a run per row of a matrix split by
// columns, are counted apart; the group's ring buffer, at most 64 KiB, is in the state). A rank that built the whole model
// and cut its shard from it holds 4P bytes more than that at its peak.
//
// Run as `mpirun -np N sharded_init_test` (CTest: N = 1, 2, 3, 4).
#include "mpi_test.hpp"
#include "training.hpp"

#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/gpt.hpp"
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
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

using namespace attn;
using namespace mpi_test;
namespace fs = std::filesystem;

namespace {

// Bytes of bookkeeping a start may hold beside its state and one tensor (see the top).
constexpr std::size_t bookkeeping = 64 * 1024;

std::shared_ptr<mpi::DataParallel> group_of(int stage) {
    if (stage == 1) return std::make_shared<mpi::ShardedOptimizer>();
    if (stage == 2) return std::make_shared<mpi::ShardedGradients>();
    if (stage == 3) return std::make_shared<mpi::ShardedParameters>();
    return std::make_shared<mpi::DataParallel>();
}

// The largest over the ranks.
std::size_t largest(std::size_t mine) {
    unsigned long long value = mine, all = 0;
    MPI_Allreduce(&value, &all, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    return static_cast<std::size_t>(all);
}

// The floats of the model's largest tensor.
std::size_t largest_tensor(const GPT& model) {
    std::size_t n = 0;
    for (const ParameterInfo& p : model.parameter_table()) n = std::max(n, p.size);
    return n;
}

// The first index where two buffers differ, or "none" (with their sizes when those differ).
std::string first_difference(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return std::to_string(a.size()) + " floats against " + std::to_string(b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return "first at index " + std::to_string(i);
    }
    return "none";
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

int main(int argc, char** argv) {
    mpi::World world(argc, argv);
    set_num_threads(1);
    Checks checks;
    const int N = world.size(), r = world.rank();
    const TextDataset data = make_dataset(generated_text());
    const fs::path dir = job_folder("attn_sharded_init_test");
    // Rng::advance's table of the step's 64 matrix powers (64 x 256 x 32 bytes) is made once
    // in a process, at its first use: made here, before any start is measured.
    Rng(1).advance(1);

    // The models, drawn (the draw's seed is printed): 12 heads divide among 1 to 4 ranks, and
    // so do the MLP's 4C hidden units; 6 to 12 layers keep a block's buffers well below the
    // whole model, and the embeddings small beside the blocks.
    const std::uint64_t draw_seed = 21;
    Rng draw(draw_seed);
    checks.note("sharded starts on " + std::to_string(N) + " rank" + (N == 1 ? "" : "s") + ", models drawn with seed " +
                std::to_string(draw_seed));
    for (int model_index = 0; model_index < 3; ++model_index) {
        TrainConfig config = tiny_recipe(12, 4, 0.0f);
        config.n_layer = 6 + static_cast<int>(draw.below(7));
        config.n_head = 12;
        config.n_embd = 12 * (4 + 4 * static_cast<int>(draw.below(2)));  // 48 or 96
        config.block_size = 16;
        config.bias = draw.below(2) == 1;
        config.seed = 1 + draw.below(1u << 30);
        const GPTConfig model_config = config.model_config(static_cast<int>(data.vocab.size()));
        const GPT reference(model_config, config.seed);  // one process's start
        const std::vector<float>& want = reference.parameters();
        const std::size_t P = want.size(), tensor = largest_tensor(reference);
        const std::string model = "L=" + std::to_string(config.n_layer) + " C=" + std::to_string(config.n_embd) +
                                  (config.bias ? " biases" : " no biases") + ", seed " + std::to_string(config.seed) +
                                  " (" + std::to_string(P) + " parameters)";
        checks.note(model);

        // Plain data parallelism and ZeRO stages 1 to 3 from the seed, as train_gpt sets a rank up.
        for (int stage = 0; stage <= 3; ++stage) {
            const std::string scheme = stage == 0 ? "plain" : "stage " + std::to_string(stage);
            GPTBuffers buffers;
            buffers.gradients = stage < 2;
            buffers.weights = stage < 3;
            TextDataset copy = data;  // the trainer's own, made before the peak starts
            MPI_Barrier(MPI_COMM_WORLD);
            const std::size_t before = live_bytes();  // the reference model, the corpus, ...
            reset_peak_bytes();
            std::optional<Trainer> trainer;
            trainer.emplace(config, std::move(copy), buffers);
            trainer->use_group(group_of(stage));
            const std::size_t peak = peak_bytes() - before;
            const MemoryUse use = trainer->memory_use();
            const std::size_t state = use.weights + use.gradients + use.optimizer;
            const std::vector<float> got = trainer->whole_parameters();  // stage 3: gathered
            checks.check(same_bits(got, want), model + ", " + scheme + ": the ranks' weights, gathered, are one process's "
                                                                       "from the seed, bit for bit",
                         "differences: " + first_difference(got, want));
            if (stage == 3) {
                const std::size_t bound = state + sizeof(float) * tensor + bookkeeping;
                checks.check(peak <= bound, model + ", stage 3 from the seed: a rank's peak while it starts is at most "
                                                    "what it keeps, one tensor and the bookkeeping",
                             format("largest over the ranks: peak %.0f bytes, bound %.0f (whole weights %.0f)",
                                    double(largest(peak)), double(largest(bound)), double(sizeof(float) * P)));
            }
        }

        // Stage 3 from a weights folder (train_gpt --init DIR --shard parameters): other
        // weights than the seed's, so that the seed's cannot pass for them.
        {
            const GPT saved(model_config, config.seed + 1);
            const fs::path weights = dir / ("weights" + std::to_string(model_index));
            if (r == 0) save_checkpoint(weights, saved);
            MPI_Barrier(MPI_COMM_WORLD);
            const GPTBuffers buffers{false, false};
            const auto kept = [r, N](const GPT& m) { return mpi::kept_segments(m, 3, r, N); };
            TextDataset copy = data;
            MPI_Barrier(MPI_COMM_WORLD);
            const std::size_t before = live_bytes();  // the reference model, the corpus, ...
            reset_peak_bytes();
            std::optional<Trainer> trainer;
            trainer.emplace(config, std::move(copy), load_kept_weights(weights, model_config, buffers, kept));
            trainer->use_group(group_of(3));
            const std::size_t peak = peak_bytes() - before;
            const MemoryUse use = trainer->memory_use();
            const std::size_t bound = use.weights + use.gradients + use.optimizer + sizeof(float) * tensor + bookkeeping;
            const std::vector<float> got = trainer->whole_parameters();
            checks.check(same_bits(got, saved.parameters()),
                         model + ", stage 3 from a weights folder: the ranks' weights, gathered, are the folder's, "
                                 "bit for bit",
                         "differences: " + first_difference(got, saved.parameters()));
            checks.check(peak <= bound, model + ", stage 3 from a weights folder: a rank's peak while it starts is at "
                                                "most what it keeps, one tensor and the bookkeeping",
                         format("largest over the ranks: peak %.0f bytes, bound %.0f (whole weights %.0f)",
                                double(largest(peak)), double(largest(bound)), double(sizeof(float) * P)));
        }

        // Tensor parallelism from the seed: each rank's slices of a model made without whole
        // weights, against one process's model split, and gathered against its weights.
        {
            MPI_Barrier(MPI_COMM_WORLD);
            const std::size_t before = live_bytes();  // the reference model, the corpus, ...
            reset_peak_bytes();
            std::optional<mpi::TensorParallelGPT> split;
            {
                const GPT empty(model_config, config.seed, GPTBuffers{false, false});
                split.emplace(empty, MPI_COMM_WORLD);
            }
            const std::size_t peak = peak_bytes() - before;
            const std::size_t local = split->local_parameters();
            // Its slices' weights and gradients; the list of its runs, kept, and the list of
            // where each lies in the whole buffer, made to draw them (an (offset, size, flag)
            // and an (offset, size) a run).
            const std::size_t lists = split->local_runs() * (sizeof(std::tuple<std::size_t, std::size_t, bool>) +
                                                             sizeof(std::pair<std::size_t, std::size_t>));
            const std::size_t bound = 2 * sizeof(float) * local + lists + sizeof(float) * tensor + bookkeeping;
            mpi::TensorParallelGPT from_whole(reference, MPI_COMM_WORLD);
            const std::vector<float> got = split->whole_of(split->parameters());
            checks.check(same_bits(split->parameters(), from_whole.parameters()),
                         model + ", tensor parallelism from the seed: each rank's slices are those it cuts from one "
                                 "process's model, bit for bit");
            checks.check(same_bits(got, want), model + ", tensor parallelism from the seed: the slices, gathered, are "
                                                       "one process's weights, bit for bit",
                         "differences: " + first_difference(got, want));
            checks.check(peak <= bound, model + ", tensor parallelism from the seed: a rank's peak while it starts is "
                                                "at most its slices' weights and gradients, one tensor and the bookkeeping",
                         format("largest over the ranks: peak %.0f bytes, bound %.0f (whole weights %.0f)",
                                double(largest(peak)), double(largest(bound)), double(sizeof(float) * P)));
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 0) fs::remove_all(dir);
    return checks.finish();
}
