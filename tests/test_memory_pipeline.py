"""The memory estimate per pipeline rank (issue 23): layers placed by the layout, dense layers where the model has
them, every rank's schedule, and the fused GLU the plan emits.

A pipeline rank holds the layers its virtual stages hold (Megatron-Core pipeline_parallel_layer_layout.py: stage i
of the layout on rank i % pp, virtual stage i // pp) and keeps the chunk forwards its interleaved 1F1B warm-up runs
(schedules.py: 2 (pp - r - 1) + (vpp - 1) pp, plus one). The rank probe measured DeepSeek-V3's rank 0 of 1024 H100s
at 7 layers and 2,569,584,640 parameters, not the 8 layers and 2.81 B of num_layers / pp.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import ROOT
from mocompile import memory
from mocompile.catalogue import _defaults
from mocompile.pipeline import analyse

DSV3_PROBE = ROOT / "benchmarks" / "results" / "rankprobe-2026-11-27" / "intents" / "deepseek-v3-1024gpu-h100-bf16.yaml"


def _plan(path: Path, *sets: str):
    return analyse(str(path), ["versions.apex=none", *sets]).plan


def _estimator(plan, **over) -> memory.Estimator:
    return memory.Estimator(plan.model, dict(plan.values(), **over))


def test_the_layout_places_seven_layers_one_dense_on_deepseek_v3s_first_rank():
    plan = _plan(DSV3_PROBE)
    assert plan["pipeline_model_parallel_layout"] == "Et|(tt|)*30mL"
    layers, dense = _estimator(plan).stage_chunks(8, 4)
    assert layers[0] == (1, 2, 2, 2) and dense[0] == (1, 0, 0, 0)        # layer 0 (dense), 15-16, 31-32, 47-48
    assert layers[1] == (2, 2, 2, 2) and dense[1] == (2, 0, 0, 0)        # layers 1-2 (dense), 17-18, ...
    assert layers[2] == (2, 2, 2, 2) and dense[2] == (0, 0, 0, 0)        # layers 3-4 are the first MoE layers
    assert layers[7] == (2, 2, 2, 0)                                      # the last stage is "mL": MTP and loss
    est = memory.estimate(plan.model, dict(plan.values(), memory_stage=0))
    # Megatron's own count of rank 0's parameters: 2,569,584,640; the estimate leaves norms and MLA's small
    # projections' norms out (-2.1 %), where num_layers / pp gave 2,811 M (+9.4 %)
    assert est["params_per_gpu_m"] == pytest.approx(2569.6, rel=0.025)


def test_every_rank_is_priced_and_the_estimate_is_the_largest():
    """The first rank keeps the most chunk forwards, but DeepSeek-V3's holds a dense layer (with `mlp` recomputed a
    tenth of a MoE layer's activations) and one layer fewer: rank 2's 8 MoE layers with 35 chunk forwards
    (2 x 5 + 3 x 8 + 1) are the peak, which the estimate reports as its stage. Without a stage named, the estimate
    adds the heaviest rank's weights to the heaviest rank's activations: never under any one rank's."""
    plan = _plan(DSV3_PROBE)
    per_stage = [memory.estimate(plan.model, dict(plan.values(), memory_stage=r))["estimate_gib"] for r in range(8)]
    est = memory.estimate(plan.model, plan.values())
    assert max(per_stage) <= est["estimate_gib"] <= max(per_stage) * 1.03
    assert est["stage"] == per_stage.index(max(per_stage)) == 2
    assert per_stage[0] < per_stage[2]


def test_interleaved_warm_up_counts_chunk_forwards_of_uneven_chunks():
    """Rank 0 of PP 8 x VPP 4: 39 chunk forwards alive; forward k runs chunk (k // 8) % 4, so chunks (1, 2, 2, 2)
    hold 8 x 1 + 24 x 2 + 7 x 1 = 63 layer micro-batches, where an even split's 39 chunks of 2 layers hold 78."""
    assert memory._layer_microbatches((1.0, 2.0, 2.0, 2.0), 8, 39) == 63
    assert memory._layer_microbatches((2.0, 2.0, 2.0, 2.0), 8, 39) == 78
    # the last rank (r = 7): (vpp - 1) pp + 1 = 25 chunk forwards
    assert memory._layer_microbatches((3.0, 3.0, 3.0, 2.0), 8, 25) == 74


TOY = _defaults({"id": "toy", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "num_query_groups": 4,
                 "kv_channels": 64, "num_moe_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 512,
                 "vocab_size": 1000, "first_k_dense": 1, "ffn_hidden_size": 2048, "shared_expert_size": 256})


def test_the_unfused_glu_keeps_six_bytes_per_routed_channel_and_four_per_dense_channel():
    """Megatron-Core's unfused GLU keeps silu(x_glu), the offset copy x_linear + 0.0 and, in the experts, the GLU
    product the router probabilities multiply: 6 bytes per expert channel per routed token, 4 per channel of a dense
    MLP or shared expert; nothing when that module is recomputed."""
    fused = memory._act_bytes_per_token(TOY, True, (), False, True)
    unfused = memory._act_bytes_per_token(TOY, True, (), False, False)
    frac_moe = 3 / 4
    assert unfused - fused == pytest.approx(frac_moe * (2 * 6 * 512 + 4 * 256) + (1 - frac_moe) * 4 * 2048)
    rc = ("moe_act", "shared_experts", "mlp")
    assert memory._act_bytes_per_token(TOY, True, rc, False, False) == memory._act_bytes_per_token(TOY, True, rc, False)


@pytest.mark.parametrize("te, goal, glu, router", [
    ("2.12.0", "throughput", True, True),
    ("2.7.0", "throughput", True, True),       # fused_moe_aux_loss first ships in TE 2.7
    ("2.6.0", "throughput", True, False),
    ("2.12.0", "fit", True, False),            # fit keeps Megatron's default routing kernels
    ("none", "throughput", False, False),      # no TE: Megatron's local spec, no fused kernels
])
def test_the_plan_fuses_the_glu_with_te_and_the_router_on_throughput_from_te_2_7(tmp_path, te, goal, glu, router):
    path = tmp_path / "r.yaml"
    path.write_text("schema: 1\nmodel: qwen3-30b-a3b\nhardware: {gpu: h100, nodes: 2}\n"
                    f"goal: {goal}\nversions: {{transformer_engine: '{te}'}}\n")
    plan = analyse(str(path)).plan
    assert (plan["bias_activation_fusion"], plan["moe_router_fusion"]) == (glu, router)
