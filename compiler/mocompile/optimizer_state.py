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

Adam's memory levers (``training.optimizer_state``, ``training.optimizer_offload``), from Megatron-Core
0.19's ``OptimizerConfig`` and ``optimizer/__init__.py``:

- ``fp32-remainders``: the precision-aware optimizer (``use_precision_aware_optimizer``, TE's FusedAdam)
  with ``store_param_remainders``: at rest the fp32 master is kept as the 16 bits the bf16 weight lacks
  (``distrib_optimizer.py`` allocates it as int16), 2 + 4 + 4 = 10 bytes. Not at the peak: measured on 2x H200
  with the mid TE model (``benchmarks/results/levers-2026-11-27/round2``) it peaked at exactly the bytes of fp32
  state (32.90 GiB both), so the estimate adds the 2 bytes back (``REMAINDER_PEAK_BYTES``; where the remainder path
  spends them was not identified). FP8 recipes other than delayed scaling keep an fp32 master in Megatron-Core
  (``use_precision_aware_optimizer_no_fp8_or_ds_fp8`` is false there): no remainders.
- ``bf16-moments``: also ``exp_avg_dtype`` / ``exp_avg_sq_dtype`` bf16: 2 + 2 + 2 = 6 bytes at rest, but at the
  step Transformer Engine's ``FusedAdam.step`` (``transformer_engine/pytorch/optimizers/fused_adam.py``) unscales
  every state kept below fp32 into a new fp32 tensor for all parameters of a group at once, runs the kernel on
  those and writes them back ("Try to reclaim the temporary fp32 buffers"): 8 bytes more, plus the 2 of the
  remainder path, 16 in all. Measured on 2x H100 (``benchmarks/results/levers-2026-11-27``): bf16 moments peaked
  5.4 GiB *above* fp32 state (38.3 vs 32.9 GiB allocated, +3.4 bytes per parameter; counted: +4).
- Neither is a memory lever on this stack, so the ladder (``resolve/decide.py lever_rungs``) never takes them:
  a rung must hold less than fp32 state at the peak. They stay in the estimate because Bridge's recipes use them
  (Qwen3-30B-A3B: remainders; DeepSeek-V3, Moonlight: bf16 moments) and a user may pin them.
- offload share ``f`` (``optimizer_cpu_offload``, ``optimizer_offload_fraction``): Megatron's
  ``HybridDeviceOptimizer`` (``optimizer/cpu_offloading/hybrid_optimizer.py``) steps a share ``f`` of the
  distributed optimizer's parameter shards on the CPU. The plan builds it the way Megatron-LM requires
  (``megatron/training/arguments.py``: "The optimizer cpu offload must be used in conjunction with
  `--use-precision-aware-optimizer`, as the hybrid device optimizer reuses the code path of this flag"): with the
  precision-aware flag (fp32 dtypes) the distributed optimizer allocates no fp32 master on the GPU
  (``distrib_optimizer.py`` ``_build_model_and_main_param_groups``: ``shard_main_param = None`` when
  ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``, which offload turns on) and hands the bf16 shards to the
  hybrid optimizer, which clones the offloaded share to host memory in fp32 (``param_update_in_fp32``) and keeps
  an fp32 copy and both moments on the GPU for the rest: on the GPU 12 * (1 - f) bytes, nothing for the
  offloaded share. Gradients reach it as views of the gradient buffer (``decoupled_grad``, no fp32 copy); the GPU
  share converts a bf16 buffer's gradient to fp32 at the step (``_set_sub_optimizer_grads``). Without the flag
  (Bridge allows it) the distributed optimizer keeps every fp32 master shard on the GPU, 4 + 8 * (1 - f) bytes:
  measured on 2x H100 (``benchmarks/results/levers-2026-11-27``: offloading all of it saved exactly 8 bytes per
  parameter). The offloading optimizer builds torch's Adam without the precision-aware dtypes, so offload goes
  with ``fp32`` moments only (rule OPT006).

Gradients and the bf16 weights are counted by ``memory.py`` (unchanged by the optimizer: Muon runs
on Megatron's plain DDP, whose gradient buffer is whole on every rank, as Adam's is).
"""

from __future__ import annotations

ADAM_BYTES = 12.0  # fp32 master + exp_avg + exp_avg_sq
MUON_BYTES = 8.0   # fp32 master + momentum
MASTER_BYTES = {"fp32": 4.0, "fp32-remainders": 2.0, "bf16-moments": 2.0}   # with bf16 weights
MOMENT_BYTES = {"fp32": 8.0, "fp32-remainders": 8.0, "bf16-moments": 4.0}  # exp_avg + exp_avg_sq, at rest
# At the optimizer step's peak, on top of the state at rest (measured and explained above): the remainder path's
# 2 bytes (the master back at fp32's 4), and TE FusedAdam's fp32 copies of bf16 moments.
REMAINDER_PEAK_BYTES = 2.0
UNSCALED_MOMENT_BYTES = {"bf16-moments": 8.0}
STATES = tuple(MASTER_BYTES)


def keeps_fp32_master(fp8: str | None) -> bool:
    """FP8 recipes other than delayed scaling: Megatron-Core keeps the fp32 master itself, so the precision-aware
    optimizer stores no remainders (``use_precision_aware_optimizer_no_fp8_or_ds_fp8`` is false)."""
    return bool(fp8) and fp8 != "delayed"


def _kept(offload: float) -> float:
    """The share of the optimizer state that stays on the GPU."""
    return 1.0 - min(1.0, max(0.0, offload))


def adam_bytes(state: str = "fp32", offload: float = 0.0, fp8_master: bool = False) -> float:
    """Adam's state bytes per parameter on the GPU at rest (before DP sharding). ``fp8_master``: an FP8 recipe
    other than delayed scaling, whose fp32 master Megatron-Core keeps itself (no remainders). With an offload share
    the hybrid optimizer holds an fp32 copy and both moments for the GPU share only (module docstring)."""
    if offload > 0:
        return ADAM_BYTES * _kept(offload)
    master = 4.0 if fp8_master else MASTER_BYTES.get(state, 4.0)
    return master + MOMENT_BYTES.get(state, 8.0)


def step_bytes(state: str = "fp32", offload: float = 0.0, fp8_master: bool = False,
               main_grad_copies: bool = True) -> float:
    """Bytes per parameter of the optimizer shard that exist only while Adam steps (after the backward has freed
    the activations): the distributed optimizer's fp32 copies of the gradients when the gradient buffer is bf16
    (``distrib_optimizer.py`` ``_copy_model_grads_to_main_grads``: ``shard_model_grad.float()`` for every shard
    at once; ``main_grad_copies``), the remainder path's 2 bytes, and TE FusedAdam's fp32 copies of bf16
    moments. With an offload share, only the GPU share's fp32 gradient copies (``HybridDeviceOptimizer.
    _set_sub_optimizer_grads``: ``grad.to(fp32)``, a copy only from a bf16 buffer). Measured: the peak of every
    plan on the lent hosts is this step, not the backward (``benchmarks/results/levers-2026-11-27``,
    ``deterministic-2026-11-27``)."""
    kept = _kept(offload)
    if offload > 0:
        return 4.0 * kept if main_grad_copies else 0.0
    extra = REMAINDER_PEAK_BYTES if state != "fp32" and not fp8_master else 0.0
    return extra + UNSCALED_MOMENT_BYTES.get(state, 0.0) + (4.0 if main_grad_copies else 0.0)


def adam_peak_bytes(state: str = "fp32", offload: float = 0.0, fp8_master: bool = False) -> float:
    """At rest plus what only the step adds beyond fp32 state: what the memory ladder compares."""
    return adam_bytes(state, offload, fp8_master) + step_bytes(state, offload, fp8_master, main_grad_copies=False)


def host_bytes(offload: float) -> float:
    """Pinned host memory per parameter of an offloaded share: fp32 master copy, both moments, fp32 gradient."""
    return 16.0 * min(1.0, max(0.0, offload))


def state_bytes_per_param(optimizer: str | None, dp: int, non_linear_share: float = 0.0, state: str = "fp32",
                          offload: float = 0.0, fp8_master: bool = False) -> float:
    """Optimizer-state bytes per parameter held on one GPU.

    ``non_linear_share``: the fraction of these parameters that Muon leaves to Adam (embeddings,
    output layer, norms, biases); ignored for Adam. ``state`` and ``offload``: Adam's levers (above).
    """
    dp = max(1, int(dp))
    if optimizer == "muon":
        share = min(1.0, max(0.0, float(non_linear_share)))
        return (MUON_BYTES * (1.0 - share) + ADAM_BYTES * share) / dp
    return adam_bytes(state, offload, fp8_master) / dp
