#!/usr/bin/python3
"""Compares the gradients train_gpt wrote with --dump-grads against PyTorch's autograd.

Run with Debian's python3 (python3-numpy and python3-torch):

    build/tools/train_gpt --dump-grads grads [--init WEIGHTS_DIR]
    /usr/bin/python3 tools/reference/compare_grads.py grads

It loads grads/weights into the nanoGPT model written out in make_gpt_fixtures.py, runs the
batch grads/x.npy, grads/y.npy forward and backward in float32, and prints, for the loss and
for every parameter, the largest absolute difference from the course's numbers. Exit status
1 if any exceeds --tolerance (default 1e-5: float32 sums taken in another order differ by
about 1e-6 on gradients of size up to 1).
"""
import argparse
import ast
import json
import pathlib
import sys

import numpy as np
import torch

HERE = pathlib.Path(__file__).resolve().parent


def reference_model_code():
    """The classes and functions of make_gpt_fixtures.py, without its fixture-writing code."""
    path = HERE / "make_gpt_fixtures.py"
    tree = ast.parse(path.read_text())
    keep = (ast.Import, ast.ImportFrom, ast.ClassDef, ast.FunctionDef)
    tree.body = [node for node in tree.body if isinstance(node, keep)]
    namespace = {}
    exec(compile(tree, str(path), "exec"), namespace)
    return namespace


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump", type=pathlib.Path, help="the folder --dump-grads wrote")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()
    config = json.loads((args.dump / "weights" / "config.json").read_text())
    if not config.get("causal", True):
        sys.exit("the dump is of a model without the causal mask; the reference model has one")
    cfg = {k: config[k] for k in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd", "bias")}
    cfg["dropout"] = 0.0
    model = reference_model_code()["GPT"](cfg)
    state = {name: torch.from_numpy(np.load(args.dump / "weights" / (name + ".npy")))
             for name in model.state_dict()}
    model.load_state_dict(state)
    model.eval()
    x = torch.from_numpy(np.load(args.dump / "x.npy")).long()
    y = torch.from_numpy(np.load(args.dump / "y.npy")).long()
    _, loss = model(x, y)
    loss.backward()
    worst = abs(loss.item() - float(np.load(args.dump / "loss.npy")[0]))
    print(f"{'loss':45s} |difference| {worst:.2e}")
    for name, p in model.named_parameters():
        ours = np.load(args.dump / "grad" / (name + ".npy"))
        diff = float(np.max(np.abs(p.grad.numpy() - ours)))
        print(f"{name:45s} max |difference| {diff:.2e}   (largest gradient {np.max(np.abs(ours)):.2e})")
        worst = max(worst, diff)
    ok = worst <= args.tolerance
    print(f"largest difference {worst:.2e}: {'within' if ok else 'ABOVE'} {args.tolerance:g}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
