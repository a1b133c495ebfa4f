"""The reference plan a throughput search must beat by more than the model's error.

The step-time model cannot tell two plans apart within its own measured error, so the search does
not simply take its fastest prediction: it compares it with a reference plan and leaves the
reference only for a predicted gain beyond that error (``search.required_ratio``). The reference
is, in order of the evidence behind it:

1. ``shipped``: the perf recipe Bridge ships for the same architecture numbers, GPU, precision and
   optimizer (whatever the model is called), scaled by data parallelism as Bridge's harness does;
2. ``near``: the nearest shipped recipe otherwise (the same architecture at another GPU count,
   precision or GPU, else the nearest architecture; a recipe of the same optimizer first, else one of
   another), moved onto the nearest legal layout here and
   keeping its dispatcher, overlap, recompute and graph choices where this setting offers them;
3. ``defaults``: Megatron-Bridge's documented defaults (its MoE performance guidance): TP and the
   expert group inside the NVLink domain, then the least model parallelism that fits without the
   recompute the guidance keeps for last (``moe``, full), the largest expert group among those (EP
   over TP for experts); alltoall for small EP (4 or fewer ranks inside an NVLink domain), a flex
   backend (HybridEP first) for a larger group or one that spans domains; EP overlap only for an all-to-all across
   NVLink domains whose exposed share of the step is larger than the model's error; no delayed wgrad and no CUDA graphs; VPP
   with PP; the lightest recompute that fits (selective before full); CP only when it is needed to fit.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from mocompile.resolve.context import Context
from mocompile.steptime import Candidate

# Catalogue keys that describe where numbers came from or how Bridge names a model, not its architecture.
_NOT_SHAPE = frozenset({"id", "display", "hf_id", "bridge", "sources", "unverified", "params_b", "active_params_b",
                        "shared_expert_overlap_default", "resized", "vendored_config"})
# How far (sum of |log ratio| of total and active parameters, layers, width and experts) another architecture's
# recipe may be and still serve as the reference: the nearest catalogue families lie 0.96 (DeepSeek-V3 /
# Kimi-K2) to 2.0 apart; beyond that a tuned recipe says little about this setting and the defaults serve.
NEAR_LIMIT = 2.0
# The largest expert group Bridge's guidance calls small EP, where the dispatcher is second-order and alltoall the
# default (``docs/training/communication-overlap.md``: "EP <= 4 with alltoall"); every shipped recipe with a
# flex backend has a larger group or spans NVLink domains.
SMALL_EP = 4
# How many plans, nearest first, a reference may be tried on before the defaults (or nothing) serve: the nearest
# layout can break a rule of this setting that the layout grid does not know (a global batch that does not divide
# over its data parallelism on 24 GPUs), and the next one then is the reference.
SETTLE_TRIES = 8
# Anchors withheld from every search (benchmarks/plan_quality.py: model-only and leave-one-family-out runs).
WITHHELD: set[str] = set()


def shape_key(model: dict[str, Any]) -> str:
    """The architecture numbers a tuned recipe depends on, whatever the model is called: every catalogue
    key but names and provenance. The dense FFN width counts only where dense layers exist."""
    shape = {k: v for k, v in model.items() if k not in _NOT_SHAPE and v is not None}
    if not shape.get("first_k_dense"):
        shape.pop("ffn_hidden_size", None)
    return json.dumps(shape, sort_keys=True, default=str)


@functools.cache
def _catalogue(model_id: str) -> tuple[str, tuple[float, ...]] | None:
    """(shape key, size) of a catalogue model, once per process: every search compares against the same
    few models the shipped recipes were tuned for."""
    from mocompile.catalogue import _defaults, models

    spec = models().get(model_id)
    if spec is None:
        return None
    model = _defaults({"id": model_id, **spec})
    return shape_key(model), _size(model)


def _catalogue_shape(model_id: str) -> str | None:
    found = _catalogue(model_id)
    return None if found is None else found[0]


def _usable(ctx: Context, any_optimizer: bool = False) -> list[dict[str, Any]]:
    """The recipes that may serve as evidence: no variants, none withheld, each runs on its own GPU count; of
    this intent's optimizer only (a shipped reference: Muon recipes serve Muon intents, Adam recipes Adam
    intents) unless ``any_optimizer`` (a near reference, ``nearest``)."""
    from mocompile.resolve.search import anchors

    optimizer = ctx["optimizer"]
    return [a for a in anchors() if not a["variant"] and (any_optimizer or a.get("optimizer", "adam") == optimizer)
            and a["recipe"] not in WITHHELD and _runs_on_its_own_count(a)]


def _runs_on(a: dict[str, Any], gpus: int) -> bool:
    """Does recipe ``a``'s layout divide ``gpus`` (TP x PP x CP and ETP x EP x PP)?"""
    return not (gpus % (a["tp"] * a["pp"] * a["cp"]) or gpus % (a["ep"] * a["etp"] * a["pp"]))


def _runs_on_its_own_count(a: dict[str, Any]) -> bool:
    """A few shipped rows cannot run on their own GPU count (EP x PP above it): no evidence for anything."""
    return _runs_on(a, a["gpus"])


def exact(ctx: Context) -> dict[str, Any] | None:
    """The shipped recipe for this architecture, GPU, precision and optimizer whose layout divides the GPU
    count: the one for this GPU count, else the largest below it (Bridge's harness weak-scales by DP)."""
    shape = shape_key(ctx.model)
    found = [a for a in _usable(ctx) if a["gpu"] == ctx["gpu"] and a["precision"] == ctx["precision"]
             and _catalogue_shape(a["model"]) == shape and _runs_on(a, ctx["world_size"])]
    if not found:
        return None
    below = [a for a in found if a["gpus"] <= ctx["world_size"]]
    return max(below, key=lambda a: a["gpus"]) if below else min(found, key=lambda a: a["gpus"])


def same_shape(ctx: Context, a: dict[str, Any]) -> bool:
    """Was recipe ``a`` tuned for this intent's architecture numbers?"""
    return _catalogue_shape(a["model"]) == shape_key(ctx.model)


def _size(model: dict[str, Any]) -> tuple[float, ...]:
    from mocompile.memory import parameters

    p = parameters(model)
    total = sum(p.values())
    active = total - p["experts"] * (1 - model["moe_router_topk"] / model["num_moe_experts"])
    return (total, active, model["num_layers"], model["hidden_size"], model["num_moe_experts"])


def _precision_distance(a: str, b: str) -> float:
    """How differently Bridge tunes two precisions' recipes of one setting. MXFP8 is its own class (full-iteration
    CUDA graphs, EP overlap, delayed wgrad on Blackwell); NVFP4 recipes keep the knobs of the setting's BF16/FP8
    ones (``tests/test_reference.py`` counts them), and of the rest MXFP8 is nearest NVFP4, the other block-scaled
    Blackwell format."""
    if a == b:
        return 0.0
    if "mxfp8" not in (a, b):
        return 1.0
    return 1.5 if "nvfp4" in (a, b) else 2.0


def nearest(ctx: Context) -> dict[str, Any] | None:
    """The nearest shipped recipe by (architecture, optimizer, GPU, precision, GPU count), architecture first.

    A recipe tuned with another optimizer still serves, after every recipe of this optimizer at the same
    architecture distance: its layout was tuned for the architecture and cluster, which the optimizer changes
    only through the optimizer step and its state (``moved`` re-fits the recompute rung, ``_settle`` refuses a
    plan that breaks a rule or does not fit here). Without it an Adam DeepSeek-V3 intent never sees Kimi-K2's
    recipes (Muon), the only architecture within ``NEAR_LIMIT`` of it, and falls back to the defaults."""
    from mocompile.catalogue import gpus

    shape, size = shape_key(ctx.model), _size(ctx.model)
    if min(size) <= 0:  # an impossible model (the rules refuse it): no size to compare
        return None
    gpu = ctx.hw
    best, best_key = None, None
    for a in _usable(ctx, any_optimizer=True):
        found = _catalogue(a["model"])
        if found is None:
            continue
        other_shape, other_size = found
        same = other_shape == shape
        arch = 0.0 if same else sum(abs(math.log(x / y)) for x, y in zip(size, other_size, strict=False))
        if arch > NEAR_LIMIT:
            continue
        arch += not same  # any same-architecture recipe comes first
        ahw = gpus().get(a["gpu"], {})
        gpu_d = 0 if a["gpu"] == ctx["gpu"] else 1 if bool(ahw.get("mnnvl")) == bool(gpu.get("mnnvl")) else 2
        prec_d = _precision_distance(a["precision"], ctx["precision"])
        other_optimizer = a.get("optimizer", "adam") != (ctx["optimizer"] or "adam")
        key = (round(arch, 6), other_optimizer, gpu_d, prec_d, abs(math.log2(a["gpus"] / ctx["world_size"])),
               a["recipe"])
        if best_key is None or key < best_key:
            best, best_key = a, key
    return best


def moved(ctx: Context, a: dict[str, Any], layouts: list[Any]) -> Candidate:
    """A recipe moved onto this setting: the legal layout nearest its own (log2 distance per size), its
    dispatcher, overlap, delayed wgrad, recompute and graphs where this setting offers them."""
    return moves(ctx, a, layouts, 1)[0]


def moves(ctx: Context, a: dict[str, Any], layouts: list[Any], n: int) -> list[Candidate]:
    """``moved`` onto the ``n`` layouts nearest the recipe's own, nearest first: where the nearest breaks a rule of
    this setting (the global batch does not divide over its data parallelism, say), the next one serves."""
    from mocompile.resolve.search import anchor_candidate

    cand = anchor_candidate(ctx, a)
    sizes = ("tp", "pp", "vpp", "ep", "etp", "cp")

    def far(lay: Any) -> tuple[float, ...]:
        # among equally near layouts keep the model parallelism (what made the recipe fit) and give up
        # expert parallelism first
        return (sum(abs(math.log2(getattr(lay, k) / getattr(cand, k))) for k in sizes),
                -lay.tp * lay.pp * lay.cp, *(getattr(lay, k) for k in sizes))

    return [_moved_knobs(ctx, a, replace(cand, **{k: getattr(lay, k) for k in sizes}))
            for lay in sorted(layouts, key=far)[:n]]


def _moved_knobs(ctx: Context, a: dict[str, Any], cand: Candidate) -> Candidate:
    """The recipe's knobs on a layout of this setting, where this setting offers them."""
    from mocompile.catalogue import gpus
    from mocompile.resolve.search import flex_across_nvl8_blackwell, flex_withheld, without_idle_overlap

    # moved onto a group that spans Blackwell NVL8 nodes, a flex backend the recipe itself ran inside one node is not
    # offered there (search.flex_withheld); one the recipe itself ran across such nodes is NVIDIA's tuned choice: kept
    ahw = gpus().get(a["gpu"], {})
    if flex_withheld(ctx, cand.dispatcher, cand.ep * cand.etp) and \
            not flex_across_nvl8_blackwell(a["dispatcher"], a["ep"] * a["etp"], ahw, ahw.get("nvlink_domain", 8)):
        cand = replace(cand, dispatcher=default_dispatcher(ctx, cand.ep * cand.etp), num_sms=None)
    # anchor_candidate already gave it a dispatcher and graph scopes this setting offers
    if cand.delay_wgrad and ctx["te_version"] is None:
        cand = replace(cand, delay_wgrad=False)
    return without_idle_overlap(ctx, cand)  # on its new layout


def fallback(ctx: Context, sc: Any, first: list[Any], rungs_by_ov: dict[bool, list[Any]]) -> Any:
    """The scored reference where no shipped recipe matches (or it breaks a rule or does not fit here):
    the nearest shipped recipe moved onto this setting, else the documented defaults. Legal and fitting,
    or None."""
    from mocompile.resolve.search import batch_divides, layouts_for

    # only layouts whose data parallelism divides the global batch (rule PAR007, which the layout grid leaves to
    # the rules): on 24 GPUs most of the grid does not, and a reference that breaks a rule serves nobody
    layouts = [lay for lay in layouts_for(ctx, sc.world) if batch_divides(ctx, lay, sc.world)]
    first = [s for s in first if batch_divides(ctx, s.cand, sc.world)]
    near = nearest(ctx)
    if near is not None and layouts:
        for cand in moves(ctx, near, layouts, SETTLE_TRIES):
            s = _settle(sc, cand, rungs_by_ov, f"{near['recipe']}, moved to this setting", "near")
            if s is not None:
                return s
    for default in defaults_ranked(ctx, sc, first, rungs_by_ov):
        s = _settle(sc, default, rungs_by_ov, "Megatron-Bridge MoE performance guidance", "defaults")
        if s is not None:
            return s
    return None


def _settle(sc: Any, cand: Candidate, rungs_by_ov: dict[bool, list[Any]], label: str, kind: str) -> Any:
    """Score ``cand`` at its lightest fitting recompute rung (its own rung when that fits); None when it
    breaks a rule or does not fit."""
    if sc.total_gib(cand) > sc.limit:
        cand = sc.lightest_fitting(cand, rungs_by_ov[cand.overlap])
    s = sc.score(cand, label)
    s.kind = kind
    if not s.fits or sc.check(s):
        return None
    return s


def defaults(ctx: Context, sc: Any, first: list[Any], rungs_by_ov: dict[bool, list[Any]] | None = None) -> Candidate | None:
    """Bridge's documented defaults (``docs/training/moe-optimization.md``: keep EP x TP inside the NVLink
    domain, minimise model parallelism, prefer EP over TP for experts; the recompute skill: fit first with the
    smallest model parallelism, then selective recompute, full recompute only if still out of memory) on the
    fitting layout they describe. Each fitting layout gets the guidance's knobs (its dispatcher for the EP
    group's span, no overlap, no delayed wgrad, no CUDA graphs) at the lightest recompute rung that fits with
    them; then, in order: no recompute the guidance keeps for last (``moe`` or full: more model parallelism
    comes before it; none and selective without ``moe`` count alike), TP and the expert group (ETP x EP) each
    inside the NVLink domain where any such layout fits (Megatron folds them into separate groups), the least
    model parallelism (TP x PP x CP), the largest expert group (fewest local experts), then the one the model
    ranks first. EP
    overlap only where the all-to-all crosses NVLink domains (``docs/training/communication-overlap.md``: most
    promising at larger EP with inter-node all-to-all) and the model puts more of the step in exposed
    all-to-all than its own error."""
    return next(defaults_ranked(ctx, sc, first, rungs_by_ov), None)


def defaults_ranked(ctx: Context, sc: Any, first: list[Any],
                    rungs_by_ov: dict[bool, list[Any]] | None = None) -> Iterator[Candidate]:
    """``defaults``' plans in the guidance's order, best first, at most ``SETTLE_TRIES``: where the first breaks a rule
    of this setting (a global batch that does not divide over its data parallelism), the next one is the reference.
    Lazy: each plan's overlap is weighed (a step estimate) only when it is asked for."""
    from mocompile.resolve.search import _bools, _graph_options, trust_margin

    fitting = [s for s in first if s.fits]
    if not fitting:
        return
    nvl = ctx["nvlink_domain"]
    graphs = "none" if "none" in _graph_options(ctx) else _graph_options(ctx)[0]
    overlap = _bools(ctx, ("moe", "overlap"), [False])[0]
    delay_wgrad = _bools(ctx, ("moe", "delay_wgrad"), [False])[0]

    def guided(c: Candidate) -> Candidate:
        first_choice = None
        for disp in default_dispatchers(ctx, c.ep * c.etp):
            cand = replace(c, dispatcher=disp, overlap=overlap, delay_wgrad=delay_wgrad, graphs=graphs, num_sms=None)
            if rungs_by_ov is None:
                return cand
            cand = sc.lightest_fitting(cand, rungs_by_ov[overlap])
            # selective recompute before full (the recompute guidance): where the guidance's dispatcher needs the
            # recompute it keeps for last (its buffers, say), the next dispatcher it names that does not serves
            if _light(cand) and sc.total_gib(cand) <= sc.limit:
                return cand
            first_choice = first_choice or cand
        assert first_choice is not None
        return first_choice

    def order(item: tuple[int, Candidate]) -> tuple[Any, ...]:
        rank, c = item  # ``first`` is ranked: ties keep rank
        outside = not (c.tp <= nvl and c.ep * c.etp <= nvl)
        return (not _light(c), outside, c.tp * c.pp * c.cp, -c.ep * c.etp, rank)

    guided_all = [guided(s.cand) for s in fitting]
    fit = [c for c in guided_all if rungs_by_ov is None or sc.total_gib(c) <= sc.limit] or guided_all
    offered_overlap = True in _bools(ctx, ("moe", "overlap"), [False, True])

    def with_overlap(cand: Candidate) -> Candidate:
        if not cand.overlap and offered_overlap and cand.ep * cand.etp > nvl \
                and (rungs_by_ov is None or cand.recompute in rungs_by_ov[True]):
            est = sc.score(cand).est
            if est.terms.get("a2a_exposed", 0.0) > trust_margin(ctx.model) * est.step_s:
                return replace(cand, overlap=True)
        return cand

    ordered = [c for _, c in sorted(enumerate(fit), key=order)]
    yield from map(with_overlap, ordered[:SETTLE_TRIES])


def _light(cand: Candidate) -> bool:
    """Uses none of the recompute the guidance keeps for last: ``moe`` (it replays dispatch and combine) and
    full recompute."""
    gran, mods = cand.recompute[0], cand.recompute[1] or ()
    return gran != "full" and "moe" not in mods


def default_dispatcher(ctx: Context, group: int) -> str:
    """Bridge's MoE guidance (``docs/training/moe-optimization.md``, the dispatcher-selection skill): alltoall
    for small EP, where the dispatcher is second-order (``SMALL_EP`` or fewer ranks inside one NVLink domain);
    a flex backend for a larger group or one that spans domains, HybridEP first: the guidance's choice on multi-node NVLink,
    and on 8-GPU NVLink nodes, where the guidance says to A/B DeepEP against HybridEP, the backend Bridge's
    tuned perf recipes settled on (``scripts/performance/configs``: HybridEP in most H100, B200 and B300 recipes
    with a flex backend; ``tests/test_reference.py`` counts them). Whichever of those this setting offers, else
    the first it offers."""
    return default_dispatchers(ctx, group)[0]


def default_dispatchers(ctx: Context, group: int) -> list[str]:
    """The dispatchers this setting offers, in the guidance's order for an expert group of ``group`` ranks
    (``default_dispatcher`` is the first): alltoall alone for small EP; HybridEP, DeepEP, then alltoall otherwise."""
    from mocompile.resolve.search import _dispatchers, flex_withheld

    offered = [d for d in _dispatchers(ctx) if not flex_withheld(ctx, d, group)]
    if group <= 1 or group <= min(SMALL_EP, ctx["nvlink_domain"]) and not ctx.hw.get("mnnvl"):
        want = ["alltoall"]
    else:
        want = ["hybridep", "deepep", "alltoall"]
    return [d for d in want if d in offered] or offered[:1]


__all__ = ["NEAR_LIMIT", "SETTLE_TRIES", "SMALL_EP", "WITHHELD", "default_dispatcher", "default_dispatchers",
           "defaults", "defaults_ranked", "exact", "fallback", "moved", "moves", "nearest", "same_shape",
           "shape_key"]
