// ZeRO stage 1 (attn/mpi/zero.hpp) on N ranks against one process: N ranks, each keeping
// AdamW's moments for its shard of the parameters only, give the losses, gradient norms and
// weights of one process over 20 steps (to the rounding of the summation order), with dropout
// and without; every rank holds the same weights, bit for bit; each rank's moments are its
// shard's 8 bytes a parameter, measured; what each rank sends per step, counted by the ring
// collectives, is what the ring's arithmetic says; a checkpoint written by the sharded ranks
// holds the whole optimizer state and resumes in one process and under plain data
// parallelism, and one process's checkpoint resumes on the sharded ranks, each with the
// losses of a run that never stopped.
//
// Run as `mpirun -np N zero_test` (N = 1, 2, 3, 4; CTest does).
#include "mpi_test.hpp"
#include "training.hpp"

#include "attn/data.hpp"
#include "attn/mpi/world.hpp"
#include "attn/mpi/zero.hpp"
#include "attn/trainer.hpp"

#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

using namespace attn;
using namespace mpi_test;
namespace fs = std::filesystem;

namespace {

// The tiny recipe with a batch that 1, 2, 3 and 4 ranks share evenly, 20 steps.
TrainConfig recipe(float dropout) { return tiny_recipe(12, 20, dropout); }

}  // namespace

int main(int argc, char** argv) {
    mpi::World world(argc, argv);
    world.share_cpus();
    Checks checks;
    const int N = world.size(), r = world.rank();
    const TextDataset data = make_dataset(generated_text());
    const std::size_t P = Trainer(recipe(0.0f), data).model().parameters().size();
    checks.note("ZeRO stage 1 on " + std::to_string(N) + " rank" + (N == 1 ? "" : "s") + ", batch 12 = " +
                std::to_string(N) + " x " + std::to_string(12 / N) + ", " + std::to_string(P) + " parameters, shards " +
                std::to_string(shard_of(P, 0, N).size()) + " to " + std::to_string(shard_of(P, N - 1, N).size()));

    // The bound, as data_parallel_test.cpp derives it for the same tiny model (B·T = 12 · 32
    // = 384 rows here): a gradient or the loss sums the rows per rank, then the ring adds the
    // ranks' partial sums in another order than one process, a difference of ≤ 2γ_384 ≈
    // 4.6e-5 of Σ|terms| at worst and ≈ √384 u ≈ 1.2e-6 of it with random signs (u = 2^-24),
    // 8× under 1e-5. AdamW moves a weight by ≲ lr·|Δg|/|g| a step (~1e-9 at lr 1e-3), 20 steps
    // ~2e-8, far under 1e-5 of the largest weight (~1). The moments' update and the clipping
    // norm add nothing: each parameter's update is the one-process arithmetic
    // (AdamW::step_range), and the norm's sum of squares is in double. The wrong versions
    // tried (the norm of one shard, no all-gather, the ring's order off by one, no share)
    // moved the losses or the norms by 5e-4 to 7e-2 relative.
    const double tolerance = 1e-5;

    for (float dropout : {0.0f, 0.1f}) {
        const TrainConfig config = recipe(dropout);
        const std::string what = std::string("dropout ") + (dropout > 0 ? "0.1" : "0");
        Trainer single(config, data);
        const Run reference = train(single, 20);
        Trainer shared(config, data);
        auto group = std::make_shared<mpi::ShardedOptimizer>();
        shared.use_group(group);
        const Run run = train(shared, 20);
        const double losses = relative_gap(run.losses, reference.losses);
        const double norms = relative_gap(run.norms, reference.norms);
        const double weights = relative_gap(run.weights, reference.weights);
        checks.check(losses <= tolerance && norms <= tolerance, what + ": 20 steps' losses and gradient norms are one process's",
                     format("largest relative gap %.2e (losses), %.2e (norms)", losses, norms));
        checks.check(weights <= tolerance, what + ": the weights after 20 steps are one process's",
                     format("largest gap %.2e of the largest weight", weights));
        checks.check(std::abs(run.eval.val_loss - reference.eval.val_loss) <= tolerance * reference.eval.val_loss,
                     what + ": the shared evaluation is one process's",
                     format("val %.7f against %.7f", run.eval.val_loss, reference.eval.val_loss));
        checks.check(same_on_every_rank(run.weights), what + ": every rank holds the same weights, bit for bit");

        // Memory: this rank's moments are its shard's, m and v in float32.
        const Shard mine = shard_of(P, r, N);
        const std::size_t bytes = shared.optimizer().bytes(), expected = 2 * sizeof(float) * mine.size();
        checks.check(bytes == expected, what + ": each rank's AdamW moments hold its shard alone, 8 bytes a parameter",
                     format("%.0f bytes measured, %.0f for the shard (%.0f for the whole model)", double(bytes),
                            double(expected), double(2 * sizeof(float) * P)));
        // Traffic: a ring's rank r sends every shard but its own in the reduce-scatter and every
        // shard but the next rank's in the all-gather; the norm is one double.
        const mpi::ZeroTraffic& t = group->last_traffic();
        const std::size_t next = shard_of(P, (r + 1) % N, N).size();
        const std::size_t rs = N > 1 ? sizeof(float) * (P - mine.size()) : 0;
        const std::size_t ag = N > 1 ? sizeof(float) * (P - next) : 0;
        const std::size_t norm = N > 1 ? sizeof(double) : 0;
        checks.check(t.reduce_scatter_bytes == rs && t.all_gather_bytes == ag && t.norm_bytes == norm,
                     what + ": the bytes each rank sends in a step are the ring's (P - |own shard|, P - |next shard|)",
                     format("reduce-scatter %.0f (expected %.0f), all-gather %.0f", double(t.reduce_scatter_bytes),
                            double(rs), double(t.all_gather_bytes)));
    }

    // Resuming across schemes: the checkpoint holds the whole optimizer state.
    const TrainConfig config = recipe(0.1f);
    Trainer uninterrupted(config, data);
    const Run reference = train(uninterrupted, 20);
    const std::vector<float> later(reference.losses.begin() + 10, reference.losses.end());
    std::string dir;
    {
        long long pid = static_cast<long long>(::getpid());
        MPI_Bcast(&pid, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
        dir = (fs::temp_directory_path() / ("attn_zero_test_" + std::to_string(N) + "_" + std::to_string(pid))).string();
    }
    {
        Trainer shared(config, data);
        shared.use_group(std::make_shared<mpi::ShardedOptimizer>());
        train(shared, 10);
        shared.save(dir + "/sharded");
        Trainer alone = Trainer::load(dir + "/sharded", data);
        checks.check(alone.optimizer().m.size() == P && alone.optimizer().v.size() == P,
                     "the sharded ranks' checkpoint holds every parameter's moments",
                     format("%.0f moments for %.0f parameters", double(alone.optimizer().m.size()), double(P)));
        const Run resumed = train(alone, 10);
        check_losses(checks, resumed.losses, later, tolerance,
                     std::to_string(N) + " sharded ranks' checkpoint at step 10, resumed by one process: the "
                     "losses of steps 10-19 are the uninterrupted run's");
        Trainer plain = Trainer::load(dir + "/sharded", data);
        plain.use_group(std::make_shared<mpi::DataParallel>());
        const Run resumed_plain = train(plain, 10);
        check_losses(checks, resumed_plain.losses, later, tolerance,
                     "the same checkpoint resumed by " + std::to_string(N) + " ranks of plain data parallelism: the "
                     "uninterrupted run's losses");
    }
    {
        if (r == 0) {
            Trainer alone(config, data);
            train(alone, 10);
            alone.save(dir + "/one");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        Trainer shared = Trainer::load(dir + "/one", data);
        shared.use_group(std::make_shared<mpi::ShardedOptimizer>());
        const Run resumed = train(shared, 10);
        check_losses(checks, resumed.losses, later, tolerance,
                     "one process's checkpoint at step 10, resumed by " + std::to_string(N) +
                         " sharded ranks: the uninterrupted run's losses");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 0) fs::remove_all(dir);
    return checks.finish();
}
