#!/usr/bin/python3
"""Times one CPU training step of the same GPT in PyTorch and in the course library.

A step is what a training loop does per batch: forward, backward, gradient clipping to
norm 1.0 and AdamW (lr 1e-3, betas (0.9, 0.99), weight decay 0.1 on tensors of 2 or more
dimensions). Both sides use the same sizes, the same batch shape and the same number of
threads. The PyTorch model is written here in the shape of nanoGPT's model.py
(embeddings, pre-norm blocks, causal attention by masked_fill and softmax, exact GELU,
tied LM head), so this script needs only PyTorch, not nanoGPT.

torch runs its element-wise operations on OpenMP threads and its matrix products on
OpenBLAS's own threads; the two pools can get in each other's way. With more than one
thread, each round times PyTorch twice, with OpenBLAS on the same number of threads and
on one, and the faster of the two is the PyTorch figure the ratio uses.

Rounds alternate between the two programs, so that a burst of load on a shared machine
hits both; each round reports the median of its timed steps, and the table shows the
median over rounds.

    /usr/bin/python3 tools/bench/cpu_train_bench.py --threads 1 2 --rounds 5

Run it with Debian's /usr/bin/python3 (python3-torch). Build bench_train_cpu first
(`cmake --build build --target bench_train_cpu`).
"""

import argparse
import ctypes
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, bias):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.n_head = n_head
        mask = torch.tril(torch.ones(block_size, block_size))
        self.register_buffer("bias", mask.view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, NH, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, NH, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, n_embd, bias):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()  # exact (erf)
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, bias):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, elementwise_affine=True)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, bias)
        self.ln_2 = nn.LayerNorm(n_embd, elementwise_affine=True)
        self.mlp = MLP(n_embd, bias)
        if not bias:
            self.ln_1.bias = None
            self.ln_2.bias = None

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd, bias):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(
            [Block(n_embd, n_head, block_size, bias) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        if not bias:
            self.ln_f.bias = None
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as nanoGPT
        for name, p in self.named_parameters():  # nanoGPT's initialisation
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer))
            elif p.dim() >= 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_torch_step(args):
    torch.manual_seed(1337)
    model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd,
                args.bias)
    model.train()
    # nanoGPT's configure_optimizers: decay the tensors of 2 or more dimensions only
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99))
    x = torch.randint(args.vocab_size, (args.batch_size, args.block_size))
    y = torch.randint(args.vocab_size, (args.batch_size, args.block_size))

    def step():
        loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss

    return step


def openblas():
    """The OpenBLAS that torch calls for its matrix products (Debian's torch links it)."""
    try:
        return ctypes.CDLL("libopenblas.so.0")
    except OSError:
        return None


def time_torch(step, threads, blas_threads, args):
    """Median ms per step with `threads` OpenMP threads and `blas_threads` OpenBLAS threads."""
    torch.set_num_threads(threads)
    if OPENBLAS is not None:
        OPENBLAS.openblas_set_num_threads(blas_threads)
    for _ in range(args.warmup):
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def time_ours(threads, args):
    cmd = [args.bench_exe, "--threads", str(threads), "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--n_layer", str(args.n_layer),
           "--n_head", str(args.n_head), "--n_embd", str(args.n_embd),
           "--block_size", str(args.block_size), "--batch_size", str(args.batch_size),
           "--vocab_size", str(args.vocab_size), "--bias", "1" if args.bias else "0"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


OPENBLAS = openblas()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_exe = os.path.join(here, "..", "..", "build", "tools", "bench", "bench_train_cpu")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per thread count")
    p.add_argument("--steps", type=int, default=30, help="timed steps per round")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before each round")
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=128)
    p.add_argument("--block_size", type=int, default=64)
    p.add_argument("--batch_size", type=int, default=12)
    p.add_argument("--vocab_size", type=int, default=65)
    p.add_argument("--bias", type=int, default=1, choices=[0, 1])
    p.add_argument("--bench-exe", default=os.path.normpath(default_exe))
    p.add_argument("--json", help="also write every round's numbers to this file")
    args = p.parse_args()
    if not os.path.exists(args.bench_exe):
        sys.exit(f"cpu_train_bench: {args.bench_exe} not found; build the bench_train_cpu "
                 "target first or pass --bench-exe")

    step = make_torch_step(args)
    tokens = args.batch_size * args.block_size
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}; n_layer {args.n_layer}, n_head {args.n_head}, "
          f"n_embd {args.n_embd}, block {args.block_size}, batch {args.batch_size}, "
          f"vocab {args.vocab_size}, bias {bool(args.bias)}; median of {args.steps} steps "
          f"per round, {args.rounds} rounds; load average {os.getloadavg()[0]:.2f}", flush=True)
    record = []
    rows = []
    for threads in args.threads:
        torch_ms, ours_ms, ratios = [], [], []
        for r in range(args.rounds):
            blas_choices = [threads, 1] if threads > 1 and OPENBLAS is not None else [threads]
            by_blas = {n: time_torch(step, threads, n, args) for n in blas_choices}
            t = min(by_blas.values())
            o = time_ours(threads, args)
            torch_ms.append(t)
            ours_ms.append(o["ms_per_step"])
            ratios.append(t / o["ms_per_step"])
            record.append({"threads": threads, "round": r, "torch_ms": t,
                           "torch_ms_by_openblas_threads": by_blas, "ours": o})
            detail = ", ".join(f"OpenBLAS {n}: {ms:.1f}" for n, ms in by_blas.items())
            print(f"#   threads {threads} round {r}: torch {t:7.2f} ms ({detail}), ours "
                  f"{o['ms_per_step']:7.2f} ms (fwd {o['forward_ms']:.1f}, bwd "
                  f"{o['backward_ms']:.1f}, clip {o['clip_ms']:.2f}, adamw "
                  f"{o['adamw_ms']:.2f}), ratio {t / o['ms_per_step']:.2f}", flush=True)
        print(f"#   load average now {os.getloadavg()[0]:.2f}", flush=True)
        rows.append((threads, statistics.median(torch_ms), statistics.median(ours_ms),
                     statistics.median(ratios)))

    print()
    print(f"| threads | PyTorch ms/step | PyTorch tokens/s | ours ms/step | ours tokens/s "
          f"| speed-up (median of {args.rounds} round ratios) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for threads, t, o, ratio in rows:
        print(f"| {threads} | {t:.1f} | {tokens / t * 1000:.0f} | {o:.1f} | "
              f"{tokens / o * 1000:.0f} | {ratio:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
