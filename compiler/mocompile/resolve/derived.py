"""CUDA graphs, pipeline p2p and gradient overlap flags, and the launch environment."""

from __future__ import annotations

from mocompile import memory, ncclep
from mocompile.ir import Decision
from mocompile.resolve.context import Context
from mocompile.resolve.search import MAX_GPUS, frugal_step, min_gpus_that_fit
from mocompile.resolve.tuning import sm_margins
from mocompile.steptime import device_max_connections


def p2p_and_grads(ctx: Context) -> None:
    pp, vpp = ctx["pipeline_model_parallel_size"], ctx["virtual_pipeline_model_parallel_size"] or 1
    ctx.set("overlap_p2p_comm", pp > 1 and vpp > 1, "derived",
            "interleaved pipeline: overlap p2p (Bridge's derivation)" if pp > 1 and vpp > 1 else
            "no interleaved pipeline")
    ctx.set("batch_p2p_comm", pp > 1 and vpp == 1, "derived",
            "plain pipeline: batched p2p" if pp > 1 and vpp == 1 else "not needed")
    dp = ctx["data_parallel_size"]
    want = dp > 1
    blockers = ctx.errors_if(overlap_grad_reduce=True) if want else []
    ctx.set("overlap_grad_reduce", want and not blockers, "derived",
            "overlap the DP gradient reduce-scatter" if want and not blockers else
            ("off: " + ", ".join(blockers) + " (delay_wgrad with grad overlap needs TE >= 2.7)" if blockers
             else "no data parallelism"), rules=blockers)
    if ctx["optimizer"] == "muon":
        ctx.set("overlap_param_gather", False, "derived",
                "Muon's layer-wise optimizer runs without Megatron's distributed optimizer: no param-gather overlap "
                "(Bridge's _apply_kimi_k2_optimizer 'muon')", path=("training", "optimizer"))
    else:
        ctx.set("overlap_param_gather", want and not blockers, "derived", "follows overlap_grad_reduce")
    mods = ctx["offload_modules"]
    ctx.set("fine_grained_activation_offloading", bool(mods), "derived",
            "Megatron-Core offloads the inputs of offload_modules" if mods else "no module offloaded",
            path=("recompute", "offload_modules"))
    ctx.set("use_te_rng_tracker", ctx["cuda_graph_impl"] not in (None, "none"), "derived",
            "CUDA graphs need TE's RNG tracker" if ctx["cuda_graph_impl"] not in (None, "none") else "no graphs")


def ncclep_budget(ctx: Context) -> None:
    """moe_expert_rank_capacity_factor for an ncclep plan: Megatron-Core 0.19 requires one for NCCL EP, and a rank
    over its budget stops the job, so the dropless worst case (mocompile/ncclep.py). Other plans leave it unset."""
    if ctx["moe_token_dispatcher_type"] != "flex" or ctx["moe_flex_dispatcher_backend"] != "ncclep":
        return
    ep = ctx["expert_model_parallel_size"]
    factor = ncclep.rank_capacity_factor(ep, ctx["num_moe_experts"], ctx["moe_router_topk"])
    ctx.set("moe_expert_rank_capacity_factor", factor, "derived",
            f"NCCL EP's receive budget, required by Megatron-Core's _NCCLEPManager (token_dispatcher.py): EP {ep} x "
            f"min(top-k, experts per rank) / top-k, the most a rank can receive, so dropless routing never exceeds it",
            path=("moe", "dispatcher"))


def _env(ctx: Context, key: str, value: str, reason: str) -> None:
    user = ctx["env"]
    if key in user:
        ctx.env[key] = Decision(user[key], "user", "launch.env", position=ctx.doc.positions.get(("launch", "env", key)))
    else:
        ctx.env[key] = Decision(value, "derived", reason)


def environment(ctx: Context) -> None:
    """The one environment block every launcher exports (computed from final values)."""
    flex = ctx["moe_token_dispatcher_type"] == "flex"
    conns, why = device_max_connections(
        flex, ctx["gpu_arch"] == "blackwell", bool(ctx["use_megatron_fsdp"]),
        ctx["tensor_model_parallel_size"] > 1 or ctx["context_parallel_size"] > 1,
        bool(ctx["overlap_moe_expert_parallel_comm"]))
    _env(ctx, "CUDA_DEVICE_MAX_CONNECTIONS", conns, why)
    if ctx["moe_flex_dispatcher_backend"] == "hybridep" and flex:
        group = ctx["expert_model_parallel_size"] * ctx["expert_tensor_parallel_size"]
        _env(ctx, "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN", str(ctx["hybridep_ranks_per_domain"]),
             "HybridEP topology: ranks per NVLink domain")
        _env(ctx, "USE_MNNVL", "1" if ctx.hw.get("mnnvl") and group > ctx["gpus_per_node"] else "0",
             "multi-node NVLink only when the EP group spans trays of an NVL72 rack")
    if ctx["offload_modules"] and ctx["te_version"] is not None:
        _env(ctx, "NVTE_CPU_OFFLOAD_V1", "1", "fine-grained activation offload with Transformer Engine >= 2.10 offloads "
             "weights too unless it is 1 (Bridge's _validate_fine_grained_activation_offloading)")
    graphs_on = ctx["cuda_graph_impl"] not in (None, "none")
    _env(ctx, "PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True", "less fragmentation for MoE's ragged tensors")
    if graphs_on:
        _env(ctx, "NCCL_GRAPH_REGISTER", "0", "CUDA graphs with expandable segments need NCCL_GRAPH_REGISTER=0")
    for key, (value, why) in sm_margins(ctx).items():
        _env(ctx, key, value, why)
    _env(ctx, "NCCL_NVLS_ENABLE", "0", "NVLink SHARP multicast off: not needed for EP and unavailable on many hosts")
    if ctx["deterministic_mode"]:
        why = "training.deterministic (Bridge recipes/utils/determinism_utils.py apply_determinism_overrides)"
        _env(ctx, "CUBLAS_WORKSPACE_CONFIG", ":4096:8", f"{why}: deterministic cuBLAS workspaces")
        _env(ctx, "NCCL_ALGO", "Ring", f"{why}: a fixed reduction order; Bridge asserts one of Tree, Ring, "
             "CollnetDirect, CollnetChain, ^NVLS")
        _env(ctx, "NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0", f"{why}: deterministic TE attention kernels; "
             "Megatron-Core's TEDotProductAttention raises otherwise (extensions/transformer_engine.py)")
    _env(ctx, "PYTHONUNBUFFERED", "1", "live logs")
    for key, value in sorted(ctx["env"].items()):
        if key not in ctx.env:
            ctx.env[key] = Decision(value, "user", "launch.env", position=ctx.doc.positions.get(("launch", "env", key)))


def _lightest_lever_count(ctx: Context, plain: int | None) -> tuple[int, str] | None:
    """The smallest GPU count with the memory ladder's rungs the recipe leaves open (resolve/decide.py
    lever_rungs): the last (most memory-saving) optimizer-state or offload rung (or a lighter offload share where
    host memory bounds the heaviest), or Megatron-FSDP, whichever fits on fewer GPUs; and how to ask for it; None
    if none is open or none fits on fewer GPUs than ``plain`` (only a smaller count is worth a note).

    Each rung searches only below the smallest count found so far (``min_gpus_that_fit``'s ``limit_gpus``): a rung
    that cannot beat it is not searched to the end, and the first rung at the smallest count still wins."""
    from mocompile.resolve.decide import lever_rungs, lever_trial

    rungs = lever_rungs(ctx)
    if not rungs:
        return None
    last = [r for r in rungs if not r[2] or ctx["use_megatron_fsdp"]][-1:]
    # the last state/offload rung and FSDP; and every lighter offload share: it pins less host memory (rule
    # MEM003), so where host memory bounds the heaviest it may fit on fewer nodes
    lighter = [r for r in rungs if r[1] and r not in last and not r[2]] if last and last[0][1] else []
    heaviest = lighter + last + [r for r in rungs if r[2] and not ctx["use_megatron_fsdp"]]
    bound = (plain - 1) if plain is not None else MAX_GPUS
    fitting = []
    for rung in heaviest:
        with lever_trial(ctx, *rung):
            n = min_gpus_that_fit(ctx, limit_gpus=bound) if bound >= 1 else None
        if n is not None:
            fitting.append((n, rung))
            bound = n - 1
    if not fitting:
        return None
    n, (state, share, fsdp, act) = min(fitting, key=lambda c: c[0])
    how = "parallelism.fsdp: true (Megatron-FSDP)" if fsdp and not ctx["use_megatron_fsdp"] else \
        f"training.optimizer_offload: {share:g} (Adam's state and step on the host CPU)" if share else \
        f"recompute.offload_modules: [{', '.join(act)}] (activation offload)" if list(act) != list(ctx["offload_modules"]) \
        else f"training.optimizer_state: {state}"
    if plain is not None and n < plain:  # what the fewer GPUs cost: both counts' fastest layout, the same test
        with lever_trial(ctx, state, share, fsdp, act):
            slow = frugal_step(ctx, n)
        fast = frugal_step(ctx, plain)
        if slow and fast:
            how += f", predicted {slow / fast:.1f}x the step time on {plain}"
    return n, how


def memory_pass(ctx: Context) -> None:
    """The final estimate from the final values (shown by explain, kept in the lock file), the limit it must
    stay under, and what MEM001 quotes when it does not: all from this one estimate, so the message and the
    check cannot disagree, and nothing is left unset for a message to print."""
    est = memory.estimate(ctx.model, ctx.values())
    ctx.memory.update(est)
    gib = ctx.hw["memory_gib"]
    ctx.memory["gpu_memory_gib"] = gib
    total = ctx.set("memory_estimate_gib", est["total_gib"], "derived",
                    "mocompile memory estimate for the most-loaded rank, incl. dispatcher and NCCL buffers")
    shipped = ctx["shipped_recipe"]
    if shipped:
        limit = ctx.set("memory_limit_gib", memory.shipped_limit_gib(gib), "derived",
                        f"{shipped} run as shipped is measured to run: the GPU's {gib} GiB plus the memory estimate's "
                        f"measured error, {memory.limits()['measured_error']:.1%} (data/memory.yaml)")
    else:
        limit = ctx.set("memory_limit_gib", memory.usable_gib(gib), "derived",
                        f"the planner's headroom: {memory.limits()['headroom']:.0%} of the GPU's {gib} GiB (data/memory.yaml)")
    node = ctx["gpus_per_node"]
    ctx.set("memory_host_node_gib", round(est["host_gib"] * node, 1), "derived",
            f"host memory the {node} GPUs of a node pin for offloaded optimizer state and activations")
    host = ctx.hw.get("host_memory_gib")
    ctx.set("host_memory_limit_gib", round(host * memory.limits()["host_headroom"], 1) if host else None, "derived",
            f"{memory.limits()['host_headroom']:.0%} of the node's {host} GiB host memory (data/hardware.yaml, "
            "data/memory.yaml host_headroom)" if host else "the GPU's catalogue entry names no host memory")
    terms = {k: est[k] for k in ("weights_and_optimizer_gib", "activations_gib", "logits_gib",
                                 "dispatcher_buffers_gib", "graph_buffers_gib")}
    big = max(terms, key=terms.__getitem__)
    ctx.set("memory_biggest_term", f"{big.replace('_gib', '').replace('_', ' ')} {terms[big]:.1f} GiB", "derived",
            "largest term of the memory estimate")
    if total > limit:
        n = min_gpus_that_fit(ctx)
        ctx.set("memory_min_gpus", n if n is not None else f"more than {MAX_GPUS}", "derived",
                "smallest GPU count (whole nodes) with a layout that fits under the headroom, with the knobs that "
                "need the least memory and the heaviest recompute (resolve/search.py min_gpus_that_fit)")
        lever = _lightest_lever_count(ctx, n)
        ctx.set("memory_lever_note", f" ({lever[0]} with {lever[1]})" if lever and (n is None or lever[0] < n)
                else "", "derived", "the count with Adam's heaviest memory lever the recipe leaves open, if smaller")
    else:
        # where it fits only through a memory lever, say which (the plan's own: see each setting's reason)
        levers = [f"{k} {ctx[k]}" for k in ("optimizer_offload_fraction", "use_megatron_fsdp", "offload_modules")
                  if ctx[k]]
        why = "the plan fits" + (f" with {', '.join(levers)}" if levers else "") + ": not searched"
        ctx.set("memory_lever_note", "", "derived", why)
        ctx.set("memory_min_gpus", None, "derived", why)
