"""NCCL EP's per-rank receive budget (flex backend ``ncclep``), shared by the planner's memory model and the recipe.

Megatron-Core 0.19 sizes NCCL EP's receive buffer from ``moe_expert_rank_capacity_factor`` and refuses to build the
dispatcher without one (transformer/moe/token_dispatcher.py ``_NCCLEPManager``: budget = the local tokens rounded up
to 64, times the TP-folded top-k, times the factor); a rank that receives more than its budget stops the job
(the field's docstring in transformer_config.py: "exceeding the budget is a hard error"). mocompile plans dropless
MoE, so it sets the factor a rank can never exceed: every rank of the ETP*EP group sends each of its tokens to at
most min(top-k, local experts) of this rank's experts.
"""

from __future__ import annotations

import math

HT_CHUNK = 64  # NCCL EP's HT backend rounds the tokens per rank up to this (token_dispatcher.py _ensure_bootstrap)


def rank_capacity_factor(ep: int, num_experts: int, topk: int) -> float:
    """The factor whose budget covers the worst case: EP * min(top-k, experts per rank) / top-k (ETP cancels),
    rounded up to a hundredth so Megatron-Core's int() of the float budget cannot fall one row short."""
    local = max(1, num_experts // max(1, ep))
    exact = ep * min(topk, local) / topk
    return exact if exact == int(exact) else math.ceil(exact * 100) / 100


def receive_bytes(tokens: int, ep: int, etp: int, num_experts: int, topk: int, hidden: int) -> float:
    """One receive buffer at that factor: bf16 token rows plus their fp32 routing weights."""
    padded = -(-tokens // HT_CHUNK) * HT_CHUNK
    rows = padded * etp * topk * rank_capacity_factor(ep, num_experts, topk)
    return rows * (hidden * 2 + 4)
