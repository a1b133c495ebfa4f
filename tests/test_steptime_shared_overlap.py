"""Shared-expert overlap in the step model: Megatron-Core's ``moe_shared_expert_overlap`` runs the shared expert on its
own stream while the dispatch and combine all-to-alls are in flight (fc1 beside the dispatch, fc2 beside the combine,
forward and backward), so the plan that keeps it (alltoall, no EP overlap; Bridge's flex setup clears it) exposes less
all-to-all. Each case sits on one side of one clause of ``steptime.shared_expert_overlap``."""

from __future__ import annotations

from dataclasses import replace

import pytest
from mocompile import steptime
from mocompile.catalogue import _defaults, gpus
from mocompile.steptime import Batch, Candidate

# A toy MoE with one shared expert, EP 8 across two 4-GPU nodes, so the all-to-all costs more than the shared expert.
SHARED = _defaults({"id": "toy-shared", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
                    "num_query_groups": 4, "kv_channels": 64, "num_moe_experts": 16, "moe_router_topk": 4,
                    "moe_ffn_hidden_size": 512, "shared_expert_size": 512, "vocab_size": 1000,
                    "shared_expert_overlap_default": True})
NO_SHARED = dict(SHARED, id="toy-plain", shared_expert_size=0)
BATCH = Batch(2048, 1, 32, force_balance=True)
A2A = Candidate(tp=1, pp=1, vpp=1, ep=8, etp=1, cp=1, dispatcher="alltoall", overlap=False)
C = dict(steptime.constants(), host_s_per_layer=0.0, host_s_per_expert=0.0, step_overhead_s=0.0)


def hw():
    return dict(gpus()["h100"], id="h100", gpus_per_node=4, world_size=8)


def est(m, cand=A2A, batch=BATCH):
    return steptime.StepModel(m, hw(), batch, 8, C).estimate(cand)


def hidden(m, cand=A2A, batch=BATCH):
    e = est(m, cand, batch)
    return e.terms["a2a_total"] - e.terms["a2a_exposed"]


def test_alltoall_with_the_provider_default_on_hides_part_of_the_all_to_all():
    e = est(SHARED)
    assert steptime.shared_expert_overlap(SHARED, A2A.dispatcher, A2A.overlap)
    assert 0 < hidden(SHARED) < e.terms["a2a_total"]


def test_at_most_the_shared_expert_s_own_compute_times_the_overlap_share_is_hidden():
    """fc1 + fc2, forward and backward: three times the shared expert's forward, and only ``overlap_hide`` of that
    (streams overlapped on one GPU do not hide all of it)."""
    m = steptime.StepModel(SHARED, hw(), BATCH, 8, C)
    t_shared = m._compute_terms(1, 1, 8, 1)[4]  # the shared expert's (and router's) forward per layer
    e = est(SHARED)
    assert m.n_moe == SHARED["num_layers"] and m.n_dense == 0  # every layer of the toy is an MoE layer
    bound = 3.0 * t_shared * m.n_moe * C["overlap_hide"] * e.num_microbatches
    assert hidden(SHARED) == pytest.approx(min(bound, e.terms["a2a_total"] * C["overlap_hide"]), rel=1e-9)
    assert bound < e.terms["a2a_total"] * C["overlap_hide"]  # here the shared expert's compute is the bound


def test_a_model_without_shared_experts_hides_nothing():
    assert hidden(NO_SHARED) == 0.0
    assert not steptime.shared_expert_overlap(NO_SHARED, A2A.dispatcher, A2A.overlap)


@pytest.mark.parametrize("cand", [replace(A2A, dispatcher="deepep"), replace(A2A, dispatcher="hybridep"),
                                  replace(A2A, overlap=True)], ids=["deepep", "hybridep", "ep-overlap"])
def test_flex_dispatchers_and_ep_overlap_clear_it(cand):
    """Bridge's apply_flex_dispatcher_backend sets moe_shared_expert_overlap False; Megatron-Core refuses it beside
    overlap_moe_expert_parallel_comm (OVL010)."""
    assert not steptime.shared_expert_overlap(SHARED, cand.dispatcher, cand.overlap, pinned=True)


def test_a_pin_decides_over_the_provider_default():
    off = replace(BATCH, shared_expert_overlap=False)
    on = replace(BATCH, shared_expert_overlap=True)
    assert hidden(SHARED, batch=off) == 0.0
    assert hidden(dict(SHARED, shared_expert_overlap_default=False), batch=on) == hidden(SHARED)
    assert hidden(dict(SHARED, shared_expert_overlap_default=False)) == 0.0


def test_the_hidden_time_comes_off_the_step():
    off = est(SHARED, batch=replace(BATCH, shared_expert_overlap=False))
    on = est(SHARED)
    assert off.step_s - on.step_s == pytest.approx(hidden(SHARED), rel=1e-6)
