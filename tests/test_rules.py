"""Every rule in the catalogue, with an intent that breaks it and one that does not."""

from __future__ import annotations

import pytest
from conftest import RULE_BASE, overrides
from mocompile.pipeline import analyse
from mocompile.rules.checks import CHECKS
from mocompile.rules.engine import rules

WITH_EXAMPLES = [r for r in rules() if r.examples]
# Rules the resolver's derivations make unreachable from an intent: their predicates are
# exercised directly on flat settings in test_rules_without_intent_examples below.
DIRECT = {"PP004", "OVL007", "OVL008", "OVL013", "DW004", "DSP002", "DSP009",
          "MEM002",  # MEM002 needs a shipped Bridge recipe's model: tests/test_memory_truth.py runs them
          "CLU001"}  # needs a probed cluster profile in the project: tests/test_probe_tune.py runs it from an intent


def test_catalogue_and_checks_match():
    assert {r.id for r in rules()} == set(CHECKS)


def test_every_rule_is_tested():
    assert {r.id for r in rules()} == {r.id for r in WITH_EXAMPLES} | DIRECT


@pytest.mark.parametrize("rule", WITH_EXAMPLES, ids=lambda r: r.id)
def test_rule_fires_on_failing_intent(rule):
    result = analyse(str(RULE_BASE), overrides(rule.examples["fail"]))
    found = [d for d in result.diagnostics if d.rule == rule.id]
    assert found, f"{rule.id} did not fire; got {[d.rule for d in result.diagnostics]}"
    assert all(d.severity == rule.severity for d in found)
    assert found[0].hint


@pytest.mark.parametrize("rule", WITH_EXAMPLES, ids=lambda r: r.id)
def test_rule_quiet_on_passing_intent(rule):
    result = analyse(str(RULE_BASE), overrides(rule.examples["pass"]))
    assert rule.id not in [d.rule for d in result.diagnostics]


def _flat(**kw):
    """A legal flat configuration (the tiny model, EP 2 with overlap) plus changes."""
    result = analyse(str(RULE_BASE), overrides({"moe.overlap": True, "parallelism.ep": 2}))
    cfg = result.plan.values()
    assert not [d for d in result.diagnostics if d.severity == "error"]
    cfg.update(kw)
    return cfg


@pytest.mark.parametrize("rule_id,broken,fine", [
    ("PP004", dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=False),
     dict(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=2, overlap_p2p_comm=True)),
    ("OVL007", dict(recompute_method="uniform"), dict(recompute_method=None)),
    ("OVL008", dict(recompute_num_layers=2), dict(recompute_num_layers=None)),
    ("OVL013", dict(num_moe_experts=1), dict(num_moe_experts=2)),
    ("DW004", dict(delay_wgrad_compute=True, overlap_grad_reduce=True, te_version="2.6.0"),
     dict(delay_wgrad_compute=True, overlap_grad_reduce=True, te_version="2.7.0")),
    ("DSP002", dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep", gpu_flex_backends=["deepep"]),
     dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep", gpu_flex_backends=["hybridep"])),
    ("DSP009", dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep", fp8_dispatch=True),
     dict(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep", fp8_dispatch=False)),
    # MEM002: a shipped recipe run as shipped, over the GPU's memory but within the estimate's measured error
    ("MEM002", dict(shipped_recipe="r_config", gpu_memory_gib=80, memory_estimate_gib=80.01, memory_limit_gib=85.92),
     dict(shipped_recipe="r_config", gpu_memory_gib=80, memory_estimate_gib=80.0, memory_limit_gib=85.92)),
    ("MEM002", dict(shipped_recipe="r_config", gpu_memory_gib=80, memory_estimate_gib=85.92, memory_limit_gib=85.92),
     dict(shipped_recipe="r_config", gpu_memory_gib=80, memory_estimate_gib=85.93, memory_limit_gib=85.92)),
    ("MEM002", dict(shipped_recipe="r_config", gpu_memory_gib=80, memory_estimate_gib=80.01, memory_limit_gib=85.92),
     dict(shipped_recipe=None, gpu_memory_gib=80, memory_estimate_gib=80.01, memory_limit_gib=73.6)),
])
def test_rules_without_intent_examples(rule_id, broken, fine):
    """(CLU001's flat cases are in tests/test_rule_boundaries.py, its intent case in tests/test_probe_tune.py.)"""
    assert CHECKS[rule_id](_flat(**broken))
    assert not CHECKS[rule_id](_flat(**fine))


def test_pinned_violation_points_at_the_pinned_value(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RULE_BASE.read_text() + "moe: {dispatcher: allgather, overlap: true}\n")
    result = analyse(str(recipe))
    d = next(d for d in result.diagnostics if d.rule == "OVL002")
    assert (d.position.line, d.position.column) == (10, 39)


def test_version_keyed_rule_follows_the_recipe_versions():
    """TE minimum for CUDA graphs with delayed wgrad (DW003) follows versions.transformer_engine."""
    base = {"moe.overlap": True, "moe.delay_wgrad": True, "parallelism.ep": 2,
            "cuda_graphs.impl": "transformer_engine", "cuda_graphs.modules": ["moe_router", "moe_preprocess"]}
    old = analyse(str(RULE_BASE), overrides({**base, "versions.transformer_engine": "2.9.1"}))
    new = analyse(str(RULE_BASE), overrides({**base, "versions.transformer_engine": "2.10.0"}))
    assert "DW003" in [d.rule for d in old.diagnostics]
    assert "DW003" not in [d.rule for d in new.diagnostics]
