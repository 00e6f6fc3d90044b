// What a rank allocates while it saves and resumes a checkpoint, against what it holds while it
// trains: plain data parallelism and ZeRO stages 1, 2 and 3 on N ranks, each rank's peak of
// bytes live through `new` (attn/live_bytes.hpp: exact, the same in every run) during a
// training step (after the first, which allocates the activations), during save() and during
// the resume (Trainer::load and joining the group, as train_gpt --resume does them, after the
// trainer that saved has been dropped). Each rank's save and resume peaks must stay within
// 1.2 times its training peak: a rank that gathered the whole weights or moments to write
// them, or built the whole model to cut its shard from it, holds several times its shard.
// The resumed run's next two steps are then the uninterrupted run's, bit for bit.
//
// Run as `mpirun -np N checkpoint_memory_test` (CTest: N = 2, 3, 4).
#include "mpi_test.hpp"

#include "attn/data.hpp"
#include "attn/live_bytes.hpp"
#include "attn/threads.hpp"
#include "attn/mpi/data_parallel.hpp"
#include "attn/mpi/world.hpp"
#include "attn/mpi/zero.hpp"
#include "attn/trainer.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;

namespace {

// The goal for the save and resume peaks, as a multiple of the training step's.
constexpr double bound = 1.2;

// Words of a small alphabet, deterministic (20 000 characters: the corpus stays small beside
// the model, whose state is what is measured).
std::string corpus() {
    std::string text = "to be, or not to be.\n";
    std::uint64_t x = 2024;
    auto next = [&x](std::uint64_t n) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        return (x >> 33) % n;
    };
    const std::string letters = "abcdefghijklmnopqrstuvwxyz";
    while (text.size() < 20000) {
        const std::uint64_t n = 1 + next(7);
        for (std::uint64_t i = 0; i < n; ++i) text += letters[next(letters.size())];
        text += next(5) == 0 ? '\n' : ' ';
    }
    return text;
}

std::shared_ptr<mpi::DataParallel> group_of(int stage) {
    if (stage == 1) return std::make_shared<mpi::ShardedOptimizer>();
    if (stage == 2) return std::make_shared<mpi::ShardedGradients>();
    if (stage == 3) return std::make_shared<mpi::ShardedParameters>();
    return std::make_shared<mpi::DataParallel>();
}

// FNV-1a of the floats' bytes.
std::uint64_t hash_of(const std::vector<float>& values) {
    std::uint64_t h = 0xcbf29ce484222325ull;
    const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
    for (std::size_t i = 0; i < values.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001B3ull;
    return h;
}

double largest(double mine) {
    double all = 0.0;
    MPI_Allreduce(&mine, &all, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return all;
}

}  // namespace

int main(int argc, char** argv) {
    mpi::World world(argc, argv);
    set_num_threads(1);
    mpi_test::Checks checks;
    const int rank = world.rank(), ranks = world.size();
    const TextDataset data = make_dataset(corpus());
    // 4 layers of 128 channels (0.8M parameters), one sequence of 16 positions per rank: the
    // training state, not the activations, sets what a rank holds.
    TrainConfig config = TrainConfig::named("cpu");
    config.batch_size = ranks;
    config.block_size = 16;
    config.eval_iters = 1;
    const fs::path dir = fs::temp_directory_path() / ("attn_checkpoint_memory_" + std::to_string(ranks));
    if (rank == 0) fs::remove_all(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    checks.note("scheme   ranks  train MB  save MB  resume MB  save/train  resume/train (the largest over the ranks)");
    const char* names[] = {"plain", "stage 1", "stage 2", "stage 3"};
    for (int stage = 0; stage <= 3; ++stage) {
        // As train_gpt sets a rank up: the whole buffers only where the group keeps them.
        GPTBuffers buffers;
        buffers.gradients = stage < 2;
        buffers.weights = stage < 3;
        std::function<std::vector<AdamW::Segment>(const GPT&)> kept;
        if (stage > 0) kept = [stage, rank, ranks](const GPT& m) { return mpi::kept_segments(m, stage, rank, ranks); };
        const fs::path checkpoint = dir / ("stage" + std::to_string(stage));

        std::optional<Trainer> trainer;
        trainer.emplace(config, data, buffers);
        trainer->use_group(group_of(stage));
        trainer->train_step();  // allocates the activations and the group's buffers
        std::size_t train = 0;
        for (int i = 0; i < 2; ++i) {
            reset_peak_bytes();
            trainer->train_step();
            train = std::max(train, peak_bytes());
        }
        reset_peak_bytes();
        trainer->save(checkpoint);
        const std::size_t save = peak_bytes();
        const std::int64_t step = trainer->step();
        // The uninterrupted run's next steps, against which the resumed run's are compared.
        std::vector<float> uninterrupted;
        for (int i = 0; i < 2; ++i) {
            const StepRecord r = trainer->train_step();
            uninterrupted.insert(uninterrupted.end(), {r.loss, r.grad_norm});
        }
        const std::uint64_t weights = hash_of(trainer->whole_parameters());  // not held while resuming
        trainer.reset();  // the process as a resumed run starts: no trainer yet
        MPI_Barrier(MPI_COMM_WORLD);
        reset_peak_bytes();
        trainer.emplace(Trainer::load(checkpoint, data, kept, buffers));
        trainer->use_group(group_of(stage));
        const std::size_t resume = peak_bytes();
        const bool at_step = trainer->step() == step;
        std::vector<float> resumed;
        for (int i = 0; i < 2; ++i) {
            const StepRecord r = trainer->train_step();
            resumed.insert(resumed.end(), {r.loss, r.grad_norm});
        }
        // The same ranks, the same order of every sum: the same bits.
        const bool same = at_step && resumed == uninterrupted && hash_of(trainer->whole_parameters()) == weights;

        const double save_ratio = static_cast<double>(save) / static_cast<double>(train);
        const double resume_ratio = static_cast<double>(resume) / static_cast<double>(train);
        char line[200];
        std::snprintf(line, sizeof line, "%-8s %5d  %8.2f  %7.2f  %9.2f  %10.3f  %12.3f", names[stage], ranks,
                      largest(static_cast<double>(train)) / 1e6, largest(static_cast<double>(save)) / 1e6,
                      largest(static_cast<double>(resume)) / 1e6, largest(save_ratio), largest(resume_ratio));
        checks.note(line);
        char detail[160];
        std::snprintf(detail, sizeof detail, "train %zu B, save %zu B (%.3f), resume %zu B (%.3f)", train, save,
                      save_ratio, resume, resume_ratio);
        checks.check(save_ratio <= bound, std::string(names[stage]) + ": a rank's peak while saving is within " +
                                              "1.2 times its training step's", detail);
        checks.check(resume_ratio <= bound, std::string(names[stage]) + ": a rank's peak while resuming is within " +
                                                "1.2 times its training step's", detail);
        checks.check(same, std::string(names[stage]) + ": resumed on its own layout, the next two steps are the "
                           "uninterrupted run's, bit for bit (losses, gradient norms, weights)");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) fs::remove_all(dir);
    return checks.finish();
}
