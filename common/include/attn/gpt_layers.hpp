/// @file gpt_layers.hpp
/// @brief The GPT's layers as flat forward/backward function pairs over contiguous float
/// buffers.
///
/// Every function takes its outputs first, then its inputs, then the sizes. Buffers are
/// C-order float arrays whose shapes are written beside each parameter, with the axis
/// letters of tensor.hpp: `B` batch, `T` time, `C` channels, `NH` heads, `hs = C / NH`
/// head size, `V` vocabulary, `OC` output channels.
///
/// Every backward function *adds* into its gradient buffers (`d<name> +=`), so a tensor
/// read by two layers (the residual stream, the tied embedding) collects both
/// contributions; the caller zeroes the gradients once before the backward pass.
/// Backward functions never allocate: scratch space, where needed, is passed in.
#pragma once

#include "attn/dropout_mask.hpp"
#include "attn/random.hpp"

#include <vector>

namespace attn {

/// Token plus position embedding: `out[b,t,:] = wte[inp[b,t],:] + wpe[t,:]`.
/// @param out (B, T, C)
/// @param inp (B, T) token ids in [0, V)
/// @param wte (V, C) token embedding
/// @param wpe (block_size, C) position embedding; T ≤ block_size
/// @param B batch size  @param T sequence length  @param C channels
void encoder_forward(float* out, const int* inp, const float* wte, const float* wpe, int B, int T,
                     int C);

/// Backward of encoder_forward: scatters `dout` into the rows of the embeddings it read.
/// @param dwte (V, C) accumulated
/// @param dwpe (block_size, C) accumulated
/// @param dout (B, T, C)
/// @param inp (B, T)
/// @param B batch size  @param T sequence length  @param C channels
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int* inp, int B, int T,
                      int C);

/// LayerNorm over the last axis (ε = 1e-5, biased variance, as `torch.nn.LayerNorm`).
/// @param out (B, T, C)
/// @param mean (B, T) saved for the backward pass
/// @param rstd (B, T) 1/√(var + ε), saved for the backward pass
/// @param inp (B, T, C)
/// @param weight (C)
/// @param bias (C), or nullptr for a LayerNorm without bias
/// @param B batch size  @param T sequence length  @param C channels
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int B, int T, int C);

/// Backward of layernorm_forward.
/// @param dinp (B, T, C) accumulated
/// @param dweight (C) accumulated
/// @param dbias (C) accumulated, or nullptr when the LayerNorm has no bias
/// @param dout (B, T, C)
/// @param inp (B, T, C)
/// @param weight (C)
/// @param mean (B, T) from the forward pass
/// @param rstd (B, T) from the forward pass
/// @param B batch size  @param T sequence length  @param C channels
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int B, int T, int C);

/// A linear map with PyTorch's weight layout: `out = inp · weightᵀ + bias` (cblas_sgemm).
/// @param out (N, OC), where N = B·T
/// @param inp (N, C)
/// @param weight (OC, C)
/// @param bias (OC), or nullptr
/// @param N rows (B·T)  @param C input channels  @param OC output channels
void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int C, int OC);

/// Another legal summation order for matmul_forward, matmul_backward and the products of
/// attention_forward and attention_backward, for the tests that
/// measure how far two correct float32 implementations of one model can land apart (a BLAS
/// with other kernels sums each product in another order): with `chunk` > 0 each product's
/// inner sum is split into runs of `chunk` terms, one sgemm call each, added into the
/// output in turn; 0 (the default) is one sgemm call per product. The same terms and the
/// same mathematical value: only the rounding differs. Process-wide; set it between passes.
void set_matmul_inner_chunk(int chunk);
/// The chunk set by set_matmul_inner_chunk() (0: one call per product).
int matmul_inner_chunk();

/// Backward of matmul_forward.
/// @param dinp (N, C) accumulated
/// @param dweight (OC, C) accumulated
/// @param dbias (OC) accumulated, or nullptr
/// @param dout (N, OC)
/// @param inp (N, C)
/// @param weight (OC, C)
/// @param N rows (B·T)  @param C input channels  @param OC output channels
void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC);

/// Causal multi-head self-attention on the fused projection `qkv`, without the output
/// projection: per batch item and head, `att = softmax(mask(q·kᵀ/√hs))` (or of q·kᵀ
/// unscaled), then
/// `out = dropout(att) · v`, with the heads written side by side into `out`.
/// @param out (B, T, C) the heads' outputs, head h in channels [h·hs, (h+1)·hs)
/// @param att (B, NH, T, T) the attention weights; zero above the diagonal when causal
/// @param att_dropped (B, NH, T, T) the weights after dropout; used only when
///        dropout_p > 0 (otherwise it may be nullptr)
/// @param qkv (B, T, 3C) q, k and v side by side, as nanoGPT's `c_attn` produces them
/// @param dropout_p the probability of zeroing a weight; 0 for no dropout
/// @param dropout_site the mask's site: weight (b, h, i, j) of the call is element
///        first_index + ((b·NH + h)·T + i)·T + j of the site (dropout_mask.hpp), the GPU's
///        index for the same weight; unused (may be nullptr) when dropout_p is 0
/// @param B batch size  @param T sequence length  @param C channels  @param NH heads
/// @param causal false attends to every position, future ones included (no mask)
/// @param scaled false leaves out the 1/√hs (scores q·kᵀ as they are)
/// @param alibi_slopes (NH) ALiBi's slope m per head: `m·(j − i)` is added to the score of
///        query i and key j before the softmax; nullptr for none. The bias is a constant, so
///        attention_backward needs no change for it.
/// @param NKV G, the key/value heads (0: NH, multi-head attention). qkv's rows are then
///        C + 2·G·hs wide: the NH queries, then G keys, then G values; query head h reads
///        key/value head kv_head_of(h, NH, G). G = 1 is multi-query attention.
/// @param window W: query t sees keys t − W + 1 … t only (0: all of 0 … t); needs causal
void attention_forward(float* out, float* att, float* att_dropped, const float* qkv,
                       float dropout_p, const DropoutSite* dropout_site, int B, int T, int C, int NH,
                       bool causal = true, bool scaled = true,
                       const float* alibi_slopes = nullptr, int NKV = 0, int window = 0);

/// The key/value head that serves query head h in grouped-query attention (Ainslie et al.
/// 2023): the NH query heads form G groups of NH/G consecutive heads, group g sharing key
/// and value head g, so `h / (NH/G)`. G = NH gives h itself; G = 1 gives 0 for every head.
/// @param h the query head, 0 ≤ h < NH  @param NH query heads  @param G key/value heads,
///        a divisor of NH
/// @return the key/value head, in [0, G)
int kv_head_of(int h, int NH, int G);

/// Backward of attention_forward.
/// @param dqkv (B, T, C + 2·G·hs) accumulated
/// @param scratch (B, NH, T, T) working space, one (T, T) block per (batch, head) pair so
///        that the pairs can run on different threads
/// @param dout (B, T, C)
/// @param qkv (B, T, 3C)
/// @param att (B, NH, T, T) from the forward pass
/// @param att_dropped (B, NH, T, T) from the forward pass when dropout_p > 0, else unused
/// @param dropout_p the dropout probability the forward pass used
/// @param B batch size  @param T sequence length  @param C channels  @param NH heads
/// @param causal as given to attention_forward
/// @param NKV as given to attention_forward: the gradient of a shared key/value head is
///        the sum of the gradients its NH/G query heads send it
/// @param window as given to attention_forward
/// @param scaled as given to attention_forward
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, const float* att_dropped, float dropout_p, int B,
                        int T, int C, int NH, bool causal = true, bool scaled = true,
                        int NKV = 0, int window = 0);

/// ALiBi's slopes for NH heads (Press et al. 2021, "Train Short, Test Long"): for NH a power
/// of two, the geometric sequence `m_h = 2^(−8(h+1)/NH)`, h = 0 … NH−1 (1/2, 1/4, … for 8
/// heads); otherwise the slopes of the power of two n below NH, then every other slope of 2n
/// heads, as the paper's code does.
/// @param NH heads, at least 1
/// @return (NH) the slopes, largest first
std::vector<float> alibi_slopes(int NH);

/// The rotation angle of RoPE's channel pair i at position `pos`: `pos · base^(−2i/hs)`
/// (Su et al. 2021), computed in double.
/// @param pos the position  @param i the pair, 0 ≤ i < hs/2  @param hs head size
/// @param base 10000 in RoFormer and in Llama 1 and 2
/// @return the angle in radians
double rope_angle(int pos, int i, int hs, double base = 10000.0);

/// Rotary position embedding, in place on the q and k parts of `qkv`: in every head, the
/// channel pairs (2i, 2i+1) of q and k at position p = pos0 + t are rotated by the angle
/// rope_angle(p, i, hs): `(x₀, x₁) ← (x₀·cos − x₁·sin, x₀·sin + x₁·cos)`. v is unchanged.
/// Then `q_i·k_j` depends on the positions only through i − j. These are the pairs of the
/// RoFormer paper and of Meta's Llama code (`apply_rotary_emb`); GPT-NeoX and Hugging Face's
/// Llama pair channel i with i + hs/2 (`rotate_half`): the same rotation with the channels
/// permuted.
/// @param qkv (B, T, 3C) changed in place
/// @param B batch size  @param T sequence length  @param C channels  @param NH heads
///        (the head size hs = C/NH must be even)
/// @param pos0 the position of the first token (0 in training)
/// @param NKV G, the key heads (0: NH); qkv's rows are C + 2·G·hs wide
void rope_forward(float* qkv, int B, int T, int C, int NH, int pos0 = 0, int NKV = 0);

/// Backward of rope_forward, in place: a rotation's transpose is the rotation by −angle, so
/// `(d₀, d₁) ← (d₀·cos + d₁·sin, −d₀·sin + d₁·cos)` on the q and k parts of `dqkv`.
/// @param dqkv (B, T, 3C) the gradient with respect to the rotated q and k on entry, to
///        the unrotated ones on exit
/// @param B batch size  @param T sequence length  @param C channels  @param NH heads
/// @param pos0 as given to rope_forward  @param NKV as given to rope_forward
void rope_backward(float* dqkv, int B, int T, int C, int NH, int pos0 = 0, int NKV = 0);

/// attention_forward() without the (T, T) weights and without dropout: the tiled CPU
/// attention of flash.hpp (attention_fast_forward()) on the heads of `qkv` in place.
/// @param out (B, T, C) the heads' outputs, head h in channels [h·hs, (h+1)·hs)
/// @param lse (B, NH, T) each row's log-sum-exp of its scores, for the backward pass
/// @param qkv (B, T, 3C) q, k and v side by side
/// @param B batch size  @param T sequence length  @param C channels  @param NH heads
/// @param causal false attends to every position
void attention_fused_forward(float* out, float* lse, const float* qkv, int B, int T, int C,
                             int NH, bool causal = true);

/// Backward of attention_fused_forward(), recomputing the weights from `lse`.
/// @param dqkv (B, T, 3C) accumulated
/// @param dout (B, T, C)
/// @param qkv (B, T, 3C)
/// @param out (B, T, C) the forward's output
/// @param lse (B, NH, T) the forward's log-sum-exps
/// @param B batch size  @param T sequence length  @param C channels  @param NH heads
/// @param causal as given to attention_fused_forward
void attention_fused_backward(float* dqkv, const float* dout, const float* qkv, const float* out,
                              const float* lse, int B, int T, int C, int NH, bool causal = true);

/// Exact GELU, as `torch.nn.GELU()`: `out = ½·x·(1 + erf(x/√2))`.
/// @param out (N) @param inp (N) @param N number of elements
void gelu_forward(float* out, const float* inp, int N);

/// Backward of gelu_forward.
/// @param dinp (N) accumulated @param inp (N) @param dout (N) @param N number of elements
void gelu_backward(float* dinp, const float* inp, const float* dout, int N);

/// The residual connection: `out = inp1 + inp2`.
/// @param out (N) @param inp1 (N) @param inp2 (N) @param N number of elements
void residual_forward(float* out, const float* inp1, const float* inp2, int N);

/// Backward of residual_forward: the gradient flows unchanged to both inputs.
/// @param dinp1 (N) accumulated @param dinp2 (N) accumulated @param dout (N)
/// @param N number of elements
void residual_backward(float* dinp1, float* dinp2, const float* dout, int N);

/// Inverted dropout, in place: each element is zeroed with probability p and the survivors
/// are scaled by 1/(1 − p), so the expected value is unchanged. `mask` records the factor
/// (0 or 1/(1 − p)) applied to each element. Element i is dropped when
/// dropout_uniform(site.seed, site.first_index + i) < p, as on the GPU.
/// @param x (N) changed in place
/// @param mask (N) the factor applied to each element
/// @param p probability of zeroing, in [0, 1)
/// @param site the mask's seed and the index of x[0] in the site's tensor
/// @param N number of elements
void dropout_forward(float* x, float* mask, float p, const DropoutSite& site, int N);

/// Backward of dropout_forward, in place: `dx *= mask`.
/// @param dx (N) changed in place @param mask (N) from the forward pass
/// @param N number of elements
void dropout_backward(float* dx, const float* mask, int N);

/// Softmax over the vocabulary and cross-entropy against the targets.
/// @param probs (B, T, V) the softmax of the logits, saved for the backward pass
/// @param losses (B, T) −log probs[target] per position
/// @param logits (B, T, V)
/// @param targets (B, T) token ids in [0, V)
/// @param B batch size  @param T sequence length  @param V vocabulary size
/// @return the mean loss over the B·T positions
float crossentropy_forward(float* probs, float* losses, const float* logits, const int* targets,
                           int B, int T, int V);

/// Backward of the mean cross-entropy through the softmax:
/// `dlogits += (probs − onehot(targets)) / positions`, positions = B·T unless given.
/// @param dlogits (B, T, V) accumulated
/// @param probs (B, T, V) from crossentropy_forward
/// @param targets (B, T)
/// @param B batch size  @param T sequence length  @param V vocabulary size
/// @param positions the number of positions the mean is taken over: 0 (the default) for
///        B·T; a slice of a batch passes the whole batch's B·T
void crossentropy_backward(float* dlogits, const float* probs, const int* targets, int B, int T,
                           int V, int positions = 0);

}  // namespace attn
