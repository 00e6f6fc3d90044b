#!/usr/bin/python3
"""Times one training step of the same GPT in PyTorch and in the course's train_gpt, on the CPU.

Run with Debian's python3 (python3-torch), after building:

    /usr/bin/python3 tools/bench/cpu_train_bench.py [--threads 2] [--steps 20] [--sdpa]

Both sides run nanoGPT's CPU recipe (4 layers, 4 heads, 128 channels, block 64, batch 12,
vocabulary 65, no biases, no dropout) for the same number of steps after 3 warm-up steps:
forward, backward, gradient clipping at 1.0, AdamW. PyTorch gets torch.set_num_threads(N),
train_gpt gets OPENBLAS_NUM_THREADS=N. The PyTorch model is the one written out in
tools/reference/make_gpt_fixtures.py (plain attention, as nanoGPT without flash attention);
--sdpa swaps in torch's fused F.scaled_dot_product_attention instead (torch 2.0 or later).

On a machine whose cores are busy with other work, PyTorch's OpenMP threads can wait on each
other for far longer than the work takes; compare with --threads 1 there.
"""
import argparse
import ast
import os
import pathlib
import re
import subprocess
import time

import torch
import torch.nn.functional as F

ROOT = pathlib.Path(__file__).resolve().parents[2]


def reference_model_code():
    """The classes and functions of make_gpt_fixtures.py, without its fixture-writing code."""
    path = ROOT / "tools" / "reference" / "make_gpt_fixtures.py"
    tree = ast.parse(path.read_text())
    keep = (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef)
    tree.body = [node for node in tree.body if isinstance(node, keep)]
    namespace = {}
    exec(compile(tree, str(path), "exec"), namespace)
    return namespace


def sdpa_forward(self, x):
    B, T, C = x.shape
    q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
    q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


def bench_torch(args):
    ref = reference_model_code()
    if args.sdpa:
        if not hasattr(F, "scaled_dot_product_attention"):
            raise SystemExit(f"--sdpa: torch {torch.__version__} has no "
                             "F.scaled_dot_product_attention (it came with torch 2.0)")
        ref["CausalSelfAttention"].forward = sdpa_forward
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)
    cfg = dict(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0,
               bias=False)
    model = ref["GPT"](cfg)
    optimizer = ref["configure_optimizer"](model, lr=1e-3)
    B, T = 12, 64

    def step():
        x = torch.randint(0, 65, (B, T))
        y = torch.randint(0, 65, (B, T))
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    for _ in range(3):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    seconds = time.perf_counter() - start
    return 1e3 * seconds / args.steps, B * T * args.steps / seconds


def bench_cpp(args):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(args.threads))
    out = subprocess.run([args.train_gpt, "--recipe", "cpu", "--bench", str(args.steps)],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout
    match = re.search(r"([\d.]+) ms/step, (\d+) tokens/s", out)
    if not match:
        raise SystemExit(f"unexpected train_gpt output: {out!r}")
    return float(match.group(1)), float(match.group(2))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sdpa", action="store_true", help="PyTorch's fused attention")
    parser.add_argument("--train-gpt", default=str(ROOT / "build" / "tools" / "train_gpt"))
    args = parser.parse_args()
    torch_ms, torch_tps = bench_torch(args)
    cpp_ms, cpp_tps = bench_cpp(args)
    label = "PyTorch (SDPA)" if args.sdpa else "PyTorch"
    print(f"nanoGPT CPU recipe, B=12 T=64, {args.threads} threads, {args.steps} steps "
          f"(torch {torch.__version__})")
    print(f"{label:15s} {torch_ms:8.1f} ms/step {torch_tps:9.0f} tokens/s")
    print(f"{'train_gpt':15s} {cpp_ms:8.1f} ms/step {cpp_tps:9.0f} tokens/s")
    print(f"train_gpt takes {cpp_ms / torch_ms:.2f}x PyTorch's time per step")


if __name__ == "__main__":
    main()
