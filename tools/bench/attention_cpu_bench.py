#!/usr/bin/python3
"""Times attention alone on the CPU: the library's tiled and plain versions and PyTorch's plain one.

Three programs on the same problems, B = 1 and 4 heads of size hs, causal or not:

- ours tiled: attn::attention_fast_forward/backward (tiles as OpenBLAS sgemm calls, online
  softmax, no (T, T) matrix), through build/tools/bench/bench_attention_cpu;
- ours plain: attn::attention_plain_forward/backward, the scalar reference of lesson 13;
- PyTorch plain: nanoGPT's attention, (q @ kᵀ)·scale, masked_fill, softmax, @ v, in torch
  (forward under no_grad; forward + backward by autograd).

Both programs use the same number of threads (torch.set_num_threads(N), --threads N). With
N > 1 PyTorch is timed in three configurations that use N cores, (torch threads, OpenBLAS
threads) = (N, N), (N, 1) and (1, N), and in each round the fastest counts: on a small
machine its thread pools can get in each other's way (one T = 256 problem took 0.7 ms in
one configuration and 8 to 16 ms in another), and the comparison should be with PyTorch at
its best. Rounds alternate between the programs, so that load from other
processes falls on all of them; the table shows the median over rounds of each one's ms
and of the per-round ratios. GFLOP/s count the unmasked work only: 2·hs FLOPs per visible
(query, key) pair per product, two products forward, six forward + backward (S, P·V; dV,
dP, dQ, dK), whatever each program recomputes. Each time is given twice: wall clock, and
the CPU time of the process (all threads; on a machine busy with other work, the better
measure of one thread's cost). Peak memory is the resident set the pass
added on top of its inputs (the kernel's high-water mark, reset after the inputs are made).

Then the GPT's training step with either attention, the same model and batch, through
build/tools/bench/bench_train_cpu --fused 0|1 (median step over --train-steps steps, rounds
alternating): the CPU recipe's shape (block 64, 4 layers, 4 heads, 128 channels, batch 12)
and the GPU recipe's (block 256, 6 layers, 6 heads, 384 channels) with batch 4.
--no-train skips it.

    /usr/bin/python3 tools/bench/attention_cpu_bench.py --threads 1 --rounds 3

Build bench_attention_cpu and bench_train_cpu first (cmake --build build --target
bench_attention_cpu bench_train_cpu). Use
Debian's /usr/bin/python3 with python3-torch.
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
from torch.nn import functional as F


def openblas():
    try:
        return ctypes.CDLL("libopenblas.so.0")
    except OSError:
        return None


OPENBLAS = openblas()


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


LIBC = ctypes.CDLL(None)


def reset_peak():
    # glibc keeps freed blocks resident for reuse, so that a problem after a larger one
    # would add nothing to the resident set: malloc_trim gives their pages back first.
    LIBC.malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def visible_pairs(T, causal):
    return T * (T + 1) // 2 if causal else T * T


def flops(problem):
    T, hs, causal, passes = problem["T"], problem["hs"], problem["causal"], problem["pass"]
    products = 2 if passes == "forward" else 6
    return products * 2.0 * hs * visible_pairs(T, causal) * problem["heads"]


def torch_inputs(problem):
    g = torch.Generator().manual_seed(7)
    shape = (1, problem["heads"], problem["T"], problem["hs"])
    q, k, v, dout = (torch.randn(shape, generator=g) for _ in range(4))
    mask = torch.tril(torch.ones(problem["T"], problem["T"], dtype=torch.bool))
    return q, k, v, dout, mask


def torch_attention(q, k, v, mask, causal):
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if causal:
        att = att.masked_fill(mask == 0, float("-inf"))
    att = F.softmax(att, dim=-1)
    return att @ v


def time_torch(problem, threads, blas_threads, reps):
    """Median wall ms, median CPU ms and peak MiB added, with the given threads."""
    torch.set_num_threads(threads)
    if OPENBLAS is not None:
        OPENBLAS.openblas_set_num_threads(blas_threads)
    q, k, v, dout, mask = torch_inputs(problem)
    causal = problem["causal"]

    def run():
        if problem["pass"] == "forward":
            with torch.no_grad():
                torch_attention(q, k, v, mask, causal)
        else:
            qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
            torch_attention(qq, kk, vv, mask, causal).backward(dout)

    base = status_kib("VmRSS")
    reset_peak()
    run()  # warm-up
    times, cpu = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    peak = (status_kib("VmHWM") - base) / 1024.0
    return statistics.median(times), statistics.median(cpu), peak


def settled(timer, *args):
    """timer(*args) after a pause: idle threads of the program timed before (PyTorch's and
    OpenBLAS's pools in this process) spin for up to about 0.1 s before they sleep, and on a
    machine with few cores they would take the next program's cores (measured: 0.5 ms
    problems taking 8 ms, ours and PyTorch's alike)."""
    time.sleep(0.3)
    return timer(*args)


def time_ours(exe, impl, problem, threads, reps):
    cmd = [exe, "--impl", impl, "--pass", "forward" if problem["pass"] == "forward" else "backward",
           "--heads", str(problem["heads"]), "--T", str(problem["T"]), "--hs", str(problem["hs"]),
           "--causal", "1" if problem["causal"] else "0", "--threads", str(threads),
           "--reps", str(reps), "--warmup", "1"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    return out["ms"], out["cpu_ms"], out["peak_extra_mib"]


# The training steps timed with either attention: (name, bench_train_cpu's model flags)
TRAIN_SHAPES = [
    ("CPU recipe (block 64)", ["--n_layer", "4", "--n_head", "4", "--n_embd", "128",
                               "--block_size", "64", "--batch_size", "12"]),
    ("GPU recipe's shape (block 256), batch 4",
     ["--n_layer", "6", "--n_head", "6", "--n_embd", "384", "--block_size", "256",
      "--batch_size", "4"]),
]


def time_train_step(exe, flags, fused, threads, steps):
    cmd = [exe, *flags, "--vocab_size", "65", "--bias", "0", "--fused", "1" if fused else "0",
           "--threads", str(threads), "--steps", str(steps), "--warmup", "2"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def train_steps(args):
    """The GPT's training step with the materialised and the fused attention, alternating."""
    print(f"\nThe GPT's training step, materialised against fused attention: median ms per step "
          f"over {args.train_steps} steps, median of {args.rounds} alternating rounds, "
          f"{args.threads} thread(s)\n")
    print("| model | materialised ms | fused ms | materialised / fused | forward ms m / f | "
          "backward ms m / f |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = []
    for name, flags in TRAIN_SHAPES:
        runs = {False: [], True: []}
        for _ in range(args.rounds):
            for fused in (False, True):
                runs[fused].append(time_train_step(args.train_exe, flags, fused, args.threads,
                                                   args.train_steps))
        med = {f: {k: statistics.median(r[k] for r in runs[f])
                   for k in ("ms_per_step", "forward_ms", "backward_ms")} for f in runs}
        ratio = statistics.median(a["ms_per_step"] / b["ms_per_step"]
                                  for a, b in zip(runs[False], runs[True]))
        print(f"| {name} | {med[False]['ms_per_step']:.1f} | {med[True]['ms_per_step']:.1f} | "
              f"{ratio:.2f}x | {med[False]['forward_ms']:.1f} / {med[True]['forward_ms']:.1f} | "
              f"{med[False]['backward_ms']:.1f} / {med[True]['backward_ms']:.1f} |", flush=True)
        rows.append({"model": name, "flags": flags, "median": {str(f): m for f, m in med.items()},
                     "ratio": ratio})
    return rows


def sgemm_rate(exe, shape):
    cmd = [exe, "--sgemm", shape, "--threads", "1", "--reps", "5"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)["gflops"]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    default_exe = os.path.join(here, "..", "..", "build", "tools", "bench", "bench_attention_cpu")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per problem")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--T", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    p.add_argument("--hs", type=int, nargs="+", default=[64, 128])
    p.add_argument("--max-backward", type=int, default=4096,
                   help="largest T timed forward + backward (and with hs > 64)")
    p.add_argument("--max-plain", type=int, default=1024,
                   help="largest T for ours plain (scalar loops: slow)")
    p.add_argument("--max-torch", type=int, default=4096,
                   help="largest T for PyTorch (3 (T, T) tensors per head at once)")
    p.add_argument("--exe", default=os.path.normpath(default_exe))
    p.add_argument("--json", help="also write every round's numbers to this file")
    p.add_argument("--no-train", action="store_true", help="skip the training steps")
    p.add_argument("--train-steps", type=int, default=10, help="timed training steps per run")
    p.add_argument("--train-exe", default=os.path.normpath(
        os.path.join(os.path.dirname(default_exe), "bench_train_cpu")))
    p.add_argument("--only-train", action="store_true", help="time the training steps only")
    args = p.parse_args()
    for exe, needed in ((args.exe, not args.only_train), (args.train_exe, not args.no_train)):
        if needed and not os.path.exists(exe):
            sys.exit(f"attention_cpu_bench: {exe} not found; build the bench_attention_cpu and "
                     "bench_train_cpu targets first or pass --exe / --train-exe")
    if args.only_train:
        print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
              f"load average {os.getloadavg()[0]:.2f}")
        train = train_steps(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"train": train}, f, indent=1)
        return

    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch "
          f"{torch.__version__}; B 1, {args.heads} heads, {args.threads} thread(s), "
          f"{args.rounds} rounds; load average {os.getloadavg()[0]:.2f}", flush=True)
    rates = {s: sgemm_rate(args.exe, s) for s in ("64x128x64", "64x128x128", "1024x1024x1024")}
    print("# single-thread sgemm C = A·Bᵀ (M x N x K): " +
          ", ".join(f"{s} {r:.1f} GFLOP/s" for s, r in rates.items()), flush=True)

    # torch loads code and starts its thread pools on first use: not the problems' memory
    for passes in ("forward", "backward"):
        time_torch({"pass": passes, "hs": 64, "causal": True, "T": 64, "heads": 1},
                   args.threads, 1, 1)
    problems = []
    for passes in ("forward", "backward"):
        for hs in args.hs:
            for causal in (True, False):
                for T in sorted(args.T):  # growing: each needs memory that none before did
                    if (passes == "backward" or hs > 64) and T > args.max_backward:
                        continue
                    problems.append({"pass": passes, "hs": hs, "causal": causal, "T": T,
                                     "heads": args.heads})
    record, rows = [], []
    for prob in problems:
        T = prob["T"]
        # repetitions per timing (their median): many for the short problems, where one
        # stall of a few ms (a vCPU descheduled by the host) would otherwise set the time
        reps = 15 if T <= 512 else 3 if T <= 1024 else 1
        programs = ["tiled"] + (["plain"] if T <= args.max_plain else []) + \
                   (["torch"] if T <= args.max_torch else [])
        ms = {name: [] for name in programs}
        cpu = {name: [] for name in programs}
        peak = {}
        for r in range(args.rounds):
            for name in programs:
                if name == "torch":
                    configs = [(args.threads, args.threads)]
                    if args.threads > 1 and OPENBLAS is not None:
                        configs += [(args.threads, 1), (1, args.threads)]
                    t, c, mib = min(settled(time_torch, prob, n, b, reps) for n, b in configs)
                else:
                    t, c, mib = settled(time_ours, args.exe, name, prob, args.threads, reps)
                ms[name].append(t)
                cpu[name].append(c)
                peak[name] = max(peak.get(name, 0.0), mib)
            record.append({**prob, "round": r, "ms": {n: ms[n][-1] for n in programs},
                           "cpu_ms": {n: cpu[n][-1] for n in programs}})
        med = {n: statistics.median(v) for n, v in ms.items()}
        cpu_med = {n: statistics.median(v) for n, v in cpu.items()}
        ratio = {n: statistics.median([a / b for a, b in zip(ms[n], ms["tiled"])])
                 for n in programs if n != "tiled"}
        cpu_ratio = {n: statistics.median([a / b for a, b in zip(cpu[n], cpu["tiled"])])
                     for n in programs if n != "tiled"}
        row = {**prob, "ms": med, "cpu_ms": cpu_med, "ratio": ratio, "cpu_ratio": cpu_ratio,
               "peak_mib": peak, "gflops": {n: flops(prob) / (m * 1e6) for n, m in med.items()},
               "cpu_gflops": {n: flops(prob) / (m * 1e6) for n, m in cpu_med.items()}}
        rows.append(row)
        print(f"# {prob['pass']:8s} hs {prob['hs']:3d} {'causal' if prob['causal'] else 'full  '} "
              f"T {T:5d}: " + ", ".join(f"{n} {med[n]:.2f} ms (CPU {cpu_med[n]:.2f})"
                                        for n in programs) +
              f"; load {os.getloadavg()[0]:.1f}", flush=True)

    def cell(row, name, fmt):
        return fmt(row) if name in row["ms"] else "–"

    for clock, key in (("wall-clock", "ms"), ("CPU", "cpu_ms")):
        ratio_key = "ratio" if key == "ms" else "cpu_ratio"
        gflops_key = "gflops" if key == "ms" else "cpu_gflops"
        print()
        print(f"{clock} time, median over {args.rounds} rounds; ratios: median of the rounds'")
        print()
        print("| pass | hs | mask | T | tiled ms | tiled GFLOP/s | plain ms | PyTorch ms | "
              "PyTorch GFLOP/s | PyTorch / tiled | plain / tiled | "
              "peak MiB tiled / plain / PyTorch |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for row in rows:
            peaks = " / ".join(f"{row['peak_mib'][n]:.1f}" if n in row["peak_mib"] else "–"
                               for n in ("tiled", "plain", "torch"))
            print(f"| {'fwd' if row['pass'] == 'forward' else 'fwd+bwd'} | {row['hs']} | "
                  f"{'causal' if row['causal'] else 'none'} | {row['T']} | "
                  f"{row[key]['tiled']:.2f} | {row[gflops_key]['tiled']:.1f} | "
                  + cell(row, "plain", lambda r: f"{r[key]['plain']:.1f}") + " | "
                  + cell(row, "torch", lambda r: f"{r[key]['torch']:.2f}") + " | "
                  + cell(row, "torch", lambda r: f"{r[gflops_key]['torch']:.1f}") + " | "
                  + cell(row, "torch", lambda r: f"{r[ratio_key]['torch']:.2f}x") + " | "
                  + cell(row, "plain", lambda r: f"{r[ratio_key]['plain']:.1f}x") +
                  f" | {peaks} |")
    train = [] if args.no_train else train_steps(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sgemm_gflops": rates, "rows": rows, "rounds": record, "train": train},
                      f, indent=1)


if __name__ == "__main__":
    main()
