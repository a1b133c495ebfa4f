"""Memory truth (issue 19 item 5): the figure the planner fits is the figure the plan is checked with.

The planner ranks candidates by ``memory.Estimator`` against its headroom (``resolve/search.py``);
``MEM001`` checks the emitted plan with ``memory.estimate`` on the final settings. Both must read the
same estimate, or a plan the search believed to fit is refused afterwards (or the other way round).
"""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli
from mocompile import init, memory
from mocompile.pipeline import analyse

# Bridge perf recipes whose plans graph attention too (te_arp: attn, moe_router, moe_preprocess), and one that
# graphs only the router scopes (te_rp)
TE_ARP = ["qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config", "qwen3_30b_a3b_pretrain_8gpu_gb200_bf16_config"]
TE_RP = ["qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"]


def shipped(tmp_path, recipe: str, sets: list[str] | None = None):
    """The intent `mocompile init --from <recipe>` writes: every knob pinned to the shipped recipe."""
    path = tmp_path / f"{recipe}.yaml"
    path.write_text(init.intent_text(init.find(recipe), benchmark=True))
    return analyse(str(path), sets or [])


@pytest.mark.parametrize("recipe", TE_ARP + TE_RP)
def test_the_planner_weighs_the_plan_it_emits(tmp_path, recipe):
    """The search's estimate of the chosen plan is the final one, attention graphs included (was 168.49 GiB in
    the search against 180.49 GiB final for the 8x B200 BF16 recipe: one graphed scope instead of two)."""
    r = shipped(tmp_path, recipe)
    assert r.plan.planner["chosen"]["memory_gib"] == r.plan["memory_estimate_gib"]


def test_attention_graphs_hold_buffers_of_their_own(tmp_path):
    """TE graphs of attention add a fifth of the router scopes' static buffers (``memory.ATTN_GRAPH_SHARE``): the
    rank probe measured 3.0 GiB for the router scopes per micro-batch in flight (6.00 GiB with EP overlap) and
    3.57 GiB for attention + the router scopes (Qwen3-30B-A3B's rank 0 of 16, graphs on and off)."""
    assert memory.ATTN_GRAPH_SHARE == pytest.approx((3.57 - 6.00 / 2) / (6.00 / 2), abs=0.015)  # 0.19
    r = shipped(tmp_path, TE_ARP[0])
    assert r.plan["cuda_graph_modules"] == ["attn", "moe_router", "moe_preprocess"]
    cfg = r.plan.values()
    both = memory.estimate(r.plan.model, cfg)["graph_buffers_gib"]
    router = memory.estimate(r.plan.model, dict(cfg, cuda_graph_modules=["moe_router", "moe_preprocess"]))
    attn = memory.estimate(r.plan.model, dict(cfg, cuda_graph_modules=["attn"]))
    assert both == pytest.approx(router["graph_buffers_gib"] + attn["graph_buffers_gib"], abs=0.02) and both > 0
    assert attn["graph_buffers_gib"] == pytest.approx(0.2 * router["graph_buffers_gib"], abs=0.02)


# -- the estimate's measured error, kept once as data ----------------------------------------------

GRID = ROOT / "benchmarks" / "results" / "te-h100x4-2026-11-26" / "grid.json"
# the TE grid's plans pinned in their recipes (the `auto` one follows the planner, so its measured peak may be
# of another plan than today's)
PINNED = ["bench-te-mid-ep4-off", "bench-te-mid-ep4-off-moeact", "bench-te-mid-ep4-on",
          "bench-te-mid-ep4-on-graphs", "bench-te-mid-ep4-on-wgrad"]


def test_the_measured_error_is_the_largest_error_on_the_measured_peaks():
    """``data/memory.yaml``'s measured_error is |estimate / peak allocated - 1| at its worst over every measured
    peak the estimate is held to: the TE grid's pinned plans (4x H100, -6.8 % .. +0.9 %) and the rank probe's
    full-size ranks (tests/test_rankprobe_truth.py; its one known gap, an over-estimate it tracks, aside). When the
    estimate or the measurements change, this says the figure must follow."""
    from test_rankprobe_truth import RUNS, _probed_estimate

    grid = json.loads(GRID.read_text())["variants"]
    errors = []
    for name in PINNED:
        est = analyse(str(ROOT / "recipes" / "bench" / f"{name}.yaml")).plan.memory["estimate_gib"]
        errors.append(est / grid[name]["summary"]["peak_allocated_gib"] - 1)
    assert min(errors) == pytest.approx(-0.068, abs=0.0005) and max(errors) == pytest.approx(0.009, abs=0.0005)
    probed = [_probed_estimate(r) / r["peak_allocated_gib"] - 1 for r in RUNS if not r.get("known_gap")]
    assert len(probed) == 26
    # the rank probe's worst: Qwen3-30B-A3B's rank 0 of 16 H100s with EP overlap and graphs off, +9.2 %
    assert max(probed) == pytest.approx(0.092, abs=0.0005) and min(probed) > -0.05
    assert memory.limits()["measured_error"] == round(max(abs(e) for e in errors + probed), 3) == 0.092


# -- goal fit and MEM001 at the planner's headroom -------------------------------------------------

DSV3_FIT = "schema: 1\nmodel: deepseek-v3\nhardware: {gpu: h100, nodes: NODES}\ngoal: fit\n"


# Adam's memory levers closed: these tests pin the fp32-state boundary (tests/test_optimizer_levers.py has the ladder)
CLOSED = ["training.optimizer_state=fp32", "training.optimizer_offload=0", "parallelism.fsdp=false",
          "recompute.offload_modules=[]"]


def dsv3_fit(tmp_path, nodes: int):
    path = tmp_path / f"dsv3-{nodes}.yaml"
    path.write_text(DSV3_FIT.replace("NODES", str(nodes)))
    return path


def mem(r, rule: str = "MEM001"):
    return [d for d in r.diagnostics if d.rule == rule]


def test_fit_on_the_smallest_node_count_that_fits_compiles_under_the_headroom(tmp_path):
    """DeepSeek-V3 on H100 fits first on 24 nodes (192 GPUs) by the planner's estimate and headroom."""
    r = analyse(str(dsv3_fit(tmp_path, 24)))
    assert not r.errors, [(d.rule, d.message) for d in r.errors]
    assert r.plan["memory_estimate_gib"] <= r.plan["memory_limit_gib"] == memory.usable_gib(80) == 73.6


def test_fit_one_node_fewer_is_refused_and_names_the_smallest_count(tmp_path):
    """On 23 nodes the best plan needs 75.56 GiB: 94 % of the GPU, over the 73.6 GiB the planner allows itself.
    `fit` used to exit 0 with it (MEM001 fired only over 100 %) and named 256 GPUs (doublings)."""
    path = dsv3_fit(tmp_path, 23)
    r = analyse(str(path), CLOSED)
    [d] = mem(r)
    assert d.severity == "error"
    assert d.message.startswith("estimated peak 75.56 GiB per GPU exceeds the 73.6 GiB a plan may fill on NVIDIA H100")
    assert "(92% of its 80 GiB: the planner's headroom)" in d.message
    assert d.message.endswith("the smallest GPU count (whole nodes of 8) with a layout that fits is 192")
    assert run_cli("lint", str(path), *[a for c in CLOSED for a in ("--set", c)]).returncode == 1
    # with the levers left auto, the 20 nodes fit on a rung of Adam's memory ladder
    free = analyse(str(path))
    assert not mem(free) and (free.plan["optimizer_state"] != "fp32" or free.plan["optimizer_offload_fraction"] > 0)


def pinned(p) -> list[str]:
    """--set values that pin every knob of plan ``p``: the planner then has nothing left to choose."""
    disp = p["moe_flex_dispatcher_backend"] if p["moe_token_dispatcher_type"] == "flex" else p["moe_token_dispatcher_type"]
    sets = [f"parallelism.tp={p['tensor_model_parallel_size']}", f"parallelism.pp={p['pipeline_model_parallel_size']}",
            f"parallelism.vpp={p['virtual_pipeline_model_parallel_size'] or 1}",
            f"parallelism.ep={p['expert_model_parallel_size']}", f"parallelism.etp={p['expert_tensor_parallel_size']}",
            f"parallelism.cp={p['context_parallel_size']}", f"moe.dispatcher={disp}",
            f"recompute.granularity={p['recompute_granularity'] or 'none'}"]
    if p["recompute_granularity"] == "full":
        sets += [f"recompute.method={p['recompute_method']}", f"recompute.num_layers={p['recompute_num_layers']}"]
    elif p["recompute_granularity"] == "selective":
        sets.append(f"recompute.modules=[{', '.join(p['recompute_modules'])}]")
    return sets


@pytest.mark.parametrize("below,refused", [(0.0, False), (0.01, True)])
def test_fit_exactly_at_the_headroom_compiles_and_a_hundredth_below_is_refused(tmp_path, monkeypatch, below, refused):
    """The planner's fit test and MEM001 read the same estimate against the same limit: the 192-GPU plan, pinned,
    is emitted with the headroom exactly at its estimate, and refused with the headroom 0.01 GiB under it."""
    path = dsv3_fit(tmp_path, 24)
    p = analyse(str(path), CLOSED).plan
    est, sets = p["memory_estimate_gib"], pinned(p) + CLOSED
    monkeypatch.setattr(memory, "limits", lambda: {"headroom": (est - below) / 80, "measured_error": 0.074,
                                                           "host_headroom": 0.75})
    assert memory.usable_gib(80) == round(est - below, 2)
    r = analyse(str(path), sets)
    assert r.plan["memory_estimate_gib"] == r.plan.planner["chosen"]["memory_gib"] == est
    assert bool(mem(r)) is refused
    assert r.plan.settings["tensor_model_parallel_size"].source == "user"


# -- a shipped recipe within the estimate's measured error ------------------------------------------

QWEN_B200 = {"qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx_config": (183.58, "3.58 GiB (2.0%)")}
B200_BF16 = "qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config"


@pytest.mark.parametrize("recipe", QWEN_B200)
def test_a_shipped_recipe_over_the_gpu_within_the_measured_error_is_a_warning_naming_the_margin(tmp_path, recipe):
    """NVIDIA's Qwen3-30B-A3B 8x B200 MXFP8 recipe, as `init` pins it, is estimated over the 180 GiB of a B200 by
    less than the estimate's measured error (9.2 %): it is measured to run, so this is a warning (was MEM001,
    'largest term: None')."""
    r = shipped(tmp_path, recipe)
    est, margin = QWEN_B200[recipe]
    assert r.plan["memory_estimate_gib"] == est and r.plan["shipped_recipe"] == recipe
    assert not r.errors, [(d.rule, d.message) for d in r.errors]
    [d] = mem(r, "MEM002")
    assert d.severity == "warning"
    assert d.message.startswith(f"estimated peak {est} GiB per GPU is {margin} over the 180 GiB of NVIDIA B200")
    assert "within the memory estimate's measured error (9.2%: up to 196.56 GiB)" in d.message
    assert recipe in d.message
    proc = run_cli("lint", str(tmp_path / f"{recipe}.yaml"))
    assert proc.returncode == 0 and "MEM002" in proc.stdout


def test_the_bf16_b200_recipe_fits_its_gpu_by_the_estimate(tmp_path):
    """Its BF16 sibling (attention graphs at their measured fifth of the router scopes') is estimated under the
    GPU: no memory diagnostic at all (it was 0.49 GiB over before that measurement)."""
    r = shipped(tmp_path, B200_BF16)
    assert r.plan["shipped_recipe"] == B200_BF16 and r.plan["memory_estimate_gib"] <= 180
    assert not [d for d in r.diagnostics if d.rule.startswith("MEM")]


@pytest.mark.parametrize("over,rule", [(0.0, "MEM002"), (0.01, "MEM001")])
def test_a_shipped_recipe_is_refused_only_beyond_the_measured_error(tmp_path, monkeypatch, over, rule):
    """Exactly at the GPU's memory plus the measured error: a warning; 0.01 GiB beyond it: MEM001, which says
    which limit it applied."""
    recipe = "qwen3_30b_a3b_pretrain_8gpu_b200_fp8mx_config"
    est = QWEN_B200[recipe][0]
    monkeypatch.setattr(memory, "limits", lambda: {"headroom": 0.92, "measured_error": (est - over) / 180 - 1,
                                                           "host_headroom": 0.75})
    assert memory.shipped_limit_gib(180) == round(est - over, 2)
    r = shipped(tmp_path, recipe, CLOSED)
    assert [d.rule for d in r.diagnostics if d.rule.startswith("MEM")] == [rule]
    if rule == "MEM001":
        [d] = mem(r)
        assert f"plus the memory estimate's measured error of {(est - over) / 180 - 1:.1%}: {recipe} run as shipped" \
            in d.message


@pytest.mark.parametrize("change", ["moe.force_balance=false", "training.seq_length=8192", "goal=fit"])
def test_a_shipped_recipe_changed_by_the_intent_gets_the_headroom(tmp_path, change):
    """The measurement covers the recipe's own shape only: natural routing, a longer sequence, or `fit` (FP32
    gradient reduction) make it one more plan under the planner's headroom, and over it here."""
    recipe = "qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config"
    path = tmp_path / "q.yaml"
    path.write_text(init.intent_text(init.find(recipe), benchmark=True))
    r = analyse(str(path), [change] + CLOSED)
    assert r.plan["shipped_recipe"] is None and r.plan["memory_limit_gib"] == memory.usable_gib(180)
    assert not mem(r, "MEM002")
    [d] = mem(r)
    assert d.severity == "error" and "the planner's headroom" in d.message


# -- no message prints a placeholder ---------------------------------------------------------------

PLACEHOLDER_CASES = [
    ("deepseek-v3 fit on 1 node", DSV3_FIT.replace("NODES", "1"), []),
    ("deepseek-v3 fit on 20 nodes", DSV3_FIT.replace("NODES", "20"), CLOSED),
    ("every knob pinned, over the headroom", DSV3_FIT.replace("NODES", "20"),
     ["parallelism.tp=8", "parallelism.pp=5", "parallelism.ep=32", "parallelism.vpp=1", "recompute.granularity=none"]
     + CLOSED),
    ("nothing fits on any count", DSV3_FIT.replace("NODES", "1") + "training: {seq_length: 1048576, micro_batch_size: 16,"
     " global_batch_size: 64}\n", []),
]


@pytest.mark.parametrize("name,text,sets", PLACEHOLDER_CASES, ids=[c[0] for c in PLACEHOLDER_CASES])
def test_memory_messages_never_print_a_placeholder(tmp_path, name, text, sets):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    found = [d for d in analyse(str(path), sets).diagnostics if d.rule.startswith("MEM")]
    assert found
    for d in found:
        assert "None" not in d.message and "{" not in d.message, d.message


def test_the_shipped_recipes_messages_never_print_a_placeholder(tmp_path):
    for recipe in QWEN_B200:
        for d in shipped(tmp_path, recipe).diagnostics:
            assert "None" not in d.message and "{" not in d.message, (d.rule, d.message)


# -- which plans a shipped recipe's measurement covers ----------------------------------------------

B300_INTENT = ("schema: 1\nmodel: qwen3-30b-a3b\nhardware: {gpu: b300, nodes: 1, gpus_per_node: 8}\ngoal: throughput\n"
               "training: {seq_length: 4096, micro_batch_size: 8, global_batch_size: 512, precision: mxfp8}\n"
               "moe: {force_balance: true}\n")


def test_a_shipped_recipe_with_fewer_graph_buffers_is_still_covered_by_its_measurement(tmp_path):
    """Nothing pinned: the planner offers router-scope graphs, not the full-iteration graphs Bridge's 8x B300 MXFP8
    recipe runs with, and the recipe with router graphs needs less memory than the one measured (295.16 against
    299.14 GiB, both over the 264.96 GiB headroom): it is kept as the measured recipe, over the GPU by less than the
    estimate's measured error, so a MEM002 warning and no error."""
    recipe = "qwen3_30b_a3b_pretrain_8gpu_b300_fp8mx_config"
    path = tmp_path / "q.yaml"
    path.write_text(B300_INTENT)
    r = analyse(str(path))
    p = r.plan
    assert p.planner["chosen"]["anchor"] == recipe and p["shipped_recipe"] == recipe
    assert p["cuda_graph_impl"] == "transformer_engine" and p["cuda_graph_modules"] == ["moe_router", "moe_preprocess"]
    assert p["recompute_granularity"] is None
    assert memory.usable_gib(288) < p["memory_estimate_gib"] == 295.16 <= memory.shipped_limit_gib(288)
    assert not r.errors and [d.rule for d in r.diagnostics if d.rule.startswith("MEM")] == ["MEM002"]
    ran = shipped(tmp_path, recipe)  # as the recipe ran: full-iteration graphs
    assert ran.plan["cuda_graph_impl"] == "full_iteration" and ran.plan["memory_estimate_gib"] == 299.14


def test_only_the_recipes_knobs_with_at_most_its_graph_buffers_are_covered(tmp_path):
    from dataclasses import replace

    from mocompile.load import load
    from mocompile.resolve import context, search
    from mocompile.schema import validate
    recipe = "qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config"
    path = tmp_path / "q.yaml"
    path.write_text(init.intent_text(init.find(recipe), benchmark=True))
    doc = load(str(path))
    ctx = context(validate(doc), doc)
    sc = search.Scorer(ctx)
    shipped = replace(search.anchor_candidate(ctx, init.find(recipe), pins=False), graphs="te_arp")
    assert sc.shipped(shipped) == recipe
    assert sc.shipped(replace(shipped, graphs="te_rp")) == recipe       # the router scopes only: fewer buffers
    assert sc.shipped(replace(shipped, graphs="none")) == recipe
    assert sc.shipped(replace(shipped, ep=4)) is None                   # another layout: not what was measured
    assert sc.shipped(replace(shipped, overlap=True)) is None


def test_a_shipped_recipe_over_the_headroom_says_why_its_recompute_is_not_heavier(tmp_path):
    """NVIDIA's Qwen3-30B-A3B 8x B200 BF16 recipe with its recompute left auto: the plan is still the shipped
    recipe, estimated over the planner's 166 GiB headroom (within the measured error), so the recompute decision
    says it runs as shipped rather than claiming the lightest recompute that fits."""
    recipe = "qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config"
    text = init.intent_text(init.find(recipe), benchmark=True)
    path = tmp_path / "r.yaml"
    path.write_text("\n".join(line for line in text.splitlines() if not line.startswith("recompute:")) + "\n")
    plan = analyse(str(path)).plan
    assert plan["shipped_recipe"] == recipe and plan["memory_estimate_gib"] > 166
    assert plan.settings["recompute_granularity"].reason == (
        f"the shipped recipe's ({recipe}): {plan['memory_estimate_gib']:.1f} GiB, over the 165.6 GiB usable, run as "
        "shipped (see memory_limit_gib)")
