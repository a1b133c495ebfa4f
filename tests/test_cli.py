"""The command-line contract: verbs, formats, exit codes, check."""

from __future__ import annotations

import json
import shutil

from conftest import ROOT, run_cli

TINY = "recipes/tiny-moe-h100x2.yaml"


def test_lint_json_is_a_list_of_diagnostics(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / TINY).read_text() + "moe: {overlap: true, dispatcher: allgather}\n")
    proc = run_cli("lint", str(bad), "--format", "json")
    assert proc.returncode == 1
    diags = json.loads(proc.stdout)
    assert diags and set(diags[0]) == {"file", "line", "column", "rule", "severity", "message", "hint"}
    assert "OVL002" in {d["rule"] for d in diags}


def test_lint_clean_recipe_exits_0():
    proc = run_cli("lint", TINY)
    assert proc.returncode == 0, proc.stdout


def test_explain_json_uses_megatron_names():
    proc = run_cli("explain", TINY, "--format", "json")
    assert proc.returncode == 0
    data = json.loads(proc.stdout)
    for key in ("expert_model_parallel_size", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
                "overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "virtual_pipeline_model_parallel_size",
                "recompute_granularity", "recompute_modules"):
        assert {"value", "source", "reason"} <= set(data["settings"][key])
    assert data["memory"]["estimate_gib"] > 0


def test_explain_a_rule():
    proc = run_cli("explain", "OVL010")
    assert proc.returncode == 0 and "overlap-forbids-shared-expert-overlap" in proc.stdout


def test_github_and_sarif_formats(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ROOT / TINY).read_text() + "moe: {overlap: true}\nparallelism: {ep: 1}\n")
    gh = run_cli("lint", str(bad), "--format", "github")
    assert gh.returncode == 1
    assert gh.stdout.startswith("::error file=") and "title=OVL001" in gh.stdout and ",line=" in gh.stdout
    sarif = json.loads(run_cli("lint", str(bad), "--format", "sarif").stdout)
    assert sarif["version"] == "2.1.0"
    assert any(r["id"] == "OVL001" for r in sarif["runs"][0]["tool"]["driver"]["rules"])


def _project_copy(tmp_path):
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "recipes", proj / "recipes")
    shutil.copytree(ROOT / "clusters", proj / "clusters")  # the TE bench recipes name a cluster profile
    shutil.copytree(ROOT / "generated", proj / "generated")
    shutil.copy(ROOT / "pyproject.toml", proj / "pyproject.toml")
    return proj


def test_check_passes_then_names_hand_edit_and_stale_recipe(tmp_path):
    proj = _project_copy(tmp_path)
    ok = run_cli("check", cwd=proj)
    assert ok.returncode == 0, ok.stdout
    sb = proj / "generated" / "tiny-moe-h100x2" / "torchrun.sh"
    sb.write_text(sb.read_text().replace("29500", "29501"))
    edited = run_cli("check", cwd=proj)
    assert edited.returncode == 1
    assert "torchrun.sh: edited" in edited.stdout
    sb.write_text(sb.read_text().replace("29501", "29500"))
    recipe = proj / "recipes" / "tiny-moe-h100x2.yaml"
    recipe.write_text(recipe.read_text().replace("train_iters: 30", "train_iters: 31"))
    stale = run_cli("check", cwd=proj)
    assert stale.returncode == 1
    assert "train.py: stale" in stale.stdout and "recipes/tiny-moe-h100x2.yaml" in stale.stdout
    # a recipe that extends the changed one is stale too, and named in the fix command
    assert "recipes/tiny-moe-muon-h100x2.yaml" in stale.stdout
    fixed = run_cli("compile", "recipes/tiny-moe-h100x2.yaml", "recipes/tiny-moe-muon-h100x2.yaml", cwd=proj)
    assert fixed.returncode == 0
    assert run_cli("check", cwd=proj).returncode == 0


def test_schema_matches_committed_file():
    proc = run_cli("schema")
    assert proc.returncode == 0
    assert json.loads(proc.stdout) == json.loads((ROOT / "schemas" / "intent.schema.json").read_text())


def test_rules_listing_covers_catalogue():
    proc = run_cli("rules", "--format", "json")
    ids = {r["id"] for r in json.loads(proc.stdout)}
    assert {"OVL001", "DSP001", "PAR003", "CG006"} <= ids


def test_rule_docs_are_generated_from_the_catalogue():
    proc = run_cli("rules", "--format", "markdown")
    assert proc.returncode == 0
    assert proc.stdout == (ROOT / "docs" / "rules.md").read_text(), "run: mocompile rules --format markdown > docs/rules.md"


def test_an_unwritable_output_is_a_write_error_not_a_hand_edit(tmp_path):
    """The file system refusing is exit 2 with its own ID; EDITED (exit 1, --force) is for hand edits only."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "tiny-moe-h100x2").write_text("a file where the recipe's folder should go\n")
    proc = run_cli("compile", TINY, "-o", str(out), "--format", "json")
    assert proc.returncode == 2
    found = json.loads(proc.stdout)
    assert [d["rule"] for d in found] == ["WRITE"] and "is not a folder" in found[0]["message"]
    assert (out / "tiny-moe-h100x2").read_text() == "a file where the recipe's folder should go\n"


def test_explain_knows_the_input_limits_too():
    proc = run_cli("explain", "LIM004")
    assert proc.returncode == 0 and "too-many-values (LIM004)" in proc.stdout and "20,000" in proc.stdout
