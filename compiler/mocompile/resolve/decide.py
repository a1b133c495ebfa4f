"""Record the planner's winner in the plan: every field with who decided it and why.

The search (``resolve.search``) picks one candidate; this pass writes its settings into the
context. Pinned values keep the user's position; every other value gets the goal's reason, the
predicted effect of flipping it (from the step-time model) and the runners-up that lost.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from mocompile import memory, steptime
from mocompile.optimizer_state import adam_peak_bytes, keeps_fp32_master
from mocompile.resolve.context import Context
from mocompile.resolve.search import (
    KIND_PHRASE,
    MBS_PIN,
    PIN_UNITS,
    KnobPinsHidden,
    Scorer,
    SearchResult,
    host_limit_gib,
    knob_distance,
    layout_fits,
    leaner_layouts,
    match_anchor,
    meets_pins,
    pinned_value,
    pins,
    required_ratio,
    search,
    settings,
    trust_margin,
    unweighed,
    verdict,
    why_lost,
)

# Intent path of each field the planner sets (pinned values keep their position).
PATHS: dict[str, tuple[str, ...]] = {
    "tensor_model_parallel_size": ("parallelism", "tp"), "pipeline_model_parallel_size": ("parallelism", "pp"),
    "virtual_pipeline_model_parallel_size": ("parallelism", "vpp"), "expert_model_parallel_size": ("parallelism", "ep"),
    "expert_tensor_parallel_size": ("parallelism", "etp"), "context_parallel_size": ("parallelism", "cp"),
    "sequence_parallel": ("parallelism", "sequence_parallel"), "pipeline_model_parallel_layout": ("parallelism", "layout"),
    "moe_token_dispatcher_type": ("moe", "dispatcher"), "moe_flex_dispatcher_backend": ("moe", "dispatcher"),
    "moe_flex_dispatcher_num_sms": ("moe", "num_sms"), "overlap_moe_expert_parallel_comm": ("moe", "overlap"),
    "delay_wgrad_compute": ("moe", "delay_wgrad"), "moe_shared_expert_overlap": ("moe", "shared_expert_overlap"),
    "recompute_granularity": ("recompute", "granularity"), "recompute_modules": ("recompute", "modules"),
    "recompute_method": ("recompute", "method"), "recompute_num_layers": ("recompute", "num_layers"),
    "cuda_graph_impl": ("cuda_graphs", "impl"), "cuda_graph_modules": ("cuda_graphs", "modules"),
}
DERIVED = {"data_parallel_size": "world / (TP*PP*CP)", "expert_data_parallel_size": "world / (ETP*EP*PP)",
           "num_microbatches": "GBS / (MBS*DP)",
           "hybridep_ranks_per_domain": "HybridEP ranks per NVLink domain = min(NVLink domain, ETP*EP)",
           "overlap_p2p_comm": "interleaved pipeline overlaps p2p (Bridge's derivation)",
           "batch_p2p_comm": "plain pipeline batches p2p", "use_te_rng_tracker": "CUDA graphs need TE's RNG tracker"}
GOAL_WHY = {"throughput": "fastest predicted plan",
            "fit": "lowest predicted memory (in steps as wide as the estimate's measured error: plans in one step "
                   "count as equal), then fastest",
            "bring-up": "simplest legal plan (alltoall, no overlap, no graphs, least model parallelism)"}


# what a goal other than throughput orders plans by, where the plan it chose is slower than a reference
GOAL_ORDER = {"fit": "less memory first", "bring-up": "the simplest plan first, not the fastest"}

MBS_CHOICES = (1, 2, 4, 8, 16)


def _goal_why(ctx: Context, w: Any, res: SearchResult | None = None) -> str:
    """What put the winner first, as the goal orders plans; said as it is where no plan fits (the memory error says
    why), where pins overrule what bring-up would choose (a pinned dispatcher, overlap or graphs), or where throughput
    kept its reference plan over a faster prediction (``verdict`` gives both numbers): not "fastest" then."""
    if not w.fits:
        return (f"no plan fits under the {memory.usable_gib(ctx.hw['memory_gib']):.1f} GiB limit (MEM001 says what "
                f"would); the first of goal {ctx.goal}'s order")
    ref, best = (res.reference, res.best) if res is not None else (None, None)
    if ctx.goal == "throughput" and ref is not None and ref.kind in KIND_PHRASE and ref.cand == w.cand \
            and best is not None and best.cand != w.cand and best.step < w.step:
        return f"{KIND_PHRASE[ref.kind]}, kept over a faster prediction (the decision says why)"
    why = GOAL_WHY[ctx.goal]
    if ctx.goal == "bring-up":
        pinned = [name for name, (section, key) in (("dispatcher", ("moe", "dispatcher")), ("overlap", ("moe", "overlap")),
                                                    ("graphs", ("cuda_graphs", "impl")))
                  if ctx.pinned(section, key) is not None]
        if pinned:
            why = f"{why[:-1]}; {', '.join(pinned)} as pinned)"
    return why


def micro_batch(ctx: Context) -> SearchResult | None:
    """``training.micro_batch_size: auto``: search the plan at each micro-batch size the batch allows and keep
    the fastest that fits, 1 (the documented default) unless another is predicted faster by more than the
    model's error for one knob. A larger micro-batch launches the same kernels for more tokens: the first cure
    for a launch-bound step (the GPU waiting for the host), at the cost of activation memory and pipeline
    bubbles. Only goal throughput searches; fit and bring-up keep 1 (least memory). Returns the search at the
    chosen size (so that ``plan`` does not search it again), or None where nothing was searched."""
    if ctx.intent["training"].get("micro_batch_size") != "auto":
        return None
    if ctx.goal != "throughput":
        ctx.set("micro_batch_size", 1, "goal", f"auto under goal {ctx.goal}: 1, the least activation memory",
                path=("training", "micro_batch_size"))
        return None
    gbs, world = ctx["global_batch_size"], ctx["world_size"]
    steps: dict[int, float | None] = {}
    results: dict[int, SearchResult] = {}
    for mbs in MBS_CHOICES:
        if mbs > 1 and gbs % mbs:
            continue
        ctx.set("micro_batch_size", mbs, "goal", "trial")
        results[mbs] = search(ctx)
        w = results[mbs].winner
        steps[mbs] = w.step if w.fits and not w.broken else None
        if mbs * world > gbs:
            break  # no layout runs more than one micro-batch per rank beyond this
    margin = trust_margin(ctx.model)
    base = steps.get(1)
    fitting = {m: s for m, s in steps.items() if s is not None}
    best = min(fitting, key=lambda m: (fitting[m], m)) if fitting else 1
    need = required_ratio(margin, 1) if margin != float("inf") else 0.0
    if base is not None and best != 1 and fitting[best] > base * need:
        chosen, why = 1, (f"kept 1: {best} is predicted {fitting[best]:.3f} s/step against {base:.3f} s, "
                          f"{1 - fitting[best] / base:.1%} faster, inside the model's {1 - need:.0%} error for one knob")
    else:
        chosen = best
        why = "fastest predicted that fits" + (f", {1 - fitting[best] / base:.1%} faster than 1, beyond the model's "
                                               f"{1 - need:.0%} error" if base and best != 1 else "")
    ctx.by_micro_batch = {m: results[m] for m in fitting}  # tune measures the sizes the model cannot separate
    listed = ", ".join(f"{m}: {'does not fit or breaks a rule' if s is None else f'{s:.3f} s'}" for m, s in steps.items())
    ctx.set("micro_batch_size", chosen, "goal", f"auto: {why} (predicted step per micro-batch size: {listed})",
            rejected=[(m, "not faster" if s is not None else "does not fit") for m, s in steps.items() if m != chosen],
            path=("training", "micro_batch_size"))
    return results.get(chosen)


OFFLOAD_SHARES = (0.25, 0.5, 0.75, 1.0)


Lever = tuple[str, float, bool, tuple[str, ...]]
"""(training.optimizer_state, training.optimizer_offload share, parallelism.fsdp, recompute.offload_modules)"""

# Fine-grained activation offload rungs: the attention inputs Bridge's DeepSeek-V3 FSDP recipes offload, then the
# expert MLP's too.
ACT_OFFLOAD_RUNGS: tuple[tuple[str, ...], ...] = (("core_attn", "attn_proj"),
                                                  ("core_attn", "attn_proj", "expert_fc1", "moe_act"))


def lever_rungs(ctx: Context) -> list[Lever]:
    """The memory levers the user left ``auto``, in the guidance's order (Megatron-Bridge's memory ladder:
    cheapest first): the precision-aware optimizer's lower-precision state (no time cost: TE's FusedAdam runs the
    same pass), fine-grained activation offload (host-link traffic under the compute), optimizer offload
    (host-link traffic and a CPU step every iteration), its least share first, then Megatron-FSDP (weights and
    gradients sharded over data parallelism, gathered every micro-batch); each state or offload rung only if it
    holds less than the rungs before it at the optimizer step's peak.
    Only what the target can run: Adam (not Muon), TE for the precision-aware optimizer and activation offload,
    optimizer offload with fp32 state (rules OPT004-OPT006), FSDP without optimizer offload."""
    t = ctx.intent["training"]
    if ctx["optimizer"] != "adam":
        return []
    state_auto, offload_auto = t.get("optimizer_state", "auto") == "auto", t.get("optimizer_offload", "auto") == "auto"
    fsdp_auto = ctx.intent["parallelism"].get("fsdp", "auto") == "auto"
    act_auto = ctx.intent["recompute"].get("offload_modules", "auto") == "auto"
    fsdp, act = bool(ctx["use_megatron_fsdp"]), tuple(ctx["offload_modules"])
    rungs: list[Lever] = []
    fp8_master = keeps_fp32_master(ctx["fp8"])  # remainders save nothing there
    if state_auto and ctx["te_version"] is not None and not ctx["optimizer_offload_fraction"]:
        rungs += [(s, 0.0, fsdp, act) for s in ("fp32-remainders", "bf16-moments")]
    if offload_auto and (state_auto or ctx["optimizer_state"] == "fp32") and not fsdp:  # FSD005
        rungs += [("fp32", f, fsdp, act) for f in OFFLOAD_SHARES]
    # each rung must hold less at the step's peak than where the plan stands and than every rung before it (a
    # recipe may start on a lower-precision state; bf16 moments peak above fp32 state: optimizer_state.py)
    best = adam_peak_bytes(ctx["optimizer_state"], ctx["optimizer_offload_fraction"], fp8_master)
    kept: list[Lever] = []
    for s, f, d, a in rungs:
        b = adam_peak_bytes(s, f, fp8_master)
        if b < best:
            kept.append((s, f, d, a))
            best = b
    state, share = ctx["optimizer_state"], ctx["optimizer_offload_fraction"]
    if act_auto and not act and ctx["te_version"] is not None:
        first_offload = next((i for i, r in enumerate(kept) if r[1]), len(kept))
        kept[first_offload:first_offload] = [(state, share, fsdp, mods) for mods in ACT_OFFLOAD_RUNGS]
    if fsdp_auto and not fsdp and not share:
        kept.append((state, 0.0, True, act))
    return kept


@contextlib.contextmanager
def lever_trial(ctx: Context, state: str, share: float, fsdp: bool | None = None,
                act: tuple[str, ...] | None = None) -> Iterator[None]:
    """Plan with one rung of the memory levers set (``fsdp``, ``act``: None keeps the plan's), then put the
    settings back as they were."""
    keys = ("optimizer_state", "optimizer_offload_fraction", "use_megatron_fsdp", "offload_modules")
    saved = {k: ctx.s[k] for k in keys}
    fsdp = bool(ctx["use_megatron_fsdp"]) if fsdp is None else fsdp
    act = tuple(ctx["offload_modules"]) if act is None else act
    try:
        ctx.set("optimizer_state", state, "goal", "trial")
        ctx.set("optimizer_offload_fraction", share, "goal", "trial")
        ctx.set("use_megatron_fsdp", fsdp, "goal", "trial")
        ctx.set("offload_modules", list(act), "goal", "trial")
        yield
    finally:
        ctx.s.update(saved)


def lever_label(state: str, share: float, fsdp: bool, act: tuple[str, ...] = ()) -> str:
    """A rung as the intent spells it."""
    return " + ".join([state] + ([f"activation offload {','.join(act)}"] if act else [])
                      + ([f"offload {share:g}"] if share else []) + (["FSDP"] if fsdp else []))


def _lever_kind(ctx: Context, rung: Lever) -> str:
    """Which lever a rung climbs: a larger rung of the same one is only heavier."""
    if rung[2] and not ctx["use_megatron_fsdp"]:
        return "fsdp"
    if rung[1] and not ctx["optimizer_offload_fraction"]:
        return "offload"
    if rung[3] and not ctx["offload_modules"]:
        return "activations"
    return "state"


def _host_over(ctx: Context, mem: dict[str, Any]) -> str:
    """Why a rung's plan pins more host memory per node than it may (rule MEM003), or '' if it does not."""
    limit = host_limit_gib(ctx)
    node = mem.get("host_gib", 0.0) * ctx["gpus_per_node"]
    return f"{node:.0f} GiB of host memory per node over {limit:.0f} (MEM003)" if limit and node > limit else ""


def climb_levers(ctx: Context, res: SearchResult) -> SearchResult:
    """Where the plan does not fit, the memory levers (both goals: a plan that does not fit never pays). Goal
    ``fit`` stops at the first rung that fits, in the guidance's order; ``throughput`` takes the first fitting
    rung of each lever (a heavier rung of the same lever only costs more) and keeps the fastest of them, since the
    levers cost time very differently (a CPU Adam step against FSDP's gathers). None fits: the levers stay off
    and MEM001 reports the plan. A plan that fits but breaks a rule (nothing legal: the pins' own error, OVL011 for
    two MTP layers under a pinned EP overlap) is left as it is: a lever frees memory and makes no rule hold, and
    each rung's search would rule-check hundreds of plans for nothing (seconds of a pre-commit hook)."""
    if res.winner.fits:
        return res
    base_state, base_gib, tried = ctx["optimizer_state"], res.winner.mem["total_gib"], []
    found: list[tuple[Lever, SearchResult, tuple[Any, Any]]] = []
    done: set[str] = set()  # levers whose next rung cannot pay
    for rung in lever_rungs(ctx):
        kind = _lever_kind(ctx, rung)
        if kind in done:
            continue
        # a heavier rung of a lever that already fits costs more for the same plan, but the memory it frees can
        # let a faster plan fit (DeepSeek-V3 on 64 B200s: offload 0.25 fits only TP8 alltoall at 70.7 s/step, 0.5
        # fits TP2 PP8 HybridEP at 51.8 s): goal throughput climbs on while each rung is faster than the last
        lighter = [t.winner.step for r, t, _ in found if _lever_kind(ctx, r) == kind]
        with lever_trial(ctx, *rung):
            trial = first_search(ctx)
        # micro_batch_size auto: each rung's trial sets the size its plan was searched at; the chosen rung's
        # must be the one emitted, not the last rung tried
        batch = ctx.s["micro_batch_size"], ctx.by_micro_batch
        w = trial.winner
        host = _host_over(ctx, w.mem)
        # rules the plan broke before any lever (the pins' own: OVL001 for EP 1 with overlap, say) do not make a rung
        # fail: the rung is judged on memory, and those rules are reported as they are
        own = [r for r in (w.broken or []) if r not in (res.winner.broken or [])]
        tried.append(f"{lever_label(*rung)}: {w.mem['total_gib']:.1f} GiB"
                     + (f", {w.step:.2f} s/step" if w.fits and not own and not host else "")
                     + (f", but {host}" if host else "")
                     + (f", but breaks {', '.join(own)}" if w.fits and own and not host else ""))
        if w.fits and not own and not host:
            if lighter and w.step >= min(lighter):
                done.add(kind)  # no faster than the lighter rung: neither will a heavier one be
                continue
            found.append((rung, trial, batch))
            if ctx.goal != "throughput":
                break
    if found:
        (state, share, fsdp, act), trial, batch = min(found, key=lambda f: f[1].winner.step) \
            if ctx.goal == "throughput" else found[0]
        ctx.s["micro_batch_size"], ctx.by_micro_batch = batch
        w, ladder = trial.winner, "; ".join(tried)
        how = "the fastest rung that fits, of those tried" if ctx.goal == "throughput" else \
            "tried in order until one fits (the last)"
        ctx.set("optimizer_state", state, "goal",
                f"no plan fits with {base_state} Adam state on the GPU ({base_gib:.1f} GiB); the memory ladder "
                f"(precision-aware state, activation offload, optimizer offload, Megatron-FSDP), {how}: {ladder}",
                path=("training", "optimizer_state"))
        cost = w.est.terms.get("optimizer", 0.0)
        least = "the least offload share that fits"
        fastest = "the offload share whose plan is fastest (a lighter one fits, slower: see optimizer_state)"
        ctx.set("optimizer_offload_fraction", share, "goal",
                (f"{least if share <= min(r[1] for r, _, _ in found if r[1]) else fastest}: "
                 f"{share:g} of Adam's state and step on the host CPU, "
                 f"optimizer step {cost:.2f} s of {w.step:.2f} s/step (host link and CPU Adam)") if share
                else "not needed: another lever fits", path=("training", "optimizer_offload"))
        if fsdp != ctx["use_megatron_fsdp"]:
            exposed = w.est.terms.get("dp_exposed", 0.0)
            ctx.set("use_megatron_fsdp", fsdp, "goal",
                    f"Megatron-FSDP: weights and gradients sharded over data parallelism ({w.mem['total_gib']:.1f} GiB), "
                    f"gathered every micro-batch, {exposed:.2f} s of {w.step:.2f} s/step exposed",
                    path=("parallelism", "fsdp"))
        if list(act) != list(ctx["offload_modules"]):
            moved = w.est.terms.get("act_offload", 0.0)
            ctx.set("offload_modules", list(act), "goal",
                    f"fine-grained activation offload of {', '.join(act)}: their inputs wait in host memory between "
                    f"forward and backward ({w.mem['total_gib']:.1f} GiB), {moved:.2f} s of {w.step:.2f} s/step of "
                    "host-link traffic exposed", path=("recompute", "offload_modules"))
        return trial
    if tried:
        d = ctx.s["optimizer_state"]
        ctx.set("optimizer_state", d.value, d.source, f"{d.reason}; no rung of the memory ladder fits either: "
                + "; ".join(tried), path=("training", "optimizer_state"))
    return first_search(ctx) if tried else res


def fsdp_pays(ctx: Context, res: SearchResult) -> SearchResult:
    """Goal ``throughput`` with ``parallelism.fsdp: auto``, a plan that fits and needs model parallelism
    (TP x PP x CP > 1), decided against the documented defaults (a tuned recipe, shipped or moved here, is
    measured and kept): Megatron-FSDP shards weights and gradients over data parallelism, which may let a plan
    with less model parallelism fit. Searched only where some layout with less of it fits with FSDP and not
    without (a few estimates first); taken when the plan found uses less model parallelism, fits only with FSDP
    and is not predicted slower: the guidance's default, the smallest model parallelism that fits."""
    w = res.winner
    mp = w.cand.tp * w.cand.pp * w.cand.cp
    if (ctx.goal != "throughput" or ctx["optimizer"] != "adam" or ctx["use_megatron_fsdp"] or mp == 1
            or ctx["optimizer_offload_fraction"] or ctx.intent["parallelism"].get("fsdp", "auto") != "auto"
            or not w.fits or w.broken or (w.kind in ("shipped", "near") and w.anchor is not None)):
        return res
    state = ctx["optimizer_state"]
    with lever_trial(ctx, state, 0.0, True):
        only_fsdp = leaner_layouts(ctx, mp)
    only_fsdp -= leaner_layouts(ctx, mp)
    if not only_fsdp:
        return res
    # at the plan's micro-batch size: a trial that also chose its own size would change two knobs at once and
    # step past the micro-batch decision's own preference for 1 (Qwen3-235B on 64 H100s with alltoall pinned: auto
    # kept 1, the FSDP trial took 8 and won, while 8 without FSDP was faster still, and pinning 8 gave that plan)
    with lever_trial(ctx, state, 0.0, True):
        trial = search(ctx)
    t = trial.winner
    tmp = t.cand.tp * t.cand.pp * t.cand.cp
    # FSDP must be what lets the plan's layout fit: one that fits without it is the search's own to weigh
    if not t.fits or t.broken or tmp >= mp or t.step > w.step or layout_fits(ctx, t.cand):
        return res
    ctx.set("use_megatron_fsdp", True, "goal",
            f"Megatron-FSDP: {t.cand.label()} at {t.step:.2f} s/step, {t.mem['total_gib']:.1f} GiB, against "
            f"{w.cand.label()} at {w.step:.2f} s/step without it: less model parallelism (TP x PP x CP {tmp} "
            f"against {mp}), which fits only with FSDP, and not slower: the guidance's default, the smallest model "
            "parallelism that fits", path=("parallelism", "fsdp"))
    return trial


def first_search(ctx: Context) -> SearchResult:
    """The micro-batch search where the size is ``auto``, else the plain search."""
    return micro_batch(ctx) or search(ctx)


# How many whole decisions a pinned intent's relaxation may make (each is a search and its lever and FSDP trials):
# one per subset of the pinned units tried, smallest first, so every subset of four pinned units at most.
RELAX_DECISIONS = 16

Decided = tuple[SearchResult, dict[str, Any], Any]
"""A whole decision: its search result, the settings it made (levers, FSDP, micro-batch) and its per-size searches."""


def _decide(ctx: Context) -> SearchResult:
    """The search and the decisions after it (memory levers, Megatron-FSDP). Where the user pinned plan knobs and
    no shipped recipe serves the intent, the plan is the decision made on the fewest of the pins that reproduces
    all of them (``_relaxed``): a pin that only repeats what the decision without it chooses must change nothing.
    Without this, such a pin narrows the space the reference plan (the nearest recipe or the documented defaults)
    is drawn from, or the one plan a later decision tests (GLM-4.5-Air on 256 H100s: pinning auto's recompute
    modules let an FSDP plan through that auto's own FSDP trial turned down; Qwen3-235B on 48 H200s with TP 2 and
    ETP 2 pinned: pinning auto's DeepEP moved the reference to DeepEP and kept it)."""
    units = [u for u in PIN_UNITS if any(pinned_value(ctx, *p) is not None for p in u)]
    if units == [(MBS_PIN,)]:
        # the micro-batch size alone: its search would repeat the decision at every size (2-3x the lint time of
        # the most common intent), and alone it keeps auto's plan (benchmarks/pin_invariance.py, first part)
        units = []
    own = _decided(ctx, ctx)
    w = own[0].winner
    # a relaxed plan keeps every pin, so it lies in the space the pinned decision searched: where that found
    # nothing that fits and breaks no rule, neither can a relaxation (and the 16 decisions would be wasted)
    relax = ctx.goal == "throughput" and units and w.fits and not w.broken and match_anchor(ctx) is None
    res, state, by_mb = (_relaxed(ctx, units, own) if relax else None) or own
    if pinned_value(ctx, *MBS_PIN) is not None and state.get("micro_batch_size") is not ctx.s.get("micro_batch_size"):
        # a decision that searched the size the user pinned (and found it): the size stays the user's, as written
        state = dict(state, micro_batch_size=ctx.s["micro_batch_size"])
        by_mb = None
    ctx.s.clear()
    ctx.s.update(state)
    ctx.by_micro_batch = by_mb
    return res


def _relaxed(ctx: Context, units: list[tuple[tuple[str, str], ...]], own: Decided) -> Decided | None:
    """The decision on the smallest subset of the pinned units (the first in ``PIN_UNITS`` order among subsets of
    one size) whose plan already has every pinned value, or None where only all of them do (or the subsets tried,
    ``RELAX_DECISIONS``, run out). Smallest first: a further pin of a value that plan already has leaves it in place
    (the subset that reproduced the other pins reproduces that one too), unless a subset as small that keeps the
    new pin reproduces every pin first (``benchmarks/pin_invariance.py``, second part, counts such moves). Where the decision
    on every pin (``own``) reaches the same plan, that one is returned: its reference was drawn from the space the
    user's pins leave, and explain reports it."""
    tried, mbs = 0, pinned_value(ctx, *MBS_PIN)
    for size in range(len(units)):
        for kept in itertools.combinations(units, size):
            if tried >= RELAX_DECISIONS:
                return None
            tried += 1
            hidden = frozenset(p for u in units if u not in kept for p in u)
            res, state, by_mb = _decided(ctx, KnobPinsHidden(ctx, hidden))
            w = res.winner
            if not (meets_pins(ctx, w.cand) and w.fits and not w.broken) or \
                    mbs is not None and state["micro_batch_size"].value != mbs:
                continue
            if own[0].winner.cand == w.cand:
                return own
            # the runners-up and rule-broken plans the user could have written, and the fastest plan found that
            # keeps every pin
            keep = [r for r in res.runners_up if meets_pins(ctx, r.cand)]
            gone = [r for r in res.excluded if meets_pins(ctx, r.cand)]
            best = res.best
            if best is not None and not meets_pins(ctx, best.cand):
                best = min([w, *(r for r in keep if r.fits and not r.broken)], key=lambda r: r.step)
            return replace(res, runners_up=keep, excluded=gone, best=best), state, by_mb
    return None


def _decided(ctx: Context, view: Any) -> Decided:
    """One whole decision on ``view``, with the settings it made; the context's own settings are left as found."""
    saved, by_mb = dict(ctx.s), ctx.by_micro_batch
    res = fsdp_pays(view, climb_levers(view, first_search(view)))
    made = (res, dict(ctx.s), ctx.by_micro_batch)
    ctx.s.clear()
    ctx.s.update(saved)
    ctx.by_micro_batch = by_mb
    return made


# The fused kernels Bridge's perf recipes turn on (resolve/tuning.py host_and_fusion), by the name explain gives them.
FUSIONS = (("moe_permute_fusion", "token permutation"), ("moe_router_fusion", "routing"),
           ("apply_rope_fusion", "RoPE"), ("cross_entropy_loss_fusion", "cross-entropy"))


def _unfused_caveat(ctx: Context) -> str:
    """Why a bring-up or fit plan's step time is optimistic: the step model costs these kernels as the fused ones of
    Bridge's perf recipes and this project's throughput runs, which those goals leave at Megatron's default, off. How
    much that costs is measured nowhere but in one published row (Qwen3-30B-A3B on 16 H100s, alltoall without fused
    permutation: 41.25 s, which the model predicts 8.8 % short), so the estimate says it is a lower bound rather than
    guess. Without TE the model's local-spec factor was fitted on unfused runs: no caveat."""
    off = [label for key, label in FUSIONS if not ctx[key]]
    if ctx.goal == "throughput" or ctx["te_version"] is None or not off:
        return ""
    return (f"; a lower bound: the model costs {', '.join(off)} as fused kernels, which goal {ctx.goal} leaves off "
            "(resolve/tuning.py host_and_fusion)")


def plan(ctx: Context) -> None:
    """Search, then record the winner's settings with reasons."""
    res = _decide(ctx)
    w = res.winner
    est = w.est
    head = (f"{_goal_why(ctx, w, res)}: {est.step_s:.2f} s/step, {est.tflops_per_gpu:.0f} TFLOPS/GPU, "
            f"{w.mem['total_gib']:.1f} GiB (of {res.scored} candidates scored)")
    share = ctx["optimizer_offload_fraction"]
    if share:  # not in the plan's label, and it can be most of the step: say it with the step it is part of
        head += (f", with {share:g} of Adam's state and step on the host CPU ({est.terms.get('optimizer', 0.0):.2f} s of "
                 "the step: see optimizer_offload_fraction)")
    said = verdict(w, res.reference, res.best, ctx.model, ctx.goal)
    if said and res.reference is not None and res.reference.kind != "shipped":  # a shipped recipe is said below
        head += f"; {said}"
    if w.anchor and w.kind == "shipped":
        head += f"; the tuned recipe Bridge ships ({w.anchor})"
        if not steptime.validated(ctx.model):
            head += f" ({unweighed(ctx.model)})"
    elif res.anchor is not None:
        lost = why_lost(res.anchor, w) if res.anchor.broken or not res.anchor.fits else \
            "slower" if ctx.goal == "throughput" or res.anchor.step >= w.step else f"goal {ctx.goal}: {GOAL_ORDER[ctx.goal]}"
        gap = res.anchor.step - w.step  # the shipped recipe may be faster only where the pins break it or it does not fit
        than = f"{abs(gap):.2f} s/step {'faster' if gap >= 0 else 'slower'}"
        head += f"; predicted {than} than the shipped {res.anchor.anchor} ({res.anchor.step:.2f} s, {lost})"
    rejected = [(r.cand.label(), why_lost(r, w, res.reference, ctx.goal, ctx.model)) for r in res.runners_up + res.excluded]
    part = f"part of the chosen plan ({est.step_s:.2f} s/step; see tensor_model_parallel_size)"
    effects = res.effects
    values = settings(ctx, w.cand)
    shipped = Scorer(ctx).shipped(w.cand)
    usable = memory.usable_gib(ctx.hw["memory_gib"])
    for name, value in values.items():
        path = PATHS.get(name)
        if path and ctx.explicit(*path) and ctx.pinned(*path) is not None:
            ctx.set(name, value, "user", "pinned in the recipe", path=path)
            continue
        if name in DERIVED:
            ctx.set(name, value, "derived", DERIVED[name])
        elif name == "tensor_model_parallel_size":
            ctx.set(name, value, "goal", head, rejected)
        elif name in ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend"):
            why = f"{part}; alternatives on this layout: {effects['dispatcher']}" if effects.get("dispatcher") else part
            ctx.set(name, value, "goal", why)
        elif name == "overlap_moe_expert_parallel_comm":
            why = part + (f"; {effects['overlap']}" if "overlap" in effects else "")
            if ctx.goal != "throughput":
                why = f"goal {ctx.goal}: no EP overlap (it keeps one more micro-batch of activations alive)"
            ctx.set(name, value, "goal", why, rules=["OVL014"] if value and w.est.notes else None)
        elif name == "cuda_graph_impl":
            why = part + (f"; {effects['graphs']}" if "graphs" in effects else "")
            if ctx["te_version"] is None:
                why = "no Transformer Engine in the target stack: no TE graphs"
            ctx.set(name, value, "goal", why)
        elif name == "moe_shared_expert_overlap":
            ctx.set(name, value, "derived", "off under EP overlap and with flex dispatchers (OVL010, Bridge's "
                    "apply_flex_dispatcher_backend); else the provider's default", rules=["OVL010"] if w.cand.overlap else None)
        elif name == "moe_flex_dispatcher_num_sms":
            ctx.set(name, value, "derived", "flex dispatcher SM budget used by the shipped perf recipes" if value else
                    "NCCL EP picks its own SM count (Megatron-Core passes 0 to Transformer Engine)"
                    if w.cand.dispatcher == "ncclep" else "no flex dispatcher")
        elif name.startswith("recompute_"):
            if not w.fits:
                why = "nothing fits: heaviest recompute"
            elif w.mem["total_gib"] > usable:
                why = (f"the shipped recipe's ({shipped}): {w.mem['total_gib']:.1f} GiB, over the {usable:.1f} GiB "
                       "usable, run as shipped (see memory_limit_gib)")
            elif w.kind in ("shipped", "near") and w.anchor:
                # a tuned recipe's rung (or, moved here, the lightest that fits its layout), not a search for the lightest
                why = (f"the reference plan's ({w.anchor}) recompute: {w.mem['total_gib']:.1f} GiB <= {usable:.1f} GiB "
                       "usable")
            else:
                why = f"lightest recompute that fits: {w.mem['total_gib']:.1f} GiB <= {usable:.1f} GiB usable"
            ctx.set(name, value, "goal", why)
        elif name == "pipeline_model_parallel_layout":
            ctx.set(name, value, "derived", "balanced layout: embedding and loss counted as a layer each"
                    if value else "even split (or no pipeline)", rules=["PP002", "PP003"] if value else None)
        else:
            ctx.set(name, value, "goal", part)
    ctx.set("step_time_estimate_s", round(w.step, 4), "derived", "mocompile step-time model (steptime.py)"
            + _unfused_caveat(ctx))
    margin = trust_margin(ctx.model)
    ref = res.reference if res.reference is not None and res.reference.kind else None
    ctx.planner = {
        "goal": ctx.goal, "candidates_scored": res.scored, "trust_margin": None if margin == float("inf") else margin,
        # train_step_s: the step without Bridge's scheduled collection, which the launchers' step probe
        # (MOCOMPILE_METRICS: train_step alone) never times; probe, tune and diagnose compare their runs with it
        "chosen": dict(w.summary(), train_step_s=round(w.step - est.terms.get("manual_gc", 0.0), 3),
                       terms_s={k: round(v, 3) for k, v in est.terms.items()}, pins=pins(ctx, w.cand)),
        "runners_up": [dict(r.summary(), why_lost=why_lost(r, w, res.reference, ctx.goal, ctx.model), pins=pins(ctx, r.cand))
                       for r in res.runners_up],
        "excluded": [dict(r.summary(), why_lost=why_lost(r, w, goal=ctx.goal)) for r in res.excluded],
        "anchor": None if res.anchor is None else dict(res.anchor.summary(), broken=res.anchor.broken or [],
                                                         fits=res.anchor.fits),
        "reference": None if ref is None else dict(ref.summary(), kind=ref.kind, pins=pins(ctx, ref.cand)),
        "best": None if res.best is None else dict(res.best.summary(), pins=pins(ctx, res.best.cand)),
        "decision": None if ref is None else {
            "kind": ref.kind, "kept": w.cand == ref.cand, "distance": knob_distance(w.cand, ref.cand),
            "required_ratio": round(required_ratio(margin, knob_distance(w.cand, ref.cand)), 4)
            if margin != float("inf") else 0.0, "verdict": said,
            # the fastest plan found and the band it had to clear (it did, or the reference was kept)
            "best_distance": None if res.best is None else knob_distance(res.best.cand, ref.cand),
            "best_required_ratio": None if res.best is None or margin == float("inf") else
            round(required_ratio(margin, knob_distance(res.best.cand, ref.cand)), 4)},
        "model": "steptime " + steptime.__name__,
    }
    if ctx.by_micro_batch:  # micro_batch_size auto: every plan names its size, so tune runs it as predicted
        for entry in [ctx.planner["chosen"], ctx.planner["reference"], ctx.planner["best"], *ctx.planner["runners_up"]]:
            if entry is not None and "pins" in entry:
                entry["pins"]["training.micro_batch_size"] = ctx["micro_batch_size"]
        ctx.planner["micro_batch"] = [
            dict(r.winner.summary(), micro_batch_size=m,
                 pins=dict(pins(ctx, r.winner.cand), **{"training.micro_batch_size": m}))
            for m, r in sorted(ctx.by_micro_batch.items()) if m != ctx["micro_batch_size"]]
    ctx.set("shipped_recipe", shipped, "derived",
            "the Bridge perf recipe this plan runs as shipped: its knobs (at most its CUDA-graph buffers), batch "
            "shape, forced balance, BF16 gradient reduction and TE (data/anchors.yaml)" if shipped else
            "no Bridge perf recipe run as shipped: the planner's headroom applies")
