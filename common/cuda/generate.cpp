// Text generation with the GPU model: the loop of attn::generate_text and
// attn::generate_cached, with the forward passes on the device and the draws on the host.
#include "attn/cuda/generate.hpp"

#include "attn/random.hpp"

#include <algorithm>
#include <vector>

namespace attn::cuda {

std::string generate_text(CudaGPT& gpu, const CharVocab& vocab, const std::string& prompt,
                          const SampleOptions& options, bool cached) {
    const int V = gpu.config().vocab_size, block = gpu.config().block_size;
    std::vector<int> ids = start_tokens(vocab, V, prompt, options);
    Rng rng(options.seed);
    std::string text = prompt;
    gpu.train(false);
    std::vector<float> last;
    for (int n = 0; n < options.max_new_tokens; ++n) {
        const int context = static_cast<int>(ids.size());
        const int T = std::min(context, block);
        const int* window = ids.data() + (context - T);
        if (!cached) {
            gpu.forward_async(window, nullptr, 1, T);
            gpu.copy_logits_row_to(last, 0, T - 1);
        } else if (n == 0 || context > block) {
            gpu.prefill(last, window, T);  // the prompt, or a cropped context: all positions new
        } else {
            gpu.decode_step(last, ids.back(), context - 1);  // one step for the newest token
        }
        const int next = sample_token(last, options.temperature, options.top_k, rng);
        ids.push_back(next);
        text += vocab.at(next);
    }
    return text;
}

}  // namespace attn::cuda
