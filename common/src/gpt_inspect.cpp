#include "attn/gpt_inspect.hpp"

#include <algorithm>
#include <string>

namespace attn {

namespace {

using std::size_t;

void require_layer(const GPT& model, int layer, const char* who) {
    require(layer >= 0 && layer < model.config().n_layer,
            std::string(who) + ": layer " + std::to_string(layer) + " is not in [0, " +
                std::to_string(model.config().n_layer) + ")");
    require(model.batch_size() > 0, std::string(who) + ": the model has not run forward() yet");
}

}  // namespace

Tensor4 attention_weights(const GPT& model, int layer) {
    require_layer(model, layer, "attention_weights");
    const size_t B = static_cast<size_t>(model.batch_size()), T = static_cast<size_t>(model.sequence_length()),
                 NH = static_cast<size_t>(model.config().n_head);
    // The activations are sized for (B, T) of the last call: att is (L, B, NH, T, T).
    const float* att = model.activations().att.data() + static_cast<size_t>(layer) * B * NH * T * T;
    Tensor4 w({B, NH, T, T});
    std::copy(att, att + w.size(), w.data());
    return w;
}

Tensor4 attention_queries_or_keys(const GPT& model, int layer, int which) {
    require_layer(model, layer, "attention_queries_or_keys");
    require(which == 0 || which == 1,
            "attention_queries_or_keys: which must be 0 (queries) or 1 (keys), got " + std::to_string(which));
    const size_t B = static_cast<size_t>(model.batch_size()), T = static_cast<size_t>(model.sequence_length()),
                 NH = static_cast<size_t>(model.config().n_head), C = static_cast<size_t>(model.config().n_embd),
                 hs = C / NH;
    // qkv is (L, B, T, 3C): q, k and v side by side, head h in channels [h·hs, (h+1)·hs).
    const float* qkv = model.activations().qkv.data() + static_cast<size_t>(layer) * B * T * 3 * C;
    Tensor4 out({B, NH, T, hs});
    for (size_t b = 0; b < B; ++b)
        for (size_t t = 0; t < T; ++t)
            for (size_t h = 0; h < NH; ++h)
                for (size_t c = 0; c < hs; ++c)
                    out(b, h, t, c) = qkv[(b * T + t) * 3 * C + static_cast<size_t>(which) * C + h * hs + c];
    return out;
}

Tensor1 previous_token_weight(const Tensor4& weights) {
    const auto& s = weights.shape();
    require(s[2] == s[3] && s[2] >= 2, "previous_token_weight: weights must be (B, NH, T, T) with T >= 2, got " +
                                           shape_of(weights));
    Tensor1 out = xt::zeros<float>({s[1]});
    for (size_t h = 0; h < s[1]; ++h) {
        double sum = 0.0;
        for (size_t b = 0; b < s[0]; ++b)
            for (size_t i = 1; i < s[2]; ++i) sum += weights(b, h, i, i - 1);
        out(h) = static_cast<float>(sum / static_cast<double>(s[0] * (s[2] - 1)));
    }
    return out;
}

void zero_head(GPT& model, int layer, int head) {
    const GPTConfig& c = model.config();
    require(layer >= 0 && layer < c.n_layer, "zero_head: layer " + std::to_string(layer) +
                                                 " is not in [0, " + std::to_string(c.n_layer) + ")");
    require(head >= 0 && head < c.n_head, "zero_head: head " + std::to_string(head) + " is not in [0, " +
                                              std::to_string(c.n_head) + ")");
    const size_t C = static_cast<size_t>(c.n_embd), hs = C / static_cast<size_t>(c.n_head);
    // c_proj (C, C): out = atty · c_projᵀ, so input channel j is column j of every row.
    float* w = model.params().attprojw + static_cast<size_t>(layer) * C * C;
    for (size_t row = 0; row < C; ++row)
        for (size_t j = static_cast<size_t>(head) * hs; j < static_cast<size_t>(head + 1) * hs; ++j)
            w[row * C + j] = 0.0f;
}

}  // namespace attn
