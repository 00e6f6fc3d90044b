// ZeRO stages 1, 2 and 3 (attn/mpi/zero.hpp) on N ranks against one process: N ranks, each
// keeping AdamW's moments (stage 1), the summed gradients too (stage 2) and the parameters
// too (stage 3) for its shard of the parameters only, take each of 20 steps as one process
// takes it from the ranks' checkpoint before it (loss, gradient norm, AdamW's moments,
// weights, step count, to the rounding of one step; the evaluation at the end), with
// dropout and without; every rank holds the same weights, bit for bit; each rank's moments,
// gradients and (stage 3) weights are its shard's bytes and the named buffers, measured; what
// each rank sends per step, counted by the ring collectives, is what the ring's arithmetic
// says (stage 3: 1.5 times stage 1's). Checkpoints across schemes: one process, plain data
// parallelism and each stage save one at step 10, and each of the five resumes each one, its
// first steps one process's from the checkpoint (the checkpoint holds the whole weights and
// optimizer state, and the resumer takes all of it).
//
// Run as `mpirun -np N zero_test` (N = 1, 2, 3, 4; CTest does).
#include "mpi_test.hpp"
#include "training.hpp"

#include "attn/data.hpp"
#include "attn/gpt.hpp"
#include "attn/threads.hpp"
#include "attn/mpi/data_parallel.hpp"
#include "attn/mpi/world.hpp"
#include "attn/mpi/zero.hpp"
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

// The tiny recipe with a batch that 1, 2, 3 and 4 ranks share evenly, 20 steps.
TrainConfig recipe(float dropout) { return tiny_recipe(12, 20, dropout); }

// The group of each scheme ("one": none, one process alone).
std::shared_ptr<mpi::DataParallel> group_of(const std::string& scheme) {
    if (scheme == "stage 1") return std::make_shared<mpi::ShardedOptimizer>();
    if (scheme == "stage 2") return std::make_shared<mpi::ShardedGradients>();
    if (scheme == "stage 3") return std::make_shared<mpi::ShardedParameters>();
    return std::make_shared<mpi::DataParallel>();
}

std::shared_ptr<mpi::ZeroGroup> zero_group_of(const std::string& stage) {
    return std::static_pointer_cast<mpi::ZeroGroup>(group_of(stage));
}

// The floats of rank r's piece of every gradient bucket (stage 2's shard).
std::size_t pieces_of(const GPT& model, int r, int N) {
    std::size_t n = 0;
    for (const GradientBucket& b : model.gradient_buckets()) n += shard_of(b.size, r, N).size();
    return n;
}

}  // namespace

int main(int argc, char** argv) {
    mpi::World world(argc, argv);
    world.share_cpus();
    Checks checks;
    const int N = world.size(), r = world.rank();
    const TextDataset data = make_dataset(generated_text());
    const std::size_t P = Trainer(recipe(0.0f), data).model().parameters().size();
    checks.note("ZeRO stages 1, 2 and 3 on " + std::to_string(N) + " rank" + (N == 1 ? "" : "s") + ", batch 12 = " +
                std::to_string(N) + " x " + std::to_string(12 / N) + ", " + std::to_string(P) + " parameters, shards " +
                std::to_string(shard_of(P, 0, N).size()) + " to " + std::to_string(shard_of(P, N - 1, N).size()));

    // Each step is compared with one process's from the same checkpoint, with the bounds of
    // one step that training.hpp derives (a chain of sums regrouped: the ring adds the ranks'
    // partial sums of B·T/N rows each in another order than one process's B·T rows). The wrong
    // versions tried (the norm of one shard, no all-gather, the ring's order off by one, no
    // share; in stage 2 no share, or the next rank's piece of a bucket kept; in stage 3 the
    // backward pass reading the last block the forward pass gathered, the forward pass
    // gathering block l's bucket index for block l, a rank's own piece put one float off, or
    // the ring receiving the piece the rank itself sends) moved the losses or the norms by 5e-4
    // to 7e-2 relative, far beyond those bounds.
    const fs::path dir = job_folder("attn_zero_test");

    // Plain data parallelism, the scheme the stages are measured against (lesson 21's
    // "plain" rows): each rank holds the model's whole gradient buffer per thread's slice of
    // the batch and, with the overlapped schedule's packed buckets, a second whole copy, 4P
    // bytes (DataParallel::gradient_bytes); summed in place (BucketPlan::view) or after the
    // pass (one allreduce of the model's buffer), no copy. Every combination of the two.
    {
        const std::size_t slices = static_cast<std::size_t>(std::min(12 / N, num_threads()));
        for (const mpi::AllreduceSchedule schedule : {mpi::AllreduceSchedule::overlapped, mpi::AllreduceSchedule::after}) {
            for (const bool view : {false, true}) {
                mpi::BucketPlan plan;
                plan.view = view;
                Trainer plain(recipe(0.0f), data);
                plain.use_group(std::make_shared<mpi::DataParallel>(schedule, plan));
                take_steps(plain, 2);
                const bool packed = schedule == mpi::AllreduceSchedule::overlapped && !view;
                const std::size_t expected = sizeof(float) * (slices * P + (packed ? P : 0));
                const MemoryUse use = plain.memory_use();
                checks.check(use.gradients == expected,
                             std::string("plain, ") + mpi::schedule_name(schedule) +
                                 (!packed ? view ? ", in place" : "" : ", packed buckets") +
                                 ": each rank's gradients are a whole buffer per thread" +
                                 (packed ? " and the buckets' packed copy, 4P bytes" : ", no copy"),
                             format("%.0f bytes measured, %.0f expected (%.0f for one whole buffer)",
                                    double(use.gradients), double(expected), double(sizeof(float) * P)));
                checks.check(use.weights == sizeof(float) * P && use.optimizer == 2 * sizeof(float) * P,
                             std::string("plain, ") + mpi::schedule_name(schedule) +
                                 ": each rank's weights and moments are the whole model's, 4P and 8P bytes");
            }
        }
    }

    for (const std::string stage : {"stage 1", "stage 2", "stage 3"}) {
        for (float dropout : {0.0f, 0.1f}) {
            const TrainConfig config = recipe(dropout);
            const std::string what = stage + ", dropout " + (dropout > 0 ? "0.1" : "0");
            Trainer shared(config, data), unsaved(config, data);
            const std::shared_ptr<mpi::ZeroGroup> group = zero_group_of(stage);
            shared.use_group(group);
            unsaved.use_group(zero_group_of(stage));
            check_steps(checks, compare_steps(shared, unsaved, 20, dir / "run"), what);
            // stage 3's shards gathered: every rank calls whole_parameters
            checks.check(same_on_every_rank(shared.whole_parameters()),
                         what + ": every rank holds the same weights, bit for bit");

            // Memory: this rank's moments are its shard's, m and v in float32 (stage 2: its
            // piece of every bucket).
            const GPT& model = shared.model();
            const std::size_t mine = stage == "stage 1" ? shard_of(P, r, N).size() : pieces_of(model, r, N);
            const std::size_t bytes = shared.optimizer().bytes(), expected = 2 * sizeof(float) * mine;
            checks.check(bytes == expected, what + ": each rank's AdamW moments hold its shard alone, 8 bytes a parameter",
                         format("%.0f bytes measured, %.0f for the shard (%.0f for the whole model)", double(bytes),
                                double(expected), double(2 * sizeof(float) * P)));
            // Traffic: a ring's rank r sends every shard but its own in the reduce-scatter and
            // every shard but the next rank's in the all-gather (stage 2: of every bucket); the
            // norm is one double.
            std::size_t rs = 0, ag = 0;
            if (N > 1 && stage == "stage 1") {
                rs = sizeof(float) * (P - shard_of(P, r, N).size());
                ag = sizeof(float) * (P - shard_of(P, (r + 1) % N, N).size());
            } else if (N > 1) {
                for (const GradientBucket& b : model.gradient_buckets()) {
                    rs += sizeof(float) * (b.size - shard_of(b.size, r, N).size());
                    ag += sizeof(float) * (b.size - shard_of(b.size, (r + 1) % N, N).size());
                }
                // Stage 3 gathers every bucket twice, before the forward and the backward pass.
                if (stage == "stage 3") ag *= 2;
            }
            const std::size_t norm = N > 1 ? sizeof(double) : 0;
            const mpi::ZeroTraffic& t = group->last_traffic();
            checks.check(t.reduce_scatter_bytes == rs && t.all_gather_bytes == ag && t.norm_bytes == norm,
                         what + ": the bytes each rank sends in a step are the ring's (every shard but its own, "
                         "every shard but the next rank's; stage 3 gathers twice)",
                         format("reduce-scatter %.0f (expected %.0f), all-gather %.0f", double(t.reduce_scatter_bytes),
                                double(rs), double(t.all_gather_bytes)) +
                             format(" (expected %.0f)", double(ag)));
            // The gradients this rank holds. Stage 1: the model's whole buffer per thread's
            // slice of the batch, and the ring's buffer for a piece received (at most 64 KiB).
            // Stage 2: its pieces, the model's one block and the embeddings' per thread
            // (GPT::set_gradient_sink), and the rings' buffers for a piece sent and received.
            const MemoryUse use = shared.memory_use();
            const std::vector<GradientBucket>& buckets = model.gradient_buckets();
            const std::size_t slices = static_cast<std::size_t>(std::min(12 / N, num_threads()));
            std::size_t held = 0, largest = 0;
            if (stage == "stage 1") {
                held = sizeof(float) * (slices * P + mpi::ring_buffer_floats(P, N));
            } else {
                for (const GradientBucket& b : buckets) largest = std::max(largest, mpi::ring_buffer_floats(b.size, N));
                // stage 3 has no all-gather after the step, so no buffer for a piece sent
                const std::size_t rings = stage == "stage 2" ? 2 : 1;
                held = sizeof(float) * (mine + slices * (buckets[0].size + buckets.back().size) + rings * largest);
            }
            checks.check(use.gradients == held,
                         what + (stage == "stage 1" ? ": each rank's gradients are a whole buffer per thread and the "
                                                      "ring's buffer"
                                                    : ": each rank's gradients are its pieces, one block's and the "
                                                      "embeddings' per thread, and the rings' buffers"),
                         format("%.0f bytes measured, %.0f expected (%.0f for one whole buffer)", double(use.gradients),
                                double(held), double(sizeof(float) * P)));
            if (stage != "stage 1") {
                checks.check(model.gradients().empty(), what + ": the model keeps no whole gradient buffer");
            }
            // The weights. Stages 1 and 2: the model's whole buffer. Stage 3: this rank's pieces,
            // and the model's buffers of two blocks (one computing, the next one's gather
            // arriving) and of the embeddings (GPT::set_weight_source).
            const std::size_t weight_bytes =
                sizeof(float) * (stage == "stage 3" ? mine + 2 * buckets[0].size + buckets.back().size : P);
            checks.check(use.weights == weight_bytes,
                         what + (stage == "stage 3" ? ": each rank's weights are its pieces, two blocks' and the "
                                                      "embeddings'"
                                                    : ": each rank's weights are the whole model's"),
                         format("%.0f bytes measured, %.0f expected (%.0f for the whole model)", double(use.weights),
                                double(weight_bytes), double(sizeof(float) * P)));
            if (stage == "stage 3") {
                checks.check(model.parameters().empty(), what + ": the model keeps no whole parameter buffer");
                // Stage 3 moves 1.5 times what data parallelism's ring allreduce moves, 2(N − 1)/N
                // of the parameters' bytes (the paper's 3Ψ against 2Ψ), to within the shards'
                // unevenness: each bucket's ring sends all but one piece.
                const double allreduce = 2.0 * (N - 1) / N * sizeof(float) * static_cast<double>(P);
                const double ratio = N > 1 ? double(t.reduce_scatter_bytes + t.all_gather_bytes) / allreduce : 1.5;
                checks.check(std::abs(ratio - 1.5) < 1e-3, what + ": a step sends 1.5 times what data parallelism sends",
                             format("ratio %.5f", ratio));
            }
        }
    }

    // Resuming across schemes: the checkpoint holds the whole optimizer state, and each
    // scheme takes all of it. The resumed run's first step is one process's from the
    // checkpoint it loaded, the second one process's from its own.
    const TrainConfig config = recipe(0.1f);
    const std::vector<std::string> schemes = {"one", "plain", "stage 1", "stage 2", "stage 3"};
    for (const std::string& saver : schemes) {
        const fs::path saved = dir / ("saved_" + std::to_string(&saver - schemes.data()));
        if (saver == "one") {
            if (r == 0) {
                Trainer alone(config, data);
                take_steps(alone, 10);
                alone.save(saved);
            }
            MPI_Barrier(MPI_COMM_WORLD);
        } else {
            Trainer shared(config, data);
            shared.use_group(group_of(saver));
            take_steps(shared, 10);
            shared.save(saved);  // rank 0 writes it, the others wait
            if (saver != "plain") {
                const Trainer whole = Trainer::load(saved, data);
                checks.check(whole.optimizer().m.size() == P && whole.optimizer().v.size() == P,
                             saver + "'s checkpoint holds every parameter's moments",
                             format("%.0f moments for %.0f parameters", double(whole.optimizer().m.size()), double(P)));
            }
        }
        for (const std::string& resumer : schemes) {
            Trainer resumed = Trainer::load(saved, data);
            if (resumer != "one") resumed.use_group(group_of(resumer));
            // One process alone: on every rank, each its own run in a folder of its own.
            const fs::path own = dir / ("resumed_" + std::to_string(resumer == "one" ? r : 0));
            check_resumed(checks, compare_resumed(resumed, 2, own, saved),
                          (saver == "one" ? "one process" : std::to_string(N) + " ranks of " + saver) +
                              ": the checkpoint at step 10 resumed by " +
                              (resumer == "one" ? "one process" : std::to_string(N) + " ranks of " + resumer) +
                              ": 2 steps, each one process's from the checkpoint before it");
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (r == 0) fs::remove_all(dir);
    return checks.finish();
}
