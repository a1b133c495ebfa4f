"""What the preflight checks at launch (render.requirements) follows from the plan, and every generated
file ends with one newline. Behaviour, not golden files: each value is derived here from the rule it encodes."""

from __future__ import annotations

import pytest

from conftest import ROOT
from mocompile.emit import render
from mocompile.pipeline import analyse, compile_recipe

WGRAD = ROOT / "recipes" / "bench" / "bench-te-mid-ep4-on-wgrad.yaml"  # TE 2.12, overlap + delayed wgrad, no graphs


def _req(path, *sets):
    r = analyse(str(path), list(sets))
    assert not r.errors, [d.message for d in r.errors]
    return render.requirements(r.plan), r.plan


@pytest.mark.parametrize("sets,te_min", [
    ((), "2.7.0"),                                                   # delayed wgrad with grad overlap: TE 2.7
    (("cuda_graphs.impl=transformer_engine", "cuda_graphs.modules=[moe_router]"), "2.10.0"),  # + TE graphs: 2.10
    (("cuda_graphs.impl=transformer_engine", "cuda_graphs.modules=[attn]", "versions.apex=present"), "2.12.0"),  # + attention
])
def test_the_te_minimum_is_the_highest_any_used_feature_needs(sets, te_min):
    req, plan = _req(WGRAD, *sets)
    assert plan["delay_wgrad_compute"] is True
    assert req["transformer_engine"] == te_min


def test_graphed_attention_without_delayed_wgrad_needs_no_newer_te():
    req, plan = _req(WGRAD, "moe.delay_wgrad=false", "cuda_graphs.impl=transformer_engine", "cuda_graphs.modules=[attn]")
    assert plan["delay_wgrad_compute"] is False and req["transformer_engine"] == "1.7.0"


def test_the_hybridep_probe_holds_one_layers_local_experts():
    req, plan = _req(ROOT / "recipes" / "bench" / "bench-tiny-flex-hybridep.yaml")
    ep = plan["expert_model_parallel_size"]
    assert ep > 1
    assert req["hybridep_probe"]["local_experts"] == plan.model["num_moe_experts"] // ep
    assert req["hybridep_probe"]["tokens"] == plan["seq_length"] * plan["micro_batch_size"]


@pytest.mark.parametrize("recipe", ["tiny-moe-h100x2.yaml", "qwen3-235b-a22b-gb200.yaml"])
def test_every_generated_file_ends_with_exactly_one_newline(recipe):
    for name, text in compile_recipe(str(ROOT / "recipes" / recipe)).files.items():
        assert text.endswith("\n") and not text.endswith("\n\n"), name
