// Lesson 09: the transformer language model. The page that narrates this program is
// lesson.md beside it.
#include "attn/data.hpp"
#include "attn/entropy.hpp"
#include "attn/gpt.hpp"
#include "attn/gpt_inspect.hpp"
#include "attn/lesson.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"
#include "attn/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
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

// The log of Σ_v exp(z_v) over one position's V logits, with the maximum subtracted first
// (lesson 04) so that nothing overflows.
double log_sum_exp(const float* z, std::size_t V) {
    const double m = *std::max_element(z, z + V);
    double sum = 0.0;
    for (std::size_t v = 0; v < V; ++v) sum += std::exp(z[v] - m);
    return m + std::log(sum);
}

// The root mean square of every entry of t.
double rms(const Tensor4& t) {
    double sum2 = 0;
    for (float v : t) sum2 += double(v) * v;
    return std::sqrt(sum2 / double(t.size()));
}

// The root mean square of the raw scores q_i · k_j over the pairs a causal head uses (j ≤ i).
double rms_causal_scores(const Tensor4& q, const Tensor4& k) {
    double sum2 = 0;
    std::size_t n = 0;
    const auto& s = q.shape();  // (B, NH, T, hs)
    for (std::size_t b = 0; b < s[0]; ++b)
        for (std::size_t h = 0; h < s[1]; ++h)
            for (std::size_t i = 0; i < s[2]; ++i)
                for (std::size_t j = 0; j <= i; ++j, ++n) {
                    double dot = 0;
                    for (std::size_t c = 0; c < s[3]; ++c) dot += double(q(b, h, i, c)) * k(b, h, j, c);
                    sum2 += dot * dot;
                }
    return std::sqrt(sum2 / double(n));
}

// A character as the output can show it, quoted, the newline as \n: 'a', ' ', '\n'.
std::string shown(const std::string& c) { return "'" + (c == "\n" ? std::string("\\n") : c) + "'"; }

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

        print_heading("The next-token objective: the loss by hand");
        const std::size_t V = static_cast<std::size_t>(config.vocab_size);
        //! [cross_entropy]
        // Position n predicts y[n]: its probability is the softmax of that position's logits,
        // and the loss is the mean of −ln p(target) over all B·T positions.
        const std::vector<float>& logits = model.logits();  // (B, T, V)
        std::vector<double> p_target(x.size());             // (B·T)
        double sum_nll = 0.0;
        for (std::size_t n = 0; n < x.size(); ++n) {
            const float* z = logits.data() + n * V;
            p_target[n] = std::exp(z[y[n]] - log_sum_exp(z, V));
            sum_nll += -std::log(p_target[n]);
        }
        const double loss_by_hand = sum_nll / static_cast<double>(x.size());
        //! [cross_entropy]
        std::printf("sequence 0, its first positions:\n  t   reads   target   p(target)   -ln p(target)\n");
        for (int t = 0; t < 6; ++t) {
            std::printf("%3d   %5s   %6s   %9.4f   %13.4f\n", t, shown(vocab.at(x[t])).c_str(),
                        shown(vocab.at(y[t])).c_str(), p_target[t], -std::log(p_target[t]));
        }
        std::printf("mean of -ln p(target) over all %d positions: %.4f; GPT::forward's loss: %.4f\n",
                    B * T, loss_by_hand, static_cast<double>(loss));
        print_claim("example_input", shown(vocab.at(x[0])));
        print_claim("example_target", shown(vocab.at(y[0])));
        print_claim("example_p", p_target[0], 4);
        print_claim("example_nll", -std::log(p_target[0]), 4);
        print_claim("positions", std::to_string(B * T));
        print_claim("loss_by_hand", loss_by_hand, 4);

        //! [init_loss]
        // A model that knows nothing gives every character 1/V: −ln(1/V) = ln V, whatever
        // the target. One that knows only how often each character occurs scores the
        // entropy of those frequencies.
        const double uniform_loss = std::log(static_cast<double>(V));
        std::vector<double> count(V, 0.0);
        for (int id : ids) count[static_cast<std::size_t>(id)] += 1.0;
        double unigram_loss = 0.0;
        for (double c : count) {
            const double frequency = c / static_cast<double>(ids.size());
            if (c > 0) unigram_loss -= frequency * std::log(frequency);
        }
        //! [init_loss]
        std::printf("\nknowing nothing (every character 1/V):     ln V = ln %zu = %.4f nats, perplexity %zu\n",
                    V, uniform_loss, V);
        std::printf("knowing only the characters' frequencies:  %.4f nats, perplexity %.2f\n", unigram_loss,
                    std::exp(unigram_loss));
        std::printf("this model at initialisation:              %.4f nats, perplexity %.2f, %.3f bits per character\n",
                    static_cast<double>(loss), std::exp(static_cast<double>(loss)),
                    static_cast<double>(loss) / std::log(2.0));
        print_claim("unigram_loss", unigram_loss, 2);
        print_claim("unigram_perplexity", std::exp(unigram_loss), 1);
        print_claim("init_perplexity", std::exp(static_cast<double>(loss)), 2);
        print_claim("init_bits", static_cast<double>(loss) / std::log(2.0), 3);

        print_heading("The loss at initialisation");
        // If the targets had nothing to do with the input, the expected loss at a position
        // would be the mean of −ln p over all V possible targets: log-sum-exp(z) − mean(z).
        double random_target_loss = 0.0, logit_variance = 0.0;
        for (std::size_t n = 0; n < x.size(); ++n) {
            const float* z = logits.data() + n * V;
            double mean = 0.0, var = 0.0;
            for (std::size_t v = 0; v < V; ++v) mean += z[v] / static_cast<double>(V);
            for (std::size_t v = 0; v < V; ++v) var += (z[v] - mean) * (z[v] - mean) / static_cast<double>(V);
            random_target_loss += (log_sum_exp(z, V) - mean) / static_cast<double>(x.size());
            logit_variance += var / static_cast<double>(x.size());
        }
        std::printf("loss %.4f, ln V = ln %d = %.4f\n", static_cast<double>(loss), config.vocab_size,
                    uniform_loss);
        std::printf("logits: standard deviation over the vocabulary %.3f (root mean square over positions)\n",
                    std::sqrt(logit_variance));
        std::printf("expected loss for targets unrelated to the input: %.4f = ln V %+.4f (sigma^2/2 = %.4f)\n",
                    random_target_loss, random_target_loss - uniform_loss, logit_variance / 2);
        print_claim("vocab_size", std::to_string(config.vocab_size));
        print_claim("init_loss", loss, 4);
        print_claim("ln_v", uniform_loss, 4);
        print_claim("init_loss_vs_ln_v", loss < uniform_loss ? "below" : "above");
        print_claim("init_loss_gap", std::fabs(loss - uniform_loss), 4);
        print_claim("logit_std", std::sqrt(logit_variance), 3);
        print_claim("half_logit_variance", logit_variance / 2, 3);
        print_claim("random_target_loss", random_target_loss, 4);
        print_claim("random_target_excess", random_target_loss - uniform_loss, 4);

        print_heading("Attention at initialisation: q and k are far from unit variance");
        std::vector<std::pair<std::string, double>> init_claims;  // printed after the table
        std::cout << "recipe        hs   rms q_c   rms k_c   rms q·k   predicted   entropy scaled / unscaled   uniform\n";
        Rng token_rng(1337);
        for (const char* recipe : {"cpu", "shakespeare"}) {
            //! [course_init]
            // The GPT as initialised for nanoGPT's two recipes (tiny shakespeare's 65
            // characters), on random tokens: every layer's q and k (a LayerNorm, then
            // N(0, 0.02²) weights), and the attention entropy with the scale and, same
            // weights, without it.
            GPTConfig sizes = TrainConfig::named(recipe).model_config(65);
            const int Bq = 2, Tq = sizes.block_size, hs = sizes.n_embd / sizes.n_head;
            std::vector<int> tokens(static_cast<std::size_t>(Bq * Tq));
            for (int& t : tokens) t = static_cast<int>(token_rng.below(65));
            GPT scaled(sizes, 1337);
            sizes.scaled_attention = false;
            GPT unscaled(sizes, 1337);  // the same weights: only the 1/√hs is gone
            scaled.forward(tokens, {}, Bq, Tq);
            unscaled.forward(tokens, {}, Bq, Tq);
            double q_ms = 0, k_ms = 0, qk_ms = 0, h_scaled = 0, h_unscaled = 0;
            for (int l = 0; l < sizes.n_layer; ++l) {
                const Tensor4 q_l = attention_queries_or_keys(scaled, l, 0);  // (B, NH, T, hs)
                const Tensor4 k_l = attention_queries_or_keys(scaled, l, 1);  // (B, NH, T, hs)
                q_ms += rms(q_l) * rms(q_l) / sizes.n_layer;
                k_ms += rms(k_l) * rms(k_l) / sizes.n_layer;
                qk_ms += std::pow(rms_causal_scores(q_l, k_l), 2) / sizes.n_layer;
                h_scaled += xt::mean(mean_entropy_per_head(attention_weights(scaled, l)))() / sizes.n_layer;
                h_unscaled += xt::mean(mean_entropy_per_head(attention_weights(unscaled, l)))() / sizes.n_layer;
            }
            // Var(q_c) ≈ C·0.02² (C unit-variance inputs times N(0, 0.02²) weights), and a dot
            // product of hs such products: rms(q·k) ≈ √hs · C · 0.02².
            const double predicted = std::sqrt(double(hs)) * sizes.n_embd * 0.02 * 0.02;
            //! [course_init]
            const double uniform = uniform_causal_entropy(static_cast<std::size_t>(Tq));
            std::printf("%-12s %3d   %7.3f   %7.3f   %7.3f   %9.3f   %7.3f / %.3f             %.3f\n", recipe,
                        hs, std::sqrt(q_ms), std::sqrt(k_ms), std::sqrt(qk_ms), predicted, h_scaled,
                        h_unscaled, uniform);
            const std::string tag = std::string(recipe) == "cpu" ? "cpu" : "gpu";
            init_claims.insert(init_claims.end(),
                               {{"hs_" + tag, hs}, {"sqrt_hs_" + tag, std::sqrt(double(hs))},
                                {"q_rms_" + tag, std::sqrt(q_ms)}, {"qk_rms_" + tag, std::sqrt(qk_ms)},
                                {"qk_predicted_" + tag, predicted}, {"entropy_scaled_" + tag, h_scaled},
                                {"entropy_unscaled_" + tag, h_unscaled}, {"entropy_uniform_" + tag, uniform}});
        }
        std::cout << "\nthe numbers the page quotes:\n";
        for (const auto& [name, value] : init_claims) {
            if (name.rfind("hs_", 0) == 0) print_claim(name, std::to_string(static_cast<int>(value)));
            else print_claim(name, value, name.rfind("sqrt_", 0) == 0 ? 1 : 2);
        }

        print_heading("Causal: a later character cannot change an earlier prediction");
        //! [causal]
        std::vector<float> before = model.logits();
        std::vector<int> x_changed = x;
        x_changed[20] = (x_changed[20] + 1) % config.vocab_size;  // sequence 0, position 20
        model.forward(x_changed, {}, B, T);
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
