#!/usr/bin/python3
"""Writes the PyTorch reference fixtures for the position schemes (tests/fixtures/positions).

Run with Debian's python3 (python3-numpy and python3-torch):

    /usr/bin/python3 tools/reference/make_position_fixtures.py

For each model below (nanoGPT's GPT with RoPE or ALiBi in place of the learned position
embedding) it writes, under tests/fixtures/positions/<name>/:
  weights/        the model in the weights format (config.json with "position", one .npy per
                  state_dict key; no transformer.wpe.weight)
  x.npy, y.npy    one batch of inputs and targets (B, T), int64 token ids; T is longer than
                  block_size, which these schemes allow
  logits.npy      (B, T, V) and loss.npy (1,) of the forward pass
  grad/<key>.npy  the gradient of the loss with respect to every parameter

and under rotation/ one RoPE rotation on its own, for the exercise's checks:
  x.npy (T, hs), pos0.npy (1,), rotated.npy (T, hs), dy.npy (T, hs), dx.npy (T, hs) the
  gradient of sum(rotated * dy) with respect to x (PyTorch's autograd).

RoPE pairs adjacent channels (2i, 2i+1) as RoFormer (Su et al. 2021) does, angle
pos * 10000^(-2i/hs). The script also checks that Llama's convention (channel i paired with
i + hs/2) gives the same scores once q and k's channels are permuted. ALiBi's slopes are
Press et al. 2021's (their get_slopes, including a head count that is not a power of two).
The fixtures are committed; the tests never need PyTorch.
"""
import json
import math
import pathlib
import shutil

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

root = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "positions"
VOCAB = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # 65 characters


def rope_angles(positions, hs):
    """(T, hs/2) angles pos * 10000^(-2i/hs), in float64."""
    i = torch.arange(hs // 2, dtype=torch.float64)
    inv_freq = 10000.0 ** (-2.0 * i / hs)
    return positions.to(torch.float64)[:, None] * inv_freq[None, :]


def rope_pairs(x, positions):
    """Rotates the adjacent pairs (2i, 2i+1) of x (..., T, hs)."""
    a = rope_angles(positions, x.shape[-1])
    cos, sin = torch.cos(a).to(x.dtype), torch.sin(a).to(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def rope_halves(x, positions):
    """Llama / GPT-NeoX: pairs channel i with i + hs/2 (rotate_half)."""
    a = rope_angles(positions, x.shape[-1])
    cos, sin = torch.cos(a).to(x.dtype), torch.sin(a).to(x.dtype)
    cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    h = x.shape[-1] // 2
    rotated_half = torch.cat((-x[..., h:], x[..., :h]), -1)
    return x * cos + rotated_half * sin


def alibi_slopes(n):
    """Press et al.'s get_slopes."""
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + alibi_slopes(2 * closest)[0::2][: n - closest]


class LayerNorm(nn.Module):
    def __init__(self, n, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.bias = nn.Parameter(torch.zeros(n)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.n_embd, self.position = cfg["n_head"], cfg["n_embd"], cfg["position"]
        self.c_attn = nn.Linear(self.n_embd, 3 * self.n_embd, bias=cfg["bias"])
        self.c_proj = nn.Linear(self.n_embd, self.n_embd, bias=cfg["bias"])

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        pos = torch.arange(T)
        if self.position == "rope":
            q, k = rope_pairs(q, pos), rope_pairs(k, pos)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        if self.position == "alibi":
            m = torch.tensor(alibi_slopes(self.n_head), dtype=torch.float32)
            distance = (pos[None, :] - pos[:, None]).to(torch.float32)  # j - i
            att = att + m[:, None, None] * distance[None, :, :]
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
        att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["n_embd"]
        self.ln_1 = LayerNorm(C, cfg["bias"])
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(C, cfg["bias"])
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(C, 4 * C, bias=cfg["bias"]),
                                      c_proj=nn.Linear(4 * C, C, bias=cfg["bias"])))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp.c_proj(F.gelu(self.mlp.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """nanoGPT's GPT without wpe: position enters inside attention."""

    def __init__(self, cfg):
        super().__init__()
        C = cfg["n_embd"]
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg["vocab_size"], C),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])]),
            ln_f=LayerNorm(C, cfg["bias"]),
        ))
        self.lm_head = nn.Linear(C, cfg["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        with torch.no_grad():  # weights large enough that every path carries a signal
            for key, p in self.named_parameters():
                if "ln_" in key and key.endswith("weight"):
                    p.copy_(1.0 + 0.1 * torch.randn_like(p))
                elif key.endswith("bias"):
                    p.copy_(0.1 * torch.randn_like(p))
                else:
                    p.copy_(0.2 * torch.randn_like(p))

    def forward(self, idx, targets):
        x = self.transformer.wte(idx)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def save(path, tensor):
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, tensor.detach().numpy().astype(np.float32))


def make(name, cfg, B, T, seed):
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(seed)
    model = GPT(cfg)
    weights = out / "weights"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text(json.dumps(
        {**cfg, "dropout": 0.0, "vocab": VOCAB[:cfg["vocab_size"]], "step": 0}, indent=2) + "\n")
    for key, p in model.state_dict().items():
        save(weights / f"{key}.npy", p)
    x = torch.randint(0, cfg["vocab_size"], (B, T))
    y = torch.randint(0, cfg["vocab_size"], (B, T))
    np.save(out / "x.npy", x.numpy())
    np.save(out / "y.npy", y.numpy())
    logits, loss = model(x, y)
    loss.backward()
    save(out / "logits.npy", logits)
    save(out / "loss.npy", loss.reshape(1))
    for key, p in model.named_parameters():  # the tied weight appears once, as wte
        save(out / "grad" / f"{key}.npy", p.grad)
    print(f"{name}: loss {loss.item():.6f}")


def make_rotation(T=5, hs=8, pos0=3, seed=5):
    out = root / "rotation"
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(seed)
    x = torch.randn(T, hs, requires_grad=True)
    dy = torch.randn(T, hs)
    rotated = rope_pairs(x, torch.arange(pos0, pos0 + T))
    (rotated * dy).sum().backward()
    save(out / "x.npy", x)
    save(out / "rotated.npy", rotated)
    save(out / "dy.npy", dy)
    save(out / "dx.npy", x.grad)
    np.save(out / "pos0.npy", np.array([pos0], dtype=np.int64))

    # The two conventions are one rotation up to a permutation of the channels: put channel
    # 2i at i and 2i+1 at i + hs/2, rotate by halves, and the result is the pairs' rotation
    # permuted the same way; so q·k, and every score, is the same.
    perm = torch.cat((torch.arange(0, hs, 2), torch.arange(1, hs, 2)))
    pos = torch.arange(pos0, pos0 + T)
    diff = (rope_halves(x[:, perm], pos) - rope_pairs(x, pos)[:, perm]).abs().max().item()
    print(f"rotation: halves(x permuted) vs pairs(x) permuted: max difference {diff:.2e}")
    assert diff < 1e-6


torch.set_num_threads(1)
# RoPE with T = 12 beyond block_size 8, two heads of size 8.
make("rope", dict(vocab_size=65, block_size=8, n_layer=2, n_head=2, n_embd=16, bias=True,
                  position="rope"), B=2, T=12, seed=15)
# ALiBi with 3 heads: slopes of 2 heads, then one of 4 (Press et al.'s rule for other counts).
make("alibi", dict(vocab_size=65, block_size=8, n_layer=2, n_head=3, n_embd=12, bias=False,
                   position="alibi"), B=2, T=12, seed=16)
make_rotation()
(root / "versions.json").write_text(
    json.dumps({"numpy": np.__version__, "torch": torch.__version__}, indent=2) + "\n")
print(f"wrote {root}")
