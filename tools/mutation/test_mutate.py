#!/usr/bin/env python3
"""The mutation tool's own test: each generated mutant, switched on in the schema, behaves
exactly as the same mutant written out as a plain edit of the solution and built on its own.

    test_mutate.py [--clang clang++] [--cxx g++] [--jobs N]

On testdata/sample.cpp (a small solution with one of each construct the operators rewrite):
  1. every operator of mutate.py makes at least one mutant of it;
  2. the schema with no mutant active prints what the solution prints;
  3. for every mutant, the schema with it active (ATTN_MUTANT=N) and the plain mutant (the
     solution with that one edit, as a learner would have written it) print the same lines
     and end the same way (exit status, or a sanitizer's report of the same kind), when
     driver.cpp calls every function on inputs chosen to tell mutants apart;
  4. every mutant changes what some call prints, but for the three that EQUIVALENT lists
     (there the sample's own checks make the mutant's change unobservable).
Both builds use AddressSanitizer and UBSan, so a mutant that reads out of bounds stops both
at the same call rather than printing whatever memory held.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "testdata"
OPERATORS = ["boundary", "arithmetic", "constant", "NaN-blind check", "check removed", "statement deleted",
             "loop bound", "arguments swapped", "narrowed to float", "narrowed to 32 bits"]


# Mutants of the sample that no input can tell from it, as equivalent.txt lists an exercise's.
EQUIVALENT = {
    "part_of: check removed: ranks < 1 → false": "no rank r has 0 ≤ r < ranks when ranks < 1: the next check refuses",
    "part_of: constant: ranks < 1 → ranks < 0": "the same: ranks = 0 leaves no rank to ask for",
    "part_of: narrowed to 32 bits: const std::size_t extra → int extra": "n % ranks < ranks, an int",
}


def run(cmd, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        sys.exit(f"test_mutate.py: {' '.join(map(str, cmd))} failed:\n{p.stdout}{p.stderr}")
    return p


def execute(program, mutant=None):
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0", UBSAN_OPTIONS="print_stacktrace=0")
    if mutant is not None:
        env["ATTN_MUTANT"] = str(mutant)
    try:
        p = subprocess.run([program], capture_output=True, text=True, env=env, timeout=20)
    except subprocess.TimeoutExpired as e:
        return ("timeout", (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""))
    how = "exit %d" % p.returncode
    if "AddressSanitizer" in p.stderr:
        how = "asan " + p.stderr.split("AddressSanitizer: ", 1)[1].split()[0]
    elif "runtime error" in p.stderr:
        how = "ubsan"
    return (how, p.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clang", default=os.environ.get("ATTN_CLANG", "clang++"))
    ap.add_argument("--cxx", default=os.environ.get("CXX", "g++"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    flags = ["-std=c++17", "-O1", "-g0", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
             "-w", f"-I{DATA}"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        run([sys.executable, HERE / "mutate.py", "generate", DATA / "sample.cpp", "--flags", f"-I{DATA} -std=c++17",
             "--clang", args.clang, "--shown", "sample.cpp", "--out-source", tmp / "schema.cpp",
             "--out-manifest", tmp / "manifest.json", "--plain-dir", tmp / "plain", "--quiet"])
        manifest = json.loads((tmp / "manifest.json").read_text())["mutants"]
        seen = {m["operator"] for m in manifest}
        missing = [op for op in OPERATORS if op not in seen]
        if missing:
            sys.exit(f"test_mutate.py: no mutant of sample.cpp by: {', '.join(missing)}")
        run([args.cxx, *flags, "-c", DATA / "driver.cpp", "-o", tmp / "driver.o"])
        run([args.cxx, *flags, DATA / "sample.cpp", tmp / "driver.o", "-o", tmp / "original"])
        run([args.cxx, *flags, "-include", HERE / "schemata.hpp", tmp / "schema.cpp", tmp / "driver.o",
             "-o", tmp / "schema"])
        original = execute(tmp / "original")
        if original[0] != "exit 0":
            sys.exit(f"test_mutate.py: the sample itself fails: {original}")
        if execute(tmp / "schema", 0) != original:
            sys.exit("test_mutate.py: the schema with no mutant active does not print what the solution prints")

        def one(m):
            src = tmp / "plain" / f"{m['id']}.cpp"
            exe = tmp / "plain" / f"{m['id']}"
            p = subprocess.run([args.cxx, *flags, src, tmp / "driver.o", "-o", exe], capture_output=True, text=True)
            if p.returncode != 0:
                return m, "the plain mutant does not compile:\n" + p.stderr[-1500:]
            plain = execute(exe)
            schema = execute(tmp / "schema", m["id"])
            if plain != schema:
                pl, sl = plain[1].splitlines(), schema[1].splitlines()
                diff = next((f"line {i + 1}: plain {a!r}, schema {b!r}" for i, (a, b) in enumerate(zip(pl, sl))
                             if a != b), f"plain ended {plain[0]} after {len(pl)} lines, "
                                         f"schema {schema[0]} after {len(sl)}")
                return m, "the schema and the plain mutant differ: " + diff
            if plain == original and m["name"] not in EQUIVALENT:
                return m, "the mutant changes nothing the driver prints"
            if plain != original and m["name"] in EQUIVALENT:
                return m, "listed as equivalent, but it changes what the driver prints"
            return m, None

        failures = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for m, why in pool.map(one, manifest):
                if why:
                    failures.append(f"mutant {m['id']} ({m['name']}): {why}")
        by_op = {op: sum(1 for m in manifest if m["operator"] == op) for op in OPERATORS}
        print(f"{len(manifest)} mutants of sample.cpp: " + ", ".join(f"{op} {n}" for op, n in by_op.items()))
        if failures:
            print("\n".join(failures))
            return 1
        print("each one behaves in the schema as the plain mutant does, and each changes what the driver prints")
        return 0


if __name__ == "__main__":
    sys.exit(main())
