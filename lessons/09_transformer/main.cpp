// Lesson 09: the transformer language model. The page that narrates this program is
// lesson.md beside it.
#include "attn/data.hpp"
#include "attn/gpt.hpp"
#include "attn/lesson.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace attn;

namespace {

// A few lines to read: enough characters for a vocabulary and a batch.
const char* const text =
    "Attention is a weighted average whose weights the data choose.\n"
    "Each token asks a question, every earlier token answers,\n"
    "and the answers that fit the question best count the most.\n"
    "Stack a few of these, with a little arithmetic between them,\n"
    "and the model starts to guess the next letter of a line.\n";

// The text with its line breaks shown as \n, to print it on one line.
std::string one_line(const std::string& s) {
    std::string out;
    for (char c : s) out += c == '\n' ? std::string("\\n") : std::string(1, c);
    return out;
}

// The largest |a − b| over two equally long float ranges.
float max_abs_diff(const float* a, const float* b, std::size_t n) {
    float worst = 0.0f;
    for (std::size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
    return worst;
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 09: the transformer language model", [](const LessonOptions&) {
        //! [config]
        const CharVocab vocab = CharVocab::from_text(text);
        GPTConfig config;                                 // nanoGPT's CPU recipe, but our vocabulary
        config.vocab_size = static_cast<int>(vocab.size());  // V
        config.block_size = 64;                           // longest context
        config.n_layer = 4;                               // L blocks
        config.n_head = 4;                                // NH heads of hs = 32 channels
        config.n_embd = 128;                              // C
        GPT model(config, /*seed=*/1337);
        //! [config]

        print_heading("The parameters, with nanoGPT's names and PyTorch's shapes");
        for (const ParameterInfo& p : model.parameter_table()) {
            // layers 1..L-1 repeat layer 0's tensors: print layer 0 only
            if (p.name.rfind("transformer.h.", 0) == 0 && p.name.rfind("transformer.h.0.", 0) != 0) continue;
            std::printf("%-36s %-10s %s\n", p.name.c_str(), format_shape(p.shape).c_str(),
                        p.decay ? "decayed" : "");
        }
        std::printf("(transformer.h.1 to h.%d repeat h.0; lm_head.weight is transformer.wte.weight)\n",
                    config.n_layer - 1);
        std::printf("parameters: %zu  (V = %d, C = %d, L = %d)\n", config.num_parameters(),
                    config.vocab_size, config.n_embd, config.n_layer);

        print_heading("One forward pass: a batch of B = 4 sequences of T = 32 characters");
        //! [forward]
        const std::vector<int> ids = vocab.encode(text);
        const int B = 4, T = 32;
        std::vector<int> x(B * T), y(B * T);
        Rng rng(7);
        sample_batch(ids, B, T, rng, x, y);  // y is x shifted one character left
        const float loss = model.forward(x, y, B, T);
        //! [forward]
        std::printf("input  x[0]: \"%s\"\n", one_line(vocab.decode({x.begin(), x.begin() + T})).c_str());
        std::printf("target y[0]: \"%s\"\n", one_line(vocab.decode({y.begin(), y.begin() + T})).c_str());
        const Activations& a = model.activations();
        // The buffers the forward pass filled (per block: the first of L stacked copies).
        const std::size_t L = static_cast<std::size_t>(config.n_layer);
        const auto row = [](const char* what, const char* shape, std::size_t floats) {
            std::printf("%-28s %-14s %8zu floats\n", what, shape, floats);
        };
        row("embeddings wte[x] + wpe", "(B, T, C)", a.encoded.size());
        row("qkv = c_attn(ln_1(x))", "(B, T, 3C)", a.qkv.size() / L);
        row("attention weights", "(B, NH, T, T)", a.att.size() / L);
        row("MLP hidden gelu(c_fc(.))", "(B, T, 4C)", a.fch_gelu.size() / L);
        row("logits ln_f(x) wte^T", "(B, T, V)", a.logits.size());

        print_heading("The loss at initialisation");
        //! [init_loss]
        const double uniform_loss = std::log(static_cast<double>(config.vocab_size));  // ln V
        //! [init_loss]
        float logit_min = a.logits[0], logit_max = a.logits[0];
        double sum_sq = 0.0;
        for (float z : a.logits) {
            logit_min = std::min(logit_min, z);
            logit_max = std::max(logit_max, z);
            sum_sq += static_cast<double>(z) * z;
        }
        std::printf("loss %.4f, ln V = ln %d = %.4f\n", static_cast<double>(loss),
                    config.vocab_size, uniform_loss);
        const double logit_rms = std::sqrt(sum_sq / static_cast<double>(a.logits.size()));
        std::printf("logits lie in [%.3f, %.3f], rms %.3f: every character about equally likely\n",
                    static_cast<double>(logit_min), static_cast<double>(logit_max), logit_rms);
        print_claim("vocab_size", std::to_string(config.vocab_size));
        print_claim("init_loss", loss, 4);
        print_claim("ln_v", uniform_loss, 4);
        print_claim("init_loss_vs_ln_v", loss < uniform_loss ? "below" : "above");
        print_claim("init_loss_minus_ln_v", loss - uniform_loss, 4);
        print_claim("logit_rms", logit_rms, 3);
        print_claim("half_logit_variance", logit_rms * logit_rms / 2, 3);

        print_heading("Causal: a later character cannot change an earlier prediction");
        //! [causal]
        std::vector<float> before = model.logits();
        std::vector<int> x_changed = x;
        x_changed[20] = (x_changed[20] + 1) % config.vocab_size;  // sequence 0, position 20
        model.forward(x_changed, {}, B, T);
        const std::size_t V = static_cast<std::size_t>(config.vocab_size);
        //! [causal]
        const float* after = model.logits().data();
        const double earlier_change = max_abs_diff(before.data(), after, 20 * V);
        std::printf("positions 0..19 of sequence 0: largest logit change %.3g\n", earlier_change);
        print_claim("earlier_change", earlier_change, 1);
        std::printf("positions 20..31 of sequence 0: largest logit change %.3g\n",
                    static_cast<double>(max_abs_diff(before.data() + 20 * V, after + 20 * V, 12 * V)));
        std::printf("sequences 1..3: largest logit change %.3g\n",
                    static_cast<double>(max_abs_diff(before.data() + T * V, after + T * V, 3 * T * V)));
    });
}
