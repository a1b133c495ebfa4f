"""`mocompile init --from`: an intent pinned to a shipped Bridge perf recipe compiles back to that recipe."""

from __future__ import annotations

import pytest

from conftest import run_cli
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
    out = tmp_path / "intent.yaml"
    proc = run_cli("init", "--from", name, "-o", str(out))
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
