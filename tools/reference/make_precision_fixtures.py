#!/usr/bin/python3
"""Writes the reference fixtures for the 16-bit formats (tests/fixtures/precision).

Run with Debian's python3 (python3-numpy and python3-torch):

    /usr/bin/python3 tools/reference/make_precision_fixtures.py

PyTorch's own conversions (CPU: c10::Half and c10::BFloat16, round to nearest even) of
float32 values chosen to be hard: exact ties between two neighbours, one step either side
of them, the edges of each format's range (largest values, the overflow threshold,
subnormals, the underflow threshold), infinities, NaNs with payloads in the low bits,
float32 subnormals, and random bit patterns over the whole float32 range. The values are
stored as their bits, each split into two 16-bit halves (exact in the float32 the .npy
reader returns), and so are the results.
"""
import json
import pathlib

import numpy as np
import torch

out = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "precision"
out.mkdir(parents=True, exist_ok=True)

bits = []


def add_floats(values):
    bits.extend(np.asarray(values, dtype=np.float32).view(np.uint32).tolist())


def add_bits(patterns):
    bits.extend(int(p) & 0xFFFFFFFF for p in patterns)


# Plain values, both signs.
add_floats([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 3.0, 0.1, -0.1, 1 / 3, 65504.0, -65504.0,
            np.inf, -np.inf])
# Ties and their neighbours. bfloat16 keeps 7 mantissa bits: at 1 a step is 2^-7, so
# 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 (to even: 1) and 1 + 3·2^-8 between
# 1 + 2^-7 and 1 + 2^-6 (to even: 1 + 2^-6). float16 keeps 10: the same at 2^-11.
for half_step in (2.0 ** -8, 2.0 ** -11):
    for k in (1, 3, 5, 7):
        for base in (1.0, 1.5, 2.0, 1024.0, 2.0 ** -10):
            tie = np.float32(base + k * half_step * base)
            add_floats([tie, -tie])
            add_bits([tie.view(np.uint32) + 1, tie.view(np.uint32) - 1])
# A carry into the exponent: the largest float below 2 rounds up to 2.
add_bits([0x3FFFFFFF, 0x3FFF8000, 0x3FFF7FFF, 0x407FFFFF])
# float16's edges: the largest value, the overflow threshold 65520 (a tie: goes to inf),
# just below it; the smallest normal 2^-14 and the subnormals 2^-24, the underflow
# threshold 2^-25 (a tie: goes to 0), just above it, 1.5·2^-24 (a tie between subnormals).
add_floats([65519.0, 65520.0, 65536.0, 1e5, 2.0 ** -14, 2.0 ** -24, 2.0 ** -25,
            1.5 * 2.0 ** -24, 2.5 * 2.0 ** -24, 3 * 2.0 ** -26, 2.0 ** -14 - 2.0 ** -25,
            6e-8, 5.9e-8, 3e-8, 1e-8])
add_bits([np.float32(2.0 ** -25).view(np.uint32) + 1, np.float32(65520.0).view(np.uint32) - 1])
# bfloat16's edges: float32's largest value rounds to infinity; bfloat16's largest value;
# float32 subnormals (bfloat16 has subnormals too, the top half of float32's).
add_bits([0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x7F7F0000, 0x00000001, 0x00008000,
          0x00010000, 0x00018000, 0x00007FFF, 0x807FFFFF])
# NaNs: quiet, signalling with a payload in the low 16 bits only (cut naively it would
# leave 0x7F80: infinity), negative.
add_bits([0x7FC00000, 0x7F800001, 0x7F80FFFF, 0xFF800001, 0x7FFFFFFF, 0xFFC00000])
# Random bit patterns over the whole range, and random values of ordinary size.
rng = np.random.default_rng(18)
add_bits(rng.integers(0, 2 ** 32, size=3000, dtype=np.uint64))
add_floats(rng.normal(0.0, 1.0, size=500) * np.exp2(rng.integers(-30, 20, size=500)))

x = np.array(bits, dtype=np.uint32)
f32 = torch.from_numpy(x.view(np.float32).copy())
fp16 = f32.to(torch.float16).view(torch.int16).numpy().astype(np.int32) & 0xFFFF
bf16 = f32.to(torch.bfloat16).view(torch.int16).numpy().astype(np.int32) & 0xFFFF

np.save(out / "input_bits_high.npy", (x >> 16).astype(np.int32))
np.save(out / "input_bits_low.npy", (x & 0xFFFF).astype(np.int32))
np.save(out / "float16_bits.npy", fp16)
np.save(out / "bfloat16_bits.npy", bf16)
(out / "versions.json").write_text(
    json.dumps({"numpy": np.__version__, "torch": torch.__version__, "values": len(x)}, indent=2) + "\n")
print(f"wrote {len(x)} values to {out}")


# ---------------------------------------------------------------------------------------
# The GPT with its matrix products' inputs rounded (tests/fixtures/precision/gpt_*): the
# course's mixed precision (GPT::set_precision), written here from its definition. Every
# Linear layer's input and weight are rounded to the format and multiplied in float32, the
# bias added in float32; q, k and v (c_attn's output) are rounded; in the backward pass the
# gradient entering each Linear layer's products is rounded (the bias's gradient is summed
# from that rounded gradient), and the products run in float32 on the rounded values. The
# loss may be multiplied by a scale before the backward pass, the gradients divided by it
# after. Written: weights/, x.npy, y.npy, loss.npy, logits.npy, grad/<key>.npy, and
# rounding.npy: (values rounded in the backward pass, of which flushed to zero, of which made
# subnormal), counted as the course counts them (finite non-zero values only).
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import reference_gpt  # noqa: E402

MIN_NORMAL = {torch.float16: 2.0 ** -14, torch.bfloat16: 2.0 ** -126}


def rounded(x, dtype):
    return x.to(dtype).float()


class Counter:
    def __init__(self):
        self.values = self.flushed = self.subnormal = 0

    def add(self, before, after, dtype):
        counted = torch.isfinite(before) & (before != 0)
        self.values += int(counted.sum())
        self.flushed += int((counted & (after == 0)).sum())
        self.subnormal += int((counted & (after != 0) & (after.abs() < MIN_NORMAL[dtype])).sum())


class RoundedLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, dtype, counter):
        xr, wr = rounded(x, dtype), rounded(weight, dtype)
        ctx.save_for_backward(xr, wr)
        ctx.dtype, ctx.counter, ctx.has_bias = dtype, counter, bias is not None
        out = xr @ wr.t()
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx, g):
        xr, wr = ctx.saved_tensors
        gr = rounded(g, ctx.dtype)
        ctx.counter.add(g, gr, ctx.dtype)
        g2 = gr.reshape(-1, gr.shape[-1])
        dx = gr @ wr
        dw = g2.t() @ xr.reshape(-1, xr.shape[-1])
        db = g2.sum(0) if ctx.has_bias else None
        return dx, dw, db, None, None


class RoundedValues(torch.autograd.Function):
    """q, k and v stored in the format; the gradient passes through unchanged."""
    @staticmethod
    def forward(ctx, x, dtype):
        return rounded(x, dtype)

    @staticmethod
    def backward(ctx, g):
        return g, None


def mixed_precision(model, dtype, counter):
    """Routes every Linear layer of a reference_gpt.GPT through RoundedLinear."""
    def route(linear, round_output=False):
        def forward(x):
            y = RoundedLinear.apply(x, linear.weight, linear.bias, dtype, counter)
            return RoundedValues.apply(y, dtype) if round_output else y
        linear.forward = forward
    for block in model.transformer.h:
        route(block.attn.c_attn, round_output=True)
        route(block.attn.c_proj)
        route(block.mlp.c_fc)
        route(block.mlp.c_proj)
    route(model.lm_head)


def make_mixed(name, dtype, loss_scale):
    out = out_root / name
    shutil.rmtree(out, ignore_errors=True)
    cfg = dict(vocab_size=65, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=True)
    torch.manual_seed(1818)
    model = reference_gpt.GPT(cfg)
    weights = out / "weights"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text(json.dumps(
        {**cfg, "dropout": 0.0, "vocab": reference_gpt.VOCAB, "step": 0}, indent=2) + "\n")
    for key, p in model.state_dict().items():
        reference_gpt.save(weights / f"{key}.npy", p)
    counter = Counter()
    mixed_precision(model, dtype, counter)
    B, T = 2, 16
    x = torch.randint(0, cfg["vocab_size"], (B, T))
    y = torch.randint(0, cfg["vocab_size"], (B, T))
    np.save(out / "x.npy", x.numpy())
    np.save(out / "y.npy", y.numpy())
    logits, loss = model(x, y)
    (loss * loss_scale).backward()
    reference_gpt.save(out / "logits.npy", logits)
    reference_gpt.save(out / "loss.npy", loss.reshape(1))
    for key, p in model.named_parameters():
        reference_gpt.save(out / "grad" / f"{key}.npy", p.grad / loss_scale)
    np.save(out / "rounding.npy", np.array([counter.values, counter.flushed, counter.subnormal],
                                           dtype=np.float32))
    print(f"{name}: loss {loss.item():.6f}, backward: {counter.values} values rounded, "
          f"{counter.flushed} flushed, {counter.subnormal} subnormal")


import shutil  # noqa: E402

out_root = out
torch.set_num_threads(1)
make_mixed("gpt_bf16", torch.bfloat16, 1.0)
make_mixed("gpt_fp16", torch.float16, 1.0)
make_mixed("gpt_fp16_scaled", torch.float16, 1024.0)
