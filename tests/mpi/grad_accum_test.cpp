// Gradient accumulation with ranks against one process: R ranks sharing each of N = 3
// micro-batches of B = 8 take each of 6 steps as one process with one batch of N·B = 24 takes
// it from the ranks' checkpoint before it (loss, gradient norm, AdamW's moments, weights, step
// count, to the rounding of one step; the evaluation at the end), with the gradients summed
// bucket by bucket, in place, after the pass, and reduce-scattered (ZeRO stage 1), with dropout
// and without; the gradients are summed once a step, after the last micro-batch (DDP's
// no_sync): as many sums and allreduce calls as a run of one batch a step makes; ZeRO stages 2
// and 3 refuse to accumulate, on every rank alike.
//
// Run as `mpirun -np R grad_accum_test` (R = 1, 2, 4; CTest does).
#include "mpi_test.hpp"
#include "training.hpp"

#include "attn/data.hpp"
#include "attn/mpi/data_parallel.hpp"
#include "attn/mpi/world.hpp"
#include "attn/mpi/zero.hpp"
#include "attn/trainer.hpp"

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

using namespace attn;
using namespace mpi_test;
namespace fs = std::filesystem;

namespace {

constexpr int micro_batches = 3, steps = 6;

TrainConfig recipe(float dropout, int grad_accum) {
    TrainConfig c = tiny_recipe(8, steps, dropout);
    c.grad_accum = grad_accum;
    return c;
}

}  // namespace

int main(int argc, char** argv) {
    mpi::World world(argc, argv);
    world.share_cpus();
    Checks checks;
    const int R = world.size();
    checks.note("gradient accumulation on " + std::to_string(R) + " rank" + (R == 1 ? "" : "s") + ": " +
                std::to_string(micro_batches) + " micro-batches of 8 = " + std::to_string(R) + " x " +
                std::to_string(8 / R) + " a step");
    const TextDataset data = make_dataset(generated_text());
    const fs::path dir = job_folder("attn_grad_accum_test");

    struct Scheme {
        std::string name;
        mpi::AllreduceSchedule schedule;
        mpi::BucketPlan plan;
        bool zero1;
    };
    mpi::BucketPlan view;
    view.view = true;
    const Scheme schemes[] = {{"summed bucket by bucket", mpi::AllreduceSchedule::overlapped, {}, false},
                              {"summed in place", mpi::AllreduceSchedule::overlapped, view, false},
                              {"summed after the pass", mpi::AllreduceSchedule::after, {}, false},
                              {"reduce-scattered (ZeRO stage 1)", mpi::AllreduceSchedule::overlapped, {}, true}};
    const auto group_of = [](const Scheme& s) -> std::shared_ptr<mpi::DataParallel> {
        if (s.zero1) return std::make_shared<mpi::ShardedOptimizer>();
        return std::make_shared<mpi::DataParallel>(s.schedule, s.plan);
    };
    for (float dropout : {0.0f, 0.1f}) {
        for (const Scheme& s : schemes) {
            const std::string what = std::string("dropout ") + (dropout > 0 ? "0.1" : "0") + ", gradients " + s.name;
            const TrainConfig config = recipe(dropout, micro_batches);
            Trainer shared(config, data), unsaved(config, data);
            const std::shared_ptr<mpi::DataParallel> group = group_of(s);
            shared.use_group(group);
            unsaved.use_group(group_of(s));
            check_steps(checks, compare_steps_with_one_batch(shared, unsaved, steps, dir / "run"),
                        what + ", against one batch of " + std::to_string(micro_batches * 8));
            checks.check(same_on_every_rank(shared.whole_parameters()),
                         what + ": every rank holds the same weights, bit for bit");
            if (s.zero1) continue;  // its reduce-scatters are counted by lesson 21's tests
            // The sums of a run of one batch a step, the same number of steps: the same count.
            Trainer once(recipe(dropout, 1), data);
            auto once_group = std::make_shared<mpi::DataParallel>(s.schedule, s.plan);
            once.use_group(once_group);
            take_steps(once, steps);
            checks.check(group->gradient_sums() == steps && group->allreduce_calls() == once_group->allreduce_calls(),
                         what + ": one gradient sum a step, after the last micro-batch: the allreduce calls of one "
                                "batch a step",
                         format("%.0f sums, %.0f allreduce calls in ", double(group->gradient_sums()),
                                double(group->allreduce_calls())) +
                             format("%.0f steps; one batch a step: %.0f calls", steps, double(once_group->allreduce_calls())));
        }
    }

    // ZeRO stages 2 and 3 hand each block's gradients to the ring as the pass finishes them:
    // refused on every rank alike, before any step.
    for (int stage : {2, 3}) {
        Trainer t(recipe(0.0f, micro_batches), data);
        std::shared_ptr<DataParallelGroup> group;
        if (stage == 2) group = std::make_shared<mpi::ShardedGradients>();
        else group = std::make_shared<mpi::ShardedParameters>();
        bool refused = false;
        try {
            t.use_group(group);
        } catch (const std::invalid_argument&) {
            refused = true;
        }
        checks.check(refused && t.group() == nullptr && t.step() == 0,
                     "ZeRO stage " + std::to_string(stage) + " with " + std::to_string(micro_batches) +
                         " micro-batches a step: refused");
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (world.rank() == 0) fs::remove_all(dir);
    return checks.finish();
}
