"""The profile reader of the GPU harness (benchmarks/gpu/trace_report.py) and how run_bench.py keeps
profiled steps out of the timing: hand-built traces whose answers are worked out in the comments."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

import run_bench  # noqa: E402
import trace_report as tr  # noqa: E402


def _step(n: int, ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur, "pid": 1, "tid": 1}


def _kernel(name: str, ts: float, dur: float, stream: int = 7) -> dict:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream}


# Two steps of 1000 us. Step 5: a GEMM 100-400 and another 300-500 on a second stream (compute union
# 100-500 = 400 us), an NCCL kernel 450-650 (50 us of it under the GEMM: hidden 50, exposed 150),
# a copy 900-950 (busy, neither compute nor comm). Busy = 100-650 + 900-950 = 600 us; idle 400 us.
# Step 6: DeepEP dispatch 1100-1300 alone (exposed 200), a GEMM that starts in step 6 and runs past its
# end (1900-2100: only 100 us counts in step 6). Busy 300 us, idle 700 us.
TRACE = [
    _step(5, 0, 1000), _step(6, 1000, 1000),
    _kernel("nvjet_sm90_gemm", 100, 300), _kernel("nvjet_sm90_gemm", 300, 200, stream=9),
    _kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 450, 200, stream=11),
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 900, "dur": 50, "pid": 0, "tid": 7},
    _kernel("void deep_ep::intranode::dispatch<4, 768, 8192>(int4*)", 1100, 200, stream=11),
    _kernel("nvjet_sm90_gemm", 1900, 200),
    {"ph": "i", "cat": "cpu_op", "name": "instant", "ts": 10},  # not a complete event: ignored
]


def test_step_figures_are_worked_out_from_kernel_intervals():
    out = tr.summarize(TRACE)
    s5, s6 = out["steps"]
    assert (s5["step"], s5["wall_ms"], s5["busy_ms"], s5["compute_ms"]) == (5, 1.0, 0.6, 0.4)
    assert (s5["comm_ms"], s5["comm_hidden_ms"], s5["comm_exposed_ms"], s5["idle_ms"]) == (0.2, 0.05, 0.15, 0.4)
    assert (s6["comm_ms"], s6["comm_hidden_ms"], s6["compute_ms"], s6["busy_ms"], s6["idle_ms"]) == (
        0.2, 0.0, 0.1, 0.3, 0.7)
    assert out["median"]["comm_exposed_ms"] == pytest.approx(0.175)
    assert out["streams"] == 3  # kernels ran on streams 7, 9 and 11
    top = {k["name"][:15]: k for k in out["top_kernels_ms_per_step"]}
    assert top["nvjet_sm90_gemm"]["ms"] == pytest.approx((300 + 200 + 200) / 1e3 / 2) and not top["nvjet_sm90_gemm"]["comm"]
    assert top["ncclDevKernel_S"]["comm"] and top["void deep_ep::i"]["comm"]


def test_interval_algebra():
    assert tr.union([(5, 6), (1, 3), (2, 4), (4, 4.5), (7, 7)]) == [(1, 4.5), (5, 6)]
    assert tr.intersect([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]
    assert tr.intersect([(0, 1)], [(1, 2)]) == []  # touching is not overlapping
    assert tr.clip([(0, 10), (12, 14)], 5, 13) == [(5, 10), (12, 13)]


def test_reads_gzipped_traces_and_the_cli_writes_json(tmp_path, capsys):
    path = tmp_path / "rank-0.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        json.dump({"traceEvents": TRACE}, fh)
    assert tr.main([str(path), "--json", str(tmp_path / "s.json")]) == 0
    assert "2 steps" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())[str(path)]["median"]["busy_ms"] == pytest.approx(0.45)
    (tmp_path / "bad.json").write_text("{not json")
    assert tr.main([str(tmp_path / "bad.json")]) == 2


def test_profiled_iterations_are_not_timed():
    """profile {start: 26, end: 29}: iteration 25 warms the profiler up, 26-28 are recorded, 29 exports."""
    rows = [{"iteration": i, "step_ms": 100.0} for i in range(1, 31)]
    run = {"profile_excluded": [25, 29], "metrics": rows}
    assert [r["iteration"] for r in run_bench._timed(run, rows, 4)] == list(range(5, 25)) + [30]
    assert [r["iteration"] for r in run_bench._timed({"metrics": rows}, rows, 4)] == list(range(5, 31))


def test_profile_window_comes_from_the_compiled_lock():
    """The TE bench recipes trace steps 26..29 (profile: in recipes/bench/bench-te-mid-*.yaml)."""
    folder = Path(__file__).resolve().parents[1] / "generated" / "bench-te-mid-ep4-off"
    assert run_bench.profile_excluded(run_bench.describe(folder)) == [25, 29]
    assert run_bench.profile_excluded(run_bench.describe(folder.parent / "bench-mid-ep4-a2a-off")) is None
