// train_gpt: trains the course's GPT on a character corpus, on the CPU or a CUDA GPU.
//
//   train_gpt                                  nanoGPT's CPU recipe on data/tinyshakespeare.txt
//   train_gpt --recipe tiny --max-iters 50     a run of seconds
//   train_gpt --resume out                     go on from out/checkpoint
//   train_gpt --init DIR --dump-grads grads    one step's gradients, to compare with PyTorch
//   train_gpt --recompute blocks               keep only each block's input, recompute the rest
//   train_gpt --recipe shakespeare --device cuda   nanoGPT's GPU recipe
//   train_gpt --device cuda --precision bf16   ... its products in bfloat16 (autocast's rounding points)
//   train_gpt --grad-accum 4                   4 batches a step, their gradients added (one update)
//   train_gpt --ranks 4                        data parallelism: 4 processes on this machine
//   train_gpt --ranks 4 --shard optimizer      ... each keeping AdamW's state for its shard (ZeRO 1)
//   train_gpt --ranks 4 --shard gradients      ... and its shard of the gradients too (ZeRO 2)
//   train_gpt --ranks 4 --shard parameters     ... and of the parameters too (ZeRO 3, FSDP); no rank
//                                              ever holds the whole weights: each draws its shard of
//                                              the seed's, or reads its runs of --init's or --resume's
//   train_gpt --ranks 4 --tensor-parallel 2    every block split over pairs of ranks, 2 pairs sharing each batch;
//                                              no rank holds the whole model: each draws its slices from the
//                                              seed or reads only its runs of --init's or --resume's, saves
//                                              them to a sharded checkpoint, and the final sample is drawn on
//                                              the slices
//   train_gpt --consolidate out out1           a --shard or --tensor-parallel run's sharded checkpoint as one
//                                              process's, in out1
//   mpirun -np 8 --hostfile hosts train_gpt    ... or on several machines (lesson 19)
//
// Every problem (bad flags, a missing or binary corpus, a broken checkpoint) is one line on
// stderr and a non-zero exit status; with ranks, one line for the whole job. A rank that
// fails mid-run (an error anywhere, in the passes' threads too), is killed, or freezes (no
// step ends within --collective-timeout, 300 s by default) ends the job in one line that
// names the rank and the checkpoint to go on from with --resume.
#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/fault.hpp"
#include "attn/run_control.hpp"
#include "attn/threads.hpp"
#include "attn/trainer.hpp"
#if ATTN_HAVE_CUDA
#include "attn/cuda/device.hpp"
#include "attn/cuda/generate.hpp"
#include "attn/cuda/training_device.hpp"
#endif
#if ATTN_HAVE_MPI
#include "attn/mpi/data_parallel.hpp"
#include "attn/mpi/launch.hpp"
#include "attn/mpi/tensor_parallel.hpp"
#include "attn/mpi/watchdog.hpp"
#include "attn/mpi/world.hpp"
#include "attn/mpi/zero.hpp"
#endif

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <unistd.h>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;

namespace {

constexpr int exit_error = 1, exit_usage = 2, exit_diverged = 3;

struct Flags {
    std::string recipe = "cpu";
    std::string data;
    fs::path out = "out";
    fs::path resume, init, dump_grads;
    std::vector<fs::path> consolidate;  // --consolidate DIR OUT
    std::optional<std::int64_t> max_iters, eval_interval, eval_iters;
    std::optional<double> learning_rate;
    std::optional<float> dropout;
    std::optional<std::uint64_t> seed;
    int sample = 500;
    float temperature = 0.8f;
    int top_k = 0;
    std::string prompt;
    std::string device = "cpu";
    bool tf32 = false;
    std::string attention = "materialised";
    std::string precision = "fp32";
    std::string recompute = "none";  // --recompute: what the backward pass computes again
    bool no_causal_mask = false;
    std::string position;  // empty: the recipe's (learned)
    bool no_attention_scale = false;
    int kv_heads = 0;      // 0: the recipe's (one per query head)
    int window = 0;        // 0: the recipe's (the whole context)
    int bench = 0;
    int threads = 0;  // 0: the library's policy (OMP_NUM_THREADS, else the CPUs)
    bool threads_info = false;
    bool overwrite = false;  // replace a run already in --out
    int ranks = 0;           // --ranks N: start N processes under mpirun (0: not given)
    std::optional<int> batch_size;  // --batch-size: sequences per step (not given: the recipe's)
    bool batch_per_rank = false;    // --batch-per-rank: that batch on each rank, not shared
    int grad_accum = 0;             // --grad-accum N: micro-batches per step (0: not given, one)
    std::string allreduce;   // how the ranks sum their gradients (empty: not given)
    std::string shard;       // --shard optimizer|gradients|parameters: ZeRO stage 1, 2 or 3 (empty: plain data parallelism)
    int tensor_parallel = 0; // --tensor-parallel N: every block split over N ranks (0: none)
    std::optional<double> bucket_cap_mb, first_bucket_mb;  // --bucket-cap-mb, --first-bucket-mb
    bool bucket_view = false;                               // --bucket-view
    std::optional<double> collective_timeout;  // --collective-timeout S (not given: 300 s with ranks)
};

// With ranks, a step that has not ended after this many seconds ends the job (--collective-timeout).
constexpr double default_collective_timeout = 300.0;

// This process's place in a data-parallel job: rank 0 of 1 when it trains alone.
struct Job {
#if ATTN_HAVE_MPI
    mpi::World* world = nullptr;  // set when mpirun started this process
#endif
    int rank = 0, size = 1;
    bool parallel() const { return size > 1 || started_by_mpirun; }
    bool started_by_mpirun = false;
};

// torchrun's convention (RANK, WORLD_SIZE, LOCAL_RANK in the environment) with no MPI
// launcher around this process: each process would train the whole batch alone, and all of
// them would write one metrics.jsonl. What to run instead, or "" when none of it is set.
std::string torchrun_without_mpi() {
    for (const char* launcher : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
        if (std::getenv(launcher)) return "";
    const char* world = std::getenv("WORLD_SIZE");
    if (!world && !std::getenv("RANK") && !std::getenv("LOCAL_RANK")) return "";
    const std::string n = world && *world ? world : "N";
    return "RANK/WORLD_SIZE/LOCAL_RANK are set (torchrun's convention), but this program's ranks "
           "are MPI processes: train_gpt --ranks " + n + " ... starts them on this machine, "
           "mpirun -n " + n + " train_gpt ... on several (or unset RANK, WORLD_SIZE and "
           "LOCAL_RANK to train in one process)";
}

// The corpus: --data, or the course's own (tiny shakespeare, in data/).
fs::path corpus_of(const Flags& f) { return f.data.empty() ? course_corpus() : fs::path(f.data); }

// A run folder that already holds a run is the learner's work: a new run replaces it only when
// asked (--overwrite), and the refusal comes before any work.
void refuse_to_replace_a_run(const Flags& f) {
    if (!f.resume.empty() || f.overwrite || f.bench > 0 || !f.dump_grads.empty()) return;
    std::error_code ec;
    if (!fs::exists(f.out / "checkpoint", ec) && !fs::exists(f.out / "metrics.jsonl", ec)) return;
    throw std::invalid_argument(f.out.string() + " already holds a run: --resume " + f.out.string() +
                                " goes on with it, --out DIR starts a new one elsewhere, --overwrite "
                                "replaces it");
}

// A run folder (holding checkpoint/) or a checkpoint folder itself; a checkpoint whose last
// save was killed between its renames is put back first (recover_directory).
fs::path checkpoint_of(const fs::path& dir) {
    recover_directory(dir.filename() == "checkpoint" ? dir : dir / "checkpoint");
    return fs::exists(dir / "checkpoint" / "trainer.json") ? dir / "checkpoint" : dir;
}

// Weights from --init with what the flags set of the training: --dropout (nanoGPT's
// override when it starts from weights), not the value in their config.json.
GPT with_flags(GPT model, const Flags& f) {
    if (!f.dropout) return model;
    GPTConfig config = model.config();
    config.dropout = *f.dropout;
    GPT changed(config);
    changed.parameters() = model.parameters();
    return changed;
}

// A size in megabytes from 0 to a million (the bucket caps).
// --collective-timeout's seconds: 0 (no watchdog) or a positive, finite number.
CLI::Validator timeout_seconds() {
    return CLI::Validator(
        [](std::string& value) -> std::string {
            std::size_t used = 0;
            double seconds = -1.0;
            try {
                seconds = std::stod(value, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used != value.size() || used == 0 || !(seconds >= 0.0 && seconds <= 1e9)) {
                return "expected seconds from 0 (wait for ever) to 1e9, got '" + value + "'";
            }
            return "";
        },
        "SECONDS");
}

CLI::Validator megabytes() {
    return CLI::Validator(
        [](std::string& value) -> std::string {
            std::size_t used = 0;
            double mb = -1.0;
            try {
                mb = std::stod(value, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used != value.size() || used == 0 || !(mb >= 0.0 && mb <= 1e6)) {
                return "expected megabytes from 0 to 1e6, got '" + value + "'";
            }
            return "";
        },
        "MB");
}

// A validator for counts: a whole number of at least `least`, with a message that says so.
CLI::Validator whole_number_at_least(long long least) {
    return CLI::Validator(
        [least](std::string& value) -> std::string {
            std::size_t used = 0;
            long long n = 0;
            try {
                n = std::stoll(value, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            if (used != value.size() || used == 0 || n < least) {
                return "expected a whole number of at least " + std::to_string(least) + ", got '" +
                       value + "'";
            }
            return "";
        },
        "N");
}

int bench(Trainer& trainer, int steps) {
    const TrainConfig& c = trainer.config();
    for (int i = 0; i < 3; ++i) trainer.train_step();  // warm-up: first-touch allocations
    std::vector<double> ms(static_cast<std::size_t>(steps));
    for (double& m : ms) {
        const auto t0 = std::chrono::steady_clock::now();
        trainer.train_step();
        m = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    }
    const double mean = std::accumulate(ms.begin(), ms.end(), 0.0) / steps;
    std::sort(ms.begin(), ms.end());  // the median: one step delayed by another process moves it least
    const double median = steps % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
    const double tokens = static_cast<double>(c.grad_accum) * c.batch_size * c.block_size * 1e3 / median;
    std::printf("bench: recipe %s (%d layers, %d heads, %d channels, block %d, vocabulary %d, "
                "bias %s, dropout %g), B=%d, T=%d, %d micro-batch%s a step, %d steps: %.1f ms/step "
                "(median; mean %.1f), %.0f tokens/s\n",
                c.recipe.c_str(), c.n_layer, c.n_head, c.n_embd, c.block_size,
                trainer.model().config().vocab_size, c.bias ? "on" : "off",
                static_cast<double>(c.dropout), c.batch_size, c.block_size, c.grad_accum,
                c.grad_accum == 1 ? "" : "es", steps, median, mean, tokens);
    return 0;
}

// --device sim: the CUDA code in the CUDA simulator, in a build configured without a GPU
// (tiny runs: it checks, it does not race); cuda and auto need a GPU build.
void check_simulator_choice(const Flags& f) {
#if ATTN_CUDA_SIMULATED
    if (f.device == "cuda") {
        throw std::runtime_error("--device cuda: this build was configured without a GPU, so its "
                                 "CUDA code runs in the CUDA simulator (--device sim, for tiny "
                                 "runs); reconfigure on a machine with a GPU");
    }
#else
    if (f.device == "sim") {
        throw std::runtime_error("--device sim: this build runs its CUDA code on a GPU (or has "
                                 "none); the simulator is built when no GPU is found at configure "
                                 "time");
    }
#endif
}

// The model the flags describe, known before any work: the recipe's with the flags'
// changes, or the config.json of the weights that --init or --resume start from (nothing
// when that folder is missing: loading it says so).
std::optional<GPTConfig> planned_model(const Flags& f, const TrainConfig& config) {
    const fs::path weights = !f.resume.empty() ? checkpoint_of(f.resume) : f.init;
    if (weights.empty()) return config.model_config(1);
    if (!fs::exists(weights / "config.json")) return std::nullopt;
    return load_config(weights);
}

// The options that shaped the model's attention, as typed: the weights folder it comes
// from, or the flags. The refusals below name them.
std::string attention_options(const Flags& f) {
    std::string names;
    auto add = [&names](const std::string& name) { names += (names.empty() ? "" : " ") + name; };
    if (!f.resume.empty()) add("--resume " + f.resume.string());
    if (!f.init.empty()) add("--init " + f.init.string());
    if (f.no_causal_mask) add("--no-causal-mask");
    if (!f.position.empty() && f.position != "learned") add("--position " + f.position);
    if (f.no_attention_scale) add("--no-attention-scale");
    if (f.kv_heads != 0) add("--kv-heads " + std::to_string(f.kv_heads));
    if (f.window != 0) add("--window " + std::to_string(f.window));
    if (f.attention == "fused") add("--attention fused");
    return names.empty() ? "--recipe " + f.recipe : names;
}

#if ATTN_HAVE_CUDA
cuda::CudaOptions cuda_options(const Flags& f) {
    cuda::CudaOptions options;
    options.tf32 = f.tf32;
    options.attention = f.attention == "fused" ? cuda::AttentionKind::fused
                                               : cuda::AttentionKind::materialised;
    options.precision = parse_precision(f.precision);
    return options;
}
#endif

// --device: cpu; cuda (a CUDA GPU or a one-line error); auto (the GPU when there is one and
// it can train this model, else the CPU, with a note); sim (see check_simulator_choice).
// Decided before any work: an option the chosen path does not implement is refused here,
// in one line that names it, never trained on another path or silently left out.
// Returns the device the run uses: cpu, cuda or sim.
std::string plan_device(const Flags& f, const std::optional<GPTConfig>& model, bool ranks,
                        bool speaks) {
    if (model && f.attention == "fused") {  // on either device
        const std::string why = fused_attention_unsupported(*model);
        if (!why.empty()) throw std::invalid_argument(attention_options(f) + ": " + why);
    }
    if (ranks && f.device != "cpu") {  // data parallelism is the CPU model's (lesson 19)
        if (f.device != "auto") {
            throw std::invalid_argument("--device " + f.device + " with ranks (--ranks or mpirun): "
                                        "data parallelism over processes trains on the CPU");
        }
        if (f.tf32) throw std::invalid_argument("--tf32 needs --device cuda or auto");
        if (speaks) {
            std::cerr << "train_gpt: --device auto: data parallelism over processes trains on the "
                         "CPU; training on the CPU\n";
        }
        return "cpu";
    }
    if (f.device == "cpu") {
        if (f.tf32) throw std::invalid_argument("--tf32 needs --device cuda or auto");
        return "cpu";
    }
    auto fall_back = [&f, speaks](const std::string& why) {
        if (f.device != "auto") throw std::runtime_error("--device " + f.device + " with " + why);
        if (speaks) std::cerr << "train_gpt: --device auto: " << why << "; training on the CPU\n";
        return std::string("cpu");
    };
    if (f.grad_accum > 1) {
        return fall_back("--grad-accum " + std::to_string(f.grad_accum) + ": gradient accumulation adds the "
                         "micro-batches' gradients in the CPU model (the GPU's backward pass clips at once)");
    }
    if (f.precision == "fp16") {
        return fall_back("--precision fp16: the GPU model's mixed precision is bf16 (fp16 needs loss "
                         "scaling, which the CPU model's trainer does)");
    }
    if (f.precision != "fp32" && f.tf32) {
        return fall_back("--tf32 and --precision " + f.precision + " together: the attention's float32 products "
                         "would round its weights to TF32 where the CPU model keeps them float32");
    }
    if (f.recompute != "none") {
        return fall_back("--recompute " + f.recompute + ": activation checkpointing is the CPU "
                         "model's (the GPU model keeps every activation)");
    }
    if (f.bench > 0 && f.device == "sim") {
        throw std::invalid_argument("--bench with --device sim: the CUDA simulator checks the GPU "
                                    "code, it does not time it");
    }
#if ATTN_HAVE_CUDA
    if (model) {
        const std::string why = cuda::unsupported_on_gpu(*model, cuda_options(f));
        if (!why.empty()) return fall_back(attention_options(f) + ": " + why);
    }
#if ATTN_CUDA_SIMULATED
    if (f.device == "auto") return fall_back("this build has no GPU");
    return "sim";
#else
    std::string why;
    if (!cuda::device_available(&why)) return fall_back("no usable CUDA device (" + why + ")");
    return "cuda";
#endif
#else
    (void)model;
    return fall_back("this build has no CUDA (nvcc was not found when it was configured)");
#endif
}

#if ATTN_CUDA_SIMULATED
// What one training step asks of the GPU: its kernel launches and cuBLAS calls, counted by
// the simulator on a copy of the model (forward, backward, clipping, AdamW on the first
// batch of the corpus; the run's own steps are not counted, nor slowed). A count, not a time.
void print_step_work(const Trainer& trainer, const Flags& f) {
    const TrainConfig& c = trainer.config();
    const int B = c.batch_size, T = c.block_size;
    const std::vector<int>& tokens = trainer.data().train;
    std::vector<int> x(static_cast<std::size_t>(B) * T), y(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
        const std::size_t at = i % (tokens.size() - 1);
        x[i] = tokens[at];
        y[i] = tokens[at + 1];
    }
    cuda::CudaGPT copy(trainer.model(), cuda_options(f));
    AdamW optimizer = trainer.optimizer();
    copy.synchronize();
    cuda::count_work(true);
    copy.forward_async(x.data(), y.data(), B, T);
    copy.zero_grad();
    copy.backward();
    copy.clip_grad_norm_async(c.grad_clip);
    copy.adamw_step(optimizer, static_cast<float>(c.learning_rate));
    copy.synchronize();
    const std::vector<roofline::Launch> work = cuda::take_counted_work();
    cuda::count_work(false);
    // The simulator records each matrix of a strided batch as one product: counted apart.
    std::size_t kernels = 0, gemm_ex = 0, sgemm = 0, batched = 0;
    for (const roofline::Launch& l : work) {
        if (l.name == "cublasGemmEx") gemm_ex += l.launches;
        else if (l.name == "cublasSgemm") sgemm += l.launches;
        else if (l.name == "cublasSgemmStridedBatched") batched += l.launches;
        else kernels += l.launches;
    }
    std::printf("one training step on the simulated GPU: %zu kernel launches; cuBLAS: %zu cublasGemmEx "
                "(bfloat16 inputs), %zu cublasSgemm, %zu matrices of cublasSgemmStridedBatched\n",
                kernels, gemm_ex, sgemm, batched);
}
#endif

// Attaches the GPU to the trainer: the run's steps, evaluations and gradients happen there.
void attach_device(Trainer& trainer, const Flags& f, const std::string& device) {
    if (device == "cpu") return;
#if ATTN_HAVE_CUDA
    trainer.use_device(cuda::make_training_device(trainer.model(), cuda_options(f)));
    std::cout << "device: " << trainer.device()->name() << "\n";
#if ATTN_CUDA_SIMULATED
    print_step_work(trainer, f);
#endif
#else
    (void)trainer;
    (void)f;
#endif
}

// The sample after training, on the device that trained: the same generation loop as the
// CPU's generate_text (the whole forward pass over the cropped context for each new
// character, the same draws), with the forward passes on the GPU.
std::string sample_text(Trainer& trainer, const Flags& f, const std::string& device,
                        const SampleOptions& s) {
#if ATTN_HAVE_CUDA
    if (device != "cpu") {
        trainer.use_device(nullptr);  // the trained weights back on the host, the copy freed
        cuda::CudaGPT gpu(trainer.model(), cuda_options(f));
        return cuda::generate_text(gpu, trainer.data().vocab, f.prompt, s, /*cached=*/false);
    }
#else
    (void)f;
    (void)device;
#endif
    return generate_text(trainer.model(), trainer.data().vocab, f.prompt, s);
}

// The settings a run starts from: the recipe with the flags' changes, validated. `ranks`: the
// processes of the job (1 without ranks); with --batch-per-rank each runs the whole batch,
// so the step's batch is ranks times it.
TrainConfig planned_config(const Flags& f, int ranks) {
    TrainConfig config = TrainConfig::named(f.recipe);
    if (f.batch_size) config.batch_size = *f.batch_size;
    if (f.batch_per_rank) config.batch_size *= ranks;
    if (f.grad_accum) config.grad_accum = f.grad_accum;
    if (f.max_iters) {
        config.max_iters = *f.max_iters;
        config.lr_decay_iters = std::min(config.lr_decay_iters, *f.max_iters);
        config.warmup_iters = std::min(config.warmup_iters, config.lr_decay_iters);
    }
    if (f.eval_interval) config.eval_interval = *f.eval_interval;
    if (f.eval_iters) config.eval_iters = *f.eval_iters;
    if (f.learning_rate) config.learning_rate = *f.learning_rate;
    if (f.dropout) config.dropout = *f.dropout;
    if (f.seed) config.seed = *f.seed;
    if (f.no_causal_mask) config.causal = false;
    if (!f.position.empty()) config.position = parse_position(f.position);
    if (f.no_attention_scale) config.scaled_attention = false;
    if (f.kv_heads != 0) config.n_kv_head = f.kv_heads;
    if (f.window != 0) config.window = f.window;
    config.precision = parse_precision(f.precision);
    config.recompute = parse_recompute(f.recompute);
    config.validate();
    return config;
}

// The refusals of options that need ranks, or that ranks cannot take, before any work.
void check_rank_options(const Flags& f, const Job& job) {
    if (!f.allreduce.empty() && !job.parallel() && f.ranks == 0) {
        throw std::invalid_argument("--allreduce chooses how ranks sum their gradients: it needs "
                                    "--ranks N or a start by mpirun");
    }
    const bool bucket_options = f.bucket_cap_mb || f.first_bucket_mb || f.bucket_view;
    if (bucket_options && !job.parallel() && f.ranks == 0) {
        throw std::invalid_argument("--bucket-cap-mb, --first-bucket-mb and --bucket-view choose how "
                                    "ranks group their gradient sums: they need --ranks N or a start "
                                    "by mpirun");
    }
    if (bucket_options && f.allreduce == "after") {
        throw std::invalid_argument("--allreduce after sums every gradient in one call after the "
                                    "backward pass: it has no buckets for --bucket-cap-mb, "
                                    "--first-bucket-mb or --bucket-view");
    }
    if (!f.shard.empty() && !job.parallel() && f.ranks == 0) {
        throw std::invalid_argument("--shard " + f.shard + " shards the training state over ranks: it "
                                    "needs --ranks N or a start by mpirun");
    }
    if (!f.shard.empty() && (!f.allreduce.empty() || bucket_options)) {
        throw std::invalid_argument("--shard " + f.shard + " sums the gradients by ring reduce-scatters of "
                                    "its own: --allreduce, --bucket-cap-mb, "
                                    "--first-bucket-mb and --bucket-view choose plain data parallelism's "
                                    "allreduce");
    }
    if (f.tensor_parallel > 0) {
        if (!job.parallel() && f.ranks == 0) {
            throw std::invalid_argument("--tensor-parallel " + std::to_string(f.tensor_parallel) + " splits every "
                                        "block over ranks: it needs --ranks N or a start by mpirun");
        }
        if (job.size % f.tensor_parallel != 0) {
            throw std::invalid_argument("--tensor-parallel " + std::to_string(f.tensor_parallel) + " does not divide the " +
                                        std::to_string(job.size) + " ranks into groups that split the model");
        }
        if (f.attention == "fused") {
            throw std::invalid_argument("--attention fused with --tensor-parallel: the tensor-parallel blocks "
                                        "call the materialised attention only (their (B, heads, T, T) weights "
                                        "stored); leave out --attention fused");
        }
        if (!f.shard.empty() || !f.allreduce.empty() || bucket_options || f.batch_per_rank) {
            throw std::invalid_argument("--tensor-parallel sums the copies' gradients in one allreduce of its own: "
                                        "--shard, --allreduce, --bucket-cap-mb, --first-bucket-mb, --bucket-view and "
                                        "--batch-per-rank are plain data parallelism's");
        }
    }
    if (f.collective_timeout && !job.parallel() && f.ranks == 0) {
        throw std::invalid_argument("--collective-timeout bounds how long ranks wait for each other: it "
                                    "needs --ranks N or a start by mpirun");
    }
    if (f.first_bucket_mb && !f.bucket_cap_mb) {
        throw std::invalid_argument("--first-bucket-mb sets the first bucket apart from the others: "
                                    "give --bucket-cap-mb too");
    }
    if (f.batch_per_rank && !job.parallel() && f.ranks == 0) {
        throw std::invalid_argument("--batch-per-rank gives each rank the whole batch (the step's "
                                    "batch grows with the ranks): it needs --ranks N or a start by "
                                    "mpirun");
    }
    if (job.parallel() && !f.dump_grads.empty()) {
        throw std::invalid_argument("--dump-grads writes one process's gradients: run it without "
                                    "mpirun");
    }
    if (f.grad_accum > 1 && (f.shard == "gradients" || f.shard == "parameters" || f.tensor_parallel > 0)) {
        throw std::invalid_argument("--grad-accum adds the micro-batches' gradients in each rank's whole gradient "
                                    "buffer before one sum, and " +
                                    (f.tensor_parallel > 0 ? "--tensor-parallel clips each pass's gradients at once"
                                                           : "--shard " + f.shard + " hands each block's to the ring as "
                                                             "the backward pass finishes it") +
                                    ": plain data parallelism or --shard optimizer");
    }
    if (f.grad_accum > 1 && !f.dump_grads.empty()) {
        throw std::invalid_argument("--dump-grads writes one batch's gradients, and --grad-accum makes a step of "
                                    "several: give one or the other");
    }
    if (job.started_by_mpirun && f.ranks > 0 && f.ranks != job.size) {
        throw std::invalid_argument("--ranks " + std::to_string(f.ranks) + " in a job that mpirun "
                                    "started with " + std::to_string(job.size) +
                                    " processes: give one or the other");
    }
}

// What a run has once it is set up: the trainer and where its text and files are.
struct Setup {
    std::optional<Trainer> trainer;
    std::function<void()> report_group;  // what the ranks' group says after the run (rank 0)
    std::function<void()> after_training;  // every rank, once the training has ended
    std::string device;  // cpu, cuda or sim
    std::optional<std::string> sample;  // the sample, where the ranks made it together (tensor parallelism)
    fs::path corpus, out;
    std::string text;
};

// Everything before the first step: the flags checked, the corpus read, the trainer made (from
// a checkpoint, weights or the recipe), the device attached, the ranks joined. In a job every
// rank does it, and an error in any one is the job's (run_on_every_rank).
void set_up(const Flags& f, const Job& job, Setup& setup) {
    check_rank_options(f, job);
    check_simulator_choice(f);
    const TrainConfig config = planned_config(f, job.parallel() ? job.size : 1);
    setup.device = plan_device(f, planned_model(f, config), job.parallel(), job.rank == 0);
    refuse_to_replace_a_run(f);

    setup.corpus = corpus_of(f);
    setup.text = read_corpus(setup.corpus);
    TextDataset data = make_dataset(setup.text);

    std::optional<Trainer>& trainer = setup.trainer;
    setup.out = f.out;
    // A rank that keeps a shard of AdamW's moments reads only those of a sharded checkpoint;
    // one that keeps its gradients (ZeRO 2) or its weights too (ZeRO 3) in shards never makes
    // the whole buffer of them: its shard of the weights is read (from a checkpoint or --init's
    // weights), or computed from the seed.
    std::function<std::vector<AdamW::Segment>(const GPT&)> kept;
    GPTBuffers buffers;
#if ATTN_HAVE_MPI
    const int stage = f.shard == "optimizer" ? 1 : f.shard == "gradients" ? 2 : f.shard == "parameters" ? 3 : 0;
    if (stage > 0 && job.parallel() && f.tensor_parallel == 0) {
        kept = [stage, rank = job.rank, ranks = job.size](const GPT& model) {
            return mpi::kept_segments(model, stage, rank, ranks);
        };
        buffers.gradients = stage == 1;
        buffers.weights = stage < 3;
    }
    // A tensor-parallel rank keeps its slices only: the host model has no whole weights or
    // gradients, and only the runs of its slices (and the whole tensors) are read.
    if (f.tensor_parallel > 0 && job.parallel()) {
        kept = [rank = job.rank % f.tensor_parallel, N = f.tensor_parallel](const GPT& model) {
            return mpi::TensorParallelGPT::runs_of(model, rank, N);
        };
        buffers.gradients = false;
        buffers.weights = false;
    }
#endif
    if (!f.resume.empty()) {
        trainer.emplace(Trainer::load(checkpoint_of(f.resume), std::move(data), kept, buffers));
        if (f.max_iters) trainer->set_max_iters(*f.max_iters);
        if (checkpoint_of(f.resume) != f.resume) setup.out = f.resume;
        if (job.rank == 0) {
            std::cerr << "train_gpt: resuming " << f.resume.string() << " at step " << trainer->step()
                      << " of " << trainer->config().max_iters << "\n";
        }
    } else if (!f.init.empty()) {
        CheckpointInfo info;
        // A rank that keeps its shard of the weights (ZeRO stage 3) reads only that shard,
        // a tensor at a time; the others read them whole.
        GPT model = [&] {
            if (buffers.weights) return with_flags(load_checkpoint(f.init, &info), f);
            GPTConfig weights_config = load_config(f.init, &info);
            if (f.dropout) weights_config.dropout = *f.dropout;
            return load_kept_weights(f.init, weights_config, buffers, kept);
        }();
        if (!info.vocab.empty() && info.vocab != data.vocab.chars()) {
            throw std::runtime_error(f.init.string() + ": its vocabulary (" +
                                     std::to_string(model.config().vocab_size) +
                                     " characters) is not the corpus's (" +
                                     std::to_string(data.vocab.size()) + ")");
        }
        trainer.emplace(config, std::move(data), std::move(model));
    } else {
        trainer.emplace(config, std::move(data), buffers);
    }
    // The materialised attention is the default on both devices, as in the library: at the
    // recipes' sizes the fused one is no faster on the CPU (tools/bench/README.md), and one
    // default keeps train_gpt, lesson 11 and the benchmark harness on the same code path.
    if (f.attention == "fused") trainer->model().set_attention(AttentionKind::fused);
    if (f.sample > 0) {  // bad sampling flags fail now, not after the training they follow
        Rng probe(0);
        sample_token(std::vector<float>(trainer->data().vocab.size(), 0.0f), f.temperature, f.top_k, probe);
        try {
            trainer->data().vocab.encode(f.prompt);
        } catch (const std::invalid_argument& e) {
            throw std::invalid_argument(std::string("--prompt: ") + e.what());
        }
    }
    attach_device(*trainer, f, setup.device);
}

#if ATTN_HAVE_MPI
// MiB of a byte count, for the reports.
double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// --shard optimizer|gradients|parameters: ZeRO stage 1, 2 or 3 (attn/mpi/zero.hpp), once the
// ranks agree on it (below).
void join_zero(const Job& job, Setup& setup, const std::shared_ptr<mpi::ZeroGroup>& group, int stage) {
    Trainer& trainer = *setup.trainer;
    const std::size_t P = trainer.model().config().num_parameters();
    trainer.use_group(group);
    const int B = trainer.config().batch_size;
    std::cout << "ZeRO stage " << stage << ": " << job.size << " ranks share each batch of " << B;
    if (stage == 1) {
        const Shard mine = static_cast<const mpi::ShardedOptimizer&>(*group).shard(trainer.model());
        std::cout << " and AdamW's moments: each keeps those of its shard of the " << P << " parameters (rank 0: ["
                  << mine.begin << ", " << mine.end << "), " << mine.size()
                  << "); gradients summed by a ring reduce-scatter, parameters gathered by a ring all-gather\n";
    } else {
        std::size_t mine = 0;
        for (const AdamW::Segment& s : static_cast<const mpi::ShardedGradients&>(*group).segments(trainer.model())) {
            mine += s.size;
        }
        std::cout << (stage == 2 ? ", the gradients and AdamW's moments" : ", the parameters, the gradients and AdamW's moments")
                  << ": each keeps its piece of every block's (rank 0: " << mine << " of the " << P << " parameters); "
                  << (stage == 2 ? "each block's gradients reduce-scattered by a ring as the backward pass finishes it, "
                                   "parameters gathered by a ring per block after the step\n"
                                 : "each block's parameters gathered by a ring on a communication thread while the "
                                   "block before computes, in the forward pass and again in the backward pass, its "
                                   "gradients reduce-scattered as the backward pass finishes it\n");
    }
    // What rank 0 holds, measured at the end of the training (stage 3 then gathers the whole
    // weights back, for the sample), and what its rings sent in the last step.
    auto held = std::make_shared<MemoryUse>();
    setup.after_training = [&trainer, held, stage] {
        *held = trainer.memory_use();
        if (stage == 3) trainer.use_group(nullptr);  // the shards gathered: every rank calls this
    };
    setup.report_group = [group, held, P, N = job.size, stage] {
        const mpi::ZeroTraffic& t = group->last_traffic();
        const double whole = sizeof(float) * static_cast<double>(P);  // one float32 copy of the parameters
        const double allreduce = 2.0 * (N - 1) / N * whole;           // what data parallelism sends
        std::printf("ZeRO stage %d (rank 0 of %d): held %.3f MiB of weights, %.3f of gradients and %.3f of AdamW's "
                    "moments, against %.3f, %.3f and %.3f for one process (buffers included: lesson 21); the last "
                    "step sent %.3f MiB (reduce-scatters %.3f, all-gathers %.3f, the norm's %zu bytes), against data "
                    "parallelism's 2(N-1)/N of the parameters, %.3f MiB\n",
                    stage, N, mib(static_cast<double>(held->weights)), mib(static_cast<double>(held->gradients)),
                    mib(static_cast<double>(held->optimizer)), mib(whole), mib(whole), mib(2.0 * whole),
                    mib(static_cast<double>(t.total())), mib(static_cast<double>(t.reduce_scatter_bytes)),
                    mib(static_cast<double>(t.all_gather_bytes)), t.norm_bytes, mib(allreduce));
        if (stage == 3) {
            const mpi::ShardedParameters::GatherTimes& g = static_cast<const mpi::ShardedParameters&>(*group).last_gather_times();
            std::printf("ZeRO stage 3 (rank 0): the last step's gathers ran %.2f ms on the communication thread, and "
                        "the passes waited %.2f ms for their weights\n", 1e3 * g.gathering, 1e3 * g.waiting);
        }
    };
}

// The ranks join one data-parallel group, once every rank has set up without an error (its
// calls are collective: a rank that failed before them would leave the others waiting in
// them). Every setting that changes the computation must be the same on every rank: the
// trainer's state (its settings, weights, optimizer, step and corpus) and --allreduce.
// --tensor-parallel N: groups of N consecutive ranks split every block, the groups share
// each batch (mpi::TensorParallelDevice), once every rank has set up.
void join_tensor_parallel(const Flags& f, const Job& job, Setup& setup) {
    Trainer& trainer = *setup.trainer;
    const int N = f.tensor_parallel, copies = job.size / N, B = trainer.config().batch_size;
    if (trainer.config().precision != Precision::fp32) {
        throw std::invalid_argument(std::string("--tensor-parallel computes in float32, and this run's products are in ") +
                                    precision_name(trainer.config().precision));
    }
    if (B < copies) {
        throw std::invalid_argument("a batch of " + std::to_string(B) + " sequences cannot be shared by " +
                                    std::to_string(copies) + " data-parallel copies: each needs at least one");
    }
    // The tensor-parallel group: ranks r with the same r / N; the copies of one slice: the
    // same r % N. Both live until the program ends.
    MPI_Comm tensor = MPI_COMM_NULL, data = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, job.rank / N, job.rank, &tensor);
    MPI_Comm_split(MPI_COMM_WORLD, job.rank % N, job.rank, &data);
    auto owned = std::make_unique<mpi::TensorParallelDevice>(tensor, data);
    mpi::TensorParallelDevice* const device = owned.get();  // the trainer's from now on
    trainer.use_device(std::move(owned));
    const GPTConfig& c = trainer.model().config();
    std::cout << "tensor parallel: " << job.size << " ranks, each group of " << N << " splitting every block ("
              << c.n_head / N << " of " << c.n_head << " heads and " << 4 * c.n_embd / N << " of " << 4 * c.n_embd
              << " MLP units per rank; rank 0 holds " << device->model().local_parameters() << " of "
              << c.num_parameters() << " parameters)";
    if (copies > 1) std::cout << ", " << copies << " groups sharing each batch of " << B;
    std::cout << "\n";
    // The sample is drawn on the slices: every rank of a split runs each forward pass (its
    // heads and hidden units, the allreduces) and the same draws, so that no rank ever holds
    // the whole weights; rank 0 writes it.
    setup.after_training = [&trainer, &setup, &f, device, N] {
        const mpi::TensorParallelTraffic t = device->last_step_traffic();
        if (f.sample > 0) {
            SampleOptions s;
            s.max_new_tokens = f.sample;
            s.temperature = f.temperature;
            s.top_k = f.top_k;
            s.seed = trainer.config().seed;
            setup.sample = device->generate(trainer.data().vocab, f.prompt, s);
        }
        if (N > 1) {
            std::printf("tensor parallel: the last step's passes made %d allreduces of %.3f MiB in all\n",
                        t.allreduces, mib(sizeof(float) * static_cast<double>(t.floats)));
        }
    };
}

void join_group(const Flags& f, const Job& job, Setup& setup) {
    std::optional<Trainer>& trainer = setup.trainer;
    if (f.tensor_parallel > 0) {
        join_tensor_parallel(f, job, setup);
        return;
    }
    if (!f.shard.empty() && job.size == 1) {
        std::cerr << "train_gpt: note: --shard " << f.shard << " on one rank has no other rank to share with: "
                  << "it keeps the whole training state, as without --shard"
                  << (f.shard == "parameters" ? ", and two blocks' weight buffers besides" : "") << "\n";
    }
    {
        const std::string schedule_name = f.allreduce.empty() ? "overlapped" : f.allreduce;
        const mpi::AllreduceSchedule schedule = mpi::parse_schedule(schedule_name);
        mpi::BucketPlan plan;
        if (f.bucket_cap_mb) plan.cap_bytes = mpi::bucket_cap_bytes(*f.bucket_cap_mb);
        if (f.first_bucket_mb) plan.first_cap_bytes = mpi::bucket_cap_bytes(*f.first_bucket_mb);
        plan.view = f.bucket_view;
        const int stage = f.shard == "optimizer" ? 1 : f.shard == "gradients" ? 2 : f.shard == "parameters" ? 3 : 0;
        std::shared_ptr<mpi::DataParallel> group;
        if (stage == 1) {
            group = std::make_shared<mpi::ShardedOptimizer>();
        } else if (stage == 2) {
            group = std::make_shared<mpi::ShardedGradients>();
        } else if (stage == 3) {
            group = std::make_shared<mpi::ShardedParameters>();
        } else {
            group = std::make_shared<mpi::DataParallel>(schedule, plan);
        }
        // FNV-1a of the sharding, the schedule's name and the bucket plan: every rank must sum
        // the same buckets in the same order, or their collectives do not match.
        const std::string settings = "shard " + f.shard + " " + schedule_name + " " + std::to_string(plan.cap_bytes) +
                                     " " + std::to_string(plan.first_cap_bytes) + " " + (plan.view ? "view" : "copy");
        std::uint64_t h = 0xcbf29ce484222325ull;
        for (const char c : settings) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
        group->check_same(h, "--shard, --allreduce, --bucket-cap-mb, --first-bucket-mb or --bucket-view (how the "
                             "gradients are summed and the optimizer's state kept)");
        if (stage > 0) {
            join_zero(job, setup, std::static_pointer_cast<mpi::ZeroGroup>(group), stage);
            return;
        }
        trainer->use_group(group);
        const int B = trainer->config().batch_size;
        std::string shares;
        for (int r = 0; r < job.size; ++r) {
            const auto [b0, b1] = batch_share(B, r, job.size);
            shares += (r ? "+" : "") + std::to_string(b1 - b0);
        }
        std::cout << "data parallel: " << job.size << " ranks, batch " << B
                  << (f.batch_per_rank ? " (" + std::to_string(B / job.size) + " per rank, --batch-per-rank)" : "")
                  << " shared " << shares
                  << "; gradients summed by MPI allreduce "
                  << (schedule == mpi::AllreduceSchedule::overlapped
                          ? "bucket by bucket during the backward pass (" +
                                std::to_string(mpi::DataParallel::plan_buckets(trainer->model(), plan).size()) +
                                " buckets: " + mpi::describe(plan) + ")"
                          : std::string("after the backward pass"))
                  << "\n";
    }
}
#endif

#if ATTN_HAVE_MPI
// Only a job of ranks can end with a rank killed and the checkpoint in question (below).

// Where a run's checkpoint is: the one --resume goes on from, or the one --out will hold.
fs::path run_checkpoint(const Flags& f) {
    return !f.resume.empty() ? checkpoint_of(f.resume) : f.out / "checkpoint";
}

// What a killed job left: its last checkpoint, whole (written atomically) or not yet written.
std::string checkpoint_left(const Flags& f) {
    const fs::path dir = run_checkpoint(f);
    const fs::path run = dir.filename() == "checkpoint" ? dir.parent_path() : dir;
    std::ifstream in(dir / "trainer.json");
    try {
        const nlohmann::json j = nlohmann::json::parse(in);
        return "the last checkpoint, " + dir.string() + " (step " +
               std::to_string(j.at("step").get<long long>()) + "), is intact: go on with --resume " +
               run.string();
    } catch (const std::exception&) {
        return "no checkpoint had been written in " + dir.string();
    }
}
#endif

// The work itself, once every rank has set up without an error.
int train_or_dump(const Flags& f, const Job& job, Setup& setup) {
    Trainer* const trainer = &*setup.trainer;
    const TrainConfig& c = trainer->config();
    const std::string& device = setup.device;
    const fs::path& corpus = setup.corpus;
    const fs::path& out = setup.out;
    const std::string& text = setup.text;
    if (!f.dump_grads.empty()) {
        const float loss = dump_gradients(*trainer, f.dump_grads);
        std::cout << "wrote the gradients of one step (loss " << loss << ", batch " << c.batch_size
                  << " x " << c.block_size << ") to " << f.dump_grads.string() << "\n";
        return 0;
    }
    // The simulator runs the CUDA code to check it; its times say nothing about a GPU.
    const bool simulated = device == "sim";
    if (f.bench > 0) return bench(*trainer, f.bench);

    std::cout << "corpus " << corpus.string() << ": " << text.size() << " bytes, vocabulary "
              << trainer->data().vocab.size() << ", " << trainer->data().train.size() << " train / "
              << trainer->data().val.size() << " val tokens\n"
              << "model: " << c.n_layer << " layers, " << c.n_head << " heads, " << c.n_embd
              << " channels, block " << c.block_size << (c.causal ? ", " : ", NO causal mask, ")
              << (c.position == Position::learned ? "" : std::string(position_name(c.position)) + ", ")
              << (c.scaled_attention ? "" : "NO attention scale, ")
              << (c.n_kv_head == 0 || c.n_kv_head == c.n_head ? ""
                 : std::to_string(c.n_kv_head) + (c.n_kv_head == 1 ? " key/value head, " : " key/value heads, "))
              << (c.window == 0 ? "" : "window " + std::to_string(c.window) + ", ")
              << trainer->model().config().num_parameters() << " parameters; "
              << (c.precision == Precision::fp32 ? ""
                  : std::string("products in ") + precision_name(c.precision) +
                        (trainer->scales_loss() ? " with loss scaling" : "") + "; ")
              << (c.recompute == Recompute::none ? "" : std::string("recompute ") + recompute_name(c.recompute) + "; ")
              << "batch " << c.batch_size
              << (c.grad_accum == 1 ? "" : " x " + std::to_string(c.grad_accum) + " micro-batches a step (gradients added, one update)")
              << ", " << c.max_iters << " steps (recipe " << c.recipe << ")\n";

    StopRequest stop;
    RunOptions options;
    options.out_dir = out;
    options.log = &std::cout;
    options.progress = simulated ? nullptr : &std::cerr;  // its line shows tokens/s
    options.progress_is_terminal = ::isatty(2);
    options.stop_requested = [&stop, &job] {
        fault_point("step", job.rank);  // ATTN_FAULT=step:rank:n, for the checks (attn/fault.hpp)
        return stop.requested();
    };
#if ATTN_HAVE_MPI
    // With ranks, a step that does not end within --collective-timeout (a rank frozen or
    // gone quiet) ends the job in one line that names the ranks that did not arrive.
    const double timeout = f.collective_timeout.value_or(default_collective_timeout);
    std::optional<mpi::Watchdog> watchdog;
    if (job.world && job.size > 1 && timeout > 0) {
        watchdog.emplace(timeout, [&f, &job](const std::string& why) {
            std::cout.flush();
            // one write: mpirun's own lines may come between two writes of the line
            const std::string line = "train_gpt: error: rank " + std::to_string(job.rank) + ": " + why + "; " +
                                     checkpoint_left(f) + "\n";
            std::cerr << line << std::flush;
            mpi::abort_job(exit_error);
        });
        options.stop_requested = [&stop, &job, &watchdog] {
            watchdog->progress();
            fault_point("step", job.rank);
            return stop.requested();
        };
    }
#endif
    const RunSummary summary = run_training(*trainer, options);
#if ATTN_HAVE_MPI
    if (watchdog) watchdog->stop();
#endif
    if (summary.stopped) {
        std::cout << "stopped at step " << trainer->step() << ": checkpoint saved in "
                  << (out / "checkpoint").string() << "; go on with --resume " << out.string() << "\n";
        return 0;
    }
    if (setup.after_training) setup.after_training();
    if (job.rank != 0) return 0;  // rank 0 writes the loss curve and the sample
    std::vector<StepRecord> steps;
    std::vector<EvalRecord> evals;
    read_metrics(out / "metrics.jsonl", steps, evals);
    plot_losses(out / "loss.png", steps, evals,
                "GPT " + std::to_string(c.n_layer) + "x" + std::to_string(c.n_embd) + ", " +
                    corpus.stem().string());
    const EvalRecord& last = summary.evals.back();
    std::printf("finished %lld steps %s: train loss %.4f, val loss %.4f (best %.4f)\n",
                static_cast<long long>(trainer->step()),
                simulated ? "(simulated on the CPU: results checked, no timing)"
                          : ("in " + format_duration(summary.seconds)).c_str(),
                last.train_loss, last.val_loss, trainer->best_val_loss());
    if (!summary.steps.empty() && !simulated) {
        const double n = static_cast<double>(summary.steps.size());
        std::printf("training steps alone: %.1f ms/step, %.0f tokens/s (the rest: evaluation and "
                    "checkpoints)\n",
                    1e3 * summary.step_seconds / n, n * c.grad_accum * c.batch_size * c.block_size / summary.step_seconds);
    }
    if (setup.report_group) setup.report_group();
    if (c.precision != Precision::fp32 && device != "cpu") {
        std::printf("mixed precision (%s) on the GPU: products through cublasGemmEx with float32 sums "
                    "(the rounded values are counted by the CPU model only)\n",
                    precision_name(c.precision));
    } else if (c.precision != Precision::fp32) {
        std::uint64_t rounded = 0, flushed = 0;
        for (const StepRecord& r : summary.steps) {
            rounded += r.rounded_gradients;
            flushed += r.flushed_gradients;
        }
        std::printf("mixed precision (%s): %llu of %llu gradient values entering the products were "
                    "flushed to zero",
                    precision_name(c.precision), static_cast<unsigned long long>(flushed),
                    static_cast<unsigned long long>(rounded));
        if (trainer->scales_loss()) {
            std::printf("; loss scale now %g, %ld steps skipped", trainer->loss_scaler().scale,
                        trainer->loss_scaler().skipped_steps);
        }
        std::printf("\n");
    }
    std::cout << "checkpoint " << (out / "checkpoint").string() << ", metrics "
              << (out / "metrics.jsonl").string() << ", loss curve " << (out / "loss.png").string()
              << "\n";
    if (f.sample > 0) {
        SampleOptions s;
        s.max_new_tokens = f.sample;
        s.temperature = f.temperature;
        s.top_k = f.top_k;
        s.seed = c.seed;
        const std::string sample = setup.sample ? *setup.sample : sample_text(*trainer, f, device, s);
        std::ofstream(out / "sample.txt") << sample << "\n";
        std::cout << "\n--- sample (temperature " << f.temperature << ", top-k " << f.top_k
                  << ") ---\n" << sample << "\n";
    }
    return 0;
}


// --ranks N: this program again, as N ranks under mpirun on this machine. Each rank makes
// the checks below too; made here first, a mistake costs no start of mpirun. A rank that
// fails says why in one line; a rank that is killed cannot, so this process does.
int launch_ranks(const Flags& f, int argc, char** argv) {
#if ATTN_HAVE_MPI
    Job job;
    job.size = f.ranks;
    check_rank_options(f, job);
    check_simulator_choice(f);
    const TrainConfig config = planned_config(f, f.ranks);
    plan_device(f, planned_model(f, config), true, false);
    refuse_to_replace_a_run(f);
    mpi::LaunchOptions options;
    options.ranks = f.ranks;
    options.stop_line = "train_gpt: stopping: every rank ends its step, then a checkpoint is saved "
                        "(press Ctrl-C again to stop at once, without one)";
    const mpi::LaunchResult result =
        mpi::run_ranks(mpi::this_program(), std::vector<std::string>(argv + 1, argv + argc), options);
    if (result.status == 0) return 0;
    // A rank that ended the job with an error (MPI_Abort) has said why, and where to go on
    // from, in its own line; one killed cannot, so this process does.
    if (result.signal == 0 && result.status < 128) return result.status;
    std::cerr << "train_gpt: " << mpi::describe_end(result, f.ranks) << "; " << checkpoint_left(f)
              << "\n";
    return exit_error;
#else
    (void)argc;
    (void)argv;
    throw std::runtime_error("--ranks " + std::to_string(f.ranks) + ": this build has no MPI (install "
                             "libopenmpi-dev and openmpi-bin, then configure again)");
#endif
}

int run(const Flags& f, const Job& job) {
    if (f.threads > 0) set_num_threads(f.threads, "--threads");
#if ATTN_HAVE_MPI
    if (job.world) job.world->share_cpus();  // the ranks on one machine share its CPUs
#endif
    // The thread settings in force, once, before any work.
    std::cout << describe_threads() << "\n";
    if (f.threads_info) return 0;
    Setup setup;
#if ATTN_HAVE_MPI
    if (job.world) {
        // From now on a stop the launcher passes on (SIGUSR1) waits for the first step's end
        // instead of ending this rank in the middle of its setup.
        StopRequest early_stop;
        mpi::run_on_every_rank([&] { set_up(f, job, setup); });
        mpi::run_on_every_rank([&] { join_group(f, job, setup); });
        return train_or_dump(f, job, setup);
    }
#endif
    set_up(f, job, setup);
    return train_or_dump(f, job, setup);
}

}  // namespace

int main(int argc, char** argv) {
    // Started by mpirun: one rank of a data-parallel job. MPI first, so that one rank, not
    // all, answers a bad flag.
    Job job;
#if ATTN_HAVE_MPI
    std::optional<mpi::World> world;
    if (mpi::launched_by_mpirun()) {
        try {
            world.emplace(argc, argv);
        } catch (const std::exception& e) {
            std::cerr << "train_gpt: error: " << e.what() << "\n";
            return exit_error;
        }
        world->quiet_unless_rank0();
        job.world = &*world;
        job.rank = world->rank();
        job.size = world->size();
        job.started_by_mpirun = true;
    }
#endif
    std::ostream& errors = job.rank == 0 ? std::cerr : std::cout;  // rank 0 speaks for the job
    if (const std::string torchrun = torchrun_without_mpi(); !torchrun.empty()) {
        std::cerr << "train_gpt: error: " << torchrun << "\n";
        return exit_usage;
    }
    Flags f;
    CLI::App app{"Trains the course's GPT on a character corpus, on the CPU or a CUDA GPU (nanoGPT's recipes)."};
    auto* recipe = app.add_option("--recipe", f.recipe,
                                  "cpu (nanoGPT's CPU recipe, the default), tiny (seconds) or "
                                  "shakespeare (nanoGPT's train_shakespeare_char, for a GPU)")
        ->check(CLI::IsMember({"cpu", "tiny", "shakespeare"}));
    app.add_option("--data", f.data,
                   "the corpus, a UTF-8 text (default: tiny shakespeare, data/tinyshakespeare.txt)");
    app.add_option("--out", f.out, "the run folder: checkpoint/, metrics.jsonl, loss.png, sample.txt");
    auto* overwrite = app.add_flag("--overwrite", f.overwrite, "replace the run already in --out (without it, that is refused)");
    app.add_option("--consolidate", f.consolidate,
                   "DIR OUT: writes the sharded checkpoint of a run with --shard or --tensor-parallel (DIR: the run folder or its "
                   "checkpoint/) as one process's checkpoint in OUT, a tensor at a time, for serve_gpt and every "
                   "reader of that format; nothing else is done")
        ->expected(2);
    auto* resume = app.add_option("--resume", f.resume, "go on from a run folder or checkpoint");
    auto* init = app.add_option("--init", f.init, "start from a weights directory (e.g. from PyTorch); with --shard parameters each rank reads only its shard of them, a tensor at a time");
    resume->excludes(init);
    resume->excludes(overwrite);  // a resumed run goes on in its own folder
    resume->excludes(recipe);  // a resumed run keeps its checkpoint's settings
    app.add_option("--max-iters", f.max_iters, "steps in the run")->check(whole_number_at_least(1));
    app.add_option("--eval-interval", f.eval_interval, "evaluate every N steps")->check(whole_number_at_least(1))
        ->excludes(resume);
    app.add_option("--eval-iters", f.eval_iters, "batches per split in an evaluation")->check(whole_number_at_least(1))
        ->excludes(resume);
    app.add_option("--learning-rate", f.learning_rate, "the peak learning rate")->check(CLI::NonNegativeNumber)
        ->excludes(resume);
    app.add_option("--dropout", f.dropout, "dropout probability while training")->check(CLI::Range(0.0, 0.99))
        ->excludes(resume);
    app.add_option("--seed", f.seed, "seeds the weights, batches, dropout and sampling")
        ->excludes(resume);
    auto* no_causal_mask = app.add_flag("--no-causal-mask", f.no_causal_mask,
                 "train without the causal mask: every position sees the future (lesson 08)")
        ->excludes(resume)->excludes(init);
    app.add_option("--position", f.position,
                   "where position enters: learned (the default, nanoGPT's), rope or alibi (lesson 15)")
        ->check(CLI::IsMember({"learned", "rope", "alibi"}))
        ->excludes(resume)->excludes(init);
    app.add_flag("--no-attention-scale", f.no_attention_scale,
                 "train without the 1/sqrt(head size) on the attention scores (lesson 08)")
        ->excludes(resume)->excludes(init);
    app.add_option("--kv-heads", f.kv_heads,
                   "G key/value heads shared by n_head/G query heads each: 1 is multi-query, "
                   "n_head (the default) multi-head attention (lesson 16)")
        ->check(whole_number_at_least(1))
        ->excludes(resume)->excludes(init);
    app.add_option("--window", f.window,
                   "W: each query sees only the last W positions, itself included "
                   "(default: the whole context; lesson 16)")
        ->check(whole_number_at_least(1))
        ->excludes(resume)->excludes(init)
        ->excludes(no_causal_mask);  // a window is a causal mask
    auto* dump_grads = app.add_option("--dump-grads", f.dump_grads,
                   "write one step's gradients on the first batch (and the weights and batch) and exit")
        ->excludes(resume);
    app.add_option("--sample", f.sample, "characters to generate at the end (0: none)")->check(whole_number_at_least(0));
    app.add_option("--temperature", f.temperature, "sampling temperature (positive)");
    app.add_option("--top-k", f.top_k, "sample from the k most likely characters (0: all)");
    app.add_option("--prompt", f.prompt, "text the sample continues");
    app.add_option("--device", f.device,
                   "cpu (the default), cuda, auto (the GPU when there is one), or sim (the CUDA "
                   "code in the CUDA simulator, for tiny runs, in builds configured without a GPU)")
        ->check(CLI::IsMember({"cpu", "auto", "cuda", "sim"}));
    app.add_flag("--tf32", f.tf32, "on the GPU, let the matrix products use TF32 (faster, less exact)");
    app.add_option("--attention", f.attention,
                   "materialised (the default; (T, T) weights stored) or fused (lesson 13's "
                   "tiled attention, no (T, T) weights; on the GPU head size 64 or 128)")
        ->check(CLI::IsMember({"materialised", "fused"}));
    app.add_option("--precision", f.precision,
                   "fp32 (the default), bf16 or fp16: the matrix products' inputs rounded to that "
                   "format, their sums, the weights and AdamW in float32 (mixed precision, lesson "
                   "18; fp16 with dynamic loss scaling, on the CPU only; bf16 on the GPU too, its products "
                   "through cublasGemmEx)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
        ->excludes(resume);  // a resumed run keeps its checkpoint's precision
    app.add_option("--recompute", f.recompute,
                   "none (the default: every activation kept), attention (the attention weights "
                   "recomputed in the backward pass, Megatron's selective recomputation) or blocks "
                   "(only each block's input kept, its forward pass run again before its backward "
                   "pass, Chen et al. 2016): less memory, the same gradients bit for bit; on the "
                   "CPU only (lesson 21)")
        ->check(CLI::IsMember({"none", "attention", "blocks"}))
        ->excludes(resume);  // a resumed run keeps its checkpoint's
    app.add_option("--bench", f.bench, "time N training steps (no evaluation, no files) and exit")
        ->check(whole_number_at_least(1))
        ->excludes(dump_grads);  // each ends the program: one of them would be ignored
    app.add_option("--threads", f.threads,
                   "CPU threads for the library's loops and matrix products (default: "
                   "OMP_NUM_THREADS, else every CPU this process may use)")
        ->check(whole_number_at_least(1));
    app.add_flag("--threads-info", f.threads_info, "print the thread settings in force and exit");
    app.add_option("--ranks", f.ranks,
                   "train as N processes (MPI ranks) on this machine, each on its share of every "
                   "batch, with the same steps as one process (data parallelism, lesson 19; the "
                   "CPU model); on several machines start train_gpt with mpirun instead")
        ->check(whole_number_at_least(1));
    app.add_option("--batch-size", f.batch_size,
                   "sequences per step, per micro-batch with --grad-accum (default: the recipe's; with "
                   "ranks, shared by them)")
        ->check(whole_number_at_least(1))
        ->excludes(resume);
    app.add_option("--grad-accum", f.grad_accum,
                   "N micro-batches of the batch a step, their gradients added before one clipping and "
                   "update: one process's step on a batch N times larger, with one batch's activations "
                   "(nanoGPT's gradient_accumulation_steps; with ranks summed once, after the last, as "
                   "DDP's no_sync; the CPU model; lesson 19)")
        ->check(whole_number_at_least(1))
        ->excludes(resume);  // a resumed run keeps its checkpoint's
    app.add_flag("--batch-per-rank", f.batch_per_rank,
                 "with ranks: each rank trains on a whole batch of its own, so the step's batch is "
                 "the ranks times it (torchrun's habit) instead of one batch shared by them")
        ->excludes(resume);
    app.add_option("--allreduce", f.allreduce,
                   "how the ranks sum their gradients: overlapped (the default: bucket by bucket "
                   "while the backward pass runs) or after (one allreduce after it)")
        ->check(CLI::IsMember({"overlapped", "after"}));
    app.add_option("--shard", f.shard,
                   "with ranks: optimizer keeps AdamW's moments only for each rank's shard of the "
                   "parameters (ZeRO stage 1: gradients reduce-scattered, parameters all-gathered); "
                   "gradients keeps each rank's shard of the gradients too, each block's "
                   "reduce-scattered as the backward pass finishes it (ZeRO stage 2); parameters keeps each "
                   "rank's shard of the parameters too, each block's gathered just before each pass uses it "
                   "(ZeRO stage 3, PyTorch's FSDP; fp32 only; lesson 21)")
        ->check(CLI::IsMember({"optimizer", "gradients", "parameters"}));
    app.add_option("--tensor-parallel", f.tensor_parallel,
                   "with ranks: groups of N ranks split every block (heads and MLP units; Megatron-LM's "
                   "tensor parallelism), the groups sharing each batch; no rank holds the whole model: "
                   "each reads or draws its slices alone and saves them to a sharded checkpoint (resumable "
                   "on any layout, --consolidate for one process's); float32, no dropout, learned "
                   "positions (lesson 21)")
        ->check(whole_number_at_least(1));
    app.add_option("--bucket-cap-mb", f.bucket_cap_mb,
                   "with ranks: a gradient bucket takes whole blocks until it holds this many MiB, "
                   "then its sum starts (PyTorch DDP's bucket_cap_mb; default: each block its own bucket)")
        ->check(megabytes());
    app.add_option("--first-bucket-mb", f.first_bucket_mb,
                   "with --bucket-cap-mb: the first bucket's size, smaller so that the first sum "
                   "starts early (DDP: 1 MiB then 25 MiB)")
        ->check(megabytes());
    app.add_option("--collective-timeout", f.collective_timeout,
                   "with ranks: a training step that has not ended after S seconds (a rank frozen or "
                   "gone quiet, which would keep the others waiting for ever) ends the job in one line "
                   "naming the ranks that did not arrive, and the checkpoint to resume from "
                   "(default 300; 0: wait for ever)")
        ->check(timeout_seconds());
    app.add_flag("--bucket-view", f.bucket_view,
                 "with ranks: sum the gradients in place, range by range, instead of copying each "
                 "bucket into a buffer and the sum back (DDP's gradient_as_bucket_view)");
    std::string parse_error;
    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        parse_error = e.what();
    }
#if ATTN_HAVE_MPI
    // In a job the ranks may have been given different arguments (mpirun's MPMD form): they
    // agree on whether every rank parsed its own, and rank 0 says the first one's error.
    if (job.world) {
        try {
            mpi::run_on_every_rank([&] {
                if (!parse_error.empty()) throw std::invalid_argument(parse_error);
            });
        } catch (const mpi::JobError& e) {
            errors << "train_gpt: " << (e.every_rank() ? "" : "rank " + std::to_string(e.rank()) + " on " + e.host() + ": ")
                   << e.what() << " (see --help)\n";
            return exit_usage;
        }
    }
#endif
    if (!parse_error.empty()) {
        errors << "train_gpt: " << parse_error << " (see --help)\n";
        return exit_usage;
    }
    if (!f.consolidate.empty()) {  // an offline conversion, in one process
        if (argc != 4 || job.parallel()) {
            errors << "train_gpt: --consolidate DIR OUT runs alone, in one process: give it no other option\n";
            return exit_usage;
        }
        try {
            consolidate_checkpoint(checkpoint_of(f.consolidate[0]), f.consolidate[1]);
        } catch (const std::exception& e) {
            std::cerr << "train_gpt: error: " << e.what() << "\n";
            return exit_error;
        }
        std::cout << "wrote " << f.consolidate[1].string() << ": the checkpoint of "
                  << checkpoint_of(f.consolidate[0]).string() << " in one process's format\n";
        return 0;
    }
    if (!job.started_by_mpirun && f.ranks > 0) {
        try {
            return launch_ranks(f, argc, argv);
        } catch (const std::exception& e) {
            std::cerr << "train_gpt: error: " << e.what() << "\n";
            return exit_error;
        }
    }
    try {
        return run(f, job);
    } catch (const TrainingDiverged& e) {
        // With ranks every rank finds it at the same step: rank 0 says so, all end alike.
        std::cout.flush();
        errors << "train_gpt: " << e.what() << "; the last checkpoint in "
               << (f.resume.empty() ? f.out : f.resume).string() << " is left as it was\n";
        return exit_diverged;
#if ATTN_HAVE_MPI
    } catch (const mpi::JobError& e) {
        // Setting up failed on some rank; every rank knows the first one's reason.
        std::cout.flush();
        errors << "train_gpt: error: "
               << (e.every_rank() ? "" : "rank " + std::to_string(e.rank()) + " on " + e.host() + ": ")
               << e.what() << "\n";
        return exit_error;
#endif
    } catch (const std::exception& e) {
        std::cout.flush();
#if ATTN_HAVE_MPI
        // The other ranks may be waiting for this one in a collective call: end them all,
        // in one line that says where the run can go on from.
        if (job.size > 1) {
            // one write: mpirun's own lines may come between two writes of the line
            const std::string line = "train_gpt: error: rank " + std::to_string(job.rank) + ": " + e.what() +
                                     "; " + checkpoint_left(f) + "\n";
            std::cerr << line << std::flush;
            mpi::abort_job(exit_error);
        }
#endif
        std::cerr << "train_gpt: error: " << e.what() << "\n";
        return exit_error;
    }
}
