#!/usr/bin/python3
"""Writes the reference fixtures for the course library's tests (tests/fixtures/library).

Run with Debian's python3 (python3-numpy and python3-torch):

    /usr/bin/python3 tools/reference/make_library_fixtures.py

The fixtures are committed, so the tests never need PyTorch. The values come from NumPy
and PyTorch, never from the course's own code.
"""
import json
import pathlib

import numpy as np
import torch

out = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "library"
out.mkdir(parents=True, exist_ok=True)

# .npy files of every dtype the reader accepts, and some it must reject.
np.save(out / "f4_2x3.npy", np.arange(6, dtype=np.float32).reshape(2, 3) / 4)
np.save(out / "f8_3.npy", np.array([0.5, -1.25, 3.0], dtype=np.float64))
np.save(out / "b1_2x2.npy", np.array([[True, False], [False, True]]))
np.save(out / "i8_4.npy", np.array([3, 1, 4, 1], dtype=np.int64))
np.save(out / "f4_scalar.npy", np.float32(2.5))
np.save(out / "fortran.npy", np.asfortranarray(np.ones((2, 3), dtype=np.float32)))
np.save(out / "complex.npy", np.ones(2, dtype=np.complex64))
data = (out / "f4_2x3.npy").read_bytes()
(out / "truncated.npy").write_bytes(data[:-5])
(out / "not_npy.npy").write_bytes(b"this is not a numpy file\n")

# nn.Linear against its functional definition, with and without bias.
torch.manual_seed(0)
for bias in (True, False):
    layer = torch.nn.Linear(5, 3, bias=bias)
    x = torch.randn(2, 4, 5)
    y = layer(x).detach()
    tag = "linear_bias" if bias else "linear_nobias"
    np.save(out / f"{tag}_weight.npy", layer.weight.detach().numpy())
    if bias:
        np.save(out / f"{tag}_bias.npy", layer.bias.detach().numpy())
    np.save(out / f"{tag}_x.npy", x.numpy())
    np.save(out / f"{tag}_y.npy", y.numpy())

(out / "versions.json").write_text(
    json.dumps({"numpy": np.__version__, "torch": torch.__version__}, indent=2) + "\n")
print(f"wrote {out}")
