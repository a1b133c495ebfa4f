"""Multi-token prediction in the memory estimate: the MTP layers live on the last pipeline stage.

Megatron-Core builds the MTP block where ``mtp_on_this_rank`` says, the last pipeline stage
(models/gpt/gpt_model.py): each MTP layer is a full transformer layer (DeepSeek-V3: MoE) plus ``eh_proj``, a
column-parallel linear from [embedding; hidden] (2h) to h (transformer/multi_token_prediction.py); with a pipeline
that stage builds its own input embedding (``if self.pre_process or self.mtp_process``); and each MTP layer computes
its own logits and loss through the output layer. The estimate used to leave all of it out: DeepSeek-V3 with and
without its MTP layer had the same memory. Found on a GPU: a resized DeepSeek-V3 (4 layers + MTP, hidden 1024)
peaked at 5.13 GiB allocated against an estimate of 4.04 (benchmarks/results/resized-h200-2026-11-29/).
"""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT
from mocompile import memory
from mocompile.pipeline import analyse

RUN = ROOT / "benchmarks" / "results" / "resized-h200-2026-11-29"
RESIZED = ROOT / "recipes" / "bench" / "bench-te-dsv3-resized1.yaml"
DSV3_PROBE = ROOT / "benchmarks" / "results" / "rankprobe-2026-11-27" / "intents" / "deepseek-v3-1024gpu-h100-bf16.yaml"


def _measured() -> tuple[int, float]:
    """(Megatron's parameter count of the rank, peak allocated GiB: median over the three runs) of the H200 run."""
    log = (RUN / "dsv3-resized1.r0.log").read_text()
    params = int(re.search(r"number of parameters on \(tensor, gtp_remat, pipeline\) model parallel rank "
                           r"\(0, 0, 0\): (\d+)", log).group(1))
    runs = json.loads((RUN / "resized-1xh200.json").read_text())["variants"]["bench-te-dsv3-resized1"]["runs"]
    peaks = sorted(r["summary"]["peak_allocated_gib"] for r in runs if r["rc"] == 0)
    return params, peaks[len(peaks) // 2]


def test_the_resized_deepseek_v3_counts_megatrons_own_parameters():
    params, _ = _measured()
    assert params == 216_424_448
    est = analyse(str(RESIZED)).plan.memory
    assert est["params_per_gpu_m"] == pytest.approx(params / 1e6, rel=0.002)  # was 180.9: the MTP layer left out


def test_the_estimate_meets_the_measured_peak_of_a_model_with_mtp():
    _, peak = _measured()
    assert peak == pytest.approx(5.128, abs=0.001)
    est = analyse(str(RESIZED)).plan.memory["estimate_gib"]
    assert est == pytest.approx(peak, rel=0.02)  # 5.09 against 5.13; without MTP it was 4.04 (-21 %)


def test_the_mtp_layer_and_its_logits_count_only_where_the_model_has_one():
    plan = analyse(str(RESIZED)).plan
    with_mtp = memory.estimate(plan.model, plan.values())
    without = memory.estimate({**plan.model, "mtp_num_layers": 0}, {**plan.values(), "mtp_num_layers": 0})
    assert with_mtp["logits_gib"] == pytest.approx(2 * without["logits_gib"], abs=0.01)  # its own logits and loss
    assert with_mtp["activations_gib"] > without["activations_gib"]
    assert with_mtp["params_per_gpu_m"] > without["params_per_gpu_m"]


def test_on_a_pipeline_the_last_stage_holds_the_mtp_layer_its_projection_and_an_embedding():
    """DeepSeek-V3 on 1024 H100s, layout Et|(tt|)*30mL (TP 2, PP 8 x VPP 4, EP 64): rank 3 holds 8 MoE layers, rank 7
    six and the MTP layer. What rank 7 holds beyond seven MoE layers is eh_proj (2h x h / TP) and its own input
    embedding (h x vocab / TP): 51.4 M + 463.3 M parameters."""
    plan = analyse(str(DSV3_PROBE), ["versions.apex=none"]).plan
    assert plan["pipeline_model_parallel_layout"] == "Et|(tt|)*30mL" and plan["tensor_model_parallel_size"] == 2
    m, tp = plan.model, 2
    per = {r: memory.estimate(m, dict(plan.values(), memory_stage=r))["params_per_gpu_m"] for r in (3, 7)}
    out_half = m["hidden_size"] * m["vocab_size"] / tp / 1e6   # every pipeline rank is priced one embedding half
    layer = (per[3] - out_half) / 8                             # one MoE layer of rank 3
    extra = per[7] - out_half - 7 * layer
    h = m["hidden_size"]
    assert extra == pytest.approx((2 * h * h / tp + h * m["vocab_size"] / tp) / 1e6, abs=0.5)
