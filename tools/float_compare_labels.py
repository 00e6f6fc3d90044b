#!/usr/bin/env python3
"""Every test case and test script that compares floats is run by a test labelled float-compare.

    tools/float_compare_labels.py BUILD_DIR [--list]

The label float-compare (cmake/float_compare.cmake) marks the tests that
tools/blas_kernel_sweep.sh runs once more under a second OpenBLAS kernel. Here each piece of
test code is read, and a piece that compares floats must be run by at least one labelled test:

  - a doctest case (TEST_CASE in tests/ or checks/) whose body compares floats: a labelled
    test runs it alone (the discovered `prefix/<case>` tests) or runs its whole program;
  - a program of tests/ without doctest cases (an MPI test's main): a labelled test runs it;
  - a test script (tools/test_*.sh, tools/*.py, tests/**/*.sh) that compares floats: it is
    the command, or an argument, of a labelled test.

A body "compares floats" when it calls one of the comparison helpers (CHECK_CLOSE,
doctest::Approx, relative_gap, compare_steps, ...) or compares a value with a tolerance
written in scientific notation (`<= 1e-5`) or named as one (`< tol`, `<= bound`).

Which program a test runs comes from ctest (its command and arguments), and which sources a
program holds from the build's build.ninja (the objects each executable links, an OBJECT
library's included, and the source each object is compiled from). Exits 1, naming
each piece and where it compares, when one is run by no labelled test; and when a doctest
case of a program that ctest runs case by case is run by no test at all (a ';' in its name
splits it in two for CMake, and the test that should run it runs nothing and passes).
"""
import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

HELPERS = (r"CHECK_CLOSE|REQUIRE_CLOSE|check::compare|Approx\b|relative_gap|compare_steps|compare_resumed|"
           r"check_steps|check_resumed|compare_step\b|"
           r"\bdifference\(|max_abs_diff|max_relative|check_against_torch|largest_step_gap|"
           r"check_gradient_numerically|finite_difference|check_resume|isclose|allclose")
TOLERANCE = r"(<=?|>=?)\s*\(?\s*-?[0-9.]+[eE]-[0-9]+|(<=?|>=?)\s*\w*(tol|tolerance|bound|eps|rtol|atol)\w*\b"
FLOATS = re.compile(f"({HELPERS})|({TOLERANCE})")


def strip_comments(text, script=False):
    if script:
        # Comments, and double-quoted strings (messages, and text a script feeds a program):
        # a comparison a script makes is code, or an awk program in single quotes.
        text = re.sub(r'"""(?:.|\n)*?"""', '""', text)  # Python's docstrings
        text = re.sub(r"(?m)^\s*#.*$", "", text)
        return re.sub(r'"(?:[^"\\\n]|\\.)*"', '""', text)
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def first_comparison(text):
    """(line number, line) of the first float comparison in text, or None."""
    m = FLOATS.search(text)
    if not m:
        return None
    line = text.count("\n", 0, m.start()) + 1
    return line, text.splitlines()[line - 1].strip()


def test_cases(path):
    """[(name, first line, body)] of the doctest cases in a source file."""
    text = strip_comments(path.read_text(errors="replace"))
    cases = []
    for m in re.finditer(r'\bTEST_CASE\s*\(\s*((?:"(?:[^"\\]|\\.)*"\s*)+)', text):
        start = text.find("{", m.end())
        if start < 0:
            continue
        depth, i = 0, start
        while i < len(text):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        literal = "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(1)))  # adjacent literals join
        name = re.sub(r"\\(.)", r"\1", literal)
        cases.append((name, text.count("\n", 0, m.start()) + 1, text[start:i + 1]))
    return cases


def program_sources(build):
    """{executable path: [source files]} from build.ninja: each executable's link edge lists
    its objects (an OBJECT library's too), each object's compile edge its source."""
    ninja = (build / "build.ninja").read_text(errors="replace")
    objects = {}
    for m in re.finditer(r"(?m)^build ([^:\n]+\.o): CXX_COMPILER\S* (\S+)", ninja):
        objects[str((build / m.group(1).strip()).resolve())] = str((build / m.group(2)).resolve())
    programs = {}
    for m in re.finditer(r"(?m)^build ([^\n]+?): CXX_EXECUTABLE_LINKER\S* ([^\n|]*)", ninja):
        exe = m.group(1).split("|")[0].split()[0]
        srcs = [objects[o] for o in (str((build / x).resolve()) for x in m.group(2).split()) if o in objects]
        programs[str((build / exe).resolve())] = srcs
    return programs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build")
    ap.add_argument("--list", action="store_true", help="print each piece that compares floats and its tests")
    args = ap.parse_args()
    build = Path(args.build).resolve()
    source_dir = Path(__file__).resolve().parent.parent
    shown = json.loads(subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True, text=True,
                                      check=True).stdout)
    programs = program_sources(build)
    # Each test: its labels, the programs it runs (alone or whole) and the scripts it names.
    runs_case = {}     # (source file, case name) -> [test names]
    runs_whole = {}    # source file -> [test names]
    runs_script = {}   # script path -> [test names]
    labelled = {}
    for t in shown["tests"]:
        name = t["name"]
        props = {p["name"]: p["value"] for p in t.get("properties", [])}
        labelled[name] = "float-compare" in (props.get("LABELS") or [])
        cmd = t.get("command") or []
        case = next((a[len("--test-case="):] for a in cmd if a.startswith("--test-case=")), None)
        if case is not None:
            case = re.sub(r"\\(.)", r"\1", case)  # doctest's filter escapes , ; and the like
        for a in cmd:
            for part in [a, *a.split("=")[1:]]:
                p = Path(part)
                if not p.is_absolute():
                    continue
                rp = str(p.resolve()) if p.exists() else str(p)
                if rp in programs:
                    for src in programs[rp]:
                        if case is not None:
                            runs_case.setdefault((src, case), []).append(name)
                        else:
                            runs_whole.setdefault(src, []).append(name)
                elif p.suffix in (".sh", ".py") and p.exists():
                    runs_script.setdefault(str(p.resolve()), []).append(name)
    # The pieces of test code, and whether a labelled test runs each that compares floats.
    problems, pieces = [], 0
    code = sorted(list(source_dir.glob("tests/**/*.cpp")) + list(source_dir.glob("checks/[0-9][0-9]_*/checks.cpp")))
    for path in code:
        src = str(path.resolve())
        rel = path.relative_to(source_dir)
        cases = test_cases(path)
        per_case = any(k[0] == src for k in runs_case)  # ctest runs this program case by case
        if cases:
            for cname, line, body in cases:
                if per_case and not runs_case.get((src, cname)) and not runs_whole.get(src):
                    problems.append(f"{rel}:{line}: the case \"{cname}\" is run by no test: ctest runs this "
                                    f"program case by case, and no test's --test-case names it (a ';' in a "
                                    f"name splits it in two for CMake: write ',')")
                    continue
                where = first_comparison(body)
                if where is None:
                    continue
                pieces += 1
                tests = runs_case.get((src, cname), []) + runs_whole.get(src, [])
                if args.list:
                    print(f"{rel}:{line} \"{cname}\": {len(tests)} test(s), labelled: "
                          f"{sum(labelled[t] for t in tests)}")
                if tests and not any(labelled[t] for t in tests):
                    problems.append(f"{rel}:{line + where[0] - 1}: the case \"{cname}\" compares floats "
                                    f"({where[1][:80]}) but no test that runs it is labelled float-compare "
                                    f"(run by: {tests[0]})")
        else:
            where = first_comparison(strip_comments(path.read_text(errors="replace")))
            if where is None:
                continue
            pieces += 1
            tests = runs_whole.get(src, [])
            if args.list:
                print(f"{rel}: {len(tests)} test(s), labelled: {sum(labelled[t] for t in tests)}")
            if tests and not any(labelled[t] for t in tests):
                problems.append(f"{rel}:{where[0]}: compares floats ({where[1][:80]}) but no test that runs it "
                                f"is labelled float-compare (run by: {tests[0]})")
    scripts = sorted(set(source_dir.glob("tools/test_*.sh")) | set(source_dir.glob("tools/*.py")) |
                     set(source_dir.glob("tests/**/*.sh")) | set(source_dir.glob("tests/**/*.py")))
    for path in scripts:
        where = first_comparison(strip_comments(path.read_text(errors="replace"), script=True))
        tests = runs_script.get(str(path.resolve()), [])
        if where is None or not tests:
            continue
        pieces += 1
        if args.list:
            print(f"{path.relative_to(source_dir)}: {len(tests)} test(s), labelled: {sum(labelled[t] for t in tests)}")
        if not any(labelled[t] for t in tests):
            problems.append(f"{path.relative_to(source_dir)}:{where[0]}: compares floats ({where[1][:80]}) but no "
                            f"test that runs it is labelled float-compare (run by: {tests[0]})")
    n_labelled = sum(labelled.values())
    if problems:
        print("\n".join(problems))
        print(f"{len(problems)} piece(s) of test code would not run under the second OpenBLAS kernel, or not at "
              f"all: give a test that compares floats the label (take it off cmake/float_compare.cmake's list of "
              f"exceptions), and a case a name that CMake keeps whole")
        return 1
    print(f"{pieces} test cases, programs and scripts compare floats; each is run by one of the {n_labelled} tests "
          f"labelled float-compare, and every doctest case is run by a test")
    return 0


if __name__ == "__main__":
    sys.exit(main())
