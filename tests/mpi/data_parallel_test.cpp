// Data parallelism over N ranks against one process: N ranks with batch B/N each take each
// of 10 steps as one process with batch B takes it from the ranks' checkpoint before it
// (loss, gradient norm, AdamW's moments, weights, step count, to the rounding of one step;
// the evaluation at the end), with the gradients summed bucket by bucket during the backward
// pass (every kind of bucket plan: one per block, capped, a small first bucket, one bucket;
// packed or in place) and in one allreduce after it, with dropout and without; every rank
// holds the same weights, bit for bit; a checkpoint written by N ranks resumes in one process,
// and one written by one process resumes on N ranks, each resumed step one process's from the
// checkpoint before it.
//
// Run as `mpirun -np N data_parallel_test` (N = 1, 2, 4; CTest does).
#include "mpi_test.hpp"
#include "training.hpp"

#include "attn/data.hpp"
#include "attn/mpi/data_parallel.hpp"
#include "attn/mpi/world.hpp"
#include "attn/trainer.hpp"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

using namespace attn;
using namespace mpi_test;
namespace fs = std::filesystem;

namespace {

// The tiny recipe with a batch that 1, 2 and 4 ranks share evenly, 10 steps.
TrainConfig recipe(float dropout) { return tiny_recipe(8, 10, dropout); }

// Every schedule, and for the overlapped one every kind of bucket plan: one bucket per block
// (the default), blocks joined up to a cap, a small first bucket before a large cap (DDP's
// habit), everything in one bucket, and each of them summed in place. The caps are made from
// the model's own block size, so that each plan really joins blocks.
std::vector<std::pair<mpi::AllreduceSchedule, mpi::BucketPlan>> schedules_and_plans(const GPT& model) {
    const std::size_t block = model.gradient_buckets().front().size * sizeof(float);
    std::vector<std::pair<mpi::AllreduceSchedule, mpi::BucketPlan>> out;
    for (bool view : {false, true}) {
        for (mpi::BucketPlan plan : {mpi::BucketPlan{}, mpi::BucketPlan{block + 1, 0, false},
                                     mpi::BucketPlan{std::size_t{1} << 30, 1, false},
                                     mpi::BucketPlan{std::size_t{1} << 30, 0, false}}) {
            plan.view = view;
            out.emplace_back(mpi::AllreduceSchedule::overlapped, plan);
        }
    }
    out.emplace_back(mpi::AllreduceSchedule::after, mpi::BucketPlan{});
    return out;
}

// The buckets of each plan: every gradient in exactly one of them, and as many buckets as the
// plan's caps make of the model's blocks (counted by hand for the tiny recipe's 2 blocks and
// the embeddings: 3 buckets, 2 (both blocks, then the rest), 2 (the last block alone, then
// the rest), 1).
void check_plans(mpi_test::Checks& checks, const GPT& model) {
    const std::vector<int> expected = {3, 2, 2, 1};
    const auto plans = schedules_and_plans(model);
    for (std::size_t k = 0; k < plans.size() - 1; ++k) {
        const mpi::BucketPlan& plan = plans[k].second;
        const auto buckets = mpi::DataParallel::plan_buckets(model, plan);
        std::vector<int> seen(model.parameters().size(), 0);
        std::size_t floats = 0;
        for (const auto& b : buckets) {
            for (const auto& [offset, size] : b.ranges) {
                for (std::size_t i = 0; i < size; ++i) ++seen[offset + i];
                floats += size;
            }
        }
        const bool once = std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; });
        checks.check(once && floats == seen.size(), "buckets " + mpi::describe(plan) + ": every gradient in one bucket",
                     mpi_test::format("%.0f floats in the buckets, %.0f parameters", double(floats), double(seen.size())));
        checks.check(static_cast<int>(buckets.size()) == expected[k % expected.size()],
                     "buckets " + mpi::describe(plan) + ": as many buckets as the caps make",
                     mpi_test::format("%.0f buckets, %.0f expected", double(buckets.size()), expected[k % expected.size()]));
    }
}

}  // namespace

int main(int argc, char** argv) {
    mpi::World world(argc, argv);
    world.share_cpus();
    mpi_test::Checks checks;
    const int N = world.size();
    checks.note("data parallelism on " + std::to_string(N) + " rank" + (N == 1 ? "" : "s") +
                ", batch 8 = " + std::to_string(N) + " x " + std::to_string(8 / N));
    const TextDataset data = make_dataset(generated_text());
    check_plans(checks, Trainer(recipe(0.0f), data).model());

    // Each step is compared with one process's from the same checkpoint, with the bounds of
    // one step that training.hpp derives (a chain of sums regrouped: each rank sums its B·T/N
    // rows, the allreduce adds the ranks' sums in another order than one process's B·T rows).
    // A wrong share, a missing rank or a skipped bucket changes the gradients by 1e-2 or more
    // of their scale after one step, far beyond those bounds.
    const fs::path dir = job_folder("attn_dp_test");
    for (float dropout : {0.0f, 0.1f}) {
        const TrainConfig config = recipe(dropout);
        const Trainer single(config, data);
        for (const auto& [schedule, plan] : schedules_and_plans(single.model())) {
            const std::string what = std::string("dropout ") + (dropout > 0 ? "0.1" : "0") +
                                     ", gradients summed " + mpi::schedule_name(schedule) +
                                     (schedule == mpi::AllreduceSchedule::overlapped ? ", buckets " + mpi::describe(plan) : "");
            Trainer shared(config, data), unsaved(config, data);
            shared.use_group(std::make_shared<mpi::DataParallel>(schedule, plan));
            unsaved.use_group(std::make_shared<mpi::DataParallel>(schedule, plan));
            check_steps(checks, compare_steps(shared, unsaved, 10, dir / "run"), what);
            checks.check(same_on_every_rank(shared.whole_parameters()),
                         what + ": every rank holds the same weights, bit for bit");
        }
    }

    // Resuming on another number of ranks: a checkpoint holds nothing of how many there were.
    const TrainConfig config = recipe(0.1f);
    {
        // N ranks train 5 steps and save (rank 0 writes); one process resumes from it, and
        // each of its steps is the ranks' own.
        Trainer shared(config, data);
        shared.use_group(std::make_shared<mpi::DataParallel>());
        take_steps(shared, 5);
        check_resumed(checks, compare_resumed(shared, 2, dir / "from_shared"),
                      std::to_string(N) + " ranks' checkpoint at step 5, resumed by one process: 2 steps, each "
                      "the ranks' own step from the checkpoint before it");
    }
    {
        // One process trains 5 steps and saves; the N ranks resume it together.
        if (world.rank() == 0) {
            Trainer alone(config, data);
            take_steps(alone, 5);
            alone.save(dir / "from_one");
        }
        MPI_Barrier(MPI_COMM_WORLD);
        Trainer shared = Trainer::load(dir / "from_one", data);
        shared.use_group(std::make_shared<mpi::DataParallel>());
        check_resumed(checks, compare_resumed(shared, 2, dir / "resumed", dir / "from_one"),
                      "one process's checkpoint at step 5, resumed by " + std::to_string(N) +
                          " ranks: 2 steps, each one process's from the checkpoint before it");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (world.rank() == 0) fs::remove_all(dir);
    return checks.finish();
}
