#!/usr/bin/python3
"""Times one CPU training step of the course's train_gpt against PyTorch, same model, same machine.

The course's side is the program learners run: `train_gpt --recipe cpu --bench N
--threads T`, with its defaults (the thread policy of attn/threads.hpp, the recipe's
sizes). Its bench line names the model (layers, heads, channels, block, vocabulary, bias,
dropout, batch), and the PyTorch model is built from that line, so both sides always time
the same configuration. A step is what a training loop does per batch: forward, backward,
gradient clipping to norm 1.0 and AdamW (betas (0.9, 0.99), weight decay 0.1 on tensors of
2 or more dimensions). The PyTorch model is written here in the shape of nanoGPT's
model.py (embeddings, pre-norm blocks, causal attention by masked_fill and softmax, exact
GELU, tied LM head), so this script needs only PyTorch, not nanoGPT.

torch runs its element-wise operations on OpenMP threads and its matrix products on
OpenBLAS's own threads, and the two pools can get in each other's way. Each round times
PyTorch on no more cores than train_gpt gets: torch.set_num_threads(T) with OpenBLAS on T
and on 1 thread, and one torch thread with OpenBLAS on T; the table shows the fastest of
these. PyTorch's default configuration (torch and OpenBLAS each on every CPU) is the first
of them at T = CPUs, and the summary names it and PyTorch's fastest configuration of the run.

With --harness, each round also times bench_train_cpu (the library's step on a fixed
batch, with a per-phase breakdown) on the same sizes, to show that it and train_gpt agree.

Rounds alternate between the programs, so that a burst of load on a shared machine hits
all of them; each round reports per-step times, and the table shows medians over rounds.

    /usr/bin/python3 tools/bench/cpu_train_bench.py --threads 1 2 --rounds 5

Run it with Debian's /usr/bin/python3 (python3-torch), after building train_gpt (and
bench_train_cpu for --harness): `cmake --build build --target train_gpt bench_train_cpu`.
"""

import argparse
import ctypes
import json
import math
import os
import platform
import re
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


def make_torch_step(cfg):
    torch.manual_seed(1337)
    model = GPT(cfg["vocab"], cfg["block"], cfg["layers"], cfg["heads"], cfg["channels"],
                cfg["bias"])
    model.train()
    # nanoGPT's configure_optimizers: decay the tensors of 2 or more dimensions only
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99))
    x = torch.randint(cfg["vocab"], (cfg["B"], cfg["T"]))
    y = torch.randint(cfg["vocab"], (cfg["B"], cfg["T"]))

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


OPENBLAS = openblas()
# OpenBLAS's own default, read before anything changes it: one thread per CPU.
OPENBLAS_DEFAULT = OPENBLAS.openblas_get_num_threads() if OPENBLAS is not None else None


def time_torch(step, threads, blas_threads, args):
    """Median ms per step with `threads` torch threads and `blas_threads` OpenBLAS threads."""
    torch.set_num_threads(threads)
    if OPENBLAS is not None:
        OPENBLAS.openblas_set_num_threads(blas_threads)
    for _ in range(3):  # the same warm-up as train_gpt --bench
        step()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


BENCH_LINE = re.compile(
    r"bench: recipe (?P<recipe>\S+) \((?P<layers>\d+) layers, (?P<heads>\d+) heads, "
    r"(?P<channels>\d+) channels, block (?P<block>\d+), vocabulary (?P<vocab>\d+), "
    r"bias (?P<bias>on|off), dropout (?P<dropout>[0-9.e-]+)\), B=(?P<B>\d+), T=(?P<T>\d+), "
    r"(?P<steps>\d+) steps: (?P<ms>[0-9.]+) ms/step \(median")


def run_train_gpt(threads, args):
    """train_gpt --bench as a learner runs it: the threads line and the parsed bench line."""
    cmd = [args.train_gpt, "--recipe", args.recipe, "--bench", str(args.steps)]
    if threads != os.cpu_count():  # every CPU is the default: time it as learners run it
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    threads_line = next((l for l in out.splitlines() if l.startswith("threads: ")), "")
    m = BENCH_LINE.search(out)
    if m is None:
        sys.exit(f"cpu_train_bench: no bench line in the output of {' '.join(cmd)}:\n{out}")
    cfg = {k: int(v) for k, v in m.groupdict().items() if k not in ("recipe", "bias", "dropout", "ms")}
    cfg.update(recipe=m["recipe"], bias=m["bias"] == "on", dropout=float(m["dropout"]),
               ms=float(m["ms"]), threads_line=threads_line)
    return cfg


def run_harness(threads, cfg, args):
    cmd = [args.harness_exe, "--threads", str(threads), "--steps", str(args.steps),
           "--warmup", "3", "--n_layer", str(cfg["layers"]), "--n_head", str(cfg["heads"]),
           "--n_embd", str(cfg["channels"]), "--block_size", str(cfg["T"]),
           "--batch_size", str(cfg["B"]), "--vocab_size", str(cfg["vocab"]),
           "--bias", "1" if cfg["bias"] else "0"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    build = os.path.normpath(os.path.join(here, "..", "..", "build"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds per thread count")
    p.add_argument("--steps", type=int, default=30, help="timed steps per round and program")
    p.add_argument("--recipe", default="cpu", help="train_gpt's recipe (dropout-free ones)")
    p.add_argument("--train-gpt", default=os.path.join(build, "tools", "train_gpt"))
    p.add_argument("--harness", action="store_true",
                   help="also time bench_train_cpu, to compare it with train_gpt")
    p.add_argument("--harness-exe", default=os.path.join(build, "tools", "bench", "bench_train_cpu"))
    p.add_argument("--json", help="also write every round's numbers to this file")
    args = p.parse_args()
    for exe, needed in ((args.train_gpt, True), (args.harness_exe, args.harness)):
        if needed and not os.path.exists(exe):
            sys.exit(f"cpu_train_bench: {exe} not found; build it first "
                     "(cmake --build build --target train_gpt bench_train_cpu)")

    first = run_train_gpt(args.threads[0], args)
    if first["dropout"] != 0:
        sys.exit(f"cpu_train_bench: recipe {first['recipe']} trains with dropout "
                 f"{first['dropout']}; the PyTorch side here has none: use a dropout-free recipe")
    step = make_torch_step(first)
    tokens = first["B"] * first["T"]
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"torch {torch.__version__}, OpenBLAS default {OPENBLAS_DEFAULT} threads; recipe "
          f"{first['recipe']}: {first['layers']} layers, {first['heads']} heads, "
          f"{first['channels']} channels, block {first['block']}, vocab {first['vocab']}, "
          f"bias {first['bias']}, B={first['B']}, T={first['T']}; {args.steps} steps per "
          f"round and program, {args.rounds} rounds; load average {os.getloadavg()[0]:.2f}",
          flush=True)
    record, rows = [], []
    cpus = os.cpu_count()
    torch_by_config = {}  # (torch threads, OpenBLAS threads) -> ms of every round
    for threads in args.threads:
        cols = {"ours": [], "harness": [], "torch_best": []}
        for r in range(args.rounds):
            ours = run_train_gpt(threads, args)
            if r == 0:
                print(f"#   train_gpt --threads {threads}: {ours['threads_line']}", flush=True)
            # PyTorch on no more cores than train_gpt: OpenBLAS on 1 or on as many threads as
            # torch (its own default, one per CPU, is that at threads == CPUs).
            blas_choices = sorted({threads, 1})
            by_blas = {n: time_torch(step, threads, n, args) for n in blas_choices}
            for n, ms in by_blas.items():
                torch_by_config.setdefault((threads, n), []).append(ms)
            if threads > 1:  # and one torch thread beside OpenBLAS's T: often its fastest
                mixed = time_torch(step, 1, threads, args)
                torch_by_config.setdefault((1, threads), []).append(mixed)
                by_blas[f"{threads}, torch 1"] = mixed
            harness = run_harness(threads, ours, args) if args.harness else None
            cols["ours"].append(ours["ms"])
            cols["torch_best"].append(min(by_blas.values()))
            if harness:
                cols["harness"].append(harness["ms_per_step"])
            record.append({"threads": threads, "round": r, "train_gpt_ms": ours["ms"],
                           "torch_ms_by_openblas_threads": by_blas, "harness": harness})
            detail = ", ".join(f"OpenBLAS {n}: {ms:.1f}" for n, ms in by_blas.items())
            extra = f", bench_train_cpu {harness['ms_per_step']:.1f} ms" if harness else ""
            print(f"#   threads {threads} round {r}: train_gpt {ours['ms']:7.2f} ms{extra}; "
                  f"torch {threads} threads ({detail}) ms", flush=True)
        print(f"#   load average now {os.getloadavg()[0]:.2f}", flush=True)
        if args.harness:
            ratio = statistics.median(o / h for o, h in zip(cols["ours"], cols["harness"]))
            print(f"#   train_gpt / bench_train_cpu, median of the rounds' ratios: {ratio:.3f}",
                  flush=True)
        rows.append((threads, {k: statistics.median(v) for k, v in cols.items() if v},
                     statistics.median(t / o for t, o in zip(cols["torch_best"], cols["ours"]))))

    print()
    head = "| threads | train_gpt ms/step | train_gpt tokens/s |"
    if args.harness:
        head += " bench_train_cpu ms/step |"
    head += " PyTorch ms/step (faster OpenBLAS setting) | speed-up |"
    print(head)
    print("|" + "---:|" * (head.count("|") - 1))
    for threads, med, speedup in rows:
        line = f"| {threads} | {med['ours']:.1f} | {tokens / med['ours'] * 1000:.0f} |"
        if args.harness:
            line += f" {med['harness']:.1f} |"
        line += f" {med['torch_best']:.1f} | {speedup:.2f}x |"
        print(line)
    print(f"\n(speed-up: the median over the {args.rounds} rounds of PyTorch's ms/step over "
          "train_gpt's in the same round)")
    # train_gpt as learners run it against PyTorch as it comes and at its fastest here.
    ours_default = [r[1]["ours"] for r in rows if r[0] == cpus]
    if ours_default:
        ours = ours_default[0]
        print(f"train_gpt with its defaults ({cpus} threads): {ours:.1f} ms/step")
        if (cpus, OPENBLAS_DEFAULT) in torch_by_config:
            default = statistics.median(torch_by_config[(cpus, OPENBLAS_DEFAULT)])
            print(f"PyTorch's default configuration (torch {cpus} threads, OpenBLAS "
                  f"{OPENBLAS_DEFAULT}): {default:.1f} ms/step: {default / ours:.2f}x")
        (bt, bb), best = min(((k, statistics.median(v)) for k, v in torch_by_config.items()),
                             key=lambda kv: kv[1])
        print(f"PyTorch's fastest configuration in this run (torch {bt} threads, OpenBLAS "
              f"{bb}): {best:.1f} ms/step: {best / ours:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
