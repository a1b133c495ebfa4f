"""Timing helpers of the one-GPU micro-benchmarks (gptoss_micro.py, fp8_micro.py): CUDA-event wall time, GPU
kernel time from the PyTorch profiler, and interleaved rounds aggregated by median."""
from __future__ import annotations

import json
import statistics
import traceback
from collections.abc import Callable
from typing import Any


def timed(torch, fn, reps: int = 10, warm: int = 3) -> float:
    """Median milliseconds of ``fn`` (forward + backward) between CUDA events."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def _kernel_spans(torch, fn, reps: int) -> list[tuple[float, float]]:
    """(start, end) microseconds of every CUDA kernel of ``reps`` calls of ``fn`` (PyTorch profiler), after one
    call outside the profile."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return [(e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type == DeviceType.CUDA]


def kernel_ms(torch, fn, reps: int = 5) -> float:
    """Milliseconds of GPU kernel time per call of ``fn`` (the sum of the kernels' durations): the wall time
    between CUDA events also counts the host's launch time whenever the GPU waits for it."""
    return sum(b - a for a, b in _kernel_spans(torch, fn, reps)) / reps / 1000.0


def kernel_and_busy_ms(torch, fn, reps: int = 5) -> tuple[float, float]:
    """``kernel_ms`` and the busy time of one profiled pass: milliseconds per call during which at least one CUDA
    kernel runs (the union of the kernels' intervals). Unlike the kernel sum the busy time does not count twice
    the kernels that overlap on several streams (TE's grouped GEMM runs up to four experts at once); unlike the
    CUDA-event wall time it leaves out the gaps in which the GPU waits for the host."""
    spans = _kernel_spans(torch, fn, reps)
    return sum(b - a for a, b in spans) / reps / 1000.0, union_length(spans) / reps / 1000.0


def run_cases(torch, fn: Callable[..., dict[str, Any]], cases: list[tuple[str, tuple[Any, ...]]],
              default_rounds: int = 2) -> dict[str, dict[str, Any]]:
    """``run_rounds`` over ``fn(*args)`` for each named argument tuple, ROUNDS (environment) rounds."""
    import os

    return run_rounds(torch, [(name, lambda a=args: fn(*a)) for name, args in cases],
                      int(os.environ.get("ROUNDS", str(default_rounds))))


def write_results(res: dict[str, Any], out_path: str, line: Callable[[dict[str, Any]], str], width: int = 44) -> None:
    """Print one line per case (``line`` of its record, or its error) and write the run as JSON."""
    for name, r in res["cases"].items():
        print(f"{name:{width}s} " + (line(r) if "ms" in r else r["error"][:200]), flush=True)
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(res, fh, indent=1)


def union_length(spans: list[tuple[float, float]]) -> float:
    """Total length covered by the intervals ``spans`` (overlaps counted once)."""
    total, start, end = 0.0, None, None
    for a, b in sorted(spans):
        if end is None or a > end:
            if end is not None:
                total += end - start
            start, end = a, b
        else:
            end = max(end, b)
    if end is not None:
        total += end - start
    return total


def run_rounds(torch, cases: list[tuple[str, Callable[[], dict[str, Any]]]], rounds: int,
               before: Callable[[], None] | None = None,
               after: Callable[[dict[str, Any], int], None] | None = None) -> dict[str, dict[str, Any]]:
    """Every case once per round, rounds interleaved (a slow moment of the GPU hits every case alike); an
    exception is recorded as the case's result, not raised (a missing backend is itself a finding). Returns
    per case the first round's record with ``ms`` and the other timings replaced by their medians over the
    rounds that ran (``ms_runs``: each round's ``ms``). ``before``/``after(record, round)`` wrap each case."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in cases}
    for rnd in range(rounds):
        for name, fn in cases:
            if before:
                before()
            try:
                r = fn()
            except Exception as e:
                r = {"error": f"{type(e).__name__}: {e}"[:500], "trace": traceback.format_exc()[-1500:]}
            if after:
                after(r, rnd)
            runs[name].append(r)
            torch.cuda.empty_cache()
    out = {}
    for name, rs in runs.items():
        ok = [r for r in rs if "ms" in r]
        r = dict(rs[0])
        if ok:
            r["ms_runs"] = [x["ms"] for x in ok]
            for key in ("ms", "tflops", "fwd_ms", "gpu_ms", "busy_ms", "wall_tflops"):
                if key in ok[0]:
                    r[key] = statistics.median(x[key] for x in ok)
        out[name] = r
    return out
