"""`mocompile diagnose RUN`: a run's breakdown, its dominant wall, and the changes the model ranks.

Inputs are recorded ones: the step metrics of the 4x H100 TE grid (benchmarks/results/te-h100x4-2026-11-26,
in the committed log archives) and hand-built traces whose answers tests/test_trace_report.py works out.
"""

from __future__ import annotations

import gzip
import json
import shutil
import statistics
import sys
import tarfile

import pytest
from conftest import ROOT, run_cli
from mocompile import diagnose

sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
import trace_report  # noqa: E402
from test_trace_report import TRACE  # noqa: E402

GRID = ROOT / "benchmarks" / "results" / "te-h100x4-2026-11-26"
LOCK = ROOT / "generated" / "bench-te-mid-auto" / "mocompile.lock.json"
H200X4 = ROOT / "benchmarks" / "results" / "issue20-h200x4-2026-11-27"  # issue 20's run on 4x H200
MID = ROOT / "recipes" / "bench" / "bench-te-mid-auto.yaml"


def _metrics(tmp_path, name="bench-te-mid-auto"):
    """The real step metrics of one run of the TE grid (rank 0, one line per step)."""
    with tarfile.open(GRID / "logs-te-h100-a.tar.gz") as tar:
        data = tar.extractfile(f"te-h100-a/{name}.r0.jsonl").read()
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "metrics.jsonl").write_bytes(data)
    return run, [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def _trace(run, events=TRACE, name="rank-0.json.gz"):
    (run / "torch_profile").mkdir(exist_ok=True)
    with gzip.open(run / "torch_profile" / name, "wt", encoding="utf-8") as fh:
        json.dump({"traceEvents": events}, fh)


def test_the_measured_step_is_the_median_after_warm_up_with_its_spread(tmp_path):
    run, rows = _metrics(tmp_path)
    b = diagnose.breakdown(diagnose.find([str(run)], str(LOCK)))
    # the lock traces iterations 26-28 (profile: {start: 26, end: 29}): the profiler slows them, so they are left out
    steady = sorted(r["step_ms"] for r in rows if r["iteration"] > diagnose.WARMUP_STEPS and r["iteration"] not in (26, 27, 28))
    assert b["measured_step_ms"] == round(statistics.median(steady), 1) and b["steps"] == len(steady)
    assert b["measured_spread"] == round((steady[-1] - steady[0]) / statistics.median(steady), 3)
    peak = max(r["max_memory_reserved"] for r in rows if r["iteration"] > diagnose.WARMUP_STEPS and r["iteration"] < 26)
    assert b["peak_memory_gib"] == round(peak / 2 ** 30, 2)
    assert b["memory_headroom"] == round(1 - b["peak_memory_gib"] / 80, 3)
    assert b["source"].startswith("the step-time model")  # no trace: the split is the model's, and it says so


def test_the_breakdown_is_trace_reports_on_the_same_trace(tmp_path):
    run, _ = _metrics(tmp_path)
    _trace(run)
    b = diagnose.breakdown(diagnose.find([str(run)], str(LOCK)))
    assert b["trace_ms"] == trace_report.summarize(TRACE)["median"]
    assert b["source"] == "profiler trace (1 rank(s))"


def test_two_ranks_take_the_median_of_their_medians(tmp_path):
    run, _ = _metrics(tmp_path)
    _trace(run)
    slow = [dict(e, dur=e["dur"] * 3) if e.get("cat") == "kernel" else e for e in TRACE]
    _trace(run, slow, "rank-1.json.gz")
    b = diagnose.breakdown(diagnose.find([str(run)], str(LOCK)))
    one, three = trace_report.summarize(TRACE)["median"], trace_report.summarize(slow)["median"]
    assert b["trace_ms"]["compute_ms"] == pytest.approx((one["compute_ms"] + three["compute_ms"]) / 2, abs=1e-3)


@pytest.mark.parametrize("idle,comm,compute,headroom,want", [
    (400, 150, 400, 0.5, "compute"),        # a tie between host and compute (checked below)
    (500, 150, 300, 0.5, "host"),
    (100, 500, 300, 0.5, "communication"),
    (500, 150, 300, 0.049, "memory"),       # under 5 % of the GPU left: make room first
    (500, 150, 300, 0.05, "host"),          # exactly 5 % left is enough
])
def test_the_dominant_wall_is_the_largest_share_unless_memory_is_nearly_full(idle, comm, compute, headroom, want):
    parts = {"trace_ms": {"wall_ms": 1000.0, "idle_ms": idle, "comm_exposed_ms": comm, "compute_ms": compute,
                          "busy_ms": 1000.0 - idle}, "memory_headroom": headroom}
    name, shares = diagnose.wall(parts)
    if want == "compute":  # a tie between host and compute: max() keeps the first key, host
        assert name == "host" and shares["host"] == shares["compute"] == 0.4
        return
    assert name == want
    assert shares == {"host": idle / 1000, "communication": comm / 1000, "compute": compute / 1000}


def test_a_host_bound_run_gets_the_host_changes_ranked_by_predicted_gain(tmp_path):
    run, _ = _metrics(tmp_path)
    report = diagnose.diagnose([str(run)], str(LOCK), str(ROOT / "recipes" / "bench" / "bench-te-mid-auto.yaml"))
    assert report["wall"] == "host"  # the lent host: the model puts most of the step in launch time
    sets = [p["set"] for p in report["proposals"]]
    assert "cuda_graphs.impl=transformer_engine" in sets and any(s.startswith("training.micro_batch_size=") for s in sets)
    gains = [p["predicted_gain"] for p in report["proposals"] if p.get("predicted_gain") is not None]
    assert gains == sorted(gains, reverse=True) and gains[0] > 0
    assert report["set_line"] == f"--set {report['proposals'][0]['set']}"


def test_a_change_that_breaks_a_rule_is_listed_with_the_rule_not_ranked():
    rows = diagnose.rank(str(ROOT / "recipes" / "bench" / "bench-te-mid-auto.yaml"),
                         [("parallelism.tp=3", "not a divisor")], [])
    assert rows[0].get("predicted_gain") is None and rows[0]["note"]


def test_the_command_line_prints_text_and_json_and_refuses_bad_input(tmp_path):
    run, _ = _metrics(tmp_path)
    proc = run_cli("diagnose", str(run), "--lock", str(LOCK), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "dominant wall: host" in proc.stdout and "try: mocompile recipes/bench/bench-te-mid-auto.yaml --set" in proc.stdout
    js = run_cli("diagnose", str(run), "--lock", str(LOCK), "--format", "json", cwd=ROOT)
    assert json.loads(js.stdout)["wall"] == "host"
    missing = run_cli("diagnose", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no such file or folder" in missing.stdout + missing.stderr
    (tmp_path / "empty").mkdir()
    empty = run_cli("diagnose", str(tmp_path / "empty"))
    assert empty.returncode == 2 and "found no step metrics" in empty.stdout + empty.stderr
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "m.jsonl").write_text('{"step_ms": 1}\nnot json\n')
    bad = run_cli("diagnose", str(tmp_path / "bad"))
    assert bad.returncode == 2 and "line 2 is not JSON" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stderr + empty.stderr + missing.stderr


def test_a_pytorch_trace_whose_events_start_past_its_process_group_table_is_found(tmp_path):
    """Megatron's many process groups put tens of KiB of distributedInfo before traceEvents: the trace is
    recognised by PyTorch's own header (seen on the 2x H200 host: diagnose fell back to the model)."""
    head = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H200"}],
            "distributedInfo": {"pg_config": [{"pg_name": str(i), "ranks": list(range(8))} for i in range(600)]}}
    text = json.dumps(dict(head, traceEvents=TRACE["traceEvents"] if isinstance(TRACE, dict) else TRACE))
    assert text.index('"traceEvents"') > 4096
    path = tmp_path / "host.pt.trace.json"
    path.write_text(text)
    assert diagnose._is_trace(str(path))
    (tmp_path / "other.json").write_text(json.dumps({"schemaVersion": 1, "x": "y" * 5000}))
    assert not diagnose._is_trace(str(tmp_path / "other.json"))


def test_without_a_trace_a_run_far_slower_than_predicted_fits_the_host_and_names_the_host_wall(tmp_path):
    """Worked case from the 2x H200 host: bench-te-mid2-auto's plan measured 1018 ms against 357 ms predicted
    for a DGX host. The model's GPU terms explain a third of that; fitted to the measured step for that very
    plan, host_factor ~7.8 makes the step host-bound, and a larger micro-batch ranks first (a compute-wall
    reading had proposed FP8, measured 59 % slower there)."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "m.jsonl").write_text("".join(json.dumps({"iteration": i, "step_ms": 1018.0}) + "\n" for i in range(1, 31)))
    lock = ROOT / "generated" / "bench-te-mid2-auto" / "mocompile.lock.json"
    rep = diagnose.diagnose([str(run)], str(lock), str(ROOT / "recipes" / "bench" / "bench-te-mid2-auto.yaml"))
    b = rep["breakdown"]
    assert 5 < b["host_factor_fitted"] < 12 and "fitted" in b["source"]
    assert sum(v for k, v in b["model_ms"].items() if k != "a2a_total") == pytest.approx(1018 - 50, rel=0.05)
    assert rep["wall"] == "host" and rep["shares"]["host"] > 0.5
    assert rep["set_line"] == "--set training.micro_batch_size=4"
    # within the model's error of the prediction, nothing is fitted: the DGX model stands
    (run / "m.jsonl").write_text("".join(json.dumps({"iteration": i, "step_ms": 400.0}) + "\n" for i in range(1, 31)))
    rep = diagnose.diagnose([str(run)], str(lock), str(ROOT / "recipes" / "bench" / "bench-te-mid2-auto.yaml"))
    assert "host_factor_fitted" not in rep["breakdown"]


def test_with_a_trace_the_split_is_the_traces_and_the_fitted_host_only_ranks_the_changes(tmp_path):
    """The same run traced (recorded on the 2x H200 host, benchmarks/results/issue20-h200x2-2026-11-27):
    the wall and shares come from the trace; the changes are ranked at the host factor fitted to the
    measured step, so a larger micro-batch is predicted +42 % (measured there: +41 % and +29 % in two
    rounds), where the DGX-host model had said +9.8 %."""
    run = tmp_path / "run"
    run.mkdir()
    shutil_src = ROOT / "benchmarks" / "results" / "issue20-h200x2-2026-11-27" / "ab" / "auto-1.jsonl"
    (run / "m.jsonl").write_bytes(shutil_src.read_bytes())
    _trace(run)
    lock = ROOT / "generated" / "bench-te-mid2-auto" / "mocompile.lock.json"
    rep = diagnose.diagnose([str(run)], str(lock), str(ROOT / "recipes" / "bench" / "bench-te-mid2-auto.yaml"))
    assert rep["breakdown"]["source"].startswith("profiler trace") and "model_ms" not in rep["breakdown"]
    assert 4 < rep["breakdown"]["host_factor_fitted"] < 12
    top = rep["proposals"][0]
    assert top["set"] == "training.micro_batch_size=4" and top["predicted_gain"] > 0.25
    assert "changes ranked at host_factor" in diagnose.text(rep)


def test_profiled_iterations_are_not_the_runs_step_time(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"iteration": i, "step_ms": 5000.0 if 20 <= i < 23 else 100.0 + i} for i in range(1, 25)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lock = json.loads((H200X4 / "grid-A.lock.json").read_text())  # profile_step_start 20, profile_step_end 23
    assert diagnose.profiled_iterations(lock) == {20, 21, 22}
    b = diagnose.breakdown(diagnose.find([str(run)], str(H200X4 / "grid-A.lock.json")))
    kept = [100.0 + i for i in range(diagnose.WARMUP_STEPS + 1, 25) if i not in (20, 21, 22)]
    assert b["steps"] == len(kept) and b["measured_step_ms"] == statistics.median(kept)
    lock["settings"]["use_pytorch_profiler"]["value"] = False  # no profiler: every step counts
    assert diagnose.profiled_iterations(lock) == set() and diagnose.profiled_iterations(None) == set()


def test_the_recorded_4_gpu_auto_run_is_host_bound_by_its_own_trace(tmp_path):
    """Issue 20's acceptance run: the auto plan of the mid TE model on 4x H200, traced at iterations 20-22
    (the trace kept to its kernels and step markers: the breakdown is the full trace's, see the README there)."""
    run = tmp_path / "A-1"
    (run / "torch_profile").mkdir(parents=True)
    shutil.copy(H200X4 / "grid" / "A-1.jsonl", run / "metrics.jsonl")
    shutil.copy(H200X4 / "trace-A-1-slim.json.gz", run / "torch_profile" / "rank-0.json.gz")
    report = diagnose.diagnose([str(run)], str(H200X4 / "grid-A.lock.json"), str(MID),
                               ["hardware.cluster=../../clusters/probed-h200x4.yaml"])
    t = trace_report.summarize(trace_report.load(H200X4 / "trace-A-1-slim.json.gz"))["median"]
    b = report["breakdown"]
    assert b["trace_ms"] == t and round(t["idle_ms"] / t["wall_ms"], 3) == 0.778
    assert report["wall"] == "host" and report["shares"]["host"] == 0.778  # the idle share the trace shows
    rows = [json.loads(line) for line in (H200X4 / "grid" / "A-1.jsonl").read_text().splitlines()]
    steady = [r["step_ms"] for r in rows if diagnose.WARMUP_STEPS < r["iteration"] and r["iteration"] not in (20, 21, 22)]
    assert b["measured_step_ms"] == round(statistics.median(steady), 1) and b["steps"] == len(steady)
    # the first cure for a launch-bound step, ranked by the probed profile's host factor
    assert report["proposals"][0]["set"] == "training.micro_batch_size=4"
    assert report["proposals"][0]["predicted_gain"] > 0.3
