"""Where a training step's time goes, from a PyTorch profiler trace (Chrome JSON, .json or .json.gz).

Bridge writes the trace when the intent has ``profile:`` (``ProfilingConfig``, one file per profiled
rank). For every ``ProfilerStep#N`` window on the host timeline:

- ``wall_ms``: the step as the host saw it;
- ``busy_ms``: time the GPU ran anything (union of kernels and copies over all streams);
- ``compute_ms`` / ``comm_ms``: union of compute kernels / of communication kernels (NCCL, DeepEP,
  HybridEP; named by ``COMM``);
- ``comm_hidden_ms``: communication time during which a compute kernel also ran (what overlap buys);
- ``comm_exposed_ms``: the rest of ``comm_ms``. A communication kernel also runs while it waits for
  slower peers, so this includes load-imbalance and skew waits, not only transfer time;
- ``idle_ms``: ``wall_ms - busy_ms``, time the GPU waited for the host (launch-bound work);
- the kernels that took the most time.

Standard library only: ``mocompile diagnose`` reads traces with it, and the GPU harness
(``benchmarks/gpu/trace_report.py``) runs it on the host next to the trace.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

COMM = re.compile(r"nccl|deep_ep|deepep|hybrid_ep|hybridep|all_?to_?all|sendrecv|dispatch|combine", re.I)
STEP = re.compile(r"^ProfilerStep#(\d+)$")
Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """Merged, sorted, non-overlapping intervals covering the same time."""
    out: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Intersection of two merged interval lists (as ``union`` returns them)."""
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi]


def load(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    events = data.get("traceEvents", data) if isinstance(data, dict) else data
    return [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e and "ts" in e]


def is_gpu(event: dict[str, Any]) -> bool:
    return event.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")


def summarize(events: list[dict[str, Any]], top: int = 8) -> dict[str, Any]:
    """Per-step figures (see the module docstring) and their medians over the profiled steps."""
    steps = sorted(((int(m.group(1)), float(e["ts"]), float(e["ts"]) + float(e["dur"]))
                    for e in events if e.get("cat") == "user_annotation"
                    for m in [STEP.match(str(e.get("name", "")))] if m), key=lambda s: s[1])
    gpu = [e for e in events if is_gpu(e)]
    comm_iv: list[Interval] = []
    comp_iv: list[Interval] = []
    all_iv: list[Interval] = []
    for e in gpu:  # one pass: every GPU event is busy time; kernels are communication or compute
        iv = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        all_iv.append(iv)
        if e.get("cat") == "kernel":
            (comm_iv if COMM.search(str(e.get("name", ""))) else comp_iv).append(iv)
    rows = []
    for number, lo, hi in steps:
        comm = union(clip(comm_iv, lo, hi))
        comp = union(clip(comp_iv, lo, hi))
        busy = union(clip(all_iv, lo, hi))
        hidden = length(intersect(comm, comp))
        wall = hi - lo
        rows.append({"step": number, "wall_ms": wall / 1e3, "busy_ms": length(busy) / 1e3,
                     "compute_ms": length(comp) / 1e3, "comm_ms": length(comm) / 1e3,
                     "comm_hidden_ms": hidden / 1e3, "comm_exposed_ms": (length(comm) - hidden) / 1e3,
                     "idle_ms": (wall - length(busy)) / 1e3})
    kernels: dict[str, float] = {}
    lo = min((s[1] for s in steps), default=float("-inf"))
    hi = max((s[2] for s in steps), default=float("inf"))
    for e in gpu:
        if e.get("cat") == "kernel" and lo <= float(e["ts"]) < hi:
            name = str(e.get("name", "?"))[:90]
            kernels[name] = kernels.get(name, 0.0) + float(e["dur"]) / 1e3
    per_step = max(1, len(rows))
    out: dict[str, Any] = {"steps": rows, "streams": len({(e.get("pid"), e.get("tid")) for e in gpu
                                                          if e.get("cat") == "kernel"})}
    if rows:
        out["median"] = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0] if k != "step"}
    out["top_kernels_ms_per_step"] = [{"name": n, "ms": round(t / per_step, 3), "comm": bool(COMM.search(n))}
                                      for n, t in sorted(kernels.items(), key=lambda kv: -kv[1])[:top]]
    return out


