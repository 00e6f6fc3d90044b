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
(Mistral 7B's sliding window). The model and the writer are in reference_gpt.py, beside
this script. The fixtures are committed; the tests never need PyTorch.
"""
import pathlib

import torch

from reference_gpt import make, write_versions

root = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "gqa"

torch.set_num_threads(1)
# Grouped-query attention: 4 query heads in 2 groups, learned positions, biases.
make(root, "gqa", dict(vocab_size=65, block_size=8, n_layer=2, n_head=4, n_embd=16,
                       bias=True, n_kv_head=2), B=2, T=8, seed=16)
# Multi-query attention (one key/value head) with a window of 3, no biases.
make(root, "mqa_window", dict(vocab_size=65, block_size=8, n_layer=2, n_head=4, n_embd=16,
                              bias=False, n_kv_head=1, window=3), B=2, T=8, seed=17)
# Both with RoPE, read beyond block_size: 2 groups, window 4, T = 12.
make(root, "gqa_rope_window", dict(vocab_size=65, block_size=8, n_layer=2, n_head=4,
                                   n_embd=16, bias=True, n_kv_head=2, window=4,
                                   position="rope"), B=2, T=12, seed=18)
write_versions(root)
print(f"wrote {root}")
