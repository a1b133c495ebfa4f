"""MoE-aware per-GPU memory estimate for the most-loaded rank.

Counts weights, gradients and Adam state per shard (expert parameters shard over
EP*ETP and their optimizer state over expert-DP), activations including the
top-k routed tokens, unfused attention scores where there is no Transformer
Engine, logits, and dispatcher buffers. The constants are calibrated against
measured peaks (benchmarks/results/RESULTS.md).
"""

from __future__ import annotations

import functools
import itertools
import math
import os
from typing import Any

from mocompile import layout as layouts
from mocompile import ncclep
from mocompile.datafiles import load_yaml
from mocompile.optimizer_state import host_bytes, keeps_fp32_master, state_bytes_per_param, step_bytes

GIB = 1024 ** 3
LIMITS = os.path.join(os.path.dirname(__file__), "data", "memory.yaml")
ROUTING_IMBALANCE = 1.2      # most-loaded expert rank vs the mean, natural routing
WORKSPACE_GIB = 0.5          # NCCL buffers and CUDA context: outside PyTorch's allocator
ATTN_SCORE_BYTES = 2.5       # unfused attention keeps the bf16 softmax output (+ dropout mask bits) per score
OVERLAP_EXTRA = 0.15         # extra micro-batches alive under EP overlap without pipelining
# Transformer Engine's activation bytes relative to the per-token counts above (fused attention, fused
# permute, TE cross-entropy): fitted on this project's six measured TE peaks (4x H100, TE 2.12, mid model,
# benchmarks/results/te-h100x4-2026-11-26: peak allocated 33.0-39.2 GiB, within -7.4 %..+0.2 %
# with the unfused weight-gradient term; the FP8 bytes below keep every shipped Bridge FP8/FP4 recipe fitting,
# plan_quality) and the published TE peak, Qwen3-30B-A3B 16xH100 EP16 HybridEP + EP overlap, 62.2 GiB (perf-recipes.md
# §5, compared with total_gib: +12 %, 69.6 GiB, 6.0 of it graph buffers by the term below; whether that
# figure is allocated, reserved or nvidia-smi memory is not published). Was 0.8 from the Qwen peak
# alone, which left every measured TE peak 4-15 % under.
TE_ACTIVATION_FACTOR = 0.95
# CUDA graphs keep their captured buffers in PyTorch's allocator (so they count in peak allocated): TE
# scoped graphs hold static inputs and outputs of every graphed scope and their gradients, per layer and per
# micro-batch running at once (4 hidden-sized bf16 tensors per token per scope); measured +2.0 GiB for
# moe_router + moe_preprocess on the TE grid (16 layers, 4096 tokens, hidden 2048, EP overlap: 2 in flight),
# which this gives (2.0 GiB), and +6.00 GiB measured with the rank probe on Qwen3-30B-A3B (48 layers, EP overlap),
# which it gives too (6.0 GiB). Full-iteration graphs "can raise peak memory 1.5-2x" (Bridge
# skills/nemo-mbridge-perf-cuda-graphs, docs/training/cuda-graphs.md), an upper bound nobody here measured; the lower
# bound that is measured is NVIDIA's Qwen3-30B-A3B 8x B300 MXFP8 recipe, which runs its full-iteration graphs on
# 288 GiB: the rest of its estimate (weights 61.9, activations 148.5, logits 35.2 GiB) leaves the graphs 0.27 of the
# activations if that rest is exact and 0.45 if it is over by the estimate's measured error (9.2 %); the factor is the
# middle of that range, and stays above what the router-scope graphs the planner offers instead hold at MBS 8.
GRAPH_IO_TENSORS = 4
FULL_ITERATION_GRAPH_FACTOR = 0.35
# TE graphs of the attention scope hold far fewer static buffers than the router scopes': measured with the rank
# probe on one H100 (Qwen3-30B-A3B, rank 0 of 16, benchmarks/results/rankprobe-2026-11-27 call-p): the router
# scopes with EP overlap cost 6.00 GiB (63.15 -> 57.15 GiB with graphs off; the term above gives 6.0), attention +
# the router scopes without overlap 3.57 GiB (56.37 -> 52.80), so attention adds 0.57 GiB where the router scopes
# take 3.0: a fifth.
ATTN_GRAPH_SHARE = 0.2


@functools.lru_cache(maxsize=1)
def limits() -> dict[str, float]:
    """The headroom and the estimate's measured error (values only; sources stay in ``data/memory.yaml``)."""
    return {k: float(v["value"]) for k, v in load_yaml(LIMITS)["limits"].items()}


def usable_gib(gpu_gib: float) -> float:
    """The most a plan may fill on a GPU of ``gpu_gib``: the planner's headroom (to the estimate's 0.01 GiB)."""
    return round(gpu_gib * limits()["headroom"], 2)


def shipped_limit_gib(gpu_gib: float) -> float:
    """The most a shipped recipe, run as shipped, may be estimated at: it is measured to fit, so our estimate
    contradicts that only beyond its measured error."""
    return round(gpu_gib * (1.0 + limits()["measured_error"]), 2)


def full_attention_layers(m: dict[str, Any], layers: int | None = None) -> int:
    """How many of the first ``layers`` (default: all) decoder layers are full (softmax) attention: all of them but
    in a hybrid model, where MCore makes layer l (1-based) full attention when l % ``linear_attention_freq`` == 0
    and a Gated DeltaNet layer otherwise (MCore 0.19.2 models/gpt/experimental_attention_variant_module_specs.py
    get_linear_attention_pattern: ``0 if (i + 1) % freq == 0 else 1``; Qwen3-Next: every 4th)."""
    n = m["num_layers"] if layers is None else layers
    freq = m.get("linear_attention_freq") if m.get("attention") == "hybrid" else None
    return n // freq if freq else n


def _full_attention_params(m: dict[str, Any]) -> float:
    """One softmax-attention layer's projection weights (GQA or MLA). ``attention_output_gate``: MCore's gated
    attention widens linear_qkv by a sigmoid gate as wide as q (MCore 0.19.2 transformer/attention.py:1829,
    ``ng * (2 * np/ng + 2) * hn``)."""
    h, heads, kv = m["hidden_size"], m["num_attention_heads"], m["kv_channels"]
    if m.get("attention") == "mla":
        q_lora, kv_lora, rope, nope = m.get("q_lora_rank", 1536), m.get("kv_lora_rank", 512), 64, 128
        # q_lora_rank 0 (HF null: Moonlight, DeepSeek-V2-Lite): MCore's MLA projects q straight from the hidden state
        # (multi_latent_attention.py: linear_q_proj instead of linear_q_down_proj + linear_q_up_proj)
        q = h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
        return q + h * (kv_lora + rope) + kv_lora * heads * (nope + kv) + heads * kv * h
    q, kvd = heads * kv, m["num_query_groups"] * kv
    gate = q if m.get("attention_output_gate") else 0
    return h * (q + gate + 2 * kvd) + q * h


def _gdn_dims(m: dict[str, Any]) -> tuple[int, int, int, int, int]:
    """Gated DeltaNet widths (MCore 0.19.2 ssm/gated_delta_net/common.py:169-175, config defaults
    transformer_config.py:356-368): q/k width, v width, value heads, key head dim, conv kernel."""
    hk, hv = m.get("linear_num_key_heads", 16), m.get("linear_num_value_heads", 32)
    dk, dv = m.get("linear_key_head_dim", 128), m.get("linear_value_head_dim", 128)
    return hk * dk, hv * dv, hv, dk, m.get("linear_conv_kernel_dim", 4)


def _gdn_params(m: dict[str, Any]) -> float:
    """One Gated DeltaNet layer's weights (MCore 0.19.2 ssm/gated_delta_net/common.py:195-280, gdn.py:35-56):
    in_proj h x (q, k, v, z gate, beta, alpha) = h x (2 qk + 2 v + 2 Hv); the depthwise causal conv1d over
    q, k, v (2 qk + v channels x kernel, no bias); dt_bias and A_log (Hv each); out_norm (one head's width);
    out_proj v x h. The in_proj's fused input norm is, as elsewhere, not counted."""
    h = m["hidden_size"]
    qk, v, hv, dk, kernel = _gdn_dims(m)
    return h * (2 * qk + 2 * v + 2 * hv) + (2 * qk + v) * kernel + 2 * hv + m.get("linear_value_head_dim", 128) \
        + v * h


def _attention_params(m: dict[str, Any]) -> float:
    """Attention weights per decoder layer, averaged over the layer mix (a hybrid model's Gated DeltaNet and full
    attention layers; every other model's layers are all full attention). Also the attention projections'
    FLOPs per token (steptime: 2 per weight)."""
    full = _full_attention_params(m)
    n_full = full_attention_layers(m)
    if n_full == m["num_layers"]:
        return full
    return (n_full * full + (m["num_layers"] - n_full) * _gdn_params(m)) / m["num_layers"]


def parameters(m: dict[str, Any]) -> dict[str, float]:
    """Total parameter counts by kind (not yet sharded)."""
    h = m["hidden_size"]
    g = 3 if m.get("gated_linear_unit", True) else 2
    n_moe = m["num_layers"] - m.get("first_k_dense", 0)
    attn = _attention_params(m) * m["num_layers"]
    dense_mlp = g * h * m["ffn_hidden_size"] * m.get("first_k_dense", 0)
    shared = g * h * m.get("shared_expert_size", 0) * n_moe
    router = h * m["num_moe_experts"] * n_moe
    experts = g * h * m["moe_ffn_hidden_size"] * m["num_moe_experts"] * n_moe
    embed = h * m["vocab_size"] * 2  # untied input embedding and output layer
    return {"attention": attn, "dense_mlp": dense_mlp, "shared": shared, "router": router,
            "experts": experts, "embedding": embed}


GDN_CHUNK = 64  # fla chunk_gated_delta_rule's default chunk_size, which MCore 0.19.2 (gdn.py:238) leaves as it is


def _gdn_act_bytes(m: dict[str, Any], modules: list[str] | tuple[str, ...]) -> float:
    """Bytes one Gated DeltaNet layer keeps for backward per local token (bf16 unless stated), counted from MCore
    0.19.2 ssm/gated_delta_net/gdn.py forward and fla-core 0.5.2's kernels:

    - in_proj's fused input norm: its input and output (4h), as attention's linear_qkv;
    - the whole in_proj output (q, k, v, z, beta, alpha): fla's causal_conv1d saves its input ``x``, which is a
      split view of that output, without copying it (fla modules/conv/triton/ops.py:365-389,
      ``input_guard(no_guard_contiguous=["x"])``, ``save_for_backward(x, ...)``);
    - the l2-normed q and k (fla modules/l2norm.py:266 saves its output and an fp32 rstd per head row);
    - q and k repeated to the value heads, and v made contiguous: saved by chunk_gated_delta_rule with the
      fp32 cumulative decay g, beta and A, the bf16 [T, Hv, chunk] WY matrix (fla ops/gated_delta_rule/chunk.py:
      310-326, chunk_fwd.py:382); the chunk states h are recomputed in backward, not kept;
    - the gate's fp32 softplus/exp inputs (common.py:444, ``_compute_g_and_beta``);
    - the gated output norm: the kernel output o (out_norm's input, TE RMSNorm, with its fp32 rstd per head
      row), the normed o and the contiguous z the sigmoid-gated product keeps (common.py:370-379), and that
      product, out_proj's input.

    ``layernorm`` recompute drops the norm's tensors as for attention; ``core_attn`` recompute does not reach a
    GDN layer (it has no core_attention submodule; MCore's own ``gdn_norm_out`` is not planned by mocompile)."""
    h = m["hidden_size"]
    qk, v, hv, dk, _ = _gdn_dims(m)
    hk = qk // dk if dk else 0
    norm = 0 if "layernorm" in modules else 4 * h
    in_proj_out = 2 * (2 * qk + 2 * v + 2 * hv)
    l2norm = 2 * 2 * qk + 4 * 2 * hk
    kernel_in = 2 * 2 * hv * dk + 2 * v + 4 * hv + 2 * hv + 2 * hv * GDN_CHUNK
    gates = 2 * 4 * hv
    out = 4 * 2 * v + 4 * hv
    return norm + in_proj_out + l2norm + kernel_in + gates + out


def _moe_share(m: dict[str, Any]) -> float:
    """The share of the model's decoder layers that are MoE layers (the first ``first_k_dense`` are dense)."""
    return (m["num_layers"] - m.get("first_k_dense", 0)) / m["num_layers"]


def _act_bytes_per_token(m: dict[str, Any], force_balance: Any, modules: list[str] | tuple[str, ...],
                         full: bool, glu_fused: bool = True) -> float:
    """Bytes kept for backward per local token per layer (averaged over dense/MoE layers, over a hybrid model's
    Gated DeltaNet and full-attention layers). ``glu_fused`` False:
    Megatron-Core's unfused GLU (``bias_activation_fusion`` off; transformer/moe/experts.py ``bias_act_func``,
    transformer/mlp.py ``glu``: ``activation_func(x_glu) * (x_linear + glu_linear_offset)``) keeps the activation's
    output and the offset copy of the linear half (and, in the experts, the GLU product the router probabilities
    multiply) beside fc1's output: 4 bytes per FFN channel more per token in a dense MLP or shared expert, 6 per
    routed token in the experts, unless that module is recomputed. Measured with the rank probe (Qwen3-235B-A22B,
    256 H100s, rank 0, fused vs unfused): 14.5 GiB, 6.2 bytes per routed channel."""
    h = m["hidden_size"]
    if full:
        return 2.0 * h
    q = m["num_attention_heads"] * m["kv_channels"]
    kvd = m["num_query_groups"] * m["kv_channels"]
    attn = h * 10 + 2 * (q + 2 * kvd)
    if "core_attn" in modules or "mla_up_proj" in modules:
        attn -= 2 * (q + 2 * kvd)
    if "layernorm" in modules:
        attn -= 4 * h
    if m.get("attention_output_gate"):
        # gated attention (MCore 0.19.2 attention.py:1605-1629): the gate is a split of linear_qkv's output that
        # the fused _apply_output_gate keeps with the core-attention output it multiplies (2q), and the gated
        # product is a new tensor, linear_proj's saved input, where ungated attention's was its output (2q)
        attn += 4 * q
    n_full = full_attention_layers(m)
    if n_full < m["num_layers"]:
        attn = (n_full * attn + (m["num_layers"] - n_full) * _gdn_act_bytes(m, modules)) / m["num_layers"]
    topk = m["moe_router_topk"]
    imbalance = 1.0 if force_balance else ROUTING_IMBALANCE
    glu = bool(m.get("gated_linear_unit", True))
    unfused = 0 if glu_fused or not glu else 1
    per_routed = 2 * h + 6 * m["moe_ffn_hidden_size"]
    if "moe_act" in modules:
        per_routed -= 2 * m["moe_ffn_hidden_size"]
    else:
        per_routed += unfused * 6 * m["moe_ffn_hidden_size"]
    moe = 4 * h + 5 * m["num_moe_experts"] + topk * imbalance * per_routed
    if m.get("shared_expert_size"):
        moe += 2 * h + (6 + 4 * unfused) * m["shared_expert_size"] if "shared_experts" not in modules else 2 * h
    if "moe" in modules:
        moe = 2 * h
    dense = 2 * h + (6 + 4 * unfused) * m["ffn_hidden_size"]
    if "mlp" in modules:
        dense = 2 * h
    frac_moe = _moe_share(m)
    return attn + frac_moe * moe + (1 - frac_moe) * dense


# Megatron-Core's fine-grained activation offload labels (TransformerConfig.offload_modules), in its order; the
# fused grouped MLP's label needs TE's op fuser, which mocompile does not plan.
OFFLOAD_ORDER = ("attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1", "moe_act")


def offloaded_bytes_per_token(m: dict[str, Any], force_balance: Any, offload: tuple[str, ...] | list[str],
                              modules: tuple[str, ...] | list[str]) -> float:
    """Bytes per local token per layer that fine-grained activation offload moves to the host: the inputs each
    offloaded module keeps for its backward (bf16), except where selective recompute already drops them
    (``modules``: the recompute modules; ``moe`` recomputes the whole MoE layer). Averaged over dense and MoE layers
    like ``_act_bytes_per_token``: the same tensors, counted the same way."""
    if not offload:
        return 0.0
    h = m["hidden_size"]
    q = m["num_attention_heads"] * m["kv_channels"]
    kvd = m["num_query_groups"] * m["kv_channels"]
    norms = "layernorm" not in modules  # recomputed norms keep no outputs: nothing left to offload after them
    attn = 0.0
    attn += 2 * h if "attn_norm" in offload else 0.0
    attn += 2 * h if "qkv_linear" in offload and norms else 0.0
    attn += 2 * (q + 2 * kvd) if "core_attn" in offload and not {"core_attn", "mla_up_proj"} & set(modules) else 0.0
    attn += 2 * q if "attn_proj" in offload else 0.0
    mlp = 2 * h if "mlp_norm" in offload else 0.0
    moe = 0.0
    if "moe" not in modules:
        routed = m["moe_router_topk"] * (1.0 if force_balance else ROUTING_IMBALANCE)
        moe += routed * 2 * h if "expert_fc1" in offload else 0.0
        moe += routed * 4 * m["moe_ffn_hidden_size"] if "moe_act" in offload and "moe_act" not in modules else 0.0
    return attn + mlp + _moe_share(m) * moe


def _layer_microbatches(chunks: tuple[float, ...], pp: int, forwards: int) -> float:
    """Layer-activations alive after ``forwards`` chunk forwards of interleaved 1F1B on one rank: forward k runs
    virtual chunk (k // pp) % vpp, holding that chunk's layers until its backward."""
    vpp = len(chunks)
    groups, rest = divmod(int(forwards), pp)  # whole groups of pp forwards run one chunk each, then the rest
    return pp * sum(chunks[g % vpp] for g in range(groups)) + rest * chunks[groups % vpp]


def estimate(m: dict[str, Any], c: dict[str, Any]) -> dict[str, Any]:
    """Estimate peak allocated bytes per GPU for flat settings ``c``; GiB figures."""
    return Estimator(m, c).of(c)


# Activations one MTP layer keeps, in MoE layers' worth: its transformer layer, plus what the block keeps beside it
# (the embedded shifted tokens and the main model's hidden states it normalises and concatenates, eh_proj's 2h input,
# its final norm and the output layer's input). Measured on 1x H200 with a resized DeepSeek-V3 (4 layers, hidden 1024,
# 2 x 2048 tokens per micro-batch; benchmarks/results/resized-h200-2026-11-29): MTP 1 minus MTP 0 is +0.80 GiB of peak
# allocated at vocabulary 32000 and at 129280 alike, of which 0.33 GiB are the layer's weights and optimizer state
# and 0.47 GiB activations, two MoE layers' 0.24 GiB each. Its logits leave the peak unchanged.
MTP_ACTIVATION_LAYERS = 2.0


@functools.lru_cache(maxsize=4096)
def _stage_chunks(layout: str | None, pp: int, vpp: int, n: int, mtp: int, dense: int) -> tuple[Any, Any]:
    """``Estimator.stage_chunks`` for a layout and model depth, shared by every estimator of a process: the search
    for the smallest GPU count that fits builds one estimator per GPU count and lever, with the same layouts."""
    legal = layout is not None and pp > 1 and layouts.layout_error(layout, pp, vpp, n, mtp) is None
    text = layout if legal else layouts.default(pp, vpp, n, mtp)
    counts = [float(st.count("t")) for st in layouts.expand(text)] if text else \
        [math.ceil(n / pp) / vpp] * (pp * vpp)
    starts = [0.0, *itertools.accumulate(counts)][:-1]  # layers before each stage (linear: PP x VPP may be 65536)
    dense_in = [max(0.0, min(counts[i], dense - starts[i])) for i in range(len(counts))]
    return (tuple(tuple(counts[j * pp + r] for j in range(vpp)) for r in range(pp)),
            tuple(tuple(dense_in[j * pp + r] for j in range(vpp)) for r in range(pp)))


def _allocated(weights: float, acts: float, logits: float, graphs: float, unfused_wgrad: float,
               step: float) -> tuple[float, float]:
    """The allocator's peak and its optimizer-step part: the step's temporaries (``step``) count where they top
    what the backward's activations, logits and unfused wgrad buffers had held."""
    step_extra = max(0.0, step - (acts + logits + unfused_wgrad))
    return weights + acts + logits + graphs + unfused_wgrad + step_extra, step_extra


class Estimator:
    """``estimate`` for one model and the settings a plan search does not vary (world size, batch shape,
    precision, optimizer, gradient dtype, layer spec, CUDA-graph scopes), taken from ``c``.

    The planner asks for thousands of candidates that differ in a few knobs, and most terms depend on
    few of them, so each part is computed once per the knobs it reads: weights and optimizer state per
    (TP, PP, CP, EP, ETP); activations and logits per (TP, PP, VPP, CP, recompute, EP overlap); the
    dispatcher and CUDA-graph buffers per call. It is ``estimate``'s own arithmetic in its own order
    (``estimate`` runs through it), so the figures are the same to the bit."""

    def __init__(self, m: dict[str, Any], c: dict[str, Any]):
        self.m = m
        self.p = parameters(m)
        self.world = c["world_size"]
        # bf16 parameter + gradient buffer (fp32 unless gradients are reduced in bf16, as Bridge's perf recipes
        # do: Megatron's DDP keeps the buffer in the reduce dtype) + fp32 master and Adam moments, sharded over DP.
        self.grad = 4 if c.get("grad_reduce_in_fp32", True) else 2
        # optimizer state per parameter (Adam 12 B, Muon 8 B + Adam on embeddings): optimizer_state.py
        self.opt = c.get("optimizer", "adam")
        self.opt_state = c.get("optimizer_state") or "fp32"
        self.offload = float(c.get("optimizer_offload_fraction") or 0.0)
        self.fp8_master = keeps_fp32_master(c.get("fp8"))
        # what exists only while Adam steps, per parameter of the optimizer shard (optimizer_state.step_bytes)
        self.step_per = step_bytes(self.opt_state, self.offload, self.fp8_master,
                                   main_grad_copies=self.grad == 2) if self.opt != "muon" else 0.0
        self.fsdp = bool(c.get("use_megatron_fsdp"))
        self.act_offload = tuple(c.get("offload_modules") or ())
        self.seq, self.mbs, self.gbs = c["seq_length"], c["micro_batch_size"], c["global_batch_size"]
        self.force_balance = c.get("moe_router_force_load_balancing")
        self.impl = c.get("transformer_impl")
        self.fp8, self.fp4 = c.get("fp8"), c.get("fp4")
        # bytes per element of a GEMM input Transformer Engine keeps for the weight gradient: bf16 2, or the
        # low-precision copy an FP8 (1) or FP4 (~0.5) recipe made for the GEMM
        low = self.impl == "transformer_engine" and (self.fp8 or self.fp4)
        self.saved_input_bytes = (0.5 if self.fp4 else 1.0) if low else 2.0
        self.nvlink_domain = c.get("nvlink_domain", 8)
        # the scopes of ``c`` (the final plan's); a search passes each candidate's own (``graph_scopes`` below)
        self.graph_scopes = tuple(c.get("cuda_graph_modules") or c.get("cuda_graph_scope") or ())
        self.unfused = c.get("gradient_accumulation_fusion") is False
        self.layout = c.get("pipeline_model_parallel_layout")
        # None: the most-loaded pipeline stage; a number: that stage (the rank probe compares the rank it measured)
        self.stage = c.get("memory_stage")
        self.glu_fused = c.get("bias_activation_fusion") is not False  # absent: fused (Bridge's perf recipes)
        self.shared_overlap = bool(c.get("moe_shared_expert_overlap"))
        self.mtp = int(c.get("mtp_num_layers") or m.get("mtp_num_layers") or 0)
        self.peak_stage: dict[tuple[Any, ...], int] = {}   # _acts_of's key -> the pipeline stage its peak is on
        self._chunks: dict[tuple[int, int], tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]]] = {}
        self._weights: dict[tuple[int, ...], tuple[Any, ...]] = {}
        self._ranks: dict[tuple[Any, ...], tuple[Any, ...]] = {}   # _weights_of's per-rank weighing
        self._sums: dict[tuple[int, int], tuple[tuple[float, float, int], ...]] = {}
        self._buffer_bytes: dict[tuple[Any, ...], float] = {}
        self._distinct: dict[tuple[int, int], tuple[tuple[float, float, int], ...]] = {}
        self._acts: dict[tuple[Any, ...], tuple[float, ...]] = {}
        self._flight: dict[tuple[Any, ...], tuple[tuple[Any, ...], ...]] = {}
        self._per_token: dict[tuple[Any, ...], float] = {}
        self._n_scopes: dict[tuple[str, ...], float] = {}

    def of(self, c: dict[str, Any]) -> dict[str, Any]:
        """The estimate for the candidate fields of ``c`` (layout, recompute, overlap, dispatcher, graphs)."""
        granularity = c.get("recompute_granularity")
        backend = c.get("moe_flex_dispatcher_backend") if c.get("moe_token_dispatcher_type") == "flex" else None
        return self.estimate(c["tensor_model_parallel_size"], c["pipeline_model_parallel_size"],
                             c.get("virtual_pipeline_model_parallel_size") or 1, c["expert_model_parallel_size"],
                             c["expert_tensor_parallel_size"], c["context_parallel_size"], granularity,
                             tuple(c.get("recompute_modules") or ()) if granularity == "selective" else (),
                             bool(c.get("overlap_moe_expert_parallel_comm")), backend,
                             c.get("hybridep_ranks_per_domain"), c.get("cuda_graph_impl") or "none",
                             tuple(c.get("cuda_graph_modules") or c.get("cuda_graph_scope") or ()),
                             bool(c.get("moe_shared_expert_overlap")))

    def stage_chunks(self, pp: int, vpp: int) -> tuple[tuple[tuple[float, ...], ...], tuple[tuple[float, ...], ...]]:
        """(layers, dense layers) in each virtual chunk of every pipeline rank. Megatron-Core places the layout's
        stage ``i`` on pipeline rank ``i % pp``, virtual stage ``i // pp``
        (``megatron/core/transformer/pipeline_parallel_layer_layout.py``), so a layout that gives the embedding's
        stage fewer layers (``Et|(tt|)*30mL``: DeepSeek-V3's first rank holds 1 + 2 + 2 + 2 = 7 of 61, one of them
        dense) gives that rank fewer parameters and fewer layer-activations in flight than ``num_layers / pp``, and
        its middle ranks more. The layout is the plan's where it is legal for this (PP, VPP), else the one the
        planner derives for it (``layout.derive``: uneven splits and MTP), else an even split. The model's first
        ``first_k_dense`` layers are the dense ones."""
        key = (pp, vpp)
        hit = self._chunks.get(key)
        if hit is None:
            layout = self.layout if isinstance(self.layout, str) else None
            hit = self._chunks[key] = _stage_chunks(layout, pp, vpp, self.m["num_layers"], self.mtp,
                                                    self.m.get("first_k_dense", 0))
        return hit

    def _rank_sums(self, pp: int, vpp: int) -> tuple[tuple[float, float, int], ...]:
        """Per pipeline rank: (its layers, its dense layers, its MTP layers) by the layout. Megatron-Core builds the
        multi-token-prediction block on the last pipeline stage (``mtp_on_this_rank``, models/gpt/gpt_model.py)."""
        key = (pp, vpp)
        hit = self._sums.get(key)
        if hit is None:
            ranks, dense = self.stage_chunks(pp, vpp)
            hit = self._sums[key] = tuple((sum(ranks[r]), sum(dense[r]), self.mtp if r == pp - 1 else 0)
                                          for r in range(pp))
        return hit

    def _weights_of(self, tp: int, pp: int, cp: int, ep: int, etp: int, vpp: int = 1) -> tuple[Any, ...]:
        key = (tp, pp, cp, ep, etp, vpp)
        hit = self._weights.get(key)
        if hit is not None:
            return hit
        m, p, world = self.m, self.p, self.world
        dp = max(1, world // (tp * pp * cp))
        edp = max(1, world // (ep * etp * pp))
        n_dense = m.get("first_k_dense", 0)
        grad, opt, st, off, fp8m = self.grad, self.opt, self.opt_state, self.offload, self.fp8_master
        emb = p["embedding"] / 2 / tp if pp > 1 else p["embedding"] / tp
        unfused_wgrad = 0.0
        if self.unfused:
            # Without the fused wgrad-into-main_grad GEMMs (they need Apex), each weight gradient is a separate bf16
            # tensor until it is added to the gradient buffer: one layer's local weights at a time during backward,
            # with the output layer's at its start (no Apex on the TE grid: 0.3 GiB of its 36.7 GiB peak).
            n_moe = max(1, m["num_layers"] - n_dense)
            layer = (p["attention"] / m["num_layers"] + (p["shared"] + p["router"]) / n_moe) / tp \
                + p["experts"] / n_moe / (ep * etp)
            unfused_wgrad = 2.0 * (layer + p["embedding"] / 2 / tp)
        step_per = self.step_per

        def weigh(layers_rank: float, dense_here: float, mtp_here: int = 0) -> tuple[Any, ...]:
            """Weights, gradients and optimizer state of a pipeline rank with ``layers_rank`` layers, ``dense_here``
            of them dense, ``mtp_here`` MTP layers: the same for every rank, layout and virtual-stage count that give
            it those."""
            rank_key = (tp, pp, cp, ep, etp, layers_rank, dense_here, mtp_here)
            done = self._ranks.get(rank_key)
            if done is None:
                done = self._ranks[rank_key] = weigh_layers(layers_rank, dense_here, mtp_here)
            return done

        def weigh_layers(layers_rank: float, dense_here: float, mtp_here: int) -> tuple[Any, ...]:
            # its dense layers carry the dense MLP, its MoE layers the router, shared expert and experts; an MTP layer
            # (transformer/multi_token_prediction.py MultiTokenPredictionLayer) is a MoE layer plus eh_proj, which
            # projects [embedding; hidden] (2h) to h, and on a pipeline the MTP stage builds its own embedding
            moe_share = (layers_rank - dense_here + mtp_here) / max(1, m["num_layers"] - n_dense)
            share = (layers_rank + mtp_here) / m["num_layers"]
            mtp_own = mtp_here * 2 * m["hidden_size"] ** 2 / tp + (p["embedding"] / 2 / tp if mtp_here and pp > 1 else 0.0)
            dense = (p["attention"] * share + p["dense_mlp"] * (dense_here / n_dense if n_dense else 0.0)
                     + p["shared"] * moe_share) / tp + p["router"] * moe_share + emb + mtp_own
            experts = p["experts"] * moe_share / (ep * etp)
            held_dense = held_expert = 2 + grad  # bf16 weight + gradient buffer, whole on every DP rank
            gathered = 0.0
            if self.fsdp:
                # Megatron-FSDP (optim_grads_params) shards them like the optimizer state, over DP and expert-DP; each
                # layer is gathered whole for its forward and backward (and its gradient reduce-scattered from a whole
                # buffer): the layer computing and the one prefetched, and the embedding/output layer at the ends
                held_dense, held_expert = (2 + grad) / dp, (2 + grad) / edp
                layer = (dense - emb) / max(1, layers_rank) + experts / max(1, layers_rank)
                gathered = (2 + grad) * (2 * layer + emb)
            bytes_dense = held_dense + state_bytes_per_param(opt, dp, emb / dense if dense else 0.0, st, off, fp8m)
            bytes_expert = held_expert + state_bytes_per_param(opt, edp, 0.0, st, off, fp8m)
            weights = dense * bytes_dense + experts * bytes_expert + gathered
            step = (dense / dp + experts / edp) * step_per
            return (dp, layers_rank, dense, experts, weights, unfused_wgrad, step)

        if self.stage is not None:
            hit = weigh(*self._rank_sums(pp, vpp)[min(self.stage, pp - 1)])
        else:  # the heaviest rank's (with the activations' heaviest rank, an upper bound on any one rank's sum);
            # ranks with the same layers weigh the same: each distinct one once, the first of the heaviest kept
            sums = self._distinct_sums(pp, vpp)
            hit = weigh(*sums[0])
            for pair in sums[1:]:
                w = weigh(*pair)
                if w[4] > hit[4]:
                    hit = w
        self._weights[key] = hit
        return hit

    def _distinct_sums(self, pp: int, vpp: int) -> tuple[tuple[float, float, int], ...]:
        """``_rank_sums`` without repeats, in rank order: ranks with the same layers weigh the same."""
        key = (pp, vpp)
        hit = self._distinct.get(key)
        if hit is None:
            hit = self._distinct[key] = tuple(dict.fromkeys(self._rank_sums(pp, vpp)))
        return hit

    def _kind_model(self, kind: str) -> dict[str, Any]:
        """The model with all its layers of one ``kind`` ("moe", "dense"), or as it is ("mix")."""
        if kind == "mix":
            return self.m
        return {**self.m, "first_k_dense": 0 if kind == "moe" else self.m["num_layers"]}

    def _bytes_per_token(self, modules: tuple[str, ...], full: bool, kind: str = "mix") -> float:
        """``kind``: "mix" averages dense and MoE layers over the model; "moe" and "dense" price one kind (a
        pipeline rank holds the layers its stages hold, not the model's average)."""
        key = (modules, full, kind)
        hit = self._per_token.get(key)
        if hit is None:
            m = self._kind_model(kind)
            hit = _act_bytes_per_token(m, self.force_balance, modules, full, self.glu_fused)
            if not full:  # full recompute keeps only each layer's input: nothing for offload to move
                hit -= min(hit, offloaded_bytes_per_token(m, self.force_balance, self.act_offload, modules))
            self._per_token[key] = hit
        return hit

    def _layout_copies(self, kind: str, modules: tuple[str, ...], tp: int, shared: bool) -> float:
        """Bytes per local token per layer that Megatron-Core keeps because of how it lays tensors out, beyond the
        per-token counts of ``_act_bytes_per_token``:

        - GQA with ``qk_layernorm``: ``get_query_key_value_tensors`` (transformer/attention.py) reshapes the query
          split out of linear_qkv's output to [sq, b, np, hn]; with more than one query group per rank and more than
          one head per group that view cannot be reshaped in place, so it is a copy, and q_layernorm keeps it for
          its backward (2 bytes per query channel). Measured with the rank probe's allocation trace on Qwen3-235B-A22B
          (attention.py:1906, 16 KiB per token per layer).
        - ``moe_shared_expert_overlap`` with TP > 1: SharedExpertMLP.pre_forward_comm (transformer/moe/shared_experts.py)
          gathers the whole sequence before linear_fc1, which then runs without sequence parallelism and keeps the
          gathered input for its weight gradient: tp times the local shard the non-overlapped layer keeps (FP8/FP4:
          its low-precision copy)."""
        m = self.m
        extra = 0.0
        if m.get("qk_layernorm") and m.get("attention") not in ("mla", "hybrid") and "core_attn" not in modules:
            groups = m["num_query_groups"] // tp if m["num_query_groups"] >= tp else 1
            if groups > 1 and m["num_attention_heads"] > m["num_query_groups"]:
                extra += 2 * m["num_attention_heads"] * m["kv_channels"]
        if shared and tp > 1 and m.get("shared_expert_size") and not {"moe", "shared_experts"} & set(modules):
            extra += _moe_share(self._kind_model(kind)) * self.saved_input_bytes * m["hidden_size"] * (tp - 1)
        return extra

    def _low_precision_saving(self, kind: str, modules: tuple[str, ...]) -> float:
        """Bytes per local token per layer an FP8/FP4 recipe keeps less than bf16. Transformer Engine saves a GEMM's
        input for its weight gradient as the low-precision (column-wise) copy it made, 1 byte per element (FP4
        ~0.5) instead of 2, where nothing else keeps the bf16 tensor: linear_qkv's layer-norm output and, per routed
        token, the expert fc1 and fc2 inputs. Where Megatron-Core 0.19.2 calls ``set_save_original_input`` the
        module keeps the bf16 input instead, and the copy saves nothing: ``linear_proj`` with any recipe but
        delayed scaling (transformer/attention.py: fused attention keeps that same bf16 output for its own
        backward), ``linear_fc2`` when ``moe_act`` is recomputed (transformer/moe/experts.py: the recompute
        discards that input), ``linear_qkv`` when ``layernorm`` is. With delayed scaling ``linear_proj`` keeps its
        FP8 copy beside attention's bf16 output: 1 byte more than bf16. Measured with the rank probe on one H100
        (FP8 current scaling vs bf16, the same plans): counting linear_proj's copy as a saving put DeepSeek-V3,
        GPT-OSS-120B and Qwen3-235B-A22B 2.3-2.7 GiB under their measured peaks."""
        m = self.m
        lp = self.saved_input_bytes        # bytes per element of the low-precision copy
        freed = 2.0 - lp                   # where the bf16 tensor is released
        h, ffn = m["hidden_size"], m["moe_ffn_hidden_size"]
        saving = 0.0 if "layernorm" in modules else freed * h
        if self.fp8 == "delayed" and not self.fp4:
            saving -= lp * m["num_attention_heads"] * m["kv_channels"]
        if "moe" not in modules:
            routed = m["moe_router_topk"] * (1.0 if self.force_balance else ROUTING_IMBALANCE) \
                * _moe_share(self._kind_model(kind))
            saving += routed * freed * (h + (0.0 if "moe_act" in modules else ffn))
        return saving

    def _acts_key(self, tp: int, pp: int, vpp: int, cp: int, granularity: Any, modules: tuple[str, ...],
                  overlap: bool, shared: bool | None) -> tuple[Any, ...]:
        """``_acts_of``'s cache key (dp and layers_rank follow from it), also the key of ``peak_stage``; ``shared``
        None resolves to this estimator's own moe_shared_expert_overlap."""
        return (tp, pp, vpp, cp, granularity, modules, overlap,
                self.shared_overlap if shared is None else bool(shared))

    def _acts_of(self, tp: int, pp: int, vpp: int, cp: int, dp: int, layers_rank: int, granularity: Any,
                 modules: tuple[str, ...], overlap: bool, shared: bool | None = None) -> tuple[float, ...]:
        """``shared``: the candidate's moe_shared_expert_overlap (None: that of the settings this estimator was
        made from)."""
        key = self._acts_key(tp, pp, vpp, cp, granularity, modules, overlap, shared)
        shared = key[-1]
        hit = self._acts.get(key)
        if hit is not None:
            return hit
        m = self.m
        full = granularity == "full"
        s, b = self.seq, self.mbs
        tokens = s * b / (tp * cp)
        def per_layer_of(kind: str) -> float:
            """Bytes one layer of ``kind`` ("mix": the model's dense/MoE average) keeps per micro-batch."""
            per_layer = self._bytes_per_token(modules, full, kind) * tokens
            if self.impl == "transformer_engine" and (self.fp8 or self.fp4) and not full:
                per_layer -= self._low_precision_saving(kind, modules) * tokens
            if not full:
                per_layer += self._layout_copies(kind, modules, tp, shared) * tokens
            if self.impl == "local" and not ("core_attn" in modules or full):
                per_layer += ATTN_SCORE_BYTES * m["num_attention_heads"] / tp * (s / cp) ** 2 * b  # unfused softmax
            return per_layer

        m_total = max(1, self.gbs // max(1, b * dp))
        ranks, dense = self.stage_chunks(pp, vpp)
        logits_full = s * b * m["vocab_size"] * 4 * 2 / (tp * cp)  # fp32 logits and their gradient, last stage
        mixed = not any(any(d) for d in dense) or pp == 1
        per_mix = per_layer_of("mix") if mixed else 0.0
        per_dense, per_moe = (0.0, 0.0) if mixed else (per_layer_of("dense"), per_layer_of("moe"))
        best: tuple[float, ...] | None = None   # (acts + logits, acts, in_flight, rank) of the most-loaded rank
        remat = self._bytes_per_token((), False) * tokens if full else 0.0  # one layer is rematerialised at a time
        mtp = self.mtp
        per_mtp = (per_moe or per_layer_of("moe")) if mtp else 0.0
        for r, lm, ld, layers, last in self._in_flight(pp, vpp, m_total, overlap):
            # a dense layer priced as itself: with `mlp` recomputed it keeps a tenth of a MoE layer's activations
            acts_r = per_mix * lm if mixed else per_dense * ld + per_moe * (lm - ld)
            if full:
                acts_r += remat
            logits_r = logits_full if last else 0.0
            if last and mtp:
                # the MTP layers run after the last stage's layers, for the micro-batches in flight there
                # (MultiTokenPredictionBlock): each keeps what MTP_ACTIVATION_LAYERS MoE layers keep, and its own logits
                # add nothing to the peak (measured: the same +0.80 GiB at vocabularies 32000 and 129280)
                acts_r += MTP_ACTIVATION_LAYERS * per_mtp * mtp * lm / max(1.0, layers)
            if best is None or acts_r + logits_r > best[0] + 1e-6:
                best = (acts_r + logits_r, acts_r, lm / max(1.0, layers), r)
                logits = logits_r
        assert best is not None
        acts, in_flight = best[1], best[2]
        self.peak_stage[key] = int(best[3])
        if self.impl == "transformer_engine":
            acts, logits = acts * TE_ACTIVATION_FACTOR, logits * TE_ACTIVATION_FACTOR
        hit = self._acts[key] = (tokens, in_flight, acts, logits)
        return hit

    def _in_flight(self, pp: int, vpp: int, m_total: int, overlap: bool) -> tuple[tuple[Any, ...], ...]:
        """Per pipeline rank weighed by ``_acts_of``: (rank, layer x micro-batch units in flight at the schedule's
        peak, the dense ones among them, the rank's layers, whether it is the last stage). They depend on the
        schedule alone (not on TP, CP or the recompute rung), so the search's thousands of candidates share them.

        Megatron-Core's interleaved 1F1B (schedules.py, get_pp_rank_microbatches) runs (pp - r - 1) * 2 +
        (vpp - 1) * pp warm-up chunk forwards, then one more before the first backward; forward k runs chunk
        (k // pp) % vpp. Plain 1F1B keeps min(pp - r, micro-batches) whole micro-batches on rank r. Combined 1F1B
        (EP overlap) frees micro-batch i layer by layer while i+1 allocates: measured +8 % peak on 2x H100
        without a pipeline (~0.15 of a micro-batch); with a pipeline its warm-up runs one chunk more."""
        key = (pp, vpp, m_total, bool(overlap))
        hit = self._flight.get(key)
        if hit is not None:
            return hit
        ranks, dense = self.stage_chunks(pp, vpp)
        sums = self._rank_sums(pp, vpp)
        rows = []
        for r in (range(pp) if self.stage is None else (min(self.stage, pp - 1),)):
            layers, dense_layers, _ = sums[r]
            last = r == pp - 1
            if pp == 1 or (vpp == 1 and last):
                mbs: float = 1 + (OVERLAP_EXTRA if overlap else 0.0)
                lm, ld = layers * mbs, dense_layers * mbs
            elif vpp == 1:
                mbs = min(pp - r, m_total) + (1 if overlap else 0)
                lm, ld = layers * mbs, dense_layers * mbs
            else:
                forwards = min(m_total * vpp, 2 * (pp - r - 1) + (vpp - 1) * pp + 1 + (1 if overlap else 0))
                lm, ld = _layer_microbatches(ranks[r], pp, forwards), _layer_microbatches(dense[r], pp, forwards)
            rows.append((r, lm, ld, layers, last))
        hit = self._flight[key] = tuple(rows)
        return hit

    def _buffers(self, ep: int, etp: int, backend: str | None, ranks: int | None) -> float:
        """Dispatcher buffers (DeepEP and HybridEP allocate their own, outside PyTorch's allocator; NCCL EP's
        receive buffer comes from it, sized by the rank capacity factor)."""
        key = (ep, etp, backend, ranks)
        hit = self._buffer_bytes.get(key)
        if hit is None:
            hit = self._buffer_bytes[key] = self._buffers_of(ep, etp, backend, ranks)
        return hit

    def _buffers_of(self, ep: int, etp: int, backend: str | None, ranks: int | None) -> float:
        m = self.m
        buffers = 0.0
        if backend == "deepep":
            buffers = 1.0 * GIB + (1.0 * GIB if ep * etp > self.nvlink_domain else 0.0)
        elif backend == "ncclep":  # allocated per dispatch at the dropless worst case (mocompile/ncclep.py)
            buffers = ncclep.receive_bytes(self.seq * self.mbs, ep, etp, m["num_moe_experts"], m["moe_router_topk"],
                                           m["hidden_size"])
        elif backend == "hybridep":
            ranks = ranks or ep * etp
            domains = max(1, (ep * etp) // ranks)
            max_tokens = self.seq * self.mbs * ranks * domains
            buffers = max_tokens * m["hidden_size"] * 2 + max_tokens * (m["num_moe_experts"] // ep) * 4
        return buffers

    def _scope_count(self, scopes: tuple[str, ...] | None) -> float:
        """Graphed scopes that hold their own static buffers, in units of the MoE scopes (router, preprocess, as
        one): attention counts ``ATTN_GRAPH_SHARE`` of them (measured). ``scopes`` None: this estimator's own (from
        ``c``); empty: the router scopes, the default."""
        key = self.graph_scopes if scopes is None else scopes
        hit = self._n_scopes.get(key)
        if hit is None:
            found = key or ("moe_router", "moe_preprocess")
            moe = 1.0 if any(str(s).startswith("moe") for s in found) else 0.0
            attn = ATTN_GRAPH_SHARE if "attn" in found else 0.0
            hit = self._n_scopes[key] = moe + attn if moe + attn else 1.0  # another scope: as the router's
        return hit

    def _graphs(self, graph_impl: str, acts: float, layers_rank: int, overlap: bool, tokens: float,
                scopes: tuple[str, ...] | None = None) -> float:
        """CUDA-graph buffers (in PyTorch's allocator). ``scopes``: the candidate's graphed scopes; a search
        must pass them, since attention graphs (TE scope ``attn``) hold buffers of their own."""
        graphs = 0.0
        if graph_impl == "full_iteration":
            graphs = FULL_ITERATION_GRAPH_FACTOR * acts
        elif graph_impl != "none":
            # a replay overwrites the graph's static buffers, so micro-batches waiting in the pipeline share them;
            # EP overlap interleaves two micro-batches layer by layer, which needs two graph instances
            sets = 2 if overlap else 1
            graphs = GRAPH_IO_TENSORS * self._scope_count(scopes) * layers_rank * sets * tokens \
                * self.m["hidden_size"] * 2.0
        return graphs

    def _parts(self, tp: int, pp: int, vpp: int, ep: int, etp: int, cp: int, granularity: Any,
               modules: tuple[str, ...], overlap: bool, backend: str | None, ranks: int | None,
               graph_impl: str, graph_scopes: tuple[str, ...] | None = None,
               shared: bool | None = None) -> tuple[float, ...]:
        dp, layers_rank, dense, experts, weights, unfused_wgrad, step = self._weights_of(tp, pp, cp, ep, etp, vpp)
        tokens, in_flight, acts, logits = self._acts_of(tp, pp, vpp, cp, dp, layers_rank, granularity, modules,
                                                        overlap, shared)
        buffers = self._buffers(ep, etp, backend, ranks)
        graphs = self._graphs(graph_impl, acts, layers_rank, overlap, tokens, graph_scopes)
        allocated, step_extra = _allocated(weights, acts, logits, graphs, unfused_wgrad, step)
        total = allocated + buffers + WORKSPACE_GIB * GIB
        return allocated, total, weights, acts, logits, buffers, graphs, dense, experts, in_flight, step_extra

    def floor_gib(self, tp: int, pp: int, vpp: int, ep: int, etp: int, cp: int) -> float:
        """A layout's least ``total_gib`` at any recompute rung, dispatcher, overlap or graph scope: its weights,
        gradients and optimizer state and the NCCL workspace (activations, buffers and graphs only add)."""
        return (self._weights_of(tp, pp, cp, ep, etp, vpp)[4] + WORKSPACE_GIB * GIB) / GIB

    def knobs(self, tp: int, pp: int, vpp: int, ep: int, etp: int, cp: int, overlap: bool, backend: str | None,
              ranks: int | None, graph_impl: str, graph_scopes: tuple[str, ...] | None = None,
              shared: bool | None = None) -> tuple[Any, ...]:
        """What ``total_gib`` needs of a candidate but its recompute rung: its weights and dispatcher buffers
        are the same at every rung."""
        dp, layers_rank, _, _, weights, unfused_wgrad, step = self._weights_of(tp, pp, cp, ep, etp, vpp)
        return (tp, pp, vpp, cp, dp, layers_rank, weights, unfused_wgrad, self._buffers(ep, etp, backend, ranks),
                overlap, graph_impl, graph_scopes, step, self.shared_overlap if shared is None else bool(shared))

    def total_gib(self, knobs: tuple[Any, ...], granularity: Any, modules: tuple[str, ...]) -> float:
        """``estimate(...)["total_gib"]`` (what a fit test reads) of ``knobs`` at one recompute rung."""
        tp, pp, vpp, cp, dp, layers_rank, weights, unfused_wgrad, buffers, overlap, graph_impl, scopes, step, shared = knobs
        # ``_acts_of``'s cache read inline (``knobs`` resolved ``shared``): the search asks thousands of times
        hit = self._acts.get((tp, pp, vpp, cp, granularity, modules, overlap, shared))
        tokens, _, acts, logits = hit if hit is not None else self._acts_of(
            tp, pp, vpp, cp, dp, layers_rank, granularity, modules, overlap, shared)
        graphs = self._graphs(graph_impl, acts, layers_rank, overlap, tokens, scopes)
        allocated, _ = _allocated(weights, acts, logits, graphs, unfused_wgrad, step)  # as in _parts
        return round((allocated + buffers + WORKSPACE_GIB * GIB) / GIB, 2)

    def estimate(self, tp: int, pp: int, vpp: int, ep: int, etp: int, cp: int, granularity: Any,
                 modules: tuple[str, ...], overlap: bool, backend: str | None, ranks: int | None,
                 graph_impl: str, graph_scopes: tuple[str, ...] | None = None,
                 shared: bool | None = None) -> dict[str, Any]:
        """The estimate of one candidate: ``modules`` only for selective recompute, ``backend`` only for the
        flex dispatcher, ``ranks`` HybridEP's ranks per domain (None: the EP group), ``graph_scopes`` its TE
        graph scopes and ``shared`` its moe_shared_expert_overlap (None: those of the settings this estimator was
        made from)."""
        allocated, total, weights, acts, logits, buffers, graphs, dense, experts, in_flight, step_extra = self._parts(
            tp, pp, vpp, ep, etp, cp, granularity, modules, overlap, backend, ranks, graph_impl, graph_scopes, shared)
        return {
            # Peak of PyTorch's allocator (comparable to torch.cuda.max_memory_allocated).
            "estimate_gib": round(allocated / GIB, 2),
            # What the GPU must hold: plus dispatcher buffers (DeepEP/HybridEP allocate their own) and NCCL.
            "total_gib": round(total / GIB, 2),
            "weights_and_optimizer_gib": round(weights / GIB, 2),
            "activations_gib": round(acts / GIB, 2),
            "logits_gib": round(logits / GIB, 2),
            "dispatcher_buffers_gib": round(buffers / GIB, 2),
            "graph_buffers_gib": round(graphs / GIB, 2),
            # the rest of the allocator's peak: weight-gradient buffers of layers whose wgrad is not fused
            "unfused_wgrad_gib": round((allocated - weights - acts - logits - graphs - step_extra) / GIB, 2),
            # the optimizer step's temporaries beyond what the backward's activations had freed (optimizer_state.py)
            "optimizer_step_gib": round(step_extra / GIB, 2),
            "nccl_context_gib": WORKSPACE_GIB,
            "params_per_gpu_m": round((dense + experts) / 1e6, 1),
            "in_flight_microbatches": round(in_flight, 2),
            # the pipeline stage this estimate is of: the most-loaded one unless ``memory_stage`` named one
            "stage": self.peak_stage.get(self._acts_key(tp, pp, vpp, cp, granularity, modules, overlap, shared), 0),
            # pinned host memory per GPU: the offloaded optimizer share and the offloaded activations (MEM003)
            "host_gib": round(self._host(tp, pp, vpp, ep, etp, cp, granularity, modules, dense, experts, in_flight) / GIB, 2),
        }

    def _host(self, tp: int, pp: int, vpp: int, ep: int, etp: int, cp: int, granularity: Any, modules: tuple[str, ...],
              dense: float, experts: float, in_flight: float) -> float:
        """Host bytes one GPU's process pins: the hybrid CPU optimizer's fp32 copies, moments and gradients of the
        offloaded share (``optimizer_state.host_bytes``) and, with fine-grained activation offload, the offloaded
        inputs of every layer of the micro-batches in flight (full recompute offloads nothing)."""
        dp, layers_rank = self._weights_of(tp, pp, cp, ep, etp, vpp)[:2]  # the weights' own (cached)
        edp = max(1, self.world // (ep * etp * pp))
        opt = host_bytes(self.offload) * (dense / dp + experts / edp) if self.opt != "muon" else 0.0
        acts = 0.0
        if self.act_offload and granularity != "full":
            tokens = self.seq * self.mbs / (tp * cp)
            acts = offloaded_bytes_per_token(self.m, self.force_balance, self.act_offload, modules) * tokens \
                * layers_rank * in_flight
        return opt + acts
