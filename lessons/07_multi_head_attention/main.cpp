// Lesson 07: multi-head attention. The page that narrates this program is lesson.md beside it.
#include "attn/entropy.hpp"
#include "attn/heatmap.hpp"
#include "attn/lesson.hpp"
#include "attn/linalg.hpp"
#include "attn/multi_head.hpp"
#include "attn/print.hpp"
#include "attn/random.hpp"
#include "attn/sdpa.hpp"

#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

using namespace attn;

int main(int argc, char** argv) {
    return run_lesson(argc, argv, "Lesson 07: multi-head attention", [](const LessonOptions& options) {
        //! [setup]
        constexpr std::size_t C = 32, NH = 4, hs = C / NH;  // 4 heads of 8 channels
        const std::vector<std::string> tokens = {"the", "cat", "sat", "on",
                                                 "the", "mat", "and", "slept"};
        const std::size_t T = tokens.size();
        Rng rng(707);
        // Token vectors: one random vector per distinct word plus one per position,
        // so the two "the" differ only by their position.
        Tensor2 position = rng.normal_tensor<2>({T, C}, 0.0f, 0.5f);
        Tensor3 x({1, T, C});  // (B, T, C) with B = 1
        for (std::size_t t = 0; t < T; ++t) {
            // A word's vector is seeded by where the word first occurs.
            const auto first = std::find(tokens.begin(), tokens.end(), tokens[t]);
            Rng word(1000 + static_cast<std::uint64_t>(first - tokens.begin()));
            xt::view(x, 0, t) = word.normal_tensor<1>({C}) + xt::view(position, t);
        }
        // Weights N(0, 1/C): queries and keys of about unit size, so heads are not flat.
        const float std_w = 1.0f / std::sqrt(static_cast<float>(C));
        Linear c_attn(rng.normal_tensor<2>({3 * C, C}, 0.0f, std_w));  // (3C, C)
        Linear c_proj(rng.normal_tensor<2>({C, C}, 0.0f, std_w));      // (C, C)
        MultiHeadAttention mha(c_attn, c_proj, NH);
        //! [setup]

        print_heading("One fused projection, split into heads");
        //! [fused]
        Tensor3 qkv = mha.c_attn.forward(x);  // (B, T, 3C): q, k, v of every head at once
        const auto third = [&](std::size_t i) {  // channels [i·C, (i+1)·C) of qkv: (B, T, C)
            return Tensor3(xt::view(qkv, xt::all(), xt::all(), xt::range(i * C, (i + 1) * C)));
        };
        Tensor4 q = split_heads(third(0), NH);  // (B, NH, T, hs)
        Tensor4 k = split_heads(third(1), NH);
        Tensor4 v = split_heads(third(2), NH);
        //! [fused]
        std::cout << "x        " << shape_of(x) << "      (B, T, C)\n"
                  << "c_attn   " << shape_of(mha.c_attn.weight) << "        (3C, C)\n"
                  << "qkv      " << shape_of(qkv) << "      (B, T, 3C)\n"
                  << "q, k, v  " << shape_of(q) << "   (B, NH, T, hs), hs = C / NH = " << hs << "\n";

        print_heading("Attention in every head at once, then merge and project");
        //! [attend]
        Tensor4 weights;  // (B, NH, T, T)
        // The head axis is just another batch axis: (B, NH, T, hs).
        Tensor4 y = scaled_dot_product_attention(q, k, v, causal_mask(T), &weights);
        Tensor3 merged = merge_heads(y);           // (B, T, C)
        Tensor3 out = mha.c_proj.forward(merged);  // (B, T, C)
        //! [attend]
        const Tensor3 from_layer = mha.forward(x);
        std::cout << "y " << shape_of(y) << "  ->  merged " << shape_of(merged) << "  ->  out "
                  << shape_of(out) << "\n";
        std::printf("largest |these steps - MultiHeadAttention::forward| = %g\n",
                    static_cast<double>(xt::amax(xt::abs(out - from_layer))()));

        print_heading("The same as NH separate heads on slices of the weight");
        //! [single_heads]
        Tensor3 concatenated({1, T, C});
        for (std::size_t h = 0; h < NH; ++h) {
            // Head h's rows of c_attn: its queries, keys and values lie C rows apart.
            const auto rows = [&](std::size_t part) {  // (hs, C)
                const std::size_t first = part * C + h * hs;
                return Tensor2(xt::view(c_attn.weight, xt::range(first, first + hs), xt::all()));
            };
            Tensor2 x0 = xt::view(x, 0);                                  // (T, C)
            Tensor2 head = scaled_dot_product_attention(
                matmul_transposed(x0, rows(0)), matmul_transposed(x0, rows(1)),
                matmul_transposed(x0, rows(2)), causal_mask(T));           // (T, hs)
            xt::view(concatenated, 0, xt::all(), xt::range(h * hs, h * hs + hs)) = head;
        }
        //! [single_heads]
        std::printf("largest |concatenated single heads - merged| = %g\n",
                    static_cast<double>(xt::amax(xt::abs(concatenated - merged))()));

        print_heading("What each head attends to");
        std::vector<Tensor2> maps;
        std::vector<std::string> titles;
        for (std::size_t h = 0; h < NH; ++h) {
            maps.emplace_back(xt::view(weights, 0, h));
            titles.push_back("head " + std::to_string(h));
            std::cout << "head " << h << "\n" << heatmap_text(maps.back(), tokens, tokens);
        }
        if (!options.figures.empty()) {
            heatmap_grid_png(options.figures / "lesson07_heads.png", maps, titles, tokens, tokens, 2);
        }

        print_heading("How spread out each head is: mean entropy H(p) = -sum p ln p");
        //! [entropy]
        Tensor1 entropy = mean_entropy_per_head(weights);  // (NH), in nats
        const double uniform = uniform_causal_entropy(T);  // every row spread evenly
        //! [entropy]
        for (std::size_t h = 0; h < NH; ++h) {
            std::printf("head %zu  H = %.3f  %s\n", h, static_cast<double>(entropy(h)),
                        entropy_bar(entropy(h), uniform).c_str());
        }
        std::printf("uniform H = %.3f  %s   (the most a causal head can have)\n", uniform,
                    entropy_bar(uniform, uniform).c_str());

        print_heading("The heads must divide the channels");
        try {
            MultiHeadAttention bad(30, 4, false, rng);
        } catch (const std::invalid_argument& e) {
            std::cout << e.what() << "\n";
        }
    });
}
