"""Parallel layout: TP/PP/EP/ETP/CP, sequence parallelism, VPP and the layer layout."""

from __future__ import annotations

import itertools
from typing import Any

from mocompile import layout as layouts
from mocompile import memory
from mocompile.resolve.context import Context

PRECISIONS = {  # intent precision -> (bf16, fp16, fp8 recipe, fp4 recipe)
    "bf16": (True, False, None, None), "fp16": (False, True, None, None), "fp32": (False, False, None, None),
    "fp8-cs": (True, False, "tensorwise", None), "fp8-ds": (True, False, "delayed", None),
    "fp8-blockwise": (True, False, "blockwise", None), "mxfp8": (True, False, "mxfp8", None),
    "nvfp4": (True, False, None, "nvfp4"),
}
HEADROOM = 0.92  # share of GPU memory a plan may fill


def base(ctx: Context) -> None:
    """Facts that are not decisions: model numbers, hardware, versions, batch shape."""
    m, hw, t, v = ctx.model, ctx.hw, ctx.intent["training"], ctx.intent["versions"]
    src = f"model catalogue ({m['id']})"
    for key, name in (("num_layers", "num_layers"), ("hidden_size", "hidden_size"),
                      ("ffn_hidden_size", "ffn_hidden_size"), ("moe_ffn_hidden_size", "moe_ffn_hidden_size"),
                      ("num_moe_experts", "num_moe_experts"), ("moe_router_topk", "moe_router_topk"),
                      ("num_attention_heads", "num_attention_heads"), ("num_query_groups", "num_query_groups"),
                      ("kv_channels", "kv_channels"), ("add_bias_linear", "add_bias_linear"),
                      ("first_k_dense", "first_k_dense"), ("vocab_size", "vocab_size")):
        ctx.set(name, m[key], "model", src, path=("model", key) if isinstance(ctx.intent["model"], dict) else None)
    ctx.set("moe_shared_expert_intermediate_size", m["shared_expert_size"] or None, "model", src)
    ctx.set("mtp_num_layers", m["mtp_num_layers"] or None, "model", src)
    ctx.set("multi_latent_attention", m["attention"] == "mla", "model", src)
    ctx.set("moe_expert_capacity_factor", None, "default", "dropless MoE (no capacity factor)")
    for name, value in (("gpu", hw["id"]), ("gpu_arch", hw["arch"]), ("nodes", hw["nodes"]),
                        ("gpus_per_node", hw["gpus_per_node"]), ("world_size", hw["world_size"]),
                        ("nvlink_domain", hw["nvlink_domain_effective"]), ("gpu_memory_gib", hw["memory_gib"]),
                        ("gpu_display", hw["display"])):
        ctx.set(name, value, "hardware", f"hardware catalogue ({hw['id']}) and the recipe's hardware block")
    ctx.set("gpu_flex_backends", sorted(b.split("-", 1)[1] for b in hw["dispatchers"]["legal"] if b.startswith("flex-")),
            "hardware", "which flex backends Megatron-Bridge accepts on this GPU")
    te = v["transformer_engine"]
    ctx.set("te_version", None if te == "none" else te, "user" if ctx.explicit("versions", "transformer_engine") else "default",
            "target stack", path=("versions", "transformer_engine"))
    for key, name in (("torch", "torch_version"), ("megatron_core", "mcore_version"), ("megatron_bridge", "bridge_version")):
        ctx.set(name, v[key], "user" if ctx.explicit("versions", key) else "default", "target stack", path=("versions", key))
    ctx.set("transformer_impl", "local" if te == "none" else "transformer_engine", "derived",
            "no Transformer Engine in the target stack: Megatron-Core local layer spec" if te == "none"
            else "Transformer Engine layer spec")
    for key in ("seq_length", "global_batch_size", "micro_batch_size", "train_iters", "seed"):
        ctx.user_or(key, ("training", key), t[key], "default", "schema default")
    prec = t["precision"]
    bf16, fp16, fp8, fp4 = PRECISIONS[prec]
    ppath = ("training", "precision")
    src = "user" if ctx.explicit(*ppath) else "default"
    ctx.set("precision", prec, src, "training precision", path=ppath)
    for name, value in (("bf16", bf16), ("fp16", fp16), ("fp8", fp8), ("fp4", fp4)):
        ctx.set(name, value, src, f"from precision {prec}", path=ppath)
    ctx.set("fp8_dispatch", False, "default", "Megatron dispatches in BF16")
    ctx.set("goal", ctx.goal, "user", "the recipe's goal", path=("goal",))
    ctx.user_or("moe_router_force_load_balancing", ("moe", "force_balance"), False, "goal",
                "natural routing: forced balancing is for benchmarks only")
    ctx.user_or("moe_grouped_gemm", ("moe", "grouped_gemm"), ctx["te_version"] is not None, "derived",
                     "grouped GEMM experts need Transformer Engine" if ctx["te_version"] is None
                     else "TE grouped GEMM experts")
    env = ctx.intent["launch"].get("env") or {}
    ctx.set("env", {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()},
            "user" if env else "default", "launch.env", path=("launch", "env"))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _fits(ctx: Context, cfg: dict[str, Any]) -> tuple[bool, float]:
    est = memory.estimate(ctx.model, cfg)["total_gib"]
    return est <= ctx.hw["memory_gib"] * HEADROOM, est


def base_sizes(ctx: Context) -> dict[str, Any]:
    """Flat settings used to score layout candidates before later passes run.

    A layout "fits" when it fits with the heaviest recompute its goal may use: selective
    (overlap-safe) for throughput, full for fit and bring-up. The recompute pass then
    picks the lightest rung that fits.
    """
    cfg = ctx.values()
    heavy = ctx.goal != "throughput"
    cfg.update(recompute_granularity="full" if heavy else "selective",
               recompute_modules=None if heavy else ["layernorm", "core_attn"] + (["moe_act"] if ctx["moe_grouped_gemm"] else []),
               recompute_method="uniform" if heavy else None, recompute_num_layers=1 if heavy else None,
               moe_token_dispatcher_type="alltoall", moe_flex_dispatcher_backend=None,
               overlap_moe_expert_parallel_comm=False, virtual_pipeline_model_parallel_size=None)
    return cfg


def layout(ctx: Context) -> None:
    """Pick TP, PP, EP (and ETP, CP) for what the user left auto."""
    world, gpn, domain = ctx["world_size"], ctx["gpus_per_node"], ctx["nvlink_domain"]
    experts, heads, groups = ctx["num_moe_experts"], ctx["num_attention_heads"], ctx["num_query_groups"]
    pins = {k: ctx.pinned("parallelism", k) for k in ("tp", "pp", "ep", "etp", "cp")}
    cp = pins["cp"] or 1
    etp = pins["etp"] or 1
    tps = [pins["tp"]] if pins["tp"] else [t for t in (1, 2, 4, 8) if t <= gpn and heads % t == 0
                                           and (groups % t == 0 or t % groups == 0)]
    pps = [pins["pp"]] if pins["pp"] else [p for p in _divisors(world) if p <= ctx["num_layers"]]
    eps = [pins["ep"]] if pins["ep"] else [e for e in _divisors(experts) if world % e == 0]
    scored = []
    rejected: list[tuple[Any, str]] = []
    for tp, pp, ep in itertools.product(tps or [1], pps, eps):
        legal = (world % (tp * pp * cp) == 0 and world % (ep * etp * pp) == 0 and experts % ep == 0) \
            or all(pins[k] for k in ("tp", "pp", "ep"))
        if not legal:
            continue
        cfg = base_sizes(ctx)
        dp = world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else 1
        cfg.update(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, expert_model_parallel_size=ep,
                   expert_tensor_parallel_size=etp, context_parallel_size=cp, data_parallel_size=dp)
        fits, est = _fits(ctx, cfg)
        in_domain = ep * etp <= domain
        ep_key = (0, -ep) if in_domain else (1, ep)
        scored.append(((not fits, tp * pp, tp, pp, ep_key), tp, pp, ep, est, fits))
    if not scored:  # nothing legal: keep the pins (or 1) and let the rules explain
        tp, pp, ep, est, fits = pins["tp"] or 1, pins["pp"] or 1, pins["ep"] or 1, 0.0, True
        reason = "no legal combination of TP, PP and EP for this world size and model"
    else:
        scored.sort(key=lambda x: x[0])
        _, tp, pp, ep, est, fits = scored[0]
        rejected = [(f"tp{c[1]} pp{c[2]} ep{c[3]}", (f"does not fit ({c[4]:.0f} GiB)" if not c[5] else
                     "more model parallelism" if c[1] * c[2] > tp * pp or (c[1] * c[2] == tp * pp and c[1] > tp) else
                     "EP outside the NVLink domain" if c[3] > domain else "smaller EP: more expert memory per GPU"))
                    for c in scored[1:4]]
        reason = (f"smallest model parallelism whose estimate ({est:.1f} GiB) fits {ctx.hw['memory_gib']} GiB; "
                  "EP preferred over TP, EP inside the NVLink domain where possible, PP only when needed"
                  if fits else f"nothing fits; this is the smallest estimate ({est:.1f} GiB)")
    goal_src = "goal"
    ctx.user_or("tensor_model_parallel_size", ("parallelism", "tp"), tp, goal_src, reason, rejected)
    ctx.user_or("pipeline_model_parallel_size", ("parallelism", "pp"), pp, goal_src, reason)
    ctx.user_or("expert_model_parallel_size", ("parallelism", "ep"), ep, goal_src, reason)
    ctx.user_or("expert_tensor_parallel_size", ("parallelism", "etp"), 1, "default",
                "ETP 1: experts split by EP, not TP (Bridge's default with EP > 1)")
    ctx.user_or("context_parallel_size", ("parallelism", "cp"), 1, "default", "no context parallelism")
    tp, pp, cp = ctx["tensor_model_parallel_size"], ctx["pipeline_model_parallel_size"], ctx["context_parallel_size"]
    ep, etp = ctx["expert_model_parallel_size"], ctx["expert_tensor_parallel_size"]
    ctx.set("data_parallel_size", max(1, world // (tp * pp * cp)), "derived", "world / (TP*PP*CP)")
    ctx.set("expert_data_parallel_size", max(1, world // (ep * etp * pp)), "derived", "world / (ETP*EP*PP)")
    ctx.user_or("sequence_parallel", ("parallelism", "sequence_parallel"), tp > 1, "derived",
                "sequence parallelism with TP > 1 (needed for EP with TP)" if tp > 1 else "TP is 1")


def pipeline(ctx: Context) -> None:
    """VPP and the explicit layout (for uneven models such as DeepSeek-V3)."""
    pp, layers, mtp = ctx["pipeline_model_parallel_size"], ctx["num_layers"], ctx["mtp_num_layers"] or 0
    dp = ctx["data_parallel_size"]
    mb = ctx["global_batch_size"] // max(1, ctx["micro_batch_size"] * dp)
    ctx.set("num_microbatches", mb, "derived", "GBS / (MBS*DP)")
    user_vpp = ctx.pinned("parallelism", "vpp")
    user_layout = ctx.pinned("parallelism", "layout")
    if user_vpp is not None and ctx.explicit("parallelism", "vpp"):
        vpp = ctx.set("virtual_pipeline_model_parallel_size", None if user_vpp == 1 else user_vpp, "user",
                      "pinned in the recipe", path=("parallelism", "vpp"))
    elif pp == 1:
        vpp = ctx.set("virtual_pipeline_model_parallel_size", None, "derived", "no pipeline parallelism")
    elif ctx.goal == "bring-up":
        vpp = ctx.set("virtual_pipeline_model_parallel_size", None, "goal", "bring-up: plain 1F1B pipeline")
    else:
        units = layers + 2 + mtp
        choice, rejected = None, []
        for v in (4, 3, 2):
            if pp * v > layers or units < 2 * pp * v:
                rejected.append((v, "too few layers per virtual stage"))
                continue
            if mb < pp:
                rejected.append((v, f"{mb} micro-batches < PP"))
                continue
            choice = v
            break
        vpp = ctx.set("virtual_pipeline_model_parallel_size", choice, "goal",
                      f"interleaved pipeline against bubbles: {choice} virtual stages per rank "
                      "(needed for EP overlap with PP > 1)" if choice else "no VPP fits the layer count",
                      rejected)
    v = vpp or 1
    lpath = ("parallelism", "layout")
    if isinstance(user_layout, str) and user_layout not in ("auto", "none") and ctx.explicit(*lpath):
        ctx.set("pipeline_model_parallel_layout", user_layout, "user", "pinned in the recipe", path=lpath)
    elif user_layout == "none" or pp == 1:
        ctx.set("pipeline_model_parallel_layout", None, "user" if user_layout == "none" else "derived",
                "no explicit layout" if user_layout == "none" else "no pipeline parallelism", path=lpath if user_layout == "none" else None)
    elif layouts.even(pp, v, layers) and not mtp:
        ctx.set("pipeline_model_parallel_layout", None, "derived", f"{layers} layers split evenly over PP*VPP")
    else:
        ctx.set("pipeline_model_parallel_layout", layouts.derive(pp, v, layers, mtp), "derived",
                f"{layers} layers{' + ' + str(mtp) + ' MTP' if mtp else ''} do not split evenly over "
                f"PP*VPP={pp * v}: balanced layout, embedding and loss counted as a layer each", rules=["PP002", "PP003"])
