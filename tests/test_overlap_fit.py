"""A cluster's EP-overlap host cost, measured: `mocompile tune` fits ``overlap_host_factor`` from an overlap on/off
pair it measured apart, writes it into the cluster profile, and the planner then predicts with it.

Worked answers: run medians are made from the model's own predictions at a known factor, and the fit must give
that factor back; pairs inside each other's run-to-run range must leave the profile alone (the same rule the
race ranks by). Everything compiles through the real pipeline and the real cluster reader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli, tune_project
from mocompile import overlap_fit, tune
from mocompile.errors import InputError, UsageError
from mocompile.pipeline import analyse


def _profile(recipe: Path) -> Path:
    return recipe.parent.parent / "clusters" / "lent-h100x4.yaml"


def _pins(recipe: Path, overlap: bool) -> dict:
    pins = dict(analyse(str(recipe)).plan.planner["chosen"]["pins"])
    pins["moe.overlap"] = overlap
    return pins


def _predicted_s(recipe: Path, pins: dict, extra: list[str] | None = None) -> float:
    res = analyse(str(recipe), tune.pin_sets(pins) + (extra or []))
    assert not res.errors, [d.message for d in res.errors]
    return float(res.plan.planner["chosen"]["train_step_s"])  # what the launchers' step probe times


def _with_factor(recipe: Path, factor: float) -> list[str]:
    """A copy of the project's profile with ``overlap_host_factor`` set: the planner's view at that factor."""
    prof = _profile(recipe)
    trial = prof.with_name("trial.yaml")
    trial.write_text(prof.read_text() + f"overlap_host_factor: {factor}\n")
    return ["hardware.cluster=../clusters/trial.yaml"]


def _record(recipe: Path, entries: list[tuple[dict, list[float]]]) -> None:
    """Entries as `mocompile tune` records them (run_ms: the runs' medians), appended to the profile."""
    lines = ["measured:"]
    for pins, runs in entries:
        flow = ", ".join(f"{k}: {str(v).lower() if isinstance(v, bool) else v}" for k, v in pins.items()
                         if not isinstance(v, list))
        lines += ["- recipe: bench-te-mid-auto", f"  plan: \"overlap {pins['moe.overlap']}\"",
                  f"  median_ms: {sorted(runs)[len(runs) // 2]}", f"  runs: {len(runs)}",
                  f"  run_ms: {runs}", f"  pins: {{{flow}}}"]
    prof = _profile(recipe)
    prof.write_text(prof.read_text() + "\n".join(lines) + "\n")


def test_the_fit_gives_back_the_factor_the_runs_were_made_with(tmp_path):
    recipe = tune_project(tmp_path)
    off, on = _pins(recipe, False), _pins(recipe, True)
    # the measured cluster: the model's own steps at overlap_host_factor 1.6 (the calibrated one is 1.088)
    t_off = _predicted_s(recipe, off, _with_factor(recipe, 1.6)) * 1000
    t_on = _predicted_s(recipe, on, _with_factor(recipe, 1.6)) * 1000
    assert t_on > t_off * 1.05  # the factor matters for this plan: the test can tell a right fit from a wrong one
    _record(recipe, [(off, [t_off * 0.99, t_off, t_off * 1.01]), (on, [t_on * 0.99, t_on, t_on * 1.01])])
    got = overlap_fit.fit(str(_profile(recipe)), str(recipe), "bench-te-mid-auto", [], str(tmp_path / "work"))
    assert got["value"] == pytest.approx(1.6, rel=0.01) and got["pairs"][0]["measured_ratio"] == round(t_on / t_off, 3)
    overlap_fit.write(str(_profile(recipe)), got)
    text = _profile(recipe).read_text()
    assert "# The 4x H100" in text and "fitted by mocompile tune: overlap on/off measured x" in text  # comments kept
    # the planner now predicts the overlap plan at the measured cost, and the plain plan as before
    plan = analyse(str(recipe), tune.pin_sets(on)).plan
    assert plan.hardware["cluster"]["overlap_host_factor"] == got["value"]
    assert _predicted_s(recipe, on) * 1000 == pytest.approx(t_on, rel=0.01)
    assert _predicted_s(recipe, off) * 1000 == pytest.approx(t_off, rel=0.001)
    assert "overlap_host_factor 1.6" in run_cli("explain", str(recipe)).stdout


def test_a_pair_inside_its_own_run_to_run_range_leaves_the_constant(tmp_path):
    recipe = tune_project(tmp_path)
    before = _profile(recipe).read_text()
    # on's slowest run is above off's fastest ... but off's slowest (760) is above on's fastest (750): overlapping
    _record(recipe, [(_pins(recipe, False), [700.0, 720.0, 760.0]), (_pins(recipe, True), [750.0, 800.0, 820.0])])
    got = overlap_fit.fit(str(_profile(recipe)), str(recipe), "bench-te-mid-auto", [], str(tmp_path / "work"))
    assert got["value"] is None and "apart" in got["why"] and "noise" in got["pairs"][0]["why"]
    # touching ranges (off's slowest run = on's fastest) are not apart
    _profile(recipe).write_text(before)
    _record(recipe, [(_pins(recipe, False), [700.0, 720.0, 750.0]), (_pins(recipe, True), [750.0, 800.0, 820.0])])
    assert overlap_fit.fit(str(_profile(recipe)), str(recipe), "bench-te-mid-auto", [], str(tmp_path / "v"))["value"] is None
    # one millisecond apart is apart
    _profile(recipe).write_text(before)
    _record(recipe, [(_pins(recipe, False), [700.0, 720.0, 749.0]), (_pins(recipe, True), [750.0, 800.0, 820.0])])
    assert overlap_fit.fit(str(_profile(recipe)), str(recipe), "bench-te-mid-auto", [], str(tmp_path / "w"))["value"]


def test_pairs_need_the_same_other_knobs_the_same_recipe_and_two_runs_each():
    off = {"recipe": "r", "pins": {"moe.overlap": False, "parallelism.ep": 4}, "run_ms": [1.0, 2.0]}
    on = {"recipe": "r", "pins": {"moe.overlap": True, "parallelism.ep": 4}, "run_ms": [3.0, 4.0]}
    assert overlap_fit.pairs([off, on], "r") == [(off, on)]
    assert overlap_fit.pairs([off, {**on, "pins": {"moe.overlap": True, "parallelism.ep": 2}}], "r") == []
    assert overlap_fit.pairs([off, on], "other") == []
    assert overlap_fit.pairs([off, {**on, "run_ms": [3.0]}], "r") == []  # one run has no range
    assert overlap_fit.pairs([off, {**on, "run_ms": None}], "r") == []  # entries from before run_ms
    assert overlap_fit.pairs([off, {**on, "pins": {"moe.overlap": "yes", "parallelism.ep": 4}}], "r") == []
    assert overlap_fit.pairs(["junk", None, off, on], "r") == [(off, on)]  # a hand-edited list does not crash it


def test_no_pair_no_fit_and_the_reason(tmp_path):
    recipe = tune_project(tmp_path)
    got = overlap_fit.fit(str(_profile(recipe)), str(recipe), "bench-te-mid-auto", [], str(tmp_path / "work"))
    assert got == {"value": None, "pairs": [], "why": got["why"]} and "both on and off" in got["why"]


def test_the_solver_stops_at_the_bounds_and_says_so():
    assert overlap_fit.solve(1.3, lambda f: 1.0 + 0.5 * (f - 1.0)) == (1.6, "")
    f, note = overlap_fit.solve(9.0, lambda f: 1.0 + 0.5 * (f - 1.0))
    assert f == 4.0 and "highest factor 4" in note
    f, note = overlap_fit.solve(0.5, lambda f: 1.0 + 0.5 * (f - 1.0))
    assert f == 0.5 and "lowest factor 0.5" in note


@pytest.mark.parametrize("value", ["true", "0.49", "4.01", "'1.2'"])
def test_a_profile_value_outside_0_5_to_4_or_not_a_number_is_refused_at_its_line(tmp_path, value):
    recipe = tune_project(tmp_path)
    prof = _profile(recipe)
    prof.write_text(prof.read_text() + f"overlap_host_factor: {value}\n")
    line = len(prof.read_text().splitlines())
    with pytest.raises(InputError) as err:
        analyse(str(recipe))
    d = err.value.diagnostics[0]
    assert "`overlap_host_factor` must be a number from 0.5 to 4" in d.message and d.position.line == line


@pytest.mark.parametrize("value", ["0.5", "4"])
def test_the_bounds_themselves_are_accepted(tmp_path, value):
    recipe = tune_project(tmp_path)
    prof = _profile(recipe)
    prof.write_text(prof.read_text() + f"overlap_host_factor: {value}\n")
    assert analyse(str(recipe)).plan.hardware["cluster"]["overlap_host_factor"] == float(value)


def test_tune_writes_the_factor_after_a_race_that_measured_overlap_on_and_off_apart(tmp_path):
    recipe = tune_project(tmp_path)
    # a race of the model's own close plans, each forced to measure overlap on and off: a cluster where overlap
    # costs 30 % on top of the plain plan
    off, on = _pins(recipe, False), _pins(recipe, True)
    state_plans = {"c1": {"plan": "off", "pins": off, "predicted_s": 0.7, "chosen": True},
                   "c2": {"plan": "on", "pins": on, "predicted_s": 0.75}}
    work = tmp_path / "work"
    work.mkdir()
    state = {"recipe": str(recipe), "work": str(work), "band": 0.16, "iterations": 20, "candidates": state_plans,
             "runs": {"c1": [700.0, 705.0, 710.0], "c2": [910.0, 915.0, 920.0]}}
    (work / "state.json").write_text(json.dumps(state))
    rep = tune.report(state)
    tune.finish(rep, str(recipe), [], write=False)
    assert rep["profile_entries_added"] == 2 and rep["overlap_fit"]["value"] is not None
    assert analyse(str(recipe)).plan.hardware["cluster"]["overlap_host_factor"] == rep["overlap_fit"]["value"]
    assert _predicted_s(recipe, on) / _predicted_s(recipe, off) == pytest.approx(915.0 / 705.0, rel=0.01)
    shown = tune.text(rep)
    assert "EP overlap on/off measured x1.298" in shown and "set overlap_host_factor" in shown


def test_a_measured_overlap_factor_starts_a_fresh_race_as_a_new_host_factor_does(tmp_path):
    recipe = tune_project(tmp_path)
    before = tune._fingerprint(str(recipe), [], {})
    prof = _profile(recipe)
    prof.write_text(prof.read_text() + "overlap_host_factor: 1.3\n")
    assert tune._fingerprint(str(recipe), [], {}) != before  # the model's view of the close plans changed


def test_a_hand_edited_pair_whose_pins_no_longer_compile_is_named_and_skipped(tmp_path):
    recipe = tune_project(tmp_path)
    broken = {**_pins(recipe, False), "parallelism.ep": 3}  # 64 experts do not split over EP 3
    _record(recipe, [(broken, [700.0, 705.0]), ({**broken, "moe.overlap": True}, [900.0, 905.0])])
    got = overlap_fit.fit(str(_profile(recipe)), str(recipe), "bench-te-mid-auto", [], str(tmp_path / "work"))
    assert got["value"] is None and got["pairs"][0]["factor"] is None
    assert "does not compile with the measured pins" in got["pairs"][0]["why"]


def test_a_pin_value_of_the_wrong_type_is_named_too_not_a_traceback(tmp_path):
    recipe = tune_project(tmp_path)
    odd = {**_pins(recipe, False), "parallelism.tp": "two"}
    _record(recipe, [(odd, [700.0, 705.0]), ({**odd, "moe.overlap": True}, [900.0, 905.0])])
    got = overlap_fit.fit(str(_profile(recipe)), str(recipe), "bench-te-mid-auto", [], str(tmp_path / "work"))
    assert got["value"] is None and "does not compile with the measured pins" in got["pairs"][0]["why"]


def _overlap_cluster(script: str, runs: list[int]) -> float:
    """A made-up cluster where EP overlap costs 30 %; successive runs of a plan wobble by +-1 %."""
    lock = json.loads(Path(script).with_name("mocompile.lock.json").read_text())
    on = lock["settings"]["overlap_moe_expert_parallel_comm"]["value"]
    runs.append(1)
    return 700.0 * (1.3 if on else 1.0) * (1.0 + 0.01 * ((len(runs) % 3) - 1))


def test_tune_overlap_races_the_model_plan_against_its_overlap_twin_and_fits_the_factor(tmp_path):
    recipe = tune_project(tmp_path)
    seen: list[int] = []
    plans: list[bool] = []

    def launcher(script, env, log, timeout):
        lock = json.loads(Path(script).with_name("mocompile.lock.json").read_text())
        plans.append(lock["settings"]["overlap_moe_expert_parallel_comm"]["value"])
        ms = _overlap_cluster(script, seen)
        with open(env["MOCOMPILE_METRICS"], "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({"iteration": i, "step_ms": ms}) + "\n" for i in range(1, 21))
        return 0

    rep = tune.tune(str(recipe), launcher=launcher, quiet=True, overlap_ab=True)
    assert [r["plan"].split(", ")[2] for r in rep["plans"]] == ["overlap off", "overlap on"]
    assert sorted(plans) == [False] * 3 + [True] * 3  # --repeats runs of each, whatever the band
    tune.finish(rep, str(recipe), [], write=False)
    assert rep["overlap_fit"]["value"] is not None and rep["overlap_fit"]["pairs"][0]["measured_ratio"] == 1.3
    off, on = _pins(recipe, False), _pins(recipe, True)
    assert _predicted_s(recipe, on) / _predicted_s(recipe, off) == pytest.approx(1.3, rel=0.01)
    assert "EP overlap flipped" in tune.text(rep)


def test_tune_overlap_says_why_when_the_plan_cannot_flip_overlap(tmp_path):
    recipe = tune_project(tmp_path)
    with pytest.raises(UsageError) as err:
        tune.tune(str(recipe), ["parallelism.ep=1"], launcher=lambda *a: 0, quiet=True, overlap_ab=True)
    assert "cannot run with EP overlap on" in str(err.value)
    bad = run_cli("tune", str(recipe), "--overlap", "--band", "0.1")
    assert bad.returncode == 2 and "--band does not apply" in bad.stderr and "Traceback" not in bad.stderr


def _recorded_probe(root: Path, host: float, overlap: float | None, spread: tuple[float, ...] = (0.98, 1.0, 1.02)) -> Path:
    """A probe's recorded runs (as `probe --from-runs` reads them): the probe plan's steps as the model predicts
    them at ``host`` (host_factor) and, with EP overlap on, at ``overlap`` (overlap_host_factor)."""
    from mocompile import probe

    work = root / ".mocompile" / "probe"
    work.mkdir(parents=True, exist_ok=True)
    recipe = work / "probe.yaml"
    recipe.write_text(json.dumps(probe.intent("h100", 4, "2.12.0")))
    plain = probe.predictor(str(work), str(recipe))(host) * 1000
    runs = root / "recorded"
    runs.mkdir(exist_ok=True)
    for i, s in enumerate(spread, 1):
        (runs / f"probe-{i}.jsonl").write_text("".join(
            json.dumps({"iteration": it, "step_ms": plain * s}) + "\n" for it in range(1, 21)))
    if overlap is not None:
        on = overlap_fit.step_predictor(str(recipe), [], {"schema": 1, "name": "t", "host_factor": host},
                                        str(work))({"moe.overlap": True}, overlap) * 1000
        for i, s in enumerate(spread, 1):
            (runs / f"probe-overlap-{i}.jsonl").write_text("".join(
                json.dumps({"iteration": it, "step_ms": on * s}) + "\n" for it in range(1, 21)))
    (runs / "environment.json").write_text(json.dumps({"torch": "2.11.0", "transformer_engine": "2.12.0",
                                                       "device_name": "H100", "missing": ["deep_ep", "hybrid_ep"]}))
    return runs


def test_probe_overlap_fits_both_factors_from_the_runs_they_were_made_with(tmp_path):
    from mocompile import probe

    (tmp_path / "pyproject.toml").write_text("")
    runs = _recorded_probe(tmp_path, host=3.0, overlap=1.5)
    out = tmp_path / "clusters" / "mine.yaml"
    rep = probe.probe(str(out), "h100", 4, from_runs=str(runs), quiet=True, overlap=True)
    assert rep["host_factor"] == pytest.approx(3.0, rel=0.02)
    assert rep["overlap"]["factor"] == pytest.approx(1.5, rel=0.03)
    text = out.read_text()
    assert f"overlap_host_factor: {rep['overlap']['factor']}  # probe --overlap" in text
    # the profile reads back, and an intent naming it predicts with both factors
    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps(dict(probe.intent("h100", 4, "2.12.0"), hardware={
        "gpu": "h100", "nodes": 1, "gpus_per_node": 4, "cluster": "clusters/mine.yaml"})))
    assert analyse(str(recipe)).plan.hardware["cluster"]["overlap_host_factor"] == rep["overlap"]["factor"]
    assert f"overlap_host_factor {rep['overlap']['factor']}" in probe.text(rep)
    # the command line takes the same path
    shown = run_cli("probe", "-o", "clusters/cli.yaml", "--gpu", "h100", "--gpus-per-node", "4", "--from-runs",
                    str(runs), "--overlap", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "EP overlap on: runs" in shown.stdout and "overlap_host_factor: " in (tmp_path / "clusters" / "cli.yaml").read_text()


def test_probe_overlap_inside_the_noise_or_with_one_run_writes_no_factor(tmp_path):
    from mocompile import probe

    (tmp_path / "pyproject.toml").write_text("")
    runs = _recorded_probe(tmp_path, host=3.0, overlap=1.0, spread=(0.9, 1.0, 1.1))  # +-10 %: the ranges overlap
    out = tmp_path / "clusters" / "mine.yaml"
    rep = probe.probe(str(out), "h100", 4, from_runs=str(runs), quiet=True, overlap=True)
    assert rep["overlap"]["factor"] is None and "noise" in rep["overlap"]["why"]
    assert "overlap_host_factor:" not in out.read_text() and '  overlap: {"runs"' in out.read_text()
    assert "overlap_host_factor not set" in probe.text(rep)
    rep = probe.probe(str(out), "h100", 4, from_runs=str(runs), quiet=True, overlap=True, repeats=1)
    assert rep["overlap"]["factor"] is None and "--repeats 2" in rep["overlap"]["why"]


def test_probe_overlap_runs_the_overlap_twin_through_its_own_launcher_and_says_why_on_one_gpu(tmp_path):
    from mocompile import probe
    from test_probe_tune import _python

    (tmp_path / "pyproject.toml").write_text("")
    seen: list[str] = []

    def launcher(script, env, log, timeout):
        on = json.loads(Path(script).with_name("mocompile.lock.json").read_text())["settings"][
            "overlap_moe_expert_parallel_comm"]["value"]
        seen.append(Path(script).parent.name)
        ms = (650.0 if on else 500.0) * (1 + 0.01 * (len(seen) % 2))
        with open(env["MOCOMPILE_METRICS"], "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps({"iteration": i, "step_ms": ms}) + "\n" for i in range(1, 26))
        return 0

    rep = probe.probe(str(tmp_path / "clusters" / "c.yaml"), "h100", 2, repeats=2, launcher=launcher, quiet=True,
                      python=_python(tmp_path), kernel_probe=False, overlap=True)
    assert seen == ["mocompile-probe"] * 2 + ["mocompile-probe-overlap"] * 2
    assert rep["overlap"]["measured_ratio"] == pytest.approx(1.3, abs=0.01) and rep["overlap"]["factor"] > 1.0
    one = probe.probe(str(tmp_path / "clusters" / "one.yaml"), "h100", 1, repeats=2, launcher=launcher, quiet=True,
                      python=_python(tmp_path), kernel_probe=False, overlap=True)
    assert one["overlap"]["factor"] is None and "cannot run with EP overlap" in one["overlap"]["why"]
    assert "overlap_host_factor:" not in (tmp_path / "clusters" / "one.yaml").read_text()


def test_a_hand_written_profile_with_a_yaml_date_still_fits(tmp_path):
    recipe = tune_project(tmp_path)
    prof = _profile(recipe)
    prof.write_text(prof.read_text().replace("schema: 1\n", "schema: 1\nprobe: {date: 2026-11-27}\n", 1))
    off, on = _pins(recipe, False), _pins(recipe, True)
    _record(recipe, [(off, [700.0, 705.0]), (on, [900.0, 905.0])])
    assert overlap_fit.fit(str(prof), str(recipe), "bench-te-mid-auto", [], str(tmp_path / "work"))["value"] > 1.0


def test_a_race_without_an_overlap_pair_says_nothing_about_overlap(tmp_path):
    recipe = tune_project(tmp_path)
    off = _pins(recipe, False)
    work = tmp_path / "work"
    work.mkdir()
    state = {"recipe": str(recipe), "work": str(work), "band": 0.16, "iterations": 20,
             "candidates": {"c1": {"plan": "a", "pins": off, "predicted_s": 0.7, "chosen": True},
                            "c2": {"plan": "b", "pins": {**off, "moe.dispatcher": "deepep"}, "predicted_s": 0.72}},
             "runs": {"c1": [700.0, 705.0, 710.0], "c2": [910.0, 915.0, 920.0]}}
    (work / "state.json").write_text(json.dumps(state))
    rep = tune.report(state)
    tune.finish(rep, str(recipe), [], write=False)
    assert rep["overlap_fit"]["value"] is None and rep["overlap_fit"]["pairs"] == []
    shown = tune.text(rep)
    assert "overlap_host_factor" not in shown and "EP overlap on/off" not in shown
    assert "overlap_host_factor" not in _profile(recipe).read_text()
    # with a pair inside the noise, the line says why
    state["candidates"]["c2"] = {"plan": "on", "pins": _pins(recipe, True), "predicted_s": 0.75}
    state["runs"]["c2"] = [700.0, 712.0, 730.0]
    (work / "state.json").write_text(json.dumps(state))
    rep = tune.report(state)
    tune.finish(rep, str(recipe), [], write=False)
    assert "overlap_host_factor not set: no on/off pair was both measured apart" in tune.text(rep)
