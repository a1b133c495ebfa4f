"""`mocompile probe` and `mocompile tune`: the measure loop, on recorded and hand-built runs (CPU).

The launcher is stood in for by a function with the launcher's contract (run ``torchrun.sh`` with
MOCOMPILE_METRICS set, write one JSON line per step there, return the exit code), which reads the plan
it was asked to run from the lock ``compile`` wrote beside the script. Everything else is real: the
probe intent and every tuned plan compile through the real pipeline into real generated folders, the
profile is read back by the real cluster reader, the recipe edit is re-analysed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, tune_project
from mocompile import cluster, measure, probe, steptime, tune
from mocompile.errors import UsageError
from mocompile.pipeline import analyse


def _project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text("")
    return tmp_path


def _metrics(path: str, ms: float, iterations: int = 25, jitter: float = 0.0) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(1, iterations + 1):
            fh.write(json.dumps({"iteration": i, "step_ms": ms * (1 + jitter * ((i % 3) - 1))}) + "\n")


def _python(tmp_path: Path, env: dict | None = None) -> str:
    """A stand-in for the target's Python: answers the probe's import question like a GPU host would."""
    report = env or {"torch": "2.11.0", "cuda_available": True, "device_count": 2, "device_name": "NVIDIA H100",
                     "transformer_engine": None, "deep_ep": None, "hybrid_ep": False,
                     "megatron_core": "0.19.2", "megatron_bridge": "0.6.2"}
    path = tmp_path / "python-standin"
    path.write_text("#!/bin/sh\necho 'MOCOMPILE_PROBE_ENV " + json.dumps(report) + "'\n")
    path.chmod(0o755)
    return str(path)


def kernel_result(gemm_share: float | None = None, a2a_gbps: float | None = None, ranks: int = 2) -> dict:
    """What train.py's kernel probe writes on an H100 node (989 TFLOP/s BF16, 450 GB/s NVLink): the reference
    GEMM at ``gemm_share`` of the peak; all-to-all at 20 us + the bytes each rank sends to the others over
    ``a2a_gbps``. By default both at 0.9 of the references (data/steptime.yaml probe_reference_*): the worked
    answer is gemm_scale 0.9 and a2a_scale 0.9."""
    c = steptime.constants()
    gemm_share = 0.9 * c["probe_reference_gemm_share"] if gemm_share is None else gemm_share
    a2a_gbps = 0.9 * c["probe_reference_a2a_share"] * 450 if a2a_gbps is None else a2a_gbps
    n = 8192
    us = 2.0 * n ** 3 / (gemm_share * 989e12) * 1e6
    points = [{"bytes": b, "us": 20.0 + b * (ranks - 1) / ranks / (a2a_gbps * 1e9) * 1e6}
              for b in (2 ** p for p in range(16, 29, 2))]
    return {"device_name": "NVIDIA H100 80GB HBM3", "world": ranks, "per_node": ranks, "torch": "2.11.0",
            "nccl": "2.27.3", "launch_us": 6.5,
            "gemm": [{"what": "reference", "m": n, "n": n, "k": n, "us": us, "tflops": 2.0 * n ** 3 / us / 1e6},
                     {"what": "expert fc1", "m": 512, "n": 1024, "k": 1024, "us": 9.0, "tflops": 119.3}],
            "all_to_all": {"nccl_intra_node": points, "nccl_world": None}}


def _settings(script: str) -> dict:
    lock = json.loads(Path(script).with_name("mocompile.lock.json").read_text())
    return {k: v["value"] for k, v in lock["settings"].items()}


# ---------------------------------------------------------------- measuring one run
def test_steady_steps_leave_out_the_warm_up_and_torn_lines(tmp_path):
    p = tmp_path / "m.jsonl"
    rows = [{"iteration": i, "step_ms": 1000.0 if i <= 5 else 100.0 + i} for i in range(1, 9)]
    p.write_text("\n".join(json.dumps(r) for r in rows) + '\n{"iteration": 9, "step_')  # killed mid-line
    assert measure.steady_ms(measure.read_metrics(str(p))) == [106.0, 107.0, 108.0]  # iterations 6-8 only
    assert measure.spread([90.0, 100.0, 110.0]) == pytest.approx(0.2)  # (max - min) / median
    assert measure.spread([100.0]) == 0.0


# ---------------------------------------------------------------- probe
def test_probe_recovers_the_host_factor_that_produced_its_step_times(tmp_path):
    """Worked answer: step times the model predicts at host_factor 3.0 for the probe plan, recorded as three
    runs (+-2 % jitter), fit back to 3.0 within 2 %; the profile is read by the real cluster reader."""
    root = _project(tmp_path)
    work = root / ".mocompile" / "probe"
    work.mkdir(parents=True)
    (work / "probe.yaml").write_text(json.dumps(probe.intent("h100", 4, "2.12.0")))
    truth = probe.predictor(str(work), str(work / "probe.yaml"))(3.0) * 1000
    runs = root / "recorded"
    runs.mkdir()
    for i, scale in enumerate((0.98, 1.0, 1.02), 1):
        _metrics(str(runs / f"probe-{i}.jsonl"), truth * scale, jitter=0.01)
    (runs / "environment.json").write_text(json.dumps({"torch": "2.11.0", "transformer_engine": "2.12.0",
                                                       "deep_ep": None, "hybrid_ep": False, "device_name": "H100",
                                                       "missing": ["deep_ep", "hybrid_ep"]}))
    out = root / "clusters" / "mine.yaml"
    rep = probe.probe(str(out), "h100", 4, from_runs=str(runs), quiet=True)
    assert rep["host_factor"] == pytest.approx(3.0, rel=0.02)
    assert rep["predicted_dgx_ms"] < rep["measured_ms"]  # the same plan is faster on a DGX-class host
    # the profile is a valid cluster profile, and the same plan predicts the measured median with it
    (work / "probe.yaml").write_text(json.dumps(dict(probe.intent("h100", 4, "2.12.0"),
                                                     hardware={"gpu": "h100", "nodes": 1, "gpus_per_node": 4,
                                                               "cluster": "../../clusters/mine.yaml"})))
    plan = analyse(str(work / "probe.yaml")).plan
    assert plan.hardware["cluster"]["host_factor"] == rep["host_factor"]
    # the launchers time train_step alone, so the measured median matches the step less the scheduled collection
    assert plan.planner["chosen"]["train_step_s"] * 1000 == pytest.approx(rep["measured_ms"], rel=0.01)
    text = out.read_text()
    assert '"deep_ep", "hybrid_ep"' in text and "not_measured" in text  # missing pieces are named, not guessed


def test_probe_through_the_launcher_contract_writes_nothing_when_no_run_produced_steps(tmp_path):
    root = _project(tmp_path)
    out = root / "clusters" / "mine.yaml"
    out.parent.mkdir()
    out.write_text("schema: 1\nhost_factor: 2.0\n")  # an earlier profile: must survive a failed probe

    def crashes(script, env, log, timeout):
        Path(log).write_text("CUDA error: no kernel image\n")
        return 1

    with pytest.raises(UsageError, match="no probe run produced step times"):
        probe.probe(str(out), "h100", 2, launcher=crashes, quiet=True, python=_python(tmp_path))
    assert out.read_text() == "schema: 1\nhost_factor: 2.0\n"


def test_probe_runs_the_generated_launcher_of_a_compiled_probe_plan(tmp_path):
    root = _project(tmp_path)
    seen = []

    def launcher(script, env, log, timeout):
        seen.append((script, _settings(script)))
        if "MOCOMPILE_PROBE_KERNELS" in env:  # train.py measures kernels instead of training
            Path(env["MOCOMPILE_PROBE_KERNELS"]).write_text(json.dumps(kernel_result()))
        else:
            _metrics(env["MOCOMPILE_METRICS"], 500.0)
        return 0

    rep = probe.probe(str(root / "clusters" / "c.yaml"), "h100", 2, repeats=2, launcher=launcher, quiet=True,
                      python=_python(tmp_path))
    # two timed runs, then the same launcher once more for the kernels: all through the generated torchrun.sh
    assert len(seen) == 3 and all(s.endswith("generated/mocompile-probe/torchrun.sh") for s, _ in seen)
    assert rep["kernels"]["gemm_scale"] == pytest.approx(0.9) and rep["kernels"]["a2a_scale"] == pytest.approx(0.9)
    assert rep["not_measured"] == ["all_to_all_across_nodes", "deepep_hybridep_all_to_all"]
    s = seen[0][1]
    assert (s["expert_model_parallel_size"], s["moe_token_dispatcher_type"], s["cuda_graph_impl"]) == (2, "alltoall", "none")
    assert rep["measured_ms"] == 500.0 and 0.1 <= rep["host_factor"] <= 100
    # no TE there: the probe plan is compiled for Megatron's local layer spec, and what is missing is named
    assert rep["environment"]["missing"] == ["transformer_engine", "deep_ep", "apex", "hybrid_ep"]
    assert s["gradient_accumulation_fusion"] is False  # no Apex there: the fused wgrad kernel is not asked for
    assert json.loads(Path(seen[0][0]).with_name("mocompile.lock.json").read_text())["versions"][
        "transformer_engine"] is None


def test_probe_records_what_does_not_import_as_missing(tmp_path):
    assert probe.environment("/nonexistent/python")["missing"] == ["python"]
    bare = _python(tmp_path, {"torch": None, "transformer_engine": None, "deep_ep": None, "hybrid_ep": False})
    assert probe.environment(bare)["missing"] == ["torch", "transformer_engine", "deep_ep", "apex", "megatron_core",
                                                  "megatron_bridge", "hybrid_ep", "gpu"]


def test_fit_stops_at_the_bounds_and_says_so():
    assert probe.fit_host_factor(0.001, lambda h: 0.1 + h)[0] == 0.1
    factor, note = probe.fit_host_factor(1000.0, lambda h: 0.1 + h)
    assert factor == 100.0 and "highest host factor" in note
    assert probe.fit_host_factor(5.1, lambda h: 0.1 + h)[0] == pytest.approx(5.0, rel=1e-3)


# ---------------------------------------------------------------- the halving schedule
def _race(times: dict[str, float], repeats: int = 3, fail: set[str] = frozenset()) -> tuple[list[str], dict]:
    order, runs, calls = list(times), {}, []
    while (p := tune.next_run(order, runs, repeats)) is not None:
        calls.append(p)
        runs.setdefault(p, []).append(None if p in fail else times[p])
    return calls, runs


def test_halving_runs_everyone_once_then_the_faster_half_until_two_have_three_runs():
    """Worked answer: four plans at 100/90/120/95 ms. Rung 0 runs all four; c2 and c4 (the faster half) run
    again; the last two run to three runs each; c2 wins. 8 runs, not 12."""
    calls, runs = _race({"c1": 100, "c2": 90, "c3": 120, "c4": 95})
    assert calls == ["c1", "c2", "c3", "c4", "c2", "c4", "c2", "c4"]
    assert tune.winner(list(runs), runs) == "c2"
    assert tune._planned_runs(4, 3) == 8


def test_halving_keeps_the_last_pair_and_drops_a_failed_plan_at_once():
    calls, runs = _race({"c1": 100, "c2": 90, "c3": 95}, fail={"c2"})
    assert calls.count("c2") == 1  # failed (e.g. out of memory): never run again, never the winner
    assert calls.count("c1") == 3 and calls.count("c3") == 3
    assert tune.winner(["c1", "c2", "c3"], runs) == "c3"
    calls, runs = _race({"c1": 100, "c2": 90}, fail={"c1", "c2"})
    assert calls == ["c1", "c2"] and tune.winner(["c1", "c2"], runs) is None
    calls, _ = _race({"c1": 100}, repeats=2)
    assert calls == ["c1", "c1"]


def test_six_plans_take_eleven_runs():
    calls, runs = _race({f"c{i}": 100 + i for i in range(1, 7)})
    assert len(calls) == 11 and tune.winner(list(runs), runs) == "c1"


# ---------------------------------------------------------------- tune end to end (launcher stood in for)
def _cluster_time(script: str) -> float:
    """A made-up cluster where the flex dispatchers win by 10 % and CUDA graphs cost 5 %."""
    s = _settings(script)
    return 700.0 * (0.9 if s["moe_token_dispatcher_type"] == "flex" else 1.0) * \
        (1.05 if s.get("cuda_graph_impl", "none") != "none" else 1.0)


def test_tune_measures_the_close_plans_records_them_and_pins_the_winner_only_with_write(tmp_path):
    recipe = tune_project(tmp_path)
    before = recipe.read_text()
    calls = []

    def launcher(script, env, log, timeout):
        calls.append(Path(script).parent.name)
        _metrics(env["MOCOMPILE_METRICS"], _cluster_time(script), iterations=20)
        return 0

    rep = tune.tune(str(recipe), launcher=launcher, quiet=True)
    tune.finish(rep, str(recipe), [], write=False)
    assert recipe.read_text() == before  # never edited without --write
    assert len(calls) == tune._planned_runs(len(rep["plans"]), 3)
    band = rep["band"]
    predicted = [r["predicted_ms"] for r in rep["plans"]]
    assert max(predicted) <= min(predicted) * (1 + band) + 1  # only plans the model cannot separate
    assert rep["plans"][0]["chosen_by_model"]
    best = min((r for r in rep["plans"] if r["measured_ms"]), key=lambda r: r["measured_ms"])
    assert best["winner"] and "deepep" in best["plan"] or "hybridep" in best["plan"]
    # the profile gained one entry per measured plan and still reads as a profile
    prof = recipe.parent.parent / "clusters" / "lent-h100x4.yaml"
    assert rep["profile_entries_added"] == sum(1 for r in rep["plans"] if r["measured_ms"])
    assert "host_factor: 5.18" in prof.read_text() and "# The 4x H100" in prof.read_text()  # comments kept
    assert analyse(str(recipe)).plan.hardware["cluster"]["host_factor"] == 5.18
    # the lock and explain say what was measured there for this recipe (and only for it)
    seen = analyse(str(recipe)).plan.hardware["cluster"]["measured"]
    assert sorted(e["plan"] for e in seen) == sorted(r["plan"] for r in rep["plans"] if r["measured_ms"])
    assert all(e["median_ms"] == round(e["median_ms"], 1) for e in seen)
    other = recipe.parent / "other.yaml"
    other.write_text(recipe.read_text().replace("name: bench-te-mid-auto", "name: other"))
    assert analyse(str(other)).plan.hardware["cluster"]["measured"] == []
    shown = run_cli("explain", str(recipe)).stdout
    assert "cluster profile ../clusters/lent-h100x4.yaml (lent-h100x4): host_factor 5.18" in shown
    assert shown.count("  measured  TP1") == len(seen)
    # --write pins the winner: the recipe then compiles to exactly that plan
    tune.finish(rep, str(recipe), [], write=True)
    assert "# Transformer Engine grid" in recipe.read_text()  # the user's comments survive the edit
    assert analyse(str(recipe)).plan.planner["chosen"]["plan"] == best["plan"]


def test_tune_resumes_after_an_interruption_without_repeating_finished_runs(tmp_path):
    recipe = tune_project(tmp_path)
    calls = []

    def launcher(script, env, log, timeout):
        if len(calls) == 3:
            calls.append("interrupted")
            raise KeyboardInterrupt
        calls.append(Path(script).parent.name)
        _metrics(env["MOCOMPILE_METRICS"], _cluster_time(script), iterations=20)
        return 0

    with pytest.raises(KeyboardInterrupt):
        tune.tune(str(recipe), launcher=launcher, quiet=True)
    first = len(calls) - 1
    rep = tune.tune(str(recipe), launcher=launcher, quiet=True)
    assert rep["resumed"] and first == 3
    assert len(calls) - 1 == tune._planned_runs(len(rep["plans"]), 3)  # 3 before, the rest after, none twice
    # another option starts afresh
    rep2 = tune.tune(str(recipe), launcher=launcher, quiet=True, repeats=2)
    assert not rep2["resumed"]
    # the profile's measured list grew (tune recorded rep2), which alone does not restart a resume ...
    tune.finish(rep2, str(recipe), [], write=False)
    assert tune.tune(str(recipe), launcher=launcher, quiet=True, repeats=2)["resumed"]
    # ... but a re-probed cluster (another host factor) plans differently: start afresh
    prof = recipe.parent.parent / "clusters" / "lent-h100x4.yaml"
    prof.write_text(prof.read_text().replace("host_factor: 5.18", "host_factor: 6.5"))
    assert not tune.tune(str(recipe), launcher=launcher, quiet=True, repeats=2)["resumed"]


def test_a_plan_that_fails_on_the_cluster_is_dropped_and_named(tmp_path):
    recipe = tune_project(tmp_path)

    def launcher(script, env, log, timeout):
        if _settings(script)["moe_token_dispatcher_type"] == "flex":
            Path(log).write_text("RUN003 deep_ep does not import\n")
            return 3  # the preflight stops a dispatcher that does not import there
        _metrics(env["MOCOMPILE_METRICS"], _cluster_time(script), iterations=20)
        return 0

    rep = tune.tune(str(recipe), launcher=launcher, quiet=True)
    flex = [r for r in rep["plans"] if "deepep" in r["plan"] or "hybridep" in r["plan"]]
    assert flex and all(r["runs"] == [None] and r["errors"] and not r["winner"] for r in flex)
    assert "alltoall" in rep["winner_plan"]


# ---------------------------------------------------------------- the command line
@pytest.mark.parametrize("args,needle", [
    (["tune", "missing.yaml"], "no such recipe"),
    (["tune", "recipes/tiny-moe-h100x2.yaml", "--band", "2"], "--band"),
    (["tune", "recipes/tiny-moe-h100x2.yaml", "--iterations", "3"], "--iterations"),
    (["probe", "-o", "clusters/x.yaml", "--gpu", "h100", "--gpus-per-node", "0"], "--gpus-per-node"),
    (["probe", "-o", "clusters/x.yaml", "--gpu", "h100"], "--gpus-per-node"),
    (["probe", "-o", "clusters/x.yaml", "--gpu", "h100", "--gpus-per-node", "2", "--from-runs", "nowhere"],
     "no such folder"),
])
def test_bad_options_exit_2_with_a_message_and_no_traceback(args, needle):
    proc = run_cli(*args)
    assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr


def test_a_profile_with_a_malformed_measured_list_is_refused_with_its_position(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "c.yaml").write_text("schema: 1\nhost_factor: 2\nmeasured: {a: 1}\n")
    (tmp_path / "r.yaml").write_text("schema: 1\nmodel: tiny-moe\nhardware: {gpu: h100, gpus_per_node: 2, "
                                     "cluster: c.yaml}\ngoal: bring-up\n")
    proc = run_cli("lint", str(tmp_path / "r.yaml"))
    assert proc.returncode == 2 and "c.yaml:3:" in proc.stdout + proc.stderr and "`measured` must be a list" in \
        proc.stdout + proc.stderr
    assert cluster.KEYS["probe"]


def test_tune_skips_plans_whose_dispatcher_the_probe_found_missing(tmp_path):
    recipe = tune_project(tmp_path)
    prof = recipe.parent.parent / "clusters" / "lent-h100x4.yaml"
    prof.write_text(prof.read_text() + 'probe:\n  missing: ["deep_ep", "hybrid_ep"]\n')
    plans, _ = tune.candidates(str(recipe), [], None, 8)
    assert plans and all(p["pins"]["moe.dispatcher"] == "alltoall" for p in plans)
    prof.write_text(prof.read_text().replace('["deep_ep", "hybrid_ep"]', '["hybrid_ep"]'))
    assert {p["pins"]["moe.dispatcher"] for p in tune.candidates(str(recipe), [], None, 8)[0]} == {"alltoall", "deepep"}


MID = ROOT / "recipes" / "bench" / "bench-te-mid-auto.yaml"
ON_4XH200 = "hardware.cluster=../../clusters/probed-h200x4.yaml"  # probed on the 4x H200 host (issue 20's run)


def test_with_micro_batch_size_auto_tune_also_measures_the_sizes_the_model_cannot_separate():
    plans, band = tune.candidates(str(MID), [ON_4XH200, "training.micro_batch_size=auto"], None, 8)
    res = analyse(str(MID), [ON_4XH200, "training.micro_batch_size=auto"])
    chosen = res.plan["micro_batch_size"]
    # every plan names its micro-batch size, so a run compiles exactly the plan predicted (no second search)
    assert all("training.micro_batch_size" in p["pins"] for p in plans)
    assert plans[0]["chosen"] and plans[0]["pins"]["training.micro_batch_size"] == chosen
    assert all(p["plan"].endswith(f", MBS {p['pins']['training.micro_batch_size']}") for p in plans)
    sizes = {p["pins"]["training.micro_batch_size"] for p in plans}
    assert len(sizes) >= 2, plans  # 8 and 4 (0.489 s each with the documented defaults' plan) inside the 16 % band
    fastest = min(p["predicted_s"] for p in plans)
    assert all(p["predicted_s"] <= fastest * (1 + band) for p in plans)
    # the best plan of each other size is there, and none of a size predicted beyond the band (1 and 2)
    alts = {x["micro_batch_size"]: x for x in res.plan.planner["micro_batch"]}
    assert chosen not in alts and set(alts) | {chosen} == {1, 2, 4, 8}
    assert alts[2]["step_time_s"] > fastest * (1 + band) and 2 not in sizes


def test_with_a_pinned_micro_batch_size_tune_leaves_it_to_the_recipe():
    plans, _ = tune.candidates(str(MID), [ON_4XH200], None, 8)
    res = analyse(str(MID), [ON_4XH200])
    assert plans and not any("training.micro_batch_size" in p["pins"] for p in plans)
    assert "micro_batch" not in res.plan.planner and not any("MBS" in p["plan"] for p in plans)


def test_a_pinned_dispatcher_the_probe_found_missing_is_refused_at_the_pin(tmp_path):
    """CLU001: the launch would stop in preflight (RUN003); the compile says so first, at the user's pin."""
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "clusters").mkdir()
    shutil.copy(ROOT / "clusters" / "probed-h200x4.yaml", tmp_path / "clusters")  # deep_ep, hybrid_ep missing
    text = MID.read_text().replace("../../clusters/lent-h100x4.yaml", "clusters/probed-h200x4.yaml")
    (tmp_path / "r.yaml").write_text(text + "\n")
    for backend, package in (("deepep", "deep_ep"), ("hybridep", "hybrid_ep")):
        proc = run_cli("lint", str(tmp_path / "r.yaml"), "--set", f"moe.dispatcher={backend}")
        assert proc.returncode == 1 and "[CLU001]" in proc.stdout and f"needs {package}" in proc.stdout, proc.stdout
    assert run_cli("lint", str(tmp_path / "r.yaml"), "--set", "moe.dispatcher=alltoall").returncode == 0
    r = analyse(str(tmp_path / "r.yaml"))
    assert r.plan["cluster_missing"] == ["apex", "deep_ep", "hybrid_ep"]
    assert analyse(str(MID)).plan["cluster_missing"] == []  # lent-h100x4: not probed, nothing known missing
    assert analyse(str(ROOT / "recipes" / "tiny-moe-h100x2.yaml")).plan["cluster_missing"] is None  # no profile


def test_the_slurm_launcher_refuses_what_sbatch_cannot_carry_before_submitting(tmp_path):
    launch = measure.slurm_launcher()
    log = tmp_path / "run.log"
    gen = tmp_path / "gen"
    gen.mkdir()
    (gen / "torchrun.sh").write_text("")
    assert launch(str(gen / "torchrun.sh"), {"A": "1"}, str(log), 5) == 2  # a plan compiled without slurm
    assert "launch.targets lacks slurm" in log.read_text()
    (gen / "slurm.sbatch").write_text("#!/bin/bash\n")
    assert launch(str(gen / "torchrun.sh"), {"MOCOMPILE_METRICS": "/a,b"}, str(log), 5) == 2  # --export splits on ,
    assert "comma" in log.read_text()


def test_a_live_probe_records_its_environment_so_from_runs_on_its_folder_fits_the_same_profile(tmp_path):
    """2x H200, 2026-11-28: `--from-runs` on a live probe's own runs folder fitted host_factor 3.86 where the live
    probe had fitted 6.91, because the folder did not say Transformer Engine was there and the probe plan was
    compiled without it. The live probe now writes runs/environment.json beside the runs."""
    root = _project(tmp_path)

    def launcher(script, env, log, timeout):
        if "MOCOMPILE_PROBE_KERNELS" in env:
            Path(env["MOCOMPILE_PROBE_KERNELS"]).write_text(json.dumps(kernel_result()))
        else:
            _metrics(env["MOCOMPILE_METRICS"], 500.0)
        return 0

    with_te = _python(tmp_path, {"torch": "2.11.0", "cuda_available": True, "device_count": 2,
                                 "device_name": "NVIDIA H200", "transformer_engine": "2.12.0", "deep_ep": None,
                                 "hybrid_ep": False, "megatron_core": "0.19.2", "megatron_bridge": "0.6.2"})
    live = probe.probe(str(root / "clusters" / "live.yaml"), "h100", 2, repeats=2, launcher=launcher, quiet=True,
                       python=with_te)
    runs = root / ".mocompile" / "probe" / "runs"
    assert json.loads((runs / "environment.json").read_text())["transformer_engine"] == "2.12.0"
    again = probe.probe(str(root / "clusters" / "again.yaml"), "h100", 2, repeats=2, quiet=True, from_runs=str(runs))
    assert again["host_factor"] == live["host_factor"] and again["predicted_dgx_ms"] == live["predicted_dgx_ms"]
    # without the record the fit is different, and the profile says why rather than passing it off as the same
    (runs / "environment.json").unlink()
    blind = probe.probe(str(root / "clusters" / "blind.yaml"), "h100", 2, repeats=2, quiet=True, from_runs=str(runs))
    assert blind["predicted_dgx_ms"] != live["predicted_dgx_ms"]
    assert any("not recorded" in m and "host_factor" in m for m in blind["environment"]["missing"])


def test_the_probe_overlap_runs_recorded_on_a_2x_h200_host_fit_its_committed_profile(tmp_path):
    """The first GPU run of `probe --overlap` (benchmarks/results/issue22-probe-overlap-h200x2-2026-11-28): read
    back, its runs give the profile the host wrote. Overlap on measured x1.026 with the run medians' ranges
    overlapping (437.6-469.2 vs 454.8-520.5 ms), so the factor is left unset and the profile says why."""
    from conftest import ROOT
    folder = ROOT / "benchmarks" / "results" / "issue22-probe-overlap-h200x2-2026-11-28"
    root = _project(tmp_path)
    rep = probe.probe(str(root / "clusters" / "p.yaml"), "h200", 2, quiet=True, overlap=True,
                      from_runs=str(folder / "probe-runs"))
    assert rep["host_factor"] == 6.912 and rep["measured_ms"] == 468.7 and rep["predicted_dgx_ms"] == 117.0
    assert rep["overlap"]["measured_ratio"] == 1.026 and rep["overlap"]["factor"] is None
    assert "overlap" in rep["overlap"]["why"]
    committed = (folder / "probed-h200x2.yaml").read_text()
    assert "host_factor: 6.912" in committed and '"factor": null' in committed


def test_tune_adds_its_measurements_to_a_probe_written_profile_and_keeps_every_line_it_had(tmp_path):
    """The committed 2x H200 profile (written by ``probe``) gained the two tuned plans on a GPU host, and the
    round-trip edit re-indented its lists and spelled ``null`` as nothing; a user diffing the profile should see
    only the new entries."""
    prof = tmp_path / "probed.yaml"
    original = (ROOT / "clusters" / "probed-h200x2.yaml").read_text()
    prof.write_text(original)
    state = {"iterations": 20, "candidates": {"c1": {"pins": {"moe.overlap": False}}}}
    report_ = {"plans": [{"id": "c1", "plan": "TP1 PP1 EP2, alltoall, overlap off", "measured_ms": 846.88,
                          "runs": [846.88, 850.61, 581.85], "spread": 0.317, "predicted_ms": 914.0}]}
    assert tune.record(report_, state, str(prof), "bench-te-mid2-auto") == 1
    text = prof.read_text()
    assert text.startswith(original.rstrip("\n")), "a line the profile had was changed"
    assert "median_ms: 846.9" in text and "run_ms:" in text
    from ruamel.yaml import YAML

    assert YAML(typ="safe").load(text)["measured"][-1]["run_ms"] == [846.9, 850.6, 581.9]


@pytest.mark.parametrize("profile", ["lent-h200x2.yaml", "lent-h100x4.yaml"])
def test_tune_keeps_a_profile_s_own_list_layout(tmp_path, profile):
    """A profile laid out another way (lists at the key's own indent, or none yet) keeps its lines too."""
    prof = tmp_path / profile
    original = (ROOT / "clusters" / profile).read_text()
    prof.write_text(original)
    state = {"iterations": 20, "candidates": {"c1": {"pins": {"moe.overlap": True}}}}
    report_ = {"plans": [{"id": "c1", "plan": "TP1 PP1 EP2, alltoall, overlap on", "measured_ms": 884.0,
                          "runs": [884.0, 945.4, 775.9], "spread": 0.192, "predicted_ms": 986.0}]}
    assert tune.record(report_, state, str(prof), "bench-te-mid2-auto") == 1
    assert prof.read_text().startswith(original.rstrip("\n"))
