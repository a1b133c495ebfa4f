"""The two-slot scheduler of issue 22's grid (benchmarks/gpu/issue22_slots.py) and its report
(slots_report.py): fake launchers that sleep and write metrics stand in for training, so what is
checked is the scheduling contract a timing grid relies on, and the report's ranking rule."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GPU = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu"
sys.path.insert(0, str(GPU))

import issue22_slots as slots  # noqa: E402
import slots_report  # noqa: E402

FAKE = """\
sleep {sleep}
for i in 1 2 3 4 5 6 7 8; do echo "{{\\"iteration\\": $i, \\"step_ms\\": {ms}, \\"loss\\": 2.5}}" >> "$MOCOMPILE_METRICS"; done
mkdir -p "$MOCOMPILE_BENCH_RANKSTATS"
echo '{{"max_memory_allocated": {peak}}}' > "$MOCOMPILE_BENCH_RANKSTATS/rank0.json"
echo "GPUS=$CUDA_VISIBLE_DEVICES PORT=$MASTER_PORT"
exit {rc}
"""


def _gen(tmp: Path, name: str, sleep: float = 0.3, ms: int = 500, rc: int = 0, peak: int = 2**30) -> str:
    d = tmp / "gen" / name
    d.mkdir(parents=True)
    (d / "torchrun.sh").write_text(FAKE.format(sleep=sleep, ms=ms, rc=rc, peak=peak))
    return str(d)


def _run(tmp: Path, jobs: list[dict], deadline_s: float = 60, done: Path | None = None) -> list[dict]:
    (tmp / "jobs.json").write_text(json.dumps(jobs))
    argv = [str(tmp / "jobs.json"), "--work", str(tmp / "w"), "--deadline", str(__import__("time").time() + deadline_s)]
    if done:
        argv += ["--done", str(done)]
    assert slots.main(argv) == 0
    runs = tmp / "w" / "runs.jsonl"
    return [json.loads(x) for x in runs.read_text().splitlines()] if runs.exists() else []


def _overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_two_gpu_jobs_share_the_host_and_a_four_gpu_job_runs_alone(tmp_path: Path) -> None:
    jobs = [{"tag": "a", "gen": _gen(tmp_path, "a"), "gpus": 2}, {"tag": "b", "gen": _gen(tmp_path, "b"), "gpus": 2},
            {"tag": "pp", "gen": _gen(tmp_path, "pp"), "gpus": 4}, {"tag": "c", "gen": _gen(tmp_path, "c"), "gpus": 2}]
    runs = {r["tag"]: r for r in _run(tmp_path, jobs)}
    assert set(runs) == {"a", "b", "pp", "c"}
    # the two 2-GPU jobs ran side by side on disjoint GPUs, each naming the other
    assert _overlap(runs["a"], runs["b"]) and {runs["a"]["gpus"], runs["b"]["gpus"]} == {"0,1", "2,3"}
    assert runs["a"]["overlapped"] == ["b"]
    # the 4-GPU job waited for both slots and had the host to itself; c did not jump the queue past it
    assert runs["pp"]["gpus"] == "0,1,2,3" and runs["pp"]["overlapped"] == []
    assert not any(_overlap(runs["pp"], runs[t]) for t in "abc")
    assert runs["c"]["start"] >= runs["pp"]["end"]
    assert runs["a"]["median_step_ms"] == 500 and runs["a"]["peak_allocated_gib"] == 1.0


def test_jobs_of_one_group_never_run_together(tmp_path: Path) -> None:
    """HybridEP JIT-compiles into one cache: two HybridEP jobs must not overlap, others fill the slot."""
    jobs = [{"tag": "h1", "gen": _gen(tmp_path, "h1"), "gpus": 2, "group": "hybridep"},
            {"tag": "h2", "gen": _gen(tmp_path, "h2"), "gpus": 2, "group": "hybridep"},
            {"tag": "x", "gen": _gen(tmp_path, "x"), "gpus": 2}]
    runs = {r["tag"]: r for r in _run(tmp_path, jobs)}
    assert not _overlap(runs["h1"], runs["h2"])
    assert _overlap(runs["h1"], runs["x"])  # x took the free slot beside h1


def test_no_job_starts_after_the_deadline_and_done_jobs_are_skipped(tmp_path: Path) -> None:
    done = tmp_path / "done"
    done.mkdir()
    (done / "a.jsonl").write_text('{"iteration": 1, "step_ms": 1}\n')
    jobs = [{"tag": "a", "gen": _gen(tmp_path, "a"), "gpus": 2}, {"tag": "b", "gen": _gen(tmp_path, "b"), "gpus": 2}]
    assert [r["tag"] for r in _run(tmp_path, jobs, done=done)] == ["b"]
    (tmp_path / "late").mkdir()
    assert _run(tmp_path / "late", [{"tag": "z", "gen": _gen(tmp_path, "z"), "gpus": 2}], deadline_s=-1) == []


def test_a_failed_run_is_recorded_without_metrics(tmp_path: Path) -> None:
    runs = _run(tmp_path, [{"tag": "bad", "gen": _gen(tmp_path, "bad", rc=3), "gpus": 2}])
    assert runs[0]["rc"] == 3 and runs[0]["median_step_ms"] is not None
    assert not (tmp_path / "w" / "bad.jsonl").exists()  # a failed run is not "done": a later call reruns it


def test_ports_are_free_and_outside_the_ephemeral_range() -> None:
    ports = {slots._free_port() for _ in range(20)}
    assert all(20000 <= p < 32768 for p in ports)


def _result(root: Path, tag: str, medians: list[float], peak_gib: float = 30.0, slot: str = "A") -> None:
    rows = [{"iteration": i, "step_ms": 9999.0, "loss": 3.0} for i in range(1, 6)]  # warm-up, left out
    rows += [{"iteration": 6 + j, "step_ms": m, "loss": 3.0} for j, m in enumerate(medians)]
    (root / f"{tag}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / f"{tag}-rank0.json").write_text(json.dumps({"max_memory_allocated": int(peak_gib * 2**30)}))
    with open(root / "runs.jsonl", "a") as f:
        f.write(json.dumps({"tag": tag, "rc": 0, "slot": slot, "gpus": "0,1", "overlapped": [], "start": 0, "end": 1})
                + "\n")


def _lock(root: Path, plan: str, **settings: object) -> None:
    base = {"memory_estimate_gib": 33.0, "global_batch_size": 16, "seq_length": 2048, "dispatcher": "alltoall"}
    base.update(settings)
    (root / f"lock-i22-{plan}.json").write_text(json.dumps({"settings": {k: {"value": v} for k, v in base.items()}}))


def test_report_ranks_only_plans_whose_ranges_do_not_overlap(tmp_path: Path) -> None:
    # fast: run medians 600, 610, 620; slow: 700, 720, 710 -> apart (620 < 700); mid: 615-705 overlaps both
    for k, m in enumerate([600, 610, 620], 1):
        _result(tmp_path, f"time-fast-r{k}", [m] * 4)
    for k, m in enumerate([700, 720, 710], 1):
        _result(tmp_path, f"time-slow-r{k}", [m] * 4)
    for k, m in enumerate([615, 705], 1):
        _result(tmp_path, f"time-mid-r{k}", [m] * 4)
    for p in ("fast", "slow", "mid"):
        _lock(tmp_path, p, dispatcher=p)
    _lock(tmp_path, "auto", dispatcher="slow")
    res = slots_report.summarise(tmp_path, auto="slow", skip_first=5)
    plans = res["plans"]
    assert plans["fast"]["faster_than"] == ["slow"]
    assert plans["mid"]["faster_than"] == [] and plans["slow"]["faster_than"] == []
    assert plans["fast"]["median_ms"] == 610 and (plans["fast"]["lo_ms"], plans["fast"]["hi_ms"]) == (600, 620)
    # 16 x 2048 tokens per 0.61 s step
    assert plans["fast"]["tokens_per_s"] == pytest.approx(16 * 2048 / 0.61)
    # estimate 33.0 against 30.0 measured: +10 %
    assert plans["fast"]["memory_error"] == pytest.approx(0.1)
    auto = res["auto"]
    assert auto["settings_differing_from_auto_lock"] == [] and auto["best"] == "fast"
    assert auto["gap_vs_best"] == pytest.approx(710 / 610 - 1) and auto["best_distinguishable"] is True


def test_report_says_when_the_auto_lock_is_not_the_named_plan(tmp_path: Path) -> None:
    for k, m in enumerate([600, 610], 1):
        _result(tmp_path, f"time-a-r{k}", [m] * 4)
    _lock(tmp_path, "a", dispatcher="alltoall")
    _lock(tmp_path, "auto", dispatcher="flex")
    assert slots_report.summarise(tmp_path, auto="a", skip_first=5)["auto"]["settings_differing_from_auto_lock"] == [
        "dispatcher"]


def test_the_plot_is_written_where_matplotlib_is_and_said_missing_where_it_is_not(tmp_path: Path) -> None:
    for k, m in enumerate([600, 610], 1):
        _result(tmp_path, f"time-a-r{k}", [m] * 4)
    _lock(tmp_path, "a")
    res = slots_report.summarise(tmp_path, auto=None, skip_first=5)
    said = slots_report.plot(res, tmp_path / "grid.png")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib missing" in said and not (tmp_path / "grid.png").exists()
    else:
        assert (tmp_path / "grid.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_job_that_needs_a_build_waits_for_it_and_others_go_first(tmp_path: Path) -> None:
    """DeepEP builds beside the first runs: a flex job waits for the build's rc file, jobs behind it
    that need nothing take the free slot meanwhile, and it starts once the file says rc=0."""
    rc_file = tmp_path / "deepep-build.rc"
    builder = _gen(tmp_path, "build", sleep=0.8)
    Path(builder, "torchrun.sh").write_text(Path(builder, "torchrun.sh").read_text().replace(
        "exit 0", f"echo rc=0 > {rc_file}\nexit 0"))
    jobs = [{"tag": "build", "gen": builder, "gpus": 2},
            {"tag": "flex", "gen": _gen(tmp_path, "flex"), "gpus": 2, "needs": str(rc_file)},
            {"tag": "a2a", "gen": _gen(tmp_path, "a2a"), "gpus": 2}]
    runs = {r["tag"]: r for r in _run(tmp_path, jobs)}
    assert set(runs) == {"build", "flex", "a2a"}
    assert runs["flex"]["start"] >= runs["build"]["end"]  # not before the file existed
    assert runs["a2a"]["start"] < runs["build"]["end"]  # jumped the waiting flex job into the free slot


def test_a_job_whose_build_failed_is_dropped_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc_file = tmp_path / "deepep-build.rc"
    rc_file.write_text("rc=124\n")
    jobs = [{"tag": "flex", "gen": _gen(tmp_path, "flex"), "gpus": 2, "needs": str(rc_file)},
            {"tag": "a2a", "gen": _gen(tmp_path, "a2a"), "gpus": 2}]
    assert [r["tag"] for r in _run(tmp_path, jobs)] == ["a2a"]
    assert "flex dropped" in capsys.readouterr().out and "rc=124" in Path(rc_file).read_text()


def test_det_report_names_the_first_iteration_that_differs(tmp_path: Path) -> None:
    """Bit equality is per iteration: a run equal at the last iteration only is not equal."""
    import det_report

    def write(name: str, losses: list[float]) -> Path:
        p = tmp_path / "call" / f"{name}.jsonl"
        p.parent.mkdir(exist_ok=True)
        p.write_text("".join(json.dumps({"iteration": i + 1, "loss": x}) + "\n" for i, x in enumerate(losses)))
        return p

    ref = write("det-a", [10.0, 9.0, 8.0])
    same = write("det-b", [10.0, 9.0, 8.0])
    drift = write("det-c", [10.0, 9.000009, 8.0])
    assert det_report.compare(det_report.losses(ref), det_report.losses(same)) == {
        "iterations": 3, "equal": 3, "first_diff": None, "max_rel_gap": 0.0}
    c = det_report.compare(det_report.losses(ref), det_report.losses(drift))
    assert c["equal"] == 2 and c["first_diff"] == 2 and abs(c["max_rel_gap"] - 1e-6) < 1e-9
    table = det_report.report(ref, [same, drift])
    assert "| `call/det-b` | 3/3 | - |" in table and "| `call/det-c` | 2/3 | 2 |" in table
