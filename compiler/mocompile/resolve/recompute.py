"""Recompute plan: the lightest rung of the ladder that fits, and the final estimate."""

from __future__ import annotations

from typing import Any

from mocompile import memory
from mocompile.resolve import moe
from mocompile.resolve.context import Context
from mocompile.resolve.parallelism import HEADROOM

Rung = tuple[str | None, list[str] | None, str | None, int | None]


def ladder(ctx: Context, overlap: bool) -> list[Rung]:
    """Overlap-safe rungs first (MCore allows only selective recompute under EP overlap)."""
    gg = bool(ctx["moe_grouped_gemm"])
    mla = bool(ctx["multi_latent_attention"])
    shared = bool(ctx["moe_shared_expert_intermediate_size"]) and not ctx["moe_shared_expert_overlap"]
    rungs: list[Rung] = [(None, None, None, None), ("selective", ["layernorm"], None, None)]
    if gg:
        rungs.append(("selective", ["layernorm", "moe_act"], None, None))
    heavy = ["layernorm"] + (["moe_act"] if gg else []) + (["mla_up_proj"] if mla else ["core_attn"]) \
        + (["shared_experts"] if shared else []) + ([] if ctx["first_k_dense"] == 0 else ["mlp"])
    rungs.append(("selective", heavy, None, None))
    if not overlap:
        rungs.append(("selective", ["layernorm", "moe"] + (["mla_up_proj"] if mla else ["core_attn"]), None, None))
        rungs.append(("full", None, "uniform", 1))
    return rungs


def _estimate(ctx: Context, rung: Rung, **extra: Any) -> float:
    cfg = ctx.values()
    cfg.update(recompute_granularity=rung[0], recompute_modules=rung[1], recompute_method=rung[2],
               recompute_num_layers=rung[3], **extra)
    return memory.estimate(ctx.model, cfg)["total_gib"]


def _legal(ctx: Context, rung: Rung) -> list[str]:
    return ctx.errors_if(recompute_granularity=rung[0], recompute_modules=rung[1], recompute_method=rung[2],
                         recompute_num_layers=rung[3])


def _set(ctx: Context, rung: Rung, source: str, reason: str, rejected: list[tuple[Any, str]], path=None) -> None:
    for name, value in zip(("recompute_granularity", "recompute_modules", "recompute_method", "recompute_num_layers"),
                           rung):
        ctx.set(name, value, source, reason, rejected if name == "recompute_granularity" else None, path=path)


def plan(ctx: Context) -> None:
    gpath, mpath = ("recompute", "granularity"), ("recompute", "modules")
    gran = ctx.pinned(*gpath) if ctx.explicit(*gpath) else None
    mods = ctx.pinned(*mpath) if ctx.explicit(*mpath) else None
    method = ctx.pinned("recompute", "method")
    nlayers = ctx.pinned("recompute", "num_layers")
    if gran is not None:
        if gran == "none":
            _set(ctx, (None, None, method, nlayers), "user", "pinned in the recipe", [], gpath)
        elif gran == "full":
            _set(ctx, ("full", None, method, nlayers), "user", "pinned in the recipe", [], gpath)
        elif mods is not None:
            _set(ctx, ("selective", list(mods), method, nlayers), "user", "pinned in the recipe", [], gpath)
        else:
            _choose(ctx, [r for r in ladder(ctx, bool(ctx["overlap_moe_expert_parallel_comm"])) if r[0] == "selective"],
                    "user-pinned selective; modules chosen")
        if mods is not None:
            ctx.set("recompute_modules", list(mods), "user", "pinned in the recipe", path=mpath)
        for key, name in (("method", "recompute_method"), ("num_layers", "recompute_num_layers")):
            if ctx.explicit("recompute", key):
                ctx.set(name, ctx.pinned("recompute", key), "user", "pinned in the recipe", path=("recompute", key))
        return
    overlap = bool(ctx["overlap_moe_expert_parallel_comm"])
    if not _choose(ctx, ladder(ctx, overlap), "lightest recompute that fits") and overlap \
            and not ctx.is_user("overlap_moe_expert_parallel_comm"):
        ctx.set("overlap_moe_expert_parallel_comm", False, "goal",
                "EP overlap allows only selective recompute, and no selective plan fits in memory",
                [(True, "does not fit")])
        if not ctx.is_user("delay_wgrad_compute"):
            ctx.set("delay_wgrad_compute", False, "derived", "needs EP overlap")
        moe.shared_expert(ctx)  # derived from the final overlap value
        _choose(ctx, ladder(ctx, False), "lightest recompute that fits (overlap off)")


def _choose(ctx: Context, rungs: list[Rung], why: str) -> bool:
    limit = ctx.hw["memory_gib"] * HEADROOM
    rejected: list[tuple[Any, str]] = []
    legal = []
    for rung in rungs:
        broken = _legal(ctx, rung)
        label = rung[0] or "none" if not rung[1] else f"selective {rung[1]}"
        if broken:
            rejected.append((label, "breaks " + ", ".join(broken)))
            continue
        legal.append(rung)
        est = _estimate(ctx, rung)
        if est <= limit:
            _set(ctx, rung, "goal", f"{why}: estimate {est:.1f} GiB <= {limit:.0f} GiB usable", rejected)
            return True
        rejected.append((label, f"estimate {est:.1f} GiB > {limit:.0f} GiB"))
    heaviest = legal[-1] if legal else rungs[0]
    _set(ctx, heaviest, "goal", f"{why}: nothing fits; heaviest legal plan chosen", rejected)
    return False


def memory_pass(ctx: Context) -> None:
    """The final estimate from the final values (shown by explain, kept in the lock file)."""
    est = memory.estimate(ctx.model, ctx.values())
    ctx.memory.update(est)
    ctx.memory["gpu_memory_gib"] = ctx.hw["memory_gib"]
    ctx.set("memory_estimate_gib", est["total_gib"], "derived",
            "mocompile memory estimate for the most-loaded rank, incl. dispatcher and NCCL buffers")

