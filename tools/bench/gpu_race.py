#!/usr/bin/env python3
"""The race: one training step of the same GPT, config and batch, in PyTorch and in ours.

PyTorch is configured as fast as it honestly goes on one GPU: nanoGPT's model written out
below, bf16 autocast, torch.compile, fused causal SDPA (flash attention), fused AdamW, TF32
matmuls allowed, data already on the device. Ours is tools/cuda/gpu_train_bench from the
build folder. Both print ms/iter, tokens/s and MFU; the script prints the ratio.

FLOPs per token (nanoGPT's estimate_mfu): 6·N + 12·L·NH·hs·T, with N the parameter count
without the position embedding: 6·N for the matmuls' forward and backward, the second
term for the attention scores and the weighted sum. MFU divides by the GPU's dense bf16
peak: H100 SXM ~989.5 TFLOP/s (the H200 is the same chip with more memory), set with
--peak-tflops for another GPU.

Usage (on a machine with a CUDA GPU, after building with nvcc):
    python3 tools/bench/gpu_race.py [--build build] [--batch 64] [--steps 50] [--tf32]
"""
import argparse
import math
import os
import re
import subprocess
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build", help="CMake build folder holding tools/cuda/gpu_train_bench")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--block", type=int, default=256)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--embd", type=int, default=384)
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--peak-tflops", type=float, default=989.5)
    p.add_argument("--tf32", action="store_true", help="run ours with TF32 matmuls")
    p.add_argument("--attention", choices=["materialised", "fused"], default="materialised",
                   help="ours: the materialised attention or lesson 13's fused kernels")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (for debugging)")
    return p.parse_args()


def flops_per_token(n_params_no_wpe, layers, heads, embd, block):
    return 6 * n_params_no_wpe + 12 * layers * heads * (embd // heads) * block


def run_pytorch(a):
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError:
        sys.exit("gpu_race: PyTorch is not installed (python3 -m pip install torch, or apt install python3-torch)")
    if not torch.cuda.is_available():
        sys.exit("gpu_race: no CUDA device visible to PyTorch: the race needs a GPU")
    major, minor = (int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    if (major, minor) < (2, 0):
        sys.exit(f"gpu_race: PyTorch {torch.__version__} is too old: torch.compile and "
                 "scaled_dot_product_attention need 2.0 or newer")

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            C = a.embd
            self.ln_1 = nn.LayerNorm(C)
            self.c_attn = nn.Linear(C, 3 * C)
            self.attn_proj = nn.Linear(C, C)
            self.ln_2 = nn.LayerNorm(C)
            self.c_fc = nn.Linear(C, 4 * C)
            self.mlp_proj = nn.Linear(4 * C, C)
            self.drop = nn.Dropout(a.dropout)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, a.heads, C // a.heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=a.dropout if self.training else 0.0,
                                               is_causal=True)
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.drop(self.attn_proj(y))
            x = x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)))))
            return x

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.embd)
            self.wpe = nn.Embedding(a.block, a.embd)
            self.drop = nn.Dropout(a.dropout)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.embd)
            self.lm_head = nn.Linear(a.embd, a.vocab, bias=False)
            self.wte.weight = self.lm_head.weight  # tied, as nanoGPT
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * a.layers) if name.endswith("proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif name.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.drop(self.wte(idx) + self.wpe(pos))
            for block in self.h:
                x = block(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = "cuda"
    model = GPT().to(dev)
    n_params = sum(p.numel() for p in model.parameters()) - model.wpe.weight.numel()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.99), fused=True)
    if not a.no_compile:
        model = torch.compile(model)
    g = torch.Generator(device="cpu").manual_seed(42)
    x = torch.randint(0, a.vocab, (a.batch, a.block), generator=g).to(dev)
    y = torch.randint(0, a.vocab, (a.batch, a.block), generator=g).to(dev)

    def step():
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):  # includes torch.compile's compilation
        step()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(a.steps):
        loss = step()
    stop.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(stop) / a.steps
    tokens = a.batch * a.block / (ms / 1e3)
    fpt = flops_per_token(n_params, a.layers, a.heads, a.embd, a.block)
    mfu = fpt * tokens / (a.peak_tflops * 1e12)
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, loss {loss.item():.4f}")
    print(f"pytorch: {ms:.2f} ms/iter, {tokens:.0f} tokens/s, MFU {100 * mfu:.2f}%")
    return ms


def run_ours(a):
    exe = os.path.join(a.build, "tools", "cuda", "gpu_train_bench")
    if not os.path.exists(exe):
        sys.exit(f"gpu_race: {exe} not found: build with nvcc first (cmake --preset default && "
                 "cmake --build build --target gpu_train_bench)")
    cmd = [exe, "--batch", str(a.batch), "--block", str(a.block), "--layers", str(a.layers),
           "--heads", str(a.heads), "--embd", str(a.embd), "--vocab", str(a.vocab),
           "--dropout", str(a.dropout), "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--peak-tflops", str(a.peak_tflops), "--attention", a.attention] + (
               ["--tf32"] if a.tf32 else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    sys.stdout.write(out.stdout)
    if out.returncode != 0:
        sys.exit(f"gpu_race: {exe} failed: {out.stderr.strip() or out.stdout.strip()}")
    m = re.search(r"ours: ([0-9.]+) ms/iter", out.stdout)
    if not m:
        sys.exit("gpu_race: could not read ms/iter from gpu_train_bench's output")
    return float(m.group(1))


def main():
    a = parse_args()
    print(f"config: B={a.batch} T={a.block} L={a.layers} NH={a.heads} C={a.embd} V={a.vocab} "
          f"dropout={a.dropout}, {a.steps} timed steps after {a.warmup} warm-up steps")
    t0 = time.time()
    torch_ms = run_pytorch(a)
    ours_ms = run_ours(a)
    print(f"ratio: ours takes {ours_ms / torch_ms:.2f}x PyTorch's time per step "
          f"({'faster' if ours_ms < torch_ms else 'slower'}); total wall time {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
