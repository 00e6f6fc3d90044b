"""nanoGPT's GPT in PyTorch with the attention variants of lessons 15 and 16, and the writer
of a model fixture: shared by make_position_fixtures.py and make_gqa_fixtures.py.

The model's config (a dict, the weights format's config.json keys) chooses:
  position   "learned" (nanoGPT's wpe, the default), "rope" (RoFormer's adjacent pairs
             (2i, 2i+1), angle pos * 10000^(-2i/hs); no wpe) or "alibi" (Press et al. 2021's
             slopes times the distance j - i added to the scores; no wpe)
  n_kv_head  G key/value heads, each shared by n_head/G consecutive query heads (Llama's
             repeat_kv); c_attn then has C + 2·G·hs outputs: q, then G keys, then G values
  window     W > 0: query i sees keys i - W + 1 ... i only (Mistral 7B's sliding window)

Imported by the scripts next to it; run those, not this file.
"""
import json
import math
import shutil

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

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
    """GPT-NeoX and Hugging Face's Llama: pairs channel i with i + hs/2 (rotate_half).

    Meta's Llama code pairs adjacent channels (view_as_complex), like rope_pairs; Hugging
    Face's conversion permutes the q and k rows so that rotate_half gives the same scores.
    """
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
        if self.position == "alibi":
            m = torch.tensor(alibi_slopes(NH), dtype=torch.float32)
            distance = (pos[None, :] - pos[:, None]).to(torch.float32)  # j - i
            att = att + m[:, None, None] * distance[None, :, :]
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
    """nanoGPT's GPT; wpe only with learned positions (RoPE and ALiBi act inside attention)."""

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


def make(root, name, cfg, B, T, seed):
    """Writes root/name/: weights/ (config.json and one .npy per state_dict key), x.npy and
    y.npy (B, T) int64, logits.npy (B, T, V), loss.npy (1,) and grad/<key>.npy."""
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


def write_versions(root):
    (root / "versions.json").write_text(
        json.dumps({"numpy": np.__version__, "torch": torch.__version__}, indent=2) + "\n")
