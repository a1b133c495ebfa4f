#!/usr/bin/env python3
"""Where a training step's time goes, from PyTorch profiler traces (Chrome JSON, .json or .json.gz):
the GPU harness's command line over ``mocompile.trace`` (compiler/mocompile/trace.py, standard library
only; its docstring defines each figure: wall, busy, compute, comm, hidden/exposed comm, idle), which
``mocompile diagnose`` reads traces with too. Prints each trace's median per-step figures; ``--json``
writes every step and the top kernels.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "compiler"))
from mocompile.trace import COMM, STEP, Interval, clip, intersect, is_gpu, length, load, summarize, union  # noqa: E402,F401


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+", type=Path, help="rank-<R>.json.gz files written by Bridge's profiler")
    ap.add_argument("--json", type=Path, help="also write the summaries here")
    args = ap.parse_args(argv)
    result = {}
    for path in args.traces:
        try:
            result[str(path)] = summarize(load(path))
        except (OSError, ValueError, EOFError) as exc:
            print(f"trace_report: {path}: {exc}", file=sys.stderr)
            return 2
        med = result[str(path)].get("median", {})
        print(f"{path}: {len(result[str(path)]['steps'])} steps; median " +
              ", ".join(f"{k} {v:.1f}" for k, v in med.items()))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
