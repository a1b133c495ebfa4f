"""Goal ``fit`` and the memory ladder, as a user who pins what ``auto`` chose, or asks for too little, sees them.

Found by a held-out sweep of intents nobody tuned: pinning a knob to the value fit chose changed the plan (the band of
"equal" memory was drawn from the least memory among the plans a pin left in the search), a ladder rung was judged
on GPU memory while its plan broke the host-memory rule (MEM003), the "smallest GPU count" counted counts the global
batch cannot run on (PAR007), a pin's own rule error came with a spurious MEM001, and pinning only
``recompute.granularity: full`` failed RC003 although auto's full rung is uniform over one layer."""

from __future__ import annotations

import json
import math

import pytest
from conftest import ROOT
from mocompile import memory
from mocompile.pipeline import analyse
from mocompile.resolve.search import memory_step

KNOBS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
         "expert_model_parallel_size", "moe_token_dispatcher_type", "moe_flex_dispatcher_backend",
         "recompute_granularity", "recompute_modules", "recompute_method", "recompute_num_layers",
         "optimizer_offload_fraction", "memory_estimate_gib", "step_time_estimate_s")


def _plan(tmp_path, text: str, name: str = "r"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return analyse(str(path))


def _knobs(p) -> dict:
    return {k: p[k] for k in KNOBS}


def test_memory_is_read_on_a_fixed_grid_as_wide_as_the_estimates_error():
    err = memory.limits()["measured_error"]
    for gib in (3.1, 17.0, 60.8, 150.2):
        assert memory_step(gib * (1 + err) * 1.0001) == memory_step(gib * 1.0001) + 1
        assert memory_step(gib) == math.floor(math.log(gib) / math.log1p(err))  # no dependence on other plans


QNEXT_FIT = "schema: 1\nname: r\nmodel: qwen3-next-80b-a3b\nhardware: {gpu: h100, nodes: 1}\ngoal: fit\n"
PINS = {"tensor_model_parallel_size": ("parallelism", "tp"), "pipeline_model_parallel_size": ("parallelism", "pp"),
        "expert_model_parallel_size": ("parallelism", "ep")}


@pytest.mark.parametrize("text", [QNEXT_FIT, (ROOT / "recipes" / "qwen3-30b-a3b-h100x8-fit.yaml").read_text()])
def test_pinning_the_values_fit_chose_returns_the_same_plan(tmp_path, text):
    auto = _plan(tmp_path, text, "auto").plan
    want = _knobs(auto)
    pins = [f"parallelism: {{{key}: {auto[field]}}}" for field, (_, key) in PINS.items()]
    gran = auto["recompute_granularity"]
    pins.append(f"recompute: {{granularity: {gran}}}" if gran else "recompute: {granularity: none}")
    if auto["recompute_modules"]:
        pins.append(f"recompute: {{modules: {json.dumps(list(auto['recompute_modules']))}}}")
    disp = auto["moe_flex_dispatcher_backend"] if auto["moe_token_dispatcher_type"] == "flex" \
        else auto["moe_token_dispatcher_type"]
    pins.append(f"moe: {{dispatcher: {disp}}}")
    for i, pin in enumerate(pins):
        got = _plan(tmp_path, text.rstrip("\n") + "\n" + pin + "\n", f"pin{i}").plan
        assert got is not None and _knobs(got) == want, pin


def test_fit_weighs_every_recompute_rung_not_only_the_lightest_that_fits(tmp_path):
    """Qwen3-Next on one H100 node: before, each layout competed at its lightest fitting rung, and fit chose TP2 PP4
    EP2 at 67.85 GiB while a pinned rung found TP4 PP1 EP8 at 64.18 GiB and faster. Now every rung competes: the plan
    is full recompute at the least memory step, and no selective plan (pinned) is better in fit's order."""
    p = _plan(tmp_path, QNEXT_FIT).plan
    sel = _plan(tmp_path, QNEXT_FIT + "recompute: {granularity: selective}\n", "sel").plan
    assert p["recompute_granularity"] == "full" and p["memory_estimate_gib"] < 64.18
    order = lambda q: (memory_step(q["memory_estimate_gib"]), q["step_time_estimate_s"])  # noqa: E731
    assert order(p) < order(sel)


def test_pinning_full_recompute_alone_takes_autos_full_rung(tmp_path):
    r = _plan(tmp_path, QNEXT_FIT + "recompute: {granularity: full}\n")
    assert not r.errors
    assert (r.plan["recompute_method"], r.plan["recompute_num_layers"]) == ("uniform", 1)


def test_a_ladder_rung_that_breaks_host_memory_is_not_taken_when_another_layout_fits_both(tmp_path):
    """Kimi-K2 on 8 B200 nodes, goal fit: offload 0.75's first plan pinned 1539 GiB of host memory per node over the
    1536 a node may pin (MEM003) and MEM001 said "64 with offload 0.75" while on 64; a layout that fits both exists."""
    r = _plan(tmp_path, "schema: 1\nname: r\nmodel: kimi-k2\nhardware: {gpu: b200, nodes: 8}\ngoal: fit\n")
    assert not r.errors, [d.rule for d in r.errors]
    p = r.plan
    assert p["optimizer_offload_fraction"] > 0
    assert p["memory_host_node_gib"] <= p["host_memory_limit_gib"]
    assert p["memory_estimate_gib"] <= p["memory_limit_gib"]


def test_the_smallest_gpu_count_is_one_the_global_batch_runs_on(tmp_path):
    """GLM-4.5-Air pinned to TP1 PP1 EP1 on 4 H100 nodes: FSDP fits on 7 nodes, but 56 does not divide the global
    batch of 1024 (PAR007); the count named is the next one it does, 64."""
    r = _plan(tmp_path, "schema: 1\nname: r\nmodel: glm-4.5-air\nhardware: {gpu: h100, nodes: 4}\ngoal: fit\n"
                        "parallelism: {tp: 1, pp: 1, ep: 1}\ntraining: {global_batch_size: 1024}\n")
    mem = [d for d in r.errors if d.rule == "MEM001"]
    assert mem and "64 with parallelism.fsdp: true" in mem[0].message and "56 with" not in mem[0].message
    assert 1024 % 64 == 0 and 1024 % 56 != 0


def test_a_pins_own_rule_error_comes_without_a_spurious_memory_error(tmp_path):
    """EP 1 with EP overlap pinned (OVL001) on one H100 node: every ladder rung's plan breaks OVL001 as the plain
    plan does; the rung that fits on memory is taken, so the user reads OVL001 alone, not a MEM001 whose ladder
    lists rungs under the limit as not fitting."""
    r = _plan(tmp_path, "schema: 1\nname: r\nmodel: qwen3-30b-a3b\nhardware: {gpu: h100, nodes: 1}\n"
                        "goal: throughput\ntraining: {global_batch_size: 256}\nparallelism: {ep: 1}\nmoe: {overlap: true}\n")
    assert [d.rule for d in r.errors] == ["OVL001"]


def test_explain_says_when_no_plan_fits_and_which_bring_up_choices_were_pinned(tmp_path):
    why = _plan(tmp_path, "schema: 1\nname: r\nmodel: glm-4.5-air\nhardware: {gpu: h100, nodes: 1}\ngoal: bring-up\n",
                "a").plan.settings["tensor_model_parallel_size"].reason
    assert why.startswith("no plan fits under the 73.6 GiB limit") and "simplest legal plan" not in why
    why = _plan(tmp_path, "schema: 1\nname: r\nmodel: qwen3-30b-a3b\nhardware: {gpu: h100, nodes: 1}\n"
                          "goal: bring-up\ntraining: {global_batch_size: 256}\nmoe: {dispatcher: deepep}\n",
                "b").plan.settings["tensor_model_parallel_size"].reason
    assert why.startswith("simplest legal plan (") and "dispatcher as pinned" in why
