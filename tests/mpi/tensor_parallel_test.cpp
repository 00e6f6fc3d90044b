// Tensor parallelism (attn/mpi/tensor_parallel.hpp) on N ranks against one process: a GPT of
// two blocks split over the ranks (each rank a share of every block's heads and MLP hidden
// units) gives one process's loss and gradients (GPT::forward and GPT::backward, the
// course's model as it trains alone), to the rounding of summing the ranks' partial outputs;
// it calls MPI_Allreduce twice per block forward and twice backward, each on a (B, T, C)
// buffer; each rank holds the whole tensors and 1/N of the split ones; a model whose heads
// do not divide among the ranks, or with dropout, is refused in one line. On 4 ranks also a
// 2 x 2 grid (MPI_Comm_split): tensor-parallel pairs, each pair on half of the batch, the
// pairs' gradients summed (data parallelism across), against one process on the whole batch.
// Training (mpi::TensorParallelDevice in the Trainer, as `train_gpt --tensor-parallel N`
// runs it): each of 20 steps of the tiny recipe is one process's step from the split's
// checkpoint before it (loss, gradient norm, AdamW's moments, weights, step count; the
// evaluation at the end), with biases and without, on N ranks and on the 2 x 2 grid; a
// checkpoint the split saves resumes in one process, on plain data parallelism and on each
// ZeRO stage, and each of theirs resumes split, each resumed step one process's from the
// checkpoint before it.
//
// Run as `mpirun -np N tensor_parallel_test` (N = 1, 2, 4; CTest does).
#include "mpi_test.hpp"
#include "training.hpp"

#include "attn/data.hpp"
#include "attn/gpt.hpp"
#include "attn/mpi/data_parallel.hpp"
#include "attn/mpi/tensor_parallel.hpp"
#include "attn/mpi/zero.hpp"
#include "attn/mpi/world.hpp"
#include "attn/random.hpp"

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

using namespace attn;
using namespace mpi_test;

namespace {

GPTConfig small_model() {
    GPTConfig c;
    c.vocab_size = 17;
    c.block_size = 16;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_embd = 32;
    c.dropout = 0.0f;
    return c;
}

// The tiny recipe with heads that 1, 2 and 4 ranks split, and a batch that 2 copies share.
TrainConfig split_recipe(bool bias) {
    TrainConfig c = tiny_recipe(12, 20, 0.0f);
    c.n_head = 4;
    c.bias = bias;
    return c;
}

}  // namespace

int main(int argc, char** argv) {
    mpi::World world(argc, argv);
    Checks checks;
    const int N = world.size();
    const int B = 4, T = 16;
    Rng rng(21);
    std::vector<int> x(B * T), y(B * T);
    for (int i = 0; i < B * T; ++i) {
        x[i] = static_cast<int>(rng.below(17));
        y[i] = static_cast<int>(rng.below(17));
    }
    for (const bool bias : {true, false}) {
        GPTConfig config = small_model();
        config.bias = bias;
        // One process: the reference, the same on every rank.
        GPT model(config, 5);
        const float loss = model.forward(x, y, B, T);
        model.zero_grad();
        model.backward();
        const std::vector<float>& reference = model.gradients();
        const std::string with = bias ? "with biases: " : "without biases: ";
        checks.note("tensor parallelism on " + std::to_string(N) + " rank" + (N == 1 ? "" : "s") + ": " +
                    std::to_string(config.n_layer) + " blocks, " + std::to_string(config.n_head) + " heads, C = " +
                    std::to_string(config.n_embd) + ", batch " + std::to_string(B) + " x " + std::to_string(T) + ", " +
                    (bias ? "with" : "without") + " biases");

        // The bound: the ranks' partial outputs of c_proj (and the partial gradients of each
        // LayerNorm's input) are sums of C/N or 4C/N products each, added over the ranks: the
        // same terms in another grouping, ≲ 2γ_{4C} ≈ 1.5e-5 of Σ|terms| at worst (u = 2^-24,
        // 4C = 128 terms) and ≈ √128 u ≈ 7e-7 of it with random signs; the loss and the
        // gradients inherit that, 1e-5 leaves 14×. The wrong versions tried (the backward
        // allreduce of d(ln1) left out; the attention's c_proj split by rows instead of columns)
        // moved the gradients by 0.2 to 0.6 of their scale.
        const double tolerance = 1e-5;
        {
            mpi::TensorParallelGPT split(model, MPI_COMM_WORLD);
            const float tp_loss = split.forward(x.data(), y.data(), B, T);
            split.backward();
            const std::vector<float> grads = split.whole_gradients();
            checks.check(std::fabs(tp_loss - loss) <= tolerance * std::fabs(loss), with + "the loss is one process's",
                         format("%.8f against %.8f", tp_loss, loss));
            const double gap = relative_gap(grads, reference);
            checks.check(gap <= tolerance, with + "every parameter's gradient is one process's",
                         format("largest gap %.2e of the largest gradient", gap));
            // Two allreduces per block forward and two backward, each a (B, T, C) buffer.
            const mpi::TensorParallelTraffic& t = split.last_traffic();
            const int calls = N > 1 ? 4 * config.n_layer : 0;
            const double floats = N > 1 ? 4.0 * config.n_layer * B * T * config.n_embd : 0.0;
            checks.check(t.allreduces == calls && static_cast<double>(t.floats) == floats,
                         with + "two allreduces of (B, T, C) per block forward and two backward",
                         format("%.0f calls of %.0f floats in all (expected %.0f calls)", t.allreduces,
                                static_cast<double>(t.floats), calls));
            // Memory: the whole tensors on every rank, 1/N of the split ones.
            const double C = config.n_embd, V = config.vocab_size, Tb = config.block_size, L = config.n_layer;
            const double b = bias ? 1.0 : 0.0;  // a bias's floats, where the model has biases
            const double whole = V * C + Tb * C + (1 + b) * C + L * (2 + 4 * b) * C;
            const double split_part = L * (3 * C * C + b * 3 * C + C * C + 4 * C * C + b * 4 * C + 4 * C * C);
            const double expected = whole + split_part / N;
            checks.check(static_cast<double>(split.local_parameters()) == expected,
                         with + "each rank holds the whole tensors and 1/N of every block's split ones",
                         format("%.0f parameters (expected %.0f, of %.0f)", static_cast<double>(split.local_parameters()),
                                expected, static_cast<double>(model.parameters().size())));
        }

        // The 2 x 2 grid: ranks {0, 1} and {2, 3} split every block; ranks {0, 2} and {1, 3}
        // hold the same slices and share the batch.
        if (N == 4) {
            const int r = world.rank();
            MPI_Comm tp = MPI_COMM_NULL, dp = MPI_COMM_NULL;
            MPI_Comm_split(MPI_COMM_WORLD, r / 2, r, &tp);
            MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &dp);
            const int half = B / 2, d = r / 2;  // this pair's sequences: [d·half, (d + 1)·half)
            mpi::TensorParallelGPT split(model, tp);
            const float local = split.forward(x.data() + d * half * T, y.data() + d * half * T, half, T);
            float grid_loss = 0.0f;
            const float share = 0.5f * local;  // each pair's mean weighted by its half of the batch
            MPI_Allreduce(&share, &grid_loss, 1, MPI_FLOAT, MPI_SUM, dp);
            split.backward();
            std::vector<float>& g = split.local_gradients();
            for (float& v : g) v *= 0.5f;
            MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM, dp);
            const std::vector<float> grads = split.whole_gradients();
            checks.check(std::fabs(grid_loss - loss) <= tolerance * std::fabs(loss),
                         with + "2 x 2 grid (tensor-parallel pairs, data-parallel across): the loss is one process's",
                         format("%.8f against %.8f", grid_loss, loss));
            const double gap = relative_gap(grads, reference);
            checks.check(gap <= tolerance, with + "2 x 2 grid: every parameter's gradient is one process's",
                         format("largest gap %.2e of the largest gradient", gap));
            MPI_Comm_free(&tp);
            MPI_Comm_free(&dp);
        }
    }

    // Training: the Trainer with the split as its device, each step against one process's
    // from the split's checkpoint before it, with one step's bounds (training.hpp derives
    // them): 20 steps of the tiny recipe, with biases and without, on N ranks and on the 2 x 2
    // grid. Over a whole run no bound holds (a gradient at rounding level can flip its AdamW
    // step), which is why the steps are compared one at a time.
    const TextDataset data = make_dataset(generated_text());
    const int r = world.rank();
    const std::filesystem::path dir = job_folder("attn_tp_test");
    for (const bool bias : {false, true}) {
        const TrainConfig config = split_recipe(bias);
        for (const bool grid : {false, true}) {
            if (grid && N != 4) continue;
            MPI_Comm tp = MPI_COMM_WORLD, dp = MPI_COMM_NULL;
            if (grid) {
                MPI_Comm_split(MPI_COMM_WORLD, r / 2, r, &tp);
                MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &dp);
            }
            const std::string what = std::string(grid ? "2 x 2 grid" : std::to_string(N) + " tensor-parallel ranks") +
                                     (bias ? ", biases" : ", no biases");
            Trainer split(config, data), unsaved(config, data);
            split.use_device(std::make_unique<mpi::TensorParallelDevice>(tp, dp));
            unsaved.use_device(std::make_unique<mpi::TensorParallelDevice>(tp, dp));
            const StepGaps gaps = compare_steps(split, unsaved, 20, dir / "run");
            check_steps(checks, gaps, what);
            split.use_device(nullptr);  // the whole state back, before the communicators go
            unsaved.use_device(nullptr);
            // The host model now computes with the weights the split trained (the sample of
            // train_gpt and every later use read it): one process's evaluation from the last
            // checkpoint, to the bound of compare_steps' evaluation.
            const EvalRecord host = split.evaluate();
            Worst gap;
            if (r == 0) {
                const EvalRecord& one = gaps.reference_eval;
                const double rel = 2 * gamma_of(sum_chains(config, data.vocab.size()).forward + double(config.eval_iters)) +
                                   unit_roundoff;
                gap.see(std::fabs(host.val_loss - one.val_loss), rel * one.val_loss, [&] {
                    return format("val %.7f against %.7f", host.val_loss, one.val_loss);
                });
            }
            double ratio = gap.ratio;
            MPI_Bcast(&ratio, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
            checks.check(ratio <= 1, what + ": the host model, given the split's weights back, evaluates as one process",
                         worst("gap", gap));
            if (grid) {
                MPI_Comm_free(&tp);
                MPI_Comm_free(&dp);
            }
        }
    }
    // Checkpoints across schemes: the split's at step 10 resumed by one process, plain data
    // parallelism and each ZeRO stage, and each of theirs resumed by the split: the resumed
    // run's first steps are one process's from the checkpoint (the first from the file it
    // loaded: the resumer took the whole state).
    {
        const TrainConfig config = split_recipe(false);
        const std::vector<std::string> schemes = {"one process", "plain", "stage 1", "stage 2", "stage 3"};
        const auto group_of = [](const std::string& scheme) -> std::shared_ptr<DataParallelGroup> {
            if (scheme == "plain") return std::make_shared<mpi::DataParallel>();
            if (scheme == "stage 1") return std::make_shared<mpi::ShardedOptimizer>();
            if (scheme == "stage 2") return std::make_shared<mpi::ShardedGradients>();
            if (scheme == "stage 3") return std::make_shared<mpi::ShardedParameters>();
            return nullptr;
        };
        const std::string split_name = std::to_string(N) + " tensor-parallel ranks";
        {
            Trainer split(config, data);
            split.use_device(std::make_unique<mpi::TensorParallelDevice>(MPI_COMM_WORLD, MPI_COMM_NULL));
            take_steps(split, 10);
            split.save(dir / "split");  // sharded: each rank writes its slices, rank 0 the whole tensors
        }
        for (const std::string& scheme : schemes) {
            const std::string ranks = scheme == "one process" ? scheme : std::to_string(N) + " ranks of " + scheme;
            // One process alone: on every rank, each its own run in a folder of its own.
            const std::filesystem::path own = dir / ("resumed_" + std::to_string(scheme == "one process" ? r : 0));
            {
                Trainer resumed = Trainer::load(dir / "split", data);
                if (const auto group = group_of(scheme)) resumed.use_group(group);
                check_resumed(checks, compare_resumed(resumed, 2, own, dir / "split"),
                              "the checkpoint of " + split_name + " at step 10 resumed by " + ranks +
                                  ": 2 steps, each one process's from the checkpoint before it");
            }
            if (scheme == "one process") {
                if (r == 0) {
                    Trainer alone(config, data);
                    take_steps(alone, 10);
                    alone.save(dir / "scheme");
                }
                MPI_Barrier(MPI_COMM_WORLD);
            } else {
                Trainer saver(config, data);
                saver.use_group(group_of(scheme));
                take_steps(saver, 10);
                saver.save(dir / "scheme");
            }
            Trainer split = Trainer::load(dir / "scheme", data);
            split.use_device(std::make_unique<mpi::TensorParallelDevice>(MPI_COMM_WORLD, MPI_COMM_NULL));
            check_resumed(checks, compare_resumed(split, 2, dir / "resumed_0", dir / "scheme"),
                          "the checkpoint of " + ranks + " at step 10 resumed by " + split_name +
                              ": 2 steps, each one process's from the checkpoint before it");
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 0) std::filesystem::remove_all(dir);

    // What the split does not do is refused in one line.
    const GPTConfig config = small_model();
    if (N > 1) {
        GPTConfig heads = config;
        heads.n_head = N + 1;  // does not divide among N > 1 ranks
        heads.n_embd = 8 * (N + 1);
        std::string said;
        try {
            mpi::TensorParallelGPT bad(GPT(heads, 5), MPI_COMM_WORLD);
        } catch (const std::invalid_argument& e) {
            said = e.what();
        }
        checks.check(said.find("heads do not divide") != std::string::npos,
                     std::to_string(N + 1) + " heads on " + std::to_string(N) + " ranks are refused", said);
    }
    {
        GPTConfig dropout = config;
        dropout.dropout = 0.1f;
        std::string said;
        try {
            mpi::TensorParallelGPT bad(GPT(dropout, 5), MPI_COMM_WORLD);
        } catch (const std::invalid_argument& e) {
            said = e.what();
        }
        checks.check(said.find("dropout") != std::string::npos, "dropout is refused", said);
    }

    return checks.finish();
}
