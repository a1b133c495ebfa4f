"""Optimizer state per parameter, in bytes per GPU, for the memory estimate (``memory.py``).

``adam`` (Megatron's distributed optimizer, as the generated recipes build it): an fp32 master
copy and Adam's two fp32 moments, 12 bytes per parameter, sharded over the data-parallel group
(``dp``; expert-DP for expert parameters).

``muon`` (Megatron-Core's ``LayerWiseDistributedOptimizer`` behind Bridge's ``dist_muon``, the way
Bridge's Kimi-K2 recipes build it): Muon keeps one fp32 momentum buffer per linear weight, plus the
fp32 master copy that ``Float16OptimizerWithFloat16Params`` holds for bf16 parameters: 8 bytes per
parameter. Embeddings, the output layer, norms and biases stay on Adam (``muon_scalar_optimizer``,
12 bytes); the layer-wise optimizer assigns whole parameters to DP ranks (dense over DP x CP,
experts over expert-DP; ``megatron/core/optimizer/layer_wise_optimizer.py``), so the state divides
by the same group sizes as Adam's, rounded to whole parameters (not modelled).

Gradients and the bf16 weights are counted by ``memory.py`` (unchanged by the optimizer: Muon runs
on Megatron's plain DDP, whose gradient buffer is whole on every rank, as Adam's is).
"""

from __future__ import annotations

ADAM_BYTES = 12.0  # fp32 master + exp_avg + exp_avg_sq
MUON_BYTES = 8.0   # fp32 master + momentum


def state_bytes_per_param(optimizer: str | None, dp: int, non_linear_share: float = 0.0) -> float:
    """Optimizer-state bytes per parameter held on one GPU.

    ``non_linear_share``: the fraction of these parameters that Muon leaves to Adam (embeddings,
    output layer, norms, biases); ignored for Adam.
    """
    dp = max(1, int(dp))
    if optimizer == "muon":
        share = min(1.0, max(0.0, float(non_linear_share)))
        return (MUON_BYTES * (1.0 - share) + ADAM_BYTES * share) / dp
    return ADAM_BYTES / dp
