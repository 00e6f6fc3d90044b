#!/usr/bin/python3
"""Writes the reference fixtures for scaled dot-product attention (lesson 06) and
multi-head attention (lesson 07): tests/fixtures/sdpa and tests/fixtures/multi_head.

Run with Debian's python3 (python3-numpy and python3-torch):

    /usr/bin/python3 tools/reference/make_attention_fixtures.py

The fixtures are committed, so the tests never need PyTorch. Inputs are float32; the
reference is computed from them with explicit torch operations in float64 and then
rounded to float32, so the fixtures hold the correctly rounded answer for the float32
inputs. (torch 1.13 has no torch.nn.functional.scaled_dot_product_attention, and an
explicit formula is what it would compute anyway.)

Masks are saved as bool arrays; true means "may attend".
"""
import json
import math
import pathlib

import numpy as np
import torch

root = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def attention64(q, k, v, mask=None, scale=None):
    """softmax(q kᵀ · scale, masked) v over the last two axes, in float64."""
    q, k, v = q.double(), k.double(), v.double()
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights @ v).float(), weights.float()


def random_mask(shape, generator):
    """A random boolean mask in which every row allows at least one key."""
    mask = torch.rand(shape, generator=generator) < 0.6
    mask[..., 0] |= ~mask.any(dim=-1)
    return mask


# --- scaled dot-product attention ----------------------------------------------------
out = root / "sdpa"
out.mkdir(parents=True, exist_ok=True)
g = torch.Generator().manual_seed(6)
cases = {
    # name: (batch axes, T_q, T_k, d_k, d_v, mask shape or "causal" or None)
    "d2_plain": ((), 4, 4, 8, 8, None),
    "d3_tq_ne_tk": ((2,), 3, 5, 8, 6, None),
    "d3_causal": ((2,), 5, 5, 8, 8, "causal"),
    "d4_plain": ((2, 3), 4, 6, 8, 4, None),
    "d4_mask": ((2, 3), 4, 6, 8, 4, (4, 6)),
    "d4_key_padding": ((2, 3), 4, 6, 8, 4, (2, 1, 1, 6)),
    "d5_plain": ((2, 2, 2), 3, 5, 4, 3, None),
    "d5_mask": ((2, 2, 2), 3, 5, 4, 3, (2, 1, 2, 3, 5)),
    "d5_causal": ((2, 1, 3), 6, 6, 4, 4, "causal"),
}
for name, (batch, tq, tk, dk, dv, mask_shape) in cases.items():
    q = torch.randn(*batch, tq, dk, generator=g)
    k = torch.randn(*batch, tk, dk, generator=g)
    v = torch.randn(*batch, tk, dv, generator=g)
    if mask_shape == "causal":
        mask = torch.tril(torch.ones(tq, tk, dtype=torch.bool))
    elif mask_shape is not None:
        mask = random_mask(mask_shape, g)
    else:
        mask = None
    y, w = attention64(q, k, v, mask)
    for tag, t in (("q", q), ("k", k), ("v", v), ("out", y), ("weights", w)):
        np.save(out / f"{name}_{tag}.npy", t.numpy().astype(np.float32))
    if mask is not None:
        np.save(out / f"{name}_mask.npy", mask.numpy())

(out / "versions.json").write_text(
    json.dumps({"numpy": np.__version__, "torch": torch.__version__,
                "reference": "explicit torch ops in float64, rounded to float32"}, indent=2)
    + "\n")

# --- multi-head causal self-attention (nanoGPT's CausalSelfAttention, written out) ---
out = root / "multi_head"
out.mkdir(parents=True, exist_ok=True)
torch.manual_seed(7)
B, T, C, NH = 2, 6, 16, 4
hs = C // NH
for bias in (False, True):
    c_attn = torch.nn.Linear(C, 3 * C, bias=bias)
    c_proj = torch.nn.Linear(C, C, bias=bias)
    with torch.no_grad():  # larger than the default init, so the heads' weights are not flat
        c_attn.weight.mul_(2.0)
    x = torch.randn(B, T, C)
    with torch.no_grad():
        qkv = torch.nn.functional.linear(x.double(), c_attn.weight.double(),
                                         c_attn.bias.double() if bias else None)
        q, k, v = qkv.split(C, dim=2)                   # each (B, T, C)
        q = q.view(B, T, NH, hs).transpose(1, 2)        # (B, NH, T, hs)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
        y, att = attention64(q, k, v, causal)           # (B, NH, T, hs), (B, NH, T, T)
        y = y.double().transpose(1, 2).contiguous().view(B, T, C)
        y = torch.nn.functional.linear(y, c_proj.weight.double(),
                                       c_proj.bias.double() if bias else None)
    tag = "bias" if bias else "nobias"
    np.save(out / f"{tag}_x.npy", x.numpy())
    np.save(out / f"{tag}_c_attn_weight.npy", c_attn.weight.detach().numpy())
    np.save(out / f"{tag}_c_proj_weight.npy", c_proj.weight.detach().numpy())
    if bias:
        np.save(out / f"{tag}_c_attn_bias.npy", c_attn.bias.detach().numpy())
        np.save(out / f"{tag}_c_proj_bias.npy", c_proj.bias.detach().numpy())
    np.save(out / f"{tag}_y.npy", y.float().numpy())
    np.save(out / f"{tag}_att.npy", att.numpy())

(out / "versions.json").write_text(
    json.dumps({"numpy": np.__version__, "torch": torch.__version__, "n_head": NH,
                "reference": "explicit torch ops in float64, rounded to float32"}, indent=2)
    + "\n")
print(f"wrote {root / 'sdpa'} and {root / 'multi_head'}")
