"""Step-time model: how long one training iteration of a candidate plan takes.

A pure function of (model, hardware, candidate, batch shape, constants), built from
first principles and a handful of constants fitted on published measurements
(``data/steptime.yaml`` names each constant and what it was fitted on;
``benchmarks/calibrate.py`` refits them and prints every row predicted vs measured).

Terms, per GPU of the slowest pipeline stage, summed over the step:
  compute      GEMM FLOPs (attention GQA/MLA, dense and expert MLPs, router, logits; backward
               = 2x forward; a hybrid model's Gated DeltaNet cores at their measured time) at an
               achievable share of the GPU's dense peak that falls for small
               GEMMs (TE runs up to 4 small expert GEMMs at once: ``grouped_gemm_concurrency``), plus
               memory-bound elementwise work (norms, activations, permutes) at HBM speed
  recompute    the forward work the recompute plan replays
  a2a          EP dispatch + combine, forward and backward, split into NVLink and network bytes by
               where the EP group sits; flex backends send a token once per rank / node (fewer nodes under
               group-limited routing: ``destination_nodes``), alltoall once per expert; each link at the
               dispatcher's efficiency
  overlap      EP overlap hides part of the all-to-all behind the other micro-batch's compute (only
               with >= 2 micro-batches in flight: PP 1 with >= 2 micro-batches, or PP > 1 with VPP),
               and the communication kernels' SMs slow the compute they overlap
  bubble       (PP - 1) / VPP micro-batch slots of the pipeline fill and drain
  tp/cp/pp/dp  collectives: TP/SP all-gather + reduce-scatter (the backward's pair hidden under its GEMMs when
               the launchers order kernel launch, CUDA_DEVICE_MAX_CONNECTIONS=1), CP ring exchange, PP sends, the DP
               gradient reduce-scatter and parameter all-gather beyond what one micro-batch hides (on
               NVLink when a pipeline stage fits a node: ``_dp_link_gbps``)
  host         CPU time per layer and micro-batch: a fixed part (cut by CUDA graphs over its scopes) and a part
               per local expert (TE grouped-GEMM experts; delayed wgrad adds to it), times the host's speed
               (hardware ``host_factor``: 1 for the DGX-class nodes of the published rows; the project's lent VM
               hosts are ``lent_host_factor`` slower); a micro-batch takes the smooth max of GPU and host time
  optimizer    the Adam step as HBM passes over the parameter state this GPU holds (dense over DP, experts over
               expert-DP): weighs in steps of few micro-batches. Muon (Megatron-Core's LayerWiseDistributedOptimizer,
               Bridge's ``dist_muon``): its HBM passes, the Newton-Schulz GEMMs of the whole matrices this GPU owns, and
               the all-gather of the updated parameters after the step, which nothing overlaps (``muon_seconds``)
  overlap      (above) also: only (mb - 1) / mb of the all-to-all can hide with PP 1, and every MoE layer of every
               micro-batch pays the overlapped schedule's cross-stream waits (``overlap_sync_s``)
Natural routing loads the busiest expert rank above the mean (expert compute and all-to-all);
forced balancing removes that.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field
from typing import Any

from mocompile.catalogue import nvlink_segment
from mocompile.datafiles import load_yaml
from mocompile.memory import _attention_params, _gdn_dims, full_attention_layers, offloaded_bytes_per_token, parameters

DATA = os.path.join(os.path.dirname(__file__), "data", "steptime.yaml")
FP8_PRECISIONS = ("fp8-cs", "fp8-ds", "fp8-blockwise", "mxfp8", "nvfp4")
PER_TENSOR_FP8 = ("fp8-cs", "fp8-ds")   # one scale per tensor: current or delayed scaling
# Communication SMs a dispatcher's kernels occupy while they run (flex: its SM budget; NCCL: its channels).
NCCL_A2A_SMS = 16
# The flex dispatchers: one link efficiency serves them all (``flex_efficiency`` in data/steptime.yaml says why;
# NCCL EP is costed as DeepEP: no published or measured run of it exists for this model to fit).
FLEX_BACKENDS = ("deepep", "hybridep", "ncclep")
COLLECTIVE_EFFICIENCY = 0.75   # NCCL ring all-gather / reduce-scatter bus efficiency on large messages
HBM_EFFICIENCY = 0.7           # share of HBM bandwidth elementwise kernels reach
UNFUSED_SCORE_PASSES = 12      # HBM passes over the attention scores without fused attention (fwd + bwd)
SEQUENTIAL_EXPERT_HOST_S = 5e-5  # CPU time per local expert per layer and micro-batch without grouped GEMM
HOST_P = 4.0                   # smooth max of GPU and host time per micro-batch
GRAPH_CUT = {"none": 0.0, "te_rp": 0.08, "te_arp": 0.6, "full_iteration": 0.95}


@dataclass(frozen=True, order=True)
class Candidate:
    """One point of the plan space: everything the step time depends on beyond the batch."""

    tp: int = 1
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    etp: int = 1
    cp: int = 1
    dispatcher: str = "alltoall"          # alltoall | deepep | hybridep | allgather
    overlap: bool = False
    delay_wgrad: bool = False
    recompute: tuple[Any, ...] = (None, None, None, None)  # granularity, modules, method, num_layers
    graphs: str = "none"                  # none | te_rp | te_arp | full_iteration
    num_sms: int | None = None

    def label(self) -> str:
        rc = self.recompute[0] or "none"
        if rc == "selective":
            rc = "sel:" + ",".join(self.recompute[1] or [])
        parts = [f"TP{self.tp}", f"PP{self.pp}"] + ([f"VPP{self.vpp}"] if self.vpp > 1 else []) + \
            [f"EP{self.ep}"] + ([f"ETP{self.etp}"] if self.etp > 1 else []) + ([f"CP{self.cp}"] if self.cp > 1 else [])
        return (" ".join(parts) + f", {self.dispatcher}, overlap {'on' if self.overlap else 'off'}"
                + (" + dW" if self.delay_wgrad else "") + f", recompute {rc}, graphs {self.graphs}")


@dataclass(frozen=True)
class Batch:
    """The run shape the user fixed (never searched)."""

    seq_length: int
    micro_batch_size: int
    global_batch_size: int
    precision: str = "bf16"
    force_balance: bool = False
    te: bool = True              # Transformer Engine layer spec (fused attention); False: Megatron's local spec
    grouped_gemm: bool = True    # grouped-GEMM experts; False: one GEMM sequence per local expert
    fp8_attention: bool = False  # FP8 dot-product attention (some Blackwell MXFP8 perf recipes; mocompile emits BF16)
    optimizer_offload: float = 0.0  # share of Adam's state and step on the host CPU (optimizer_state.py)
    fsdp: bool = False           # Megatron-FSDP: weights gathered and gradients reduce-scattered every micro-batch
    offload_modules: tuple[str, ...] = ()  # fine-grained activation offload (memory.offloaded_bytes_per_token)
    optimizer: str = "adam"      # adam | muon (Megatron-Core's LayerWiseDistributedOptimizer: ``muon_seconds``)
    shared_expert_overlap: bool | None = None  # a pinned moe_shared_expert_overlap; None: ``shared_expert_overlap``
    manual_gc_interval: int = 0  # Bridge's train.manual_gc_interval with manual_gc on; 0: no scheduled collection
    grad_reduce_fp32: bool = False  # DDP's grad_reduce_in_fp32: gradients reduced in FP32, twice BF16's bytes


@dataclass
class StepEstimate:
    """Predicted iteration time with its named terms (seconds) and throughput figures."""

    step_s: float
    terms: dict[str, float]
    tflops_per_gpu: float
    tokens_per_s_per_gpu: float
    flops_per_step: float
    num_microbatches: int
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"step_time_s": round(self.step_s, 4), "tflops_per_gpu": round(self.tflops_per_gpu, 1),
                "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 1),
                "num_microbatches": self.num_microbatches,
                "terms_s": {k: round(v, 4) for k, v in self.terms.items()}}


COVERED_ATTENTION = ("gqa", "mla", "hybrid")  # attention the model costs (hybrid: Gated DeltaNet, measured)
# attention whose whole-step predictions were checked against published training runs (benchmarks/calibrate.py);
# hybrid's Gated DeltaNet is costed from a one-GPU kernel measurement, and no Qwen3-Next step time is published
VALIDATED_ATTENTION = ("gqa", "mla")
# The dense BF16 peak the Gated DeltaNet constants were measured at (H200: H100's SMs and clocks, 989 TFLOPS);
# another GPU's time scales by its own peak, as the attention core's does
GDN_REFERENCE_PEAK = 989e12
GDN_CHUNK = 64  # flash-linear-attention's chunk size for the gated delta rule (chunk_gated_delta_rule)


def covers(m: dict[str, Any]) -> bool:
    """Does this model cost the architecture well enough to weigh plans against each other (and leave a reference
    that is not itself measured: a recipe moved to another setting, the documented defaults)?"""
    return m.get("attention", "gqa") in COVERED_ATTENTION


def validated(m: dict[str, Any]) -> bool:
    """Were the model's whole-step predictions for this architecture checked against measured training runs, so
    that a predicted gain may leave a shipped recipe, which NVIDIA measured at that very setting?"""
    return m.get("attention", "gqa") in VALIDATED_ATTENTION


@functools.lru_cache(maxsize=1)
def constants() -> dict[str, float]:
    """The fitted constants (values only; provenance stays in the data file)."""
    return {k: float(v["value"]) for k, v in load_yaml(DATA)["constants"].items()}


@functools.lru_cache(maxsize=1)
def facts() -> dict[str, Any]:
    """Published hardware and optimizer facts the model uses as they are (sources in the data file)."""
    return {k: v["value"] for k, v in load_yaml(DATA)["facts"].items()}


def _cc(hw: dict[str, Any]) -> str:
    cc = hw.get("compute_capability") or [9, 0]
    return f"{cc[0]}.{cc[1]}"


def exp_rate(hw: dict[str, Any]) -> float:
    """Softmax exponentials per second (MUFU.EX2 on the special function units)."""
    table = facts()["exp_tera_per_s"]
    return float(table.get(_cc(hw), table["9.0"])) * 1e12


# -- FLOPs --------------------------------------------------------------------------------------

def _attn_dims(m: dict[str, Any]) -> tuple[int, int]:
    """Per-head (QK, V) widths of the attention core."""
    if m.get("attention") == "mla":
        return m.get("qk_head_dim", 128) + m.get("qk_pos_emb_head_dim", 64), m["kv_channels"]
    return m["kv_channels"], m["kv_channels"]


def attended_keys(m: dict[str, Any], seq: int) -> float:
    """Keys a query attends to, averaged over the positions and the layers of one sequence.

    Causal full attention: s/2 on average (Bridge's FLOPs convention). A sliding-window layer (GPT-OSS:
    ``sliding_window`` keys, itself included, on every layer but each ``window_attn_skip_freq``-th one,
    MCore's ``window_size``/``window_attn_skip_freq``) sees min(position + 1, window) keys: about the
    window, independent of the sequence length once it is longer than the window."""
    full = seq / 2.0
    w = m.get("sliding_window")
    if not w or w >= seq:
        return full
    windowed = (w * (w + 1) / 2.0 + (seq - w) * w) / seq
    skip = m.get("window_attn_skip_freq") or 0
    n = m["num_layers"]
    n_full = n // skip if skip else 0          # MCore: layer l (1-based) is full when l % skip == 0
    return (n_full * full + (n - n_full) * windowed) / n


@functools.lru_cache(maxsize=256)
def _per_token(key: tuple[tuple[str, Any], ...], seq: int) -> dict[str, float]:
    m = dict(key)
    h, g = m["hidden_size"], (3 if m.get("gated_linear_unit", True) else 2)
    dqk, dv = _attn_dims(m)
    # QK^T and PV, 2 FLOPs per multiply-add, over the keys each query attends to (a full-attention layer)
    core_full = 2.0 * attended_keys(m, seq) * m["num_attention_heads"] * (dqk + dv)
    full_share = full_attention_layers(m) / m["num_layers"]
    return {
        "attn_proj": 2.0 * _attention_params(m),
        # averaged over the layer mix: a hybrid model's Gated DeltaNet layers have no softmax attention
        "core_attn": core_full * full_share + (1.0 - full_share) * gdn_flops(m),
        "core_full": core_full,
        "full_share": full_share,
        "experts": 2.0 * g * h * m["moe_ffn_hidden_size"] * m["moe_router_topk"],
        "shared": 2.0 * g * h * (m.get("shared_expert_size") or 0),
        "router": 2.0 * h * m["num_moe_experts"],
        "dense_mlp": 2.0 * g * h * m["ffn_hidden_size"],
        "logits": 2.0 * h * m["vocab_size"],
        "mtp_proj": 2.0 * 2 * h * h,
    }


def gdn_flops(m: dict[str, Any]) -> float:
    """Forward FLOPs per token of one Gated DeltaNet core (the chunked gated delta rule, chunk C): per value head
    the state's three dk x dv products (the output's q S, the WY correction's w S, the update's k^T v) and the
    chunk's own matmuls (k k^T, q k^T, the WY factors' A k and A v, A v_new), 2 FLOPs per multiply-add. What the
    step model reports as the layer's FLOPs; its time is measured (``gdn_seconds``), not derived from these."""
    _, v, hv, dk, _ = _gdn_dims(m)
    dv = v / hv
    return hv * (6.0 * dk * dv + GDN_CHUNK * (8.0 * dk + 4.0 * dv))


def gdn_seconds(m: dict[str, Any], c: dict[str, float]) -> float:
    """GPU time per token of one Gated DeltaNet core, forward + backward, at ``GDN_REFERENCE_PEAK``: measured on
    1x H200 (flash-linear-attention's Triton kernels, benchmarks/gpu/gdn_micro.py, fitted by gdn_fit.py); the
    kernels run at ~7 % of the tensor cores' peak, bound by their own latency, so the time is the measurement's
    linear fit in value heads and state size rather than FLOPs at a share of the peak."""
    _, v, hv, dk, _ = _gdn_dims(m)
    dv = v / hv
    return (c["gdn_token_ns"] + hv * (c["gdn_head_ns"] + c["gdn_state_ns"] * dk * dv)) * 1e-9


def _model_key(m: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    keys = ("hidden_size", "gated_linear_unit", "attention", "kv_channels", "num_attention_heads", "num_query_groups",
            "moe_ffn_hidden_size", "moe_router_topk", "shared_expert_size", "num_moe_experts", "ffn_hidden_size",
            "vocab_size", "q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "num_layers",
            "sliding_window", "window_attn_skip_freq", "attention_output_gate", "linear_attention_freq",
            "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
            "linear_conv_kernel_dim")
    return tuple((k, m.get(k)) for k in keys if m.get(k) is not None)


def flops_per_token(m: dict[str, Any], seq: int) -> float:
    """Model FLOPs per token of one training step (forward + backward = 3x forward), as Bridge counts them."""
    return _flops_per_token(m, _per_token(_model_key(m), seq))


def _flops_per_token(m: dict[str, Any], f: dict[str, float]) -> float:
    n_moe, n_dense, mtp = _layers(m)
    moe_layer = f["attn_proj"] + f["core_attn"] + f["experts"] + f["shared"] + f["router"]
    dense_layer = f["attn_proj"] + f["core_attn"] + f["dense_mlp"]
    fwd = n_moe * moe_layer + n_dense * dense_layer + mtp * (moe_layer + f["mtp_proj"]) + f["logits"] * (1 + mtp)
    return 3.0 * fwd


def _layers(m: dict[str, Any]) -> tuple[int, int, int]:
    dense = m.get("first_k_dense") or 0
    return m["num_layers"] - dense, dense, m.get("mtp_num_layers") or 0


# -- the model -----------------------------------------------------------------------------------

def _peak_bf16(hw: dict[str, Any], c: dict[str, float]) -> float:
    """The BF16 dense peak the GEMMs are costed against (FLOP/s)."""
    peak_bf16 = hw["bf16_dense_tflops"] * 1e12
    if hw.get("arch") == "blackwell":
        peak_bf16 *= c["blackwell_efficiency"]
        if _cc(hw) == "10.3":  # Blackwell Ultra (B300/GB300)
            peak_bf16 *= c["blackwell_ultra_gain"]
    # a cluster profile's kernel probe: this cluster's GEMM speed relative to a reference Hopper SXM GPU
    return peak_bf16 * float(hw.get("gemm_scale") or 1.0)


def _gemm_eff(rows: float, c: dict[str, float]) -> float:
    """Achieved share of peak for GEMMs of ``rows`` tokens: saturates for large ones."""
    return c["gemm_efficiency"] * rows / (rows + c["gemm_half_rows"])


# Transformer Engine's grouped GEMM (``GroupedLinear`` -> ``general_grouped_gemm`` -> ``nvte_multi_tensor_gemm``, whose
# cuBLAS path is ``multi_stream_cublas_gemm`` in transformer_engine/common/gemm/cublaslt_gemm.cu) launches the local
# experts' GEMMs round-robin on ``nvte_get_num_compute_streams()`` CUDA streams, a constant 4
# (transformer_engine/common/util/multi_stream.cpp ``get_num_compute_streams``): up to four experts' GEMMs share the
# SMs at once.
TE_GEMM_STREAMS = 4
GEMM_TILE = 128      # output tile edge of the cuBLAS BF16/FP8 GEMM kernels on Hopper/Blackwell (128 x 128 and up)


def grouped_gemm_concurrency(m: dict[str, Any], hw: dict[str, Any], rows: float, ep: int, etp: int,
                             batch: Batch) -> float:
    """How many local experts' GEMMs share the GPU at once: the factor on one expert's ``rows`` that sets how well the
    expert GEMMs fill it (``_gemm_eff`` counts the rows that run together).

    TE's grouped-GEMM experts launch their GEMMs round-robin on ``TE_GEMM_STREAMS`` (4) streams, so while one expert's
    GEMM has fewer output tiles than the GPU has SMs, the next experts' GEMMs fill the idle SMs: up to 4, no more
    than the local experts, and no more than it takes to cover the SMs (a GEMM that already covers them runs alone,
    the next one queued behind it). The tiles are ``GEMM_TILE`` square over the expert's rows and the narrower of
    its two output widths (fc1: 2 x moe_ffn / ETP gated, fc2: hidden). Qwen3-30B with EP4 (32 experts of 512 rows,
    48 tiles on 132 SMs) runs ~2.75 at once; GPT-OSS-120B's wide experts (1024 rows x 2880: 180 tiles) run one at a
    time. Without grouped GEMM (Megatron's SequentialMLP, the local spec) the experts run one after another: 1."""
    if not (batch.te and batch.grouped_gemm):
        return 1.0
    g = 2 if m.get("gated_linear_unit", True) else 1
    width = min(g * m["moe_ffn_hidden_size"] / etp, m["hidden_size"])
    tiles = max(1.0, rows / GEMM_TILE) * max(1.0, width / GEMM_TILE)
    fill = float(hw.get("sm_count", 132)) / tiles
    return float(max(1.0, min(TE_GEMM_STREAMS, m["num_moe_experts"] / ep, fill)))


def _distinct(picks: float, bins: float) -> float:
    """Expected number of distinct bins hit by ``picks`` uniform picks."""
    if bins <= 1:
        return min(1.0, picks)
    return bins * (1.0 - (1.0 - 1.0 / bins) ** picks)


def destination_nodes(m: dict[str, Any], nodes: float) -> float:
    """Expected number of the EP group's ``nodes`` a token's ``moe_router_topk`` experts lie on.

    Without group-limited routing the experts are ``topk`` uniform picks over the nodes (``_distinct``). With it
    (Megatron-Core's ``moe_router_num_groups`` / ``moe_router_group_topk``, ``topk_routing_with_score_function`` ->
    ``group_limited_topk``; DeepSeek-V3: 8 groups, top 4) the router first keeps ``group_topk`` of the
    ``num_groups`` contiguous blocks of experts and picks the experts inside them only. Megatron places experts on
    EP ranks in order, so where a node holds whole groups, a token's experts lie on the nodes of its kept groups
    that got a pick: for each node, the number ``j`` of kept groups it holds is hypergeometric and it is missed when
    all ``topk`` picks land in the other ``group_topk - j`` kept groups. Where a group spans whole nodes, the picks
    spread over the kept groups' nodes only. Any other split gets no credit (``_distinct``). Picks are uniform over
    the kept groups here; the real router (random scores, DeepSeek-V3 at one group per node) reaches 3.95 nodes
    against this 3.60, since it keeps the groups whose top experts score highest (tests/stack/test_group_routing.py)."""
    k = float(m["moe_router_topk"])
    limit = _group_limit(m, nodes)
    if limit is None:
        return _distinct(k, nodes)
    groups, kept, n = limit
    if groups % n == 0:
        per_node = groups // n
        missed = sum(math.comb(per_node, j) * math.comb(groups - per_node, kept - j) / math.comb(groups, kept)
                     * ((kept - j) / kept) ** k for j in range(0, min(per_node, kept) + 1))
        return n * (1.0 - missed)
    return _distinct(k, kept * n // groups)


def _group_limit(m: dict[str, Any], nodes: float) -> tuple[int, int, int] | None:
    """(groups, kept groups, nodes) where group-limited routing narrows a token's destination nodes: a router with
    groups that keeps some of them, over a whole number of nodes that either divides the groups or is divided by
    them (``destination_nodes``); None where the token's picks are free over the nodes."""
    groups, kept = int(m.get("moe_router_num_groups") or 1), int(m.get("moe_router_group_topk") or 0)
    n = int(round(nodes))
    if groups <= 1 or not 0 < kept < groups or n <= 1 or n != nodes or (groups % n and n % groups):
        return None
    return groups, kept, n


def nvlink_width(hw: dict[str, Any], world: int | None = None) -> int:
    """How many consecutive ranks share NVLink: a node, or on multi-node NVLink the job's segment of a rack
    (``catalogue.nvlink_segment``: resolved hardware carries it; a bare catalogue entry gets the segment its job
    size, ``world`` or its ``world_size``, would be given; with neither, the whole rack)."""
    gpn = int(hw["gpus_per_node"])
    if not hw.get("mnnvl"):
        return gpn
    if hw.get("segment_nodes"):
        return int(hw["nvlink_domain"])
    world = world or hw.get("world_size")
    if not world:
        return int(hw["nvlink_domain"])
    return nvlink_segment(max(1, int(world) // gpn), gpn, int(hw["nvlink_domain"])) * gpn


def a2a_seconds(m: dict[str, Any], hw: dict[str, Any], cand: Candidate, tokens: float, c: dict[str, float],
                imbalance: float) -> float:
    """One dispatch (or combine) of ``tokens`` local tokens, on the busiest rank."""
    group = cand.ep * cand.etp
    if group <= 1:
        return 0.0
    k = m["moe_router_topk"]
    width = nvlink_width(hw)
    # Megatron ranks experts with their own generator (etp-ep-edp-pp): an EP group is ETP*EP consecutive ranks,
    # starting at a multiple of its size, so it fills a node (or an NVLink segment of an NVL72 rack) before it
    # crosses the network. Where neither size divides the other, some groups straddle a domain boundary: their
    # smallest share on one side is gcd(group, width) ranks, which the busiest rank of the slowest group sees.
    local = max(1, math.gcd(group, width) // cand.etp)
    nodes = group / local
    token_bytes = m["hidden_size"] * 2.0
    if cand.dispatcher in FLEX_BACKENDS:
        eff_nvl = eff_net = c["flex_efficiency"]
        # once per destination node over the network, then once per destination rank inside a node
        # (fewer nodes under group-limited routing: ``destination_nodes``)
        reached = destination_nodes(m, nodes)
        spread = reached if _group_limit(m, nodes) else nodes  # the nodes a token's picks share
        net_copies = reached * (nodes - 1) / nodes if nodes > 1 else 0.0
        nvl_copies = _distinct(k / spread, local) * (local - 1) / local * spread if local > 1 else 0.0
        latency = c["flex_latency_s"]
    else:
        eff_nvl = eff_net = c["nccl_a2a_efficiency"]
        nvl_copies = k * (local - 1) / group
        net_copies = k * (group - local) / group
        latency = c["nccl_latency_s"]
        if hw.get("a2a_scale"):  # a cluster profile's kernel probe measured NCCL all-to-all inside its nodes
            eff_nvl *= float(hw["a2a_scale"])
            latency = float(hw.get("a2a_latency_s", latency))
        if cand.dispatcher == "allgather":  # every rank receives every token of the EP group
            nvl_copies, net_copies = float(local - 1), float(group - local)
    nvl = tokens * nvl_copies * token_bytes * imbalance / (hw["nvlink_gbps"] * 1e9 * eff_nvl)
    net = tokens * net_copies * token_bytes * imbalance / (hw["nic_gbps"] * 1e9 * eff_net)
    return max(nvl, net) + latency


def _recompute_share(cand: Candidate, f: dict[str, float], m: dict[str, Any]) -> dict[str, float]:
    """Which forward work the recompute plan replays, as multipliers per work kind."""
    gran, mods = cand.recompute[0], set(cand.recompute[1] or [])
    out = {"attn_gemm": 0.0, "core": 0.0, "experts": 0.0, "dense": 0.0, "elementwise": 0.0, "a2a": 0.0}
    if gran == "full":
        return {k: 1.0 for k in out}
    if gran != "selective":
        return out
    if "core_attn" in mods:
        out["core"] = 1.0
    if "mla_up_proj" in mods and m.get("attention") == "mla":
        out["attn_gemm"] = 0.6  # the q/kv up projections are most of MLA's projection FLOPs
    if "mlp" in mods:
        out["dense"] = 1.0
    if "shared_experts" in mods:
        out["experts"] += f["shared"] / max(1.0, f["experts"] + f["shared"])
    if "moe" in mods:
        out["experts"] = 1.0
        out["a2a"] = 1.0
        out["elementwise"] += 0.5
    if "moe_act" in mods:
        out["elementwise"] += 0.15
    if "layernorm" in mods:
        out["elementwise"] += 0.1
    return out


def estimate(m: dict[str, Any], hw: dict[str, Any], cand: Candidate, batch: Batch,
             world: int, c: dict[str, float] | None = None) -> StepEstimate:
    """Predicted time of one iteration for ``cand`` on ``world`` GPUs."""
    return StepModel(m, hw, batch, world, c).estimate(cand)


class StepModel:
    """``estimate`` for one model, hardware, batch shape, GPU count and set of constants.

    The planner scores hundreds of candidates of one intent: what depends on none of a candidate's knobs
    (FLOPs per token, peak, parameter counts) is computed once, and each term that depends on only a few
    knobs once per their values (the compute times per TP/CP/EP, the all-to-all per EP group and
    dispatcher, the optimizer step and the DP traffic per layout, host time per graphs/wgrad/EP, the
    recompute shares per rung). It is ``estimate``'s own arithmetic in its own order (``estimate`` runs
    through it), so the figures are the same to the bit."""

    def __init__(self, m: dict[str, Any], hw: dict[str, Any], batch: Batch, world: int,
                 c: dict[str, float] | None = None):
        c = constants() if c is None else c
        self.m, self.hw, self.batch, self.world, self.c = m, hw, batch, world, c
        s = batch.seq_length
        self.f = f = _per_token(_model_key(m), s)
        self.n_moe, self.n_dense, self.mtp = _layers(m)
        self.fp8 = batch.precision in FP8_PRECISIONS
        peak_bf16 = _peak_bf16(hw, c)
        self.peak_bf16 = peak_bf16                      # the attention core's, unless FP8 attention is on
        # blockwise FP8's GEMMs apply per-block scales: measured slower than per-tensor (fp8_block_gemm_extra)
        self.peak = peak_bf16 / (1.0 / c["fp8_gain"] + c["fp8_block_gemm_extra"]) \
            if batch.precision == "fp8-blockwise" else peak_bf16 * (c["fp8_gain"] if self.fp8 else 1.0)
        self.imbalance = 1.0 if batch.force_balance else c["natural_imbalance"]
        self.flops = _flops_per_token(m, f) * batch.global_batch_size * s
        self.gc_pause = manual_gc_seconds(batch.manual_gc_interval)  # the same for every candidate
        self._compute: dict[tuple[int, int, int, int], tuple[float, ...]] = {}
        self._a2a: dict[tuple[Any, ...], float] = {}
        self._rc: dict[tuple[Any, ...], dict[str, float]] = {}
        self._host: dict[tuple[Any, ...], tuple[float, float]] = {}
        self._per_layout: dict[tuple[int, ...], tuple[float, float, float]] = {}

    def _compute_terms(self, tp: int, cp: int, ep: int, etp: int = 1) -> tuple[float, ...]:
        """Per-layer forward times of one micro-batch and the TP/CP collectives: they depend on TP, CP, EP, ETP."""
        key = (tp, cp, ep, etp)
        hit = self._compute.get(key)
        if hit is not None:
            return hit
        m, hw, batch, c, f, peak, imbalance = self.m, self.hw, self.batch, self.c, self.f, self.peak, self.imbalance
        s, b = batch.seq_length, batch.micro_batch_size
        tokens = s * b / cp                           # tokens of one micro-batch on this CP rank
        per_rank = tokens / tp                        # after the SP split: what the GPU computes / dispatches
        e_dense = _gemm_eff(tokens, c)
        rows_expert = per_rank * m["moe_router_topk"] * ep / m["num_moe_experts"]
        e_expert = _gemm_eff(rows_expert * grouped_gemm_concurrency(m, hw, rows_expert, ep, etp, batch), c)
        t_attn_gemm = per_rank * f["attn_proj"] / (peak * e_dense)
        # The attention core (measured on H100 with TE's fused attention, data/steptime.yaml): matmuls at a share
        # of the BF16 peak (FP8 recipes keep attention in BF16 unless they turn on FP8 attention), and the softmax
        # between them: one exponential per score forward and one when the backward recomputes the probabilities, on
        # the special function units the tensor cores wait for (Blackwell Ultra doubles their rate), plus max and sum. Counted per
        # forward pass like the GEMMs (x3 below). Per query the fused kernel also does work that does not depend
        # on the keys (``attention_key_overhead``, in keys), and learnable softmax sinks add their own pass.
        keys = attended_keys(m, s)
        work = keys
        if batch.te:
            work += c["attention_key_overhead"] + (c["attention_sink_keys"] if m.get("softmax_sinks") else 0.0)
        attn_peak = self.peak if batch.fp8_attention else self.peak_bf16  # the same in a BF16 run
        # averaged over the layers like the other per-layer terms: a hybrid model's softmax attention is on a share
        # of them (``full_share``), its Gated DeltaNet cores on the rest (measured GPU time, fwd + bwd = 3 passes)
        full = f["full_share"]
        t_core = per_rank * full * f["core_full"] * (work / keys) / (attn_peak * c["attention_peak_share"])
        t_core += full * per_rank * work * m["num_attention_heads"] * 2.0 / 3.0 * c["attention_exp_factor"] / exp_rate(hw)
        if not batch.te:
            # unfused attention computes the whole s x s score matrix (no causal skipping) and moves it through
            # HBM: scores, softmax, dropout-free probabilities and their gradients, ~12 passes of 2 bytes
            scores = full * b * (m["num_attention_heads"] / tp) * (s / cp) * s
            t_core = 2 * t_core + UNFUSED_SCORE_PASSES * 2.0 * scores / (hw["hbm_tbps"] * 1e12 * HBM_EFFICIENCY) / 3
        if full < 1.0:
            t_core += per_rank * (1.0 - full) * gdn_seconds(m, c) * GDN_REFERENCE_PEAK / self.peak_bf16 / 3.0
        t_experts = per_rank * (f["experts"] * imbalance) / (peak * e_expert)
        if m.get("add_bias_linear"):  # biased grouped GEMMs (GPT-OSS): measured slower, data/steptime.yaml
            t_experts *= c["expert_bias_factor"]
        t_shared = per_rank * (f["shared"] + f["router"]) / (peak * e_dense)
        t_dense = per_rank * f["dense_mlp"] / (peak * e_dense)
        h, k = m["hidden_size"], m["moe_router_topk"]
        elem_bytes = 2.0 * per_rank * (24 * h + k * imbalance * (6 * h + 6 * m["moe_ffn_hidden_size"]))
        if self.fp8:
            # FP8 recipes quantise every GEMM operand they produce (amax, cast, transposed copy): activations
            # into the GEMMs forward, output gradients backward. It is memory-bound work per element, so it
            # weighs most in narrow models, whose GEMMs do the fewest FLOPs per element.
            _, dv = _attn_dims(m)
            f_e = m["moe_ffn_hidden_size"]
            fwd_in = h + m["num_attention_heads"] * dv + k * imbalance * (h + f_e)    # QKV, proj, fc1, fc2 inputs
            bwd_in = _attention_params(m) / h + k * imbalance * (2 * f_e + h)         # their outputs' gradients
            # Hopper's FP8 recipes (per-tensor current or delayed scaling, blockwise scaling) at the cost measured on
            # H100 for per-tensor scaling (blockwise pays its extra in its GEMMs: fp8_block_gemm_extra); Blackwell's
            # block-scaled MXFP8 and NVFP4 casts are fused: fitted (fp8_quant_bytes)
            hopper = batch.precision in PER_TENSOR_FP8 or batch.precision == "fp8-blockwise"
            quant = "fp8_tensor_quant_bytes" if hopper else "fp8_quant_bytes"
            elem_bytes += per_rank * (fwd_in + bwd_in) * c[quant]
        t_elem = elem_bytes / (hw["hbm_tbps"] * 1e12 * HBM_EFFICIENCY)
        if not batch.te:  # the local spec runs norms, RoPE, SwiGLU, permutation and loss as many unfused kernels
            t_elem *= c["local_spec_factor"]
        t_logits = per_rank * f["logits"] / (peak * e_dense)
        moe_fwd = t_attn_gemm + t_core + t_experts + t_shared + t_elem
        dense_fwd = t_attn_gemm + t_core + t_dense + 0.5 * t_elem

        # TP/SP: all-gather + reduce-scatter around attention (and dense MLPs), forward and backward.
        tp_layer = 0.0
        if tp > 1:
            msg = tokens * h * 2.0 * (tp - 1) / tp
            tp_layer = 4.0 * msg / (hw["nvlink_gbps"] * 1e9 * COLLECTIVE_EFFICIENCY)
        cp_layer = 0.0
        if cp > 1:
            kv = tokens * 2 * m["num_query_groups"] * m["kv_channels"] * 2.0 * (cp - 1)
            link = hw["nvlink_gbps"] if tp * cp <= hw["gpus_per_node"] else hw["nic_gbps"]
            cp_layer = max(0.0, 3.0 * kv / (link * 1e9 * COLLECTIVE_EFFICIENCY) - 3.0 * t_core)
        hit = self._compute[key] = (per_rank, t_attn_gemm, t_core, t_experts, t_shared, t_dense, t_elem, t_logits,
                                    moe_fwd, dense_fwd, tp_layer, cp_layer)
        return hit

    def _ordered_launch(self, cand: Candidate) -> bool:
        """Do the launchers export CUDA_DEVICE_MAX_CONNECTIONS=1 for this plan (``device_max_connections``)?"""
        return device_max_connections(cand.dispatcher in FLEX_BACKENDS, self.hw.get("arch") == "blackwell",
                                      self.batch.fsdp, cand.tp > 1 or cand.cp > 1, cand.overlap)[0] == "1"

    def estimate(self, cand: Candidate) -> StepEstimate:
        """Predicted time of one iteration for ``cand``."""
        m, hw, batch, world, c = self.m, self.hw, self.batch, self.world, self.c
        s, b = batch.seq_length, batch.micro_batch_size
        dp = max(1, world // (cand.tp * cand.pp * cand.cp))
        mb = max(1, batch.global_batch_size // max(1, b * dp))
        n_moe, n_dense, mtp = self.n_moe, self.n_dense, self.mtp
        (per_rank, t_attn_gemm, t_core, t_experts, t_shared, t_dense, t_elem, t_logits, moe_fwd, dense_fwd,
         tp_layer, cp_layer) = self._compute_terms(cand.tp, cand.cp, cand.ep, cand.etp)
        h = m["hidden_size"]

        rc = self._rc.get(cand.recompute)
        if rc is None:
            rc = self._rc[cand.recompute] = _recompute_share(cand, self.f, m)
        moe_rc = (rc["attn_gemm"] * t_attn_gemm + rc["core"] * t_core + rc["experts"] * t_experts
                  + rc["elementwise"] * t_elem + (rc["dense"] if cand.recompute[0] == "full" else 0.0) * t_shared)
        dense_rc = rc["attn_gemm"] * t_attn_gemm + rc["core"] * t_core + rc["dense"] * t_dense \
            + rc["elementwise"] * 0.5 * t_elem

        a2a_key = (cand.ep, cand.etp, cand.dispatcher, cand.tp, cand.cp)
        a2a_one = self._a2a.get(a2a_key)
        if a2a_one is None:
            a2a_one = self._a2a[a2a_key] = a2a_seconds(m, hw, cand, per_rank, c, self.imbalance)
        a2a_layer = 4.0 * a2a_one * (1.0 + rc["a2a"] / 2)  # dispatch + combine, forward + backward (+ replay)

        host_key = (cand.graphs, cand.delay_wgrad, cand.ep, cand.etp)
        host = self._host.get(host_key)
        if host is None:
            host_layer, host_dense = host_seconds_per_layer(m, cand, batch, c)
            # The host's single-thread speed: 1 for the DGX-class nodes of the published rows; the project's lent
            # VM hosts run the same Python several times slower (``host_factor`` in the hardware description).
            host_scale = float(hw.get("host_factor", 1.0))
            host = self._host[host_key] = (host_layer * host_scale, host_dense * host_scale)
        host_layer, host_dense = host

        # Sequence parallelism's backward all-gather and reduce-scatter run asynchronously beside the dgrad and wgrad
        # GEMMs (Transformer Engine's Linear backward, Megatron-Core's LinearWithGradAccumulationAndAsyncCommunication)
        # and reliably overlap them only when kernels launch in order (CUDA_DEVICE_MAX_CONNECTIONS=1, the launchers'
        # choice for TP/CP > 1 without EP overlap, a flex dispatcher, Blackwell or FSDP: ``device_max_connections``):
        # then half of the TP traffic, the backward's, is hidden.
        if tp_layer and self._ordered_launch(cand):
            tp_layer *= 0.5
        moe_c, moe_a, moe_o = 3.0 * moe_fwd + moe_rc, a2a_layer, tp_layer + cp_layer
        den_c, den_o = 3.0 * dense_fwd + dense_rc, tp_layer + cp_layer
        n_moe_all = n_moe + mtp
        total_c = n_moe_all * moe_c + n_dense * den_c + 3.0 * t_logits * (1 + mtp)
        total_a = n_moe_all * moe_a
        total_o = n_moe_all * moe_o + n_dense * den_o
        # Share of the model on the slowest pipeline rank: balanced layouts count embedding and loss as a
        # layer each (Bridge's account flags).
        units = m["num_layers"] + mtp + 2
        share = 1.0 if cand.pp == 1 else math.ceil(units / (cand.pp * cand.vpp)) * cand.vpp / units
        comp, a2a, other = total_c * share, total_a * share, total_o * share

        # ncclep without moe_ncclep_static_shape (never set by mocompile) syncs device to host in every MoE layer,
        # which serialises the overlapped schedule (megatron-core transformer_config.py warns so): nothing is hidden.
        overlap_ok = cand.overlap and cand.dispatcher != "ncclep" \
            and ((cand.pp == 1 and mb >= 2) or (cand.pp > 1 and cand.vpp > 1))
        hidden, slowdown = 0.0, 0.0
        if overlap_ok and a2a > 0:
            hide = c["overlap_hide"] + (c["delay_wgrad_hide"] if cand.delay_wgrad else 0.0)
            # Combined 1F1B pairs one micro-batch's forward with another's backward: the first forward and the
            # last backward have no partner, so with PP 1 only (mb - 1) / mb of the all-to-all can be hidden
            # (a half with 2 micro-batches; all of it in the limit of many).
            pairs = (mb - 1) / mb if cand.pp == 1 else 1.0
            hidden = min(a2a, comp) * min(1.0, hide) * pairs
            sms = cand.num_sms or (20 if cand.dispatcher == "deepep" else 32 if cand.dispatcher == "hybridep"
                                   else NCCL_A2A_SMS)
            frac = min(0.5, sms / hw.get("sm_count", 132))
            slowdown = hidden * frac / (1.0 - frac)
            # The overlapped schedule splits every MoE layer into sub-steps (attention, dispatch, experts, combine)
            # that wait on each other across the compute and communication streams: each wait leaves the GPU a
            # launch-and-handshake gap, per layer and micro-batch, whether or not there is much to hide.
            slowdown += c["overlap_sync_s"] * n_moe_all * share
        elif cand.overlap and cand.dispatcher == "ncclep":
            slowdown = c["overlap_sync_s"] * n_moe_all * share  # the split schedule's waits, with nothing hidden
        # Shared-expert overlap (Megatron-Core's moe_shared_expert_overlap, SharedExpertMLP on its own stream): the
        # shared expert's fc1 runs while the dispatch all-to-all is in flight and its fc2 during the combine, forward
        # and backward, so up to its own compute of the all-to-all is hidden, as far as overlapped streams hide it.
        shared_hidden = 0.0
        if a2a > 0 and t_shared > 0 and shared_expert_overlap(m, cand.dispatcher, cand.overlap, batch.shared_expert_overlap):
            shared_hidden = min(a2a - hidden, 3.0 * t_shared * n_moe_all * share) * min(1.0, c["overlap_hide"])
        offload_mb = 0.0
        if batch.offload_modules and cand.recompute[0] != "full":
            # Fine-grained activation offload copies the offloaded inputs to the host during the forward and back
            # during the backward, on their own streams: what the micro-batch's compute does not cover is exposed.
            moved = 2.0 * per_rank * share * (n_moe_all + n_dense) * offloaded_bytes_per_token(
                m, batch.force_balance, batch.offload_modules, cand.recompute[1] or ())
            offload_mb = max(0.0, moved / (float(hw.get("host_link_gbps", 64)) * 1e9) - comp)
        gpu_mb = comp + a2a - hidden - shared_hidden + slowdown + other + offload_mb
        # The CPU launches every kernel; dropless MoE syncs with the GPU each layer, so a micro-batch takes
        # as long as the slower of the two. The overlapped schedule launches more (two micro-batches,
        # explicit stream waits); CUDA graphs cut launches.
        # (a cluster profile's measured ``overlap_host_factor`` replaces the calibrated one: mocompile.overlap_fit)
        host_mb = (n_moe_all * host_layer + n_dense * host_dense) * share \
            * ((hw.get("overlap_host_factor") or c["overlap_host_factor"]) if overlap_ok else 1.0)
        per_mb = (gpu_mb ** HOST_P + host_mb ** HOST_P) ** (1.0 / HOST_P)
        steady = mb * per_mb
        bubble = (cand.pp - 1) / cand.vpp * per_mb if cand.pp > 1 else 0.0
        pp_comm = 0.0
        if cand.pp > 1:
            msg = per_rank * h * 2.0
            link = hw["nic_gbps"] if world > hw["gpus_per_node"] else hw["nvlink_gbps"]
            exposed = 0.25 if cand.vpp > 1 else 1.0
            pp_comm = 2.0 * mb * cand.vpp * msg / (link * 1e9) * exposed

        lay_key = (cand.tp, cand.pp, cand.cp, cand.ep, cand.etp)
        per_layout = self._per_layout.get(lay_key)
        if per_layout is None:
            if batch.optimizer == "muon":
                muon_step, gather = muon_seconds(m, hw, cand, world, c)
                per_layout = (_dp_traffic(m, hw, cand, world, dp, batch), muon_step, gather)
            else:
                per_layout = (_dp_traffic(m, hw, cand, world, dp, batch),
                              optimizer_seconds(m, hw, cand, world, batch.optimizer_offload, c), 0.0)
            self._per_layout[lay_key] = per_layout
        dp_traffic, opt, param_gather = per_layout
        if self.batch.fsdp:
            # Megatron-FSDP gathers every layer's weights for its forward and again for its backward and
            # reduce-scatters its gradients, in every micro-batch: 3 passes of the DP traffic's 2 per step. The next
            # layer's gather runs under the current layer's compute, so only what a micro-batch's GPU time cannot
            # cover is exposed, in each micro-batch.
            dp_comm = mb * max(0.0, 1.5 * dp_traffic - gpu_mb)
        else:
            # Muon (no distributed optimizer): the DDP gradient all-reduce moves the bytes of the reduce-scatter plus
            # all-gather counted here and overlaps the backward the same way; the layer-wise optimizer's all-gather
            # of the updated parameters runs after its step, exposed (``param_gather``, ``muon_seconds``)
            dp_comm = _dp_exposed(dp_traffic, per_mb)
        step = steady + bubble + pp_comm + dp_comm + opt + param_gather + c["step_overhead_s"] + self.gc_pause
        flops = self.flops
        recompute = mb * share * (n_moe_all * moe_rc + n_dense * dense_rc)
        terms = {"compute": mb * comp - recompute, "a2a_total": mb * a2a,
                 "a2a_exposed": mb * (a2a - hidden - shared_hidden), "overlap_slowdown": mb * slowdown, "bubble": bubble,
                 "tp_cp": mb * other, "host_bound": mb * (per_mb - gpu_mb), "pp_p2p": pp_comm, "dp_exposed": dp_comm,
                 "optimizer": opt, "act_offload": mb * offload_mb,
                 "recompute": recompute, "manual_gc": self.gc_pause}
        if batch.optimizer == "muon":
            terms["param_gather"] = param_gather
        notes = []
        if cand.overlap and not overlap_ok:
            notes.append("EP overlap has nothing to overlap (one micro-batch in flight)")
        return StepEstimate(step, terms, flops / (world * step) / 1e12, batch.global_batch_size * s / (world * step),
                            flops, mb, notes)


def manual_gc_seconds(interval: int) -> float:
    """Per-step share of Bridge's scheduled full collection (``maybe_run_manual_gc``: ``gc.collect()`` every
    ``manual_gc_interval`` iterations, inside the interval timer that Bridge's step time divides).

    One full collection walks every tracked Python object of the training process (about a million in a Bridge
    run); its time is measured, not fitted (``manual_gc_collect_s``). It is pure CPU work with no CUDA call, so
    the host's launch factor does not scale it. Interval 0 (manual GC off, or on with no schedule) adds nothing:
    Python's own collector then runs young generations, whose cost ``step_overhead_s`` holds."""
    if interval <= 0:
        return 0.0
    return float(facts()["manual_gc_collect_s"]) / interval


def shared_expert_overlap(m: dict[str, Any], dispatcher: str, overlap: bool, pinned: bool | None = None) -> bool:
    """Does the shared expert overlap the all-to-all in this plan? Megatron-Core allows it only with the alltoall
    dispatcher and without EP overlap (Bridge's flex setup clears it, ``apply_flex_dispatcher_backend``); a pin
    decides, else the model's provider default (``shared_expert_overlap_default``: on for DeepSeek-V3, Kimi-K2).
    The planner's setting (``search._shared_expert_overlap``) is this, with a pin reported as pinned even where the
    rules refuse it."""
    if not m.get("shared_expert_size") or dispatcher != "alltoall" or overlap:
        return False
    if pinned is not None:
        return pinned
    return bool(m.get("shared_expert_overlap_default"))


def device_max_connections(flex: bool, blackwell: bool, fsdp: bool, tp_cp: bool, overlap: bool) -> tuple[str, str]:
    """CUDA_DEVICE_MAX_CONNECTIONS for a plan, with the reason: what every launcher exports (resolve/derived.py)
    and what the step model reads (1 orders kernel launch, so sequence parallelism's backward collectives overlap
    their GEMMs)."""
    if flex or blackwell:
        return "32", "flex dispatcher or Blackwell: more hardware queues for the communication streams"
    if fsdp:
        return "32", ("Megatron-FSDP needs more than 1 (Bridge's ConfigContainer "
                      "_validate_and_apply_megatron_fsdp_configs): its gathers run on their own streams")
    if tp_cp and not overlap:
        return "1", "TP/CP > 1 without EP overlap: Megatron wants ordered kernel launch before Blackwell"
    return ("32", "EP overlap needs concurrent streams (> 1)") if overlap else ("8", "default concurrency")


def local_experts(m: dict[str, Any], cand: Candidate) -> float:
    """Experts whose weights one GPU holds (ETP splits each expert's matrices, not the count)."""
    return m["num_moe_experts"] / cand.ep


def host_seconds_per_layer(m: dict[str, Any], cand: Candidate, batch: Batch, c: dict[str, float]) -> tuple[float, float]:
    """CPU time to run one MoE layer (and one dense layer) of one micro-batch, forward + backward.

    A fixed part per layer (Python module calls and kernel launches of attention, router, permutation;
    CUDA graphs over those scopes cut it) and a part per local expert: TE's GroupedLinear handles every
    local expert's weight on the host (its GEMM launches forward, dgrad and wgrad, the weight-gradient
    accumulation and DDP's per-parameter gradient hook), which the attention/router graph scopes do not
    capture; only a full-iteration graph replays them. Delayed wgrad runs the expert weight gradients as
    a separate, later pass over the same experts (``delay_wgrad_host``, fitted)."""
    cut = GRAPH_CUT.get(cand.graphs, 0.0)
    experts = local_experts(m, cand)
    per_expert = c["host_s_per_expert"] * (1.0 + (c["delay_wgrad_host"] if cand.delay_wgrad else 0.0))
    moe = c["host_s_per_layer"] * (1.0 - cut) + per_expert * experts * (1.0 - (cut if cand.graphs == "full_iteration" else 0.0))
    dense = c["host_s_per_layer"] * (1.0 - cut)
    if not batch.grouped_gemm:  # SequentialMLP: the CPU launches each local expert's GEMMs one by one
        moe += SEQUENTIAL_EXPERT_HOST_S * m["num_moe_experts"] / (cand.ep * cand.etp)
    if not batch.te:
        moe, dense = moe * c["local_spec_factor"], dense * c["local_spec_factor"]
    return moe, dense


# HBM bytes per local parameter of one distributed-optimizer step with Adam (bf16 weights and gradient
# buffer, fp32 main weights and moments): gradient copy to fp32 (2 + 4), norm for clipping (4), scale (8),
# Adam (read gradient, weight, both moments: 16; write weight and moments: 12), bf16 weight copy back
# (4 + 2), gradient-buffer zeroing (2).
ADAM_STEP_BYTES = 54.0
OFFLOAD_LINK_BYTES = 8.0  # per offloaded parameter and step: fp32 gradient to the host, fp32 parameter back


def optimizer_seconds(m: dict[str, Any], hw: dict[str, Any], cand: Candidate, world: int, offload: float = 0.0,
                      c: dict[str, float] | None = None) -> float:
    """The optimizer step: memory-bound passes over the parameters whose state this GPU holds.

    Dense parameters' state is sharded over DP, expert parameters' over expert-DP; with EDP 1 (EP = world)
    every GPU steps its experts' full fp32 state, which weighs in small-batch steps (few micro-batches).
    With an offloaded share (``optimizer_offload``, Megatron-Core's HybridDeviceOptimizer) that share's fp32
    gradients go to the host and its fp32 parameters come back over the host link (PCIe on x86 nodes, C2C on
    Grace ones: ``host_link_gbps``), and the CPU runs its Adam step (``cpu_adam_params_per_s``): one after the
    other, as Megatron runs them without ``overlap_cpu_optimizer_d2h_h2d``."""
    p = parameters(m)
    dense = (p["attention"] + p["dense_mlp"] + p["shared"] + p["router"] + p["embedding"]) / (cand.tp * cand.pp)
    experts = p["experts"] / (cand.ep * cand.etp * cand.pp)
    dp = max(1, world // (cand.tp * cand.pp * cand.cp))
    edp = max(1, world // (cand.ep * cand.etp * cand.pp))
    shard = dense / dp + experts / edp
    f = min(1.0, max(0.0, offload))
    gpu = shard * (1.0 - f) * ADAM_STEP_BYTES / (hw["hbm_tbps"] * 1e12 * HBM_EFFICIENCY)
    if f <= 0.0:
        return gpu
    c = constants() if c is None else c
    host = shard * f * (OFFLOAD_LINK_BYTES / (float(hw.get("host_link_gbps", 64)) * 1e9)
                        + 1.0 / c["cpu_adam_params_per_s"])
    return gpu + host


# Muon, as Bridge's Kimi-K2 recipes build it (``recipes/kimi/h100/kimi_k2.py _apply_kimi_k2_optimizer("muon")``:
# ``distributed_muon_with_cosine_annealing`` = optimizer ``dist_muon``, ``ddp.use_distributed_optimizer`` and
# ``overlap_param_gather`` False). Megatron-Core 0.19 (``optimizer/__init__.py _get_megatron_emerging_optimizer``)
# wraps it in ``LayerWiseDistributedOptimizer`` on its legacy path (no ``full_param_layout`` without the distributed
# optimizer): DDP all-reduces every gradient, each DP rank (expert-DP for expert weights) steps the whole matrices
# it owns (``_shard_params_ping_pong``: sorted by size, dealt out in a ping-pong loop), then ``allgather_params``
# all-gathers the updated bf16 weights, inside ``step_with_ready_grads``.
MUON_NS_STEPS = 5   # muon_num_ns_steps (Bridge's distributed_muon_with_cosine_annealing; MCore OptimizerConfig)
# HBM bytes per owned parameter of one step, from the kernels it runs (fp32 master/momentum, bf16 weight and
# gradient buffer): Float16OptimizerWithFloat16Params copies the bf16 gradient to fp32 (2 + 4), norm for clipping (4)
# and clip (8); emerging_optimizers' OrthogonalizedOptimizer.step: decoupled weight decay on the master (8), momentum
# lerp (12), Nesterov lerp (12); newton_schulz: normalise (12), cast to bf16 for fp32_matmul_prec "medium" (6) and back
# (6); TensorParallelMuon's scale factors (16); the update (12); Float16's copy to the bf16 weight (6); zeroing the
# gradient buffer (2).
MUON_STEP_BYTES = 110.0


def _ns_flops(rows: float, cols: float, steps: int = MUON_NS_STEPS) -> float:
    """FLOPs of emerging_optimizers' ``newton_schulz`` on a rows x cols matrix: it transposes to whiten the smaller
    dimension s (the larger is l), and each ``newton_schulz_step`` runs A = X X^T (2 s^2 l), B = b A + c A A (2 s^3)
    and X = a X + B X (2 s^2 l)."""
    small, large = min(rows, cols), max(rows, cols)
    return steps * (4.0 * small * small * large + 2.0 * small ** 3)


def muon_matrices(m: dict[str, Any], tp: int = 1, etp: int = 1) -> dict[str, list[tuple[float, float]]]:
    """The (rows, cols) of each matrix Muon orthogonalizes, as one GPU holds it: ``"moe"`` per MoE layer (attention,
    shared expert, router), ``"dense"`` per dense layer, ``"expert"`` per routed expert (fc1, fc2).

    Megatron-Core routes every 2-D weight but the embedding and output layer to Muon
    (``emerging_optimizers._is_nonlinear_or_embedding``). Bridge's default ``muon_tp_mode`` is ``"blockwise"``:
    ``TensorParallelMuon.orthogonalize`` passes no partition dim, so each TP (expert: ETP) shard is orthogonalized on
    its own rank, no gather and no duplicated work: column-parallel weights split their rows, row-parallel ones their
    columns. ``muon_split_qkv`` (default True) orthogonalizes Q, K and V of a fused QKV separately; MLA's down
    projections are not split by TP."""
    h = m["hidden_size"]
    heads, kv = m["num_attention_heads"], m["kv_channels"]
    if m.get("attention") == "mla":
        q_lora, kv_lora = m.get("q_lora_rank", 1536), m.get("kv_lora_rank", 512)
        nope, rope = m.get("qk_head_dim", 128), m.get("qk_pos_emb_head_dim", 64)
        q = [(q_lora, h), (heads * (nope + rope) / tp, q_lora)] if q_lora else [(heads * (nope + rope) / tp, h)]
        attn = q + [(kv_lora + rope, h), (heads * (nope + kv) / tp, kv_lora), (h, heads * kv / tp)]
    else:
        groups = m["num_query_groups"]
        attn = [(heads * kv / tp, h), (groups * kv / tp, h), (groups * kv / tp, h), (h, heads * kv / tp)]
    g = 2 if m.get("gated_linear_unit", True) else 1
    shared = m.get("shared_expert_size") or 0
    moe = attn + ([(g * shared / tp, h), (h, shared / tp)] if shared else []) + [(m["num_moe_experts"], h)]
    dense = attn + [(g * m["ffn_hidden_size"] / tp, h), (h, m["ffn_hidden_size"] / tp)]
    f_e = m["moe_ffn_hidden_size"]
    return {"moe": moe, "dense": dense, "expert": [(g * f_e / etp, h), (h, f_e / etp)]}


def muon_seconds(m: dict[str, Any], hw: dict[str, Any], cand: Candidate, world: int,
                 c: dict[str, float] | None = None) -> tuple[float, float]:
    """Muon's optimizer step and its exposed parameter all-gather on one GPU of the slowest stage, in seconds.

    The step: ``MUON_STEP_BYTES`` of HBM passes per parameter this GPU owns (dense over DP, experts over expert-DP, as
    Adam's shard) and the Newton-Schulz GEMMs of the whole matrices it owns (``muon_matrices``, ``_ns_flops``), run in
    BF16 (``fp32_matmul_prec="medium"``: ``newton_schulz`` casts to bf16) at the GEMM efficiency of their smaller
    dimension. The ping-pong deal balances the owned matrices, so a GPU runs 1/DP of its stage's dense matrices and
    1/EDP of its experts.

    The all-gather: ``LayerWiseDistributedOptimizer.allgather_params`` sends each rank's updated bf16 weights to the
    other ranks of its DP group (expert weights: expert-DP group) after the step; Bridge's Muon recipes run with
    ``overlap_param_gather`` False, so nothing hides it. A group of one (DP 1, or EP x PP = world) gathers nothing."""
    c = constants() if c is None else c
    n_moe, n_dense, mtp = _layers(m)
    mats = muon_matrices(m, cand.tp, cand.etp)
    peak = _peak_bf16(hw, c)

    def seconds(ms: list[tuple[float, float]]) -> float:
        return sum(_ns_flops(r, q) / (peak * _gemm_eff(min(r, q), c)) for r, q in ms)

    dp = max(1, world // (cand.tp * cand.pp * cand.cp))
    edp = max(1, world // (cand.ep * cand.etp * cand.pp))
    stage = 1.0 / cand.pp
    ns = ((n_moe + mtp) * seconds(mats["moe"]) + n_dense * seconds(mats["dense"])) * stage / dp \
        + (n_moe + mtp) * m["num_moe_experts"] / cand.ep * seconds(mats["expert"]) * stage / edp
    p = parameters(m)
    dense = (p["attention"] + p["dense_mlp"] + p["shared"] + p["router"] + p["embedding"]) / (cand.tp * cand.pp)
    experts = p["experts"] / (cand.ep * cand.etp * cand.pp)
    step = (dense / dp + experts / edp) * MUON_STEP_BYTES / (hw["hbm_tbps"] * 1e12 * HBM_EFFICIENCY) + ns
    gather = 0.0
    link = _dp_link_gbps(hw, world, cand.pp)
    for params, group in ((dense, dp), (experts, edp)):
        if group > 1:
            gather += params * 2.0 * (group - 1) / group / (link * 1e9 * COLLECTIVE_EFFICIENCY)
    return step, gather


def _dp_link_gbps(hw: dict[str, Any], world: int, pp: int) -> float:
    """The link a data-parallel (or expert-data-parallel) group's collectives run on.

    Megatron-Core orders ranks ``tp-cp-ep-dp-pp`` (``parallel_state.initialize_model_parallel``'s default ``order``; the
    expert ranks ``tp-ep-dp-pp`` through the same order), pipeline outermost: each pipeline stage is world / PP
    consecutive ranks, and every DP and expert-DP group lies inside one stage. A stage that fits one node (an NVLink
    segment of a rack on multi-node NVLink) keeps its DP collectives on NVLink; only stages wider than that use the
    network."""
    return hw["nic_gbps"] if world // max(1, pp) > nvlink_width(hw, world) else hw["nvlink_gbps"]


def _dp_exposed(dp_traffic: float, per_mb: float) -> float:
    """The DP traffic (``_dp_traffic``) beyond what one micro-batch's compute hides."""
    return max(0.0, dp_traffic - per_mb)


def _dp_traffic(m: dict[str, Any], hw: dict[str, Any], cand: Candidate, world: int, dp: int,
                batch: Batch | None = None) -> float:
    """The data-parallel bytes of one step, as time on the DP link. Adam (distributed optimizer): the gradient
    reduce-scatter and the bf16 parameter all-gather. Muon (no distributed optimizer): DDP's gradient all-reduce, a
    reduce-scatter and an all-gather both in the gradient's dtype (its parameter all-gather is ``muon_seconds``').
    Gradients go in BF16 unless ``grad_reduce_in_fp32`` (``Batch.grad_reduce_fp32``: Megatron-Bridge's default,
    which the planner keeps where it does not tune for throughput), in FP32 then
    (megatron/core/distributed/distributed_data_parallel_config.py)."""
    grad = 4.0 if batch is not None and batch.grad_reduce_fp32 else 2.0
    per_param = 2.0 * grad if batch is not None and batch.optimizer == "muon" else grad + 2.0
    p = parameters(m)
    share = 1.0 / cand.pp
    dense = (p["attention"] + p["dense_mlp"] + p["shared"] + p["router"]) * share / cand.tp + p["embedding"] / cand.tp / cand.pp
    experts = p["experts"] * share / (cand.ep * cand.etp)
    edp = max(1, world // (cand.ep * cand.etp * cand.pp))
    t = 0.0
    link = _dp_link_gbps(hw, world, cand.pp)
    for params, group in ((dense, dp), (experts, edp)):
        if group <= 1:
            continue
        t += params * per_param * (group - 1) / group / (link * 1e9 * COLLECTIVE_EFFICIENCY)
    return t


__all__ = ["Batch", "Candidate", "StepEstimate", "StepModel", "a2a_seconds", "constants", "covers", "estimate", "flops_per_token",
           "muon_matrices", "muon_seconds"]
