#!/usr/bin/python3
"""Writes the PyTorch reference fixtures for attention between two sequences: key padding
masks, causal masks with T_q != T_k, cross-attention and the encoder-decoder of lesson 17
(tests/fixtures/cross_attention).

Run with Debian's python3 (python3-numpy and python3-torch):

    /usr/bin/python3 tools/reference/make_cross_attention_fixtures.py

It writes three kinds of fixture:

  functional_<case>/   attention written out with torch operations, as a textbook does:
                       scores = q k^T / sqrt(d), masked_fill(~mask, -inf), softmax, @ v;
                       the mask is the key padding mask (key j of sequence b is real when
                       j < lengths[b]) and, for two cases, the causal mask with T_q != T_k in
                       each alignment: top-left (query i sees keys j <= i, torch.tril) and
                       bottom-right (j <= i + T_k - T_q, FlashAttention >= 2.1).
                       q, k, v (B, NH, T, d), lengths (B), dout (B, NH, T_q, d_v), out,
                       weights, and dq, dk, dv: the gradients of sum(out * dout).
  mha/                 nn.MultiheadAttention(batch_first=True) as cross-attention: queries
                       from x (B, T_q, C), keys and values from memory (B, T_k, C), with
                       key_padding_mask (PyTorch's convention: True on the padding). x,
                       memory, lengths, the module's four parameters, dout, out, weights
                       (per head) and the gradients of sum(out * dout) with respect to x,
                       memory and every parameter.
  model/               the whole encoder-decoder of attn/encoder_decoder.hpp, built from
                       nn.Transformer(norm_first=True, batch_first=True, activation="gelu"):
                       weights/ (the course's weights format), the padded batch (source,
                       source_lengths, target_in, target_out, target_lengths), logits, loss
                       (the mean cross-entropy over the real target positions,
                       ignore_index on the padding) and grad/<parameter>.npy.

No case has a sequence whose every key is padding: PyTorch's softmax gives NaN for such a
row (0/0), where the course's attention gives zeros; that rule is tested by hand. The
fixtures are committed; the tests never need PyTorch.
"""
import json
import math
import pathlib

import numpy as np
import torch
import torch.nn.functional as F

root = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "cross_attention"


def save(dir_, name, t):
    dir_.mkdir(parents=True, exist_ok=True)
    a = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    if a.dtype.kind == "f":
        a = a.astype(np.float32)
    np.save(dir_ / f"{name}.npy", np.ascontiguousarray(a))


def randn32(g, *shape):
    """Normal numbers that float32 holds exactly, in float64: the C++ side reads the same inputs."""
    return torch.randn(*shape, generator=g).double()


def round_to_float32(module):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.float().double())


def key_padding(lengths, T_k):
    """True where key j is a real token (the course's convention: true = may attend)."""
    return torch.arange(T_k)[None, :] < torch.tensor(lengths)[:, None]  # (B, T_k)


def causal(T_q, T_k, alignment):
    offset = 0 if alignment == "top_left" else T_k - T_q
    i = torch.arange(T_q)[:, None]
    j = torch.arange(T_k)[None, :]
    return j <= i + offset  # (T_q, T_k)


def functional_case(name, B, NH, T_q, T_k, d, d_v, lengths, alignment, seed):
    g = torch.Generator().manual_seed(seed)
    q = randn32(g, B, NH, T_q, d).requires_grad_()
    k = randn32(g, B, NH, T_k, d).requires_grad_()
    v = randn32(g, B, NH, T_k, d_v).requires_grad_()
    dout = randn32(g, B, NH, T_q, d_v)
    mask = key_padding(lengths, T_k)[:, None, None, :]  # (B, 1, 1, T_k)
    if alignment:
        mask = mask & causal(T_q, T_k, alignment)  # (B, 1, T_q, T_k)
    mask = mask.expand(B, NH, T_q, T_k)
    assert mask.any(-1).all(), "every query must see a key (PyTorch's softmax gives NaN otherwise)"
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    out = weights @ v
    (out * dout).sum().backward()
    d_ = root / f"functional_{name}"
    for n, t in dict(q=q, k=k, v=v, dout=dout, out=out, weights=weights, dq=q.grad, dk=k.grad,
                     dv=v.grad).items():
        save(d_, n, t)
    save(d_, "lengths", np.array(lengths, dtype=np.int64))


def mha_case(B=2, T_q=3, T_k=5, C=8, NH=2, lengths=(5, 2), seed=26):
    torch.manual_seed(seed)
    mha = torch.nn.MultiheadAttention(C, NH, batch_first=True).double()
    with torch.no_grad():  # biases away from PyTorch's zeros, so that their gradients show
        mha.in_proj_bias.normal_(0, 0.5)
        mha.out_proj.bias.normal_(0, 0.5)
    round_to_float32(mha)
    g = torch.Generator().manual_seed(seed)
    x = randn32(g, B, T_q, C).requires_grad_()
    memory = randn32(g, B, T_k, C).requires_grad_()
    dout = randn32(g, B, T_q, C)
    pad = ~key_padding(list(lengths), T_k)  # PyTorch's key_padding_mask: True on the padding
    out, weights = mha(x, memory, memory, key_padding_mask=pad, need_weights=True,
                       average_attn_weights=False)
    (out * dout).sum().backward()
    d_ = root / "mha"
    for n, t in dict(x=x, memory=memory, dout=dout, out=out, weights=weights, dx=x.grad,
                     dmemory=memory.grad).items():
        save(d_, n, t)
    for n, p in mha.named_parameters():
        save(d_, n, p)
        save(d_, "d" + n, p.grad)
    save(d_, "lengths", np.array(lengths, dtype=np.int64))


class EncoderDecoder(torch.nn.Module):
    """The course's encoder-decoder: shared token embedding (tied to the output), learned
    positions for source and target, nn.Transformer with the norm before each sublayer."""

    def __init__(self, V, max_source, max_target, n_encoder_layer, n_decoder_layer, n_head, n_embd):
        super().__init__()
        self.embedding = torch.nn.Embedding(V, n_embd)
        self.source_position = torch.nn.Embedding(max_source, n_embd)
        self.target_position = torch.nn.Embedding(max_target, n_embd)
        self.transformer = torch.nn.Transformer(
            d_model=n_embd, nhead=n_head, num_encoder_layers=n_encoder_layer,
            num_decoder_layers=n_decoder_layer, dim_feedforward=4 * n_embd, dropout=0.0,
            activation="gelu", batch_first=True, norm_first=True)

    def forward(self, source, source_lengths, target_in, target_lengths):
        S, T = source.shape[1], target_in.shape[1]
        x = self.embedding(source) + self.source_position.weight[:S]
        y = self.embedding(target_in) + self.target_position.weight[:T]
        source_pad = ~key_padding(source_lengths, S)  # True on the padding
        target_pad = ~key_padding(target_lengths, T)
        future = ~causal(T, T, "top_left")            # True above the diagonal
        h = self.transformer(x, y, tgt_mask=future, src_key_padding_mask=source_pad,
                             tgt_key_padding_mask=target_pad, memory_key_padding_mask=source_pad)
        return h @ self.embedding.weight.T           # (B, T, V)


def model_case(seed=17):
    torch.manual_seed(seed)
    chars = "0123456789-/ abc"  # any characters: the vocabulary's ids are what matter
    V = 3 + len(chars)
    config = dict(vocab_size=V, max_source=8, max_target=6, n_encoder_layer=2,
                  n_decoder_layer=2, n_head=2, n_embd=8)
    model = EncoderDecoder(V, 8, 6, 2, 2, 2, 8).double()
    with torch.no_grad():  # every weight away from its initial value, biases and norms included
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    round_to_float32(model)
    # three sources of 6, 3 and 1 tokens (S = 6) and targets of 3, 1 and 2 characters
    # (the decoder reads bos + target: T = 4)
    sources = [[5, 6, 7, 8, 9, 10], [11, 3, 12], [4]]
    targets = [[3, 4, 5], [6], [7, 8]]
    B, S, T = 3, 6, 4
    source = torch.zeros(B, S, dtype=torch.long)
    target_in = torch.zeros(B, T, dtype=torch.long)
    target_out = torch.zeros(B, T, dtype=torch.long)
    for b in range(B):
        source[b, :len(sources[b])] = torch.tensor(sources[b])
        target_in[b, 0] = 1  # bos
        target_in[b, 1:len(targets[b]) + 1] = torch.tensor(targets[b])
        target_out[b, :len(targets[b])] = torch.tensor(targets[b])
        target_out[b, len(targets[b])] = 2  # eos
    source_lengths = [len(s) for s in sources]
    target_lengths = [len(t) + 1 for t in targets]
    logits = model(source, source_lengths, target_in, target_lengths)
    ignored = target_out.masked_fill(~key_padding(target_lengths, T), -100)
    loss = F.cross_entropy(logits.reshape(-1, V), ignored.reshape(-1), ignore_index=-100)
    loss.backward()
    d_ = root / "model"
    weights = d_ / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    config.update(model="encoder_decoder", special_tokens=["<pad>", "<bos>", "<eos>"],
                  vocab=chars, step=0)
    (weights / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for n, p in model.named_parameters():
        save(weights, n, p)
        save(d_ / "grad", n, p.grad)
    for n, a in dict(source=source, target_in=target_in, target_out=target_out).items():
        save(d_, n, a.numpy().astype(np.int64))
    save(d_, "source_lengths", np.array(source_lengths, dtype=np.int64))
    save(d_, "target_lengths", np.array(target_lengths, dtype=np.int64))
    save(d_, "logits", logits)
    save(d_, "loss", loss.reshape(1))


torch.set_num_threads(1)
# float64 throughout, rounded to float32 when written: the references are exact to float32.
functional_case("padding", B=2, NH=2, T_q=3, T_k=5, d=4, d_v=3, lengths=[5, 2], alignment=None, seed=1)
functional_case("top_left", B=2, NH=2, T_q=3, T_k=5, d=4, d_v=3, lengths=[5, 4], alignment="top_left", seed=2)
functional_case("bottom_right", B=2, NH=2, T_q=3, T_k=5, d=4, d_v=3, lengths=[5, 4], alignment="bottom_right", seed=3)
mha_case()
model_case()
print(f"wrote {root}")
