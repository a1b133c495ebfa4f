#!/usr/bin/env python3
"""How fast is `mocompile lint` next to `yamllint` (pre-commit runs both on every commit)?

Cold processes (a fresh interpreter per run, as pre-commit starts them), the same files, several
repeats, medians. Two workloads: one recipe, and 200 generated intents in one invocation (variants of
the example recipes). Prints both medians and the ratio mocompile / yamllint; the goal is <= 1.5.

    python benchmarks/lint_speed.py [--repeats 7] [--out benchmarks/results/lint_speed.txt]

Runs with the interpreter that runs it; it needs yamllint installed there, and mocompile importable
(installed, or this checkout's compiler/ is put on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "compiler") + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(cmd: list[str], repeats: int, cwd: Path, ok: tuple[int, ...]) -> list[float]:
    env = _env()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)  # warm the OS file cache and .pyc
    if proc.returncode not in ok:
        raise SystemExit(f"{' '.join(cmd[:4])} ... exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t0)
    return times


def make_intents(dest: Path, n: int) -> list[str]:
    sources = sorted(p for p in (ROOT / "recipes").glob("*.yaml"))
    names = []
    for i in range(n):
        src = sources[i % len(sources)]
        text = src.read_text().replace("../schemas/", "../../schemas/")
        text += f"name: intent-{i:03d}\n"
        path = dest / f"intent-{i:03d}.yaml"
        path.write_text(text)
        names.append(path.name)
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--out", default=None, help="also write the report to this file")
    args = ap.parse_args()
    py = sys.executable
    lines = [f"lint speed: cold processes, median of {args.repeats} runs after one warm-up",
             f"python {platform.python_version()} ({py}), {platform.platform()}, {os.cpu_count()} CPUs", ""]
    rows = []
    with tempfile.TemporaryDirectory(prefix="lint-speed-") as tmp:
        work = Path(tmp) / "intents"
        work.mkdir()
        names = make_intents(work, args.count)
        one = ["recipe", str(ROOT / "recipes" / "tiny-moe-h100x2.yaml")]
        for label, files, cwd in (("1 file", [one[1]], ROOT), (f"{args.count} intents", names, work)):
            moc = timed([py, "-m", "mocompile", "lint", *files], args.repeats, cwd, ok=(0, 1))
            yml = timed([py, "-m", "yamllint", *files], args.repeats, cwd, ok=(0, 1))
            m, y = statistics.median(moc), statistics.median(yml)
            rows.append((label, m, y))
            lines.append(f"{label:<12} mocompile lint {m * 1000:7.0f} ms   yamllint {y * 1000:7.0f} ms   "
                         f"ratio {m / y:5.2f}   (mocompile min {min(moc) * 1000:.0f} ms, yamllint min {min(yml) * 1000:.0f} ms)")
    worst = max(m / y for _, m, y in rows)
    lines.append("")
    lines.append(f"worst ratio {worst:.2f} (goal <= 1.5): {'met' if worst <= 1.5 else 'NOT met'}")
    report = "\n".join(lines) + "\n"
    sys.stdout.write(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
