"""Cluster profiles (`hardware.cluster`): the user's own host speed reaches the step-time model.

On the lent 4x H100 VMs the host launches kernels ~5.2x slower than a DGX node; with that profile the
TE grid's locks predict its measured medians (benchmarks/results/te-h100x4-2026-11-26/grid.md).
"""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli
from mocompile.errors import InputError
from mocompile.pipeline import analyse

RECIPE = ("schema: 1\nmodel: qwen3-30b-a3b\nhardware: {gpu: h100, nodes: 2, cluster: clusters/c.yaml}\n"
          "goal: throughput\n")
PROFILE = "schema: 1\nname: test\nhost_factor: {f}\nsource: a test\n"


def _project(tmp_path, factor="5.18", recipe=RECIPE, profile=PROFILE):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "clusters").mkdir(exist_ok=True)
    (tmp_path / "clusters" / "c.yaml").write_text(profile.format(f=factor))
    (tmp_path / "r.yaml").write_text(recipe)
    return tmp_path / "r.yaml"


def _error(path):
    with pytest.raises(InputError) as exc:
        analyse(str(path))
    return exc.value.diagnostics


def test_the_profile_slows_the_host_part_of_the_step_and_is_recorded(tmp_path):
    dgx = analyse(str(_project(tmp_path, recipe=RECIPE.replace(", cluster: clusters/c.yaml", "")))).plan
    lent = analyse(str(_project(tmp_path))).plan
    assert "cluster" not in dgx.hardware and "host_factor" not in dgx.hardware
    assert lent.hardware["cluster"]["host_factor"] == 5.18 and lent.hardware["cluster"]["path"] == "clusters/c.yaml"
    d, lt = dgx.planner["chosen"]["terms_s"], lent.planner["chosen"]["terms_s"]
    assert lt.get("host_bound", 0) > d.get("host_bound", 0)
    assert lent.planner["chosen"]["step_time_s"] > dgx.planner["chosen"]["step_time_s"]


def test_a_profile_of_a_dgx_host_changes_nothing(tmp_path):
    dgx = analyse(str(_project(tmp_path, recipe=RECIPE.replace(", cluster: clusters/c.yaml", "")))).plan
    same = analyse(str(_project(tmp_path, factor="1.0"))).plan
    assert same.planner["chosen"] == dgx.planner["chosen"]


@pytest.mark.parametrize("factor,ok", [("0.1", True), ("0.09", False), ("100", True), ("100.5", False),
                                       ("true", False), ("fast", False)])
def test_host_factor_bounds(tmp_path, factor, ok):
    path = _project(tmp_path, factor=factor)
    if ok:
        assert analyse(str(path)).plan.hardware["host_factor"] == float(factor)
    else:
        (d,) = _error(path)
        assert d.position.file.endswith("c.yaml") and (d.position.line, d.position.column) == (3, 14)
        assert "host_factor" in d.message


def test_a_profile_is_read_like_a_recipe_every_problem_positioned(tmp_path):
    path = _project(tmp_path, profile="schema: 2\nhost_factor: 2\nspeed: 3\n")
    diags = _error(path)
    assert {(d.position.line, d.message.split(" ")[0]) for d in diags} == {(3, "unknown"), (1, "a")}


@pytest.mark.parametrize("where,message", [("../outside.yaml", "outside the project root"),
                                           ("clusters/missing.yaml", "names a missing file")])
def test_a_profile_outside_the_project_or_missing_is_refused_at_the_key(tmp_path, where, message):
    (tmp_path.parent / "outside.yaml").write_text(PROFILE.format(f=2))
    path = _project(tmp_path, recipe=RECIPE.replace("clusters/c.yaml", where))
    (d,) = _error(path)
    assert message in d.message and (d.position.line, d.position.column) == (3, 42)  # the value of the key


def test_a_changed_profile_makes_the_generated_files_stale(tmp_path):
    _project(tmp_path)
    assert run_cli("compile", "r.yaml", cwd=tmp_path).returncode == 0
    lock = json.loads((tmp_path / "generated" / "r" / "mocompile.lock.json").read_text())
    assert lock["hardware"]["cluster"]["host_factor"] == 5.18
    assert run_cli("check", "r.yaml", cwd=tmp_path).returncode == 0
    (tmp_path / "clusters" / "c.yaml").write_text(PROFILE.format(f=2.0))
    stale = run_cli("check", "r.yaml", cwd=tmp_path)
    assert stale.returncode == 1 and "stale" in stale.stdout


GRID = {  # measured median step (ms) on 4x H100, grid.md; every plan but auto pins its knobs
    "bench-te-mid-ep4-off": 638, "bench-te-mid-ep4-off-moeact": 659, "bench-te-mid-ep4-on": 728,
    "bench-te-mid-ep4-on-graphs": 656, "bench-te-mid-ep4-on-wgrad": 861}


@pytest.mark.parametrize("name", sorted(GRID))
def test_with_the_test_hosts_profile_the_te_grid_is_predicted_within_15_percent(name):
    """In-sample: the profile's host_factor was fitted on these rows (benchmarks/calibrate.py)."""
    p = analyse(str(ROOT / "recipes" / "bench" / f"{name}.yaml")).plan
    assert p.hardware["cluster"]["name"] == "lent-h100x4"
    predicted = p.planner["chosen"]["step_time_s"] * 1000
    assert abs(predicted / GRID[name] - 1) <= 0.15, (predicted, GRID[name])


def test_an_edited_profile_re_plans_even_with_the_plan_cache_on(tmp_path):
    """The command line caches search verdicts by intent; the profile's values are part of that key, so a
    re-fitted host_factor (same path, new file) gives the new prediction, not the cached one."""
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    _project(tmp_path, factor="1.0")

    def predicted() -> float:
        assert run_cli("compile", "--force", "r.yaml", cwd=tmp_path, env=env).returncode == 0
        lock = json.loads((tmp_path / "generated" / "r" / "mocompile.lock.json").read_text())
        return lock["estimate"]["chosen"]["step_time_s"]

    fast = predicted()
    (tmp_path / "clusters" / "c.yaml").write_text(PROFILE.format(f="20.0"))
    slow = predicted()
    assert slow > fast * 1.5  # a host 20x slower than DGX makes this plan host-bound
    (tmp_path / "clusters" / "c.yaml").write_text(PROFILE.format(f="1.0"))
    assert predicted() == fast
