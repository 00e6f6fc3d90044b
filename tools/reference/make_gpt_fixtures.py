#!/usr/bin/python3
"""Writes the PyTorch reference fixtures for the GPT model's tests (tests/fixtures/gpt).

Run with Debian's python3 (python3-numpy and python3-torch):

    /usr/bin/python3 tools/reference/make_gpt_fixtures.py

For each model below it writes, under tests/fixtures/gpt/<name>/:
  weights/        the model in the weights format (config.json + one .npy per state_dict key)
  x.npy, y.npy    one batch of inputs and targets (B, T), int64 token ids
  logits.npy      (B, T, V) and loss.npy (1,) of the forward pass, dropout 0
  grad/<key>.npy  the gradient of the loss with respect to every parameter
  adamw_losses.npy  (10,) the losses of 10 AdamW steps on the same batch (nanoGPT's recipe:
                  betas (0.9, 0.99), weight decay 0.1 on tensors of 2 or more dims, gradient
                  clipping at 1.0, lr 1e-3)

The model class is written here from nanoGPT's description, so the reference is PyTorch's
autograd and optimizer, never the course's own code. The fixtures are committed; the
tests never need PyTorch.
"""
import json
import math
import pathlib
import shutil

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# LayerNorm with an optional bias (PyTorch's has none-or-both), and the 65 characters
from reference_gpt import VOCAB, LayerNorm

root = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "gpt"


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.n_embd = cfg["n_head"], cfg["n_embd"]
        self.c_attn = nn.Linear(self.n_embd, 3 * self.n_embd, bias=cfg["bias"])
        self.c_proj = nn.Linear(self.n_embd, self.n_embd, bias=cfg["bias"])
        self.attn_dropout = nn.Dropout(cfg["dropout"])
        self.resid_dropout = nn.Dropout(cfg["dropout"])
        T = cfg["block_size"]
        self.register_buffer("mask", torch.tril(torch.ones(T, T, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["n_embd"]
        self.c_fc = nn.Linear(C, 4 * C, bias=cfg["bias"])
        self.gelu = nn.GELU()  # exact, erf-based
        self.c_proj = nn.Linear(4 * C, C, bias=cfg["bias"])
        self.dropout = nn.Dropout(cfg["dropout"])

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = LayerNorm(cfg["n_embd"], cfg["bias"])
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        C = cfg["n_embd"]
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg["vocab_size"], C),
            wpe=nn.Embedding(cfg["block_size"], C),
            drop=nn.Dropout(cfg["dropout"]),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])]),
            ln_f=LayerNorm(C, cfg["bias"]),
        ))
        self.lm_head = nn.Linear(C, cfg["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg["n_layer"]))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def configure_optimizer(model, lr):
    """nanoGPT's configure_optimizers: decay tensors of 2 or more dims only."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99), eps=1e-8)


def save(path, tensor):
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, tensor.detach().numpy().astype(np.float32))


def make(name, cfg, B, T, seed):
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    torch.manual_seed(seed)
    model = GPT(cfg)
    # Away from the initial values (LayerNorm 1 and 0, biases 0), so that every gradient
    # path carries a signal the tests can see.
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "ln_" in key and key.endswith("weight"):
                p.add_(0.1 * torch.randn_like(p))
            elif key.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
    model.eval()  # dropout 0 in the config as well: the same numbers either way

    # The weights directory, exactly as the C++ side writes it.
    weights = out / "weights"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text(json.dumps(
        {**cfg, "vocab": VOCAB[:cfg["vocab_size"]], "step": 0}, indent=2) + "\n")
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

    # 10 AdamW steps on the same batch, from the same weights.
    optimizer = configure_optimizer(model, lr=1e-3)
    optimizer.zero_grad(set_to_none=True)
    losses = []
    for _ in range(10):
        _, loss = model(x, y)
        losses.append(loss.item())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    np.save(out / "adamw_losses.npy", np.array(losses, dtype=np.float32))
    print(f"{name}: loss {losses[0]:.6f} -> {losses[-1]:.6f}")


torch.set_num_threads(1)
make("bias", dict(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=0.0,
                  bias=True), B=2, T=16, seed=1337)
# No biases, a shorter sequence than the block, more heads.
make("nobias", dict(vocab_size=65, block_size=16, n_layer=1, n_head=4, n_embd=16, dropout=0.0,
                    bias=False), B=2, T=11, seed=7)
(root / "versions.json").write_text(
    json.dumps({"numpy": np.__version__, "torch": torch.__version__}, indent=2) + "\n")
print(f"wrote {root}")
