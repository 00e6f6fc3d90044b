// Lesson 10: backpropagation through attention. The page that narrates this program is
// lesson.md beside it.
#include "attn/gpt.hpp"
#include "attn/gpt_layers.hpp"
#include "attn/gradcheck.hpp"
#include "attn/lesson.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

using namespace attn;

namespace {

// The largest error of every line of the finite-difference table, for the page.
std::vector<double> layer_errors;

// One line of the finite-difference table.
void report(const char* layer, const char* input, const GradCheck& r) {
    std::printf("%-22s %-8s %12.2e %14.3f\n", layer, input, r.max_abs_error, r.max_abs_grad);
    layer_errors.push_back(r.max_abs_error);
}

// A small number as the page prints it: 3.2e-05.
std::string scientific(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1e", x);
    return buf;
}

// Checks the gradient of Σ w·out with respect to `x` (n floats) against finite differences.
GradCheck check(std::vector<float>& x, const std::vector<float>& analytic,
                const std::function<double()>& loss) {
    return finite_difference(x.data(), analytic.data(), x.size(), 1e-2f, loss);
}

}  // namespace

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 10: backpropagation through attention", [](const LessonOptions&) {
        print_heading("The two-token example, by the library's attention_backward");
        {
            //! [two_tokens]
            // One head, hs = 1: q = [1, 1], k = [0, ln 3], v = [1, 5]; loss = out[1].
            const float ln3 = std::log(3.0f);
            const std::vector<float> qkv = {1, 0, 1, 1, ln3, 5};  // (T, 3): q, k, v per token
            std::vector<float> out(2), att(4), scratch(4), dqkv(6, 0.0f);
            attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, 1, 2, 1, 1);
            const std::vector<float> dout = {0.0f, 1.0f};  // d loss / d out
            attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(),
                               nullptr, 0.0f, 1, 2, 1, 1);
            //! [two_tokens]
            std::printf("weights row 1 = [%.4f, %.4f], out[1] = %.4f\n", static_cast<double>(att[2]),
                        static_cast<double>(att[3]), static_cast<double>(out[1]));
            std::printf("dq = [%.4f, %.4f]   (by hand: 0, 3/4 ln 3 = %.4f)\n",
                        static_cast<double>(dqkv[0]), static_cast<double>(dqkv[3]),
                        0.75 * std::log(3.0));
            std::printf("dk = [%.4f, %.4f]   (by hand: -0.75, 0.75)\n", static_cast<double>(dqkv[1]),
                        static_cast<double>(dqkv[4]));
            std::printf("dv = [%.4f, %.4f]   (by hand: 0.25, 0.75)\n", static_cast<double>(dqkv[2]),
                        static_cast<double>(dqkv[5]));
        }

        print_heading("Every layer against central differences (h = 0.01, float32)");
        std::printf("%-22s %-8s %12s %14s\n", "layer", "input", "max error", "largest grad");
        Rng rng(2024);
        const int B = 2, T = 5, C = 8, NH = 2, V = 7;
        {
            //! [check_attention]
            std::vector<float> qkv = normal_vector(rng, B * T * 3 * C);  // (B, T, 3C)
            std::vector<float> out(B * T * C), att(B * NH * T * T), scratch(att.size());
            const std::vector<float> w = normal_vector(rng, out.size());  // loss = Σ w·out
            auto loss = [&] {
                attention_forward(out.data(), att.data(), nullptr, qkv.data(), 0.0f, nullptr, B, T,
                                  C, NH);
                return weighted_sum(out, w);
            };
            loss();
            std::vector<float> dqkv(qkv.size(), 0.0f);
            attention_backward(dqkv.data(), scratch.data(), w.data(), qkv.data(), att.data(),
                               nullptr, 0.0f, B, T, C, NH);
            report("causal attention", "qkv", check(qkv, dqkv, loss));
            //! [check_attention]
        }
        {
            std::vector<float> inp = normal_vector(rng, B * T * C, 2.0f), weight = normal_vector(rng, C),
                               bias = normal_vector(rng, C);
            std::vector<float> out(inp.size()), mean(B * T), rstd(B * T);
            const std::vector<float> w = normal_vector(rng, out.size());
            auto loss = [&] {
                layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                                  bias.data(), B, T, C);
                return weighted_sum(out, w);
            };
            loss();
            std::vector<float> dinp(inp.size(), 0.0f), dweight(C, 0.0f), dbias(C, 0.0f);
            layernorm_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(),
                               weight.data(), mean.data(), rstd.data(), B, T, C);
            report("layernorm", "inp", check(inp, dinp, loss));
            report("layernorm", "weight", check(weight, dweight, loss));
            report("layernorm", "bias", check(bias, dbias, loss));
        }
        {
            const int N = B * T, OC = 3 * C;
            std::vector<float> inp = normal_vector(rng, N * C), weight = normal_vector(rng, OC * C),
                               bias = normal_vector(rng, OC);
            std::vector<float> out(N * OC);
            const std::vector<float> w = normal_vector(rng, out.size());
            auto loss = [&] {
                matmul_forward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
                return weighted_sum(out, w);
            };
            std::vector<float> dinp(inp.size(), 0.0f), dweight(weight.size(), 0.0f), dbias(OC, 0.0f);
            matmul_backward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(),
                            weight.data(), N, C, OC);
            report("linear (matmul)", "inp", check(inp, dinp, loss));
            report("linear (matmul)", "weight", check(weight, dweight, loss));
            report("linear (matmul)", "bias", check(bias, dbias, loss));
        }
        {
            const int N = B * T * 4 * C;
            std::vector<float> inp = normal_vector(rng, N, 2.0f), out(N);
            const std::vector<float> w = normal_vector(rng, N);
            auto loss = [&] {
                gelu_forward(out.data(), inp.data(), N);
                return weighted_sum(out, w);
            };
            std::vector<float> dinp(N, 0.0f);
            gelu_backward(dinp.data(), inp.data(), w.data(), N);
            report("GELU", "inp", check(inp, dinp, loss));
        }
        {
            std::vector<float> logits = normal_vector(rng, B * T * V, 2.0f), probs(logits.size()),
                               losses(B * T);
            std::vector<int> targets(B * T);
            for (int& t : targets) t = static_cast<int>(rng.below(V));
            auto loss = [&] {
                return static_cast<double>(crossentropy_forward(probs.data(), losses.data(),
                                                                logits.data(), targets.data(), B, T, V));
            };
            loss();
            std::vector<float> dlogits(logits.size(), 0.0f);
            crossentropy_backward(dlogits.data(), probs.data(), targets.data(), B, T, V);
            report("softmax cross-entropy", "logits", check(logits, dlogits, loss));
        }

        print_heading("The whole model: every parameter of a small GPT");
        //! [check_model]
        GPTConfig config;
        config.vocab_size = 11;
        config.block_size = 8;
        config.n_layer = 2;
        config.n_head = 2;
        config.n_embd = 8;
        GPT model(config, 3);
        for (float& p : model.parameters()) p += 0.3f * rng.normal();  // away from init
        const std::vector<int> x = {1, 4, 2, 9, 0, 3, 10, 10, 5, 6, 7, 8};
        const std::vector<int> y = {4, 2, 9, 0, 3, 1, 10, 5, 6, 7, 8, 2};
        auto loss = [&] {
            model.forward(x, y, 2, 6);
            double sum = 0.0;
            for (float l : model.activations().losses) sum += l;
            return sum / 12.0;
        };
        loss();
        model.zero_grad();
        model.backward();
        const std::vector<float> analytic = model.gradients();
        const GradCheck r = finite_difference(model.parameters().data(), analytic.data(),
                                              analytic.size(), 1e-3f, loss);
        //! [check_model]
        std::printf("%zu parameters: max |analytic - numeric| = %.2e, largest gradient %.3f\n",
                    analytic.size(), r.max_abs_error, r.max_abs_grad);
        std::printf("(one float32 ulp of the loss, 2.4e-7, divided by 2h = 2e-3 is 1.2e-4)\n");
        print_claim("layer_error_min", scientific(*std::min_element(layer_errors.begin(), layer_errors.end())));
        print_claim("layer_error_max", scientific(*std::max_element(layer_errors.begin(), layer_errors.end())));
        print_claim("model_error", scientific(r.max_abs_error));
    });
}
