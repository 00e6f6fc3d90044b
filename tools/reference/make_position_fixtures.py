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
pos * 10000^(-2i/hs), as Meta's Llama code does too. The script also checks that the
convention of GPT-NeoX and Hugging Face's Llama (channel i paired with i + hs/2, rotate_half)
gives the same scores once q and k's channels are permuted. ALiBi's slopes are
Press et al. 2021's (their get_slopes, including a head count that is not a power of two).
The model and the writer are in reference_gpt.py, beside this script. The fixtures are
committed; the tests never need PyTorch.
"""
import pathlib
import shutil

import numpy as np
import torch

from reference_gpt import make, rope_halves, rope_pairs, save, write_versions

root = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "positions"


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
make(root, "rope", dict(vocab_size=65, block_size=8, n_layer=2, n_head=2, n_embd=16,
                        bias=True, position="rope"), B=2, T=12, seed=15)
# ALiBi with 3 heads: slopes of 2 heads, then one of 4 (Press et al.'s rule for other counts).
make(root, "alibi", dict(vocab_size=65, block_size=8, n_layer=2, n_head=3, n_embd=12,
                         bias=False, position="alibi"), B=2, T=12, seed=16)
make_rotation()
write_versions(root)
print(f"wrote {root}")
