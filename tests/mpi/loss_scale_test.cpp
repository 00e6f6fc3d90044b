// Mixed precision on any number of ranks against one process: N ranks sharing a batch of B
// sequences (every share, even or not: B drawn from N … 4N+1) take each of 4 steps as one
// process with the whole batch takes it from the ranks' checkpoint before it, in bfloat16
// products and in float32, with the gradients summed by plain data parallelism and by ZeRO
// stages 1 and 2.
//
// The bound. In float32 the steps are compared with the bounds of one step that
// step_bounds.hpp derives (the sums over the batch's rows and the ranks regrouped). In
// bfloat16 the same bounds hold where one row's float32 products do not depend on the rows
// beside it, plus one bfloat16 ulp on each product's inputs where they do (OpenBLAS's Haswell
// kernel gives a row other last bits by the rows around it: step_bounds.hpp's `flip`). Why
// they hold: every value that is rounded to bfloat16 (a product's input)
// belongs to one position and is computed for it by the same float operations on a rank as
// in one process: its forward pass from the same weights, and its backward pass from the
// logits' gradient (p − y)/(B·T), divided by the whole batch's positions in every rank
// (GPT::set_whole_batch). What the ranks regroup are only the float32 sums over rows (the
// weights' gradients) and over ranks, which those bounds cover. A rank that differentiated
// its own mean, 1/(b·T), and weighted it by b/B afterwards would feed the products values
// B/b times larger: for B/b not a power of two they round to other bfloat16 neighbours,
// 2^-8 of a value apart, and the moments of 3 ranks' steps miss those bounds several times
// over (2 and 4 ranks of even shares, B/b a power of two, round alike either way).
//
// Run as `mpirun -np N loss_scale_test` (N = 1, 2, 3, 4; CTest does).
#include "mpi_test.hpp"
#include "training.hpp"

#include "attn/data.hpp"
#include "attn/mpi/data_parallel.hpp"
#include "attn/mpi/world.hpp"
#include "attn/mpi/zero.hpp"
#include "attn/random.hpp"
#include "attn/trainer.hpp"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace attn;
using namespace mpi_test;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
    mpi::World world(argc, argv);
    world.share_cpus();
    mpi_test::Checks checks;
    const int N = world.size();
    const TextDataset data = make_dataset(generated_text());

    // The batches: N (one sequence each), 2N + 1 (uneven for N > 1), and two drawn from
    // N … 4N + 1 with the same seed on every rank.
    std::vector<int> batches = {N, 2 * N + 1};
    Rng rng(53);
    for (int k = 0; k < 2; ++k) batches.push_back(N + static_cast<int>(rng.below(static_cast<std::uint64_t>(3 * N + 2))));
    std::sort(batches.begin(), batches.end());
    batches.erase(std::unique(batches.begin(), batches.end()), batches.end());

    using MakeGroup = std::function<std::shared_ptr<DataParallelGroup>()>;
    const std::vector<std::pair<std::string, MakeGroup>> schemes = {
        {"plain data parallelism", [] { return std::make_shared<mpi::DataParallel>(); }},
        {"ZeRO stage 1", [] { return std::make_shared<mpi::ShardedOptimizer>(); }},
        {"ZeRO stage 2", [] { return std::make_shared<mpi::ShardedGradients>(); }},
    };
    const fs::path dir = job_folder("attn_loss_scale_test");
    for (const Precision precision : {Precision::bf16, Precision::fp32}) {
        for (const int B : batches) {
            std::string shares;
            for (int r = 0; r < N; ++r) {
                const auto [b0, b1] = batch_share(B, r, N);
                shares += (r == 0 ? "" : "+") + std::to_string(b1 - b0);
            }
            for (const auto& [name, make] : schemes) {
                TrainConfig config = tiny_recipe(B, 4, 0.0f);
                config.precision = precision;
                Trainer shared(config, data), unsaved(config, data);
                shared.use_group(make());
                unsaved.use_group(make());
                const std::string what = std::string(precision_name(precision)) + ", " + std::to_string(N) +
                                         " ranks, batch " + std::to_string(B) + " = " + shares + ", " + name;
                check_steps(checks, compare_steps(shared, unsaved, 4, dir / "run"), what);
            }
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (world.rank() == 0) fs::remove_all(dir);
    return checks.finish();
}
