"""Megatron-FSDP (parallelism.fsdp): what it holds per GPU, what it costs per step, when the planner takes it, and
what train.py sets for it. Rules FSD001-FSD004 have their boundary cases in tests/test_rule_boundaries.py and the
generated recipe goes through Bridge's real validation in tests/stack (test_generated_recipes, test_parity_fsdp)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from mocompile import memory, steptime
from mocompile.steptime import Candidate
from test_steptime import TOY, hw

FSDP_RECIPE = ROOT / "recipes" / "deepseek-v3-gb300x64-fsdp.yaml"


def _flat(**over):
    c = dict(world_size=8, seq_length=1024, micro_batch_size=1, global_batch_size=64, tensor_model_parallel_size=1,
             pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None, context_parallel_size=1,
             expert_model_parallel_size=2, expert_tensor_parallel_size=1, recompute_granularity=None,
             optimizer="adam", grad_reduce_in_fp32=True)
    c.update(over)
    return c


@pytest.mark.parametrize("grad_fp32", [True, False])
def test_fsdp_shards_the_weights_and_gradient_buffer_over_dp_and_expert_dp(grad_fp32):
    """Without FSDP every DP rank holds the bf16 weight and the gradient buffer whole (2 + 4 B, or 2 + 2 with bf16
    gradients); with it, 1/DP of the dense ones and 1/expert-DP of the experts (DP 8, expert DP 4 on 8 GPUs at
    EP 2), plus the gathered working set: two layers and the embedding, whole. The optimizer state is sharded
    either way, so the difference is exactly that."""
    grad = 4 if grad_fp32 else 2
    off = memory.Estimator(TOY, _flat(grad_reduce_in_fp32=grad_fp32))
    on = memory.Estimator(TOY, _flat(grad_reduce_in_fp32=grad_fp32, use_megatron_fsdp=True))
    _, layers, dense, experts, w_off, *_ = off._weights_of(1, 1, 1, 2, 1)
    *_, w_on, _, _ = on._weights_of(1, 1, 1, 2, 1)
    emb = memory.parameters(TOY)["embedding"]
    gathered = (2 + grad) * (2 * ((dense - emb) / layers + experts / layers) + emb)
    saved = (2 + grad) * (dense * (1 - 1 / 8) + experts * (1 - 1 / 4))
    assert w_on == pytest.approx(w_off - saved + gathered, rel=1e-12)
    assert w_on < w_off


def test_with_nothing_to_shard_fsdp_only_adds_the_gathered_layers():
    """DP 1 and expert DP 1 (TP 8, EP 8 on 8 GPUs): nothing is sharded; FSDP still gathers layer by layer."""
    off = memory.Estimator(TOY, _flat(tensor_model_parallel_size=8, expert_model_parallel_size=8))
    on = memory.Estimator(TOY, _flat(tensor_model_parallel_size=8, expert_model_parallel_size=8, use_megatron_fsdp=True))
    assert on._weights_of(8, 1, 1, 8, 1)[4] > off._weights_of(8, 1, 1, 8, 1)[4]


def _step(fsdp: bool, gbs: int) -> steptime.StepEstimate:
    batch = steptime.Batch(4096, 1, gbs, fsdp=fsdp)
    return steptime.StepModel(TOY, hw(), batch, 16).estimate(Candidate(1, 1, 1, 8, 1, 1, "alltoall", False, False,
                                                                       (None,) * 4, "none"))


def test_fsdp_pays_its_gathers_in_every_micro_batch_and_the_rest_of_the_step_is_unchanged():
    """FSDP moves 3 passes of the weights per micro-batch (gather forward, gather backward, reduce-scatter) where
    the distributed optimizer moves 2 per step; what a micro-batch's GPU time hides is free. Only the DP term
    differs: compute, all-to-all and optimizer are the same plan."""
    for gbs in (16, 256):
        a, b = _step(False, gbs), _step(True, gbs)
        assert b.terms["dp_exposed"] >= 0.0
        for k in ("compute", "a2a_total", "optimizer", "bubble"):
            assert a.terms[k] == b.terms[k]
        assert b.step_s - a.step_s == pytest.approx(b.terms["dp_exposed"] - a.terms["dp_exposed"])


def _explain(path: Path, *sets: str) -> dict:
    args = [a for s in sets for a in ("--set", s)]
    res = run_cli("explain", str(path), *args, "--format", "json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


def test_nvidias_fsdp_recipe_shape_gets_fsdp_with_every_knob_auto():
    """deepseek_v3_pretrain_64gpu_gb300_bf16_fsdp_config's batch on 64 GB300s: without FSDP only TP 4 fits; FSDP
    fits TP 1 PP 1 EP 64 (NVIDIA's layout, its MTP layer counted) and is not slower, so the guidance's default
    (least model parallelism) takes it, and says both step times."""
    s = _explain(FSDP_RECIPE)["settings"]
    assert s["use_megatron_fsdp"]["value"] is True and s["use_megatron_fsdp"]["source"] == "goal"
    assert (s["tensor_model_parallel_size"]["value"], s["pipeline_model_parallel_size"]["value"],
            s["expert_model_parallel_size"]["value"]) == (1, 1, 64)
    reason = s["use_megatron_fsdp"]["reason"]
    assert "TP4 PP1 EP64" in reason and "less model parallelism" in reason and "s/step" in reason
    assert s["ckpt_format"]["value"] == "fsdp_dtensor"


def test_with_nvidias_activation_offload_fsdp_fits_nvidias_layout():
    """The recipe also offloads core_attn and attn_proj activations (perf_recipes/deepseek/common.py
    _apply_deepseek_v3_64gpu_gb300_fsdp_configs): with that pinned too, the plan keeps NVIDIA's layout."""
    s = _explain(FSDP_RECIPE, "recompute.offload_modules=[core_attn, attn_proj]")["settings"]
    assert s["use_megatron_fsdp"]["value"] is True
    assert (s["tensor_model_parallel_size"]["value"], s["pipeline_model_parallel_size"]["value"],
            s["expert_model_parallel_size"]["value"]) == (1, 1, 64)


def test_fsdp_pinned_off_keeps_the_tp4_plan_and_pinned_on_compiles():
    off = _explain(FSDP_RECIPE, "parallelism.fsdp=false")["settings"]
    assert off["use_megatron_fsdp"]["value"] is False and off["tensor_model_parallel_size"]["value"] == 4
    on = _explain(FSDP_RECIPE, "parallelism.fsdp=true", "parallelism.tp=1", "parallelism.pp=1", "parallelism.ep=64",
                  "moe.dispatcher=hybridep", "moe.overlap=false")
    assert not [d for d in on["diagnostics"] if d["severity"] == "error"]
    assert on["settings"]["use_megatron_fsdp"]["source"] == "user"


def test_a_plan_without_model_parallelism_is_never_traded_for_fsdp(tmp_path):
    """FSDP is only tried where it could let the plan drop model parallelism: a TP1 PP1 winner keeps the
    distributed optimizer (and no second search runs)."""
    out = _explain(ROOT / "recipes" / "qwen3-30b-a3b-h100x16-hybridep.yaml")["settings"]
    assert out["tensor_model_parallel_size"]["value"] * out["pipeline_model_parallel_size"]["value"] == 1
    assert out["use_megatron_fsdp"]["value"] is False


def test_the_generated_train_py_sets_fsdp_as_bridges_recipe_does(tmp_path):
    res = run_cli("compile", str(FSDP_RECIPE), "-o", str(tmp_path / "gen"))
    assert res.returncode == 0, res.stdout + res.stderr
    text = (tmp_path / "gen" / "deepseek-v3-gb300x64-fsdp" / "train.py").read_text()
    for line in ("cfg.ddp.use_megatron_fsdp = True", "cfg.ddp.data_parallel_sharding_strategy = 'optim_grads_params'",
                 "cfg.model.init_model_with_meta_device = True"):
        assert line in text
    # Bridge refuses Megatron-FSDP with CUDA_DEVICE_MAX_CONNECTIONS=1: the plan sets 32
    assert "'CUDA_DEVICE_MAX_CONNECTIONS': '32'" in text


def test_fit_climbs_the_ladder_in_the_guidances_order_and_fsdp_comes_last(tmp_path):
    """GPT-OSS-120B on one 8x B200 node, goal fit: the first rung that fits is optimizer offload, so the FSDP
    rung after it is never tried; goal throughput tries each lever's first fitting rung, FSDP included."""
    (tmp_path / "pyproject.toml").write_text("")
    path = tmp_path / "r.yaml"
    path.write_text("schema: 1\nname: r\nmodel: gpt-oss-120b\nhardware: {gpu: b200, nodes: 1}\ngoal: fit\n")
    s = _explain(path)["settings"]
    assert s["use_megatron_fsdp"]["value"] is False and s["optimizer_offload_fraction"]["value"] > 0
    # offload 0.25 does not fit the 165.6 GiB usable (92 % of 180), 0.5 does and is the last rung tried
    reason = s["optimizer_state"]["reason"]
    assert reason.rstrip().endswith(" s/step") and "+ FSDP" not in reason
    tried = re.findall(r"fp32 \+ offload ([0-9.]+): ([0-9.]+) GiB", reason)
    assert [float(share) for share, _ in tried] == [0.25, 0.5]
    assert float(tried[0][1]) > 165.6 >= float(tried[1][1])
    t = _explain(path, "goal=throughput")["settings"]["optimizer_state"]["reason"]
    assert "the fastest rung that fits" in t and "fp32 + FSDP:" in t
