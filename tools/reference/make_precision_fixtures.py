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
