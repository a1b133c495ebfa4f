"""Issue 19's calibration terms, each pinned on both sides of its condition with the reason its value is right.

- TE's grouped GEMM runs up to 4 local experts' GEMMs at once (``grouped_gemm_concurrency``);
- DP / expert-DP collectives stay on NVLink when a pipeline stage fits a node (``_dp_link_gbps``);
- MLA without a q low-rank projection (Moonlight: HF ``q_lora_rank`` null) projects q straight from the hidden state;
- calibrate.py's headline counts the A/B-only rows;
- sequence parallelism's backward collectives are hidden under ordered launch (CUDA_DEVICE_MAX_CONNECTIONS=1).
"""

from __future__ import annotations

import sys

import pytest
from conftest import ROOT
from mocompile import steptime
from mocompile.catalogue import _defaults, gpus, models
from mocompile.memory import _full_attention_params
from mocompile.steptime import Batch, Candidate

sys.path.insert(0, str(ROOT / "benchmarks"))
import calibrate  # noqa: E402


def hw(name="h100", **over):
    h = dict(gpus()[name], id=name)
    h.update(over)
    return h


def model(name):
    return _defaults({"id": name, **models()[name]})


TE = Batch(4096, 1, 64)
LOCAL = Batch(4096, 1, 64, te=False, grouped_gemm=False)


# -- grouped GEMM concurrency ---------------------------------------------------------------------------------

def test_te_runs_four_expert_gemms_at_once_on_its_four_compute_streams():
    """transformer_engine/common/util/multi_stream.cpp: get_num_compute_streams() is a constant 4, and
    multi_stream_cublas_gemm deals GEMM i to stream i % 4."""
    assert steptime.TE_GEMM_STREAMS == 4


def test_narrow_experts_share_the_sms_up_to_filling_them():
    """Qwen3-30B with EP4: 32 local experts of 512 rows; an expert's GEMM has 512/128 x 1536/128 = 48 output tiles
    (fc1 2 x 768 wide, narrower than hidden 2048), so 132 / 48 = 2.75 of them fill an H100's 132 SMs."""
    m = model("qwen3-30b-a3b")
    assert steptime.grouped_gemm_concurrency(m, hw(), 512, 4, 1, TE) == pytest.approx(132 / 48)


def test_an_expert_gemm_that_covers_the_sms_runs_alone():
    """GPT-OSS-120B with EP8: 1024 rows x 2880 wide = 8 x 22.5 = 180 tiles > 132 SMs: the next expert's GEMM waits
    for SMs, so concurrency buys nothing (1)."""
    m = model("gpt-oss-120b")
    assert steptime.grouped_gemm_concurrency(m, hw(), 1024, 8, 1, TE) == 1.0


def test_concurrency_is_capped_by_the_streams_and_by_the_local_experts():
    m = model("qwen3-30b-a3b")
    # tiny GEMMs (128 rows: 12 tiles) would need 11 at once to fill the SMs: only 4 streams
    assert steptime.grouped_gemm_concurrency(m, hw(), 128, 4, 1, TE) == 4.0
    # EP 64 of 128 experts: 2 local experts, however small
    assert steptime.grouped_gemm_concurrency(m, hw(), 128, 64, 1, TE) == 2.0
    # one local expert: nothing to run beside it
    assert steptime.grouped_gemm_concurrency(m, hw(), 128, 128, 1, TE) == 1.0


def test_without_grouped_gemm_experts_run_one_after_another():
    """Megatron's SequentialMLP (local spec, no grouped GEMM) runs the local experts' GEMMs in order on one stream."""
    m = model("qwen3-30b-a3b")
    assert steptime.grouped_gemm_concurrency(m, hw(), 512, 4, 1, LOCAL) == 1.0


def test_concurrency_makes_small_expert_gemms_cheaper_and_leaves_wide_ones_alone():
    m = model("qwen3-30b-a3b")
    c = steptime.constants()
    te = steptime.StepModel(m, hw(), TE, 16, c)._compute_terms(2, 1, 4)[3]
    seq = steptime.StepModel(m, hw(), Batch(4096, 1, 64, grouped_gemm=False), 16, c)._compute_terms(2, 1, 4)[3]
    assert te < seq
    g = model("gpt-oss-120b")
    a = steptime.StepModel(g, hw(), TE, 64, c)._compute_terms(1, 1, 8)[3]
    b = steptime.StepModel(g, hw(), Batch(4096, 1, 64, grouped_gemm=False), 64, c)._compute_terms(1, 1, 8)[3]
    assert a == pytest.approx(b)


# -- where the DP collectives run -----------------------------------------------------------------------------

def test_dp_groups_stay_inside_a_pipeline_stage_that_fits_a_node():
    """Megatron-Core orders ranks tp-cp-ep-dp-pp (pipeline outermost): with 16 H100s and PP 2 each stage is one
    8-GPU node, so DP and expert-DP traffic runs on NVLink; with PP 1 the DP group spans both nodes (network)."""
    h = hw()
    assert steptime._dp_link_gbps(h, 16, 2) == h["nvlink_gbps"]
    assert steptime._dp_link_gbps(h, 16, 1) == h["nic_gbps"]
    assert steptime._dp_link_gbps(h, 8, 1) == h["nvlink_gbps"]


def test_an_nvl72_domain_is_one_node_for_the_dp_groups():
    h = hw("gb200")
    assert h["mnnvl"] and h["nvlink_domain"] == 72
    assert steptime._dp_link_gbps(h, 256, 4) == h["nvlink_gbps"]   # 64-GPU stages inside the domain
    assert steptime._dp_link_gbps(h, 256, 2) == h["nic_gbps"]      # 128-GPU stages leave it


def test_dp_traffic_of_a_node_sized_stage_is_costed_on_nvlink():
    m = model("qwen3-30b-a3b")
    cand = Candidate(tp=2, pp=2, ep=4)
    inside = steptime._dp_traffic(m, hw(), cand, 16, 4)
    across = steptime._dp_traffic(m, hw(), Candidate(tp=2, pp=1, ep=4), 16, 8)
    assert inside < across
    h = hw()
    assert steptime._dp_traffic(m, dict(h, nic_gbps=h["nvlink_gbps"]), cand, 16, 4) == pytest.approx(inside)


# -- MLA without a q low-rank projection ----------------------------------------------------------------------

def test_moonlight_projects_q_from_the_hidden_state():
    """Moonlight's HF config has q_lora_rank null (Bridge's tests/unit_tests/recipes/test_moonlight_recipes.py
    sets q_lora_rank = None), and MCore's MLASelfAttention then builds linear_q_proj (hidden -> heads x 192)
    instead of linear_q_down_proj + linear_q_up_proj."""
    m = model("moonlight-16b-a3b")
    assert m["q_lora_rank"] == 0
    h, heads = 2048, 16
    expected = h * heads * 192 + h * (512 + 64) + 512 * heads * (128 + 128) + heads * 128 * h
    assert _full_attention_params(m) == expected


def test_deepseek_v3_keeps_its_q_low_rank_projection():
    m = model("deepseek-v3")
    h, heads = 7168, 128
    expected = h * 1536 + 1536 * heads * 192 + h * (512 + 64) + 512 * heads * (128 + 128) + heads * 128 * h
    assert _full_attention_params(m) == expected


def test_muon_orthogonalizes_the_one_q_matrix_without_q_lora():
    mats = steptime.muon_matrices(model("moonlight-16b-a3b"))["moe"]
    assert mats[0] == (16 * 192, 2048)
    assert len(steptime.muon_matrices(model("deepseek-v3"))["moe"]) == len(mats) + 1


# -- calibrate.py's headline ------------------------------------------------------------------------------------

def test_the_moonlight_rows_have_the_published_run_shape():
    """skills/nemo-mbridge-perf-activation-recompute/card.yaml: TP2 PP1 EP8 DP4, seq 4096, MBS 1, GBS 4 (77.50 TFLOPS
    at 457.18 ms: 2.83e14 FLOPs per step, which the model's FLOPs count gives for GBS 4, not 32)."""
    rows = [r for r in calibrate.load_rows() if r["id"].startswith("moonlight-h100x8-rc-")]
    assert len(rows) == 3
    for r in rows:
        assert (r["gbs"], r["mbs"], r["seq"], r["shape_known"], r["force_balance"]) == (4, 1, 4096, True, False)
    r = rows[0]
    m, _, _, batch = calibrate.setup(r)
    flops = steptime.flops_per_token(m, 4096) * 4 * 4096
    assert flops / (8 * 0.45718) / 1e12 == pytest.approx(77.50, rel=0.03)


def test_the_headline_counts_every_ab_only_row():
    out = calibrate.headline([0.05, 0.20], [0.06, 0.22], [0.30])
    assert "all rows: 3 (2 fitted + 1 not fitted: A/B-only or held out)" in out[0]
    assert "worst 30.0%" in out[1] and "worst 30.0%" in out[2]
    assert "<= 10%, <= 25%" in out[2] and "NOT met" in out[2]
    assert "fitted rows only: 2" in out[3]


def test_an_ab_only_row_with_an_unpublished_shape_counts_its_ratio_to_its_partner():
    rows = calibrate.load_rows()
    c = steptime.constants()
    r = next(x for x in rows if x["id"] == "q30-h100x16-tp2pp2-graphs")
    o = next(x for x in rows if x["id"] == "q30-h100x16-tp2pp2-eager")
    partner, err = calibrate.ab_ratio_error(r, rows, c)
    assert partner == o["id"]
    want = (calibrate.predict(r, c) / calibrate.predict(o, c)) / (calibrate.measured_s(r) / calibrate.measured_s(o)) - 1
    assert err == pytest.approx(want)


# -- sequence parallelism's backward overlap under ordered launch ------------------------------------------------

def _tp_cost(cand, hw_name="h100", batch=TE, world=16):
    return steptime.estimate(model("qwen3-30b-a3b"), hw(hw_name), cand, batch, world).terms["tp_cp"]


ORDERED = Candidate(tp=2, ep=8, dispatcher="alltoall")


@pytest.mark.parametrize("other, why", [
    (dict(overlap=True), "EP overlap wants concurrent streams"),
    (dict(dispatcher="hybridep"), "a flex dispatcher wants concurrent streams"),
    (dict(dispatcher="deepep"), "a flex dispatcher wants concurrent streams"),
])
def test_tp_traffic_is_half_hidden_only_with_ordered_launch(other, why):
    """With CUDA_DEVICE_MAX_CONNECTIONS=1 the backward's all-gather and reduce-scatter overlap the dgrad/wgrad
    GEMMs (TE Linear backward): half of the four TP collectives per layer are hidden; any plan whose launchers
    export more connections pays all four."""
    from dataclasses import replace
    assert _tp_cost(replace(ORDERED, **other)) == pytest.approx(2 * _tp_cost(ORDERED), rel=1e-9), why


def test_blackwell_and_fsdp_launch_with_more_connections_so_pay_all_tp_traffic():
    from dataclasses import replace
    fsdp = replace(TE, fsdp=True)
    assert _tp_cost(ORDERED, batch=fsdp) == pytest.approx(2 * _tp_cost(ORDERED), rel=1e-9)
    # B200 has other link speeds: compare its ordered plan with its own EP-overlap plan instead
    assert _tp_cost(ORDERED, "b200") == pytest.approx(_tp_cost(replace(ORDERED, overlap=True), "b200"), rel=1e-9)
    assert _tp_cost(ORDERED, "b200") > 0


@pytest.mark.parametrize("sets", [
    {"parallelism.tp": 2, "parallelism.ep": 8, "moe.dispatcher": "alltoall", "moe.overlap": False},
    {"parallelism.tp": 2, "parallelism.ep": 8, "moe.dispatcher": "alltoall", "moe.overlap": True},
    {"parallelism.tp": 2, "parallelism.ep": 8, "moe.dispatcher": "hybridep", "moe.overlap": False},
    {"parallelism.tp": 2, "parallelism.ep": 8, "moe.dispatcher": "alltoall", "moe.overlap": False, "hardware.gpu": "b200"},
])
def test_the_step_model_reads_the_launch_order_the_launchers_export(sets, tmp_path):
    """``StepModel._ordered_launch`` is what resolve/derived.py puts in CUDA_DEVICE_MAX_CONNECTIONS: 1 exactly
    when the model hides the backward TP traffic."""
    from conftest import overrides
    from mocompile.pipeline import analyse
    path = tmp_path / "q30.yaml"
    path.write_text("schema: 1\nmodel: qwen3-30b-a3b\nhardware: {gpu: h100, nodes: 2}\ngoal: throughput\n"
                    "training: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 256}\n")
    r = analyse(str(path), overrides(sets))
    assert not r.errors, [(d.rule, d.message) for d in r.errors]
    p = r.plan
    cand = Candidate(tp=p["tensor_model_parallel_size"], ep=p["expert_model_parallel_size"],
                     dispatcher=p["moe_flex_dispatcher_backend"] or p["moe_token_dispatcher_type"],
                     overlap=bool(p["overlap_moe_expert_parallel_comm"]))
    sm = steptime.StepModel(model("qwen3-30b-a3b"), dict(p.hardware), TE, 16)
    assert (p.env["CUDA_DEVICE_MAX_CONNECTIONS"].value == "1") == sm._ordered_launch(cand)
