"""`mocompile init --from`: an intent pinned to a shipped Bridge perf recipe compiles back to that recipe."""

from __future__ import annotations

import pytest
from conftest import run_cli
from mocompile import init
from mocompile.pipeline import analyse
from mocompile.resolve.search import anchors

RECIPES = ["qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config", "deepseek_v3_pretrain_1024gpu_h100_bf16_config",
           "qwen3_235b_a22b_pretrain_256gpu_gb200_fp8mx_config", "gpt_oss_120b_pretrain_64gpu_h100_bf16_config",
           "kimi_k2_pretrain_256gpu_gb200_bf16_config"]  # trains with Muon: the intent must say so


def _shape(p):
    disp = p["moe_flex_dispatcher_backend"] if p["moe_token_dispatcher_type"] == "flex" else p["moe_token_dispatcher_type"]
    return (p["tensor_model_parallel_size"], p["pipeline_model_parallel_size"],
            p["virtual_pipeline_model_parallel_size"] or 1, p["expert_model_parallel_size"], disp,
            bool(p["overlap_moe_expert_parallel_comm"]), bool(p["delay_wgrad_compute"]), p["global_batch_size"])


@pytest.mark.parametrize("name", RECIPES)
def test_the_pinned_intent_compiles_to_the_shipped_recipe(tmp_path, name):
    """--benchmark: the recipe as NVIDIA measured it, force-balanced routing included."""
    out = tmp_path / "intent.yaml"
    proc = run_cli("init", "--from", name, "--benchmark", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    a = next(a for a in anchors() if a["recipe"] == name)
    r = analyse(str(out))
    assert not r.errors, [(d.rule, d.message) for d in r.errors]
    assert _shape(r.plan) == (a["tp"], a["pp"], a["vpp"], a["ep"], a["dispatcher"], a["overlap"], a["delay_wgrad"],
                              a["gbs"])
    assert r.plan.planner["chosen"]["anchor"].startswith(name)
    assert r.plan["optimizer"] == a.get("optimizer", "adam")


def test_weak_scaling_grows_data_parallelism_and_the_global_batch(tmp_path):
    out = tmp_path / "big.yaml"
    assert run_cli("init", "--from", RECIPES[0], "--gpus", "64", "-o", str(out)).returncode == 0
    p = analyse(str(out)).plan
    assert p["world_size"] == 64 and p["global_batch_size"] == 4096 and p["expert_model_parallel_size"] == 16


def test_a_gpu_count_the_recipe_cannot_use_is_refused():
    proc = run_cli("init", "--from", RECIPES[0], "--gpus", "24")
    assert proc.returncode == 2 and "multiple of 16" in proc.stderr and "Traceback" not in proc.stderr


def test_unknown_recipe_suggests_close_names():
    proc = run_cli("init", "--from", "qwen3_30b_a3b_pretrain_16gpu_h100_bf17_config")
    assert proc.returncode == 2 and "did you mean qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config" in proc.stderr


def test_init_never_overwrites_a_file(tmp_path):
    out = tmp_path / "mine.yaml"
    out.write_text("# my own work\n")
    proc = run_cli("init", "--from", RECIPES[0], "-o", str(out))
    assert proc.returncode == 2 and "never overwrites" in proc.stderr
    assert out.read_text() == "# my own work\n"


def test_list_names_every_recipe():
    proc = run_cli("init", "--list")
    assert proc.returncode == 0
    assert len(proc.stdout.splitlines()) == len(anchors())


def _compile(tmp_path, text, name="intent.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return analyse(str(path))


def test_every_listed_recipe_compiles_by_default_and_as_a_benchmark(tmp_path):
    """`init --list` offers only what compiles: at its size, or the smallest size that holds its layout; and by
    default with the model's own routing (a real run must learn its routing)."""
    for i, a in enumerate(anchors()):
        text = init.intent_text(a)
        assert "force_balance" not in text.replace("# moe.force_balance", ""), a["recipe"]
        r = _compile(tmp_path, text, f"{i}.yaml")
        assert not r.errors, (a["recipe"], [(d.rule, d.message) for d in r.errors])
        assert r.plan["moe_router_force_load_balancing"] is False
        bench = _compile(tmp_path, init.intent_text(a, benchmark=True), f"{i}b.yaml")
        assert not bench.errors, (a["recipe"], [(d.rule, d.message) for d in bench.errors])
        assert bench.plan["moe_router_force_load_balancing"] is True


def test_the_default_intent_keeps_the_recipes_knobs_with_natural_routing(tmp_path):
    a = next(a for a in anchors() if a["recipe"] == RECIPES[0])
    p = _compile(tmp_path, init.intent_text(a)).plan
    assert _shape(p) == (a["tp"], a["pp"], a["vpp"], a["ep"], a["dispatcher"], a["overlap"], a["delay_wgrad"], a["gbs"])
    assert p["moe_router_force_load_balancing"] is False
    assert "NVIDIA measured this recipe with force-balanced routing (--benchmark)" in init.intent_text(a)
    assert "the model does not learn routing" in init.intent_text(a, benchmark=True)


def test_a_recipe_whose_layout_needs_more_gpus_than_its_name_is_written_at_the_smallest_size_that_holds_it(tmp_path):
    name = "deepseek_v3_pretrain_64gpu_h100_bf16_config"  # TP2 PP8 VPP4 EP64: PP x EP = 512 GPUs
    a = init.find(name)
    assert a["gpus"] == 64 and init.model_parallel(a) == 512 and init.smallest_size(a) == 512
    proc = run_cli("init", "--from", name, "-o", str(tmp_path / "dsv3.yaml"))
    assert proc.returncode == 0 and "layout needs 512 GPUs, not 64" in proc.stderr
    text = (tmp_path / "dsv3.yaml").read_text()
    assert "written at 512 GPUs" in text and "nodes: 64, gpus_per_node: 8" in text
    p = analyse(str(tmp_path / "dsv3.yaml")).plan
    assert p["world_size"] == 512 and p["global_batch_size"] == a["gbs"] * 8  # weak-scaled by DP, as --gpus does
    listed = run_cli("init", "--list").stdout
    assert f"{name}" in listed and "(its layout needs 512)" in next(ln for ln in listed.splitlines() if name in ln)
    # a recipe that fits its listed size says nothing of the sort
    assert "needs" not in next(ln for ln in listed.splitlines() if RECIPES[0] in ln)


def test_the_size_a_layout_needs_is_pp_times_the_lcm_of_attention_and_expert_groups():
    base = {"tp": 1, "cp": 1, "etp": 1, "pp": 1, "ep": 1}
    assert init.model_parallel(dict(base, tp=3, ep=4)) == 12  # not max(3, 4): both groups fold into one stage
    assert init.model_parallel(dict(base, tp=2, cp=2, ep=8, pp=4)) == 32
    assert init.model_parallel(dict(base, tp=4, ep=2, etp=2)) == 4


def test_where_the_recipes_recompute_fits_only_with_balanced_routing_the_planner_adds_it(tmp_path):
    a = init.find("qwen3_30b_a3b_pretrain_8gpu_b200_bf16_config")  # no recompute, MBS 4: over 166 GiB with natural routing
    text = init.intent_text(a)
    assert "recompute: {granularity: auto, offload_modules: []}" in text and "fits only with force-balanced routing" in text
    assert "micro_batch_size: 4" in text  # recompute alone is enough at MBS 4: the recipe's MBS is kept
    assert not _compile(tmp_path, text).errors
    bench = init.intent_text(a, benchmark=True)  # as measured: the recipe's own knobs, kept
    assert "micro_batch_size: 4" in bench and 'recompute: {granularity: "none", offload_modules: []}' in bench
    fits = init.find(RECIPES[0])  # fits with natural routing: nothing unpinned
    assert "auto" not in init.intent_text(fits).split("schema: 1")[1]


def test_weak_scaling_down_halves_data_parallelism_and_the_global_batch(tmp_path):
    a = next(a for a in anchors() if init.model_parallel(a) * 2 <= a["gpus"] // 2 and a["gpus"] // 2 > 8)
    p = _compile(tmp_path, init.intent_text(a, a["gpus"] // 2, benchmark=True)).plan
    assert p["world_size"] == a["gpus"] // 2 and p["global_batch_size"] == a["gbs"] // 2


def test_an_unknown_recipe_offers_at_most_three_close_names():
    proc = run_cli("init", "--from", "qwen3_30b_a3b_pretrain_16gpu_h100_bf17")
    names = proc.stderr.split("did you mean ", 1)[1].split("?")[0].split(", ")
    assert proc.returncode == 2 and len(names) == 3 and all(n.startswith("qwen3_30b_a3b_pretrain_") for n in names)


def test_the_config_suffix_is_optional_and_the_comment_says_how_the_size_was_chosen():
    a = init.find("qwen3_30b_a3b_pretrain_16gpu_h100_bf16")  # the `_config` suffix added
    assert a["recipe"] == "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"
    assert "), as shipped." in init.intent_text(a)
    assert "weak-scaled by DP to 64 GPUs" in init.intent_text(a, 64) and "as shipped" not in init.intent_text(a, 64)
    dsv3 = init.intent_text(init.find("deepseek_v3_pretrain_64gpu_h100_bf16_config"))
    assert "its layout (PP8 x EP64, TP2) does not fit the 64 GPUs" in dsv3  # no " x ETP1" for ETP 1


def test_fewer_gpus_than_a_node_is_one_partial_node():
    """No shipped recipe is smaller than a node, but a held-out one may be: EP 2 written for 4 of 8 GPUs."""
    a = dict(next(a for a in anchors() if a["gpu"] == "h100"), tp=1, pp=1, vpp=1, cp=1, ep=2, etp=1, gpus=8, gbs=64)
    text = init.intent_text(a, 4, benchmark=True)
    assert "hardware: {gpu: h100, nodes: 1, gpus_per_node: 4}" in text and "global_batch_size: 32" in text
