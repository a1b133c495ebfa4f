"""Group-limited routing against the real Megatron-Core 0.19.2 (CPU): the two things mocompile builds on it.

- MDL004: ``group_limited_topk`` scores a group by the sum of its top ``topk // group_topk`` experts. Below the kept
  groups that is 0 experts: every group scores 0, and every token keeps the same groups, so half of DeepSeek-V3's
  experts never get a token (nothing in Megatron-Core refuses it).
- The step-time model's ``steptime.destination_nodes``: with forced balancing (random scores), a token's experts lie
  in the kept groups only, so at one group per node they reach ~3.6 of 8 nodes, not the ~5.3 of free picks.
"""

from __future__ import annotations

import pytest
from mocompile import steptime
from mocompile.catalogue import _defaults, models, resolve_model
from mocompile.errors import InputError
from mocompile.ir import Document

pytestmark = pytest.mark.stack

TOKENS, EXPERTS, GROUPS, KEPT = 4096, 256, 8, 4  # DeepSeek-V3's router


def _groups_of_tokens(topk: int) -> tuple[list[int], float]:
    """Tokens per group and the mean number of distinct groups per token, for random scores (forced balancing)."""
    import torch
    from megatron.core.transformer.moe.moe_utils import group_limited_topk

    torch.manual_seed(0)
    scores = torch.rand(TOKENS, EXPERTS).sigmoid()
    _, idx = group_limited_topk(scores, topk, TOKENS, EXPERTS, GROUPS, KEPT)
    group = idx // (EXPERTS // GROUPS)
    per_group = [int((group == g).any(dim=1).sum()) for g in range(GROUPS)]
    distinct = float(sum(len(set(row.tolist())) for row in group)) / TOKENS
    return per_group, distinct


@pytest.mark.parametrize("topk,dead", [(3, True), (4, False), (8, False)])
def test_a_top_k_below_the_kept_groups_leaves_groups_without_a_token(topk, dead, mcore):
    per_group, _ = _groups_of_tokens(topk)
    assert (min(per_group) == 0) is dead, per_group
    if dead:
        assert sum(n == 0 for n in per_group) == GROUPS - KEPT  # the same 4 groups for every token
    refused = False
    try:
        resolve_model({"model": {"base": "deepseek-v3", "moe_router_topk": topk}}, Document({}, {}, ["r.yaml"]))
    except InputError as exc:
        refused = [d.rule for d in exc.diagnostics] == ["MDL004"]
    assert refused is dead


def test_a_tokens_experts_lie_on_about_the_nodes_the_step_time_model_counts(mcore):
    """One group per node (EP 64 on 8-GPU nodes). The real router puts a token's 8 experts on 3.95 groups; the
    model's uniform picks inside the kept groups give 3.60: it undercounts by 9 %, because Megatron-Core keeps the
    groups whose top-2 experts score highest, so nearly every kept group gets a pick. Both are far below the 5.25
    nodes of 8 free picks, which is what the term corrects; the 9 % is left for a later refinement."""
    _, distinct = _groups_of_tokens(8)
    m = _defaults({"id": "deepseek-v3", **models()["deepseek-v3"]})
    assert distinct == pytest.approx(steptime.destination_nodes(m, 8), rel=0.10)
    assert distinct < 0.8 * steptime._distinct(8, 8)
