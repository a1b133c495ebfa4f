#!/usr/bin/env python3
"""Where a training step's time goes, from a PyTorch profiler trace (Chrome JSON, .json or .json.gz).

Bridge writes the trace when the intent has ``profile:`` (``ProfilingConfig``, one file per profiled
rank). For every ``ProfilerStep#N`` window on the host timeline this reports:

- ``wall_ms``: the step as the host saw it;
- ``busy_ms``: time the GPU ran anything (union of kernels and copies over all streams);
- ``compute_ms`` / ``comm_ms``: union of compute kernels / of communication kernels (NCCL, DeepEP,
  HybridEP; named by ``COMM``);
- ``comm_hidden_ms``: communication time during which a compute kernel also ran (what overlap buys);
- ``comm_exposed_ms``: the rest of ``comm_ms``. A communication kernel also runs while it waits for
  slower peers, so this includes load-imbalance and skew waits, not only transfer time;
- ``idle_ms``: ``wall_ms - busy_ms``, time the GPU waited for the host (launch-bound work);
- the kernels that took the most time.

The reading lives in compiler/mocompile/trace.py (standard library only; `mocompile diagnose` uses it too).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "compiler"))
from mocompile.trace import (COMM, STEP, Interval, clip, intersect, is_gpu, length, load,  # noqa: E402,F401
                             summarize, union)


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
