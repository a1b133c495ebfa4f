"""Facts the planner starts from: model numbers, hardware, target stack, batch shape, precision."""

from __future__ import annotations

from mocompile.memory import OFFLOAD_ORDER
from mocompile.resolve.context import Context

PRECISIONS = {  # intent precision -> (bf16, fp16, fp8 recipe, fp4 recipe)
    "bf16": (True, False, None, None), "fp16": (False, True, None, None), "fp32": (False, False, None, None),
    "fp8-cs": (True, False, "tensorwise", None), "fp8-ds": (True, False, "delayed", None),
    "fp8-blockwise": (True, False, "blockwise", None), "mxfp8": (True, False, "mxfp8", None),
    "nvfp4": (True, False, None, "nvfp4"),
}


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
        ctx.set(name, value, "hardware", f"hardware catalogue ({hw['id']}) and the recipe's hardware block",
                path=("hardware", name) if name in ("gpu", "nodes", "gpus_per_node") else None)
    if hw.get("segment_nodes"):
        ctx.set("nvlink_domain", hw["nvlink_domain_effective"], "hardware",
                f"one {hw['display']} rack joins {hw['rack_gpus']} GPUs by NVLink; this job of {hw['nodes']} nodes runs as "
                f"Slurm segments of {hw['segment_nodes']} nodes inside racks (its node count if one rack holds it, else "
                "its largest divisor a rack holds, as Megatron-Bridge's scripts/performance/utils/executors.py "
                "submits), and only a segment shares NVLink", path=("hardware", "nodes"))
    ctx.set("gpu_flex_backends", sorted(b.split("-", 1)[1] for b in hw["dispatchers"]["legal"] if b.startswith("flex-")),
            "hardware", "which flex backends Megatron-Bridge accepts on this GPU")
    probed = ((hw.get("cluster") or {}).get("missing"))
    ctx.set("cluster_missing", sorted(probed) if probed is not None else None, "hardware",
            "what the cluster profile's `mocompile probe` found missing on its nodes (empty: nothing, or no probe)"
            if probed is not None else "no cluster profile: nothing known to be missing")
    te = v["transformer_engine"]
    ctx.set("te_version", None if te == "none" else te, "user" if ctx.explicit("versions", "transformer_engine") else "default",
            "target stack", path=("versions", "transformer_engine"))
    apex = v.get("apex", "present")
    ctx.set("apex", apex, "user" if ctx.explicit("versions", "apex") else "default", "target stack",
            path=("versions", "apex"))
    # Bridge's provider turns gradient_accumulation_fusion on whenever TE imports, but Megatron-Core's
    # output layer is a ColumnParallelLinear, which then raises unless Apex's fused_weight_gradient_mlp_cuda
    # imports (megatron/core/tensor_parallel/layers.py): it is safe only with TE and Apex both present.
    gaf = te != "none" and apex != "none"
    ctx.set("gradient_accumulation_fusion", gaf, "derived",
            "TE fuses the wgrad accumulation; the output layer uses Apex's fused_weight_gradient_mlp_cuda" if gaf else
            ("no Apex in the target stack (versions.apex: none): Megatron-Core's output layer "
             "(ColumnParallelLinear) raises with it on" if te != "none" else
             "no Transformer Engine: fused kernel unavailable"), path=("versions", "apex"))
    for key, name in (("torch", "torch_version"), ("megatron_core", "mcore_version"), ("megatron_bridge", "bridge_version")):
        ctx.set(name, v[key], "user" if ctx.explicit("versions", key) else "default", "target stack", path=("versions", key))
    ctx.set("transformer_impl", "local" if te == "none" else "transformer_engine", "derived",
            "no Transformer Engine in the target stack: Megatron-Core local layer spec" if te == "none"
            else "Transformer Engine layer spec")
    for key in ("seq_length", "global_batch_size", "micro_batch_size", "train_iters", "seed"):
        ctx.user_or(key, ("training", key), t[key], "default", "schema default")
    if t["micro_batch_size"] == "auto":  # decide.plan searches it; 1 (the documented default) until then
        ctx.set("micro_batch_size", 1, "goal", "auto: decided with the plan", path=("training", "micro_batch_size"))
    prec = t["precision"]
    bf16, fp16, fp8, fp4 = PRECISIONS[prec]
    ppath = ("training", "precision")
    src = "user" if ctx.explicit(*ppath) else "default"
    ctx.set("precision", prec, src, "training precision", path=ppath)
    for name, value in (("bf16", bf16), ("fp16", fp16), ("fp8", fp8), ("fp4", fp4)):
        ctx.set(name, value, src, f"from precision {prec}", path=ppath)
    ctx.set("fp8_dispatch", False, "default", "Megatron dispatches in BF16")
    ctx.user_or("optimizer", ("training", "optimizer"), t.get("optimizer", "adam"), "default",
                "schema default: Megatron's distributed Adam")
    ctx.user_or("deterministic_mode", ("training", "deterministic"), False, "default",
                "schema default: Megatron's fast kernels, not bitwise reproducible")
    # Adam's memory levers: pinned, or the lightest until decide.plan finds that no plan fits without them
    state = t.get("optimizer_state", "auto")
    bridge = ctx.model.get("bridge") or {}
    recipe_state = bridge.get("optimizer_state") if bridge.get("recipe") and ctx["optimizer"] == "adam" else None
    if state != "auto":
        ctx.set("optimizer_state", state, "user", "pinned in the recipe", path=("training", "optimizer_state"))
    elif recipe_state and ctx["te_version"] is None:
        ctx.set("optimizer_state", "fp32", "default", f"Bridge's recipe {bridge['recipe']} builds the precision-aware "
                "optimizer, which needs Transformer Engine's FusedAdam (OPT005): without TE, fp32 state",
                path=("training", "optimizer_state"))
    elif recipe_state:
        ctx.set("optimizer_state", recipe_state, "default", f"Bridge's recipe {bridge['recipe']} builds its optimizer "
                "this way (use_precision_aware_optimizer and its dtypes; train.py keeps it); the memory estimate "
                "follows", path=("training", "optimizer_state"))
    else:
        ctx.set("optimizer_state", "fp32", "default", "auto: fp32 master and moments unless no plan fits",
                path=("training", "optimizer_state"))
    off = t.get("optimizer_offload", "auto")
    ctx.set("optimizer_offload_fraction", 0.0 if off == "auto" else float(off), "user" if off != "auto" else "default",
            "pinned in the recipe" if off != "auto" else "auto: on the GPU unless no plan fits",
            path=("training", "optimizer_offload"))
    off_mods = ctx.intent["recompute"].get("offload_modules", "auto")
    mods = [] if off_mods == "auto" else [m for m in OFFLOAD_ORDER if m in off_mods]
    ctx.set("offload_modules", mods, "user" if off_mods != "auto" else "default",
            "pinned in the recipe" if off_mods != "auto" else "auto: activations stay on the GPU unless no plan fits",
            path=("recompute", "offload_modules"))
    fsdp = ctx.intent["parallelism"].get("fsdp", "auto")
    ctx.set("use_megatron_fsdp", fsdp is True, "user" if fsdp != "auto" else "default",
            "pinned in the recipe" if fsdp != "auto" else "auto: the distributed optimizer unless no plan fits",
            path=("parallelism", "fsdp"))
    ctx.set("goal", ctx.goal, "user", "the recipe's goal", path=("goal",))
    ctx.user_or("moe_router_force_load_balancing", ("moe", "force_balance"), False, "goal",
                "natural routing: forced balancing is for benchmarks only")
    ctx.user_or("moe_grouped_gemm", ("moe", "grouped_gemm"), ctx["te_version"] is not None, "derived",
                     "grouped GEMM experts need Transformer Engine" if ctx["te_version"] is None
                     else "TE grouped GEMM experts")
    env = ctx.intent["launch"].get("env") or {}
    ctx.set("env", {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in env.items()},
            "user" if env else "default", "launch.env", path=("launch", "env"))
