"""Host-side and fusion settings of Bridge's tuned perf recipes, for a `throughput` plan.

Bridge's ``_benchmark_common`` (megatron/bridge/perf_recipes/_common.py in 0.6.2) applies these to
every MoE perf recipe beyond the MoE knobs: manual garbage collection, RoPE and cross-entropy
fusion, gradient reduction in BF16; the recipes add fused permutation, fused routing, the fused GLU and TE
layernorm SM margins.
Each is set only where the target stack supports it (Megatron-Core raises otherwise), with its
source; `fit` and `bring-up` keep Megatron's defaults (full-precision gradient reduction, no
fused kernels that a first run would have to debug).
"""

from __future__ import annotations

from mocompile.resolve.context import Context
from mocompile.steptime import facts, manual_gc_seconds
from mocompile.versions import at_least

COMMON = "Bridge perf_recipes/_common.py::_benchmark_common"


def _te_at_least(ctx: Context, version: str) -> bool:
    te = ctx["te_version"]
    return te is not None and at_least(te, version)


def host_and_fusion(ctx: Context) -> None:
    fast = ctx.goal == "throughput"
    why_not = f"goal {ctx.goal}: Megatron's default"
    ctx.set("manual_gc", fast, "goal", f"{COMMON}: Python GC only every 100 steps, never inside a step "
            "(the GC pauses it removes are a cause of step-time jitter)" if fast else why_not)
    interval = 100 if fast else 0
    pause = ""
    if fast:  # what the scheduled collection costs a step (the step model counts it: steptime.manual_gc_seconds)
        pause = (f"; one full collection ({facts()['manual_gc_collect_s']:.2f} s measured in a Bridge run) every "
                 f"{interval} steps costs {manual_gc_seconds(interval) * 1000:.1f} ms a step")
    ctx.set("manual_gc_interval", interval, "goal", COMMON + pause if fast else why_not)
    te = ctx["te_version"] is not None
    mla = bool(ctx["multi_latent_attention"])
    # MCore: RoPE fusion needs TE >= 1.4; for MLA it needs YaRN RoPE, which the catalogue does not record.
    rope = fast and _te_at_least(ctx, "1.4.0") and not mla
    ctx.set("apply_rope_fusion", rope, "goal", f"{COMMON}: fused RoPE (TE >= 1.4)" if rope else
            (why_not if not fast else "needs TE >= 1.4 and, with MLA, YaRN RoPE (transformer_config.py)"))
    det = bool(ctx["deterministic_mode"])
    ce = fast and te and not det
    ctx.set("cross_entropy_loss_fusion", ce, "goal", f"{COMMON}: fused cross-entropy in TE" if ce else
            "training.deterministic: Bridge refuses cross-entropy fusion in deterministic mode (training/config.py "
            "ConfigContainer._validate_and_apply_deterministic_mode)" if det else
            (why_not if not fast else "TE cross-entropy needs Transformer Engine"))
    ctx.set("cross_entropy_fusion_impl", "te" if ce else "native", "goal",
            f"{COMMON}: cross_entropy_fusion_impl='te'" if ce else "Megatron's default")
    permute = fast and _te_at_least(ctx, "2.1.0")
    ctx.set("moe_permute_fusion", permute, "goal",
            "perf recipes fuse token permutation (TE >= 2.1; the unfused permute is part of why the published "
            "alltoall run without it took 41.25 s vs 24.71 s for HybridEP)" if permute else
            (why_not if not fast else "fused permutation needs TE >= 2.1 (transformer_config.py)"))
    # Fused (weighted) GLU: Megatron-Core's unfused path (transformer/moe/experts.py bias_act_func, mlp.py glu)
    # keeps the activation's output, the offset copy of the linear half and the GLU product for backward beside fc1's
    # output, 6 bytes per expert-FFN channel per routed token more than weighted_bias_swiglu_impl (memory.py
    # _act_bytes_per_token); every Bridge perf recipe turns it on, and the
    # library recipes of DeepSeek-V3, GPT-OSS and Qwen3-30B-A3B do, those of Qwen3-235B-A22B and Qwen3-Next do not.
    glu = te and bool(ctx.model.get("gated_linear_unit", True))
    ctx.set("bias_activation_fusion", glu, "derived",
            "fused SwiGLU/quick-GeGLU with the router probabilities (Megatron-Core weighted_bias_swiglu_impl): less "
            "activation memory than the unfused GLU, as Bridge's perf recipes set it" if glu else
            ("Megatron-Core fuses only gated SwiGLU/quick-GeGLU here (transformer_config.py)" if te else
             "no Transformer Engine: fused kernel unavailable"))
    # Fused top-k routing and aux loss (TE >= 2.7: moe_utils.py raises without fused_moe_aux_loss)
    router = fast and _te_at_least(ctx, "2.7.0")
    ctx.set("moe_router_fusion", router, "goal",
            "Bridge's perf recipes fuse top-k routing and the aux loss (TE >= 2.7, "
            "megatron/core/transformer/moe/moe_utils.py)" if router else
            (why_not if not fast else "fused routing needs TE >= 2.7 (moe_utils.py fused_moe_aux_loss)"))
    bf16_reduce = fast and ctx["precision"] != "fp32" and not ctx["fp16"]
    ctx.set("grad_reduce_in_fp32", not bf16_reduce, "goal",
            f"{COMMON}: gradients reduced in BF16 (half the DP traffic)" if bf16_reduce else
            "gradients reduced in FP32 (Megatron-Bridge's mixed-precision default)")


def sm_margins(ctx: Context) -> dict[str, tuple[str, str]]:
    """TE layernorm SM margins the perf recipes set when communication kernels run beside compute."""
    if ctx.goal != "throughput" or ctx["te_version"] is None or not ctx["overlap_moe_expert_parallel_comm"]:
        return {}
    why = ("Megatron-Bridge scripts/performance recipes' env: leave 20 SMs to the overlapped EP communication "
           "while TE layernorm kernels run")
    return {"NVTE_FWD_LAYERNORM_SM_MARGIN": ("20", why), "NVTE_BWD_LAYERNORM_SM_MARGIN": ("20", why)}
