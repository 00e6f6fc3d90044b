#!/usr/bin/python3
"""Writes the PyTorch reference fixtures for grouped keys and values and the sliding window
(tests/fixtures/gqa).

Run with Debian's python3 (python3-numpy and python3-torch):

    /usr/bin/python3 tools/reference/make_gqa_fixtures.py

For each model below (nanoGPT's GPT whose attention has G key/value heads, each shared by
n_head/G query heads, and optionally a sliding window W) it writes, under
tests/fixtures/gqa/<name>/:
  weights/        the model in the weights format (config.json with "n_kv_head" and
                  "window"; c_attn has C + 2·G·hs output channels: q, then G keys, then G values)
  x.npy, y.npy    one batch of inputs and targets (B, T), int64 token ids
  logits.npy      (B, T, V) and loss.npy (1,) of the forward pass
  grad/<key>.npy  the gradient of the loss with respect to every parameter

Query head h reads key/value head h // (n_head // G), as Llama's repeat_kv does
(repeat_interleave on the head axis). The window lets query i see keys i - W + 1 ... i
(Mistral 7B's sliding window). The fixtures are committed; the tests never need PyTorch.
"""
import json
import math
import pathlib
import shutil

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

root = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "gqa"
VOCAB = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # 65 characters


def rope_pairs(x, positions):
    """RoPE on the adjacent pairs (2i, 2i+1) of x (..., T, hs), angle pos * 10000^(-2i/hs)."""
    hs = x.shape[-1]
    i = torch.arange(hs // 2, dtype=torch.float64)
    a = positions.to(torch.float64)[:, None] * (10000.0 ** (-2.0 * i / hs))[None, :]
    cos, sin = torch.cos(a).to(x.dtype), torch.sin(a).to(x.dtype)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


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
        self.n_head, self.n_embd = cfg["n_head"], cfg["n_embd"]
        self.n_kv_head = cfg.get("n_kv_head", self.n_head)
        self.window = cfg.get("window", 0)
        self.position = cfg.get("position", "learned")
        hs = self.n_embd // self.n_head
        self.c_attn = nn.Linear(self.n_embd, self.n_embd + 2 * self.n_kv_head * hs,
                                bias=cfg["bias"])
        self.c_proj = nn.Linear(self.n_embd, self.n_embd, bias=cfg["bias"])

    def forward(self, x):
        B, T, C = x.shape
        NH, G = self.n_head, self.n_kv_head
        hs = C // NH
        q, k, v = self.c_attn(x).split([C, G * hs, G * hs], dim=2)
        q = q.view(B, T, NH, hs).transpose(1, 2)  # (B, NH, T, hs)
        k = k.view(B, T, G, hs).transpose(1, 2)   # (B, G, T, hs)
        v = v.view(B, T, G, hs).transpose(1, 2)
        pos = torch.arange(T)
        if self.position == "rope":
            q, k = rope_pairs(q, pos), rope_pairs(k, pos)
        # each key/value head serves NH/G consecutive query heads
        k = k.repeat_interleave(NH // G, dim=1)   # (B, NH, T, hs)
        v = v.repeat_interleave(NH // G, dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        i, j = pos[:, None], pos[None, :]
        mask = j <= i
        if self.window:
            mask = mask & (j > i - self.window)
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
    """nanoGPT's GPT (learned positions unless cfg["position"] is "rope")."""

    def __init__(self, cfg):
        super().__init__()
        C = cfg["n_embd"]
        modules = dict(wte=nn.Embedding(cfg["vocab_size"], C))
        self.learned = cfg.get("position", "learned") == "learned"
        if self.learned:
            modules["wpe"] = nn.Embedding(cfg["block_size"], C)
        modules["h"] = nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])])
        modules["ln_f"] = LayerNorm(C, cfg["bias"])
        self.transformer = nn.ModuleDict(modules)
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
        T = idx.shape[1]
        x = self.transformer.wte(idx)
        if self.learned:
            x = x + self.transformer.wpe(torch.arange(T))
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


torch.set_num_threads(1)
# Grouped-query attention: 4 query heads in 2 groups, learned positions, biases.
make("gqa", dict(vocab_size=65, block_size=8, n_layer=2, n_head=4, n_embd=16, bias=True,
                 n_kv_head=2), B=2, T=8, seed=16)
# Multi-query attention (one key/value head) with a window of 3, no biases.
make("mqa_window", dict(vocab_size=65, block_size=8, n_layer=2, n_head=4, n_embd=16,
                        bias=False, n_kv_head=1, window=3), B=2, T=8, seed=17)
# Both with RoPE, read beyond block_size: 2 groups, window 4, T = 12.
make("gqa_rope_window", dict(vocab_size=65, block_size=8, n_layer=2, n_head=4, n_embd=16,
                             bias=True, n_kv_head=2, window=4, position="rope"),
     B=2, T=12, seed=18)
(root / "versions.json").write_text(
    json.dumps({"numpy": np.__version__, "torch": torch.__version__}, indent=2) + "\n")
print(f"wrote {root}")
