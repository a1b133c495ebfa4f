"""The step-time model against hand-computed small cases: each term does what the physics says."""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import ROOT
from hypothesis import given, settings
from hypothesis import strategies as st
from mocompile import steptime
from mocompile.catalogue import _defaults, gpus
from mocompile.steptime import Batch, Candidate

# A toy MoE small enough to count by hand: h=1024, 16 heads of 64, 4 KV groups, 8 experts of 512, top-2.
TOY = _defaults({"id": "toy", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
                 "num_query_groups": 4, "kv_channels": 64, "num_moe_experts": 8, "moe_router_topk": 2,
                 "moe_ffn_hidden_size": 512, "vocab_size": 1000})
# Constants chosen so hand arithmetic is easy: perfect GEMMs, no host time, no fixed overhead.
EASY = dict(steptime.constants(), gemm_efficiency=1.0, gemm_half_rows=0.0, attention_peak_share=1.0,
            attention_exp_factor=1.0, attention_key_overhead=0.0, attention_sink_keys=0.0, expert_bias_factor=1.0,
            host_s_per_layer=0.0, step_overhead_s=0.0, nccl_latency_s=0.0, flex_latency_s=0.0,
            natural_imbalance=1.5, overlap_hide=1.0, delay_wgrad_hide=0.0, nccl_a2a_efficiency=1.0,
            overlap_host_factor=1.0, fp8_quant_bytes=0.0, fp8_tensor_quant_bytes=0.0,  # quantisation: own tests
            fp8_block_gemm_extra=0.0,
            host_s_per_expert=0.0, overlap_sync_s=0.0)      # per-expert host time, overlap waits: their own tests


def hw(**over):
    h = dict(gpus()["h100"], id="h100")
    h.update(over)
    return h


def test_flops_per_token_counts_attention_experts_router_and_logits_three_times():
    h, s = 1024, 128
    attn_params = h * (16 * 64 + 2 * 4 * 64) + 16 * 64 * h       # QKV + output projection
    core = s * 16 * (64 + 64)                                       # causal: s/2 keys, QK^T and AV, 2 FLOPs each
    experts = 2 * 3 * h * 512 * 2                                   # gated MLP (3 GEMMs), top-2
    router = 2 * h * 8
    logits = 2 * h * 1000
    fwd = 4 * (2 * attn_params + core + experts + router) + logits
    assert steptime.flops_per_token(TOY, s) == pytest.approx(3 * fwd)


def test_mla_uses_qk_and_v_head_widths_for_the_attention_core():
    mla = dict(TOY, attention="mla", kv_channels=128)
    # core per token = s * heads * (d_qk + d_v); MLA's d_qk = 128 + 64 (nope + rope), d_v = 128
    per_token_core = 256 * 16 * (192 + 128)
    gqa = dict(TOY, kv_channels=128)
    diff = steptime.flops_per_token(mla, 256) - steptime.flops_per_token(gqa, 256)
    gqa_core = 256 * 16 * 256
    attn_param_diff = 3 * 4 * 2 * (steptime._attention_params(mla) - steptime._attention_params(gqa))
    assert diff == pytest.approx(3 * 4 * (per_token_core - gqa_core) + attn_param_diff)


def test_alltoall_sends_each_copy_that_leaves_the_gpu_over_nvlink_inside_a_node():
    """EP 2 on one node, top-2: of 2 copies per token, half go to the peer (1 copy), over NVLink."""
    cand = Candidate(ep=2, dispatcher="alltoall")
    tokens = 4096
    t = steptime.a2a_seconds(TOY, hw(gpus_per_node=8), cand, tokens, EASY, 1.0)
    assert t == pytest.approx(tokens * 1 * 1024 * 2 / (450e9 * 1.0))


def test_alltoall_beyond_a_node_pays_the_nic_for_the_remote_share():
    """EP 16 over two 8-GPU nodes, top-2: 2 * 8/16 = 1 copy per token leaves the node at 50 GB/s."""
    cand = Candidate(ep=16, dispatcher="alltoall")
    t = steptime.a2a_seconds(TOY, hw(gpus_per_node=8), cand, 1000, EASY, 1.0)
    net = 1000 * (2 * 8 / 16) * 2048 / 50e9
    nvl = 1000 * (2 * 7 / 16) * 2048 / 450e9
    assert t == pytest.approx(max(net, nvl))


# DeepSeek-V3's router in miniature: 16 experts in 8 groups of 2, top-8 experts inside the top-4 groups.
GROUPED = dict(TOY, num_moe_experts=16, moe_router_topk=8, moe_router_num_groups=8, moe_router_group_topk=4)


def test_without_router_groups_a_token_reaches_the_nodes_of_topk_uniform_picks():
    assert steptime.destination_nodes(TOY, 4) == steptime._distinct(2, 4)
    assert steptime.destination_nodes(dict(GROUPED, moe_router_group_topk=8), 8) == steptime._distinct(8, 8)
    assert steptime.destination_nodes(dict(GROUPED, moe_router_num_groups=1), 8) == steptime._distinct(8, 8)


def test_group_limited_routing_with_a_group_per_node_reaches_at_most_the_kept_groups_nodes():
    """8 nodes, one group each, 4 groups kept: the 8 picks spread over 4 nodes, 4 * (1 - (3/4)^8) = 3.60 of them,
    against 8 * (1 - (7/8)^8) = 5.25 without the limit (DeepSeek-V3 at EP 64 on 8-GPU nodes)."""
    assert steptime.destination_nodes(GROUPED, 8) == pytest.approx(4 * (1 - 0.75 ** 8))
    assert steptime.destination_nodes(GROUPED, 8) < steptime._distinct(8, 8)


def test_group_limited_routing_with_two_groups_per_node_counts_the_kept_groups_each_node_holds():
    """4 nodes of 2 groups, 4 of 8 groups kept: a node holds j kept groups with the hypergeometric chance
    C(2,j) C(6,4-j) / C(8,4) = 15/70, 40/70, 15/70 and is missed when the 8 picks avoid its j groups."""
    missed = 15 / 70 + 40 / 70 * (3 / 4) ** 8 + 15 / 70 * (2 / 4) ** 8
    assert steptime.destination_nodes(GROUPED, 4) == pytest.approx(4 * (1 - missed))


def test_group_limited_routing_with_groups_spanning_nodes_spreads_over_the_kept_groups_nodes():
    """16 nodes, each group on 2 of them: the 4 kept groups lie on 8 nodes."""
    assert steptime.destination_nodes(GROUPED, 16) == pytest.approx(steptime._distinct(8, 8))


def test_group_limited_routing_gets_no_credit_where_groups_and_nodes_do_not_divide():
    assert steptime.destination_nodes(GROUPED, 3) == steptime._distinct(8, 3)
    assert steptime.destination_nodes(GROUPED, 1) == 1.0


@settings(max_examples=300, deadline=None)
@given(groups=st.sampled_from([2, 4, 8, 16, 32, 64]), kept=st.integers(1, 63), topk=st.integers(1, 16),
       nodes=st.sampled_from([1, 2, 3, 4, 6, 8, 16, 32, 64, 128]))
def test_group_limited_routing_never_reaches_more_nodes_than_free_picks_nor_fewer_than_one(groups, kept, topk, nodes):
    """Limiting the groups only concentrates a token's experts: at most as many nodes as the same picks without the
    limit, at most the EP group's nodes, and at least one."""
    m = dict(GROUPED, moe_router_topk=topk, moe_router_num_groups=groups, moe_router_group_topk=min(kept, groups - 1))
    reached = steptime.destination_nodes(m, nodes)
    assert 1.0 - 1e-9 <= reached <= min(nodes, steptime._distinct(topk, nodes)) + 1e-9


def test_flex_dispatch_under_group_limited_routing_sends_to_fewer_nodes_and_alltoall_does_not_change():
    """The flex backends send a token once per destination node (DeepEP's internode kernels forward it over
    NVLink inside the node); NCCL's all-to-all sends every copy, wherever the router put it."""
    flex = Candidate(ep=64, dispatcher="deepep")
    c = dict(EASY, flex_efficiency=1.0)
    limited = steptime.a2a_seconds(GROUPED, hw(), flex, 1000, c, 1.0)
    free = steptime.a2a_seconds(dict(GROUPED, moe_router_group_topk=8), hw(), flex, 1000, c, 1.0)
    assert limited == pytest.approx(1000 * 4 * (1 - 0.75 ** 8) * 7 / 8 * 2048 / 50e9)
    assert free == pytest.approx(1000 * steptime._distinct(8, 8) * 7 / 8 * 2048 / 50e9)
    a2a = Candidate(ep=64, dispatcher="alltoall")
    assert steptime.a2a_seconds(GROUPED, hw(), a2a, 1000, EASY, 1.0) == \
        steptime.a2a_seconds(dict(GROUPED, moe_router_group_topk=8), hw(), a2a, 1000, EASY, 1.0)


def test_flex_dispatch_sends_a_token_once_per_remote_node_not_once_per_expert():
    a2a = steptime.a2a_seconds(TOY, hw(), Candidate(ep=16, dispatcher="alltoall"), 1000, EASY, 1.0)
    flex = steptime.a2a_seconds(TOY, hw(), Candidate(ep=16, dispatcher="hybridep"),
                                1000, dict(EASY, flex_efficiency=1.0), 1.0)
    # 2 nodes, top-2: expected distinct remote nodes = 2 * (1 - (1/2)^2) * 1/2 = 0.75 < 1 copy for alltoall
    assert flex == pytest.approx(1000 * 0.75 * 2048 / 50e9)
    assert flex < a2a


def test_natural_routing_loads_the_busiest_rank_by_the_imbalance_factor():
    cand = Candidate(ep=2)
    b_forced = Batch(1024, 1, 8, force_balance=True)
    b_natural = replace(b_forced, force_balance=False)
    t_forced = steptime.estimate(TOY, hw(), cand, b_forced, 2, EASY).terms["a2a_total"]
    t_natural = steptime.estimate(TOY, hw(), cand, b_natural, 2, EASY).terms["a2a_total"]
    assert t_natural == pytest.approx(1.5 * t_forced)


def test_ep_overlap_needs_two_micro_batches_in_flight():
    """PP 1: the combined 1F1B schedule overlaps micro-batch i's all-to-all with i+1's compute."""
    one = Batch(1024, 1, 2, force_balance=True)      # DP 2 -> one micro-batch per step
    two = Batch(1024, 1, 4, force_balance=True)      # two micro-batches
    cand = Candidate(ep=2, dispatcher="alltoall", overlap=True)
    e1 = steptime.estimate(TOY, hw(), cand, one, 2, EASY)
    e2 = steptime.estimate(TOY, hw(), cand, two, 2, EASY)
    assert e1.terms["a2a_exposed"] == pytest.approx(e1.terms["a2a_total"])
    assert e1.notes and "nothing to overlap" in e1.notes[0]
    assert e2.terms["a2a_exposed"] < e2.terms["a2a_total"]


def test_ep_overlap_with_pipelining_needs_vpp():
    b = Batch(1024, 1, 64, force_balance=True)
    plain = steptime.estimate(TOY, hw(), Candidate(pp=2, ep=2, overlap=True), b, 8, EASY)
    inter = steptime.estimate(TOY, hw(), Candidate(pp=2, vpp=2, ep=2, overlap=True), b, 8, EASY)
    assert plain.terms["a2a_exposed"] == pytest.approx(plain.terms["a2a_total"])
    assert inter.terms["a2a_exposed"] < inter.terms["a2a_total"]


def test_bubble_is_pp_minus_one_over_vpp_micro_batch_slots():
    b = Batch(1024, 1, 32, force_balance=True)
    e = steptime.estimate(TOY, hw(), Candidate(pp=4, vpp=1, ep=1), b, 4, EASY)
    per_mb = (e.step_s - e.terms["bubble"] - e.terms["pp_p2p"] - e.terms["dp_exposed"] - e.terms["optimizer"]) \
        / e.num_microbatches
    assert e.terms["bubble"] == pytest.approx(3 * per_mb)
    e2 = steptime.estimate(TOY, hw(), Candidate(pp=4, vpp=2, ep=1), b, 4, EASY)
    per_mb2 = (e2.step_s - e2.terms["bubble"] - e2.terms["pp_p2p"] - e2.terms["dp_exposed"] - e2.terms["optimizer"]) \
        / e2.num_microbatches
    assert e2.terms["bubble"] == pytest.approx(1.5 * per_mb2)


def test_recompute_adds_forward_work_and_full_adds_most():
    b = Batch(2048, 1, 8, force_balance=True)
    c = dict(EASY)
    none = steptime.estimate(TOY, hw(), Candidate(ep=2), b, 2, c)
    sel = steptime.estimate(TOY, hw(), Candidate(ep=2, recompute=("selective", ("core_attn",), None, None)), b, 2, c)
    full = steptime.estimate(TOY, hw(), Candidate(ep=2, recompute=("full", None, "uniform", 1)), b, 2, c)
    assert none.terms["recompute"] == 0
    assert 0 < sel.terms["recompute"] < full.terms["recompute"]
    # full recompute replays one forward: about a third of fwd+bwd compute
    assert full.terms["recompute"] == pytest.approx(none.terms["compute"] / 3, rel=0.15)


def test_cuda_graphs_cut_host_time_and_the_slower_of_host_and_gpu_sets_the_pace():
    c = dict(EASY, host_s_per_layer=1.0)       # absurdly slow CPU: host-bound
    b = Batch(128, 1, 2, force_balance=True)
    eager = steptime.estimate(TOY, hw(), Candidate(ep=1), b, 1, c)
    graphs = steptime.estimate(TOY, hw(), Candidate(ep=1, graphs="te_rp"), b, 1, c)
    assert eager.step_s == pytest.approx(2 * 4 * 1.0, rel=0.01)            # 2 micro-batches x 4 layers x 1 s
    # router+preprocess graphs replay a small share of a layer's launches: the 4xH100 TE grid measured 722 ->
    # 683 ms (-5 %) for them with a host-bound step, i.e. ~8 % of the host time
    assert graphs.step_s == pytest.approx(2 * 4 * (1 - steptime.GRAPH_CUT["te_rp"]), rel=0.01)
    assert 0.05 <= steptime.GRAPH_CUT["te_rp"] <= 0.15


def test_fp8_speeds_up_gemms_but_not_communication():
    b16 = Batch(2048, 1, 8, "bf16", True)
    b8 = replace(b16, precision="fp8-cs")
    cand = Candidate(ep=16)
    e16 = steptime.estimate(TOY, hw(), cand, b16, 16, EASY)
    e8 = steptime.estimate(TOY, hw(), cand, b8, 16, EASY)
    assert e8.terms["compute"] < e16.terms["compute"]
    assert e8.terms["a2a_total"] == pytest.approx(e16.terms["a2a_total"])


def test_tflops_and_tokens_per_second_follow_from_the_step_time():
    b = Batch(1024, 2, 64, force_balance=True)
    e = steptime.estimate(TOY, hw(), Candidate(ep=4), b, 8, EASY)
    assert e.tokens_per_s_per_gpu == pytest.approx(64 * 1024 / (8 * e.step_s))
    assert e.tflops_per_gpu == pytest.approx(steptime.flops_per_token(TOY, 1024) * 64 * 1024 / (8 * e.step_s) / 1e12)



def test_the_named_terms_add_up_to_the_step():
    """explain shows the terms; they must account for the whole predicted step (a2a_total is a total, not a term)."""
    b = Batch(2048, 1, 32, force_balance=False)
    cand = Candidate(tp=2, pp=2, vpp=2, ep=4, overlap=True, recompute=("selective", ("core_attn",), None, None))
    c = dict(steptime.constants())
    e = steptime.estimate(TOY, hw(), cand, b, 16, c)
    parts = sum(v for k, v in e.terms.items() if k != "a2a_total")
    assert parts + c["step_overhead_s"] == pytest.approx(e.step_s)


# -- sliding-window attention, softmax exponentials, Blackwell Ultra, FP8 quantisation ---------------

def test_sliding_window_layers_cost_attention_by_the_window_not_the_sequence():
    """A windowed query attends to min(position + 1, window) keys: at seq >> window its layer's attention
    core is ~window/(seq/2) of a full layer's, and doubling the sequence leaves it (per token) unchanged."""
    swa = dict(TOY, sliding_window=128, window_attn_skip_freq=0)       # every layer windowed
    w = 128
    for s in (4096, 8192):
        keys = (w * (w + 1) / 2 + (s - w) * w) / s
        assert steptime.attended_keys(swa, s) == pytest.approx(keys)
    assert steptime.attended_keys(swa, 8192) == pytest.approx(steptime.attended_keys(swa, 4096), rel=0.02)
    assert steptime.attended_keys(TOY, 8192) == 2 * steptime.attended_keys(TOY, 4096)   # full: s/2


def test_gpt_oss_alternates_windowed_and_full_layers_as_bridge_counts_its_flops():
    """GPT-OSS: window 128 on odd layers, full attention on every 2nd (MCore window_attn_skip_freq 2). Its
    verification card (535.2 TFLOPS at 4.996 s, 64 GPUs, GBS 1280, seq 4096) implies 32.64 GFLOPs/token;
    counting full attention on every layer gives 34.4, the window brings it within 0.5 %."""
    from mocompile.catalogue import models
    m = _defaults({"id": "gpt-oss-120b", **models()["gpt-oss-120b"]})
    card = 535.2e12 * 64 * 4.996 / (1280 * 4096)
    assert steptime.flops_per_token(m, 4096) == pytest.approx(card, rel=0.005)
    full = {k: v for k, v in m.items() if k not in ("sliding_window", "window_attn_skip_freq")}
    assert steptime.flops_per_token(full, 4096) > 1.04 * card
    keys = steptime.attended_keys(m, 4096)
    windowed = (128 * 129 / 2 + (4096 - 128) * 128) / 4096
    assert keys == pytest.approx((18 * 2048 + 18 * windowed) / 36)


def test_softmax_exponentials_cost_time_at_the_gpus_published_rate():
    """One exponential per score forward and one in the backward, at the special-function-unit rate:
    Blackwell Ultra's doubled rate (10.7 vs 5 T/s) makes the same attention faster, GEMMs untouched."""
    c = dict(EASY, blackwell_ultra_gain=1.0, blackwell_efficiency=1.0)
    b = Batch(4096, 1, 8)
    bw = dict(gpus()["gb200"], id="gb200", world_size=8, gpus_per_node=4)
    ultra = dict(bw, compute_capability=[10, 3])
    t_bw = steptime.estimate(TOY, bw, Candidate(), b, 1, c).terms["compute"]
    t_ultra = steptime.estimate(TOY, ultra, Candidate(), b, 1, c).terms["compute"]
    scores = 4 * 4096 * steptime.attended_keys(TOY, 4096) * 16 * 8         # layers x tokens x keys x heads x mbs
    expect = scores * 2 * (1 / 5.0e12 - 1 / 10.7e12)
    assert t_bw - t_ultra == pytest.approx(expect, rel=1e-6)


def _core(m, c, batch, hw_=None):
    """The forward attention-core time of one micro-batch and layer (StepModel's t_core)."""
    return steptime.StepModel(m, hw_ or hw(), batch, 1, c)._compute_terms(1, 1, 1)[2]


def test_fused_attention_costs_its_keys_plus_a_fixed_per_query_overhead_at_its_measured_rate():
    """Measured on H100 (gptoss_micro): fused attention time is linear in the keys a query attends with an
    intercept worth ``attention_key_overhead`` keys, its matmuls at ``attention_peak_share`` of the BF16 peak
    and its softmax at ``attention_exp_factor`` exponentials per score."""
    c = dict(EASY, attention_peak_share=0.5, attention_exp_factor=2.0, attention_key_overhead=100.0)
    s, tokens = 4096, 4096
    keys = steptime.attended_keys(TOY, s)
    work = keys + 100.0
    flops = tokens * 2 * work * 16 * (64 + 64)
    expect = flops / (989e12 * 0.5) + tokens * work * 16 * 2 / 3 * 2.0 / 4.5e12
    assert _core(TOY, c, Batch(s, 1, 8)) == pytest.approx(expect, rel=1e-9)
    # the overhead is per query, whatever the keys: a 128-key window pays the same 100 keys more
    swa = dict(TOY, sliding_window=128, window_attn_skip_freq=0)
    w = steptime.attended_keys(swa, s)
    assert _core(swa, c, Batch(s, 1, 8)) / _core(swa, dict(c, attention_key_overhead=0.0), Batch(s, 1, 8)) \
        == pytest.approx((w + 100) / w)


def test_learnable_softmax_sinks_add_their_measured_keys_only_to_models_that_have_them():
    c = dict(EASY, attention_key_overhead=0.0, attention_sink_keys=500.0)
    b = Batch(4096, 1, 8)
    keys = steptime.attended_keys(TOY, 4096)
    assert _core(dict(TOY, softmax_sinks=True), c, b) / _core(TOY, c, b) == pytest.approx((keys + 500) / keys)
    assert _core(dict(TOY, softmax_sinks=False), c, b) == _core(TOY, c, b)


def test_the_measured_attention_terms_apply_to_te_fused_attention_only():
    """The local (TE-less) spec runs unfused attention: its own cost (score passes through HBM), not the
    fused kernel's per-query overhead or sinks pass."""
    c = dict(EASY, attention_key_overhead=700.0, attention_sink_keys=800.0)
    local = Batch(4096, 1, 8, te=False, grouped_gemm=False)
    m = dict(TOY, softmax_sinks=True)
    assert _core(m, c, local) == _core(m, dict(c, attention_key_overhead=0.0, attention_sink_keys=0.0), local)


def test_fp8_recipes_keep_attention_in_bf16():
    """FP8 speeds up the linear layers' GEMMs, not the attention core (TE runs it in BF16 by default)."""
    c = dict(EASY, fp8_gain=2.0, fp8_quant_bytes=0.0)
    assert _core(TOY, c, Batch(4096, 1, 8, "fp8-cs")) == pytest.approx(_core(TOY, c, Batch(4096, 1, 8)))


def test_fp8_attention_runs_the_attention_matmuls_at_the_fp8_rate_when_a_recipe_turns_it_on():
    c = dict(EASY, fp8_gain=2.0, fp8_quant_bytes=0.0, attention_exp_factor=0.0)   # matmuls only
    bf16_attn = _core(TOY, c, Batch(4096, 1, 8, "mxfp8"))
    assert _core(TOY, c, Batch(4096, 1, 8, "mxfp8", fp8_attention=True)) == pytest.approx(bf16_attn / 2)
    # the flag means nothing in a BF16 run
    assert _core(TOY, c, Batch(4096, 1, 8, fp8_attention=True)) == _core(TOY, c, Batch(4096, 1, 8))


def test_biased_expert_gemms_cost_the_measured_factor_more():
    c = dict(EASY, expert_bias_factor=1.25)
    b = Batch(4096, 1, 8)
    experts = lambda m: steptime.StepModel(m, hw(), b, 1, c)._compute_terms(1, 1, 1)[3]  # noqa: E731
    assert experts(dict(TOY, add_bias_linear=True)) == pytest.approx(1.25 * experts(dict(TOY, add_bias_linear=False)))


def _derived_from_measurement(module: str, results: str) -> dict:
    """What benchmarks/gpu/<module>.py derives from a committed micro-benchmark run in benchmarks/results/."""
    import importlib
    import json
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    doc = json.loads((ROOT / "benchmarks" / "results" / results).read_text())
    return importlib.import_module(module).derive(doc)


def test_the_attention_and_bias_constants_are_what_the_h100_measurement_gives():
    """data/steptime.yaml states the values benchmarks/gpu/attention_fit.py derives from the committed
    micro-benchmark (GPU kernel time, 1x H100): a change to either shows here."""
    got = _derived_from_measurement("attention_fit", "gptoss-micro-h100-2026-11-26/gptoss_micro.json")
    c = steptime.constants()
    for name in ("attention_peak_share", "attention_exp_factor", "attention_key_overhead", "attention_sink_keys",
                 "expert_bias_factor"):
        assert c[name] == pytest.approx(got[name], rel=1e-3), name
    # the premise of stating the intercept in keys: both head widths give the same number of keys, within 10 %
    assert abs(got["_intercept_d64_ms"] / got["_slope_d64_us_per_key"] * 1e3
               - got["_intercept_d128_ms"] / got["_slope_d128_us_per_key"] * 1e3) < 0.1 * c["attention_key_overhead"]


def test_blackwell_ultra_gain_scales_gemm_throughput_of_compute_capability_10_3_only():
    c = dict(EASY, blackwell_ultra_gain=1.1)
    b = Batch(4096, 1, 8)
    bw = dict(gpus()["b200"], id="b200")
    ultra = dict(gpus()["b300"], id="b300", bf16_dense_tflops=bw["bf16_dense_tflops"])
    assert ultra["compute_capability"] == [10, 3] and bw["compute_capability"] == [10, 0]
    fast = steptime.estimate(TOY, ultra, Candidate(), b, 1, dict(c, blackwell_ultra_gain=1.1))
    same = steptime.estimate(TOY, ultra, Candidate(), b, 1, dict(c, blackwell_ultra_gain=1.0))
    assert fast.terms["compute"] < same.terms["compute"]
    h = steptime.estimate(TOY, hw(), Candidate(), b, 1, dict(c, blackwell_ultra_gain=1.1))
    assert h.step_s == steptime.estimate(TOY, hw(), Candidate(), b, 1, dict(c, blackwell_ultra_gain=1.0)).step_s


def test_fp8_quantisation_is_memory_bound_work_that_weighs_most_in_narrow_models():
    """Each GEMM operand element is quantised (amax, cast, transposed copy) at HBM speed: the cost grows with
    fp8_quant_bytes, and relative to the GEMM FLOPs it is larger for a narrow model than a wide one."""
    b8 = Batch(4096, 1, 8, "mxfp8")
    def compute(m, qb):
        return steptime.estimate(m, hw(), Candidate(), b8, 1, dict(EASY, fp8_quant_bytes=qb)).terms["compute"]
    wide = dict(TOY, hidden_size=4096, moe_ffn_hidden_size=2048, kv_channels=256)
    narrow_cost = compute(TOY, 4.0) / compute(TOY, 0.0) - 1
    wide_cost = compute(wide, 4.0) / compute(wide, 0.0) - 1
    assert narrow_cost > wide_cost > 0
    bf = Batch(4096, 1, 8, "bf16")
    assert steptime.estimate(TOY, hw(), Candidate(), bf, 1, dict(EASY, fp8_quant_bytes=4.0)).step_s == \
        steptime.estimate(TOY, hw(), Candidate(), bf, 1, dict(EASY, fp8_quant_bytes=0.0)).step_s


def test_each_fp8_scaling_pays_its_own_quantisation_bytes():
    """Hopper's FP8 recipes (current and delayed per-tensor scaling, blockwise scaling) quantise at
    fp8_tensor_quant_bytes, measured on H100; Blackwell's MXFP8 at the fitted fp8_quant_bytes. Each reads only its
    own constant."""
    c = dict(EASY, fp8_gain=2.0, fp8_quant_bytes=1.0, fp8_tensor_quant_bytes=5.0)
    def compute(precision, **over):
        return steptime.estimate(TOY, hw(), Candidate(), Batch(4096, 1, 8, precision), 1, dict(c, **over)).terms["compute"]
    own = {"fp8-cs": "fp8_tensor_quant_bytes", "fp8-ds": "fp8_tensor_quant_bytes",
           "fp8-blockwise": "fp8_tensor_quant_bytes", "mxfp8": "fp8_quant_bytes"}
    for precision, mine in own.items():
        assert compute(precision) > compute(precision, **{mine: 0.5})
        for other in set(own.values()) - {mine}:
            assert compute(precision) == compute(precision, **{other: 9.0})
    # same operands: the quantisation costs in proportion to each constant (5 : 1)
    zero = dict(fp8_quant_bytes=0.0, fp8_tensor_quant_bytes=0.0)
    q = lambda p: compute(p) - compute(p, **zero)  # noqa: E731
    assert q("fp8-cs") == pytest.approx(5 * q("mxfp8")) and q("fp8-blockwise") == pytest.approx(q("fp8-cs"))


def test_blockwise_fp8_costs_per_tensor_plus_its_share_of_the_bf16_gemm_time():
    """Blockwise scaling's GEMMs apply per-block scales: measured on one H200, blockwise ran slower than per-tensor
    current scaling in all six shapes, by fp8_block_gemm_extra of the BF16 GEMM time. So the model's FP8 GEMM time
    for blockwise is the BF16 time x (1 / fp8_gain + extra): with no extra it is per-tensor's to the bit, and the
    difference is linear in the extra."""
    def compute(precision, extra):
        c = dict(EASY, fp8_gain=2.0, fp8_block_gemm_extra=extra)
        return steptime.estimate(TOY, hw(), Candidate(), Batch(4096, 1, 8, precision), 1, c).terms["compute"]
    assert compute("fp8-blockwise", 0.0) == compute("fp8-cs", 0.0)
    d1 = compute("fp8-blockwise", 0.1) - compute("fp8-cs", 0.1)
    d2 = compute("fp8-blockwise", 0.2) - compute("fp8-cs", 0.2)
    assert d1 > 0 and d2 == pytest.approx(2 * d1)
    assert compute("fp8-cs", 0.1) == compute("fp8-cs", 0.0)        # per-tensor never reads it
    # with the shipped constants a blockwise plan is predicted slower than the same plan in per-tensor FP8 (the
    # planner used to call blockwise the cheaper of the two)
    shipped = steptime.constants()
    step = lambda p: steptime.estimate(TOY, hw(), Candidate(), Batch(4096, 1, 8, p), 1, shipped).step_s  # noqa: E731
    assert step("fp8-cs") < step("fp8-blockwise")


def test_the_blockwise_fp8_constant_is_what_the_h200_measurement_gives():
    import importlib
    import json
    import sys
    sys.path.insert(0, str(ROOT / "benchmarks" / "gpu"))
    doc = json.loads((ROOT / "benchmarks" / "results" / "fp8-blockwise-h200-2026-11-29" / "fp8_micro.json").read_text())
    got = importlib.import_module("fp8_fit").derive_blockwise(doc)
    assert got["_points"] == 6                                    # six shapes, each timed in all three recipes
    assert steptime.constants()["fp8_block_gemm_extra"] == pytest.approx(got["fp8_block_gemm_extra"], rel=1e-3)
    # measured, not assumed: blockwise is the slower in every shape (busy time)
    cases = doc["cases"]
    stems = {n.rsplit(" ", 1)[0] for n in cases}
    assert all(cases[s + " fp8-blockwise"]["busy_ms"] > cases[s + " fp8-cs"]["busy_ms"] for s in stems)


def test_the_per_tensor_fp8_constant_is_what_the_h100_measurement_gives():
    got = _derived_from_measurement("fp8_fit", "fp8-micro-h100-2026-11-26/fp8_micro.json")
    assert steptime.constants()["fp8_tensor_quant_bytes"] == pytest.approx(got["fp8_tensor_quant_bytes"], rel=1e-3)
    assert got["_points"] == 12                                   # six shapes x current and delayed scaling
    # the GEMM gain the same measurement implies is close to the one the calibration fits
    assert got["fp8_gemm_gain"] == pytest.approx(steptime.constants()["fp8_gain"], rel=0.1)


# -- issue 10/11: the 4x H100 Transformer Engine grid (benchmarks/results/te-h100x4-2026-11-26) --------------

def _mid():
    from mocompile.catalogue import models
    return _defaults({**models()["tiny-moe"], "id": "bench-mid", "num_layers": 16, "hidden_size": 2048,
                      "ffn_hidden_size": 8192, "num_attention_heads": 16, "num_query_groups": 4, "kv_channels": 128,
                      "num_moe_experts": 64, "moe_router_topk": 8, "moe_ffn_hidden_size": 1024, "vocab_size": 32000})


def _qwen30():
    from mocompile.catalogue import models
    return _defaults({"id": "qwen3-30b-a3b", **models()["qwen3-30b-a3b"]})


TE_GRID = Batch(2048, 2, 16, force_balance=True)       # seq 2048, MBS 2, GBS 16: 2 micro-batches at DP 4
Q30 = Batch(4096, 1, 1024, force_balance=True)          # Qwen3-30B-A3B 16xH100, 64 micro-batches


def test_ep_overlap_hides_only_the_all_to_all_of_paired_micro_batches():
    """Combined 1F1B pairs a forward with another micro-batch's backward: the first forward and the last
    backward have no partner, so with PP 1 only (mb - 1) / mb of the all-to-all can hide: half with the TE
    grid's 2 micro-batches (why overlap bought nothing there), nearly all with Qwen3-30B's 64."""
    c = dict(EASY, overlap_hide=1.0)
    for gbs, mb in ((4, 2), (16, 8)):
        e = steptime.estimate(TOY, hw(gpus_per_node=2), Candidate(ep=2, overlap=True),
                              Batch(1024, 1, gbs, force_balance=True), 2, c)
        assert e.num_microbatches == mb
        assert e.terms["a2a_exposed"] == pytest.approx(e.terms["a2a_total"] / mb)


def test_ep_overlap_pays_a_wait_per_layer_and_micro_batch_so_it_loses_where_the_all_to_all_is_small():
    """The overlapped schedule's cross-stream waits cost every MoE layer of every micro-batch: at EP 4 on one
    NVLink node with 2 micro-batches (the TE grid: off 657 ms, on 722 ms) that is more than the little it
    hides, while Qwen3-30B's inter-node all-to-all (published: on 20.99 s vs off 24.71 s) still gains."""
    c = steptime.constants()
    assert c["overlap_sync_s"] > 0
    h4 = hw(gpus_per_node=4)
    off = steptime.estimate(_mid(), h4, Candidate(ep=4), TE_GRID, 4, c)
    on = steptime.estimate(_mid(), h4, Candidate(ep=4, overlap=True), TE_GRID, 4, c)
    assert on.step_s >= off.step_s
    q_off = steptime.estimate(_qwen30(), hw(), Candidate(ep=16, dispatcher="hybridep", graphs="te_rp"), Q30, 16, c)
    q_on = steptime.estimate(_qwen30(), hw(), Candidate(ep=16, dispatcher="hybridep", graphs="te_rp", overlap=True), Q30, 16, c)
    assert q_on.step_s < q_off.step_s


def test_host_time_has_a_part_per_local_expert_that_router_graphs_do_not_capture():
    """TE's grouped-GEMM experts cost host time per local expert (GEMM launches, weight-gradient accumulation,
    DDP hooks): EP 4 of 64 experts holds 16, EP 8 holds 8. Router/preprocess graphs cut only the per-layer
    part; a full-iteration graph replays the experts too."""
    c = dict(steptime.constants(), host_s_per_layer=0.004, host_s_per_expert=0.0005)
    m = _mid()
    ep4, _ = steptime.host_seconds_per_layer(m, Candidate(ep=4), TE_GRID, c)
    ep8, _ = steptime.host_seconds_per_layer(m, Candidate(ep=8), TE_GRID, c)
    assert ep4 - ep8 == pytest.approx(8 * 0.0005)
    rp, _ = steptime.host_seconds_per_layer(m, Candidate(ep=4, graphs="te_rp"), TE_GRID, c)
    assert ep4 - rp == pytest.approx(0.004 * steptime.GRAPH_CUT["te_rp"])
    full, dense = steptime.host_seconds_per_layer(m, Candidate(ep=4, graphs="full_iteration"), TE_GRID, c)
    assert full == pytest.approx(ep4 * 0.05) and dense == pytest.approx(0.004 * 0.05)


def test_a_slower_host_scales_host_time_only():
    """The project's lent VM hosts run the same Python slower than the DGX nodes of the published rows
    (``lent_host_factor``, fitted on the project's own 14 grid rows). A host-bound step grows with it, a
    GPU-bound one (Qwen3-30B alltoall at 64 micro-batches) barely moves."""
    c = steptime.constants()
    assert 1.5 <= c["lent_host_factor"] <= 6.0
    h4 = hw(gpus_per_node=4)
    dgx = steptime.estimate(_mid(), h4, Candidate(ep=4), TE_GRID, 4, c)
    lent = steptime.estimate(_mid(), dict(h4, host_factor=c["lent_host_factor"]), Candidate(ep=4), TE_GRID, 4, c)
    assert lent.step_s > 1.5 * dgx.step_s
    assert lent.terms["compute"] == pytest.approx(dgx.terms["compute"])
    q = Candidate(ep=16, dispatcher="alltoall")
    q1 = steptime.estimate(_qwen30(), hw(), q, Q30, 16, c).step_s
    q2 = steptime.estimate(_qwen30(), hw(host_factor=1.5), q, Q30, 16, c).step_s
    assert q2 == pytest.approx(q1, rel=0.03)


def test_delayed_wgrad_costs_host_time_per_expert_and_is_neutral_when_gpu_bound():
    """Delayed wgrad runs the expert weight gradients as a later, separate pass: more host work per expert.
    Host-bound (TE grid on the lent host: on 722 ms, on + dW 890 ms) it is slower; GPU-bound (Qwen3-30B
    alltoall with overlap, published 31.31 -> 31.20 s) it stays within a few per cent."""
    c = steptime.constants()
    assert c["delay_wgrad_host"] > 0
    h4 = hw(gpus_per_node=4, host_factor=c["lent_host_factor"])
    on = steptime.estimate(_mid(), h4, Candidate(ep=4, overlap=True), TE_GRID, 4, c)
    dw = steptime.estimate(_mid(), h4, Candidate(ep=4, overlap=True, delay_wgrad=True), TE_GRID, 4, c)
    assert dw.step_s > 1.1 * on.step_s
    q_on = steptime.estimate(_qwen30(), hw(), Candidate(ep=16, overlap=True), Q30, 16, c).step_s
    q_dw = steptime.estimate(_qwen30(), hw(), Candidate(ep=16, overlap=True, delay_wgrad=True), Q30, 16, c).step_s
    assert q_dw == pytest.approx(q_on, rel=0.05)


def test_the_optimizer_step_is_memory_bound_over_the_state_this_gpu_holds():
    """Adam over the local shard: dense state sharded over DP, expert state over expert-DP. EP 4 on 4 GPUs
    leaves expert-DP 1, so every GPU steps its 16 experts' full fp32 state (~1.6 B parameters): ~40 ms on an
    H100, which weighs in a 2-micro-batch step and vanishes in Qwen3-30B's 20 s ones."""
    from mocompile.memory import parameters
    m, h = _mid(), hw()
    p = parameters(m)
    dense = p["attention"] + p["dense_mlp"] + p["shared"] + p["router"] + p["embedding"]
    want = (dense / 4 + p["experts"] / 4) * steptime.ADAM_STEP_BYTES / (h["hbm_tbps"] * 1e12 * steptime.HBM_EFFICIENCY)
    assert steptime.optimizer_seconds(m, h, Candidate(ep=4), 4) == pytest.approx(want)
    assert 0.02 < want < 0.06
    # EP 2 on 4 GPUs: expert-DP 2 halves each GPU's expert state relative to the experts it holds
    ep2 = steptime.optimizer_seconds(m, h, Candidate(ep=2), 4)
    assert ep2 == pytest.approx(want)  # twice the experts per GPU, half of their state each


def test_the_planner_picks_a_measured_good_plan_for_the_te_grid():
    """bench-te-mid-auto (everything auto) must compile to overlap off without delayed wgrad: the measured
    best plans of the TE grid (off 657 ms, on 722 ms, on + dW 890 ms)."""
    import json

    from conftest import ROOT
    lock = json.loads((ROOT / "generated" / "bench-te-mid-auto" / "mocompile.lock.json").read_text())
    s = {k: (v.get("value") if isinstance(v, dict) else v) for k, v in lock["settings"].items()}
    assert not s.get("overlap_moe_expert_parallel_comm")
    assert not s.get("delay_wgrad_compute")
    assert s.get("moe_token_dispatcher_type") == "alltoall" or s.get("moe_flex_dispatcher_backend") == "deepep"


# -- Muon (Megatron-Core's LayerWiseDistributedOptimizer behind Bridge's dist_muon) ------------------------------------

def test_newton_schulz_flops_whiten_the_smaller_dimension():
    """emerging_optimizers' newton_schulz: per step A = X X^T (2 s^2 l), B = bA + cA A (2 s^3), X = aX + B X (2 s^2 l),
    with s the smaller dimension (it transposes a tall matrix), 5 steps (Bridge's muon_num_ns_steps)."""
    assert steptime._ns_flops(1024, 1024) == 5 * 6 * 1024 ** 3              # square: 6 n^3 per step
    assert steptime._ns_flops(2048, 7168) == steptime._ns_flops(7168, 2048)  # transposed: the same work
    assert steptime._ns_flops(2048, 7168) == 5 * (4 * 2048 ** 2 * 7168 + 2 * 2048 ** 3)


def test_muon_blockwise_tp_orthogonalizes_each_shard_on_its_own_rank():
    """Bridge's muon_tp_mode "blockwise": no all-gather, no duplicated work: each TP rank whitens its own shard of the
    column-parallel (rows / TP) and row-parallel (cols / TP) weights; MLA's down projections are not split."""
    mla = dict(TOY, attention="mla", kv_channels=128, q_lora_rank=256, kv_lora_rank=128)
    one, two = steptime.muon_matrices(mla, 1)["moe"], steptime.muon_matrices(mla, 2)["moe"]
    assert two[0] == one[0] and two[2] == one[2]                      # q and kv down projections: whole
    assert two[1] == (one[1][0] / 2, one[1][1]) and two[4] == (one[4][0], one[4][1] / 2)
    # a rank whitens its shard, less than the whole matrix the "duplicated" mode would whiten on every rank
    for i in (1, 3, 4):
        assert steptime._ns_flops(*two[i]) < steptime._ns_flops(*one[i])
    # GQA with muon_split_qkv: Q, K and V whitened separately, plus the output projection; experts: fc1 (gated), fc2
    gqa = steptime.muon_matrices(TOY, 1)
    assert gqa["moe"][:4] == [(16 * 64, 1024), (4 * 64, 1024), (4 * 64, 1024), (1024, 16 * 64)]
    assert gqa["expert"] == [(2 * 512, 1024), (1024, 512)]
    assert steptime.muon_matrices(TOY, 1, etp=2)["expert"] == [(512, 1024), (1024, 256)]


def test_muon_gathers_updated_weights_only_over_groups_larger_than_one():
    """allgather_params sends each rank's updated bf16 weights to the rest of its DP (experts: expert-DP) group after the
    step; a group of one gathers nothing (EP x PP = world: EDP 1, as every shipped Kimi-K2 recipe runs)."""
    h = hw(gpus_per_node=8)
    _, none = steptime.muon_seconds(TOY, h, Candidate(tp=1, pp=2, ep=4), 8, EASY)      # DP 4, EDP 1
    p = steptime.parameters(TOY)
    dense = (p["attention"] + p["dense_mlp"] + p["shared"] + p["router"] + p["embedding"]) / 2
    assert none == pytest.approx(dense * 2.0 * 3 / 4 / (450e9 * steptime.COLLECTIVE_EFFICIENCY))
    _, both = steptime.muon_seconds(TOY, h, Candidate(tp=1, pp=2, ep=2), 8, EASY)      # DP 4, EDP 2
    experts = p["experts"] / (2 * 2)
    assert both - none == pytest.approx(experts * 2.0 * 1 / 2 / (450e9 * steptime.COLLECTIVE_EFFICIENCY))
    _, alone = steptime.muon_seconds(TOY, h, Candidate(tp=2, pp=4, ep=2), 8, EASY)     # DP 1, EDP 1
    assert alone == 0.0
    # a pipeline stage (4 GPUs) wider than a node: the gather runs at the NIC's bandwidth (a stage that fits a node
    # keeps its DP groups on NVLink: Megatron orders ranks tp-cp-ep-dp-pp, steptime._dp_link_gbps)
    _, net = steptime.muon_seconds(TOY, hw(gpus_per_node=2), Candidate(tp=1, pp=2, ep=2), 8, EASY)
    assert net == pytest.approx(both * 450 / hw()["nic_gbps"])


def test_muon_step_per_gpu_does_not_depend_on_how_experts_split_between_ep_and_expert_dp():
    """Owned work is the stage's experts / (EP x EDP): whole-matrix ownership spreads it like Adam's shard, so EP 4 with
    EDP 1 and EP 2 with EDP 2 step the same (the gather, not the step, is what EDP > 1 adds)."""
    h = hw(gpus_per_node=8)
    a, _ = steptime.muon_seconds(TOY, h, Candidate(pp=2, ep=4), 8, EASY)
    b, _ = steptime.muon_seconds(TOY, h, Candidate(pp=2, ep=2), 8, EASY)
    assert a == pytest.approx(b)
    # and it is more than Adam's memory-bound step: the Newton-Schulz GEMMs and twice the HBM passes
    assert a > steptime.optimizer_seconds(TOY, h, Candidate(pp=2, ep=4), 8, 0.0, EASY)


def test_muon_changes_only_the_optimizer_terms_of_the_estimate():
    h, cand = hw(gpus_per_node=8), Candidate(pp=2, ep=2)
    adam = steptime.estimate(TOY, h, cand, Batch(1024, 1, 64), 8, EASY)
    muon = steptime.estimate(TOY, h, cand, Batch(1024, 1, 64, optimizer="muon"), 8, EASY)
    assert "param_gather" not in adam.terms                      # Adam plans' figures and locks are unchanged
    step, gather = steptime.muon_seconds(TOY, h, cand, 8, EASY)
    assert muon.terms["param_gather"] == gather and muon.terms["optimizer"] == step
    assert muon.step_s - adam.step_s == pytest.approx(step + gather - adam.terms["optimizer"])
    assert {k: v for k, v in muon.terms.items() if k not in ("optimizer", "param_gather")} == \
        {k: v for k, v in adam.terms.items() if k != "optimizer"}


def test_the_gated_deltanet_constants_are_what_the_h200_measurement_gives():
    """data/steptime.yaml states the values benchmarks/gpu/gdn_fit.py derives from the committed micro-benchmark
    (flash-linear-attention's chunked gated delta rule, GPU busy time, 1x H200), and the linear fit holds."""
    got = _derived_from_measurement("gdn_fit", "gdn-micro-h200-2026-12-01/gdn_micro.json")
    c = steptime.constants()
    for name in ("gdn_token_ns", "gdn_head_ns", "gdn_state_ns"):
        assert c[name] == pytest.approx(got[name], rel=1e-3), name
    assert got["_worst_fit_error"] < 0.05  # the premise: time linear in tokens, value heads and state size
    # the premise of a time per token: twice the tokens (batch or length) take twice the time, within 3 %
    per = got["_ns_per_token"]
    assert per["b1 t8192 h16 hv32 d128"] == pytest.approx(per["b1 t4096 h16 hv32 d128"], rel=0.03)
    assert per["b2 t4096 h16 hv32 d128"] == pytest.approx(per["b1 t8192 h16 hv32 d128"], rel=0.01)


QWEN3_NEXT_LIKE = dict(TOY, attention="hybrid", linear_attention_freq=4, num_layers=48, linear_num_key_heads=16,
                       linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
                       linear_conv_kernel_dim=4)


def test_a_hybrid_model_s_gated_deltanet_layers_cost_the_measured_core_not_softmax_attention():
    """Qwen3-Next's layout: 12 of 48 layers are softmax attention, 36 Gated DeltaNet. The core's time is the
    full layers' softmax attention plus the DeltaNet layers' measured time, a quarter and three quarters of it."""
    b = Batch(4096, 1, 8)
    c = steptime.constants()
    hybrid = steptime.StepModel(QWEN3_NEXT_LIKE, hw(), b, 1)._compute_terms(1, 1, 1)[2]
    full = steptime.StepModel(dict(QWEN3_NEXT_LIKE, attention="gqa"), hw(), b, 1)._compute_terms(1, 1, 1)[2]
    gdn = 4096 * steptime.gdn_seconds(QWEN3_NEXT_LIKE, c) * steptime.GDN_REFERENCE_PEAK / \
        steptime._peak_bf16(hw(), c) / 3
    assert hybrid == pytest.approx(full / 4 + 3 / 4 * gdn)
    # 277 ns per token fwd + bwd at 32 value heads of 128 x 128 (the measurement's own figure, to 2 %)
    assert steptime.gdn_seconds(QWEN3_NEXT_LIKE, c) == pytest.approx(277e-9, rel=0.02)
    # the DeltaNet layers do not grow with the sequence: four times the tokens per sequence at the same tokens per
    # micro-batch costs the softmax layers more and the DeltaNet layers the same
    long = steptime.StepModel(QWEN3_NEXT_LIKE, hw(), Batch(16384, 1, 8), 1)._compute_terms(1, 4, 1)[2]
    long_full = steptime.StepModel(dict(QWEN3_NEXT_LIKE, attention="gqa"), hw(), Batch(16384, 1, 8), 1)._compute_terms(
        1, 4, 1)[2]
    assert long - long_full / 4 == pytest.approx(3 / 4 * gdn)


def test_the_step_model_covers_hybrid_attention_now_that_its_core_is_measured():
    assert steptime.covers(QWEN3_NEXT_LIKE) and steptime.covers(TOY)
    assert not steptime.covers(dict(TOY, attention="something-new"))
