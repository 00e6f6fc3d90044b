#!/usr/bin/python3
"""Writes the reference fixtures for one head of causal self-attention (tests/fixtures/head).

Run with Debian's python3 (python3-numpy and python3-torch):

    /usr/bin/python3 tools/reference/make_head_fixtures.py

For each case, a PyTorch head with the same structure as the `Head` of Karpathy's "Let's build
GPT" lecture code (karpathy/ng-video-lecture, gpt.py) (three bias-free
projections, a causal `tril` buffer built at the block size and sliced to T, dropout on the
weights) runs in evaluation mode on random weights and inputs. The files of case NAME:

    NAME_key.npy, NAME_query.npy, NAME_value.npy   (hs, C)   the projection weights
    NAME_x.npy                                      (B, T, C) the input
    NAME_weights.npy                                (B, T, T) the attention weights
    NAME_out.npy                                    (B, T, hs) the head's output

cases.txt lists the cases as `NAME B T C hs block_size`, and versions.json records the
versions of torch and numpy that computed them. The fixtures are committed, so the tests
never need PyTorch.
"""
import json
import pathlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Head(nn.Module):
    """One head of causal self-attention, written as nanoGPT writes it."""

    def __init__(self, n_embd, head_size, block_size, dropout):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        k = self.key(x)
        q = self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        wei = F.softmax(wei, dim=-1)
        self.last_weights = wei
        wei = self.dropout(wei)
        v = self.value(x)
        return wei @ v


# (B, T, C, hs, block_size): T below the block size in two cases (the mask is sliced), equal
# to it in the other three.
CASES = [
    (1, 3, 2, 2, 3),
    (2, 5, 8, 4, 8),
    (3, 8, 16, 8, 8),
    (2, 6, 32, 16, 10),
    (2, 16, 32, 8, 16),
]

out = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "head"
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(1234)
lines = []
for B, T, C, hs, block_size in CASES:
    name = f"b{B}_t{T}_c{C}_hs{hs}_block{block_size}"
    head = Head(C, hs, block_size, dropout=0.2)
    head.eval()  # evaluation mode: dropout is the identity
    x = torch.randn(B, T, C)
    with torch.no_grad():
        y = head(x)
    for part in ("key", "query", "value"):
        np.save(out / f"{name}_{part}.npy", getattr(head, part).weight.detach().numpy())
    np.save(out / f"{name}_x.npy", x.numpy())
    np.save(out / f"{name}_weights.npy", head.last_weights.numpy())
    np.save(out / f"{name}_out.npy", y.numpy())
    lines.append(f"{name} {B} {T} {C} {hs} {block_size}")

(out / "cases.txt").write_text("\n".join(lines) + "\n")
(out / "versions.json").write_text(
    json.dumps({"numpy": np.__version__, "torch": torch.__version__}, indent=2) + "\n")
print(f"wrote {len(CASES)} cases to {out}")
