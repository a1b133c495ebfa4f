"""The planner: every knob the user left ``auto``, decided jointly by a search.

Candidates are enumerated over what is not pinned (TP, PP, VPP, EP, ETP, CP, dispatcher, EP
overlap, delayed wgrad, recompute rung, CUDA-graph scope), pruned early (divisibility, memory),
scored by the step-time model (``mocompile.steptime``) and checked against the same rule catalogue
as ``check``. Ranking follows the goal: predicted step time for ``throughput``, lowest memory (in steps as wide as
the estimate's measured error: plans in one step count as equal) then time for ``fit``, the simplest legal plan for
``bring-up``. The tuned perf recipe Bridge ships for the same model, GPU and precision
(``data/anchors.yaml``) is always scored too, and is kept unless the model predicts another plan faster by
more than its trust margin (``data/steptime.yaml``), widened
with the number of knobs the plan changes (``required_ratio``).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

from mocompile import layout as layouts
from mocompile import memory, plancache, steptime
from mocompile.datafiles import load_yaml
from mocompile.resolve.context import Context
from mocompile.rules.checks import idle_overlap, ncclep_unavailable, package_missing
from mocompile.rules.engine import VERSION_KEYS, rules
from mocompile.steptime import Batch, Candidate, StepEstimate

FLEX = ("deepep", "hybridep", "ncclep")
# None: Megatron-Core passes 0 to Transformer Engine's NCCL EP, which lets NCCL choose (token_dispatcher.py _NCCLEPManager)
DEFAULT_SMS: dict[str, int | None] = {"deepep": 20, "hybridep": 32, "ncclep": None}
HEADROOM = memory.limits()["headroom"]  # share of GPU memory a plan may fill (data/memory.yaml)
ROUTER_SCOPES = ["moe_router", "moe_preprocess"]
LAYOUT_SHORTLIST = 16      # layouts kept after the first (default-knob) scoring
RULE_CHECK_LIMIT = 400     # candidates rule-checked at most, best first
ANCHORS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "anchors.yaml")
Rung = tuple[Any, ...]


@dataclass
class Scored:
    """One candidate with its predicted step, memory and (once checked) broken rules."""

    cand: Candidate
    est: StepEstimate
    _mem: dict[str, Any] | Callable[[], dict[str, Any]]  # the estimate, or how to make it when first read
    fits: bool
    anchor: str | None = None      # the label of the reference plan this is (resolve/reference.py), if one
    broken: list[str] | None = None
    kind: str | None = None        # shipped | near | defaults: what that reference rests on

    @property
    def mem(self) -> dict[str, Any]:
        """The memory estimate: made on first read, since a search scores hundreds of plans whose fit test
        needs only the total (``Scorer.total_gib``) and reports the parts of a handful."""
        if callable(self._mem):
            self._mem = self._mem()
        return self._mem

    @property
    def step(self) -> float:
        return self.est.step_s

    def summary(self) -> dict[str, Any]:
        out = {"plan": self.cand.label(), "step_time_s": round(self.step, 3),
               "tflops_per_gpu": round(self.est.tflops_per_gpu, 1),
               "tokens_per_s_per_gpu": round(self.est.tokens_per_s_per_gpu, 1),
               "memory_gib": self.mem["total_gib"]}
        if self.anchor:
            out["anchor"] = self.anchor
        return out


@functools.lru_cache(maxsize=1)
def anchors() -> tuple[dict[str, Any], ...]:
    return tuple(load_yaml(ANCHORS)["anchors"])


def trust_margin(model: dict[str, Any] | None = None) -> float:
    """Leave a reference plan only for a predicted gain above the model's errors; never where the model's costing
    of the architecture was not checked against training runs (``steptime.validated``: Qwen3-Next), whatever the
    reference: a finite margin against the recipes moved to other settings (not measured there either) made
    Qwen3-Next leave NVIDIA's plans in leave-the-setting-out by ~2x (benchmarks/plan_quality.py)."""
    if model is not None and not steptime.validated(model):
        return float("inf")
    return steptime.constants().get("trust_margin", 0.08)


def unweighed(model: dict[str, Any] | None) -> str:
    """Why no predicted gain leaves the reference (``trust_margin`` is infinite for it)."""
    attention = (model or {}).get("attention")
    if model is not None and steptime.covers(model):
        return (f"the step-time model costs {attention} attention from a one-GPU kernel measurement no training run "
                "has checked (steptime.validated), so no predicted gain leaves the reference")
    return _UNCOSTED.format(attention=attention)


# The knobs a plan is made of (``num_sms`` follows the dispatcher: not a knob of its own).
KNOB_FIELDS = ("tp", "pp", "vpp", "ep", "etp", "cp", "dispatcher", "overlap", "delay_wgrad", "recompute", "graphs")


def knob_distance(a: Candidate, b: Candidate) -> int:
    """How many knobs two plans differ in (each parallel size, dispatcher, EP overlap, delayed wgrad,
    recompute rung, CUDA-graph scope)."""
    return sum(getattr(a, f) != getattr(b, f) for f in KNOB_FIELDS)


def required_ratio(margin: float, distance: int) -> float:
    """The predicted step-time ratio (plan / shipped recipe) a plan ``distance`` knobs away must beat.

    Each changed knob brings its own error in the predicted ratio; independent errors add in quadrature,
    so the margin grows with the square root of the distance, in log space: (1 - margin) ** sqrt(d).
    The model's errors on the ratios between measured plans of one setting grow that way
    (``benchmarks/calibrate.py`` prints them by distance: root-mean-square about 0.09 in log at one and two
    knobs, 0.15-0.19 at three to five)."""
    if margin >= 1.0:
        return 0.0
    return (1.0 - margin) ** math.sqrt(max(1, distance))


# -- the space --------------------------------------------------------------------------------------

def pinned_value(ctx: Context, *path: str) -> Any:
    """The user's value at ``path``, or None where the intent leaves it ``auto`` (or says nothing)."""
    return ctx.pinned(*path) if ctx.explicit(*path) else None



def _divisors(n: int) -> list[int]:
    """Divisors of a small number (expert counts: never the world size, which may be huge)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def ladder(ctx: Context, overlap: bool) -> list[Rung]:
    """Recompute rungs, lightest first; EP overlap allows only the overlap-safe ones."""
    gg = bool(ctx["moe_grouped_gemm"])
    mla = bool(ctx["multi_latent_attention"])
    attn = "mla_up_proj" if mla else "core_attn"
    dense = ["mlp"] if ctx["first_k_dense"] else []
    # layernorm recompute needs TE on Megatron-Core 0.19.2 (RC009): the local spec starts at the next rung
    norm = ["layernorm"] if ctx["te_version"] is not None else []
    rungs: list[Rung] = [(None, None, None, None)]
    if norm:
        rungs.append(("selective", ("layernorm",), None, None))
    if gg:
        rungs.append(("selective", tuple(norm + ["moe_act"]), None, None))
    rungs.append(("selective", tuple(norm + (["moe_act"] if gg else []) + [attn] + dense), None, None))
    if not overlap:
        rungs.append(("selective", tuple(norm + ["moe", attn]), None, None))
        rungs.append(("full", None, "uniform", 1))
    return rungs


def _rungs(ctx: Context, overlap: bool) -> list[Rung]:
    gran = pinned_value(ctx, "recompute", "granularity")
    mods = pinned_value(ctx, "recompute", "modules")
    method, nlayers = ctx.pinned("recompute", "method"), ctx.pinned("recompute", "num_layers")
    if gran == "none":
        return [(None, None, method, nlayers)]
    if gran == "full":
        # neither method nor layers pinned: the ladder's full rung (uniform over one layer), as auto chooses it;
        # one pinned without the other is the user's half of Megatron's pair (RC003 asks for the other)
        return [("full", None, "uniform", 1) if method is None and nlayers is None else ("full", None, method, nlayers)]
    if gran == "selective" and mods is not None:
        return [("selective", tuple(mods), method, nlayers)]
    pinned_pair = method is not None or nlayers is not None
    if gran is None and mods is None and pinned_pair:
        # Megatron-Core reads recompute_method and recompute_num_layers only under full granularity
        # (transformer_config.py): pinning either asks for full recompute, with the user's values (RC003 asks for the
        # other half of the pair, RC007 checks the layer count)
        return [("full", None, method, nlayers)]
    rungs = ladder(ctx, overlap)
    if gran == "selective":
        # a pinned method or layer count is kept, never dropped: RC004 refuses it beside selective recompute, at the
        # user's line (the plan used to print the ladder's None as "pinned in the recipe")
        rungs = [(r[0], r[1], method, nlayers) if pinned_pair else r for r in rungs if r[0] == "selective"]
    if mods is not None:  # modules pinned, granularity auto: selective with those modules
        rungs = [("selective", tuple(mods), method, nlayers)]
    return rungs


def _graph_options(ctx: Context) -> list[str]:
    impl, mods = pinned_value(ctx, "cuda_graphs", "impl"), pinned_value(ctx, "cuda_graphs", "modules")
    if impl is not None:
        if impl == "none":
            return ["none"]
        if impl == "full_iteration":
            return ["full_iteration"]
        return ["te_arp" if mods and "attn" in mods else "te_rp"]
    if ctx.goal != "throughput" or ctx["te_version"] is None:
        return ["none"]
    return ["te_rp", "none"]


def _dispatchers(ctx: Context) -> list[str]:
    pinned = pinned_value(ctx, "moe", "dispatcher")
    if pinned is not None:
        return [pinned]
    if ctx.goal == "bring-up":
        return ["alltoall"]
    # The ranking is a stable sort, so a tie in predicted time goes to the earlier backend: HybridEP before DeepEP
    # (the model costs their links alike; the documented default, reference.default_dispatcher, prefers HybridEP).
    # A flex backend the cluster profile's probe found missing there (`mocompile probe`) would only fail its
    # preflight (RUN003/RUN013): not offered.
    # NCCL EP comes last (its link efficiency is DeepEP's, unmeasured) and only where the target stack has it
    # (DSP011-DSP013: the lock's Transformer Engine 2.12 has no transformer_engine.pytorch.ep).
    return ["alltoall"] + [b for b in ("hybridep", "deepep", "ncclep") if b in ctx["gpu_flex_backends"]
                           and package_missing(b, ctx["cluster_missing"]) is None
                           and (b != "ncclep" or ncclep_unavailable(ctx) is None)]


def flex_across_nvl8_blackwell(disp: str, group: int, hw: dict[str, Any], domain: int) -> bool:
    """Is ``disp`` a DeepEP/HybridEP backend whose group of ``group`` ranks spans the 8-GPU NVLink nodes (NVLink
    domains of ``domain`` GPUs, no multi-node NVLink) of a Blackwell GPU ``hw`` (B200/B300)?"""
    return disp in ("deepep", "hybridep") and group > domain and not hw.get("mnnvl") and hw.get("arch") == "blackwell"


def flex_withheld(ctx: Context, disp: str, group: int) -> str | None:
    """Why the search does not offer flex backend ``disp`` for an EP group of ``group`` ranks (None: it does).
    On Blackwell's 8-GPU NVLink nodes (B200/B300; not NVL72) no flex backend is offered for a group that spans
    nodes unless the intent pins it: NVIDIA's internode DeepEP runs there have failed (rule DSP016), and NVIDIA
    limits HybridEP to EP <= 8 on such nodes because its internode path is not yet performant (Megatron-Bridge
    issue 2883; every B200/B300 perf recipe with HybridEP keeps its expert group inside one node, while
    Kimi-K2's EP 16 recipes run alltoall). The step model costs the flex backends' network path at the link
    rate they reach on Hopper (DeepEP's README), so left to itself it would pick them there. A shipped recipe that
    runs one across such nodes (Qwen3-Next's DeepEP at EP 64) stays a reference plan: reference.moved keeps it."""
    if not flex_across_nvl8_blackwell(disp, group, ctx.hw, ctx["nvlink_domain"]) \
            or pinned_value(ctx, "moe", "dispatcher") is not None:
        return None
    rule = "DSP016: NVIDIA's internode DeepEP runs on B200/B300 failed" if disp == "deepep" else \
        "Megatron-Bridge limits HybridEP to EP <= 8 on 8-GPU NVLink nodes (issue 2883)"
    return f"an expert group of {group} ranks spans {ctx['gpu']} nodes of {ctx['nvlink_domain']} GPUs: {rule}"


def _bools(ctx: Context, path: tuple[str, str], goal_default: list[bool]) -> list[bool]:
    pinned = pinned_value(ctx, *path)
    return [bool(pinned)] if pinned is not None else goal_default


class Layout(NamedTuple):
    """A (TP, PP, VPP, EP, ETP, CP) the search enumerates (a tuple: the 1024-GPU search makes hundreds)."""

    tp: int
    pp: int
    vpp: int
    ep: int
    etp: int
    cp: int


def _sizes(ctx: Context, world: int | None) -> tuple[dict[str, Any], list[int], list[int], list[int], list[int],
                                                     list[int]]:
    """The pins and the TP, CP, PP, ETP and EP sizes the model allows, those of PP and EP dividing ``world``
    (None: on any GPU count)."""
    gpn = ctx["gpus_per_node"]
    heads, groups, experts = ctx["num_attention_heads"], ctx["num_query_groups"], ctx["num_moe_experts"]
    layers = ctx["num_layers"]
    p = {k: pinned_value(ctx, "parallelism", k) for k in ("tp", "pp", "vpp", "ep", "etp", "cp")}
    tps = [p["tp"]] if p["tp"] else [t for t in (1, 2, 4, 8) if t <= gpn and heads % t == 0
                                     and (groups % t == 0 or t % groups == 0)]
    cps = [p["cp"]] if p["cp"] else ([1, 2, 4, 8] if ctx["seq_length"] >= 16384 else [1])
    pps = [p["pp"]] if p["pp"] else [d for d in range(1, min(world or layers, layers) + 1)
                                     if world is None or world % d == 0]
    etps = [p["etp"]] if p["etp"] else [1]
    eps = [p["ep"]] if p["ep"] else [e for e in _divisors(experts) if world is None or world % e == 0]
    return p, tps, cps, pps, etps, eps


def _vpps(ctx: Context, p: dict[str, Any], pp: int) -> list[int]:
    """The interleaving depths a pipeline of ``pp`` stages may take."""
    if p["vpp"] is not None:
        return [p["vpp"]]
    if pp == 1 or ctx.goal == "bring-up":
        return [1]
    units = ctx["num_layers"] + 2 + (ctx["mtp_num_layers"] or 0)
    return [1] + [v for v in (2, 3, 4, 6, 8, 12, 16) if units >= 2 * pp * v]


def layouts_for(ctx: Context, world: int) -> list[Layout]:
    """Every (TP, PP, VPP, EP, ETP, CP) the pins, divisibility and the model allow on ``world`` GPUs."""
    experts = ctx["num_moe_experts"]
    p, tps, cps, pps, etps, eps = _sizes(ctx, world)
    out: list[Layout] = []
    for tp, cp, pp, etp, ep in itertools.product(tps, cps, pps, etps, eps):
        if world % (tp * pp * cp) or world % (ep * etp * pp) or experts % ep:
            if not all(p[k] for k in ("tp", "pp", "ep")):
                continue
        out.extend(Layout(tp, pp, v, ep, etp, cp) for v in _vpps(ctx, p, pp))
    if not out:  # the pins leave nothing legal: keep them (1 where unpinned) and let the rules say why
        out.append(Layout(p["tp"] or 1, p["pp"] or 1, p["vpp"] or 1, p["ep"] or 1, p["etp"] or 1, p["cp"] or 1))
    return out


def _shapes(ctx: Context) -> list[Layout]:
    """Every layout the pins and the model allow on some GPU count (``layouts_for`` without divisibility)."""
    experts = ctx["num_moe_experts"]
    p, tps, cps, pps, etps, eps = _sizes(ctx, None)
    return [Layout(tp, pp, v, ep, etp, cp) for tp, cp, pp, etp, ep in itertools.product(tps, cps, pps, etps, eps)
            if experts % ep == 0 for v in _vpps(ctx, p, pp)]


# -- candidate -> settings ------------------------------------------------------------------------

def _layout_string(ctx: Context, pp: int, vpp: int) -> str | None:
    return _layout_cached(ctx, pp, vpp)


def _layout_cached(ctx: Context, pp: int, vpp: int) -> str | None:
    cache = ctx.__dict__.setdefault("_layout_cache", {})
    if (pp, vpp) not in cache:
        cache[(pp, vpp)] = _derive_layout(ctx, pp, vpp)
    return cache[(pp, vpp)]


def _derive_layout(ctx: Context, pp: int, vpp: int) -> str | None:
    user = ctx.pinned("parallelism", "layout")
    if isinstance(user, str) and user not in ("auto", "none") and ctx.explicit("parallelism", "layout"):
        return user
    if user == "none":
        return None
    return layouts.default(pp, vpp, ctx["num_layers"], ctx["mtp_num_layers"] or 0)


def _shared_expert_overlap(ctx: Context, overlap: bool, dispatcher: str) -> bool:
    pinned = pinned_value(ctx, "moe", "shared_expert_overlap")
    if pinned is not None:
        return bool(pinned)
    return steptime.shared_expert_overlap(ctx.model, dispatcher, overlap)


def _graph_impl(ctx: Context, graphs: str) -> str:
    """Megatron's cuda_graph_impl for a candidate's graph scope (a pinned impl wins)."""
    return pinned_value(ctx, "cuda_graphs", "impl") or \
        {"none": "none", "full_iteration": "full_iteration"}.get(graphs, "transformer_engine")


def _graph_modules(ctx: Context, graphs: str) -> list[str]:
    """Megatron's cuda_graph_modules for a candidate's graph scope (pinned modules win)."""
    pinned = pinned_value(ctx, "cuda_graphs", "modules")
    if pinned is not None:
        return list(pinned)
    impl = _graph_impl(ctx, graphs)
    return [] if impl in ("none", "full_iteration") else (["attn"] if graphs == "te_arp" else []) + ROUTER_SCOPES


def pins(ctx: Context, cand: Candidate) -> dict[str, Any]:
    """The intent values (dotted keys, as ``--set`` takes them) that pin every knob of ``cand``: what
    ``mocompile tune`` compiles to run a candidate, and what ``--write`` puts in the recipe."""
    out: dict[str, Any] = {f"parallelism.{k}": getattr(cand, k) for k in ("tp", "pp", "vpp", "ep", "etp", "cp")}
    out.update({"moe.dispatcher": cand.dispatcher, "moe.overlap": cand.overlap, "moe.delay_wgrad": cand.delay_wgrad,
                "cuda_graphs.impl": _graph_impl(ctx, cand.graphs)})
    if out["cuda_graphs.impl"] not in ("none", "full_iteration"):
        out["cuda_graphs.modules"] = _graph_modules(ctx, cand.graphs)
    gran, modules, method, layers = cand.recompute
    out["recompute.granularity"] = gran or "none"
    if gran == "selective":
        out["recompute.modules"] = list(modules or [])
    elif gran == "full":
        out.update({"recompute.method": method, "recompute.num_layers": layers})
    return out


def settings(ctx: Context, cand: Candidate, world: int | None = None) -> dict[str, Any]:
    """The Megatron fields a candidate sets, derived settings included (what the rules read)."""
    world = world or ctx["world_size"]
    dp = max(1, world // (cand.tp * cand.pp * cand.cp))
    flex = cand.dispatcher in FLEX
    impl = _graph_impl(ctx, cand.graphs)
    mods = _graph_modules(ctx, cand.graphs)
    sp = pinned_value(ctx, "parallelism", "sequence_parallel")
    sms = pinned_value(ctx, "moe", "num_sms")
    rung = cand.recompute
    return {
        "tensor_model_parallel_size": cand.tp, "pipeline_model_parallel_size": cand.pp,
        "expert_model_parallel_size": cand.ep, "expert_tensor_parallel_size": cand.etp,
        "context_parallel_size": cand.cp, "data_parallel_size": dp,
        "expert_data_parallel_size": max(1, world // (cand.ep * cand.etp * cand.pp)),
        # SP with TP > 1 (EP with TP needs it), except on the local spec, whose torch LayerNorm refuses it (PAR012)
        "sequence_parallel": bool(sp) if sp is not None else cand.tp > 1 and ctx["te_version"] is not None,
        "num_microbatches": ctx["global_batch_size"] // max(1, ctx["micro_batch_size"] * dp),
        "virtual_pipeline_model_parallel_size": None if cand.vpp == 1 else cand.vpp,
        "pipeline_model_parallel_layout": _layout_string(ctx, cand.pp, cand.vpp),
        "moe_token_dispatcher_type": "flex" if flex else cand.dispatcher,
        "moe_flex_dispatcher_backend": cand.dispatcher if flex else None,
        "moe_flex_dispatcher_num_sms": sms if sms is not None else (DEFAULT_SMS[cand.dispatcher] if flex else None),
        "hybridep_ranks_per_domain": min(ctx["nvlink_domain"], cand.ep * cand.etp),
        "overlap_moe_expert_parallel_comm": cand.overlap, "delay_wgrad_compute": cand.delay_wgrad,
        "moe_shared_expert_overlap": _shared_expert_overlap(ctx, cand.overlap, cand.dispatcher),
        "recompute_granularity": rung[0], "recompute_modules": list(rung[1]) if rung[1] is not None else None,
        "recompute_method": rung[2], "recompute_num_layers": rung[3],
        "cuda_graph_impl": impl, "cuda_graph_modules": mods,
        "overlap_p2p_comm": cand.pp > 1 and cand.vpp > 1, "batch_p2p_comm": cand.pp > 1 and cand.vpp == 1,
        "use_te_rng_tracker": impl not in (None, "none"),
    }


# -- scoring ----------------------------------------------------------------------------------------

class Scorer:
    """Scores candidates for one intent; memoises the flat base settings."""

    def __init__(self, ctx: Context, world: int | None = None):
        self.ctx = ctx
        self.world = world or ctx["world_size"]
        self.base = ctx.values()
        self.base["world_size"] = self.world
        self.limit = memory.usable_gib(ctx.hw["memory_gib"])
        # shipped recipes run as shipped fit up to the GPU's memory plus the estimate's measured error
        self.shipped_limit = memory.shipped_limit_gib(ctx.hw["memory_gib"])
        self._shipped = shipped_plans(ctx) if self.world == ctx["world_size"] else {}
        self._host = _offload_host_limit(ctx)  # offloading: a plan must also fit the host memory a node may pin
        self.batch = Batch(ctx["seq_length"], ctx["micro_batch_size"], ctx["global_batch_size"], ctx["precision"],
                           bool(ctx["moe_router_force_load_balancing"]), ctx["te_version"] is not None,
                           bool(ctx["moe_grouped_gemm"]), optimizer_offload=float(ctx["optimizer_offload_fraction"]),
                           fsdp=bool(ctx["use_megatron_fsdp"]), offload_modules=tuple(ctx["offload_modules"]),
                           optimizer=ctx["optimizer"] or "adam",
                           shared_expert_overlap=pinned_value(ctx, "moe", "shared_expert_overlap"),
                           manual_gc_interval=int(ctx["manual_gc_interval"] or 0) if ctx["manual_gc"] else 0,
                           grad_reduce_fp32=bool(ctx["grad_reduce_in_fp32"]))
        self.hw = dict(ctx.hw, nvlink_domain=ctx.hw["nvlink_domain"], gpus_per_node=ctx["gpus_per_node"])
        self.count = 0
        self._mem: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._fit: dict[tuple[Any, ...], float] = {}
        self._rungs: dict[Rung, tuple[Any, tuple[str, ...]]] = {}
        # the memory estimate with the settings no candidate changes (what the base holds) fixed: it memoises
        # its parts per the knobs each depends on (memory.Estimator)
        self._estimator = memory.Estimator(ctx.model, self.base)
        self._impl = {g: _graph_impl(ctx, g) for g in ("none", "te_rp", "te_arp", "full_iteration")}
        # each candidate's own graph scopes: attention graphs (te_arp) hold buffers of their own
        self._scopes = {g: tuple(_graph_modules(ctx, g)) for g in ("none", "te_rp", "te_arp", "full_iteration")}
        self._nvlink_domain = ctx["nvlink_domain"]
        self._steps = steptime.StepModel(ctx.model, self.hw, self.batch, self.world)  # memoises per knob too
        self._checks: dict[tuple[Any, ...], list[tuple[str, Any]]] = {}
        self._shared_by: dict[tuple[bool, str], bool] = {}

    @property
    def estimator(self) -> memory.Estimator:
        return self._estimator

    def weight_bound(self, cand: Candidate) -> bool:
        """Are the layout's weights alone (``memory.Estimator.floor_gib``) over the limit? Then no knob, rung or
        scope fits it (the 0.01 margin covers the total's rounding to 0.01 GiB)."""
        return self._estimator.floor_gib(cand.tp, cand.pp, cand.vpp, cand.ep, cand.etp, cand.cp) > self.limit + 0.01

    def config(self, cand: Candidate) -> dict[str, Any]:
        cfg = dict(self.base)
        cfg.update(settings(self.ctx, cand, self.world))
        return cfg

    def memory(self, cand: Candidate) -> dict[str, Any]:
        """The memory estimate from only the fields it reads (the hot path of the search)."""
        key = (cand.tp, cand.pp, cand.vpp, cand.ep, cand.etp, cand.cp, cand.recompute, cand.overlap,
               cand.dispatcher, cand.graphs)  # delayed wgrad and SM counts do not change memory
        hit = self._mem.get(key)
        if hit is None:
            hit = self._mem[key] = self._estimator.estimate(*self._knob_args(cand, self._rung_args(cand.recompute)))
        return hit

    def total_gib(self, cand: Candidate) -> float:
        """``memory(cand)["total_gib"]``: what a fit test reads."""
        key = (cand.tp, cand.pp, cand.vpp, cand.ep, cand.etp, cand.cp, cand.recompute, cand.overlap,
               cand.dispatcher, cand.graphs)
        hit = self._fit.get(key)
        if hit is None:
            hit = self._fit[key] = self._estimator.total_gib(self._knobs_of(cand), *self._rung_args(cand.recompute))
        return hit

    def _knobs_of(self, cand: Candidate) -> tuple[Any, ...]:
        """``memory.Estimator.knobs`` of a candidate (all its memory fields but the recompute rung)."""
        return self._estimator.knobs(cand.tp, cand.pp, cand.vpp, cand.ep, cand.etp, cand.cp, bool(cand.overlap),
                                     cand.dispatcher if cand.dispatcher in FLEX else None,
                                     min(self._nvlink_domain, cand.ep * cand.etp),
                                     self._impl.get(cand.graphs) or _graph_impl(self.ctx, cand.graphs),
                                     self._scopes_of(cand.graphs), self._shared(cand.overlap, cand.dispatcher))

    def _shared(self, overlap: bool, dispatcher: str) -> bool:
        """``_shared_expert_overlap`` of a candidate (it reads only these two of its fields)."""
        key = (overlap, dispatcher)
        hit = self._shared_by.get(key)
        if hit is None:
            hit = self._shared_by[key] = _shared_expert_overlap(self.ctx, overlap, dispatcher)
        return hit

    def _scopes_of(self, graphs: str) -> tuple[str, ...]:
        hit = self._scopes.get(graphs)
        return hit if hit is not None else tuple(_graph_modules(self.ctx, graphs))

    def _rung_args(self, rung: Rung) -> tuple[Any, tuple[str, ...]]:
        """The memory estimate's (granularity, modules) of a recompute rung."""
        hit = self._rungs.get(rung)
        if hit is None:
            hit = self._rungs[rung] = (rung[0], tuple(rung[1] or ()) if rung[0] == "selective" else ())
        return hit

    def _knob_args(self, cand: Candidate, rung: tuple[Any, tuple[str, ...]] | None) -> tuple[Any, ...]:
        """The memory estimate's candidate fields as ``settings`` sets them (``memory.Estimator.of``)."""
        flex = cand.dispatcher in FLEX
        return (cand.tp, cand.pp, cand.vpp, cand.ep, cand.etp, cand.cp, *(rung or (None, None)), bool(cand.overlap),
                cand.dispatcher if flex else None, min(self._nvlink_domain, cand.ep * cand.etp),
                self._impl.get(cand.graphs) or _graph_impl(self.ctx, cand.graphs), self._scopes_of(cand.graphs),
                self._shared(cand.overlap, cand.dispatcher))

    def score(self, cand: Candidate, anchor: str | None = None) -> Scored:
        self.count += 1
        est = self._steps.estimate(cand)
        return Scored(cand, est, lambda: self.memory(cand), self.fits(cand, self.total_gib(cand)), anchor)

    def fits(self, cand: Candidate, total_gib: float) -> bool:
        """Under the headroom, or, for a shipped recipe run as shipped, under its measured limit (what MEM001
        and MEM002 check on the emitted plan); where the plan offloads, also under the host memory a node may pin
        (MEM003), so a memory-ladder rung's search picks a layout that fits both, as ``min_gpus_that_fit`` counts."""
        gpu = total_gib <= self.limit or \
            bool(self._shipped) and total_gib <= self.shipped_limit and self.shipped(cand) is not None
        return gpu and self.host_fits(cand)

    def host_fits(self, cand: Candidate) -> bool:
        """Under the host memory a node may pin (rule MEM003); only tested where the plan offloads
        (``_offload_host_limit``: the host estimate is 0 otherwise)."""
        return self._host is None or self.memory(cand)["host_gib"] * self.hw["gpus_per_node"] <= self._host

    def shipped(self, cand: Candidate) -> str | None:
        """The Bridge perf recipe whose measurement covers ``cand``: run as shipped (``shipped_plans``), with the
        same knobs and at most the recipe's CUDA-graph buffers (the planner offers the router scopes where a
        recipe graphs attention or the full iteration; only the graph term differs, so the estimates compare
        the buffers); None: none does."""
        for graphs, recipe in self._shipped.get(tuple(getattr(cand, f) for f in _NOT_GRAPHS), ()):
            if cand.graphs == graphs or self.total_gib(cand) <= self.total_gib(replace(cand, graphs=graphs)):
                return recipe
        return None

    def lightest_fitting(self, cand: Candidate, rungs: list[Rung]) -> Candidate:
        """The lightest recompute rung that fits (recompute only costs time), else the heaviest."""
        knobs = self._knobs_of(cand)  # the weights and buffers, the same at every rung
        total_gib, rung_args, limit = self._estimator.total_gib, self._rung_args, self.limit
        pick, out, total = rungs[-1], None, None
        if len(rungs) > 1:
            total = total_gib(knobs, *rung_args(pick))
        if total is None or total <= limit:  # else nothing lighter can fit either
            for rung in rungs:
                t = total if rung is pick and total is not None else total_gib(knobs, *rung_args(rung))
                if t <= limit:
                    pick, out, total = rung, cand if rung == cand.recompute else None, t
                    break
            else:
                total = t
        self._fit[(cand.tp, cand.pp, cand.vpp, cand.ep, cand.etp, cand.cp, pick, cand.overlap, cand.dispatcher,
                   cand.graphs)] = total
        return out or _with(cand, recompute=pick)

    def check(self, s: Scored) -> list[str]:
        if s.broken is None:
            cfg = self.config(s.cand)
            cfg["memory_estimate_gib"] = s.mem["total_gib"]
            # memory is the search's own test (``fits``); MEM001 reports it on the final plan
            s.broken = sorted(rid for rid, broken in self._error_checks(cfg) if broken(cfg))
        return s.broken

    def _error_checks(self, cfg: dict[str, Any]) -> list[tuple[str, Any]]:
        """The error rules (bar MEM001) whose version range holds for ``cfg``'s target stack:
        ``broken_rules`` filtered the same way, with the version test done once per stack."""
        stack = tuple(cfg.get(k) for k in VERSION_KEYS.values())
        found = self._checks.get(stack)
        if found is None:
            from mocompile.rules.checks import CHECKS
            found = self._checks[stack] = [(r.id, CHECKS[r.id]) for r in rules()
                                           if r.severity == "error" and r.id != "MEM001" and r.applies(cfg)]
        return found


def _candidate(tp: int, pp: int, vpp: int, ep: int, etp: int, cp: int, dispatcher: str, overlap: bool,
               delay_wgrad: bool, recompute: Rung, graphs: str) -> Candidate:
    """``Candidate(...)`` for the search's hot path (every field an init field, no ``__post_init__``): without the
    frozen dataclass's per-field ``object.__setattr__``."""
    new = object.__new__(Candidate)
    new.__dict__.update(tp=tp, pp=pp, vpp=vpp, ep=ep, etp=etp, cp=cp, dispatcher=dispatcher, overlap=overlap,
                        delay_wgrad=delay_wgrad, recompute=recompute, graphs=graphs, num_sms=None)
    return new


def _with(cand: Candidate, **fields: Any) -> Candidate:
    """``replace(cand, **fields)`` for the search's hot path: a copy of the fields with some changed
    (``Candidate`` has no ``__post_init__`` and every field is an init field), without ``dataclasses.replace``'s
    per-field checks, which cost the 1024-GPU search about 6 ms."""
    new = object.__new__(Candidate)
    new.__dict__.update(cand.__dict__)
    new.__dict__.update(fields)
    return new


def _knobs(ctx: Context) -> list[tuple[str, bool, bool, str]]:
    """(dispatcher, overlap, delayed wgrad, graphs) combinations the goal and pins allow."""
    heavy = ctx.goal in ("bring-up", "fit")
    overlaps = _bools(ctx, ("moe", "overlap"), [False] if heavy else [False, True])
    out: list[tuple[str, bool, bool, str]] = []
    for disp, ov, graphs in itertools.product(_dispatchers(ctx), overlaps, _graph_options(ctx)):
        wgrads = _bools(ctx, ("moe", "delay_wgrad"), [False, True] if ov and ctx["te_version"] else [False])
        out.extend((disp, ov, dw, graphs) for dw in wgrads)
    return out


def _default_knob(ctx: Context, knobs: list[tuple[str, bool, bool, str]], group: int) -> tuple[str, bool, bool, str]:
    """The knob setting used to rank layouts before the full product: flex + overlap where offered."""
    def pref(k: tuple[str, bool, bool, str]) -> tuple[int, ...]:
        return (k[0] == "alltoall" and group > 1, not k[1], k[2], k[3] == "none")
    return min(knobs, key=pref)


def _frugal_knob(knobs: list[tuple[str, bool, bool, str]]) -> tuple[str, bool, bool, str]:
    """The knob setting that needs the least memory: no EP overlap, no CUDA graphs, alltoall if offered."""
    return min(knobs, key=lambda k: (k[1], k[3] != "none", k[0] != "alltoall"))


def _stand_in(sc: Scorer, cand: Candidate, frugal: tuple[str, bool, bool, str],
              rungs_by_ov: dict[bool, list[Rung]], light: bool = False) -> Candidate:
    """A layout's stage-1 representative: its default knobs at the lightest fitting recompute rung, or,
    only when that does not fit, the frugal knobs at theirs (which may still not fit). ``light``: the caller
    found its weights under the limit (``Scorer.weight_bound``)."""
    # a layout whose weights alone are over the limit fits with no knobs: straight to the frugal ones
    if light or not sc.weight_bound(cand):
        cand = sc.lightest_fitting(cand, rungs_by_ov[cand.overlap])
        if sc.total_gib(cand) <= sc.limit:
            return cand
    return sc.lightest_fitting(_with(cand, dispatcher=frugal[0], overlap=frugal[1], delay_wgrad=frugal[2],
                                     graphs=frugal[3], recompute=(None,) * 4), rungs_by_ov[frugal[1]])


def match_anchor(ctx: Context) -> dict[str, Any] | None:
    """The shipped perf recipe for this architecture (whatever the model is called), GPU, precision and
    optimizer whose layout divides the GPU count (``reference.exact``)."""
    from mocompile.resolve import reference
    return reference.exact(ctx)


def anchor_candidate(ctx: Context, a: dict[str, Any], pins: bool = True) -> Candidate:
    """The anchor as a candidate, with the user's pins laid over it (``pins=False``: as shipped)."""
    rc = a["recompute"]
    rung: Rung = (None, None, None, None) if rc == "none" else ("full", None, "uniform", 1) if rc == "full" \
        else ("selective", tuple(rc), None, None)
    p = {k: pinned_value(ctx, "parallelism", k) if pins else None for k in ("tp", "pp", "vpp", "ep", "etp", "cp")}
    cand = Candidate(tp=p["tp"] or a["tp"], pp=p["pp"] or a["pp"], vpp=p["vpp"] or a["vpp"], ep=p["ep"] or a["ep"],
                     etp=p["etp"] or a["etp"], cp=p["cp"] or a["cp"], dispatcher=a["dispatcher"],
                     overlap=a["overlap"], delay_wgrad=a["delay_wgrad"], recompute=rung,
                     graphs=a["graphs"] if a["graphs"] in _graph_options(ctx) else _graph_options(ctx)[0],
                     num_sms=a.get("num_sms"))
    if not pins:
        return cand
    disp = _dispatchers(ctx)
    if cand.dispatcher not in disp:
        cand = replace(cand, dispatcher=disp[0])
    ov = _bools(ctx, ("moe", "overlap"), [cand.overlap])
    dw = _bools(ctx, ("moe", "delay_wgrad"), [cand.delay_wgrad])
    cand = replace(cand, overlap=ov[0], delay_wgrad=dw[0] and ov[0] if pinned_value(ctx, "moe", "delay_wgrad") is None else dw[0])
    gran, mods = pinned_value(ctx, "recompute", "granularity"), pinned_value(ctx, "recompute", "modules")
    # a recompute pin the recipe already satisfies keeps the recipe's rung (pinning what auto chose changes nothing)
    method, nlayers = ctx.pinned("recompute", "method"), ctx.pinned("recompute", "num_layers")
    if (gran is not None or mods is not None) and not (
            cand.recompute[0] == "selective" and gran in (None, "selective")
            and (mods is None or tuple(mods) == tuple(cand.recompute[1] or ()))
            and method is None and nlayers is None):
        cand = replace(cand, recompute=_rungs(ctx, cand.overlap)[0])
    elif (method is not None or nlayers is not None) and cand.recompute[2:] != (method or cand.recompute[2],
                                                                                nlayers or cand.recompute[3]):
        # a pinned recompute method or layer count the recipe does not run: the pins' rung (never dropped)
        cand = replace(cand, recompute=_rungs(ctx, cand.overlap)[0])
    return without_idle_overlap(ctx, cand)


def batch_split(ctx: Context, lay: Any, world: int) -> tuple[int, int] | None:
    """(global batch, samples per step of one micro-batch on every DP rank) of a layout (or candidate) on ``world``
    GPUs: their quotient is the micro-batches per step, whole where the first divides (rule PAR007). None while the
    micro-batch size is still ``auto``."""
    mbs, gbs = ctx["micro_batch_size"], ctx["global_batch_size"]
    if not isinstance(mbs, int) or not isinstance(gbs, int):
        return None
    return gbs, mbs * max(1, world // (lay.tp * lay.pp * lay.cp))


def without_idle_overlap(ctx: Context, cand: Candidate) -> Candidate:
    """A recipe's EP overlap (and the delayed wgrad that rides on it) dropped where it would hide nothing here: no
    pipeline and fewer than two micro-batches per step, which the combined 1F1B schedule needs to pair one
    micro-batch's forward with another's backward (rule OVL014). A pinned overlap stays (the rule then says so)."""
    batch = batch_split(ctx, cand, ctx["world_size"])
    if batch is None or not idle_overlap(cand.overlap, cand.pp, batch[0] // batch[1]) \
            or pinned_value(ctx, "moe", "overlap") is not None:
        return cand
    return replace(cand, overlap=False,
                   delay_wgrad=cand.delay_wgrad if pinned_value(ctx, "moe", "delay_wgrad") is not None else False)


# Bridge's MoE perf recipes train at 4096 tokens (perf_recipes/<family>/<gpu>/<model>.py; what `mocompile init` writes)
SHIPPED_SEQ_LENGTH = 4096


def runs_as_shipped(ctx: Context, a: dict[str, Any]) -> bool:
    """Does this intent run recipe ``a`` with the batch shape and the settings its memory was measured with?
    Its sequence, micro batch and global batch (weak-scaled by DP to at least its GPU count, which only lowers
    per-GPU memory), forced balancing, BF16 gradient reduction and Transformer Engine with fused weight
    gradients (Bridge's ``_benchmark_common``): the memory estimate reads each of them."""
    world = ctx["world_size"]
    return (ctx["seq_length"] == SHIPPED_SEQ_LENGTH and ctx["micro_batch_size"] == a["mbs"]
            and world >= a["gpus"] and ctx["global_batch_size"] * a["gpus"] == a["gbs"] * world
            and bool(ctx["moe_router_force_load_balancing"]) and not ctx["grad_reduce_in_fp32"]
            and ctx["transformer_impl"] == "transformer_engine" and ctx["gradient_accumulation_fusion"] is not False)


_NOT_GRAPHS = tuple(f for f in KNOB_FIELDS if f != "graphs")


def shipped_plans(ctx: Context) -> dict[tuple[Any, ...], list[tuple[str, str]]]:
    """(graph scope, recipe name) of every Bridge perf recipe, variants included, that this intent runs as
    shipped (``runs_as_shipped``), by its other knobs (``KNOB_FIELDS`` but graphs): such a plan is measured
    to run, so its fit test allows the memory estimate's measured error over the GPU's memory
    (``memory.shipped_limit_gib``)."""
    from mocompile.resolve.reference import same_shape
    gpu, prec, opt = ctx["gpu"], ctx["precision"], ctx["optimizer"]
    out: dict[tuple[Any, ...], list[tuple[str, str]]] = {}
    for a in anchors():
        if a["gpu"] != gpu or a["precision"] != prec or a.get("optimizer", "adam") != opt or not same_shape(ctx, a):
            continue
        if runs_as_shipped(ctx, a):
            cand = anchor_candidate(ctx, a, pins=False)
            rungs = [cand.recompute] + ([(None, None, None, None)] if a["recompute"] == [] else [])
            for rung in rungs:  # a module list without granularity is no recompute (what `init` pins)
                key = tuple(getattr(replace(cand, recompute=rung), f) for f in _NOT_GRAPHS)
                out.setdefault(key, []).append((a["graphs"], a["recipe"]))
    return out


@dataclass
class SearchResult:
    winner: Scored
    runners_up: list[Scored]
    excluded: list[Scored]
    anchor: Scored | None            # the shipped recipe for this architecture, GPU and precision, if one
    scored: int
    effects: dict[str, str] = field(default_factory=dict)  # predicted cost of flipping the winner's knobs
    best: Scored | None = None       # the fastest legal plan the model found (before the reference decision)
    reference: Scored | None = None  # the plan the winner was measured against (``kind``: what it rests on)


SIMPLICITY = 0.002  # each extra feature must buy more than 0.2 % of predicted step time


def complexity(c: Candidate) -> int:
    """Features that cost bring-up effort or risk: turned on only when they buy time."""
    return (c.dispatcher in FLEX) + c.overlap + c.delay_wgrad + (c.graphs != "none") + (c.vpp > 1) \
        + (c.pp > 1) + (c.tp > 1) + (c.cp > 1)


def _rank_key(goal: str) -> Callable[[Scored], tuple[Any, ...]]:
    """How a goal orders scored plans. ``fit``: the least memory first, in steps the memory estimate's measured error
    wide (``memory_step``): plans in one step count as equal and the fastest of them wins. A plan 0.2 GiB larger is
    not "less likely to fit" by anything the estimate can tell, while being 2x slower is real."""
    if goal == "fit":
        # where nothing fits, the least memory first: the plan MEM001 reports is the nearest to fitting
        return lambda s: (False, memory_step(s.mem["total_gib"]), s.step, s.mem["total_gib"]) if s.fits else \
            (True, 0, 0.0, s.mem["total_gib"])
    if goal == "bring-up":
        return lambda s: (not s.fits, s.cand.tp * s.cand.pp * s.cand.cp, s.cand.pp, s.cand.tp,
                          s.cand.recompute[0] == "full", s.step)
    return lambda s: (not s.fits, weighted_step(s))


def memory_step(gib: float) -> int:
    """Which step of a fixed geometric grid, each the memory estimate's measured error wide (data/memory.yaml),
    ``gib`` falls in: goal fit's memory order. Plans in one step count as equal and the fastest wins. The grid is
    fixed, not drawn from the least memory among the plans scored, so a pin that leaves the winner in the search
    cannot move the line (pinning a knob to the value auto chose returns the same plan)."""
    return math.floor(math.log(max(gib, 1e-9)) / math.log1p(memory.limits()["measured_error"]))


def weighted_step(s: Scored) -> float:
    """What a throughput search ranks fitting plans by: the step time, ``SIMPLICITY`` dearer per feature."""
    return s.step * (1 + SIMPLICITY * complexity(s.cand))


def _flip(sc: Scorer, base: Scored, **change: Any) -> float | None:
    """Predicted step-time change (s) of one knob flip on the winner, or None when illegal or unfit."""
    trial = sc.score(replace(base.cand, **change))
    if not trial.fits or sc.check(trial):
        return None
    return trial.step - base.step


def signed_step(d: float) -> str:
    """A predicted step-time difference as a reader takes it in: milliseconds below a tenth of a second (never
    "-0.00 s"), and "same predicted step" where that rounds to 0 ms."""
    ms = round(d * 1000)
    if ms == 0:
        return "same predicted step"
    return f"{ms:+d} ms" if abs(d) < 0.1 else f"{d:+.2f} s"


def effects(ctx: Context, res_winner: Scored) -> dict[str, str]:
    """For the dispatcher, overlap and graph choices: what the alternatives are predicted to cost."""
    sc = Scorer(ctx)
    w = res_winner
    out: dict[str, str] = {}
    alts = []
    for disp in ["alltoall"] + [b for b in FLEX if b in ctx["gpu_flex_backends"]]:
        if disp == w.cand.dispatcher:
            continue
        if need := package_missing(disp, ctx["cluster_missing"]):
            alts.append(f"{disp} not offered ({need} missing on the cluster profile's nodes)")
            continue
        if disp == "ncclep" and (rule := ncclep_unavailable(ctx)):
            alts.append(f"ncclep not offered (the target stack has no NCCL EP: {rule})")
            continue
        if why := flex_withheld(ctx, disp, w.cand.ep * w.cand.etp):
            alts.append(f"{disp} not offered ({why}; pin moe.dispatcher to race it)")
            continue
        d = _flip(sc, w, dispatcher=disp, num_sms=None)
        alts.append(f"{disp} {'illegal or does not fit' if d is None else signed_step(d)}")
    out["dispatcher"] = "; ".join(alts)
    d = _flip(sc, w, overlap=not w.cand.overlap, delay_wgrad=False)
    out["overlap"] = (f"overlap {'off' if w.cand.overlap else 'on'}: "
                      + ("illegal or does not fit" if d is None else signed_step(d)))
    if w.cand.graphs != "none":
        d = _flip(sc, w, graphs="none")
        out["graphs"] = "no graphs: " + ("illegal" if d is None else signed_step(d))
    return out


def _to_json(s: Scored) -> dict[str, Any]:
    return {"cand": asdict(s.cand), "anchor": s.anchor, "est": asdict(s.est), "mem": s.mem, "fits": s.fits,
            "broken": s.broken, "kind": s.kind}


def _from_json(d: dict[str, Any]) -> Scored:
    c = dict(d["cand"])
    rc = c["recompute"]
    c["recompute"] = (rc[0], tuple(rc[1]) if rc[1] is not None else None, rc[2], rc[3])
    return Scored(Candidate(**c), StepEstimate(**d["est"]), d["mem"], d["fits"], d["anchor"], d["broken"], d.get("kind"))


def search(ctx: Context) -> SearchResult:
    """The verdict for this intent: from the plan cache (command line only) or a fresh search."""
    # the profile's values (hash included), not only its path: an edited profile must re-plan
    key = {"intent": ctx.intent, "kept_pins": _kept_pins(ctx),  # pins hidden: another search
           "cluster": ctx.hw.get("cluster"), "micro_batch_size": ctx["micro_batch_size"],
           "optimizer_state": ctx["optimizer_state"], "optimizer_offload": ctx["optimizer_offload_fraction"],
           "fsdp": ctx["use_megatron_fsdp"], "offload_modules": ctx["offload_modules"]}
    # within one compile the same search can be asked for twice (a pinned intent's free search: by the decision
    # and by ``_search``); each asker gets its own copy of the verdict's lists
    memo_key = json.dumps(key, sort_keys=True, default=str)
    done = ctx.searches.get(memo_key)
    if done is None:
        done = ctx.searches[memo_key] = _cached_search(ctx, key)
    return replace(done, runners_up=list(done.runners_up), excluded=list(done.excluded), effects=dict(done.effects))


def _kept_pins(ctx: Context) -> list[str]:
    """The plan-knob pins the search keeps (the intent holds their values): a view that hides only pins the user
    did not write asks for the same search as the context itself, and one that hides every pin is the free one."""
    return [".".join(p) for p in HIDDEN_PINS if pinned_value(ctx, *p) is not None]


def _cached_search(ctx: Context, key: dict[str, Any]) -> SearchResult:
    """``search`` through the plan cache (command line only)."""
    cached = plancache.get(key)
    if cached is not None:
        try:
            return SearchResult(_from_json(cached["winner"]), [_from_json(d) for d in cached["runners_up"]],
                                [_from_json(d) for d in cached["excluded"]],
                                _from_json(cached["anchor"]) if cached["anchor"] else None,
                                cached["scored"], dict(cached["effects"]),
                                _from_json(cached["best"]) if cached.get("best") else None,
                                _from_json(cached["reference"]) if cached.get("reference") else None)
        except (KeyError, TypeError, ValueError, IndexError):
            pass  # an unreadable entry: search again
    res = _search(ctx)
    if ctx.goal == "throughput":
        res.effects = effects(ctx, res.winner)
    plancache.put(key, {"winner": _to_json(res.winner), "runners_up": [_to_json(s) for s in res.runners_up],
                               "excluded": [_to_json(s) for s in res.excluded],
                               "anchor": _to_json(res.anchor) if res.anchor else None,
                               "scored": res.scored, "effects": res.effects,
                               "best": _to_json(res.best) if res.best else None,
                               "reference": _to_json(res.reference) if res.reference else None})
    return res


# Pins of the knobs the search itself sets: a pin that only repeats what `auto` chooses must change nothing.
KNOB_PINS = tuple(("parallelism", k) for k in ("tp", "pp", "vpp", "ep", "etp", "cp")) + \
    (("moe", "dispatcher"), ("moe", "overlap"), ("moe", "delay_wgrad"))
# pins that select a recompute rung or a graph scope rather than a Candidate field's value
SPACE_PINS = (("recompute", "granularity"), ("recompute", "modules"), ("cuda_graphs", "impl"), ("cuda_graphs", "modules"))
HIDDEN_PINS = KNOB_PINS + SPACE_PINS
# the micro-batch size: searched where `auto` (decide.micro_batch), so a pin of it can repeat auto's choice too
MBS_PIN = ("training", "micro_batch_size")
# the pins a user writes as one choice: a recompute rung, a graph scope, each knob on its own, the micro-batch size
PIN_UNITS: tuple[tuple[tuple[str, str], ...], ...] = tuple((p,) for p in KNOB_PINS) + (SPACE_PINS[:2], SPACE_PINS[2:]) \
    + ((MBS_PIN,),)


class KnobPinsHidden:
    """The context as the search would see it had the user left the knobs of ``hidden`` (by default every one of
    ``HIDDEN_PINS``) ``auto``."""

    def __init__(self, ctx: Context, hidden: frozenset[tuple[str, ...]] = frozenset(HIDDEN_PINS)):
        object.__setattr__(self, "_ctx", ctx)
        object.__setattr__(self, "hidden", hidden)
        if MBS_PIN in hidden and ctx.intent["training"].get("micro_batch_size") != "auto":
            # a hidden micro-batch size is searched (decide.micro_batch reads the intent): the intent as if `auto`
            training = dict(ctx.intent["training"], micro_batch_size="auto")
            object.__setattr__(self, "intent", dict(ctx.intent, training=training))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ctx, name)

    def __setattr__(self, name: str, value: Any) -> None:  # what a search records (by_micro_batch) is the context's
        setattr(self._ctx, name, value)

    def __getitem__(self, key: str) -> Any:
        return self._ctx[key]

    def explicit(self, *path: str) -> bool:
        return tuple(path) not in self.hidden and self._ctx.explicit(*path)

    def pinned(self, *path: str) -> Any:
        return None if tuple(path) in self.hidden else self._ctx.pinned(*path)


def meets_pins(ctx: Context, cand: Candidate) -> bool:
    """Does ``cand`` already have every knob value the user pinned? Its recompute rung and graph scope must lie
    in the space the pins leave (``_rungs``, ``_graph_options``), selective modules in any order."""
    for section, knob in KNOB_PINS:
        value = pinned_value(ctx, section, knob)
        if value is None:
            continue
        have = getattr(cand, knob)
        if (bool(value) != have) if knob in ("overlap", "delay_wgrad") else (value != have):
            return False

    def unordered(rung: Any) -> tuple[Any, ...]:
        return (rung[0], frozenset(rung[1] or ()), *rung[2:])

    if any(pinned_value(ctx, *p) is not None for p in SPACE_PINS[:2]) and \
            unordered(cand.recompute) not in {unordered(r) for r in _rungs(ctx, cand.overlap)}:
        return False
    if any(pinned_value(ctx, *p) is not None for p in SPACE_PINS[2:]):
        free: Any = KnobPinsHidden(ctx)
        if cand.graphs not in _graph_options(ctx) or _graph_impl(ctx, cand.graphs) != _graph_impl(free, cand.graphs):
            return False
        mods = pinned_value(ctx, "cuda_graphs", "modules")
        if mods is not None and set(mods) != set(_graph_modules(free, cand.graphs)):
            return False
    return True


def _search(ctx: Context) -> SearchResult:
    """The search on the intent as written; where no shipped recipe matches and the user pinned plan knobs,
    the plan ``auto`` would choose is kept when it already has every pinned value. Without that, a pin that
    only repeats ``auto``'s choice could change the plan: it narrows the space the reference plan (the nearest
    recipe or the documented defaults) is drawn from, so the decision against the reference moves."""
    res = _search_pinned(ctx)
    if ctx.goal != "throughput" or res.anchor is not None or not any(pinned_value(ctx, *p) is not None for p in HIDDEN_PINS):
        return res
    free = search(KnobPinsHidden(ctx))  # type: ignore[arg-type]  # the decision's free search, when it made one
    if free.anchor is None and meets_pins(ctx, free.winner.cand) and not free.winner.broken:
        free.scored += res.scored
        # runners-up the user can run: the free search's that keep every pin, then the pinned search's
        keep = [r for r in free.runners_up if meets_pins(ctx, r.cand)]
        keep += [r for r in res.runners_up if r.cand != free.winner.cand and r.cand not in {k.cand for k in keep}]
        free.runners_up = keep[:3]
        return free
    return res


def _search_pinned(ctx: Context) -> SearchResult:
    """Enumerate, prune, score, rule-check and rank; see the module docstring."""
    sc = Scorer(ctx)
    knobs = _knobs(ctx)
    rungs_by_ov = {ov: _rungs(ctx, ov) for ov in (False, True)}

    # 1. every layout with its default knobs and lightest fitting rung -> a shortlist of layouts.
    # The step model runs only on layouts that fit; the others are scored only if none fits.
    first: list[Scored] = []
    frugal = _frugal_knob(knobs)
    defaults = {group: _default_knob(ctx, knobs, group) for group in (1, 2)}  # it reads only whether EP*ETP > 1
    # in layout order; a layout whose weights alone are over the limit (``Scorer.weight_bound``) fits with no knobs:
    # its stand-in is made only if the unfit are ranked (a 1024-GPU search has hundreds)
    unfit_or_heavy: list[tuple[Candidate, bool]] = []
    withheld: dict[int, bool] = {}  # by EP group size: flex_withheld of the default dispatcher
    no_rung = (None,) * 4
    for tp, pp, vpp, ep, etp, cp in layouts_for(ctx, sc.world):
        group = ep * etp
        disp, ov, dw, graphs = defaults[2 if group > 1 else 1]
        held = withheld.get(group)
        if held is None:
            held = withheld[group] = bool(flex_withheld(ctx, disp, group))
        cand = _candidate(tp, pp, vpp, ep, etp, cp, "alltoall" if held else disp, ov, dw, no_rung, graphs)
        if sc.weight_bound(cand):
            unfit_or_heavy.append((cand, True))
            continue
        cand = _stand_in(sc, cand, frugal, rungs_by_ov, light=True)
        if sc.total_gib(cand) > sc.limit:
            unfit_or_heavy.append((cand, False))
            continue
        if ctx.goal == "fit":  # fit ranks layouts by the least memory they reach: frugal knobs, heaviest rung
            cand = _with(cand, dispatcher=frugal[0], overlap=frugal[1], delay_wgrad=frugal[2], graphs=frugal[3],
                         recompute=rungs_by_ov[frugal[1]][-1])
        first.append(sc.score(cand))
    if ctx.goal == "fit" or len(first) < LAYOUT_SHORTLIST:
        unfit = [_stand_in(sc, cand, frugal, rungs_by_ov) if heavy else cand for cand, heavy in unfit_or_heavy]
        unfit.sort(key=sc.total_gib)
        first += [sc.score(c) for c in unfit[:LAYOUT_SHORTLIST]]
    first.sort(key=_rank_key(ctx.goal))
    shortlist = {(s.cand.tp, s.cand.pp, s.cand.vpp, s.cand.ep, s.cand.etp, s.cand.cp) for s in first[:LAYOUT_SHORTLIST]}
    fitting = [s for s in first if s.fits] if ctx.goal == "fit" else []
    if fitting:
        # fit: the winner's memory is in the least step any layout reaches, so every layout that reaches it is
        # searched (with the least-memory shortlist, should every plan of that step break a rule): a pin that keeps
        # the winner leaves it the best of a subset (the same plan)
        low = min(memory_step(s.mem["total_gib"]) for s in fitting)
        shortlist |= {(s.cand.tp, s.cand.pp, s.cand.vpp, s.cand.ep, s.cand.etp, s.cand.cp) for s in fitting
                      if memory_step(s.mem["total_gib"]) == low}

    # 2. the full knob product on the shortlisted layouts (and the anchor's)
    anchor = match_anchor(ctx)
    anchor_scored = None
    if anchor is not None:
        acand = anchor_candidate(ctx, anchor)
        pinned = acand != anchor_candidate(ctx, anchor, pins=False)
        # a shipped recipe run as shipped is measured to run: Scorer.fits allows it the estimate's measured error
        anchor_scored = sc.score(acand, anchor["recipe"] + (ADAPTED if pinned else ""))
        shortlist.add((acand.tp, acand.pp, acand.vpp, acand.ep, acand.etp, acand.cp))
    pool: dict[Candidate, Scored] = {s.cand: s for s in first}
    for sizes in shortlist:
        for disp, ov, dw, graphs in knobs:
            if flex_withheld(ctx, disp, sizes[3] * sizes[4]):
                continue
            cand = Candidate(*sizes, dispatcher=disp, overlap=ov, delay_wgrad=dw, recompute=(None,) * 4, graphs=graphs)
            cand = sc.lightest_fitting(cand, rungs_by_ov[ov])
            if cand not in pool:
                pool[cand] = sc.score(cand)
            if ctx.goal == "fit":
                # fit ranks by memory first: every heavier rung competes too (it needs less), so the plan is the
                # one a pinned recompute setting would find among its own (pinning auto's choice changes nothing)
                rungs = rungs_by_ov[ov]
                for rung in rungs[rungs.index(cand.recompute) + 1:]:
                    heavier = _with(cand, recompute=rung)
                    if heavier not in pool:
                        pool[heavier] = sc.score(heavier)
    if anchor_scored is not None:
        pool[anchor_scored.cand] = anchor_scored

    # 3. rank, then rule-check best first until the winner and three runners-up are legal
    ranked = sorted(pool.values(), key=_rank_key(ctx.goal))
    legal: list[Scored] = []
    excluded: list[Scored] = []
    seen: set[str] = set()
    least_broken: Scored | None = None  # where nothing is legal: the plan that breaks the fewest rules
    for s in ranked[:RULE_CHECK_LIMIT]:
        if s.cand.label() in seen:
            continue
        seen.add(s.cand.label())
        if sc.check(s):
            if least_broken is None or (len(s.broken or ()), complexity(s.cand)) < \
                    (len(least_broken.broken or ()), complexity(least_broken.cand)):
                least_broken = s
            if len(excluded) < 3:
                excluded.append(s)
        else:
            legal.append(s)
            if len(legal) >= 4 and (anchor_scored is None or anchor_scored.broken is not None):
                break
        # With four legal and three excluded nothing later can change the result (only legal[:4] and
        # excluded[:3] are kept; the anchor, when not reached, is checked below): stop instead of
        # rule-checking down to the anchor's rank (the 1024-GPU DeepSeek-V3 search checked 253, 222 legal).
        if len(legal) >= 4 and len(excluded) >= 3:
            break
    if anchor_scored is not None:
        sc.check(anchor_scored)
        anchor_scored.kind = "shipped"
    if not legal:  # nothing legal: the one that breaks the fewest rules, then the simplest (the user's pins are
        # the cause, and a feature the planner chose, e.g. a flex dispatcher, should not add messages of its own)
        legal = [least_broken] if least_broken is not None else ranked[:1]
    winner = best = legal[0]
    ref = anchor_scored
    if ctx.goal == "throughput" and (ref is None or ref.broken or not ref.fits):
        from mocompile.resolve.reference import fallback
        ref = fallback(ctx, sc, first, rungs_by_ov) or ref
        if ref is not None and ref.kind != "shipped" and ref.cand in pool:
            ranked = [ref if s.cand == ref.cand else s for s in ranked]  # one object per plan: `s is ref` below
    if ctx.goal == "throughput" and ref is not None and not ref.broken and ref.fits and winner.cand != ref.cand:
        winner = _beyond_margin(sc, ranked, ref, trust_margin(ctx.model)) or ref
        legal = [winner] + [s for s in legal if s.cand.label() != winner.cand.label()]
    elif ref is not None and winner.cand == ref.cand and winner is not ref:
        winner = ref
    return SearchResult(winner, legal[1:4], excluded, anchor_scored, sc.count, best=best, reference=ref)


def _beyond_margin(sc: Scorer, ranked: list[Scored], anchor: Scored, margin: float) -> Scored | None:
    """The best-ranked legal, fitting plan predicted faster than the shipped recipe by more than the
    margin for its distance from it (``required_ratio``); None keeps the shipped recipe."""
    # ``ranked`` orders fitting plans by step time times at most (1 + SIMPLICITY * 8): past this bound
    # nothing clears even a one-knob margin
    loosest = anchor.step * required_ratio(margin, 1) * (1 + SIMPLICITY * 8)
    for s in ranked:
        if s.fits and s.step >= loosest:
            break
        if s is anchor or not s.fits or s.step >= anchor.step * required_ratio(margin, knob_distance(s.cand, anchor.cand)):
            continue
        if not sc.check(s):
            return s
    return None


# A shipped recipe with this intent's pins laid over it (or an EP overlap it would not use here): no longer the
# measured plan, and explain does not call it measured.
ADAPTED = " with this intent's changes"
# The largest GPU count the smallest-GPU-count search tries (MEM001 says "more than" this beyond it).
MAX_GPUS = 16384


def min_gpus_that_fit(ctx: Context, limit_gpus: int = MAX_GPUS) -> int | None:
    """The smallest GPU count, in whole nodes, on which some layout fits under the planner's headroom with the
    knobs that need the least memory (``_frugal_knob``, the pins kept) at the heaviest recompute rung: the
    planner's own estimate and limit, so the planner finds a plan that fits there; with an offload, also under
    the host memory a node may pin (rule MEM003). None: no count up to ``limit_gpus`` does.

    Every node count counts, not only doublings (DeepSeek-V3 on H100 fits on 168 GPUs; doubling said 256). A
    layout's estimate never grows with the GPU count (data parallelism shards more of the optimizer state, and
    fewer micro-batches wait in the pipeline), so each layout is bisected over the node counts it divides,
    below the best count found so far."""
    gpn = ctx["gpus_per_node"]
    frugal = _frugal_at(ctx)
    scorers: dict[int, Scorer] = {}

    def fits(lay: Layout, world: int) -> bool:
        sc = scorers.get(world)
        if sc is None:
            sc = scorers[world] = Scorer(ctx, world)
        return _frugal_fits(sc, frugal(lay))

    best: int | None = None
    for lay in _shapes(ctx):
        step = math.lcm(gpn, lay.tp * lay.pp * lay.cp, lay.ep * lay.etp * lay.pp)  # GPU counts it runs on
        top = (limit_gpus if best is None else best - 1) // step
        if top < 1 or not fits(lay, top * step):
            continue
        lo, hi = 1, top  # the smallest multiple that fits: it fits at hi
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(lay, mid * step):
                hi = mid
            else:
                lo = mid + 1
        # and whose data parallelism divides the global batch (rule PAR007): a count the batch cannot run on is
        # no answer; more GPUs only lower the estimate, so the next multiples that divide it fit too
        while lo <= top and not batch_divides(ctx, lay, lo * step):
            lo += 1
        if lo <= top:
            best = lo * step
    return best


def batch_divides(ctx: Context, lay: Any, world: int) -> bool:
    """Does the global batch divide into whole micro-batches over ``lay``'s (a layout's or candidate's) data
    parallelism on ``world`` GPUs (rule PAR007)? True while the micro-batch size is still ``auto``. The smallest GPU
    count MEM001 names and the reference plans (``reference.fallback``) both keep to it."""
    split = batch_split(ctx, lay, world)
    return split is None or split[0] % split[1] == 0


def frugal_step(ctx: Context, world: int) -> float | None:
    """The predicted step time on ``world`` GPUs of the fastest layout that passes ``min_gpus_that_fit``'s test
    there (the least-memory knobs at the heaviest recompute rung, the context's levers, host memory included): what
    MEM001 compares a lever's GPU count with the plain count by. None: no layout fits there."""
    sc, frugal = Scorer(ctx, world), _frugal_at(ctx)
    steps = [sc.score(cand).step for cand in map(frugal, layouts_for(ctx, world)) if _frugal_fits(sc, cand)]
    return min(steps) if steps else None


def _frugal_fits(sc: Scorer, cand: Candidate) -> bool:
    """``min_gpus_that_fit``'s memory test of one candidate: under the headroom (not a shipped recipe's measured
    limit: no count but the intent's own runs a recipe as shipped), and where the plan offloads under the host memory
    a node may pin (``Scorer.host_fits``, rule MEM003)."""
    return sc.total_gib(cand) <= sc.limit and sc.host_fits(cand)


def _offload_host_limit(ctx: Context) -> float | None:
    """The host limit ``Scorer.host_fits`` applies: only where the plan offloads optimizer state or activations (the
    host estimate is 0 otherwise, so the test could not fail)."""
    return host_limit_gib(ctx) if ctx["optimizer_offload_fraction"] or ctx["offload_modules"] else None


def host_limit_gib(ctx: Context) -> float | None:
    """The host memory a node's offloaded optimizer state and activations may pin (rule MEM003): the catalogue's
    host memory per node times the host headroom (data/memory.yaml); None where the GPU entry names none."""
    host = ctx.hw.get("host_memory_gib")
    return float(host) * memory.limits()["host_headroom"] if host else None


def leaner_layouts(ctx: Context, model_parallel: int) -> set[Layout]:
    """The layouts with less model parallelism (TP x PP x CP) than ``model_parallel`` that fit on this intent's
    GPUs, with the knobs that need the least memory at the heaviest recompute rung (``min_gpus_that_fit``'s test)
    and the context's memory levers as set. A few estimates, no search."""
    sc, frugal = Scorer(ctx), _frugal_at(ctx)
    return {lay for lay in layouts_for(ctx, sc.world) if lay.tp * lay.pp * lay.cp < model_parallel
            and sc.total_gib(frugal(lay)) <= sc.limit}


def layout_fits(ctx: Context, cand: Candidate) -> bool:
    """Does ``cand``'s layout fit on this intent's GPUs with the knobs that need the least memory at the heaviest
    recompute rung (with the context's memory levers as set)?"""
    sc = Scorer(ctx)
    return sc.total_gib(_frugal_at(ctx)(cand)) <= sc.limit


def _frugal_at(ctx: Context) -> Any:
    """A layout (or a candidate's) with the knobs that need the least memory (``_frugal_knob``, the pins kept) at
    the heaviest recompute rung: the memory tests of ``min_gpus_that_fit``, ``leaner_layouts`` and ``layout_fits``."""
    disp, overlap, delay_wgrad, graphs = _frugal_knob(_knobs(ctx))
    rung = _rungs(ctx, overlap)[-1]
    return lambda lay: Candidate(lay.tp, lay.pp, lay.vpp, lay.ep, lay.etp, lay.cp, disp, overlap, delay_wgrad, rung,
                                 graphs)


def why_lost(loser: Scored, winner: Scored, anchor: Scored | None = None, goal: str = "throughput",
             model: dict[str, Any] | None = None) -> str:
    """One line: what makes ``loser`` worse than ``winner``; ``anchor``: the shipped recipe the search
    scored, against which a plan predicted faster than the winner fell short of its margin. Under goal fit or
    bring-up a faster plan loses on the goal's own order (memory; simplicity), and says so."""
    if loser.broken:
        return "breaks " + ", ".join(loser.broken)
    if not loser.fits:
        return f"does not fit ({loser.mem['total_gib']:.1f} GiB)"
    d = loser.step - winner.step
    pace = f"{abs(d):.2f} s/step {'faster' if d < 0 else 'slower'}"
    if goal == "fit" and memory_step(loser.mem["total_gib"]) > memory_step(winner.mem["total_gib"]):
        return (f"{loser.mem['total_gib'] - winner.mem['total_gib']:.1f} GiB more ({loser.mem['total_gib']:.1f} GiB; "
                f"goal fit takes the least memory first, in steps of the estimate's "
                f"{memory.limits()['measured_error']:.1%} error), {pace}")
    if goal == "bring-up" and d < 0:
        return (f"{pace}, but not the simplest legal plan (goal bring-up: least model parallelism, alltoall, "
                "no overlap, no graphs)")
    diff = {k: loser.est.terms.get(k, 0.0) - winner.est.terms.get(k, 0.0) for k in winner.est.terms if k != "a2a_total"}
    term, delta = max(diff.items(), key=lambda kv: kv[1])
    slower = loser.step - winner.step
    margin = trust_margin(model)
    d = knob_distance(loser.cand, anchor.cand) if anchor is not None else 0
    # by value, not identity: a verdict read back from the plan cache holds copies
    ref_won = anchor is not None and winner.anchor is not None and winner.cand == anchor.cand
    # a plan that clears the band as the chosen one does lost to the chosen plan, not to the band: said below
    cleared = anchor is not None and not ref_won and loser.step < anchor.step * required_ratio(margin, d)
    if anchor is not None and slower < 0 and not cleared:
        need = 1.0 - required_ratio(margin, d)
        rel = 1 - loser.step / anchor.step
        gain = f"{abs(rel):.1%}"
        side = "faster" if rel >= 0 else "slower"
        what = KIND_PHRASE.get(anchor.kind or "shipped", "the reference plan")
        than = (f"{-slower:.2f} s ({gain}) {side} than {what}" if ref_won else
                f"{-slower:.2f} s faster than the chosen plan and {gain} {side} than {what}")
        if round(-slower, 2) == 0.0:  # not "0.00 s (0.0%) faster": the two round to one step time
            than = f"the same step as {what}, to 0.01 s" if ref_won else \
                f"the same step as the chosen plan, to 0.01 s, and {gain} {side} than {what}"
        measured = ", which is measured" if (anchor.kind or "shipped") == "shipped" and \
            not (anchor.anchor or "").endswith(ADAPTED) else ""
        if margin == float("inf"):
            return f"predicted {than}{measured}: {unweighed(model)}"
        return (f"predicted {than}{measured}: within the model's {need:.1%} error for a plan {d} "
                f"knob{'s' if d != 1 else ''} away from it")
    if slower < 0 and goal == "throughput":
        extra = complexity(loser.cand) - complexity(winner.cand)
        if extra > 0 and weighted_step(loser) >= weighted_step(winner):
            gain = f"{-slower * 1000:.0f} ms" if -slower < 1 else f"{-slower:.2f} s"
            return (f"predicted {gain}/step faster, less than the {SIMPLICITY:.1%} a step each of its "
                    f"{extra} extra feature{'s' if extra != 1 else ''} must buy (flex dispatcher, overlap, graphs, "
                    "model parallelism: search.complexity)")
    step = signed_step(slower)
    if step == "same predicted step":  # no term to name: "(compute same predicted step)" read as nothing
        return "predicted the same step (to the millisecond): the chosen plan comes first in the planner's order"
    return f"predicted {step}/step ({TERM_NAMES.get(term, term)} {signed_step(delta)})"


KIND_PHRASE = {"shipped": "the shipped recipe", "near": "the nearest tuned recipe Bridge ships",
               "defaults": "the documented defaults"}


# The step-time terms (StepEstimate.terms) as explain names them
TERM_NAMES = {"compute": "compute", "a2a_exposed": "exposed all-to-all", "overlap_slowdown": "SMs lost to overlapped "
              "communication", "bubble": "pipeline bubble", "tp_cp": "TP/CP collectives",
              "host_bound": "host (CPU launch) time", "pp_p2p": "pipeline sends",
              "dp_exposed": "exposed DP gradient/parameter traffic", "recompute": "recompute",
              "act_offload": "exposed activation offload traffic",
              "param_gather": "Muon's parameter all-gather after its step (Megatron-Core "
              "LayerWiseDistributedOptimizer.allgather_params, not overlapped)"}


def largest_costs(s: Scored) -> str:
    """A plan's two largest step terms (compute aside), as explain names them: where a reference is kept whatever
    it costs, what its step is spent on (on more GPUs, the cost that grows)."""
    terms = sorted(((v, k) for k, v in s.est.terms.items() if k in TERM_NAMES and k != "compute" and v > 0.0),
                   reverse=True)[:2]
    return ", ".join(f"{TERM_NAMES[k]} {v:.2f} s" for v, k in terms)


# Where ``steptime.covers`` says the model does not cost the architecture, the margin is infinite: no predicted gain
# leaves a reference plan, and explain says why instead of quoting an error band that was not applied.
_UNCOSTED = ("the step-time model does not cost {attention} attention (steptime.covers), so no predicted gain "
             "leaves it")


def verdict(winner: Scored, ref: Scored | None, best: Scored | None, model: dict[str, Any] | None = None,
            goal: str = "throughput") -> str:
    """Why the chosen plan is the reference or left it, with both predicted step times and the error band
    (``required_ratio``, at ``trust_margin(model)``) the gain had to clear; empty without a reference. Goals fit and
    bring-up leave a reference by their own order (memory, simplicity), whatever its speed: said so."""
    if ref is None or ref.kind is None:
        return ""
    what = f"{KIND_PHRASE[ref.kind]} ({ref.anchor})"
    if ref.broken or not ref.fits:
        return f"{what} {why_lost(ref, winner)} here"
    margin = trust_margin(model)
    if winner.cand == ref.cand:
        if best is None or best.cand == ref.cand or best.step >= ref.step:
            return f"{what}: also the fastest plan found ({ref.step:.3f} s/step)"
        d = knob_distance(best.cand, ref.cand)
        found = (f"kept {what} at {ref.step:.3f} s/step: the fastest plan found ({best.cand.label()}) is predicted "
                 f"{best.step:.3f} s/step, {1 - best.step / ref.step:.1%} faster")
        if margin == float("inf"):
            spent = largest_costs(ref)
            return f"{found}, but {unweighed(model)}" + (f"; beside compute its step is {spent}" if spent else "")
        need = 1.0 - required_ratio(margin, d)
        return f"{found}, inside the model's {need:.1%} error for a plan {d} knob{'s' if d != 1 else ''} away"
    if goal != "throughput":
        change = winner.step / ref.step - 1
        return (f"left {what} ({ref.cand.label()}, {ref.step:.3f} s/step) by goal {goal}'s order, not by speed: "
                f"predicted {winner.step:.3f} s/step ({abs(change):.1%} {'slower' if change >= 0 else 'faster'})")
    d = knob_distance(winner.cand, ref.cand)
    need = 1.0 - required_ratio(margin, d)
    return (f"left {what} ({ref.cand.label()}, {ref.step:.3f} s/step): predicted {winner.step:.3f} s/step, "
            f"{1 - winner.step / ref.step:.1%} faster, beyond the model's {need:.1%} error for a plan {d} "
            f"knob{'s' if d != 1 else ''} away")


__all__ = ["SearchResult", "Scored", "Scorer", "anchors", "knob_distance", "layouts_for", "match_anchor",
           "MAX_GPUS", "batch_divides", "batch_split", "layout_fits", "without_idle_overlap", "weighted_step",
           "leaner_layouts", "min_gpus_that_fit", "required_ratio", "runs_as_shipped", "search", "settings",
           "shipped_plans", "why_lost"]
