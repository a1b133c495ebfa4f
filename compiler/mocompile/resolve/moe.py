"""Dispatcher, EP overlap, delayed wgrad and shared-expert overlap."""

from __future__ import annotations

from mocompile.resolve.context import Context

FLEX = {"deepep", "hybridep"}
DEFAULT_SMS = {"deepep": 20, "hybridep": 32}
SMALL_EP = 4  # at or below: the dispatcher is second-order, overlap has little to hide


def _apply_dispatcher(ctx: Context, choice: str, source: str, reason: str, rejected=None) -> None:
    path = ("moe", "dispatcher") if source == "user" else None
    if choice in FLEX:
        ctx.set("moe_token_dispatcher_type", "flex", source, reason, rejected, path=path)
        ctx.set("moe_flex_dispatcher_backend", choice, source, reason, path=path)
    else:
        ctx.set("moe_token_dispatcher_type", choice, source, reason, rejected, path=path)
        ctx.set("moe_flex_dispatcher_backend", None, "derived",
                "no flex backend: set explicitly so Bridge's inert alltoall+deepep default cannot mislead")
    group = ctx["expert_model_parallel_size"] * ctx["expert_tensor_parallel_size"]
    ctx.set("hybridep_ranks_per_domain", min(ctx["nvlink_domain"], group), "derived",
            "HybridEP ranks per NVLink domain = min(NVLink domain, ETP*EP)")
    sms = ctx.pinned("moe", "num_sms")
    if sms is not None and ctx.explicit("moe", "num_sms"):
        ctx.set("moe_flex_dispatcher_num_sms", sms, "user", "pinned in the recipe", path=("moe", "num_sms"))
    elif choice in FLEX:
        ctx.set("moe_flex_dispatcher_num_sms", DEFAULT_SMS[choice], "derived",
                f"{choice} default used by the shipped perf recipes; one SM knob, no deprecated aliases")
    else:
        ctx.set("moe_flex_dispatcher_num_sms", None, "derived", "no flex dispatcher")


def dispatcher(ctx: Context) -> None:
    """alltoall for bring-up and small EP; the GPU's preferred flex backend otherwise."""
    pinned = ctx.pinned("moe", "dispatcher")
    if pinned is not None and ctx.explicit("moe", "dispatcher"):
        _apply_dispatcher(ctx, pinned, "user", "pinned in the recipe")
        return
    group = ctx["expert_model_parallel_size"] * ctx["expert_tensor_parallel_size"]
    preferred = ctx.hw["dispatchers"]["preferred"].replace("flex-", "")
    if ctx.goal == "bring-up":
        _apply_dispatcher(ctx, "alltoall", "goal", "bring-up: alltoall is always legal and needs no DeepEP build",
                          [(preferred, "bring-up first")])
        return
    if ctx.goal == "fit":
        _apply_dispatcher(ctx, "alltoall", "goal", "fit: flex backends keep more tensors and buffers alive",
                          [(preferred, "extra dispatcher buffers")])
        return
    if group <= SMALL_EP:
        _apply_dispatcher(ctx, "alltoall", "goal",
                          f"ETP*EP = {group} <= {SMALL_EP}: the dispatcher is second-order at small EP",
                          [(preferred, "no gain expected at small EP")])
        return
    rejected = []
    order = [preferred] + [b.replace("flex-", "") for b in ctx.hw["dispatchers"]["legal"]
                           if b.startswith("flex-") and b.replace("flex-", "") != preferred]
    for cand in order:
        if cand not in ctx["gpu_flex_backends"]:
            rejected.append((cand, "not supported on this GPU"))
            continue
        trial_group_rules = ctx.errors_if(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend=cand,
                                          hybridep_ranks_per_domain=min(ctx["nvlink_domain"], group),
                                          moe_flex_dispatcher_num_sms=DEFAULT_SMS[cand])
        if trial_group_rules:
            rejected.append((cand, "breaks " + ", ".join(trial_group_rules)))
            continue
        _apply_dispatcher(ctx, cand, "hardware",
                          f"throughput on {ctx.hw['id']}: {cand} is the preferred backend for this GPU", rejected)
        return
    _apply_dispatcher(ctx, "alltoall", "hardware", "no flex backend is legal here; alltoall fallback", rejected)


def overlap(ctx: Context) -> None:
    """EP overlap, then the settings that depend on it."""
    path = ("moe", "overlap")
    group = ctx["expert_model_parallel_size"] * ctx["expert_tensor_parallel_size"]
    pinned = ctx.pinned(*path)
    if pinned is not None and ctx.explicit(*path):
        ctx.set("overlap_moe_expert_parallel_comm", pinned, "user", "pinned in the recipe", path=path)
    elif ctx.goal in ("bring-up", "fit"):
        ctx.set("overlap_moe_expert_parallel_comm", False, "goal",
                "bring-up: no overlap until the plain run is correct" if ctx.goal == "bring-up"
                else "fit: overlap keeps one more micro-batch of activations alive", [(True, f"goal {ctx.goal}")])
    else:
        blockers = ctx.errors_if(overlap_moe_expert_parallel_comm=True)
        nodes_spanned = -(-group // ctx["gpus_per_node"])
        if blockers:
            ctx.set("overlap_moe_expert_parallel_comm", False, "goal", "EP overlap would break " + ", ".join(blockers),
                    [(True, ", ".join(blockers))], rules=blockers)
        elif ctx["num_microbatches"] < 2 and ctx["pipeline_model_parallel_size"] == 1:
            ctx.set("overlap_moe_expert_parallel_comm", False, "goal",
                    "one micro-batch per step: the combined 1F1B schedule has nothing to overlap", [(True, "OVL014")])
        elif group <= SMALL_EP and nodes_spanned <= 2 and ctx["moe_token_dispatcher_type"] == "alltoall":
            ctx.set("overlap_moe_expert_parallel_comm", False, "goal",
                    f"EP {group} with alltoall on {nodes_spanned} node(s): the all-to-all is a small share of the "
                    "step; measured at EP 2 on one NVLink host (2xH100 trial, 2xH200 benchmarks/results): "
                    "no speed-up, +4-8% memory",
                    [(True, "no measurable gain at small intranode EP")])
        else:
            ctx.set("overlap_moe_expert_parallel_comm", True, "goal",
                    f"throughput: hide the EP all-to-all (ETP*EP = {group}) behind compute")
    shared_expert(ctx)
    ctx.user_or("delay_wgrad_compute", ("moe", "delay_wgrad"), False, "goal",
                "off unless asked: isolate plain overlap first", [(True, "opt-in")])


def shared_expert(ctx: Context) -> None:
    """Shared-expert overlap: the provider's default, but never together with EP overlap.

    Recomputed whenever EP overlap changes (the recompute pass may turn overlap off)."""
    spath = ("moe", "shared_expert_overlap")
    sp = ctx.pinned(*spath)
    if sp is not None and ctx.explicit(*spath):
        ctx.set("moe_shared_expert_overlap", sp, "user", "pinned in the recipe", path=spath)
    elif ctx["overlap_moe_expert_parallel_comm"]:
        ctx.set("moe_shared_expert_overlap", False, "derived",
                "off under EP overlap (the two cannot run together); set explicitly because some providers default it on",
                rules=["OVL010"])
    elif ctx["moe_token_dispatcher_type"] == "flex":
        ctx.set("moe_shared_expert_overlap", False, "derived",
                "Bridge's apply_flex_dispatcher_backend turns it off for the flex dispatcher")
    elif not ctx["moe_shared_expert_intermediate_size"]:
        ctx.set("moe_shared_expert_overlap", False, "model", "no shared experts to overlap")
    else:
        on = bool(ctx.model["shared_expert_overlap_default"]) and ctx["moe_token_dispatcher_type"] == "alltoall"
        ctx.set("moe_shared_expert_overlap", on, "model", "the model provider's default" if on else "provider default off")
