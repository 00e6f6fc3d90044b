#!/usr/bin/env python3
"""The table of which exercise's checks draw from which property family, in checks/README.md.

    tools/families_table.py [--write]

The property families (checks/support/include/attn/families.hpp) name the edges where wrong
solutions hide: magnitudes, offsets, non-finite values, settings out of range, masks, T = 1,
argument order, invariances and sizes past 32 bits. For each checks/NN_slug/checks.cpp this
reads which families its properties call (`family::<generator>(`), and for each it does not,
the reason its checks/NN_slug/families.txt gives (`<family>: <why the contract has no such
input>`). It fails when

  - a family is neither used nor given a reason (or given a reason and used: say one);
  - families.txt names a family that does not exist;
  - a check calls a generator this table does not know (add it to FAMILIES below);
  - a property draws a value without naming it (`*rc::gen::...` instead of attn::draw):
    its counterexample would print a bare `float: 0.999`;
  - checks/README.md's table is not the one these files give (--write rewrites it).
"""
import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "checks" / "README.md"
BEGIN, END = "<!-- families table: tools/families_table.py --write -->", "<!-- end of the families table -->"

# The families, in the table's order, and the generators of attn/families.hpp that draw from each.
FAMILIES = [
    ("magnitudes", ["magnitude"]),
    ("offsets", ["offset"]),
    ("non-finite", ["non_finite"]),
    ("out of range", ["out_of_range", "below", "not_dividing"]),
    ("masks", ["mask", "mask_of_kind"]),
    ("T = 1", ["length"]),
    ("argument order", ["distinct"]),
    ("invariances", ["shift", "scale", "permutation"]),
    ("wide sizes", ["wide_count"]),
]
NAMES = [f for f, _ in FAMILIES]
OF = {g: f for f, gens in FAMILIES for g in gens}
UNNAMED = re.compile(r"\*\s*(rc::gen::\w+|attn::(family::)?(?!draw\b)\w+\s*\(|magnitude\s*\()")


def strip_comments(text):
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def survey():
    rows, problems = [], []
    for d in sorted(ROOT.glob("checks/[0-9][0-9]_*")):
        checks = d / "checks.cpp"
        if not checks.exists():
            continue
        code = strip_comments(checks.read_text())
        used = {}
        for m in re.finditer(r"\bfamily::(\w+)\s*\(", code):
            g = m.group(1)
            if g not in OF:
                line = code.count("\n", 0, m.start()) + 1
                problems.append(f"{checks.relative_to(ROOT)}:{line}: family::{g} is no generator this table knows: "
                                f"add it to FAMILIES in tools/families_table.py")
                continue
            used.setdefault(OF[g], []).append(g)
        for m in UNNAMED.finditer(code):
            line = code.count("\n", 0, m.start()) + 1
            problems.append(f"{checks.relative_to(ROOT)}:{line}: a value drawn without a name ({m.group(0).strip()}…): "
                            f"draw it with attn::draw(\"name\", gen), so that a counterexample names it")
        reasons = {}
        why_file = d / "families.txt"
        if why_file.exists():
            for n, line in enumerate(why_file.read_text().splitlines(), 1):
                if not line.strip() or line.startswith("#"):
                    continue
                fam, _, why = line.partition(":")
                fam, why = fam.strip(), why.strip()
                if fam not in NAMES:
                    problems.append(f"{why_file.relative_to(ROOT)}:{n}: '{fam}' is no family ({', '.join(NAMES)})")
                elif not why:
                    problems.append(f"{why_file.relative_to(ROOT)}:{n}: no reason given for {fam}")
                else:
                    reasons[fam] = why
        for fam in NAMES:
            if fam in used and fam in reasons:
                problems.append(f"{d.name}: the checks draw from '{fam}' ({', '.join(sorted(set(used[fam])))}) and "
                                f"families.txt says why they do not: say one")
            elif fam not in used and fam not in reasons:
                problems.append(f"{d.name}: no property draws from '{fam}' and {d.name}/families.txt gives no reason: "
                                f"add a property that does, or `{fam}: <why the contract has no such input>`")
        rows.append((d.name, used, reasons))
    return rows, problems


def table(rows):
    out = [BEGIN, "",
           "| exercise | " + " | ".join(NAMES) + " |",
           "|---|" + "---|" * len(NAMES)]
    for name, used, reasons in rows:
        cells = ["✓" if f in used else "·" for f in NAMES]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    out += ["", "✓: a property of the exercise's checks draws from the family. ·: its contract gives that family "
            "no input, for the reason below.", ""]
    for name, used, reasons in rows:
        empty = [f for f in NAMES if f not in used and f in reasons]
        if empty:
            out.append(f"- **{name}**: " + "; ".join(f"*{f}*: {reasons[f]}" for f in empty))
    out += ["", END]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--write", action="store_true", help="rewrite checks/README.md's table")
    args = ap.parse_args()
    rows, problems = survey()
    text = README.read_text() if README.exists() else ""
    if BEGIN not in text or END not in text:
        problems.append(f"{README.relative_to(ROOT)} has no table between '{BEGIN}' and '{END}'")
        current = None
    else:
        current = text[text.index(BEGIN):text.index(END) + len(END)]
    wanted = table(rows)
    if current is not None and current != wanted:
        if args.write:
            README.write_text(text.replace(current, wanted))
            print(f"rewrote the table in {README.relative_to(ROOT)}")
        else:
            problems.append(f"{README.relative_to(ROOT)}'s table is out of date: python3 tools/families_table.py --write")
    if problems:
        print("\n".join(problems))
        return 1
    n = sum(len(used) for _, used, _ in rows)
    print(f"{len(rows)} exercises, {n} exercise × family cells drawn from, every other one explained; "
          f"every drawn value named")
    return 0


if __name__ == "__main__":
    sys.exit(main())
