// Lesson 17: attention between two sequences. The page that narrates this program is
// lesson.md beside it.
//
// It shows key padding masks on a batch of sequences of different lengths (a padded batch
// gives each sequence what it gets alone; a context that is all padding gives zeros; what
// −1e9 in place of −∞ does), the two alignments of a causal mask with T_q ≠ T_k and which
// one chunked prefill needs, then trains a small pre-norm encoder–decoder to rewrite dates
// ("the 23rd of November, 2026" -> "2026-11-23"), reports its exact-match accuracy on
// held-out dates, decodes greedily with the encoder's keys and values computed once, and
// draws the cross-attention of a trained example. `--quick` takes a few steps only.
#include "attn/date_task.hpp"
#include "attn/encoder_decoder.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/print.hpp"
#include "attn/sdpa.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

using namespace attn;
namespace fs = std::filesystem;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string drawn(const Mask<2>& m) {
    std::string s;
    for (std::size_t i = 0; i < m.shape()[0]; ++i) {
        s += "  ";
        for (std::size_t j = 0; j < m.shape()[1]; ++j) s += m(i, j) ? " x" : " .";
        s += "\n";
    }
    return s;
}

double max_abs_diff(const Tensor3& a, const Tensor3& b) { return xt::amax(xt::abs(a - b))(); }

// A batch of examples: each a date in one of the formats, and its ISO form.
struct Examples {
    std::vector<std::vector<int>> sources, targets;
    std::vector<std::string> inputs, answers;
    std::vector<int> formats;
};

Examples draw_examples(Rng& rng, const Seq2SeqVocab& vocab, int n, bool from_held_out) {
    Examples e;
    for (int i = 0; i < n; ++i) {
        const Date d = random_date(rng, from_held_out);
        const int format = static_cast<int>(rng.below(date_format_count));
        e.inputs.push_back(date_text(d, format));
        e.answers.push_back(iso_date(d));
        e.formats.push_back(format);
        e.sources.push_back(vocab.encode(e.inputs.back()));
        e.targets.push_back(vocab.encode(e.answers.back()));
    }
    return e;
}

// Greedy decoding in batches of 256; returns the decoded texts.
std::vector<std::string> decode_all(EncoderDecoder& model, const Seq2SeqVocab& vocab,
                                    const std::vector<std::vector<int>>& sources, int max_length,
                                    CausalAlignment step = CausalAlignment::bottom_right,
                                    bool cached = true) {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < sources.size(); i += 256) {
        const std::vector<std::vector<int>> chunk(sources.begin() + static_cast<long>(i),
                                                  sources.begin() + static_cast<long>(std::min(sources.size(), i + 256)));
        const auto ids = cached ? model.greedy_decode(chunk, max_length, step)
                                : model.greedy_decode_uncached(chunk, max_length);
        for (const auto& s : ids) out.push_back(vocab.decode(s));
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 17: attention between two sequences", [](const LessonOptions& opts) {
        print_heading("A padded batch and its key padding mask");
        //! [padding]
        // Three sequences of 5, 3 and 0 tokens, right-padded to T = 5; 2 heads of size 4.
        const std::vector<std::size_t> lengths = {5, 3, 0};
        const std::size_t B = 3, NH = 2, T = 5, hs = 4;
        Rng rng(17);
        const Tensor4 x = rng.normal_tensor<4>({B, NH, T, hs});  // q = k = v: self-attention
        const Mask<4> padding = key_padding_mask<4>(lengths, T);  // (B, 1, 1, T)
        Tensor4 weights;
        const Tensor4 out = scaled_dot_product_attention(x, x, x, padding, &weights);
        //! [padding]
        for (std::size_t b = 0; b < B; ++b) {
            std::printf("sequence %zu (%zu real tokens): key mask ", b, lengths[b]);
            for (std::size_t j = 0; j < T; ++j) std::printf("%c", padding(b, 0, 0, j) ? 'x' : '.');
            std::printf("\n");
        }
        std::printf("\nweights of sequence 1, head 0 (rows: queries 0-4, columns: keys 0-4):\n%s",
                    format_tensor(Tensor2(xt::view(weights, 1, 0))).c_str());

        // The rule: sequence b's outputs at its real positions are what it gets alone.
        double worst_alone = 0.0;
        for (std::size_t b = 0; b < 2; ++b) {
            const std::size_t n = lengths[b];
            const Tensor3 xb = xt::view(x, b, xt::all(), xt::range(0, n));
            const Tensor3 alone = scaled_dot_product_attention(xb, xb, xb);
            const Tensor3 mine = xt::view(out, b, xt::all(), xt::range(0, n));
            worst_alone = std::max(worst_alone, max_abs_diff(mine, alone));
        }
        std::printf("\npadded batch against each sequence alone, real positions: max |difference| = %.1e\n",
                    worst_alone);
        // The padded queries of sequence 1 (positions 3 and 4) still get outputs: they attend
        // to the real keys like any query. Nothing in the mask stops that; the loss must.
        const double padded_query_norm = xt::amax(xt::abs(xt::view(out, 1, xt::all(), xt::range(3, 5))))();
        std::printf("sequence 1's padded queries 3-4: largest |output| = %.3f (not zero: they must not "
                    "reach the loss)\n", padded_query_norm);
        const double all_padding = xt::amax(xt::abs(xt::view(out, 2)))();
        std::printf("sequence 2, all padding: largest |output| = %.1f, largest weight = %.1f, NaN: %s\n",
                    all_padding, static_cast<double>(xt::amax(xt::view(weights, 2))()),
                    xt::any(xt::isnan(out)) ? "yes" : "no");
        print_claim("alone_difference", worst_alone < 1e-6 ? "below 1e-6" : "ABOVE 1e-6");
        print_claim("padded_query_output", padded_query_norm, 3);

        // What a finite "minus infinity" does to the all-padding row: every score is −1e9, the
        // row's maximum is −1e9, and the softmax of a row of equal numbers is uniform.
        //! [minus_1e9]
        // one query whose 5 keys are all padding
        Tensor3 finite = xt::zeros<float>({std::size_t{1}, std::size_t{1}, T});
        Tensor3 infinite = finite;
        for (std::size_t j = 0; j < T; ++j) {
            finite(0, 0, j) = -1e9f;             // "minus a lot"
            infinite(0, 0, j) = minus_infinity;  // minus infinity
        }
        const Tensor3 w_finite = softmax(finite), w_infinite = softmax(infinite);
        //! [minus_1e9]
        std::printf("\nan all-padding row with -1e9 for the hidden scores: weights %s", format_tensor(Tensor1(xt::view(w_finite, 0, 0))).c_str());
        std::printf("\n                              with -inf: weights %s\n",
                    format_tensor(Tensor1(xt::view(w_infinite, 0, 0))).c_str());
        print_claim("minus_1e9_weight", static_cast<double>(w_finite(0, 0, 0)), 2);

        print_heading("Causal masks when T_q != T_k");
        //! [alignment]
        // PyTorch's is_causal, and FlashAttention's causal=True (from 2.1)
        const Mask<2> top_left = causal_mask(3, 5, CausalAlignment::top_left);
        const Mask<2> bottom_right = causal_mask(3, 5, CausalAlignment::bottom_right);
        //! [alignment]
        std::printf("3 queries, 5 keys, top-left:\n%s", drawn(top_left).c_str());
        std::printf("3 queries, 5 keys, bottom-right:\n%s", drawn(bottom_right).c_str());
        try {
            causal_mask(3, 5);
        } catch (const std::invalid_argument& e) {
            std::printf("without an alignment: %s\n", e.what());
        }

        // Chunked prefill: a prompt of 8 tokens processed as chunks of 3, 3 and 2, each
        // chunk's queries against the cache (every key so far, lesson 14's) plus its own keys.
        //! [prefill]
        const std::size_t P = 8;
        const Tensor3 q = rng.normal_tensor<3>({1, P, hs}), k = rng.normal_tensor<3>({1, P, hs}),
                      v = rng.normal_tensor<3>({1, P, hs});
        const Tensor3 whole = scaled_dot_product_attention(q, k, v, causal_mask(P));  // all at once
        for (CausalAlignment a : {CausalAlignment::bottom_right, CausalAlignment::top_left}) {
            double worst = 0.0;
            for (std::size_t start = 0; start < P; start += 3) {
                const std::size_t end = std::min(P, start + 3);  // queries [start, end)
                const Tensor3 qc = xt::view(q, xt::all(), xt::range(start, end));
                const Tensor3 kc = xt::view(k, xt::all(), xt::range(0, end));  // cache + chunk
                const Tensor3 vc = xt::view(v, xt::all(), xt::range(0, end));
                const Tensor3 chunk = scaled_dot_product_attention(qc, kc, vc, causal_mask(end - start, end, a));
                worst = std::max(worst, max_abs_diff(chunk, xt::view(whole, xt::all(), xt::range(start, end))));
            }
            std::printf("chunked prefill (chunks of 3 over 8 tokens) with %s alignment: max |difference| "
                        "from the whole prompt at once = %.2g\n", alignment_name(a), worst);
            print_claim(a == CausalAlignment::top_left ? "prefill_top_left" : "prefill_bottom_right",
                        a == CausalAlignment::top_left ? (worst > 0.01 ? "wrong" : "RIGHT?")
                                                       : (worst < 1e-6 ? "exact" : "INEXACT"));
        }
        //! [prefill]

        print_heading("The task: dates written many ways");
        const Seq2SeqVocab vocab(CharVocab::from_chars(date_characters()));
        Rng data_rng(2026);
        for (int f = 0; f < date_format_count; ++f) {
            const Date d = random_date(data_rng, false);
            std::printf("  %-30s -> %s\n", ("\"" + date_text(d, f) + "\"").c_str(), iso_date(d).c_str());
        }
        const int n_test = opts.quick ? 64 : 1000;
        Rng test_rng(4242);
        const Examples test = draw_examples(test_rng, vocab, n_test, true);
        std::size_t shortest = 1000, longest = 0;
        for (const std::string& s : test.inputs) {
            shortest = std::min(shortest, s.size());
            longest = std::max(longest, s.size());
        }
        std::printf("vocabulary: %d tokens (%zu characters + <pad> <bos> <eos>); held-out dates: "
                    "one day in five, never trained on; test set: %d of them, %zu to %zu characters long\n",
                    vocab.size(), vocab.chars().size(), n_test, shortest, longest);
        print_claim("test_examples", std::to_string(n_test));
        print_claim("shortest_input", std::to_string(shortest));
        print_claim("longest_input", std::to_string(longest));

        print_heading("Training the encoder-decoder");
        //! [model]
        EncoderDecoderConfig config;
        config.vocab_size = vocab.size();
        config.max_source = 32;  // inputs have at most 28 characters
        config.max_target = 12;  // <bos> + 10 characters, then <eos>
        config.n_encoder_layer = 2;
        config.n_decoder_layer = 2;
        config.n_head = 4;
        config.n_embd = 64;
        EncoderDecoder model(config, 1337);
        AdamW optimizer;  // β = (0.9, 0.99), decay 0.1
        const int steps = opts.quick ? 3 : 1000;
        const int batch_size = 64, warmup = 100;
        //! [model]
        std::printf("%d encoder + %d decoder layers, %d heads, %d channels: %zu parameters; "
                    "batch %d, %d steps, AdamW, lr 1e-3 to 1e-4 (cosine)\n",
                    config.n_encoder_layer, config.n_decoder_layer, config.n_head, config.n_embd,
                    config.num_parameters(), batch_size, steps);
        const auto start = std::chrono::steady_clock::now();
        Rng train_rng(1);
        double padded_fraction = 0.0;
        for (int step = 0; step < steps; ++step) {
            //! [step]
            const Examples e = draw_examples(train_rng, vocab, batch_size, false);
            // padded to the longest; the loss is the mean over the real target positions
            const Seq2SeqBatch batch = make_batch(e.sources, e.targets);
            const float loss = model.forward(batch);
            model.zero_grad();
            model.backward();
            clip_grad_norm(model.gradients(), 1.0f);
            const double lr = cosine_lr(step, warmup, steps, 1e-3, 1e-4);
            optimizer.step(model.parameters(), model.gradients(), model.parameter_table(),
                           static_cast<float>(lr));
            //! [step]
            int real = 0;
            for (int len : batch.source_lengths) real += len;
            padded_fraction += 1.0 - static_cast<double>(real) / (batch.B * batch.S);
            if (step % 250 == 0 || step == steps - 1)
                std::printf("step %5d  loss %.4f  (sources padded to %d)\n", step, loss, batch.S);
        }
        const double train_seconds = seconds_since(start);
        std::printf("trained in %.1f s; on average %.0f%% of a batch's source positions were padding\n",
                    train_seconds, 100.0 * padded_fraction / steps);
        print_claim("train_seconds", train_seconds, 0);
        print_claim("parameters", std::to_string(config.num_parameters()));
        print_claim("steps", std::to_string(steps));
        print_claim("batch_size", std::to_string(batch_size));
        print_claim("padding_percent", 100.0 * padded_fraction / steps, 0);

        print_heading("Exact-match accuracy on held-out dates");
        //! [decode]
        const int max_length = 11;  // 10 characters and <eos>
        const auto t0 = std::chrono::steady_clock::now();
        const std::vector<std::string> decoded = decode_all(model, vocab, test.sources, max_length);
        const double decode_seconds = seconds_since(t0);
        //! [decode]
        int right = 0;
        std::vector<int> right_by_format(date_format_count, 0), count_by_format(date_format_count, 0);
        for (int i = 0; i < n_test; ++i) {
            const bool ok = decoded[static_cast<std::size_t>(i)] == test.answers[static_cast<std::size_t>(i)];
            right += ok;
            right_by_format[static_cast<std::size_t>(test.formats[static_cast<std::size_t>(i)])] += ok;
            ++count_by_format[static_cast<std::size_t>(test.formats[static_cast<std::size_t>(i)])];
        }
        const double accuracy = 100.0 * right / n_test;
        std::printf("%d of %d held-out dates exactly right: %.1f%% (greedy decoding, %.2f s)\n", right, n_test,
                    accuracy, decode_seconds);
        print_claim("accuracy", accuracy, 1);
        std::printf("by format:\n");
        Rng show_rng(7);
        const Date shown = random_date(show_rng, true);
        for (int f = 0; f < date_format_count; ++f)
            std::printf("  %-30s %4d / %-4d\n", ("\"" + date_text(shown, f) + "\"").c_str(),
                        right_by_format[static_cast<std::size_t>(f)], count_by_format[static_cast<std::size_t>(f)]);
        std::printf("%s\n", right == n_test ? "no mistakes" : "some mistakes:");
        for (int i = 0, shown_mistakes = 0; i < n_test && shown_mistakes < 5; ++i) {
            const std::size_t u = static_cast<std::size_t>(i);
            if (decoded[u] == test.answers[u]) continue;
            std::printf("  %-30s -> %-12s (right: %s)\n", ("\"" + test.inputs[u] + "\"").c_str(),
                        decoded[u].c_str(), test.answers[u].c_str());
            ++shown_mistakes;
        }

        // Two paths to the same text: the cached decoder against the whole prefix every step.
        const std::size_t n_check = opts.quick ? 16 : 200;
        const std::vector<std::vector<int>> some(test.sources.begin(), test.sources.begin() + static_cast<long>(n_check));
        const auto uncached = decode_all(model, vocab, some, max_length, CausalAlignment::bottom_right, false);
        const bool same = std::equal(uncached.begin(), uncached.end(), decoded.begin());
        std::printf("the cached decoder and the whole-prefix decoder agree on the first %zu: %s\n", n_check,
                    same ? "yes" : "NO");
        print_claim("cached_equals_uncached", same ? "yes" : "NO");
        print_claim("checked_decodes", std::to_string(n_check));
        // The step's causal mask has one query and t + 1 keys. Top-left alignment shows that
        // query the first key only (<bos>): the decoder no longer sees what it wrote.
        const auto wrong = decode_all(model, vocab, test.sources, max_length, CausalAlignment::top_left);
        int right_wrong = 0;
        for (int i = 0; i < n_test; ++i)
            right_wrong += wrong[static_cast<std::size_t>(i)] == test.answers[static_cast<std::size_t>(i)];
        std::printf("the same decoder with a top-left causal mask in its cached step: %.1f%% right\n",
                    100.0 * right_wrong / n_test);
        print_claim("accuracy_top_left", 100.0 * right_wrong / n_test, 1);

        print_heading("What cross-attention learned");
        //! [cross]
        const std::string input = "the 23rd of November, 2026";
        const std::vector<std::vector<int>> one = {vocab.encode(input)};
        const std::vector<int> answer = model.greedy_decode(one, max_length)[0];
        // the decoder reads its own answer back: its weights are the map
        model.forward(make_batch(one, {answer}), false);
        //! [cross]
        std::vector<std::string> in_chars, out_chars;
        for (int id : one[0]) in_chars.push_back(vocab.token(id));
        for (int id : answer) out_chars.push_back(vocab.token(id));
        out_chars.push_back(vocab.token(Seq2SeqVocab::eos));
        const std::size_t S = one[0].size(), To = out_chars.size();
        std::printf("\"%s\" -> \"%s\"\n", input.c_str(), vocab.decode(answer).c_str());
        // Every decoder layer and head: which one is the sharpest (lowest mean entropy)?
        std::vector<Tensor2> maps;
        std::vector<std::string> titles;
        std::size_t sharpest = 0;
        double sharpest_entropy = 1e30;
        for (int l = 0; l < config.n_decoder_layer; ++l) {
            const std::vector<float>& w = model.attention_weights(2, l);  // (1, NH, T, S)
            for (int h = 0; h < config.n_head; ++h) {
                Tensor2 m = xt::zeros<float>({To, S});
                for (std::size_t i = 0; i < To; ++i)
                    for (std::size_t j = 0; j < S; ++j)
                        m(i, j) = w[(static_cast<std::size_t>(h) * To + i) * S + j];
                double entropy = 0.0;
                for (float p : m) entropy -= p > 0 ? p * std::log(p) : 0.0;
                entropy /= static_cast<double>(To);
                std::printf("decoder layer %d, head %d: mean entropy %.2f nats (uniform over the input: %.2f)\n",
                            l + 1, h + 1, entropy, std::log(static_cast<double>(S)));
                if (entropy < sharpest_entropy) {
                    sharpest_entropy = entropy;
                    sharpest = maps.size();
                }
                maps.push_back(m);
                titles.push_back("layer " + std::to_string(l + 1) + ", head " + std::to_string(h + 1));
            }
        }
        std::printf("\nthe sharpest, %s (rows: the output characters, columns: the input):\n%s",
                    titles[sharpest].c_str(), heatmap_text(maps[sharpest], out_chars, in_chars).c_str());
        print_claim("sharpest_head", titles[sharpest]);
        print_claim("sharpest_entropy", sharpest_entropy, 2);
        print_claim("uniform_entropy", std::log(static_cast<double>(S)), 2);
        if (!opts.figures.empty()) {
            heatmap_png(opts.figures / "lesson17_cross_attention.png", maps[sharpest], out_chars, in_chars,
                        "Cross-attention, decoder " + titles[sharpest] + ": output (rows) against input (columns)");
            heatmap_grid_png(opts.figures / "lesson17_cross_attention_heads.png", maps, titles, out_chars,
                             in_chars, static_cast<std::size_t>(config.n_head));
            std::printf("\npictures: lesson17_cross_attention.png, lesson17_cross_attention_heads.png\n");
            // The checkpoint, for ./workbook inspect
            save_encoder_decoder(opts.figures / "lesson17_model", model, vocab, steps);
            std::printf("checkpoint: lesson17_model/ (./workbook inspect <it> \"23 Nov 2026\")\n");
        }
    });
}
