"""The memory estimate against the measured peaks of the 4x H100 Transformer Engine grid (issue 11).

benchmarks/results/te-h100x4-2026-11-26/grid.json holds torch.cuda.max_memory_allocated of every rank of
every run (max over ranks and runs per plan); the committed locks hold the estimate each plan compiles to.
Acceptance (issue 10/11): within +-10 % of every measured peak allocated.
"""

from __future__ import annotations

import json

import pytest
from conftest import ROOT
from mocompile import memory

GRID = ROOT / "benchmarks" / "results" / "te-h100x4-2026-11-26" / "grid.json"
PINNED = ["bench-te-mid-ep4-off", "bench-te-mid-ep4-off-moeact", "bench-te-mid-ep4-on",
          "bench-te-mid-ep4-on-graphs", "bench-te-mid-ep4-on-wgrad"]


def _measured() -> dict[str, float]:
    doc = json.loads(GRID.read_text())
    return {n: v["summary"]["peak_allocated_gib"] for n, v in doc["variants"].items() if v["runs"]}


def _lock(name: str) -> dict:
    return json.loads((ROOT / "generated" / name / "mocompile.lock.json").read_text())


@pytest.mark.parametrize("name", PINNED)
def test_te_grid_peak_allocated_is_estimated_within_ten_percent(name):
    est = _lock(name)["memory"]["estimate_gib"]
    meas = _measured()[name]
    assert abs(est / meas - 1) <= 0.10, (name, est, meas)


def test_te_scoped_graph_buffers_count_in_peak_allocated():
    """moe_router + moe_preprocess graphs with EP overlap measured +2.0 GiB allocated (39.24 vs 37.25 GiB):
    static inputs/outputs and their gradients, per layer and per micro-batch in flight (2 under overlap),
    4 hidden-sized bf16 tensors per token: 4 x 16 layers x 2 x 4096 tokens x 2048 x 2 B = 2.0 GiB."""
    graphs = _lock("bench-te-mid-ep4-on-graphs")["memory"]
    plain = _lock("bench-te-mid-ep4-on")["memory"]
    assert graphs["graph_buffers_gib"] == pytest.approx(2.0, abs=0.01)
    assert graphs["estimate_gib"] - plain["estimate_gib"] == pytest.approx(2.0, abs=0.02)
    meas = _measured()
    assert meas["bench-te-mid-ep4-on-graphs"] - meas["bench-te-mid-ep4-on"] == pytest.approx(2.0, abs=0.1)


def test_the_te_activation_factor_is_fitted_on_measured_te_peaks():
    """Was 0.8 from one published peak of unknown kind; the six measured TE peaks need more (0.88), and shipped
    Bridge recipes that ran must still fit (plan_quality), which bounds it from above."""
    assert 0.85 <= memory.TE_ACTIVATION_FACTOR <= 1.0


def test_unfused_weight_gradients_count_without_apex():
    """No Apex (versions.apex: none) turns gradient_accumulation_fusion off: each layer's weight gradients
    exist as a separate bf16 tensor before they reach the gradient buffer (one MoE layer's 16 local experts
    and attention, plus the output layer: 0.33 GiB for the mid model at EP 4)."""
    lock = _lock("bench-te-mid-ep4-off")
    c = {k: (v.get("value") if isinstance(v, dict) else v) for k, v in lock["settings"].items()}
    assert c["gradient_accumulation_fusion"] is False
    m = _mid()
    off = memory.estimate(m, c)["estimate_gib"]
    fused = memory.estimate(m, dict(c, gradient_accumulation_fusion=True))["estimate_gib"]
    assert off - fused == pytest.approx(0.33, abs=0.02)


def _mid():
    from mocompile.catalogue import _defaults, models
    return _defaults({**models()["tiny-moe"], "id": "bench-mid", "num_layers": 16, "hidden_size": 2048,
                      "ffn_hidden_size": 8192, "num_attention_heads": 16, "num_query_groups": 4, "kv_channels": 128,
                      "num_moe_experts": 64, "moe_router_topk": 8, "moe_ffn_hidden_size": 1024, "vocab_size": 32000})


def test_fp8_recipes_keep_gemm_inputs_in_one_byte():
    """FP8 (FP4) recipes: TE saves the QKV input and each routed token's expert fc1/fc2 inputs in the
    low-precision copy it made for the GEMM (1 byte, FP4 ~0.5) instead of bf16; the projection keeps its bf16
    input (Megatron-Core's set_save_original_input: fused attention keeps that tensor anyway). Without this,
    raising the TE activation factor to what the measured BF16 peaks need made shipped FP8/NVFP4 Bridge recipes
    (which ran) stop fitting in plan_quality."""
    lock = _lock("bench-te-mid-ep4-off")
    c = {k: (v.get("value") if isinstance(v, dict) else v) for k, v in lock["settings"].items()}
    m = _mid()
    bf16 = memory.estimate(m, c)["activations_gib"]
    fp8 = memory.estimate(m, dict(c, fp8="hybrid"))["activations_gib"]
    gemm_in = 2 * 2048 + 8 * 2 * (2048 + 1024)       # force-balanced routing: imbalance 1; no projection input
    want = 0.5 * gemm_in * 4096 * 16 * memory.TE_ACTIVATION_FACTOR / memory.GIB
    assert bf16 - fp8 == pytest.approx(want, abs=0.02)
