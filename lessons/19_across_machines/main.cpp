// Lesson 19: when one machine is not enough. The page that narrates this program is lesson.md
// beside it.
//
// It starts as one process, as every lesson does, and runs the parts that need several
// processes by starting itself again under mpirun, as 1, 2 and 4 ranks on this machine (more
// ranks than cores is allowed): the environment variable ATTN_LESSON19_PART tells a rank
// which part it runs, and rank 0 prints that part's numbers as `key value…` lines, which this
// process reads and explains. Built without MPI, it runs the parts of one process and says
// what it left out.
// Timed: this program prints measured times, so CTest runs it with nothing beside it (RUN_SERIAL).
#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/flash.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/partial_attention.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"
#include "attn/threads.hpp"
#include "attn/trainer.hpp"

#ifdef ATTN_HAVE_MPI
#include "attn/mpi/data_parallel.hpp"
#include "attn/mpi/launch.hpp"
#include "attn/mpi/parts.hpp"
#include "attn/mpi/ring_attention.hpp"
#include "attn/mpi/ulysses.hpp"
#include "attn/mpi/world.hpp"
#include <mpi.h>
#include <csignal>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;

namespace {

std::vector<float> normal_buffer(Rng& rng, std::size_t n) {
    std::vector<float> x(n);
    for (float& e : x) e = rng.normal();
    return x;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double worst = 0.0;
    for (std::size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
    return worst;
}

#ifdef ATTN_HAVE_MPI
double median(std::vector<double> x) {  // of the ranks' timings
    std::sort(x.begin(), x.end());
    const std::size_t n = x.size();
    return n == 0 ? 0.0 : n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

std::string mib(double bytes) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f MiB", bytes / (1 << 20));
    return buf;
}
#endif

// The settings every part shares: small with --quick (for the tests), the lesson's otherwise.
struct Sizes {
    bool quick = false;
    std::string recipe;         // the model data parallelism trains
    int steps = 10;             // the steps whose losses are compared
    int timed_steps = 20;       // the steps timed per schedule
    int kill_steps = 60;        // the run a rank is killed in
    int kill_at = 25;           // the step after which rank 2 is killed
    int checkpoint_every = 10;  // evaluations and checkpoints
    std::size_t T_equal = 4096, T_long = 16384;  // ring and Ulysses: compared, and long
    std::size_t NH = 4, hs = 64;
    int allreduce_repeats = 25;  // MPI_Allreduce timed alone: the fastest of these calls
};

Sizes sizes(bool quick) {
    Sizes s;
    s.quick = quick;
    s.recipe = quick ? "tiny" : "cpu";
    if (quick) {
        s.steps = 3;
        s.timed_steps = 2;
        s.kill_steps = 8;
        s.kill_at = 5;
        s.checkpoint_every = 2;
        s.T_equal = 256;
        s.T_long = 512;
        s.allreduce_repeats = 3;
    }
    return s;
}

// The recipe data parallelism trains: nanoGPT's CPU recipe (batch 12: shared 12, 6 + 6 or
// 3 + 3 + 3 + 3), or with --quick the tiny one with a batch of 8.
TrainConfig dp_recipe(const Sizes& s) {
    TrainConfig c = TrainConfig::named(s.recipe);
    if (s.quick) c.batch_size = 8;
    c.eval_iters = 2;
    return c;
}

// The micro-batches of a step in the lesson's gradient accumulation.
constexpr int accumulated_micro_batches = 4;

// ---------------------------------------------------------------------------------------
// Part 1, one process: the merge

void merge_by_hand() {
    print_heading("Two partial attentions, merged by their log-sum-exps");
    // One query row, 8 keys of head size 4: its attention over the first 3 keys, over the
    // other 5, and over all 8, each computed alone (lesson 13's tiled forward).
    Rng rng(1919);
    const std::size_t hs = 4, keys = 8, first = 3;
    const std::vector<float> q = normal_buffer(rng, hs), k = normal_buffer(rng, keys * hs),
                             v = normal_buffer(rng, keys * hs);
    auto attend = [&](std::size_t begin, std::size_t end, std::vector<float>& out, float& lse) {
        // The one query against keys [begin, end): a problem of its own, T keys, no mask.
        const std::size_t n = end - begin;
        std::vector<float> qq(n * hs, 0.0f), o(n * hs), l(n);
        std::copy(q.begin(), q.end(), qq.begin());  // row 0 is our query; the others are unused
        attention_flash_forward(o.data(), l.data(), qq.data(), k.data() + begin * hs, v.data() + begin * hs,
                                AttentionShape{1, 1, n, hs, false});
        out.assign(o.begin(), o.begin() + static_cast<std::ptrdiff_t>(hs));
        lse = l[0];
    };
    std::vector<float> out_a, out_b, out_all;
    float lse_a = 0, lse_b = 0, lse_all = 0;
    attend(0, first, out_a, lse_a);
    attend(first, keys, out_b, lse_b);
    attend(0, keys, out_all, lse_all);
    auto show = [](const char* what, const std::vector<float>& o, float lse) {
        std::printf("%-34s lse %8.5f   out [%8.5f %8.5f %8.5f %8.5f]\n", what, static_cast<double>(lse),
                    static_cast<double>(o[0]), static_cast<double>(o[1]), static_cast<double>(o[2]),
                    static_cast<double>(o[3]));
    };
    show("keys 0-2 alone:", out_a, lse_a);
    show("keys 3-7 alone:", out_b, lse_b);
    //! [merge_call]
    std::vector<float> merged = out_a;
    float merged_lse = lse_a;
    merge_partial_attention(merged.data(), &merged_lse, out_b.data(), &lse_b, 1, hs);
    //! [merge_call]
    show("merged:", merged, merged_lse);
    show("all 8 keys at once:", out_all, lse_all);
    std::vector<float> wrong = out_a;
    float wrong_lse = lse_a;
    merge_adding_log_sum_exps(wrong.data(), &wrong_lse, out_b.data(), &lse_b, 1, hs);
    show("log-sum-exps added (WRONG):", wrong, wrong_lse);
    const double gap = std::max(max_abs_diff(merged, out_all), std::fabs(double(merged_lse) - lse_all));
    const double wrong_gap = std::max(max_abs_diff(wrong, out_all), std::fabs(double(wrong_lse) - lse_all));
    std::printf("merged against all at once: largest difference %.1e; added: %.2f\n", gap, wrong_gap);
    print_claim("merge_by_hand_gap", gap < 1e-6 ? "below 1e-6" : "ABOVE 1e-6");
    print_claim("merge_by_hand_wrong_gap", wrong_gap, 2);
}

// Gradient accumulation in one process: 4 micro-batches of B, their gradients added, against
// one batch of 4B on the same sequences, from the same weights.
void gradient_accumulation(const Sizes& s, const fs::path& corpus) {
    const int N = accumulated_micro_batches;
    //! [accumulate_use]
    TrainConfig micro = dp_recipe(s);
    micro.grad_accum = N;      // N micro-batches of batch_size a step (nanoGPT's gradient_accumulation_steps)
    micro.grad_clip = 0.0f;    // the gradients compared as the passes leave them
    TrainConfig large = micro;
    large.grad_accum = 1;
    large.batch_size = N * micro.batch_size;  // the same sequences in one batch
    //! [accumulate_use]
    print_heading("Gradient accumulation: " + std::to_string(N) + " micro-batches of " +
                  std::to_string(micro.batch_size) + " against one batch of " + std::to_string(large.batch_size));
    const TextDataset data = make_dataset(read_corpus(corpus));
    Trainer accumulated(micro, data), one_batch(large, data);  // the same weights and batch source
    const StepRecord a = accumulated.train_step(), b = one_batch.train_step();
    const std::vector<float>& ga = accumulated.model().gradients();
    const std::vector<float>& gb = one_batch.model().gradients();
    double largest = 0.0;
    for (float g : gb) largest = std::max(largest, std::fabs(static_cast<double>(g)));
    const double gap = max_abs_diff(ga, gb) / largest;
    // Higham's γ_n = n·u/(1 − n·u): one float32 sum of n terms, in any order, is within γ_{n−1}
    // of the sum of their magnitudes; the weights' gradients end with a sum over the rows.
    const double rows = static_cast<double>(large.batch_size) * large.block_size, u = 0x1p-24;
    const double gamma = rows * u / (1.0 - rows * u);
    const double mib_a = static_cast<double>(accumulated.memory_use().activations) / (1 << 20);
    const double mib_b = static_cast<double>(one_batch.memory_use().activations) / (1 << 20);
    std::printf("the %s recipe, one step from the same weights on the same %d sequences, unclipped\n\n",
                micro.recipe.c_str(), large.batch_size);
    std::printf("%-34s  %12s  %13s  %11s\n", "", "loss", "gradient norm", "activations");
    char label[64];
    std::snprintf(label, sizeof label, "%d micro-batches of %d, added", N, micro.batch_size);
    std::printf("%-34s  %12.7f  %13.7f  %7.1f MiB\n", label, static_cast<double>(a.loss),
                static_cast<double>(a.grad_norm), mib_a);
    std::snprintf(label, sizeof label, "one batch of %d", large.batch_size);
    std::printf("%-34s  %12.7f  %13.7f  %7.1f MiB\n", label, static_cast<double>(b.loss),
                static_cast<double>(b.grad_norm), mib_b);
    char gap_text[32], gamma_text[32];
    std::snprintf(gap_text, sizeof gap_text, "%.1e", gap);
    std::snprintf(gamma_text, sizeof gamma_text, "%.1e", gamma);
    std::printf("\nlargest gradient gap: %s of the largest gradient; gamma_n of one float32 sum over the\n"
                "n = %.0f rows of the batch: %s (the sums before it add their own terms to n)\n",
                gap_text, rows, gamma_text);
    print_claim("accum_micro_batches", std::to_string(N));
    print_claim("accum_batch", std::to_string(micro.batch_size));
    print_claim("accum_large_batch", std::to_string(large.batch_size));
    print_claim("accum_rows", std::to_string(static_cast<long long>(rows)));
    print_claim("accum_gap", gap_text);
    print_claim("accum_gamma", gamma_text);
    print_claim("accum_activations_mib", mib_a, 1);
    print_claim("accum_large_activations_mib", mib_b, 1);
    print_claim("accum_activations_ratio", mib_b / mib_a, 2);
}

// The causal blocks each rank computes, for a split of 2N (zigzag) or N (contiguous) pieces.
void causal_blocks(const LessonOptions& options) {
    print_heading("Which causal blocks each of 4 ranks computes");
    for (SequenceOrder order : {SequenceOrder::contiguous, SequenceOrder::zigzag}) {
        const SequenceSplit split{64, 4, order};
        const std::size_t P = split.pieces();
        std::vector<int> owner(P);
        for (std::size_t r = 0; r < 4; ++r) {
            for (std::size_t p : split.pieces_of(r)) owner[p] = static_cast<int>(r);
        }
        std::printf("%s: query piece (its rank) against key pieces; the digit is the rank that\n"
                    "computes the block, '.' a block wholly in the future (skipped)\n",
                    sequence_order_name(order));
        Tensor2 picture = xt::zeros<float>({P, P});
        std::vector<std::string> rows, cols;
        for (std::size_t qi = 0; qi < P; ++qi) {
            std::printf("  q%zu (rank %d)  ", qi, owner[qi]);
            for (std::size_t kj = 0; kj < P; ++kj) {
                const BlockMask mask = block_mask(qi, kj, true);
                std::printf("%c", mask == BlockMask::skipped ? '.' : static_cast<char>('0' + owner[qi]));
                picture(qi, kj) = mask == BlockMask::skipped ? 0.0f : 0.25f * static_cast<float>(owner[qi] + 1);
            }
            std::printf("\n");
            rows.push_back("q" + std::to_string(qi) + " r" + std::to_string(owner[qi]));
            cols.push_back("k" + std::to_string(qi));
        }
        std::printf("  (query, key) pairs per rank at T = 64:");
        std::size_t most = 0, total = 0;
        for (std::size_t r = 0; r < 4; ++r) {
            const std::size_t pairs = attention_pairs(split, r, true);
            std::printf(" %zu", pairs);
            most = std::max(most, pairs);
            total += pairs;
        }
        const double imbalance = static_cast<double>(most) / (static_cast<double>(total) / 4);
        std::printf("; the busiest rank does %.2fx the mean\n\n", imbalance);
        print_claim(std::string("pairs_imbalance_") + sequence_order_name(order), imbalance, 2);
        if (!options.figures.empty()) {
            heatmap_png(options.figures / (std::string("lesson19_blocks_") + sequence_order_name(order) + ".png"),
                        picture, rows, cols,
                        std::string(sequence_order_name(order)) + ": the rank computing each causal block (shade)");
        }
    }
}

#ifdef ATTN_HAVE_MPI
// ---------------------------------------------------------------------------------------
// The ranks' side: each part runs on every rank; rank 0 prints `key value…` lines.

struct Part {
    mpi::World& world;
    Sizes s;
    fs::path corpus, out;
    void say(const std::string& key, const std::vector<double>& values) const { mpi::say(key, values); }
    // One number from every rank, on rank 0 in rank order.
    std::vector<double> gather(double value) const { return mpi::gather_from_ranks(value); }
    double max_over_ranks(double value) const {
        double m = 0.0;
        MPI_Allreduce(&value, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        return m;
    }
};

// The ways of summing the gradients that the lesson times: the bucket per block of the
// library, the same summed in place (DDP's gradient_as_bucket_view), DDP's default caps (a
// first bucket of 1 MiB, then 25 MiB), and one allreduce after the backward pass.
struct SumPlan {
    const char* key;
    const char* label;
    mpi::AllreduceSchedule schedule;
    mpi::BucketPlan plan;
};

std::vector<SumPlan> sum_plans() {
    using mpi::AllreduceSchedule;
    return {{"overlapped", "per block", AllreduceSchedule::overlapped, {}},
            {"view", "in place", AllreduceSchedule::overlapped, {0, 0, true}},
            {"ddp", "1+25 MiB", AllreduceSchedule::overlapped, {mpi::bucket_cap_bytes(25), mpi::bucket_cap_bytes(1), false}},
            {"after", "after", AllreduceSchedule::after, {}}};
}

// Data parallelism: 10 steps to compare with one rank, the ways of summing timed, and
// MPI_Allreduce timed alone on a few sizes.
void data_parallel_part(const Part& part) {
    const TextDataset data = make_dataset(read_corpus(part.corpus));
    const TrainConfig config = dp_recipe(part.s);
    Trainer trainer(config, data);
    //! [dp]
    auto group = std::make_shared<mpi::DataParallel>(mpi::AllreduceSchedule::overlapped);
    trainer.use_group(group);  // each rank: its share of every batch; the gradients summed
    std::vector<double> losses, norms;
    for (int i = 0; i < part.s.steps; ++i) {
        const StepRecord r = trainer.train_step();
        losses.push_back(r.loss);
        norms.push_back(r.grad_norm);
    }
    trainer.save(part.out);  // rank 0 writes it; the others wait until it is written
    //! [dp]
    part.say("losses", losses);
    part.say("norms", norms);
    bool identical = true;
    try {
        group->check_same(trainer.state_fingerprint(), "the weights");
    } catch (const std::runtime_error&) {
        identical = false;
    }
    part.say("identical", {identical ? 1.0 : 0.0});
    part.say("parameters", {static_cast<double>(trainer.model().parameters().size())});
    {
        // One step of 4 micro-batches: their gradients stay on each rank, summed once after
        // the last (DDP's no_sync); the group counts its sums and allreduce calls.
        TrainConfig accumulating = config;
        accumulating.grad_accum = accumulated_micro_batches;
        Trainer accumulated(accumulating, data);
        auto counted = std::make_shared<mpi::DataParallel>(mpi::AllreduceSchedule::overlapped);
        accumulated.use_group(counted);
        accumulated.train_step();
        part.say("accumulated", {static_cast<double>(counted->gradient_sums()),
                                 static_cast<double>(counted->allreduce_calls())});
    }

    for (const SumPlan& sums : sum_plans()) {
        auto timed = std::make_shared<mpi::DataParallel>(sums.schedule, sums.plan);
        trainer.use_group(timed);
        std::vector<double> step, backward, exposed, skew, communication;
        for (int i = 0; i < 2 + part.s.timed_steps; ++i) {  // 2 warm-up steps
            MPI_Barrier(MPI_COMM_WORLD);
            const double start = mpi::wall_seconds();
            trainer.train_step();
            const double took = part.max_over_ranks(mpi::wall_seconds() - start);
            if (i < 2) continue;
            step.push_back(took);
            backward.push_back(part.max_over_ranks(timed->last_timing().backward_seconds));
            exposed.push_back(part.max_over_ranks(timed->last_timing().exposed_seconds));
            // The wait splits in two: until the last rank hands in its gradients (skew: no sum
            // can finish before every rank has), then communication.
            const double last_hand_in = part.max_over_ranks(timed->last_timing().handed_in);
            const double waited = std::max(0.0, last_hand_in - timed->last_timing().backward_end);
            skew.push_back(part.max_over_ranks(waited));
            communication.push_back(part.max_over_ranks(
                std::max(0.0, timed->last_timing().exposed_seconds - waited)));
        }
        part.say(std::string("time_") + sums.key,
                 {median(step), median(backward), median(exposed),
                  static_cast<double>(timed->last_timing().allreduce_calls), median(skew),
                  median(communication), static_cast<double>(timed->last_timing().buckets)});
    }

    // MPI_Allreduce alone, on the gradient's size and on others, for the cost model: the
    // fastest of several calls, the one least disturbed by other programs on the machine.
    const std::size_t P = trainer.model().parameters().size();
    for (std::size_t n : {std::size_t{256}, std::size_t{16384}, P, std::size_t{1} << 22}) {
        std::vector<float> buffer(n, 1.0f);
        double fastest = INFINITY;
        for (int i = 0; i < part.s.allreduce_repeats; ++i) {
            MPI_Barrier(MPI_COMM_WORLD);
            const double start = mpi::wall_seconds();
            MPI_Allreduce(MPI_IN_PLACE, buffer.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
            fastest = std::min(fastest, part.max_over_ranks(mpi::wall_seconds() - start));
        }
        part.say("allreduce", {static_cast<double>(n * sizeof(float)), fastest});
    }
}

// A run with checkpoints in which rank 2 is killed after step kill_at (it sends itself
// SIGKILL, which no program can catch), or the run resumed from its checkpoint.
void training_part(const Part& part, bool resume) {
    const TextDataset data = make_dataset(read_corpus(part.corpus));
    TrainConfig config = dp_recipe(part.s);
    config.shorten_to(part.s.kill_steps);
    config.eval_interval = part.s.checkpoint_every;
    std::optional<Trainer> trainer;
    if (resume) trainer.emplace(Trainer::load(part.out / "checkpoint", data));
    else trainer.emplace(config, data);
    trainer->use_group(std::make_shared<mpi::DataParallel>());
    RunOptions options;
    options.out_dir = part.out;
    const int rank = part.world.rank(), kill_at = part.s.kill_at;
    Trainer& t = *trainer;
    options.stop_requested = [&t, rank, kill_at, resume] {
        if (!resume && rank == 2 && t.step() == kill_at) std::raise(SIGKILL);
        return false;
    };
    run_training(t, options);
}

// Ring attention and Ulysses attention: equal to one process, what they move, how the causal
// work is shared, and the memory per rank.
void sequence_part(const Part& part) {
    const std::size_t N = static_cast<std::size_t>(part.world.size()), rank = static_cast<std::size_t>(part.world.rank());
    const Sizes& s = part.s;
    {
        // Equality: every rank's share of the single-process reference is the heads h with
        // h % N = rank (a head is a whole attention problem of its own).
        const AttentionShape shape{1, s.NH, s.T_equal, s.hs, true};
        Rng rng(19);
        const std::size_t n = shape.qkv_size();
        const std::vector<float> q = normal_buffer(rng, n), k = normal_buffer(rng, n),
                                 v = normal_buffer(rng, n), dout = normal_buffer(rng, n);
        std::vector<float> out(n), lse(shape.rows()), dq(n), dk(n), dv(n);
        attention_fast_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), shape);
        attention_fast_backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                                out.data(), lse.data(), shape);
        auto gather_all = [&](const std::vector<float>& local, const SequenceSplit& split, std::size_t width) {
            std::vector<float> all(local.size() * N), whole(all.size());
            MPI_Allgather(local.data(), static_cast<int>(local.size()), MPI_FLOAT, all.data(),
                          static_cast<int>(local.size()), MPI_FLOAT, MPI_COMM_WORLD);
            for (std::size_t r = 0; r < N; ++r) {
                put_local_pieces(whole.data(), all.data() + r * local.size(), split, r, 1, s.NH, width);
            }
            return whole;
        };
        auto take = [&](const std::vector<float>& whole, const SequenceSplit& split) {
            std::vector<float> local(whole.size() / N);
            take_local_pieces(local.data(), whole.data(), split, rank, 1, s.NH, s.hs);
            return local;
        };
        // The largest difference from the reference over the heads this rank holds it for.
        auto gap = [&](const std::vector<float>& got, const std::vector<float>& expected, std::size_t per_head) {
            double worst = 0.0;
            for (std::size_t h = rank; h < s.NH; h += N) {
                for (std::size_t i = h * per_head; i < (h + 1) * per_head; ++i) {
                    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - expected[i]));
                }
            }
            return part.max_over_ranks(worst);
        };
        const std::size_t T = shape.T, hs = shape.hs;
        for (SequenceOrder order : {SequenceOrder::zigzag, SequenceOrder::contiguous}) {
            for (bool wrong : {false, true}) {
                if (wrong && order == SequenceOrder::contiguous) continue;
                mpi::RingAttention ring(shape, order, wrong ? merge_adding_log_sum_exps : merge_partial_attention);
                const SequenceSplit& split = ring.split();
                const std::vector<float> lq = take(q, split), lk = take(k, split), lv = take(v, split),
                                         ldout = take(dout, split);
                std::vector<float> lo(ring.local_floats()), ll(ring.local_rows()), ldq(lo.size()),
                    ldk(lo.size()), ldv(lo.size());
                //! [ring]
                ring.forward(lo.data(), ll.data(), lq.data(), lk.data(), lv.data());
                const std::size_t forward_bytes = ring.stats().bytes_sent;
                ring.backward(ldq.data(), ldk.data(), ldv.data(), ldout.data(), lq.data(), lk.data(),
                              lv.data(), lo.data(), ll.data());
                //! [ring]
                const std::string key = std::string("ring_") + (wrong ? "wrong" : sequence_order_name(order));
                part.say(key, {gap(gather_all(lo, split, hs), out, T * hs), gap(gather_all(ll, split, 1), lse, T),
                               gap(gather_all(ldq, split, hs), dq, T * hs), gap(gather_all(ldk, split, hs), dk, T * hs),
                               gap(gather_all(ldv, split, hs), dv, T * hs)});
                if (!wrong && order == SequenceOrder::zigzag) {
                    part.say("bytes_ring", {static_cast<double>(forward_bytes),
                                            static_cast<double>(ring.stats().bytes_sent)});
                }
            }
        }
        {
            mpi::UlyssesAttention ulysses(shape);
            const SequenceSplit split{T, N, SequenceOrder::contiguous};
            const std::vector<float> lq = take(q, split), lk = take(k, split), lv = take(v, split),
                                     ldout = take(dout, split);
            std::vector<float> lo(ulysses.local_floats()), ll(ulysses.local_rows()), ldq(lo.size()),
                ldk(lo.size()), ldv(lo.size());
            //! [ulysses]
            ulysses.forward(lo.data(), ll.data(), lq.data(), lk.data(), lv.data());
            const std::size_t forward_bytes = ulysses.stats().bytes_sent;
            ulysses.backward(ldq.data(), ldk.data(), ldv.data(), ldout.data());
            //! [ulysses]
            part.say("ulysses", {gap(gather_all(lo, split, hs), out, T * hs), gap(gather_all(ll, split, 1), lse, T),
                                 gap(gather_all(ldq, split, hs), dq, T * hs), gap(gather_all(ldk, split, hs), dk, T * hs),
                                 gap(gather_all(ldv, split, hs), dv, T * hs)});
            part.say("bytes_ulysses", {static_cast<double>(forward_bytes), static_cast<double>(ulysses.stats().bytes_sent)});
        }
    }
    {
        // The long sequence: the causal work per rank in each order, the time, the memory.
        const AttentionShape shape{1, s.NH, s.T_long, s.hs, true};
        for (SequenceOrder order : {SequenceOrder::contiguous, SequenceOrder::zigzag}) {
            mpi::RingAttention ring(shape, order);
            Rng rng(1900 + rank);  // this rank's own q, k, v: the work does not depend on them
            const std::vector<float> q = normal_buffer(rng, ring.local_floats()),
                                     k = normal_buffer(rng, ring.local_floats()),
                                     v = normal_buffer(rng, ring.local_floats()),
                                     dout = normal_buffer(rng, ring.local_floats());
            std::vector<float> out(ring.local_floats()), lse(ring.local_rows()), dq(out.size()), dk(out.size()),
                dv(out.size());
            const std::size_t resident = mpi::resident_bytes();
            mpi::reset_peak_resident();
            MPI_Barrier(MPI_COMM_WORLD);
            double start = mpi::wall_seconds();
            ring.forward(out.data(), lse.data(), q.data(), k.data(), v.data());
            const double forward_wall = part.max_over_ranks(mpi::wall_seconds() - start);
            const std::string key = std::string("long_") + sequence_order_name(order);
            part.say(key + "_cpu", part.gather(ring.stats().compute_seconds));
            part.say(key + "_pairs", part.gather(static_cast<double>(ring.stats().pairs)));
            part.say(key + "_wait", part.gather(ring.stats().wait_seconds));
            const std::size_t forward_floats = ring.stats().peak_floats;
            double backward_wall = 0.0;
            if (order == SequenceOrder::zigzag) {
                MPI_Barrier(MPI_COMM_WORLD);
                start = mpi::wall_seconds();
                ring.backward(dq.data(), dk.data(), dv.data(), dout.data(), q.data(), k.data(), v.data(),
                              out.data(), lse.data());
                backward_wall = part.max_over_ranks(mpi::wall_seconds() - start);
                const double grown = static_cast<double>(mpi::peak_resident_bytes()) - static_cast<double>(resident);
                part.say("long_memory", {static_cast<double>(ring.local_floats()), static_cast<double>(forward_floats),
                                         static_cast<double>(ring.stats().peak_floats),
                                         part.max_over_ranks(std::max(0.0, grown))});
            }
            part.say(key + "_wall", {forward_wall, backward_wall});
        }
    }
}

int run_part(const char* name, int argc, char** argv) {
    return mpi::run_rank(argc, argv, "lesson_19", [name](mpi::World& world) {
        world.share_cpus();
        const Part part{world, sizes(mpi::environment("ATTN_LESSON19_QUICK") == "1"),
                        mpi::environment("ATTN_LESSON19_CORPUS"), mpi::environment("ATTN_LESSON19_OUT")};
        const std::string which = name;
        if (which == "dp") data_parallel_part(part);
        else if (which == "train") training_part(part, false);
        else if (which == "resume") training_part(part, true);
        else if (which == "sequence") sequence_part(part);
        else throw std::invalid_argument("unknown part " + which);
    });
}

// ---------------------------------------------------------------------------------------
// This process's side: it starts the ranks, reads their numbers and explains them.

using mpi::need;
using mpi::Numbers;

struct Launcher {
    Sizes s;
    fs::path corpus, scratch;
    // Runs `part` on `ranks` ranks and returns what rank 0 printed. A job that does not end
    // well is an error, unless `ended` is given (a rank will be killed).
    Numbers run(const std::string& part, int ranks, const fs::path& out, mpi::LaunchResult* ended = nullptr) const {
        mpi::LaunchOptions options;
        options.ranks = ranks;
        options.environment = {"ATTN_LESSON19_PART=" + part, "ATTN_LESSON19_QUICK=" + std::string(s.quick ? "1" : "0"),
                               "ATTN_LESSON19_CORPUS=" + corpus.string(), "ATTN_LESSON19_OUT=" + out.string()};
        return mpi::run_part(options, part, ended);
    }
};

double largest_relative_gap(const std::vector<double>& a, const std::vector<double>& b) {
    double worst = 0.0;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), 1e-30));
    }
    return worst;
}

double weight_gap(const fs::path& a, const fs::path& b) {
    const std::vector<float> wa = load_checkpoint(a).parameters(), wb = load_checkpoint(b).parameters();
    double gap = 0.0, scale = 0.0;
    for (std::size_t i = 0; i < wa.size(); ++i) {
        gap = std::max(gap, std::fabs(static_cast<double>(wa[i]) - wb[i]));
        scale = std::max(scale, std::fabs(static_cast<double>(wb[i])));
    }
    return gap / scale;
}

struct DataParallelPoints {
    double P = 0;                          // parameters
    std::map<int, Numbers> by_ranks;       // 1, 2, 4
};

DataParallelPoints data_parallel(const Launcher& launcher) {
    print_heading("Data parallelism: N ranks of batch B/N against one of batch B");
    const TrainConfig config = dp_recipe(launcher.s);
    std::printf("the %s recipe, batch %d, %d steps, on 1, 2 and 4 ranks of this machine (%d CPUs)\n\n",
                config.recipe.c_str(), config.batch_size, launcher.s.steps, thread_config().cpus);
    DataParallelPoints points;
    for (int N : {1, 2, 4}) {
        points.by_ranks[N] = launcher.run("dp", N, launcher.scratch / ("dp" + std::to_string(N)));
    }
    const Numbers& one = points.by_ranks[1];
    points.P = need(one, "parameters")[0];
    std::printf("%5s  %-12s  %12s  %12s  %22s  %s\n", "ranks", "shares", "first loss", "last loss",
                "largest gap from 1 rank", "every rank the same weights");
    double worst_loss = 0, worst_weight = 0;
    bool all_identical = true;
    for (int N : {1, 2, 4}) {
        const Numbers& n = points.by_ranks[N];
        const std::vector<double>& losses = need(n, "losses");
        std::string shares;
        for (int r = 0; r < N; ++r) {
            const auto [b0, b1] = batch_share(config.batch_size, r, N);
            shares += (r ? "+" : "") + std::to_string(b1 - b0);
        }
        const double loss_gap = largest_relative_gap(losses, need(one, "losses"));
        const double w_gap = weight_gap(launcher.scratch / ("dp" + std::to_string(N)), launcher.scratch / "dp1");
        worst_loss = std::max(worst_loss, loss_gap);
        worst_weight = std::max(worst_weight, w_gap);
        const bool identical = need(n, "identical")[0] == 1.0;
        all_identical = all_identical && identical;
        char gaps[64];
        std::snprintf(gaps, sizeof gaps, "loss %.1e, weights %.1e", loss_gap, w_gap);
        std::printf("%5d  %-12s  %12.7f  %12.7f  %22s  %s\n", N, shares.c_str(), losses.front(), losses.back(),
                    gaps, identical ? "yes, bit for bit" : "NO");
    }
    std::printf("(gaps relative to the loss and to the largest weight, after %d steps)\n", launcher.s.steps);
    print_claim("dp_steps", std::to_string(launcher.s.steps));
    print_claim("dp_batch", std::to_string(config.batch_size));
    {
        std::string shares, blocks;
        for (int r = 0; r < 4; ++r) {
            const auto [b0, b1] = batch_share(config.batch_size, r, 4);
            shares += (r ? " + " : "") + std::to_string(b1 - b0);
        }
        for (int l = config.n_layer - 1; l >= 0; --l) blocks += std::to_string(l) + (l ? ", " : "");
        print_claim("dp_shares_4", shares);
        print_claim("dp_bucket_blocks", blocks);
    }
    print_claim("dp_loss_gap", worst_loss < 1e-5 ? "below 1e-5" : "ABOVE 1e-5");
    print_claim("dp_weight_gap", worst_weight < 1e-5 ? "below 1e-5" : "ABOVE 1e-5");
    print_claim("dp_identical", all_identical ? "yes" : "no");
    print_claim("dp_parameters", std::to_string(static_cast<long long>(points.P)));
    {
        const std::vector<double>& acc = need(points.by_ranks[2], "accumulated");
        const double per_batch = need(points.by_ranks[2], "time_overlapped")[3];
        std::printf("\none step of %d micro-batches on 2 ranks: %.0f gradient sum, %.0f allreduce calls (one batch a\n"
                    "step: %.0f; a sum after every micro-batch would make %.0f)\n",
                    accumulated_micro_batches, acc[0], acc[1], per_batch, accumulated_micro_batches * per_batch);
        print_claim("accum_sums_2", acc[0], 0);
        print_claim("accum_calls_2", acc[1], 0);
        print_claim("accum_calls_every_2", accumulated_micro_batches * per_batch, 0);
    }

    print_heading("Summing the gradients: bucket by bucket during the backward pass, or once after it");
    std::printf("median of %d steps, milliseconds; the slowest rank's each time. 'exposed' is the wait for\n"
                "the sums after the backward pass, in two parts: 'skew', waiting for the last rank to hand in\n"
                "its gradients (the ranks' clocks of this one machine compared), and 'comm.', the rest:\n"
                "the communication that did not hide behind the computation. The buckets: 'per block'\n"
                "(the library's), 'in place' (the same, summed where the gradients lie: no copy, one\n"
                "allreduce per range), '1+25 MiB' (DDP's caps: blocks join a bucket until it holds 1 MiB,\n"
                "then 25), 'after' (one allreduce after the backward pass)\n\n",
                launcher.s.timed_steps);
    std::printf("%5s  %-9s  %8s  %9s  %8s  %8s  %8s  %7s  %5s\n", "ranks", "buckets", "step", "backward", "exposed",
                "skew", "comm.", "buckets", "calls");
    for (int N : {1, 2, 4}) {
        for (const SumPlan& sums : sum_plans()) {
            const std::vector<double>& t = need(points.by_ranks[N], std::string("time_") + sums.key);
            std::printf("%5d  %-9s  %8.2f  %9.2f  %8.2f  %8.2f  %8.2f  %7.0f  %5.0f\n", N, sums.label, 1e3 * t[0],
                        1e3 * t[1], 1e3 * t[2], 1e3 * t.at(4), 1e3 * t.at(5), t.at(6), t[3]);
        }
    }
    std::printf("\neach rank sends about 2(N - 1)/N of the %.0f gradient bytes per step (a ring allreduce):\n"
                "%.0f bytes on 2 ranks, %.0f on 4\n",
                4 * points.P, 4 * points.P, 1.5 * 4 * points.P);
    const std::vector<double>& o2 = need(points.by_ranks[2], "time_overlapped");
    const std::vector<double>& a2 = need(points.by_ranks[2], "time_after");
    print_claim("exposed_overlapped_2", 1e3 * o2[2], 2);
    print_claim("exposed_after_2", 1e3 * a2[2], 2);
    print_claim("skew_overlapped_2", 1e3 * o2.at(4), 2);
    print_claim("comm_overlapped_2", 1e3 * o2.at(5), 2);
    print_claim("comm_after_2", 1e3 * a2.at(5), 2);
    // The other bucket plans against the library's, on 2 and 4 ranks: the step and the
    // communication left after the backward pass.
    for (int N : {2, 4}) {
        const std::vector<double>& base = need(points.by_ranks[N], "time_overlapped");
        for (const char* key : {"view", "ddp"}) {
            const std::vector<double>& t = need(points.by_ranks[N], std::string("time_") + key);
            const std::string at = std::string("_") + key + "_" + std::to_string(N);
            print_claim("step" + at, 1e3 * t[0], 1);
            print_claim("comm" + at, 1e3 * t.at(5), 2);
            print_claim("step_word" + at, t[0] < base[0] ? "shorter than" : "no shorter than");
        }
        print_claim("step_overlapped_" + std::to_string(N), 1e3 * base[0], 1);
        print_claim("comm_overlapped_" + std::to_string(N) + "_b", 1e3 * base.at(5), 2);
    }
    double spread = 0.0;  // the largest difference of a step from the bucket per block's
    for (int N : {2, 4}) {
        const double base = need(points.by_ranks[N], "time_overlapped")[0];
        for (const char* key : {"view", "ddp"}) {
            spread = std::max(spread, std::fabs(need(points.by_ranks[N], std::string("time_") + key)[0] - base) / base);
        }
    }
    // On 1 rank the ways of summing do the same work but for the copy: how far their steps
    // differ there is the machine's noise, which the differences above are measured against.
    double noise = 0.0;
    const double one_base = need(points.by_ranks[1], "time_overlapped")[0];
    for (const SumPlan& sums : sum_plans()) {
        noise = std::max(noise, std::fabs(need(points.by_ranks[1], std::string("time_") + sums.key)[0] - one_base) / one_base);
    }
    print_claim("bucket_step_spread", 100 * spread, 0);
    print_claim("one_rank_spread", 100 * noise, 0);
    print_claim("spread_word", spread <= noise ? "no more than" : "more than");
    print_claim("buckets_ddp", std::to_string(static_cast<int>(need(points.by_ranks[2], "time_ddp").at(6))));
    print_claim("calls_view", std::to_string(static_cast<int>(need(points.by_ranks[2], "time_view").at(3))));
    print_claim("calls_per_block", std::to_string(static_cast<int>(o2[3])));
    print_claim("gradient_mb", 4 * points.P / 1e6, 1);
    print_claim("overlap_word_2", o2[2] < a2[2] ? "less than" : "no less than");
    print_claim("step_1", 1e3 * need(points.by_ranks[1], "time_overlapped")[0], 1);
    print_claim("step_2", 1e3 * o2[0], 1);
    print_claim("step_4", 1e3 * need(points.by_ranks[4], "time_overlapped")[0], 1);
    return points;
}

void killed_rank(const Launcher& launcher) {
    print_heading("A rank killed in the middle of a run");
    const Sizes& s = launcher.s;
    const fs::path run = launcher.scratch / "killed";
    mpi::LaunchResult ended;
    launcher.run("train", 4, run, &ended);
    std::printf("4 ranks, a checkpoint every %d steps; rank 2 killed itself (SIGKILL) after step %d.\n",
                s.checkpoint_every, s.kill_at);
    print_claim("checkpoint_every", std::to_string(s.checkpoint_every));
    print_claim("kill_at", std::to_string(s.kill_at));
    print_claim("kill_steps", std::to_string(s.kill_steps));
    if (ended.signal != 9 || ended.failed_rank != 2) {
        throw std::runtime_error("the run in which rank 2 is killed ended otherwise: " + mpi::describe_end(ended, 4));
    }
    std::vector<StepRecord> steps;
    std::vector<EvalRecord> evals;
    const long long at = Trainer::load(run / "checkpoint", make_dataset(read_corpus(launcher.corpus))).step();
    std::printf("the job ended with: %s; the checkpoint of step %lld is intact\n",
                mpi::describe_end(ended, 4).c_str(), at);
    print_claim("killed_line", mpi::describe_end(ended, 4));
    print_claim("killed_checkpoint_step", std::to_string(at));
    // Resumed on 2 ranks, against one process that never stopped.
    launcher.run("resume", 2, run);
    read_metrics(run / "metrics.jsonl", steps, evals);
    TrainConfig config = dp_recipe(s);
    config.shorten_to(s.kill_steps);
    config.eval_interval = s.checkpoint_every;
    Trainer alone(config, make_dataset(read_corpus(launcher.corpus)));
    double worst = 0.0;
    std::size_t compared = 0;
    for (const StepRecord& r : steps) {
        const StepRecord expected = alone.train_step();
        if (expected.step != r.step) throw std::runtime_error("the resumed run's metrics skip a step");
        if (r.step < at) continue;
        worst = std::max(worst, std::fabs(double(r.loss) - expected.loss) / expected.loss);
        ++compared;
    }
    std::printf("resumed on 2 ranks from step %lld to %d: the %zu losses after the checkpoint are those of\n"
                "one process that never stopped, to %.1e (relative)\n",
                at, s.kill_steps, compared, worst);
    print_claim("resume_gap", worst < 1e-5 ? "below 1e-5" : "ABOVE 1e-5");
}

struct SequencePoints {
    std::map<int, Numbers> by_ranks;  // 2, 4
    double single_forward = 0, single_backward = 0;  // one process, the long sequence
    double single_growth = 0;  // what its resident memory grew by
};

SequencePoints sequence_parallel(const Launcher& launcher) {
    const Sizes& s = launcher.s;
    SequencePoints points;
    for (int N : {2, 4}) points.by_ranks[N] = launcher.run("sequence", N, launcher.scratch);
    print_heading("Ring attention and Ulysses attention against one process");
    std::printf("B=1, %zu heads of %zu, T=%zu, causal, forward and backward; the largest difference from\n"
                "one process's attention (attention_fast_forward/backward), per result\n\n",
                s.NH, s.hs, s.T_equal);
    std::printf("%5s  %-30s  %9s  %9s  %9s  %9s  %9s\n", "ranks", "", "out", "lse", "dq", "dk", "dv");
    double worst = 0.0, wrong = INFINITY;
    for (int N : {2, 4}) {
        for (const char* key : {"ring_zigzag", "ring_contiguous", "ulysses", "ring_wrong"}) {
            const std::vector<double>& g = need(points.by_ranks[N], key);
            const std::string name = std::string(key) == "ring_wrong" ? "ring, log-sum-exps ADDED (wrong)"
                                   : std::string(key) == "ulysses"    ? "Ulysses (all-to-all)"
                                   : std::string("ring, ") + (std::string(key) == "ring_zigzag" ? "zigzag" : "contiguous");
            std::printf("%5d  %-30s  %9.1e  %9.1e  %9.1e  %9.1e  %9.1e\n", N, name.c_str(), g[0], g[1], g[2], g[3], g[4]);
            const double largest = *std::max_element(g.begin(), g.end());
            if (std::string(key) == "ring_wrong") wrong = std::min(wrong, largest);
            else worst = std::max(worst, largest);
        }
    }
    print_claim("t_equal", std::to_string(s.T_equal));
    print_claim("t_long", std::to_string(s.T_long));
    print_claim("heads", std::to_string(s.NH));
    print_claim("head_size", std::to_string(s.hs));
    print_claim("sequence_worst_gap", worst, 7);
    print_claim("sequence_wrong_gap", wrong, 2);

    print_heading("What each moves per layer");
    const double C = static_cast<double>(s.NH * s.hs), T = static_cast<double>(s.T_equal), MB = 1 << 20;
    std::printf("bytes each rank sends, T=%zu, C=%zu, float32, measured (the formula beside it)\n\n", s.T_equal,
                s.NH * s.hs);
    std::printf("%5s  %-8s  %-28s  %-28s\n", "ranks", "", "forward", "backward");
    for (int N : {2, 4}) {
        const double n = N;
        const std::vector<double>& ring = need(points.by_ranks[N], "bytes_ring");
        const std::vector<double>& uly = need(points.by_ranks[N], "bytes_ulysses");
        // ring: N − 1 hops of k and v forward; backward N − 1 of k, v and N of dk, dv.
        const double ring_f = 4 * (n - 1) * 2 * T / n * C, ring_b = 4 * ((n - 1) * 2 + n * 2) * T / n * C;
        // Ulysses: (N − 1)/N of each local tensor: q, k, v and out (with its lse) forward,
        // dout and dq, dk, dv backward.
        const double uly_f = 4 * (n - 1) / n * (4 * T / n * C + T / n * static_cast<double>(s.NH)), uly_b = 4 * (n - 1) / n * 4 * T / n * C;
        char a[64], b[64];
        std::snprintf(a, sizeof a, "%7.2f MiB (%7.2f)", ring[0] / MB, ring_f / MB);
        std::snprintf(b, sizeof b, "%7.2f MiB (%7.2f)", ring[1] / MB, ring_b / MB);
        std::printf("%5d  %-8s  %-28s  %-28s\n", N, "ring", a, b);
        std::snprintf(a, sizeof a, "%7.2f MiB (%7.2f)", uly[0] / MB, uly_f / MB);
        std::snprintf(b, sizeof b, "%7.2f MiB (%7.2f)", uly[1] / MB, uly_b / MB);
        std::printf("%5d  %-8s  %-28s  %-28s\n", N, "Ulysses", a, b);
        if (std::fabs(ring[0] - ring_f) > 0.5 || std::fabs(ring[1] - ring_b) > 0.5 ||
            std::fabs(uly[0] - uly_f) > 0.5 || std::fabs(uly[1] - uly_b) > 0.5) {
            throw std::runtime_error("the bytes measured are not the formula's");
        }
    }
    print_claim("ring_vs_ulysses_4", need(points.by_ranks[4], "bytes_ring")[0] / need(points.by_ranks[4], "bytes_ulysses")[0], 1);
    // Ulysses' forward on 2 ranks, and the part of it that is the log-sum-exp sent back
    // (one float per position and head): the four tensors alone would be 4·(N−1)/N·(T/N)·C.
    print_claim("ulysses_forward_mib_2", need(points.by_ranks[2], "bytes_ulysses")[0] / MB, 2);
    print_claim("ulysses_four_tensors_mib_2", 4 * 0.5 * 4 * T / 2 * C / MB, 2);
    print_claim("ulysses_lse_kib_2", 4 * 0.5 * T / 2 * static_cast<double>(s.NH) / 1024, 0);

    print_heading("The causal work of a long sequence, shared out two ways");
    std::printf("B=1, %zu heads of %zu, T=%zu, forward; per rank: the (query, key) pairs it scores and the CPU\n"
                "seconds it computes (CPU time: on %d cores the 4 ranks take turns, and a wall clock would\n"
                "count the turns of the others)\n\n",
                s.NH, s.hs, s.T_long, thread_config().cpus);
    for (int N : {2, 4}) {
        for (const char* order : {"contiguous", "zigzag"}) {
            const std::string key = std::string("long_") + order;
            const std::vector<double>& pairs = need(points.by_ranks[N], key + "_pairs");
            const std::vector<double>& cpu = need(points.by_ranks[N], key + "_cpu");
            std::printf("%d ranks, %-10s  pairs (M):", N, order);
            for (double p : pairs) std::printf(" %7.1f", p / 1e6);
            std::printf("   CPU s:");
            for (double c : cpu) std::printf(" %6.2f", c);
            const double pair_ratio = *std::max_element(pairs.begin(), pairs.end()) /
                                      (std::accumulate(pairs.begin(), pairs.end(), 0.0) / N);
            const double cpu_ratio = *std::max_element(cpu.begin(), cpu.end()) /
                                     (std::accumulate(cpu.begin(), cpu.end(), 0.0) / N);
            std::printf("   busiest/mean %.2f counted, %.2f measured; forward %.2f s\n", pair_ratio, cpu_ratio,
                        need(points.by_ranks[N], key + "_wall")[0]);
            print_claim("imbalance_" + std::string(order) + "_" + std::to_string(N), cpu_ratio, 2);
            print_claim("pairs_imbalance_long_" + std::string(order) + "_" + std::to_string(N), pair_ratio, 2);
        }
    }

    print_heading("Memory per rank");
    {
        // One process, for the first point: the whole sequence's attention, fast and tiled.
        const AttentionShape shape{1, s.NH, s.T_long, s.hs, true};
        Rng rng(7);
        const std::size_t n = shape.qkv_size();
        const std::vector<float> q = normal_buffer(rng, n), k = normal_buffer(rng, n), v = normal_buffer(rng, n);
        std::vector<float> out(n), lse(shape.rows()), dq(n), dk(n), dv(n);
        const std::size_t resident = mpi::resident_bytes();
        mpi::reset_peak_resident();
        const auto start = std::chrono::steady_clock::now();
        attention_fast_forward(out.data(), lse.data(), q.data(), k.data(), v.data(), shape);
        const auto middle = std::chrono::steady_clock::now();
        attention_fast_backward(dq.data(), dk.data(), dv.data(), q.data(), q.data(), k.data(), v.data(), out.data(),
                                lse.data(), shape);
        points.single_forward = std::chrono::duration<double>(middle - start).count();
        points.single_backward = std::chrono::duration<double>(std::chrono::steady_clock::now() - middle).count();
        points.single_growth = std::max(0.0, static_cast<double>(mpi::peak_resident_bytes()) - static_cast<double>(resident));
    }
    const double T_long = static_cast<double>(s.T_long);
    std::printf("T=%zu, %zu heads of %zu: one head's (T, T) scores would be %s; q, k, v and out of the\n"
                "whole sequence are %s\n\n",
                s.T_long, s.NH, s.hs, mib(4 * T_long * T_long).c_str(), mib(4 * 4 * T_long * C).c_str());
    std::printf("%5s  %16s  %18s  %19s  %22s  %10s\n", "ranks", "q, k, v per rank", "ring's own, fwd",
                "ring's own, bwd", "resident growth, bwd", "fwd + bwd");
    std::printf("%5d  %16s  %18s  %19s  %22s  %9.2fs\n", 1, mib(3 * 4 * T_long * C).c_str(), "-", "-",
                mib(points.single_growth).c_str(), points.single_forward + points.single_backward);
    for (int N : {2, 4}) {
        const std::vector<double>& m = need(points.by_ranks[N], "long_memory");
        const std::vector<double>& wall = need(points.by_ranks[N], "long_zigzag_wall");
        std::printf("%5d  %16s  %18s  %19s  %22s  %9.2fs\n", N, mib(3 * 4 * m[0]).c_str(), mib(4 * m[1]).c_str(),
                    mib(4 * m[2]).c_str(), mib(m[3]).c_str(), wall[0] + wall[1]);
        print_claim("ring_backward_mib_" + std::to_string(N), 4 * m[2] / MB, 1);
        print_claim("ring_resident_mib_" + std::to_string(N), m[3] / MB, 0);
    }
    print_claim("scores_one_head_mib", 4 * T_long * T_long / MB, 0);
    return points;
}

// The cost model, with this machine's measured points and predictions for 8 and 64 nodes.
void cost_model(const Sizes& s, const DataParallelPoints& dp, const SequencePoints& seq) {
    print_heading("The cost model, this machine's points, and 8 and 64 nodes");
    // Fit MPI_Allreduce on this machine (2 ranks): t = 2(N−1)·α + 2(N−1)/N · bytes / β, that
    // is 2α + bytes/β at N = 2, from the smallest and the largest message.
    const std::vector<double>& ar = need(dp.by_ranks.at(2), "allreduce");  // bytes, seconds pairs
    const double small_bytes = ar[0], small_t = ar[1], large_bytes = ar[ar.size() - 2], large_t = ar.back();
    const double beta = (large_bytes - small_bytes) / std::max(large_t - small_t, 1e-9);
    const double alpha = std::max(0.0, (small_t - small_bytes / beta) / 2.0);
    std::printf("MPI_Allreduce on this machine, the fastest of %d calls (2 ranks, shared memory):\n",
                s.allreduce_repeats);
    print_claim("allreduce_repeats", std::to_string(s.allreduce_repeats));
    for (std::size_t i = 0; i + 1 < ar.size(); i += 2) {
        std::printf("  %10.0f bytes: %8.1f us\n", ar[i], 1e6 * ar[i + 1]);
    }
    std::printf("fitted: latency α = %.1f us per step of the ring, bandwidth β = %.2f GB/s\n", 1e6 * alpha, beta / 1e9);
    const std::vector<double>& ar4 = need(dp.by_ranks.at(4), "allreduce");
    const double P_bytes = 4 * dp.P;
    auto predicted = [](double n, double bytes, double a, double b) {
        return n <= 1 ? 0.0 : 2 * (n - 1) * a + 2 * (n - 1) / n * bytes / b;
    };
    for (std::size_t i = 0; i + 1 < ar4.size(); i += 2) {
        if (ar4[i] != P_bytes) continue;
        std::printf("the gradient (%.0f bytes) on 4 ranks: measured %.1f us, the model says %.1f us (4 ranks\n"
                    "on %d cores wait for each other's turns: the model assumes a core each)\n",
                    P_bytes, 1e6 * ar4[i + 1], 1e6 * predicted(4, P_bytes, alpha, beta), thread_config().cpus);
    }

    // The assumptions for a cluster: nodes that each compute like this machine, on a network.
    const double net_alpha = 20e-6, net_beta = 12.5e9;  // 100 Gb/s Ethernet, MPI over TCP
    const double step_1 = need(dp.by_ranks.at(1), "time_overlapped")[0];
    const double backward_1 = need(dp.by_ranks.at(1), "time_overlapped")[1];
    std::printf("\nassumed: every node computes like this whole machine (one rank of %d threads: %.1f ms a step\n"
                "of batch %d, of which %.1f ms backward, measured above), each keeps that batch (the global\n"
                "batch grows with N), links of %.1f GB/s and %.0f us per message (100 Gb/s Ethernet, TCP)\n\n",
                thread_config().cpus, 1e3 * step_1, dp_recipe(s).batch_size, 1e3 * backward_1, net_beta / 1e9,
                1e6 * net_alpha);
    std::printf("data parallelism, the %s recipe's %.0f gradient bytes per step:\n", dp_recipe(s).recipe.c_str(), P_bytes);
    std::printf("%6s  %14s  %16s  %16s  %12s\n", "nodes", "allreduce ms", "step ms, after", "step ms, overl.",
                "efficiency");
    for (double n : {8.0, 64.0}) {
        const double t_ar = predicted(n, P_bytes, net_alpha, net_beta);
        const double after = step_1 + t_ar;
        // Overlapped: all but the last bucket's share hides behind the backward pass.
        const double overlapped = step_1 + std::max(0.0, t_ar - backward_1);
        std::printf("%6.0f  %14.3f  %16.2f  %16.2f  %11.0f%%\n", n, 1e3 * t_ar, 1e3 * after, 1e3 * overlapped,
                    100 * step_1 / overlapped);
        print_claim("dp_allreduce_ms_" + std::to_string(static_cast<int>(n)), 1e3 * t_ar, 3);
    }
    // A model the size of nanoGPT's GPU recipe, where the bytes matter more.
    const double gpu_params = 10.65e6, gpu_bytes = 4 * gpu_params;
    for (double n : {8.0, 64.0}) {
        print_claim("gpu_recipe_allreduce_ms_" + std::to_string(static_cast<int>(n)),
                    1e3 * predicted(n, gpu_bytes, net_alpha, net_beta), 1);
    }
    std::printf("(nanoGPT's GPU recipe, %.1fM parameters: %.1f ms on 8 nodes, %.1f ms on 64)\n", gpu_params / 1e6,
                1e3 * predicted(8, gpu_bytes, net_alpha, net_beta), 1e3 * predicted(64, gpu_bytes, net_alpha, net_beta));

    // Ring attention: a step of the ring passes k, v of c positions on while it computes. A
    // whole (c, c) block is 4·c²·hs·NH FLOPs; the causal ring with the zig-zag split computes
    // half of one at every step (two of its four (c/2, c/2) pairs), 2·c²·hs·NH. Measured here:
    // this machine's rate on the long sequence.
    const double T = static_cast<double>(s.T_long), NH = static_cast<double>(s.NH), hs = static_cast<double>(s.hs);
    const double causal_flops = 4 * T * (T + 1) / 2 * hs * NH;  // q·kᵀ and P·v over the visible pairs
    const double rate = causal_flops / std::max(seq.single_forward, 1e-9);
    std::printf("\nring attention, forward, T = %.0f, %.0f heads of %.0f: this machine computes it at %.1f GFLOP/s\n"
                "(%.2f s in one process, measured above). Per step of the causal zig-zag ring a rank computes\n"
                "half a (c, c) block, 2·c²·hs·NH FLOPs, and sends k and v, 2·c·hs·NH·4 bytes: the sends hide\n"
                "while c ≥ 4·rate/β = %.0f positions\n\n",
                T, NH, hs, rate / 1e9, seq.single_forward, 4 * rate / net_beta);
    std::printf("%6s  %10s  %14s  %14s  %s\n", "nodes", "c = T/N", "compute ms", "send ms", "");
    for (double n : {8.0, 64.0}) {
        const double c = T / n;
        const double compute = 2 * c * c * hs * NH / rate, send = 2 * c * hs * NH * 4 / net_beta + net_alpha;
        std::printf("%6.0f  %10.0f  %14.3f  %14.3f  %s\n", n, c, 1e3 * compute, 1e3 * send,
                    send < compute ? "hidden" : "exposed: the ring waits");
        print_claim("ring_hidden_" + std::to_string(static_cast<int>(n)), send < compute ? "hidden" : "exposed");
    }
    // A node that computes as fast as an H100 does on dense BF16 products (989 TFLOP/s, the
    // datasheet's figure) on the same links, its k and v in bfloat16 too: 2 bytes a number
    // instead of 4, so the causal ring's condition becomes c ≥ 2F/β (Liu et al.'s c ≥ F/B is
    // for whole blocks, without the mask).
    const double h100 = 989e12;
    std::printf("\na node computing at an H100's %.0f TFLOP/s (dense BF16, its datasheet) on the same links,\n"
                "sending k and v in bfloat16 (2 bytes), needs c ≥ 2F/β = %.0f positions per rank: %.1fM tokens\n"
                "on 8 nodes, %.1fM on 64\n",
                h100 / 1e12, 2 * h100 / net_beta, 16 * h100 / net_beta / 1e6, 128 * h100 / net_beta / 1e6);
    print_claim("ring_threshold_h100", 2 * h100 / net_beta, 0);
    print_claim("h100_tflops", h100 / 1e12, 0);
    print_claim("net_gbs", net_beta / 1e9, 1);
    print_claim("net_latency_us", 1e6 * net_alpha, 0);
    print_claim("gpu_recipe_params_m", gpu_params / 1e6, 1);
    print_claim("ring_threshold", 4 * rate / net_beta, 0);
    print_claim("this_rate_gflops", rate / 1e9, 1);
    print_claim("fitted_beta_gbs", beta / 1e9, 2);
}
#endif  // ATTN_HAVE_MPI

void lesson(const LessonOptions& options) {
    const Sizes s = sizes(options.quick);
    merge_by_hand();
    causal_blocks(options);
    gradient_accumulation(s, fs::absolute(options.corpus()));
#ifdef ATTN_HAVE_MPI
    Launcher launcher{s, fs::absolute(options.corpus()), {}};
    // The corpus is checked here, in one process: a text too short is refused in one line
    // before any rank starts.
    {
        TrainConfig config = dp_recipe(s);
        Trainer check(config, make_dataset(read_corpus(launcher.corpus)));
        (void)check;
    }
    const mpi::ScratchFolder scratch("attn_lesson19");  // removed when the lesson ends
    launcher.scratch = scratch.path();
    std::printf("\n%s; each rank starts this program again under %s\n", describe_threads().c_str(),
                mpi::mpirun_path().c_str());
    const DataParallelPoints dp = data_parallel(launcher);
    killed_rank(launcher);
    const SequencePoints seq = sequence_parallel(launcher);
    cost_model(s, dp, seq);
#else
    (void)s;
    print_heading("The parts on several processes");
    std::printf("This build has no MPI: data parallelism, ring attention and Ulysses attention run as\n"
                "several processes under mpirun. Install Open MPI (libopenmpi-dev, openmpi-bin) and\n"
                "configure again (./workbook setup) to run them.\n");
#endif
}

}  // namespace

int main(int argc, char** argv) {
#ifdef ATTN_HAVE_MPI
    if (const char* part = std::getenv("ATTN_LESSON19_PART")) return run_part(part, argc, argv);
#endif
    return run_lesson(argc, argv, "Lesson 19: when one machine is not enough", lesson, LessonText::corpus);
}
