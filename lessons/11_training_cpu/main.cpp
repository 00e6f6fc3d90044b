// Lesson 11: training on the CPU. The page that narrates this program is lesson.md beside it.
//
// It trains nanoGPT's CPU recipe on tiny shakespeare (about five minutes on two cores). The
// environment variable ATTN_LESSON11_MAX_ITERS shortens the run (the test suite sets it;
// the docs show the full run).
#include "attn/checkpoint.hpp"
#include "attn/data.hpp"
#include "attn/lesson.hpp"
#include "attn/print.hpp"
#include "attn/run_control.hpp"
#include "attn/threads.hpp"
#include "attn/trainer.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <unistd.h>

using namespace attn;
namespace fs = std::filesystem;

namespace {

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 11: training on the CPU", [](const LessonOptions& opts) {
        print_heading("The corpus");
        //! [data]
        const fs::path corpus = find_corpus(&std::cout);
        const TextDataset data = make_dataset(read_corpus(corpus));  // 90% train, 10% val
        //! [data]
        std::printf("%s: %zu characters, vocabulary of %zu, %zu train / %zu val tokens\n",
                    corpus.filename().c_str(), data.train.size() + data.val.size(),
                    data.vocab.size(), data.train.size(), data.val.size());

        print_heading("The recipe");
        //! [recipe]
        TrainConfig config = TrainConfig::named("cpu");  // nanoGPT's CPU recipe
        //! [recipe]
        if (const char* quick = std::getenv("ATTN_LESSON11_MAX_ITERS")) {
            config.max_iters = std::max(1, std::atoi(quick));
            std::printf("(ATTN_LESSON11_MAX_ITERS=%s: a shortened run; the docs show the full one)\n",
                        quick);
        }
        std::printf("model: %d layers, %d heads, %d channels, block %d, dropout %.1f, bias %s\n",
                    config.n_layer, config.n_head, config.n_embd, config.block_size,
                    static_cast<double>(config.dropout), config.bias ? "yes" : "no");
        std::printf("steps: %lld of batch %d (%d tokens each), AdamW betas (%.2f, %.2f), "
                    "weight decay %.1f, clip %.1f\n",
                    static_cast<long long>(config.max_iters), config.batch_size,
                    config.batch_size * config.block_size, static_cast<double>(config.beta1),
                    static_cast<double>(config.beta2), static_cast<double>(config.weight_decay),
                    static_cast<double>(config.grad_clip));
        std::printf("evaluation: every %lld steps, %lld batches of each split\n",
                    static_cast<long long>(config.eval_interval),
                    static_cast<long long>(config.eval_iters));

        print_heading("The learning-rate schedule");
        Trainer trainer(config, data);
        for (std::int64_t step : {0, 9, 49, 99, 100, 500, 1000, 1500, 1999, 2000}) {
            std::printf("step %4lld: lr %.3e\n", static_cast<long long>(step),
                        trainer.learning_rate(step));
        }

        print_heading("Training");
        std::printf("%s\n", describe_threads().c_str());
        std::printf("%lld parameters; at initialisation the loss should be about ln %zu = %.4f\n",
                    static_cast<long long>(trainer.model().config().num_parameters()),
                    data.vocab.size(), std::log(static_cast<double>(data.vocab.size())));
        //! [train]
        RunOptions options;
        options.log = &std::cout;        // "step 250: train loss ..., val loss ..."
        options.progress = &std::cerr;   // step, loss, lr, tokens/s, ETA
        options.progress_is_terminal = ::isatty(2);
        const RunSummary run = run_training(trainer, options);
        //! [train]
        const EvalRecord& last = run.evals.back();
        const double tokens = static_cast<double>(run.steps.size()) * config.batch_size * config.block_size;
        std::printf("\nfinal: train loss %.4f, val loss %.4f (nanoGPT reports about 1.88 for this recipe)\n",
                    last.train_loss, last.val_loss);
        std::printf("wall time %s for %zu steps and %zu evaluations: %.0f tokens/s overall\n",
                    format_duration(run.seconds).c_str(), run.steps.size(), run.evals.size(),
                    tokens / run.seconds);
        std::printf("the training steps alone: %.1f ms/step, %.0f tokens/s on this machine\n",
                    1e3 * run.step_seconds / static_cast<double>(run.steps.size()),
                    tokens / run.step_seconds);
        if (!opts.figures.empty()) {
            plot_losses(opts.figures / "lesson11_loss.png", run.steps, run.evals,
                        "CPU recipe, " + corpus.stem().string());
            // The trained weights, for the attention inspector (`./workbook inspect`), with
            // the corpus they learnt from.
            const fs::path model_dir = opts.figures / "lesson11_model";
            save_checkpoint(model_dir, trainer.model(), {data.vocab.chars(), trainer.step()});
            std::ofstream(model_dir / "corpus.txt")
                << (corpus.filename() == "tinyshakespeare.txt"
                        ? std::string("tiny shakespeare")
                        : "the fallback corpus " + corpus.string() + " (tiny shakespeare was not found)")
                << "\n";
        }

        print_heading("Resuming reproduces the losses exactly");
        //! [resume]
        const fs::path checkpoint = fs::temp_directory_path() /
                                    ("attn_lesson11_checkpoint_" + std::to_string(::getpid()));
        trainer.save(checkpoint);
        Trainer resumed = Trainer::load(checkpoint, data);
        trainer.set_max_iters(trainer.step() + 5);
        resumed.set_max_iters(resumed.step() + 5);
        //! [resume]
        bool identical = true;
        for (int i = 0; i < 5; ++i) {
            const StepRecord a = trainer.train_step(), b = resumed.train_step();
            identical = identical && a.loss == b.loss;
            std::printf("step %lld: went on %.7f   reloaded %.7f\n", static_cast<long long>(a.step),
                        static_cast<double>(a.loss), static_cast<double>(b.loss));
        }
        fs::remove_all(checkpoint);
        std::printf("bit for bit identical: %s\n", identical ? "yes" : "NO");

        print_heading("Samples");
        //! [sample]
        SampleOptions sample;
        sample.max_new_tokens = 300;
        sample.temperature = 0.8f;
        const std::string text = generate_text(resumed.model(), data.vocab, "", sample);
        //! [sample]
        std::cout << "temperature 0.8, all characters:\n" << text << "\n\n";
        sample.max_new_tokens = 150;
        sample.temperature = 1.0f;
        sample.top_k = 1;
        std::cout << "top-k 1 (always the most likely character):\n"
                  << generate_text(resumed.model(), data.vocab, "ROMEO:", sample) << "\n\n";
        sample.temperature = 2.0f;
        sample.top_k = 0;
        std::cout << "temperature 2.0 (flattened: nearly random characters):\n"
                  << generate_text(resumed.model(), data.vocab, "ROMEO:", sample) << "\n";
    });
}
