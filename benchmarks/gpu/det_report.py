#!/usr/bin/env python3
"""Loss equality between deterministic runs, across calls and hosts (issue 22).

Why: a deterministic plan is only useful as a check if two runs that must agree agree bit for bit
at every iteration, not only at the last one; and where they do not, the first iteration that
differs and the size of the difference say whether it is the dispatcher's reduction order (from
iteration 1, ~1e-6) or something that drifts. Runs may come from several device calls, so each run
is named by the folder it came from.

Usage: det_report.py REF RUN... [--md FILE]   (each a MOCOMPILE_METRICS file: <call>/det-<plan>.jsonl)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def losses(path: Path) -> list[float]:
    """The per-iteration losses of one run, in iteration order."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["loss"] for r in sorted(rows, key=lambda r: r["iteration"])]


def compare(ref: list[float], run: list[float]) -> dict:
    """Bit-equal iterations, the first that differs (1-based; None if none) and the largest relative gap."""
    n = min(len(ref), len(run))
    differ = [i for i in range(n) if ref[i] != run[i]]
    gap = max((abs(run[i] - ref[i]) / abs(ref[i]) for i in differ if ref[i]), default=0.0)
    return {"iterations": n, "equal": n - len(differ), "first_diff": differ[0] + 1 if differ else None,
            "max_rel_gap": gap}


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def report(ref: Path, runs: list[Path]) -> str:
    base = losses(ref)
    lines = [f"Reference: `{_name(ref)}` ({len(base)} iterations, last loss {base[-1]!r})", "",
             "| run | bit-equal iterations | first differing iteration | largest relative gap | last loss |",
             "|---|---|---|---|---|"]
    for path in runs:
        run = losses(path)
        c = compare(base, run)
        lines.append(f"| `{_name(path)}` | {c['equal']}/{c['iterations']} | {c['first_diff'] or '-'} | "
                     f"{c['max_rel_gap']:.2e} | {run[-1]!r} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ref", type=Path)
    ap.add_argument("runs", type=Path, nargs="+")
    ap.add_argument("--md", type=Path)
    args = ap.parse_args(argv)
    text = report(args.ref, args.runs)
    print(text, end="")
    if args.md:
        args.md.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
