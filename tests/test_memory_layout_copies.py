"""Two activation terms Megatron-Core's tensor layout adds (memory.Estimator._layout_copies), each found in the rank
probe's allocation trace (benchmarks/results/rankprobe-2026-11-27, MOCOMPILE_RANK_PROBE_SITES=1) and read in
Megatron-Core 0.19.2's source; each case sits on a boundary of its condition.

- GQA with qk_layernorm: ``get_query_key_value_tensors`` (transformer/attention.py) reshapes the query it split out
  of linear_qkv's output; the reshape copies when a rank holds more than one query group of more than one head,
  and q_layernorm keeps the copy: 2 bytes per query channel per token.
- ``moe_shared_expert_overlap`` with TP > 1: ``SharedExpertMLP.pre_forward_comm`` gathers the whole sequence for
  linear_fc1, which keeps it: 2 h (tp - 1) bytes per local token more than the sequence-parallel shard, MoE layers.
"""

from __future__ import annotations

import pytest
from mocompile import memory
from mocompile.catalogue import _defaults
from test_planner_mutants import mem_cfg

# h 1024, 16 heads of 64 in 4 query groups, 8 experts of 512, top-2, one shared expert of 512, 4 layers
GQA = _defaults({"id": "toy-qk", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16,
                 "num_query_groups": 4, "kv_channels": 64, "num_moe_experts": 8, "moe_router_topk": 2,
                 "moe_ffn_hidden_size": 512, "vocab_size": 1000, "qk_layernorm": True})
Q = 16 * 64


def copies(m: dict, tp: int = 1, modules: tuple[str, ...] = (), **cfg) -> float:
    return memory.Estimator(m, mem_cfg(**cfg))._layout_copies("mix", modules, tp, bool(cfg.get("moe_shared_expert_overlap")))


@pytest.mark.parametrize("tp, copied", [(1, True), (2, True), (4, False), (8, False)])
def test_the_query_copy_exists_while_a_rank_holds_more_than_one_query_group(tp, copied):
    """4 groups: 4 per rank at TP 1, 2 at TP 2 (a copy), 1 at TP 4 and TP 8 (a view of linear_qkv's output)."""
    assert copies(GQA, tp) == (2 * Q if copied else 0.0)


def test_no_query_copy_without_qk_layernorm_or_with_one_head_per_group_or_mla():
    assert copies(dict(GQA, qk_layernorm=False)) == 0.0          # nothing keeps the copy
    assert copies(dict(GQA, num_query_groups=16)) == 0.0         # MHA: one head a group, the reshape is a view
    assert copies(dict(GQA, num_query_groups=8)) == 2 * Q        # two heads a group: a copy again
    assert copies(dict(GQA, attention="mla")) == 0.0             # MLA's latents are normed, not a GQA query


def test_recomputed_core_attention_keeps_no_query_copy():
    assert copies(GQA, 1, ("core_attn",)) == 0.0
    assert copies(GQA, 1, ("mlp",)) == 2 * Q


SHARED = dict(GQA, qk_layernorm=False, shared_expert_size=512)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_the_overlapped_shared_expert_keeps_the_whole_sequence_beside_the_shard(tp):
    """2 h (tp - 1) bytes per local token: nothing at TP 1, where the shard is the sequence."""
    assert copies(SHARED, tp, moe_shared_expert_overlap=True) == pytest.approx(2 * 1024 * (tp - 1))
    assert copies(SHARED, tp, moe_shared_expert_overlap=False) == 0.0


def test_the_shared_expert_term_needs_a_shared_expert_and_leaves_with_its_recompute():
    assert copies(dict(SHARED, shared_expert_size=0), 4, moe_shared_expert_overlap=True) == 0.0
    assert copies(SHARED, 4, ("shared_experts",), moe_shared_expert_overlap=True) == 0.0
    assert copies(SHARED, 4, ("moe",), moe_shared_expert_overlap=True) == 0.0
    # dense layers carry no shared expert: a model whose first layer is dense pays on 3 of its 4
    assert copies(dict(SHARED, first_k_dense=1), 4, moe_shared_expert_overlap=True) == pytest.approx(2 * 1024 * 3 * 3 / 4)
    # FP8: the fc1 input is kept as its 1-byte copy
    assert copies(SHARED, 4, moe_shared_expert_overlap=True, fp8="tensorwise") == pytest.approx(1024 * 3)


def test_the_search_and_the_final_estimate_agree_on_the_shared_expert_overlap():
    """The overlap is decided per candidate (resolve/search.py _shared_expert_overlap); the search passes it to the
    estimate, which would otherwise price every candidate with the base settings' value."""
    est = memory.Estimator(SHARED, mem_cfg(tensor_model_parallel_size=4, world_size=8))
    on = est.estimate(4, 1, 1, 1, 1, 1, None, (), False, None, None, "none", (), True)["activations_gib"]
    off = est.estimate(4, 1, 1, 1, 1, 1, None, (), False, None, None, "none", (), False)["activations_gib"]
    assert on > off
    assert est.estimate(4, 1, 1, 1, 1, 1, None, (), False, None, None, "none", ())["activations_gib"] == off
