// The CUDA GPU as a TrainingDevice: the Trainer's step (forward, backward, clipping, AdamW)
// on CudaGPT, with the host model as the copy that checkpoints and sampling read.
#include "attn/cuda/training_device.hpp"

#include "attn/cuda/device.hpp"
#include "attn/cuda/gpt.hpp"

#include <stdexcept>

namespace attn::cuda {

namespace {

class CudaTrainingDevice final : public TrainingDevice {
public:
    CudaTrainingDevice(const GPT& model, const CudaOptions& options)
        : gpu_(model, options), options_(options) {}

    std::string name() const override {
        return "CUDA: " + device_summary() + (options_.tf32 ? ", TF32 matmuls" : "") +
               (options_.precision == Precision::bf16 ? ", bf16 products (cublasGemmEx, float32 sums)" : "") +
               (options_.attention == AttentionKind::fused ? ", fused attention" : "");
    }

    Precision precision() const override { return options_.precision; }

    void push(const GPT& model, const AdamW& optimizer) override {
        gpu_.copy_parameters_from(model);
        gpu_.copy_optimizer_from(optimizer);
    }

    void pull(GPT& model, AdamW& optimizer) override {
        gpu_.copy_parameters_to(model);
        gpu_.copy_optimizer_to(optimizer);
    }

    float loss(const int* x, const int* y, int B, int T, bool training,
               std::uint64_t dropout_seed) override {
        gpu_.train(training);
        if (training) gpu_.seed_dropout(dropout_seed);
        // Waits for the loss: the Trainer checks every step's loss before it updates.
        return gpu_.forward(x, y, B, T);
    }

    float backward_and_clip(float max_norm) override {
        gpu_.zero_grad();
        gpu_.backward();
        return gpu_.clip_grad_norm(max_norm);
    }

    void adamw_step(AdamW& optimizer, float lr) override { gpu_.adamw_step(optimizer, lr); }

    void copy_gradients_to(std::vector<float>& out) override { gpu_.copy_gradients_to(out); }

private:
    CudaGPT gpu_;
    CudaOptions options_;
};

}  // namespace

std::unique_ptr<TrainingDevice> make_training_device(const GPT& model,
                                                     const CudaOptions& options) {
    std::string why;
    if (!device_available(&why)) throw std::runtime_error("no usable CUDA device: " + why);
    return std::make_unique<CudaTrainingDevice>(model, options);
}

}  // namespace attn::cuda
