#!/usr/bin/env python3
"""How fast is `mocompile lint` next to `yamllint` (pre-commit runs both on every commit)?

Cold processes (a fresh interpreter per run, as pre-commit starts them), the same files, several
repeats, medians. Workloads: one recipe; a 1024-GPU DeepSeek-V3 intent with everything auto (the
planner's largest search), with the plan cache off (a changed file) and on (an unchanged one); and
200 generated intents in one invocation. Prints both medians, the ratio mocompile / yamllint (goal
<= 1.5) and the number of candidates the planner scored.

    python benchmarks/lint_speed.py [--repeats 7] [--out benchmarks/results/lint_speed.txt]

Runs with the interpreter that runs it; it needs yamllint installed there, and mocompile importable
(installed, or this checkout's compiler/ is put on PYTHONPATH).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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


def timed(cmd: list[str], repeats: int, cwd: Path, ok: tuple[int, ...], extra: dict | None = None) -> list[float]:
    env = _env()
    env.update(extra or {})
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
    for src in sources:  # under their own names too: what a recipe `extends` (not linted themselves)
        (dest / src.name).write_text(src.read_text().replace("../schemas/", "../../schemas/"))
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
    # yamllint exits 1 for its own findings, which a missing module also returns: without it every ratio would
    # be against Python's import error (~25 ms), so refuse instead of printing one
    for module in ("yamllint", "mocompile"):
        if module == "mocompile":
            sys.path.insert(0, str(ROOT / "compiler"))
        if importlib.util.find_spec(module) is None:
            raise SystemExit(f"{module} is not importable by {py}: install it there (pip install {module}) and rerun")
    lines = [f"lint speed: cold processes, median of {args.repeats} runs after one warm-up",
             f"python {platform.python_version()} ({py}), {platform.platform()}, {os.cpu_count()} CPUs", ""]
    rows = []
    with tempfile.TemporaryDirectory(prefix="lint-speed-") as tmp:
        work = Path(tmp) / "intents"
        work.mkdir()
        names = make_intents(work, args.count)
        one = str(ROOT / "recipes" / "tiny-moe-h100x2.yaml")
        big = work / "deepseek-v3-1024xh100.yaml"   # the largest search: 1024 GPUs, everything auto
        big.write_text("schema: 1\nmodel: deepseek-v3\nhardware: {gpu: h100, nodes: 128}\ngoal: throughput\n"
                       "training: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 16384}\n")
        scored = {}
        for path in (one, str(big)):
            proc = subprocess.run([py, "-m", "mocompile", "explain", path, "--format", "json"], env=_env(),
                                  capture_output=True, text=True)
            scored[path] = json.loads(proc.stdout)["estimate"]["candidates_scored"] if proc.stdout else "?"
        cache = Path(tmp) / "cache"
        workloads = [("1 file", [one], ROOT, {}), ("DSV3 1024 GPUs, plan cache miss", [str(big)], ROOT,
                     {"MOCOMPILE_NO_CACHE": "1"}), ("DSV3 1024 GPUs, plan cache hit", [str(big)], ROOT, {}),
                     (f"{args.count} intents", names, work, {})]
        for label, files, cwd, extra in workloads:
            env = {"XDG_CACHE_HOME": str(cache), **extra}
            moc = timed([py, "-m", "mocompile", "lint", *files], args.repeats, cwd, ok=(0, 1), extra=env)
            yml = timed([py, "-m", "yamllint", *files], args.repeats, cwd, ok=(0, 1))
            m, y = statistics.median(moc), statistics.median(yml)
            rows.append((label, m, y))
            n = scored.get(files[0]) if len(files) == 1 else None
            lines.append(f"{label:<34} mocompile lint {m * 1000:7.0f} ms   yamllint {y * 1000:7.0f} ms   "
                         f"ratio {m / y:5.2f}   (min {min(moc) * 1000:.0f} / {min(yml) * 1000:.0f} ms)"
                         + (f"   {n} candidates scored" if n is not None else ""))
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
