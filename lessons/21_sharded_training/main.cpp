// Lesson 21: when the model does not fit. The page that narrates this program is lesson.md
// beside it.
//
// It starts as one process, as every lesson does: the memory arithmetic of training, the
// bytes this course's model measures, and a ring reduce-scatter worked in one process. Then it
// runs the training on several processes by starting itself again under mpirun, as 1 to 4
// ranks on this machine: the environment variable ATTN_LESSON21_PART tells a rank which
// scheme it trains with, and rank 0 prints the numbers every rank measured as `key value…`
// lines, which this process reads and explains. Built without MPI, it runs the parts of one
// process and says what it left out.
#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/live_bytes.hpp"
#include "attn/random.hpp"
#include "attn/plot.hpp"
#include "attn/print.hpp"
#include "attn/shard.hpp"
#include "attn/threads.hpp"
#include "attn/trainer.hpp"

#ifdef ATTN_HAVE_MPI
#include "attn/mpi/data_parallel.hpp"
#include "attn/mpi/launch.hpp"
#include "attn/mpi/parts.hpp"
#include "attn/mpi/tensor_parallel.hpp"
#include "attn/mpi/world.hpp"
#include "attn/mpi/zero.hpp"
#include <mpi.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------------------
// Part 1, arithmetic: what training keeps per parameter

// What mixed-precision AdamW keeps per parameter and what each ZeRO stage leaves on a rank
// (Rajbhandari et al. 2020, section 3 and Figure 1): bf16 weights and gradients, 2 bytes
// each, and K = 12 bytes of optimizer state (a float32 master copy, m and v).
void when_the_model_does_not_fit(const LessonOptions& options) {
    print_heading("When the model does not fit: bytes per parameter and ZeRO's stages");
    //! [zero]
    const double K = 12.0;  // float32 master weights, AdamW's m and v: 4 + 4 + 4 bytes
    // bytes per rank for Ψ parameters on N ranks, each stage sharding one more of the three
    const auto replicated = [&](double psi, double) { return (2 + 2 + K) * psi; };
    const auto stage1 = [&](double psi, double n) { return (2 + 2) * psi + K * psi / n; };
    const auto stage2 = [&](double psi, double n) { return 2 * psi + (2 + K) * psi / n; };
    const auto stage3 = [&](double psi, double n) { return (2 + 2 + K) * psi / n; };
    //! [zero]
    const double gb = 1e9;
    std::printf("mixed-precision AdamW: 2 (bf16 weights) + 2 (bf16 gradients) + %.0f (float32 master,\n"
                "m, v) = %.0f bytes per parameter, before any activation\n\n", K, 4 + K);
    std::printf("%-28s %8s %12s %12s %12s %12s\n", "model", "ranks", "replicated", "stage 1",
                "stage 2", "stage 3");
    struct Row { const char* name; double psi; double n; const char* key; };
    const Row rows[] = {
        {"ZeRO's example, 7.5B", 7.5e9, 64, "zero_example"},
        {"7B parameters", 7e9, 8, "b7"},
        {"70B parameters", 70e9, 8, "b70"},
    };
    for (const Row& r : rows) {
        const double b[4] = {replicated(r.psi, r.n), stage1(r.psi, r.n), stage2(r.psi, r.n),
                             stage3(r.psi, r.n)};
        std::printf("%-28s %8.0f %9.1f GB %9.1f GB %9.1f GB %9.1f GB\n", r.name, r.n, b[0] / gb,
                    b[1] / gb, b[2] / gb, b[3] / gb);
        const char* stage[4] = {"replicated", "stage1", "stage2", "stage3"};
        for (int i = 0; i < 4; ++i) print_claim(std::string(r.key) + "_" + stage[i] + "_gb", b[i] / gb, 1);
    }
    // What fits on one 80 GB GPU with nothing else on it
    const double gpu = 80e9;
    if (!options.figures.empty()) {
        // Bytes per rank of ZeRO's 7.5B example against the number of ranks, each stage a line.
        std::vector<PlotSeries> lines = {{"replicated", {}, {}}, {"stage 1", {}, {}}, {"stage 2", {}, {}},
                                         {"stage 3", {}, {}}, {"one 80 GB GPU", {}, {}}};
        for (int n = 1; n <= 64; ++n) {
            const double N = n, at[5] = {replicated(7.5e9, N), stage1(7.5e9, N), stage2(7.5e9, N),
                                         stage3(7.5e9, N), gpu};
            for (int i = 0; i < 5; ++i) {
                lines[static_cast<std::size_t>(i)].x.push_back(N);
                lines[static_cast<std::size_t>(i)].y.push_back(at[i] / gb);
            }
        }
        line_plot_png(options.figures / "lesson21_zero_memory.png", lines,
                      "ZeRO's 7.5B example: training state per rank", "ranks N", "GB per rank");
    }
    std::printf("\nthe largest model whose weights, gradients and optimizer state fit in one 80 GB GPU:\n"
                "%.1fB parameters replicated; on 8 GPUs %.1fB with stage 1, %.1fB with stage 2, %.1fB with stage 3\n",
                gpu / (4 + K) / 1e9, gpu / (4 + K / 8) / 1e9, gpu / (2 + (2 + K) / 8) / 1e9,
                gpu / ((4 + K) / 8) / 1e9);
    print_claim("fits_80gb_b", gpu / (4 + K) / 1e9, 1);
    print_claim("fits_80gb_stage1_8_b", gpu / (4 + K / 8) / 1e9, 1);
    print_claim("fits_80gb_stage2_8_b", gpu / (2 + (2 + K) / 8) / 1e9, 1);
    print_claim("fits_80gb_stage3_8_b", gpu / ((4 + K) / 8) / 1e9, 1);
    print_claim("adamw_bytes_per_parameter", 4 + K, 0);
}

// The same arithmetic for the model this lesson trains, measured: the bytes the library has
// allocated (GPT::memory_use, AdamW::bytes) after one step of the CPU recipe at its batch, on
// one thread (more threads add a gradient buffer per extra batch slice). It trains in
// float32, so its 16 bytes per parameter split 4 + 4 + 8 instead of 2 + 2 + 12.
void this_model_measured() {
    //! [measured]
    const TrainConfig recipe = TrainConfig::named("cpu");
    const int threads = num_threads();
    set_num_threads(1);
    GPT model(recipe.model_config(65), 1);
    const int B = recipe.batch_size, T = recipe.model_config(65).block_size;
    const std::vector<int> x(static_cast<std::size_t>(B) * T, 1), y(x.size(), 2);
    model.forward(x, y, B, T);
    model.zero_grad();
    model.backward();
    AdamW adamw;
    adamw.step(model, 1e-3f);
    MemoryUse use = model.memory_use();
    use.optimizer = adamw.bytes();
    set_num_threads(threads);
    //! [measured]
    const double P = static_cast<double>(model.parameters().size()), mb = 1e6;
    const double weights = static_cast<double>(use.weights), gradients = static_cast<double>(use.gradients),
                 optimizer = static_cast<double>(use.optimizer), activations = static_cast<double>(use.activations);
    const double state = weights + gradients + optimizer;
    std::printf("\nthis lesson's model (the CPU recipe, %.0f parameters, float32), measured after one step\n"
                "of batch %d x %d on one thread:\n", P, B, T);
    std::printf("  weights %8.2f MB  (%.1f bytes per parameter)\n", weights / mb, weights / P);
    std::printf("  gradients %6.2f MB  (%.1f)\n", gradients / mb, gradients / P);
    std::printf("  AdamW %10.2f MB  (%.1f)\n", optimizer / mb, optimizer / P);
    std::printf("  activations %4.2f MB  (%.1f bytes per parameter: %.1f times the rest)\n", activations / mb,
                activations / P, activations / state);
    print_claim("measured_params", std::to_string(model.parameters().size()));
    print_claim("measured_batch", std::to_string(B));
    print_claim("measured_T", std::to_string(T));
    print_claim("measured_state_bytes_per_parameter", state / P, 1);
    print_claim("measured_activations_mb", activations / mb, 1);
    print_claim("measured_activations_ratio", activations / state, 1);
}

// The activations again, under each recomputation (GPT::set_recompute): the bytes kept,
// measured as above; the time of a step, measured side by side (the modes take turns, step
// after step, so that a busy machine slows them alike) as a ratio to keeping everything; and
// the extra floating-point work by formula. Every mode's gradients are the same bit for bit
// (tests/test_recompute.cpp); the losses printed here show it once more.
void recomputation_measured(bool quick) {
    const TrainConfig recipe = TrainConfig::named("cpu");
    const GPTConfig c = recipe.model_config(65);
    const int B = recipe.batch_size, T = c.block_size;
    const int threads = num_threads();
    set_num_threads(1);
    struct Mode {
        const char* name;
        Recompute recompute;
        AttentionKind attention;
        std::size_t activations = 0;
        std::vector<double> ms = {};
        float loss = 0.0f;
    };
    std::vector<Mode> modes = {{"none", Recompute::none, AttentionKind::materialised},
                               {"attention", Recompute::attention, AttentionKind::materialised},
                               {"blocks", Recompute::blocks, AttentionKind::materialised},
                               {"fused attention, none", Recompute::none, AttentionKind::fused},
                               {"fused attention, attention", Recompute::attention, AttentionKind::fused}};
    std::vector<GPT> models;
    for (const Mode& m : modes) {
        models.emplace_back(c, 1);
        models.back().set_attention(m.attention);
        models.back().set_recompute(m.recompute);
    }
    Rng rng(3);
    std::vector<int> x(static_cast<std::size_t>(B) * T), y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        x[i] = static_cast<int>(rng.below(65));
        y[i] = static_cast<int>(rng.below(65));
    }
    const int rounds = quick ? 2 : 8;  // the first allocates and is not timed
    for (int r = 0; r <= rounds; ++r) {
        for (std::size_t i = 0; i < modes.size(); ++i) {
            GPT& model = models[i];  // set_recompute(Recompute::none, ::attention or ::blocks)
            const auto start = std::chrono::steady_clock::now();
            const float loss = model.forward(x, y, B, T);
            model.zero_grad();
            model.backward();  // the recomputation happens here
            const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
            if (r > 0) modes[i].ms.push_back(ms);
            modes[i].loss = loss;
            modes[i].activations = model.memory_use().activations;
        }
    }
    set_num_threads(threads);
    // The floating-point operations of one forward pass, per token: a block's four products
    // 2·(3C² + C² + 4C² + 4C²) = 24C², its attention 2·2·T·C (q·kᵀ and the weights times v,
    // over every key, as the code computes them); the LM head 2·C·V. The backward pass takes
    // twice the forward's, so a step is 3 forward passes. Recomputing the blocks adds a forward
    // pass of the blocks; recomputing the attention, the attention's part of one.
    const double C = c.n_embd, L = c.n_layer, V = c.vocab_size;
    const double block = 24.0 * C * C + 4.0 * T * C, forward = L * block + 2.0 * C * V;
    const double extra_blocks = L * block / (3.0 * forward), extra_attention = L * 4.0 * T * C / (3.0 * forward);
    const auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    const double mb = 1e6, base_ms = median(modes[0].ms);
    std::printf("\nthe activations under each recomputation, the same model, batch and thread; step time the\n"
                "median of %d steps, the modes taking turns:\n", rounds);
    std::printf("  %-28s %12s %10s %9s %14s  %s\n", "recompute", "activations", "step ms", "vs none", "extra FLOPs",
                "loss");
    for (const Mode& m : modes) {
        const double extra = m.recompute == Recompute::blocks ? extra_blocks
                             : m.recompute == Recompute::attention && m.attention == AttentionKind::materialised
                                 ? extra_attention
                                 : 0.0;
        std::printf("  %-28s %9.2f MB %10.1f %8.2fx %13.1f%%  %.6f\n", m.name, static_cast<double>(m.activations) / mb,
                    median(m.ms), median(m.ms) / base_ms, 100.0 * extra, static_cast<double>(m.loss));
    }
    const auto mb_of = [&](std::size_t i) { return static_cast<double>(modes[i].activations) / mb; };
    const auto ratio_of = [&](std::size_t i) { return median(modes[i].ms) / base_ms; };
    // the same loss, bit for bit, for every recomputation of one attention (the fused attention
    // rounds its sums in another order than the materialised one)
    const bool same_loss = modes[1].loss == modes[0].loss && modes[2].loss == modes[0].loss &&
                           modes[4].loss == modes[3].loss;
    print_claim("recompute_none_mb", mb_of(0), 2);
    print_claim("recompute_attention_mb", mb_of(1), 2);
    print_claim("recompute_blocks_mb", mb_of(2), 2);
    print_claim("recompute_fused_mb", mb_of(3), 2);
    print_claim("recompute_blocks_fraction", 100.0 * mb_of(2) / mb_of(0), 0);
    print_claim("recompute_attention_fraction", 100.0 * mb_of(1) / mb_of(0), 0);
    print_claim("recompute_attention_time", ratio_of(1), 2);
    print_claim("recompute_blocks_time", ratio_of(2), 2);
    print_claim("recompute_blocks_flops_percent", 100.0 * extra_blocks, 0);
    print_claim("recompute_attention_flops_percent", 100.0 * extra_attention, 1);
    print_claim("recompute_fused_same", modes[3].activations == modes[4].activations ? "yes" : "no");
    print_claim("recompute_losses_same", same_loss ? "yes" : "no");
}

// ---------------------------------------------------------------------------------------
// Part 2, one process: a ring reduce-scatter and all-gather by hand

// Prints each rank's buffer, its shards separated by bars.
void print_buffers(const std::vector<std::vector<double>>& buffers, int ranks) {
    const std::size_t n = buffers[0].size();
    for (int r = 0; r < ranks; ++r) {
        std::printf("    rank %d:", r);
        for (int s = 0; s < ranks; ++s) {
            const Shard piece = shard_of(n, s, ranks);
            std::printf(" |");
            for (std::size_t i = piece.begin; i < piece.end; ++i) std::printf(" %4.0f", buffers[static_cast<std::size_t>(r)][i]);
        }
        std::printf(" |\n");
    }
}

// Seven gradients on three ranks, rank r's all 10^r: every digit of a sum says which ranks
// have added to it (111 is complete; 11 has ranks 0 and 1). The shards are uneven, 3, 2, 2.
void ring_by_hand(const LessonOptions& options) {
    print_heading("A ring reduce-scatter and all-gather, worked in one process");
    const int N = 3;
    const std::size_t n = 7;
    std::printf("%zu gradients on %d ranks; shard_of gives rank r the elements", n, N);
    for (int r = 0; r < N; ++r) {
        const Shard s = shard_of(n, r, N);
        std::printf(" %s[%zu, %zu)", r == 0 ? "" : r == N - 1 ? "and " : "", s.begin, s.end);
        std::printf("%s", r == N - 1 ? "" : ",");
    }
    std::printf(".\nRank r's gradients are all 10^r, so a sum's digits say which ranks are in it:\n"
                "111 is the whole sum, 11 holds ranks 0 and 1 only.\n\n");
    std::vector<std::vector<double>> buffers;
    for (int r = 0; r < N; ++r) buffers.emplace_back(n, std::pow(10.0, r));
    std::printf("  before\n");
    print_buffers(buffers, N);
    // For the picture: the share of the ranks in each element's sum (its digits that are 1).
    std::vector<Tensor2> maps;
    std::vector<std::string> titles;
    const auto picture = [&](const std::string& title) {
        Tensor2 share = xt::zeros<float>({static_cast<std::size_t>(N), n});
        for (int r = 0; r < N; ++r) {
            for (std::size_t i = 0; i < n; ++i) {
                int ones = 0;
                for (auto v = static_cast<long>(buffers[static_cast<std::size_t>(r)][i]); v > 0; v /= 10) ones += v % 10 == 1;
                share(static_cast<std::size_t>(r), i) = static_cast<float>(ones) / N;
            }
        }
        maps.push_back(share);
        titles.push_back(title);
    };
    picture("before");
    // Every rank sends at once: what it sends is what it held before the step.
    const auto step_round = [&](const char* what, int step, auto send_order, bool add) {
        std::printf("  %s step %d: ", what, step + 1);
        const std::vector<std::vector<double>> before = buffers;
        for (int from = 0; from < N; ++from) {
            const int to = (from + 1) % N, shard = send_order(from, step, N);
            const Shard s = shard_of(n, shard, N);
            std::printf("%srank %d sends shard %d to rank %d", from == 0 ? "" : ", ", from, shard, to);
            for (std::size_t i = s.begin; i < s.end; ++i) {
                double& theirs = buffers[static_cast<std::size_t>(to)][i];
                theirs = (add ? theirs : 0.0) + before[static_cast<std::size_t>(from)][i];
            }
        }
        std::printf("\n");
        print_buffers(buffers, N);
        picture(std::string(what) + " " + std::to_string(step + 1));
    };
    for (int step = 0; step < N - 1; ++step) step_round("reduce-scatter", step, ring_reduce_scatter_send, true);
    bool complete = true;
    for (int r = 0; r < N; ++r) {
        const Shard s = shard_of(n, r, N);
        for (std::size_t i = s.begin; i < s.end; ++i) complete = complete && buffers[static_cast<std::size_t>(r)][i] == 111.0;
    }
    std::printf("  after %d steps each rank holds its own shard's whole sum: %s\n", N - 1, complete ? "yes" : "NO");
    print_claim("ring_own_shard_complete", complete ? "yes" : "no");
    for (int step = 0; step < N - 1; ++step) step_round("all-gather", step, ring_all_gather_send, false);
    bool everywhere = true;
    for (const auto& b : buffers) everywhere = everywhere && std::all_of(b.begin(), b.end(), [](double v) { return v == 111.0; });
    std::printf("  after %d more steps every rank holds every sum: %s\n", N - 1, everywhere ? "yes" : "NO");
    print_claim("ring_all_complete", everywhere ? "yes" : "no");
    if (!options.figures.empty()) {
        std::vector<std::string> ranks, elements;
        for (int r = 0; r < N; ++r) ranks.push_back("rank " + std::to_string(r));
        for (int s = 0; s < N; ++s) {
            const Shard piece = shard_of(n, s, N);
            for (std::size_t i = piece.begin; i < piece.end; ++i) elements.push_back("s" + std::to_string(s));
        }
        heatmap_grid_png(options.figures / "lesson21_ring.png", maps, titles, ranks, elements, 1);
    }
}

// ---------------------------------------------------------------------------------------
// Part 3, on several processes: the schemes trained and measured

// The settings every part shares: the CPU recipe, or with --quick the tiny one. A batch of 12
// divides among 1, 2, 3 and 4 ranks.
struct Sizes {
    bool quick = false;
    std::string recipe;
    int steps = 10;    // the steps whose losses are compared
    int save_at = 5;   // the sharded run on 4 ranks saves a checkpoint here
};

Sizes sizes(bool quick) {
    Sizes s;
    s.quick = quick;
    s.recipe = quick ? "tiny" : "cpu";
    if (quick) {
        s.steps = 4;
        s.save_at = 2;
    }
    return s;
}

#ifdef ATTN_HAVE_MPI
TrainConfig recipe(const Sizes& s) {
    TrainConfig c = TrainConfig::named(s.recipe);
    c.batch_size = 12;
    c.eval_iters = 2;
    return c;
}

// One rank's run of a scheme: its losses, every rank's bytes by kind and bytes sent, whether
// the ranks end with the same weights, and with ATTN_LESSON21_SAVE_AT a checkpoint.
void train_part(const std::string& scheme, const Sizes& s, const fs::path& corpus, const fs::path& out, int save_at) {
    // One thread per rank: a rank with more keeps a gradient buffer for each extra thread's
    // slice of the batch, which the formulas below do not count.
    set_num_threads(1);
    if (scheme != "plain" && scheme != "stage1" && scheme != "stage2" && scheme != "stage3" && scheme != "split") {
        throw std::invalid_argument("unknown scheme " + scheme);
    }
    const TextDataset data = make_dataset(read_corpus(corpus));
    // "split": tensor parallelism, every block split over as many of the ranks as its heads
    // allow (all 4 with the CPU recipe's 4 heads), copies of that split sharing each batch.
    const bool split = scheme == "split";
    const int stage = scheme == "plain" || split ? 0 : scheme[5] - '0';
    // A rank never makes the whole buffers its group keeps in shards: stage 2's gradients, stage
    // 3's weights too (its shard of the seed's initial weights computed alone); a tensor-parallel
    // rank neither (its slices drawn alone, the device keeping the state).
    GPTBuffers buffers;
    buffers.gradients = stage < 2 && !split;
    buffers.weights = stage < 3 && !split;
    int rank = 0, ranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &ranks);
    int width = ranks;  // the split's ranks: the largest count that divides both the heads and the ranks
    while (recipe(s).n_head % width != 0 || ranks % width != 0) --width;
    MPI_Comm tensor = MPI_COMM_NULL, copies = MPI_COMM_NULL;
    if (split) {
        MPI_Comm_split(MPI_COMM_WORLD, rank / width, rank, &tensor);
        MPI_Comm_split(MPI_COMM_WORLD, rank % width, rank, &copies);
    }
    const auto join = [&](Trainer& t, const std::shared_ptr<mpi::DataParallel>& group) {
        if (split) t.use_device(std::make_unique<mpi::TensorParallelDevice>(tensor, copies));
        else t.use_group(group);
    };
    auto group_of = [stage]() -> std::shared_ptr<mpi::DataParallel> {
        if (stage == 1) return std::make_shared<mpi::ShardedOptimizer>();
        if (stage == 2) return std::make_shared<mpi::ShardedGradients>();
        if (stage == 3) return std::make_shared<mpi::ShardedParameters>();
        return std::make_shared<mpi::DataParallel>();  // every rank holds everything
    };
    std::optional<Trainer> holder;
    holder.emplace(recipe(s), data, buffers);
    Trainer& trainer = *holder;
    //! [schemes]
    std::shared_ptr<mpi::DataParallel> group = group_of();
    std::shared_ptr<mpi::ZeroGroup> sharded = std::dynamic_pointer_cast<mpi::ZeroGroup>(group);
    join(trainer, group);
    std::vector<double> losses;
    double seconds = 0.0;  // the steps after the first (which allocates), on the wall clock
    // The peaks of the bytes this rank holds through `new` (attn/live_bytes.hpp): during a
    // training step (after the first), and while it saves a checkpoint (its own shard's file).
    // Beside them the peak resident set (VmHWM), started again before each phase: what the
    // machine gave the process, the allocator's kept pages and MPI's buffers included.
    std::size_t train_peak = 0, save_peak = 0, train_resident = 0, save_resident = 0;
    bool resident = true;  // whether every reset of the peak resident set worked
    std::int64_t saved_step = 0;
    for (int i = 0; i < s.steps; ++i) {
        const auto start = std::chrono::steady_clock::now();
        reset_peak_bytes();
        resident = mpi::reset_peak_resident() && resident;
        losses.push_back(trainer.train_step().loss);
        if (i > 0) train_peak = std::max(train_peak, peak_bytes());
        if (i > 0) train_resident = std::max(train_resident, mpi::peak_resident_bytes());
        if (i > 0) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (i + 1 == save_at) {
            reset_peak_bytes();
            resident = mpi::reset_peak_resident() && resident;
            trainer.save(out);  // sharded: each rank writes its own part, nothing is gathered
            save_peak = peak_bytes();
            save_resident = mpi::peak_resident_bytes();
            saved_step = trainer.step();
        }
    }
    MemoryUse use = trainer.memory_use();  // what this rank allocated, by kind
    //! [schemes]
    if (split) {  // the device's: its slices' weights and gradients, their AdamW moments
        const auto* device = static_cast<const mpi::TensorParallelDevice*>(trainer.device());
        const double held = static_cast<double>(device->model().local_parameters());
        mpi::say("split_width", {static_cast<double>(width)});
        mpi::say("split_state", mpi::gather_from_ranks(16.0 * held));
    }
    mpi::say("step_ms", mpi::gather_from_ranks(1e3 * seconds / std::max(1, s.steps - 1)));
    mpi::say("losses", losses);
    mpi::say("parameters", {static_cast<double>(trainer.model().config().num_parameters())});
    std::vector<double> buckets;  // every gradient bucket's floats: one block, …, the embeddings
    for (const GradientBucket& b : trainer.model().gradient_buckets()) buckets.push_back(static_cast<double>(b.size));
    mpi::say("buckets", buckets);
    mpi::say("weights", mpi::gather_from_ranks(static_cast<double>(use.weights)));
    mpi::say("gradients", mpi::gather_from_ranks(static_cast<double>(use.gradients)));
    mpi::say("optimizer", mpi::gather_from_ranks(static_cast<double>(use.optimizer)));
    mpi::say("activations", mpi::gather_from_ranks(static_cast<double>(use.activations)));
    if (sharded) mpi::say("sent", mpi::gather_from_ranks(static_cast<double>(sharded->last_traffic().total())));
    if (const auto* stage3 = dynamic_cast<const mpi::ShardedParameters*>(sharded.get())) {
        // The last step's gathers: how long the rings ran on the communication thread, and how
        // long the passes waited for them.
        const mpi::ShardedParameters::GatherTimes& t = stage3->last_gather_times();
        mpi::say("gather_ms", mpi::gather_from_ranks(1e3 * t.gathering));
        mpi::say("waited_ms", mpi::gather_from_ranks(1e3 * t.waiting));
    }
    // The weights alone, hashed (a sharded rank's moments are its shard's, unlike the others';
    // stage 3's weights are gathered from the shards first, by every rank).
    std::uint64_t h = 0xcbf29ce484222325ull;
    const std::vector<float> w = trainer.whole_parameters();
    const auto* bytes = reinterpret_cast<const unsigned char*>(w.data());
    for (std::size_t i = 0; i < w.size() * sizeof(float); ++i) h = (h ^ bytes[i]) * 0x100000001B3ull;  // FNV-1a
    bool identical = true;
    try {
        if (!split) group->check_same(h, "the weights");
    } catch (const std::runtime_error&) {
        identical = false;
    }
    mpi::say("identical", {identical ? 1.0 : 0.0});
    if (save_at == 0) return;
    // The checkpoint resumed on these ranks as train_gpt --resume does it, the trainer that
    // saved it gone: the peak while it loads (each rank reads the moments it keeps, in stage 3
    // its weights too) and joins the group.
    holder.reset();
    group.reset();
    sharded.reset();
    std::function<std::vector<AdamW::Segment>(const GPT&)> kept;
    if (stage > 0) kept = [=](const GPT& m) { return mpi::kept_segments(m, stage, rank, ranks); };
    if (split) kept = [=](const GPT& m) { return mpi::TensorParallelGPT::runs_of(m, rank % width, width); };
    MPI_Barrier(MPI_COMM_WORLD);
    reset_peak_bytes();
    resident = mpi::reset_peak_resident() && resident;
    Trainer resumed = Trainer::load(out, data, kept, buffers);
    join(resumed, group_of());
    const std::size_t resume_peak = peak_bytes(), resume_resident = mpi::peak_resident_bytes();
    if (resumed.step() != saved_step) throw std::runtime_error("the resumed run is not at the checkpoint's step");
    mpi::say("train_peak", mpi::gather_from_ranks(static_cast<double>(train_peak)));
    mpi::say("save_peak", mpi::gather_from_ranks(static_cast<double>(save_peak)));
    mpi::say("resume_peak", mpi::gather_from_ranks(static_cast<double>(resume_peak)));
    mpi::say("resident_reset", mpi::gather_from_ranks(resident ? 1.0 : 0.0));
    mpi::say("train_resident", mpi::gather_from_ranks(static_cast<double>(train_resident)));
    mpi::say("save_resident", mpi::gather_from_ranks(static_cast<double>(save_resident)));
    mpi::say("resume_resident", mpi::gather_from_ranks(static_cast<double>(resume_resident)));
}

// The model of the lesson's recipe split over the ranks by tensor parallelism: one forward
// and backward pass of a batch against one process's, what the ranks gave to MPI_Allreduce,
// the parameters each holds; on 4 ranks also a 2 x 2 grid with data parallelism.
void tensor_part(const Sizes& s, const fs::path& corpus) {
    set_num_threads(1);
    const TextDataset data = make_dataset(read_corpus(corpus));
    const TrainConfig recipe_config = recipe(s);
    GPTConfig config = recipe_config.model_config(static_cast<int>(data.vocab.size()));
    config.dropout = 0.0f;  // the split draws no dropout masks
    if (s.quick) config.n_head = 4;  // the tiny recipe's 2 heads do not divide among 4 ranks
    GPT model(config, 1337);
    const int B = recipe_config.batch_size, T = config.block_size;
    Rng rng(7);
    std::vector<int> x, y;
    sample_batch(data.train, static_cast<std::size_t>(B), static_cast<std::size_t>(T), rng, x, y);
    const float loss = model.forward(x, y, B, T);  // one process, on every rank alike
    model.zero_grad();
    model.backward();
    const auto gap = [&](const std::vector<float>& g) {
        double worst = 0.0, scale = 0.0;
        for (std::size_t i = 0; i < g.size(); ++i) {
            worst = std::max(worst, std::fabs(static_cast<double>(g[i]) - model.gradients()[i]));
            scale = std::max(scale, std::fabs(static_cast<double>(model.gradients()[i])));
        }
        return worst / scale;
    };
    //! [tensor]
    mpi::TensorParallelGPT split(model, MPI_COMM_WORLD);  // this rank's heads and hidden units
    const float tp_loss = split.forward(x.data(), y.data(), B, T);
    split.backward();
    const std::vector<float> grads = split.whole_gradients();  // every rank's, gathered
    //! [tensor]
    const mpi::TensorParallelTraffic traffic = split.last_traffic();
    mpi::say("tensor", {std::fabs(tp_loss - loss) / loss, gap(grads), static_cast<double>(traffic.allreduces),
                        static_cast<double>(traffic.floats), static_cast<double>(split.local_parameters()),
                        static_cast<double>(model.parameters().size()), static_cast<double>(B) * T * config.n_embd,
                        static_cast<double>(config.n_layer), static_cast<double>(config.n_head)});
    int N = 1, r = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &N);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    // Training with the split: the Trainer's steps on the split model (AdamW on each rank's
    // slices), against one process's steps, on every rank alike.
    TrainConfig train_config = recipe_config;
    train_config.dropout = 0.0f;
    train_config.n_head = config.n_head;
    double seconds = 0.0;  // of the last losses_of(), steps after the first
    const auto losses_of = [&](Trainer& t) {
        std::vector<double> l;
        seconds = 0.0;
        for (int i = 0; i < s.steps; ++i) {
            const auto start = std::chrono::steady_clock::now();
            l.push_back(t.train_step().loss);
            if (i > 0) seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        }
        return l;
    };
    Trainer alone(train_config, data);
    const std::vector<double> reference = losses_of(alone);
    const double alone_ms = 1e3 * seconds / std::max(1, s.steps - 1);
    //! [tp_training]
    Trainer trainer(train_config, data);
    trainer.use_device(std::make_unique<mpi::TensorParallelDevice>(MPI_COMM_WORLD, MPI_COMM_NULL));
    const std::vector<double> split_losses = losses_of(trainer);  // each step on the split model
    trainer.use_device(nullptr);  // every rank's slices gathered back into the whole model
    //! [tp_training]
    double train_gap = 0.0;
    for (std::size_t i = 0; i < reference.size(); ++i) {
        train_gap = std::max(train_gap, std::fabs(split_losses[i] - reference[i]) / reference[i]);
    }
    const double split_ms = 1e3 * seconds / std::max(1, s.steps - 1);
    mpi::say("tp_training", {train_gap, static_cast<double>(s.steps), alone_ms, split_ms});
    if (N != 4) return;
    //! [grid]
    // 2 x 2: ranks {0, 1} and {2, 3} each split the model; {0, 2} and {1, 3} hold the same
    // slices and share the batch, each pair of ranks on half of it.
    MPI_Comm tp = MPI_COMM_NULL, dp = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, r / 2, r, &tp);
    MPI_Comm_split(MPI_COMM_WORLD, r % 2, r, &dp);
    const int half = B / 2, first = (r / 2) * half;
    mpi::TensorParallelGPT pair(model, tp);
    float mean = 0.5f * pair.forward(x.data() + first * T, y.data() + first * T, half, T);
    MPI_Allreduce(MPI_IN_PLACE, &mean, 1, MPI_FLOAT, MPI_SUM, dp);
    pair.backward();
    std::vector<float>& g = pair.local_gradients();
    for (float& v : g) v *= 0.5f;  // each half's share of the batch's mean
    MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM, dp);
    //! [grid]
    mpi::say("grid", {std::fabs(mean - loss) / loss, gap(pair.whole_gradients())});
    MPI_Comm_free(&tp);
    MPI_Comm_free(&dp);
}

int run_part(const char* scheme, int argc, char** argv) {
    return mpi::run_rank(argc, argv, "lesson_21", [scheme](mpi::World&) {
        const Sizes s = sizes(mpi::environment("ATTN_LESSON21_QUICK") == "1");
        const std::string corpus = mpi::environment("ATTN_LESSON21_CORPUS");
        if (std::string(scheme) == "tensor") {
            tensor_part(s, corpus);
        } else {
            const std::string save_at = mpi::environment("ATTN_LESSON21_SAVE_AT");
            train_part(scheme, s, corpus, mpi::environment("ATTN_LESSON21_OUT"), save_at.empty() ? 0 : std::stoi(save_at));
        }
    });
}

// This process's side: it starts the ranks, reads their numbers and explains them.
using mpi::need;
using mpi::Numbers;

struct Run {
    std::string scheme;
    int N = 1;
    Numbers numbers;
    double of(const std::string& key, int rank) const { return need(numbers, key).at(static_cast<std::size_t>(rank)); }
    // The largest of the ranks' training state (weights + gradients + AdamW), in bytes.
    double state() const {
        double most = 0.0;
        for (int r = 0; r < N; ++r) most = std::max(most, of("weights", r) + of("gradients", r) + of("optimizer", r));
        return most;
    }
    double largest(const std::string& key) const {
        const std::vector<double>& v = need(numbers, key);
        return *std::max_element(v.begin(), v.end());
    }
};

double largest_relative_gap(const std::vector<double>& a, const std::vector<double>& b) {
    double worst = a.size() == b.size() ? 0.0 : INFINITY;
    for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(std::fabs(b[i]), 1e-30));
    }
    return worst;
}

struct Launcher {
    Sizes s;
    fs::path corpus, scratch;
    Run run(const std::string& scheme, int N, int save_at = 0) const {
        mpi::LaunchOptions options;
        options.ranks = N;
        const fs::path out = scratch / (scheme + std::to_string(N));
        options.environment = {"ATTN_LESSON21_PART=" + scheme, "ATTN_LESSON21_QUICK=" + std::string(s.quick ? "1" : "0"),
                               "ATTN_LESSON21_CORPUS=" + corpus.string(), "ATTN_LESSON21_OUT=" + out.string(),
                               "ATTN_LESSON21_SAVE_AT=" + std::to_string(save_at)};
        return {scheme, N, mpi::run_part(options, scheme)};
    }
};

// The name of a scheme in the tables.
const char* scheme_name(const std::string& scheme) {
    return scheme == "plain"    ? "plain"
           : scheme == "stage1" ? "stage 1"
           : scheme == "stage2" ? "stage 2"
           : scheme == "split"  ? "tensor parallel"
                                : "stage 3";
}

// Plain data parallelism and ZeRO stages 1, 2 and 3 on 1 to 4 ranks: the same losses as one
// process, the bytes every rank measured beside each scheme's formula and its working
// buffers, the bytes sent beside the ring's count, the sharded runs' checkpoints resumed in
// one process, and the plot.
void schemes(const Launcher& launcher, const LessonOptions& options) {
    print_heading("Data parallelism and ZeRO stages 1, 2 and 3, trained and measured");
    std::vector<Run> runs;
    for (int N : {1, 2, 4}) runs.push_back(launcher.run("plain", N, N == 4 ? launcher.s.save_at : 0));
    for (const char* stage : {"stage1", "stage2", "stage3"}) {
        for (int N : {1, 2, 3, 4}) runs.push_back(launcher.run(stage, N, N == 4 ? launcher.s.save_at : 0));
    }
    // Tensor parallelism on 4 ranks, for its checkpoint and its peaks (its training is measured
    // in the next part).
    const Run split = launcher.run("split", 4, launcher.s.save_at);
    const Run& one = runs.front();
    const double P = need(one.numbers, "parameters")[0], mb = 1e6;
    const std::vector<double>& reference = need(one.numbers, "losses");
    std::vector<std::size_t> buckets;
    for (double b : need(one.numbers, "buckets")) buckets.push_back(static_cast<std::size_t>(b));
    const double block = static_cast<double>(buckets.front()), rest = static_cast<double>(buckets.back());
    std::printf("the %s recipe (%.0f parameters in %zu blocks of %.0f and %.0f more in the embeddings and\n"
                "ln_f; float32, batch 12 shared by the ranks, one thread each), %d steps of each scheme on N\n"
                "ranks; bytes per rank as the library allocated them (Trainer::memory_use), the largest over\n"
                "the ranks\n\n", launcher.s.recipe.c_str(), P, buckets.size() - 1, block, rest, launcher.s.steps);
    //! [formulas]
    // ZeRO's formulas in float32: weights 4P, gradients 4P, AdamW's m and v 8P, on every rank
    // or sharded over N
    const auto formula = [P](const std::string& scheme, int N) {
        if (scheme == "plain") return 16.0 * P;
        if (scheme == "stage1") return 4.0 * P + 4.0 * P + 8.0 * P / N;
        if (scheme == "stage2") return 4.0 * P + (4.0 + 8.0) * P / N;
        return (4.0 + 4.0 + 8.0) * P / N;  // stage 3
    };
    // What each keeps besides: plain data parallelism's packed buffer of each bucket, which
    // lesson 19's overlapped allreduce sums in one call (a second copy of every gradient, 4P),
    // the rings' buffers for a piece of at most 64 KiB (stage 2: one to send, one to
    // receive), in stages 2 and 3 the backward pass's buffer of one block's
    // and the embeddings' and ln_f's gradients, which it hands over bucket by bucket, and in
    // stage 3 the buffers of two blocks' weights (one computing, the next one's arriving) and
    // the embeddings', which it gathers
    const auto buffers = [&](const std::string& scheme, int N) {
        if (scheme == "plain") return 4.0 * P;
        if (scheme == "stage1") return 4.0 * static_cast<double>(mpi::ring_buffer_floats(static_cast<std::size_t>(P), N));
        std::size_t piece = 0;
        for (std::size_t b : buckets) piece = std::max(piece, mpi::ring_buffer_floats(b, N));
        if (scheme == "stage2") return 4.0 * (block + rest) + 2.0 * 4.0 * static_cast<double>(piece);
        return 4.0 * (block + rest) + 4.0 * (2.0 * block + rest) + 4.0 * static_cast<double>(piece);  // stage 3
    };
    //! [formulas]
    std::printf("%-7s %5s  %8s  %9s  %8s  %8s  %8s  %6s  %8s  %10s  %11s  %9s  %s\n", "scheme", "ranks", "weights",
                "gradients", "AdamW", "state", "formula", "off by", "buffers", "unexplained", "activations",
                "loss gap", "same");
    double worst_gap = 0.0, worst_off = 0.0, worst_unexplained = 0.0, worst_unexplained_bytes = 0.0;
    bool identical = true;
    for (const Run& run : runs) {
        const double state = run.state(), expected = formula(run.scheme, run.N), extra = buffers(run.scheme, run.N);
        const double off = state / expected - 1.0, unexplained = state - expected - extra;
        const double gap = largest_relative_gap(need(run.numbers, "losses"), reference);
        const bool same = need(run.numbers, "identical")[0] == 1.0;
        worst_gap = std::max(worst_gap, gap);
        // plain beside the formula once its packed buckets are added; stage 1 beside it alone
        if (run.scheme == "plain") worst_off = std::max(worst_off, std::fabs((state - extra) / expected - 1.0));
        if (run.scheme == "stage1") worst_off = std::max(worst_off, std::fabs(off));
        worst_unexplained = std::max(worst_unexplained, std::fabs(unexplained) / state);
        worst_unexplained_bytes = std::max(worst_unexplained_bytes, std::fabs(unexplained));
        identical = identical && same;
        const char* name = scheme_name(run.scheme);
        std::printf("%-7s %5d  %8.3f  %9.3f  %8.3f  %8.3f  %8.3f  %+5.1f%%  %8.3f  %8.0f B  %11.3f  %9.1e  %s\n", name,
                    run.N, run.largest("weights") / mb, run.largest("gradients") / mb, run.largest("optimizer") / mb,
                    state / mb, expected / mb, 100.0 * off, extra / mb, unexplained, run.largest("activations") / mb,
                    gap, same ? "yes" : "NO");
        const std::string key = run.scheme + "_" + std::to_string(run.N);
        print_claim(key + "_state_mb", state / mb, 2);
        print_claim(key + "_formula_mb", expected / mb, 2);
        print_claim(key + "_off_percent", 100.0 * off, 1);
        print_claim(key + "_buffers_mb", extra / mb, 2);
        print_claim(key + "_activations_mb", run.largest("activations") / mb, 2);
    }
    std::printf("(MB = 10^6 bytes; state = weights + gradients + AdamW; off by: from ZeRO's formula; buffers: the\n"
                "packed buckets' (plain), the rings', the backward pass's (stages 2, 3) and the gathered weights'\n"
                "(stage 3), from the sizes above; unexplained: state - formula - buffers, from a shard's size\n"
                "differing by one float from rank to rank; loss gap: the largest relative difference from the\n"
                "plain run on 1 rank over the %d steps)\n", launcher.s.steps);
    print_claim("block_floats", std::to_string(buckets.front()));
    print_claim("blocks", std::to_string(buckets.size() - 1));
    print_claim("state_worst_off_percent", 100.0 * worst_off, 1);
    print_claim("state_within_5_percent", worst_off < 0.05 ? "yes" : "no");
    print_claim("state_explained", worst_unexplained < 1e-4 ? "yes" : "no");
    print_claim("state_unexplained_bytes", worst_unexplained_bytes, 0);
    print_claim("schemes_loss_gap", worst_gap < 1e-5 ? "below 1e-5" : "ABOVE 1e-5");
    print_claim("schemes_identical", identical ? "yes" : "no");

    // The bytes each rank sent in its last step, counted by the rings, against the ring's
    // 2(N - 1)/N of the parameters' bytes, and against what rank r's rings must send: every
    // shard but its own in the reduce-scatter, every shard but rank r + 1's in the
    // all-gather (stage 2: of every bucket; stage 3: two all-gathers of every bucket), and on
    // more than one rank the clipping norm's sum of squares (a double).
    std::printf("\nbytes sent in one step, counted by the rings, rank by rank, against data parallelism's ring\n"
                "allreduce, 2(N-1)/N x 4P, and against each rank's exact count 4(P - |shard r|) + g x 4(P -\n"
                "|shard r+1|) + 8 (stages 2 and 3: summed over the buckets; g = 2 gathers in stage 3, else 1):\n");
    std::printf("%-7s %5s  %-40s  %14s  %7s  %s\n", "scheme", "ranks", "sent", "2(N-1)/N x 4P", "x DP", "exact count");
    bool exact = true;
    double stage3_ratio = 0.0;
    for (const Run& run : runs) {
        if (run.scheme == "plain") continue;
        const double gathers = run.scheme == "stage3" ? 2.0 : 1.0;
        const std::vector<std::size_t> sizes =
            run.scheme == "stage1" ? std::vector<std::size_t>{static_cast<std::size_t>(P)} : buckets;
        std::string each;
        bool all = true;
        for (int r = 0; r < run.N; ++r) {
            const double sent = run.of("sent", r);
            each += (each.empty() ? "" : " ") + std::to_string(static_cast<long long>(sent));
            double count = run.N == 1 ? 0.0 : 8.0;
            for (std::size_t n : sizes) {
                if (run.N > 1) {
                    count += 4.0 * static_cast<double>(n - shard_of(n, r, run.N).size()) +
                             gathers * 4.0 * static_cast<double>(n - shard_of(n, (r + 1) % run.N, run.N).size());
                }
            }
            all = all && sent == count;
        }
        exact = exact && all;
        const double ring = 2.0 * (run.N - 1) / run.N * 4.0 * P;
        const double ratio = run.N > 1 ? run.of("sent", 0) / ring : 0.0;
        if (run.N > 1) {
            std::printf("%-7s %5d  %-40s  %14.0f  %7.3f  %s\n", scheme_name(run.scheme), run.N, each.c_str(), ring,
                        ratio, all ? "equal on every rank" : "DIFFERS");
        } else {
            std::printf("%-7s %5d  %-40s  %14.0f  %7s  %s\n", scheme_name(run.scheme), run.N, each.c_str(), ring, "-",
                        all ? "equal on every rank" : "DIFFERS");
        }
        if (run.scheme == "stage3" && run.N == 4) stage3_ratio = ratio;
        if (run.N == 4) {
            print_claim(run.scheme + "_sent_rank0_4", std::to_string(static_cast<long long>(run.of("sent", 0))));
            if (run.scheme == "stage1") print_claim("sent_formula_4", std::to_string(static_cast<long long>(ring + 0.5)));
        }
    }
    print_claim("sent_exact", exact ? "yes" : "no");
    print_claim("stage3_sent_ratio_4", stage3_ratio, 3);

    // The time of a step, each run's slowest rank: what the memory costs in time here.
    std::printf("\nms per training step (the slowest rank's mean over steps 2 to %d; one thread per rank, on\n"
                "one machine whose cores the ranks share, so more ranks are not faster here):\n", launcher.s.steps);
    std::printf("%-8s %8s %8s %8s %8s\n", "scheme", "1 rank", "2 ranks", "3 ranks", "4 ranks");
    for (const char* scheme : {"plain", "stage1", "stage2", "stage3"}) {
        std::printf("%-8s", scheme_name(scheme));
        for (int N = 1; N <= 4; ++N) {
            const auto it = std::find_if(runs.begin(), runs.end(),
                                         [&](const Run& run) { return run.scheme == scheme && run.N == N; });
            if (it == runs.end()) std::printf(" %8s", "-");
            else std::printf(" %8.1f", it->largest("step_ms"));
        }
        std::printf("\n");
    }

    // Stage 3's gathers against the time the passes spent waiting for them: what the
    // prefetch hid.
    std::printf("\nstage 3's gathers in the last step, rank by rank: ms the rings ran on the communication\n"
                "thread, ms the passes waited for their weights, and the share of the rings' time hidden\n"
                "behind the compute (1 - waited / gathering; the same shared cores as above):\n");
    std::printf("%5s  %-28s  %-28s  %s\n", "ranks", "gathering (ms)", "waited (ms)", "hidden");
    for (const Run& run : runs) {
        if (run.scheme != "stage3" || run.N == 1) continue;
        std::string gathering, waited, hidden;
        const auto add = [](std::string& to, const char* fmt, double x) {
            char text[32];
            std::snprintf(text, sizeof text, fmt, x);
            to += (to.empty() ? "" : " ") + std::string(text);
        };
        double least = 100.0;  // the smallest share hidden over the ranks
        for (int r = 0; r < run.N; ++r) {
            const double g = run.of("gather_ms", r), w = run.of("waited_ms", r);
            const double share = g > 0.0 ? 100.0 * std::max(0.0, 1.0 - w / g) : 0.0;
            add(gathering, "%6.2f", g);
            add(waited, "%6.2f", w);
            add(hidden, "%3.0f%%", share);
            least = std::min(least, share);
        }
        std::printf("%5d  %-28s  %-28s  %s\n", run.N, gathering.c_str(), waited.c_str(), hidden.c_str());
        print_claim("stage3_hidden_" + std::to_string(run.N), least, 0);
    }

    // The checkpoints the sharded runs on 4 ranks saved, resumed in one process.
    const Sizes& s = launcher.s;
    const int threads = num_threads();
    set_num_threads(1);
    double resume_gap = 0.0;
    for (const char* stage : {"stage1", "stage2", "stage3", "split"}) {
        Trainer resumed = Trainer::load(launcher.scratch / (std::string(stage) + "4"), make_dataset(read_corpus(launcher.corpus)));
        std::vector<double> later;
        while (resumed.step() < s.steps) later.push_back(resumed.train_step().loss);
        const std::vector<double> tail(reference.begin() + s.save_at, reference.end());
        resume_gap = std::max(resume_gap, largest_relative_gap(later, tail));
    }
    set_num_threads(threads);
    std::printf("\nthe runs of stages 1, 2 and 3 and of tensor parallelism on 4 ranks saved a sharded checkpoint after\n"
                "step %d (each rank its own weights and moments: a tensor-parallel rank its slices); one process\n"
                "resumed each for steps %d to %d: largest relative gap from the 1-rank run's losses %.1e\n",
                s.save_at, s.save_at + 1, s.steps, resume_gap);
    print_claim("resume_gap", resume_gap < 1e-5 ? "below 1e-5" : "ABOVE 1e-5");

    // What a rank holds at its peak while it trains, saves and resumes, on 4 ranks.
    std::printf("\npeak bytes per rank held through `new` (attn/live_bytes.hpp), the largest over the 4 ranks: during\n"
                "a training step, while saving the checkpoint of step %d (each rank writes its own part), and while\n"
                "resuming it (loading what the rank keeps, joining the group); the state formula of the table above\n\n",
                s.save_at);
    std::printf("%-15s  %9s  %8s  %9s  %10s  %12s  %12s\n", "scheme", "train MB", "save MB", "resume MB", "formula MB",
                "save/train", "resume/train");
    double worst_ratio = 0.0;
    std::vector<const Run*> on_four;  // the schemes on 4 ranks, tensor parallelism last
    for (const Run& run : runs) {
        if (run.N == 4) on_four.push_back(&run);
    }
    on_four.push_back(&split);
    for (const Run* each : on_four) {
        const Run& run = *each;
        double train = 0, save = 0, resume = 0, save_ratio = 0, resume_ratio = 0;
        const std::vector<double>&t = need(run.numbers, "train_peak"), &sv = need(run.numbers, "save_peak"),
                                  &r = need(run.numbers, "resume_peak");
        for (std::size_t k = 0; k < t.size(); ++k) {  // each rank against its own training peak
            train = std::max(train, t[k]);
            save = std::max(save, sv[k]);
            resume = std::max(resume, r[k]);
            save_ratio = std::max(save_ratio, sv[k] / t[k]);
            resume_ratio = std::max(resume_ratio, r[k] / t[k]);
        }
        worst_ratio = std::max({worst_ratio, save_ratio, resume_ratio});
        // tensor parallelism's state: 16 bytes for each parameter a rank holds (its slices and the
        // whole tensors)
        const double state = run.scheme == "split" ? run.largest("split_state") : formula(run.scheme, 4);
        std::printf("%-15s  %9.2f  %8.2f  %9.2f  %10.2f  %12.3f  %12.3f\n", scheme_name(run.scheme), train / mb,
                    save / mb, resume / mb, state / mb, save_ratio, resume_ratio);
        if (run.scheme == "split") print_claim("split_4_state_mb", state / mb, 2);
        print_claim("peak_" + run.scheme + "_train_mb", train / mb, 2);
        print_claim("peak_" + run.scheme + "_save_mb", save / mb, 2);
        print_claim("peak_" + run.scheme + "_resume_mb", resume / mb, 2);
        print_claim("peak_" + run.scheme + "_save_ratio", save_ratio, 2);
        print_claim("peak_" + run.scheme + "_resume_ratio", resume_ratio, 2);
    }
    print_claim("peak_worst_ratio", worst_ratio, 2);
    print_claim("peak_within_1_2", worst_ratio <= 1.2 ? "yes" : "no");

    // The same phases as the resident set: the peak of VmHWM in each, started again before it
    // by writing 5 to /proc/self/clear_refs (Linux, man 5 proc).
    std::printf("\nthe same phases as peak resident memory per rank (VmHWM, its peak started again before each\n"
                "phase; the largest over the 4 ranks): what the machine gave the process, the allocator's kept\n"
                "pages, the program's code and MPI's buffers included\n\n");
    bool resident = true;
    for (const Run* run : on_four) {
        for (double ok : need(run->numbers, "resident_reset")) resident = resident && ok == 1.0;
    }
    if (!resident) {
        std::printf("n/a: this system did not let the program write /proc/self/clear_refs, so the peak resident set\n"
                    "cannot be started again between phases\n");
        print_claim("resident_measured", "no");
    } else {
        std::printf("%-15s  %9s  %8s  %9s  %12s  %12s\n", "scheme", "train MB", "save MB", "resume MB", "save/train",
                    "resume/train");
        double worst_resident = 0.0;
        for (const Run* each : on_four) {
            const Run& run = *each;
            double train = 0, save = 0, resume = 0, save_ratio = 0, resume_ratio = 0;
            const std::vector<double>&t = need(run.numbers, "train_resident"), &sv = need(run.numbers, "save_resident"),
                                      &r = need(run.numbers, "resume_resident");
            for (std::size_t k = 0; k < t.size(); ++k) {  // each rank against its own training peak
                train = std::max(train, t[k]);
                save = std::max(save, sv[k]);
                resume = std::max(resume, r[k]);
                save_ratio = std::max(save_ratio, sv[k] / t[k]);
                resume_ratio = std::max(resume_ratio, r[k] / t[k]);
            }
            worst_resident = std::max({worst_resident, save_ratio, resume_ratio});
            std::printf("%-15s  %9.2f  %8.2f  %9.2f  %12.3f  %12.3f\n", scheme_name(run.scheme), train / mb, save / mb,
                        resume / mb, save_ratio, resume_ratio);
            print_claim("resident_" + run.scheme + "_train_mb", train / mb, 1);
            print_claim("resident_" + run.scheme + "_save_mb", save / mb, 1);
            print_claim("resident_" + run.scheme + "_resume_mb", resume / mb, 1);
            print_claim("resident_" + run.scheme + "_save_ratio", save_ratio, 2);
            print_claim("resident_" + run.scheme + "_resume_ratio", resume_ratio, 2);
        }
        print_claim("resident_measured", "yes");
        print_claim("resident_worst_ratio", worst_resident, 2);
        print_claim("resident_within_1_2", worst_resident <= 1.2 ? "yes" : "no");
    }

    if (!options.figures.empty()) {
        // Measured only: the formulas would hide these lines (the table has both).
        std::vector<PlotSeries> lines = {{"plain: weights + gradients + AdamW", {}, {}},
                                         {"stage 1: weights + gradients + AdamW", {}, {}},
                                         {"stage 2: weights + gradients + AdamW", {}, {}},
                                         {"stage 3: weights + gradients + AdamW", {}, {}},
                                         {"activations, any scheme", {}, {}}};
        for (const Run& run : runs) {
            PlotSeries& line = lines[run.scheme == "plain" ? 0 : run.scheme == "stage1" ? 1 : run.scheme == "stage2" ? 2 : 3];
            line.x.push_back(run.N);
            line.y.push_back(run.state() / mb);
            if (run.scheme == "stage1") {
                lines[4].x.push_back(run.N);
                lines[4].y.push_back(run.largest("activations") / mb);
            }
        }
        line_plot_png(options.figures / "lesson21_measured_memory.png", lines,
                      "This lesson's model: bytes per rank, measured", "ranks N", "MB per rank");
    }
}
// Tensor parallelism on 1, 2 and 4 ranks and the 2 x 2 grid: equal to one process, the
// allreduces and their bytes against data parallelism's, the parameters per rank.
void tensor_parallelism(const Launcher& launcher) {
    print_heading("Tensor parallelism: every block split over the ranks");
    std::printf("one forward and backward pass of a batch, the model split by heads and MLP hidden units,\n"
                "against one process; per rank: the parameters it holds and what it gave to MPI_Allreduce\n\n");
    std::printf("%5s  %9s  %13s  %11s  %16s  %25s\n", "ranks", "loss gap", "gradient gap", "allreduces",
                "floats summed", "parameters held");
    double worst = 0.0;
    double grid_gap = 0.0, tp_sent = 0.0, dp_sent = 0.0, train_gap = 0.0, train_steps = 0.0;
    std::string times;  // a training step's, split and alone, on rank 0
    for (int N : {1, 2, 4}) {
        const Run run = launcher.run("tensor", N);
        const std::vector<double>& t = need(run.numbers, "tensor");
        const double P = t[5], BTC = t[6], L = t[7];
        worst = std::max({worst, t[0], t[1]});
        std::printf("%5d  %9.1e  %13.1e  %11.0f  %16.0f  %10.0f of %.0f (%.0f%%)\n", N, t[0], t[1], t[2], t[3], t[4],
                    P, 100.0 * t[4] / P);
        if (N == 4) {
            print_claim("tp_allreduces_4", std::to_string(static_cast<long long>(t[2])));
            print_claim("tp_blocks", std::to_string(static_cast<long long>(L)));
            print_claim("tp_heads", std::to_string(static_cast<long long>(t[8])));
            print_claim("tp_params_4", std::to_string(static_cast<long long>(t[4])));
            print_claim("tp_params_whole", std::to_string(static_cast<long long>(P)));
            print_claim("tp_params_percent_4", 100.0 * t[4] / P, 0);
            // A ring allreduce sends 2(N - 1)/N of its buffer from each rank: tensor
            // parallelism's (B, T, C) buffers against data parallelism's parameters.
            tp_sent = 2.0 * 3 / 4 * 4.0 * t[3];
            dp_sent = 2.0 * 3 / 4 * 4.0 * P;
            print_claim("tp_sent_mb_4", tp_sent / 1e6, 2);
            print_claim("dp_sent_mb_4", dp_sent / 1e6, 2);
            print_claim("tp_btc", std::to_string(static_cast<long long>(BTC)));
            if (run.numbers.count("grid")) grid_gap = std::max(need(run.numbers, "grid")[0], need(run.numbers, "grid")[1]);
        }
        const std::vector<double>& training = need(run.numbers, "tp_training");
        train_gap = std::max(train_gap, training[0]);
        train_steps = training[1];
        char time[96];
        std::snprintf(time, sizeof time, "%s%d rank%s %.1f ms (one process %.1f)", times.empty() ? "" : ", ", N,
                      N == 1 ? "" : "s", training[3], training[2]);
        times += time;
    }
    std::printf("(gaps: relative to one process's loss and largest gradient; held: the split tensors' 1/N\n"
                "and the whole ones: embeddings, LayerNorms, the biases added after an allreduce)\n");
    std::printf("\non 4 ranks a ring allreduce of these buffers sends %.2f MB per rank per step, on the\n"
                "critical path (each waits for the one before); data parallelism's gradient sum sends\n"
                "%.2f MB, %.1f times less, and the backward pass can hide it\n", tp_sent / 1e6, dp_sent / 1e6,
                tp_sent / dp_sent);
    std::printf("\n2 x 2 grid (MPI_Comm_split: tensor-parallel pairs, data-parallel across, each pair on half\n"
                "of the batch): largest relative gap from one process %.1e\n", grid_gap);
    std::printf("\ntrained with the split (the Trainer's steps, AdamW on each rank's slices) for %.0f steps on\n"
                "1, 2 and 4 ranks: largest relative gap from one process's losses %.1e; a step on rank 0:\n"
                "%s (one thread per rank, the ranks sharing this machine's cores)\n", train_steps, train_gap,
                times.c_str());
    print_claim("tp_gap", worst < 1e-5 ? "below 1e-5" : "ABOVE 1e-5");
    print_claim("tp_training_gap", train_gap < 1e-5 ? "below 1e-5" : "ABOVE 1e-5");
    print_claim("grid_gap", grid_gap < 1e-5 ? "below 1e-5" : "ABOVE 1e-5");
}
#endif  // ATTN_HAVE_MPI

void lesson(const LessonOptions& options) {
    const Sizes s = sizes(options.quick);
    when_the_model_does_not_fit(options);
    this_model_measured();
    recomputation_measured(options.quick);
    ring_by_hand(options);
#ifdef ATTN_HAVE_MPI
    Launcher launcher{s, fs::absolute(options.corpus()), {}};
    // The corpus is checked here, in one process: a text too short is refused in one line
    // before any rank starts.
    {
        Trainer check(recipe(s), make_dataset(read_corpus(launcher.corpus)));
        (void)check;
    }
    const mpi::ScratchFolder scratch("attn_lesson21");  // removed when the lesson ends
    launcher.scratch = scratch.path();
    std::printf("\neach rank starts this program again under %s\n", mpi::mpirun_path().c_str());
    schemes(launcher, options);
    tensor_parallelism(launcher);
#else
    (void)s;
    print_heading("The parts on several processes");
    std::printf("This build has no MPI: the schemes train as several processes under mpirun. Install\n"
                "Open MPI (libopenmpi-dev, openmpi-bin) and configure again (./workbook setup) to run them.\n");
#endif
}

}  // namespace

int main(int argc, char** argv) {
#ifdef ATTN_HAVE_MPI
    if (const char* part = std::getenv("ATTN_LESSON21_PART")) return run_part(part, argc, argv);
#endif
    return run_lesson(argc, argv, "Lesson 21: when the model does not fit", lesson, LessonText::corpus);
}
