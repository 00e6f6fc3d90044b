#!/usr/bin/env python3
"""Where the test suite's time goes: its stages, each build by part, the tests by kind.

    tools/suite_times.py [--stages FILE] [--build DIR]... [--tests DIR]... [--top N]

--stages  a file of "stage<TAB>seconds" lines, each a stage's wall-clock time (./workbook
          test writes .workbook/suite-stages.tsv as it goes).
--build   a build folder: its .ninja_log says how long each compile, link and custom command
          took, summed here by part of the course (compiles run two at a time on two cores,
          so a part's sum is up to twice its share of the wall-clock time).
--tests   a build folder whose last ctest run wrote ctest-junit.xml (./workbook test asks
          ctest for it): each test's time, summed by kind (mutants, solution checks, lessons,
          ...), with the slowest tests.

./workbook test prints this table at its end; run it by hand on any build folder.
"""
import argparse
import collections
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET


def part_of_target(target):
    """The part of the course a build target belongs to."""
    rules = [
        (r"^(attn|attn_startup)$", "course library (attn)"),
        (r"^attn_cuda$", "CUDA library (nvcc)"),
        (r"^(cuda_sim|attn_cuda_sim)$", "CUDA simulator and simulated library"),
        (r"^(attn_mpi|mpi_.*)$", "MPI library and tests"),
        (r"^lesson_\d\d$", "lesson programs"),
        (r"^(checks_\d\d_obj|check_\d\d|check_support.*)$", "checks with the solutions"),
        (r"^check_\d\d_exercise$", "checks with the exercises"),
        (r"^mutant_", "mutants (catalogued mistakes)"),
        (r"^mutation_\d\d$", "mutants generated (one schema per solution)"),
        (r"^library_tests$", "library tests"),
        (r"^serving_tests$", "serving tests"),
        (r"^(cuda_.*|cudasim_.*|attention_bench|half_attention_bench)$", "CUDA tests and benchmarks"),
        (r"^(train_gpt|inspect_attention|.*bench.*)$", "tools (train_gpt, inspector, benchmarks)"),
    ]
    for pattern, part in rules:
        if re.search(pattern, target):
            return part
    return "other: " + target


def part_of_output(path, build=""):
    """The part of the course a .ninja_log output belongs to."""
    if build and path.startswith(build.rstrip("/") + "/"):
        path = path[len(build.rstrip("/")) + 1:]
    m = re.search(r"CMakeFiles/([^/]+)\.dir/", path)
    if m:
        return part_of_target(m.group(1))
    if re.match(r"^(tests/)?[a-z_0-9]+_tests-[0-9a-f]+\.cmake$", path) or re.match(r"^check_\d\d_tests-", path):
        return "doctest's listing of each check program's cases"
    if path.startswith("mutants/"):
        return "mutants (catalogued mistakes)"
    if path.startswith("mutation/"):
        return "mutants generated (one schema per solution)"
    if re.search(r"docs/output/lesson\d\d\.txt$", path):
        return "docs: lesson runs (reused from the tests when current)"
    if path.startswith("docs/"):
        return "docs: pages and Doxygen"
    if path.startswith("CMakeFiles/") or path.endswith(".ninja") or path.startswith("cmake"):
        return "cmake"
    base = os.path.basename(path)
    base = re.sub(r"^lib(.*)\.a$", r"\1", base)
    return part_of_target(base)


def read_ninja_log(build):
    """{output: seconds} of the newest entry of each output in BUILD/.ninja_log."""
    entries = {}
    try:
        with open(os.path.join(build, ".ninja_log")) as f:
            for line in f:
                if line.startswith("#"):
                    continue
                fields = line.rstrip("\n").split("\t")
                if len(fields) < 4:
                    continue
                start, end, path = int(fields[0]), int(fields[1]), fields[3]
                entries[path] = (end - start) / 1000.0
    except OSError:
        return None
    return entries


def table(title, rows, total_label="total", counts=True):
    width = max([len(r[0]) for r in rows] + [len(total_label), 30])
    print(title)
    total = sum(r[2] for r in rows)
    for name, count, seconds in rows:
        share = 100.0 * seconds / total if total > 0 else 0.0
        n = f"{count:>5} " if counts else ""
        print(f"  {name:<{width}} {n}{seconds:>9.1f} s {share:>5.1f}%")
    n = f"{sum(r[1] for r in rows):>5} " if counts else ""
    print(f"  {total_label:<{width}} {n}{total:>9.1f} s")


def build_breakdown(build):
    entries = read_ninja_log(build)
    if entries is None:
        print(f"{build}: no .ninja_log (not built yet)")
        return
    parts = collections.defaultdict(lambda: [0, 0.0])
    seen = set()
    for path, seconds in entries.items():
        # One command with several outputs is logged once per output, absolute or not.
        root = os.path.abspath(build).rstrip("/") + "/"
        key = path[len(root):] if path.startswith(root) else path
        if key in seen:
            continue
        seen.add(key)
        p = parts[part_of_output(path, os.path.abspath(build))]
        p[0] += 1
        p[1] += seconds
    rows = sorted(((k, v[0], v[1]) for k, v in parts.items()), key=lambda r: -r[2])
    table(f"build {os.path.basename(os.path.normpath(build))}: steps and their summed time "
          "(compiles, links, commands)", rows, "all steps")


def test_kind(name, labels):
    if re.match(r"^\d\d mutant ", name):
        return "mutants caught (one program each)"
    if re.match(r"^\d\d solution/", name):
        return "solution checks"
    if "exercise ships failing" in name:
        return "exercises ship failing"
    if re.match(r"^lesson \d\d runs$", name):
        return "lessons, full runs (the docs reuse them)"
    for label, kind in [("mutation", "generated mutants (tools/mutation)"), ("lessons-quick", "lessons --quick"), ("cudasim", "CUDA simulator"),
                        ("mpi", "MPI (mpirun)"), ("browser", "docs and browser"),
                        ("docs", "docs and browser"), ("library", "library tests"),
                        ("serving", "serving (paged cache, scheduler)"),
                        ("tools", "tools and workbook")]:
        if label in labels:
            return kind
    return labels[0] if labels else "other"


def test_breakdown(build, top):
    # ctest-junit.xml, and ctest-junit-<stage>.xml for a stage that ran a label apart
    junits = sorted(os.path.join(build, f) for f in os.listdir(build)
                    if re.match(r"^ctest-junit(-[\w-]+)?\.xml$", f)) if os.path.isdir(build) else []
    if not junits:
        print(f"{build}: no ctest-junit.xml (ctest --output-junit ctest-junit.xml writes it)")
        return
    labels = {}
    try:
        shown = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True,
                               text=True, check=True).stdout
        for t in json.loads(shown).get("tests", []):
            for prop in t.get("properties", []):
                if prop.get("name") == "LABELS":
                    labels[t["name"]] = prop.get("value", [])
    except (OSError, subprocess.CalledProcessError, ValueError):
        pass
    kinds = collections.defaultdict(lambda: [0, 0.0])
    times = []
    cases = [c for junit in junits for c in ET.parse(junit).getroot().iter("testcase")]
    for case in cases:
        name = case.get("name", "")
        seconds = float(case.get("time", "0") or 0)
        k = kinds[test_kind(name, labels.get(name, []))]
        k[0] += 1
        k[1] += seconds
        times.append((seconds, name))
    rows = sorted(((k, v[0], v[1]) for k, v in kinds.items()), key=lambda r: -r[2])
    table(f"tests in {os.path.basename(os.path.normpath(build))}: summed time by kind "
          "(two run at once on two cores)", rows, "all tests")
    if top:
        print(f"  the {top} slowest:")
        for seconds, name in sorted(times, reverse=True)[:top]:
            print(f"    {seconds:8.1f} s  {name[:110]}")


def main():
    ap = argparse.ArgumentParser(description="Where the test suite's time goes.")
    ap.add_argument("--stages")
    ap.add_argument("--build", action="append", default=[])
    ap.add_argument("--tests", action="append", default=[])
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args()
    if args.stages:
        rows = []
        try:
            with open(args.stages) as f:
                for line in f:
                    name, _, seconds = line.rstrip("\n").rpartition("\t")
                    if name:
                        rows.append((name, 1, float(seconds)))
        except OSError:
            print(f"no stage times in {args.stages}")
        if rows:
            table("stages of ./workbook test (wall-clock)", rows, "the whole suite", counts=False)
            print()
    for b in args.build:
        build_breakdown(b)
        print()
    for b in args.tests:
        test_breakdown(b, args.top)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
