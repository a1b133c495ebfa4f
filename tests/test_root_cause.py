"""One root cause per error: illegal pins are reported by the rules they break, without the consequences
(rules on values that the broken rule leaves meaningless, masks: in the catalogue) and without messages about
knobs the planner chose for a plan that cannot exist (it picks the plan breaking the fewest rules, then the
simplest)."""

from __future__ import annotations

import pytest
from conftest import run_cli
from mocompile.pipeline import analyse

HEAD = "schema: 1\nmodel: {model}\nhardware: {{gpu: h100, nodes: {nodes}}}\ngoal: throughput\n"


def _rules(tmp_path, body, model="qwen3-30b-a3b", nodes=2):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD.format(model=model, nodes=nodes) + body)
    r = analyse(str(path))
    return {d.rule for d in r.diagnostics if d.severity == "error"}, {d.rule for d in r.diagnostics}


@pytest.mark.parametrize("body, model, nodes, want", [
    # PP 5 on 16 GPUs: DP = 16/5 is no number, so no PAR007 on it; no DeepEP chosen to be warned about
    ("parallelism: {pp: 5}\n", "qwen3-30b-a3b", 2, {"PAR001", "PAR002"}),
    # EP 12 with no dispatcher pinned: the rules EP 12 breaks, not DeepEP's table (DSP003) for a DeepEP nobody asked for
    ("parallelism: {ep: 12}\n", "qwen3-30b-a3b", 2, {"PAR002", "PAR003"}),
    # VPP 2 at PP 1: the interleaving rules (PP004's "PP > 2" hint) would only echo PP001
    ("parallelism: {pp: 1, vpp: 2}\n", "qwen3-30b-a3b", 2, {"PP001"}),
    # PP 7 on 32 GPUs: no memory estimate (MEM001 "smallest GPU count") of a layout that cannot exist
    ("parallelism: {pp: 7}\n", "deepseek-v3", 4, {"PAR001", "PAR002"}),
])
def test_illegal_pins_are_reported_by_the_rules_they_break_and_nothing_else(tmp_path, body, model, nodes, want):
    errors, everything = _rules(tmp_path, body, model, nodes)
    assert errors == want
    assert not {r for r in everything if r.startswith("DSP")}, everything


def test_a_mask_hides_only_consequences_the_masked_rules_still_report_their_own_causes(tmp_path):
    errors, _ = _rules(tmp_path, "training: {global_batch_size: 1000}\nparallelism: {tp: 1, pp: 1, cp: 1}\n")
    assert "PAR007" in errors and "PAR001" not in errors  # DP 16 is whole: 1000 % 16 is the user's own problem
    errors, _ = _rules(tmp_path, "parallelism: {pp: 2, vpp: 2, tp: 1, cp: 1}\ntraining: {global_batch_size: 8}\n")
    assert "PP001" not in errors and "PP005" in errors  # a real pipeline: VPP rules speak


def test_a_pinned_dispatcher_is_the_users_and_its_rules_speak(tmp_path):
    errors, _ = _rules(tmp_path, "parallelism: {ep: 12}\nmoe: {dispatcher: deepep}\n")
    assert {"DSP003", "PAR002", "PAR003"} <= errors


@pytest.mark.parametrize("typed, key, field", [
    ("expert_parallel", "ep", "expert_model_parallel_size"),  # not `sequence_parallel`, the nearer spelling
    ("tensor_model_parallel_size", "tp", "tensor_model_parallel_size"),
    ("pipeline_parallel", "pp", "pipeline_model_parallel_size"),
    ("context_parallel_size", "cp", "context_parallel_size"),
    ("tpp", "tp", "tensor_model_parallel_size"),
])
def test_a_misspelt_key_is_matched_against_the_megatron_field_each_key_sets(tmp_path, typed, key, field):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD.format(model="qwen3-30b-a3b", nodes=2) + f"parallelism: {{{typed}: 8}}\n")
    proc = run_cli("lint", str(path))
    assert proc.returncode == 2 and f"did you mean `{key}` ({field})?" in proc.stdout + proc.stderr


def test_a_misspelling_of_a_key_without_a_megatron_field_still_finds_it(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(HEAD.format(model="qwen3-30b-a3b", nodes=2) + "parallelism: {seqence_parallel: true}\n")
    proc = run_cli("lint", str(path))
    assert "did you mean `sequence_parallel`?" in proc.stdout + proc.stderr


def test_beside_an_error_advice_on_knobs_the_planner_chose_is_left_out_but_advice_on_pins_stays(tmp_path):
    # DeepSeek-V3 cannot fit 16 GPUs: the error is MEM001; the DeepEP the planner tried needs no warning (DSP006)
    errors, everything = _rules(tmp_path, "moe: {overlap: true}\nparallelism: {vpp: 1}\n", "deepseek-v3", 2)
    assert errors == {"MEM001"} and everything == {"MEM001"}
    # the user's own DeepEP across nodes is theirs: its warning stays beside the PP error
    errors, everything = _rules(tmp_path, "moe: {dispatcher: deepep}\nparallelism: {ep: 16, pp: 5}\n")
    assert "PAR001" in errors and "DSP006" in everything
    # and without an error, the planner's own choices keep their advice (Moonlight with EP 16 on 16 nodes of a
    # cluster whose probe found no HybridEP: the planner's DeepEP across two of them)
    (tmp_path / "c.yaml").write_text('schema: 1\nname: no-hybridep\nprobe:\n  missing: ["hybrid_ep"]\n')
    path = tmp_path / "r.yaml"
    path.write_text("schema: 1\nmodel: moonlight-16b-a3b\nhardware: {gpu: h100, nodes: 16, cluster: c.yaml}\n"
                    "goal: throughput\nparallelism: {ep: 16}\n")
    r = analyse(str(path))
    assert r.plan["moe_flex_dispatcher_backend"] == "deepep"
    assert not {d.rule for d in r.diagnostics if d.severity == "error"} and "DSP006" in {d.rule for d in r.diagnostics}


@pytest.mark.parametrize("gbs, unit, near", [
    (1000, 16, "992 or 1008"),  # DP 16 (TP 1 PP 1 CP 1 on 16 GPUs): the multiples of 16 either side
    (10, 16, "16"),             # below one unit: the unit itself, never 0
])
def test_a_global_batch_that_does_not_divide_gets_the_nearest_ones_that_do(tmp_path, gbs, unit, near):
    """PAR007 names numbers: a user whose data parallelism the planner chose never wrote a DP size, so "a multiple
    of micro batch times DP" alone leaves them to work out which."""
    path = tmp_path / "r.yaml"
    path.write_text(HEAD.format(model="qwen3-30b-a3b", nodes=2)
                    + f"training: {{global_batch_size: {gbs}, micro_batch_size: 1}}\nparallelism: {{tp: 1, pp: 1, cp: 1}}\n")
    (d,) = [d for d in analyse(str(path)).diagnostics if d.rule == "PAR007"]
    assert d.message.endswith(f"the nearest multiples of {unit}: {near}")
    for n in near.split(" or "):
        assert int(n) % unit == 0 and int(n) != gbs  # each named batch passes the rule this hint is for
