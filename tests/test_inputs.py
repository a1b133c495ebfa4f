"""Bad input: a clear message, exit 2 (or 1 for rule findings), no traceback, nothing written."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli

GOOD = (ROOT / "recipes" / "tiny-moe-h100x2.yaml").read_text()


def _compile(tmp_path, text: str, name: str = "r.yaml", *extra: str):
    recipe = tmp_path / name
    recipe.write_text(text)
    out = tmp_path / "out"
    proc = run_cli("compile", str(recipe), "-o", str(out), "--format", "json", *extra)
    return proc, out


def _diags(proc):
    return json.loads(proc.stdout) if proc.stdout.strip() else []


CASES = {
    "malformed": ("schema: 1\nmodel: [unclosed\n", "malformed YAML"),
    "empty": ("", "file is empty"),
    "comments_only": ("# nothing here\n", "holds no YAML document"),
    "wrong_type": (GOOD.replace("nodes: 1", "nodes: two"), "must be an integer"),
    "unknown_key": (GOOD.replace("goal: throughput", "goal: throughput\ngaol: fit"), "unknown key `gaol`"),
    "bad_enum": (GOOD.replace("goal: throughput", "goal: througput"), "unknown value 'througput'"),
    "unknown_model": (GOOD.replace("model: tiny-moe", "model: tiny-mo"), "unknown model `tiny-mo`"),
    "unknown_gpu": (GOOD.replace("gpu: h100", "gpu: h10"), "unknown value 'h10'"),
    "metachar_name": ("name: 'x; rm -rf /'\n" + GOOD, "`name` has an invalid value"),
    "python_metachar_name": ("name: \"x'''); import os #\"\n" + GOOD, "`name` has an invalid value"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_reported_cleanly(tmp_path, case):
    text, expected = CASES[case]
    proc, out = _compile(tmp_path, text)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    diags = _diags(proc)
    assert any(expected in d["message"] for d in diags), diags
    assert all(d["line"] >= 1 and d["file"].endswith("r.yaml") for d in diags)
    assert not out.exists()


def test_did_you_mean_for_unknown_key_and_enum(tmp_path):
    proc, _ = _compile(tmp_path, GOOD.replace("goal: throughput", "goal: througput\ngaol: fit"))
    hints = [d["hint"] for d in _diags(proc)]
    assert "did you mean `goal`?" in hints
    assert "did you mean `throughput`?" in hints


def test_all_errors_of_a_file_at_once(tmp_path):
    text = GOOD.replace("goal: throughput", "goal: fast").replace("gpu: h100", "gpu: h1000").replace(
        "nodes: 1", "nodes: 0")
    proc, _ = _compile(tmp_path, text)
    assert len(_diags(proc)) == 3


def test_unknown_key_position_is_the_key(tmp_path):
    proc, _ = _compile(tmp_path, GOOD + "moe: {dispatcher: alltoall, overlapp: true}\n")
    d = next(d for d in _diags(proc) if "overlapp" in d["message"])
    assert d["hint"] == "did you mean `overlap` (overlap_moe_expert_parallel_comm)?"
    assert d["line"] == GOOD.count("\n") + 1 and d["column"] == 29


def test_extends_cycle(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: b.yaml\n" + GOOD)
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n" + GOOD)
    proc = run_cli("lint", str(tmp_path / "a.yaml"), "--format", "json")
    assert proc.returncode == 2
    assert "`extends` cycle" in _diags(proc)[0]["message"]


def test_missing_file(tmp_path):
    proc = run_cli("compile", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert "file not found" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_rule_error_exits_1_and_writes_nothing(tmp_path):
    proc, out = _compile(tmp_path, GOOD + "moe: {overlap: true}\nparallelism: {ep: 1}\n")
    assert proc.returncode == 1
    assert "OVL001" in [d["rule"] for d in _diags(proc)]
    assert not out.exists()


def test_failed_compile_keeps_previous_output(tmp_path):
    proc, out = _compile(tmp_path, GOOD)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    before = {p.name: p.read_text() for p in (out / "r").iterdir()}
    proc, _ = _compile(tmp_path, GOOD + "moe: {overlap: true}\nparallelism: {ep: 1}\n")
    assert proc.returncode == 1
    assert {p.name: p.read_text() for p in (out / "r").iterdir()} == before


def test_hand_edited_output_is_not_overwritten(tmp_path):
    proc, out = _compile(tmp_path, GOOD)
    train = out / "r" / "train.py"
    train.write_text(train.read_text() + "# my local tweak\n")
    proc, _ = _compile(tmp_path, GOOD.replace("train_iters: 30", "train_iters: 40"))
    assert proc.returncode == 1
    assert "hand-edited" in proc.stdout
    assert train.read_text().endswith("# my local tweak\n")
    proc, _ = _compile(tmp_path, GOOD.replace("train_iters: 30", "train_iters: 40"), "r.yaml", "--force")
    assert proc.returncode == 0 and "train_iters=40" in train.read_text()


def test_usage_errors_exit_2():
    proc = run_cli("lint")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    proc = run_cli("compile", "recipes/tiny-moe-h100x2.yaml", "--format", "yaml")
    assert proc.returncode == 2


def test_set_and_unset_apply_last(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(GOOD)
    proc = run_cli("explain", str(recipe), "--format", "json", "--set", "parallelism.ep=1",
                   "--set", "training.seq_length=1024")
    data = json.loads(proc.stdout)
    assert data["settings"]["expert_model_parallel_size"]["value"] == 1
    assert data["settings"]["expert_model_parallel_size"]["source"] == "user"
    assert data["settings"]["seq_length"]["value"] == 1024
    proc = run_cli("explain", str(recipe), "--format", "json", "--unset", "training.seq_length")
    assert json.loads(proc.stdout)["settings"]["seq_length"]["value"] == 4096


def test_positions_survive_extends(tmp_path):
    """A pin inherited from a base file is reported at its line in the base file."""
    (tmp_path / "base.yaml").write_text(GOOD + "moe: {overlap: true}\n")
    (tmp_path / "child.yaml").write_text("extends: base.yaml\nname: child\nparallelism: {ep: 1}\n")
    proc = run_cli("lint", str(tmp_path / "child.yaml"), "--format", "json")
    assert proc.returncode == 1
    d = next(d for d in _diags(proc) if d["rule"] == "OVL001")
    assert d["file"].endswith("base.yaml") and d["line"] == GOOD.count("\n") + 1 and d["column"] == 16
