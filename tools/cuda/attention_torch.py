#!/usr/bin/env python3
"""Times PyTorch's scaled_dot_product_attention on the shapes of attention_bench.

    python3 tools/cuda/attention_torch.py                 T = 256 ... 4096, hs 64, float32
    python3 tools/cuda/attention_torch.py 1024 4096 --dtype bfloat16

Causal, B*T = 16384 tokens, NH = 2048 / hs heads, as build/tests/attention_bench does, and
the same columns: ms and TFLOP/s for the forward and for forward + backward, and peak
memory. FLOPs: forward 2*B*NH*T^2*hs (the causal half of q k^T and P v), backward 2.5x that.
Peak memory is torch.cuda.max_memory_allocated: q, k, v, out, their gradients and what
the kernel allocates (comparable to the workbench's figure, which counts the same buffers).

In float32 PyTorch cannot use its FlashAttention kernel (16-bit only) and picks the
memory-efficient or the math backend; the enabled backends are printed. Needs PyTorch 2.0 or
newer and a CUDA device: without either it says so and exits with status 2.
"""
import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("T", nargs="*", type=int, default=[256, 512, 1024, 2048, 4096])
    parser.add_argument("--hs", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"attention_torch.py needs PyTorch: {e}")
        return 2
    if not hasattr(F, "scaled_dot_product_attention"):
        print(f"PyTorch {torch.__version__} has no torch.nn.functional.scaled_dot_product_attention "
              "(it arrived in PyTorch 2.0): nothing to time. Run this on the GPU machine's newer PyTorch.")
        return 2
    if not torch.cuda.is_available():
        print("attention_torch.py needs a CUDA device: torch.cuda.is_available() is False")
        return 2

    dtype = getattr(torch, args.dtype)
    device = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name(0)}, PyTorch {torch.__version__}")
    print(f"causal attention, {args.dtype}, hs {args.hs}, B*T = 16384, NH = {2048 // args.hs}; "
          f"{args.repeats} timed runs after {args.warmup} warm-up\n")
    print(f"{'T':>6} {'B':>4} {'NH':>4}  {'method':<6} {'fwd ms':>10} {'TFLOP/s':>10} "
          f"{'fwd+bwd ms':>12} {'TFLOP/s':>10} {'peak MiB':>11}")

    def time_ms(fn):
        for _ in range(args.warmup):
            fn()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.repeats):
            fn()
        stop.record()
        torch.cuda.synchronize()
        return start.elapsed_time(stop) / args.repeats

    for T in args.T:
        B, NH, hs = max(1, 16384 // T), 2048 // args.hs, args.hs
        gen = torch.Generator(device=device).manual_seed(T)
        q, k, v = (torch.randn(B, NH, T, hs, device=device, dtype=dtype, generator=gen)
                   .requires_grad_() for _ in range(3))
        dout = torch.randn(B, NH, T, hs, device=device, dtype=dtype, generator=gen)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()

        def fwd():
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True)

        def fwdbwd():
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            q.grad = k.grad = v.grad = None
            out.backward(dout)

        f = time_ms(fwd)
        fb = time_ms(fwdbwd)
        peak = torch.cuda.max_memory_allocated() / 2**20
        flops = 2.0 * B * NH * T * T * hs
        print(f"{T:>6} {B:>4} {NH:>4}  {'sdpa':<6} {f:>10.3f} {flops / (f * 1e-3) / 1e12:>10.2f} "
              f"{fb:>12.3f} {3.5 * flops / (fb * 1e-3) / 1e12:>10.2f} {peak:>11.1f}")
        del q, k, v, dout
        torch.cuda.empty_cache()

    try:
        from torch.backends.cuda import flash_sdp_enabled, mem_efficient_sdp_enabled
        print(f"\nbackends enabled: flash {flash_sdp_enabled()}, memory-efficient "
              f"{mem_efficient_sdp_enabled()} (flash needs float16/bfloat16; float32 uses another)")
    except ImportError:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
