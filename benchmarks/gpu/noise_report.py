#!/usr/bin/env python3
"""Table of the host-setting A/B (``issue22_grid.sh noise``): per setting, the run medians, their spread between
runs, and the spread of step times inside each run.

Reads the ``noise-<setting>-r<round>.jsonl`` step metrics of one results folder. Steps after the warm-up
(iteration > ``--warmup``) count. Two settings are called apart only where their ranges of run medians do not
overlap, the rule the grid tables use. Standard library only.

    python3 benchmarks/gpu/noise_report.py benchmarks/results/issue22-noise-h200x2-2026-11-28/runs
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

NAME = re.compile(r"^noise-(?P<setting>[a-z-]+)-r(?P<round>\d+)\.jsonl$")


def runs(folder: Path, warmup: int) -> dict[str, list[tuple[int, list[float]]]]:
    """setting -> [(round, step times in ms after the warm-up)], rounds in order."""
    out: dict[str, list[tuple[int, list[float]]]] = {}
    for path in sorted(folder.iterdir()):
        m = NAME.match(path.name)
        if not m:
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        ms = [float(r["step_ms"]) for r in rows if r["iteration"] > warmup]
        if ms:
            out.setdefault(m["setting"], []).append((int(m["round"]), ms))
    for v in out.values():
        v.sort()
    return out


def cv(xs: list[float]) -> float:
    return statistics.stdev(xs) / statistics.mean(xs) if len(xs) > 1 else 0.0


def report(data: dict[str, list[tuple[int, list[float]]]]) -> list[str]:
    lines = [f"{'setting':<16} {'runs':>4}  {'median ms':>9}  {'run medians (by round)':<28} {'between runs':>12} "
             f"{'within-run CV':>13}"]
    summary = {}
    for setting, rs in sorted(data.items()):
        medians = [statistics.median(ms) for _, ms in rs]
        mid = statistics.median(medians)
        summary[setting] = (min(medians), max(medians), mid)
        lines.append(f"{setting:<16} {len(rs):>4}  {mid:>9.1f}  {', '.join(f'{x:.0f}' for x in medians):<28} "
                     f"{(max(medians) - min(medians)) / mid:>11.1%} {statistics.mean(cv(ms) for _, ms in rs):>13.1%}")
    lines.append("")
    names = sorted(summary)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            lo_a, hi_a, mid_a = summary[a]
            lo_b, hi_b, mid_b = summary[b]
            apart = hi_a < lo_b or hi_b < lo_a
            lines.append(f"{a} vs {b}: medians x{mid_a / mid_b:.3f}; ranges " + ("apart" if apart else "overlap"))
    rounds = sorted({r for rs in data.values() for r, _ in rs})
    by_round = [statistics.median(statistics.median(ms) for rs in data.values() for r, ms in rs if r == k)
                for k in rounds]
    if len(by_round) > 1:
        lines.append("round medians (all settings): " + ", ".join(f"r{k} {x:.0f}" for k, x in zip(rounds, by_round, strict=True))
                     + f" ms (spread {(max(by_round) - min(by_round)) / statistics.median(by_round):.1%})")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    if not args.folder.is_dir():
        print(f"error: {args.folder}: no such folder", file=sys.stderr)
        return 2
    data = runs(args.folder, args.warmup)
    if not data:
        print(f"error: no noise-<setting>-r<round>.jsonl step metrics in {args.folder}", file=sys.stderr)
        return 2
    print("\n".join(report(data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
