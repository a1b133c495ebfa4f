"""Prepare the values the Bridge Python recipe template prints.

Every assignment carries a comment naming the decision (and rule) behind it,
taken from the Plan; the template itself only formats.
"""

from __future__ import annotations

from typing import Any

from mocompile import kernels, rankprobe
from mocompile.ir import Decision, Plan

KERNEL_SETTINGS = ("tensor_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
                   "expert_tensor_parallel_size", "seq_length", "micro_batch_size")

MIXED_PRECISION = {
    "bf16": "bf16_mixed", "fp16": "fp16_mixed", "fp32": None,
    "fp8-cs": "bf16_with_fp8_current_scaling_mixed", "fp8-ds": "bf16_with_fp8_delayed_scaling_mixed",
    "fp8-blockwise": "bf16_with_fp8_subchannel_scaling_mixed", "mxfp8": "bf16_with_mxfp8_mixed",
    "nvfp4": "bf16_with_nvfp4_mixed",
}

# Model fields the plan decides, in the order they are written (Megatron's names).
MODEL_FIELDS = (
    "tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
    "pipeline_model_parallel_layout", "context_parallel_size", "expert_model_parallel_size",
    "expert_tensor_parallel_size", "sequence_parallel",
    "moe_token_dispatcher_type", "moe_flex_dispatcher_backend", "moe_flex_dispatcher_num_sms",
    "moe_shared_expert_overlap", "moe_router_force_load_balancing", "moe_grouped_gemm",
    "recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules",
    "cuda_graph_impl", "cuda_graph_modules", "use_te_rng_tracker", "mtp_num_layers",
    "apply_rope_fusion", "cross_entropy_loss_fusion", "cross_entropy_fusion_impl", "moe_permute_fusion",
    "bias_activation_fusion", "moe_router_fusion",
    "deterministic_mode", "fine_grained_activation_offloading", "offload_modules",
)


# CommOverlapConfig fields the plan decides (Bridge copies the MoE ones onto the model).
COMM_OVERLAP_FIELDS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "overlap_p2p_comm",
                       "batch_p2p_comm", "overlap_grad_reduce", "overlap_param_gather")


def _comment(d: Decision) -> str:
    rules = f" [{', '.join(d.rules)}]" if d.rules else ""
    return f"{d.source}: {d.reason}{rules}"


def _assign(plan: Plan, field: str, value: Any = None) -> dict[str, Any]:
    d = plan.settings[field]
    return {"field": field, "value": d.value if value is None else value, "comment": _comment(d)}


def _custom_model(plan: Plan) -> list[dict[str, Any]]:
    """Constructor arguments for a GPTModelProvider built from the numbers (no HF download)."""
    m, te = plan.model, plan["te_version"] is not None
    n_dense = int(m.get("first_k_dense", 0))
    layer_freq: Any = 1 if n_dense == 0 else [0] * n_dense + [1] * (m["num_layers"] - n_dense)
    args: list[tuple[str, Any, str]] = [
        ("num_layers", m["num_layers"], "model"), ("hidden_size", m["hidden_size"], "model"),
        ("ffn_hidden_size", m["ffn_hidden_size"], "model"),
        ("num_attention_heads", m["num_attention_heads"], "model"),
        ("num_query_groups", m["num_query_groups"], "model"), ("kv_channels", m["kv_channels"], "model"),
        ("num_moe_experts", m["num_moe_experts"], "model"), ("moe_router_topk", m["moe_router_topk"], "model"),
        ("moe_ffn_hidden_size", m["moe_ffn_hidden_size"], "model"),
        ("moe_shared_expert_intermediate_size", m["shared_expert_size"] or None, "model"),
        ("moe_layer_freq", layer_freq, f"{n_dense} leading dense layer(s)"),
        ("vocab_size", m["vocab_size"], "model"), ("seq_length", plan["seq_length"], "training.seq_length"),
        ("normalization", "RMSNorm", "model"), ("gated_linear_unit", bool(m["gated_linear_unit"]), "model"),
        ("position_embedding_type", "rope", "model"), ("rotary_base", 1000000, "model"),
        ("add_bias_linear", bool(m["add_bias_linear"]), "model"), ("qk_layernorm", bool(m["qk_layernorm"]), "model"),
        ("share_embeddings_and_output_weights", False, "untied embeddings"),
        ("moe_router_load_balancing_type", "aux_loss", "router"), ("moe_aux_loss_coeff", 1e-3, "router"),
        ("moe_router_dtype", "fp32", "fp32 routing for many experts"),
        ("attention_dropout", 0.0, "pretraining"), ("hidden_dropout", 0.0, "pretraining"),
        ("make_vocab_size_divisible_by", 128, "vocab padding"),
    ]
    if te and not plan["gradient_accumulation_fusion"]:
        args.append(("gradient_accumulation_fusion", False, "no Apex (versions.apex: none): the output layer's "
                     "fused wgrad needs apex fused_weight_gradient_mlp_cuda"))
    if not te:
        args += [(k, False, "no Transformer Engine: fused kernel unavailable") for k in (
            "bias_activation_fusion", "masked_softmax_fusion", "persist_layer_norm", "bias_dropout_fusion",
            "apply_rope_fusion", "gradient_accumulation_fusion", "cross_entropy_loss_fusion", "moe_permute_fusion")]
        args.append(("transformer_impl", "local", "no Transformer Engine: Megatron-Core local layer spec"))
    return [{"field": k, "value": v, "comment": c} for k, v, c in args]


def _resized(plan: Plan) -> list[dict[str, Any]]:
    """Provider assignments for a resized catalogue model (catalogue.RESIZABLE): Bridge's recipe for the base
    built the family's provider (its attention, router and RoPE), these lines give it the intent's numbers."""
    resized = plan.model.get("resized")
    if not resized:
        return []
    m, fields, base = plan.model, resized["fields"], resized["from"]
    why = f"model: {base} resized (the intent's number; the recipe built {base}'s)"
    out: list[tuple[str, Any]] = []
    for key in sorted(fields):
        if key == "first_k_dense":
            continue  # the dense prefix is moe_layer_freq, below
        if key == "shared_expert_size":
            out.append(("moe_shared_expert_intermediate_size", m["shared_expert_size"] or None))
        elif key == "kv_channels" and m.get("attention") == "mla":
            out.append(("v_head_dim", m["kv_channels"]))  # MLA's value head width (MLATransformerConfig)
        elif key == "mtp_num_layers":
            out.append(("mtp_num_layers", m["mtp_num_layers"] or None))  # Bridge's providers say None for none
        else:
            out.append((key, m[key]))
    if {"num_layers", "first_k_dense"} & set(fields):
        # Which layers are MoE: Megatron-Core asserts the list has one entry per layer (gpt_layer_specs.py)
        k = int(m.get("first_k_dense") or 0)
        out.append(("moe_layer_freq", 1 if k == 0 else [0] * k + [1] * (m["num_layers"] - k)))
    follows = set(resized.get("derived", ()))
    # "resized": config_fields names the lock's model.resized as what explains these fields
    return [{"field": f, "value": v, "resized": True, "comment": "model: follows num_attention_heads: MLA has no "
             "key/value groups (MDL003)" if f in follows else why} for f, v in out]


def _kwargs(plan: Plan, fields: tuple[str, ...], keep: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Keyword arguments with their reasons: the fields that are set, plus ``keep`` always."""
    return [_assign(plan, f) for f in fields if f in plan.settings and (f in keep or plan[f] is not None)]


def training_io(plan: Plan) -> dict[str, Any]:
    """Dataset, tokenizer, checkpoint, validation and logger arguments (issue 9 keys).

    Mock data with none of these keys renders exactly the lines recipes had before them.
    """
    real = plan.get("data_type", "mock") != "mock"
    blend = plan.get("blend")
    dataset = None
    if real:
        dataset = {"blend": (list(blend[0]), None if blend[1] is None else list(blend[1])),
                   "blend_comment": _comment(plan.settings["blend"]),
                   "split": _assign(plan, "split"), "path_to_cache": _assign(plan, "path_to_cache")}
    tokenizer = None
    if plan.get("tokenizer_type", "NullTokenizer") != "NullTokenizer":
        tokenizer = [_assign(plan, "tokenizer_type"), _assign(plan, "tokenizer_model")]
    ckpt_fields = ("save", "load", "save_interval", "ckpt_format", "async_save", "pretrained_checkpoint")
    checkpoint = None
    if any(plan.get(f) for f in ("save", "load", "pretrained_checkpoint")):
        checkpoint = _kwargs(plan, ckpt_fields, keep=("save", "load", "ckpt_format", "async_save"))
    logger = _kwargs(plan, ("log_interval", "tensorboard_dir", "wandb_project", "wandb_exp_name", "wandb_entity"),
                     keep=("log_interval",)) if "log_interval" in plan.settings else [
        {"field": "log_interval", "value": 1, "comment": "default"}]
    evaluate = bool(plan.get("eval_interval"))
    profiling = _kwargs(plan, ("use_pytorch_profiler", "profile_step_start", "profile_step_end", "profile_ranks",
                               "pytorch_profiler_collect_shapes")) if plan.get("use_pytorch_profiler") else None
    return {
        "profiling": profiling,
        "dataset": dataset,
        "tokenizer": tokenizer,
        "checkpoint": checkpoint,
        "logger": logger,
        "logger_plain": len(logger) == 1 and logger[0]["value"] == 1,
        "validation": {"eval_iters": plan.get("eval_iters", 0) if evaluate else 0,
                       "eval_interval": plan.get("eval_interval") if evaluate else None,
                       "comment": _comment(plan.settings["eval_interval"]) if evaluate else
                       ("mock data: no evaluation" if not real else "no evaluation (training.eval.interval not set)")},
        "exit_signal_handler": bool(plan.get("exit_signal_handler", False)),
    }


DTYPES = {"fp32": "float32", "bf16": "bfloat16"}  # torch dtype names (the template prints torch.<name>)


def optimizer_levers(plan: Plan, explicit: bool = False) -> list[dict[str, Any]]:
    """Adam's memory levers as Megatron-Core OptimizerConfig fields. ``explicit`` (onto a Bridge recipe's
    optimizer, which may have its own): every field, fp32 state included; else only what differs from
    OptimizerConfig's defaults."""
    if plan.get("optimizer") == "muon":
        return []
    state = plan.get("optimizer_state") or "fp32"
    share = float(plan.get("optimizer_offload_fraction") or 0.0)
    out: list[dict[str, Any]] = []
    why = _comment(plan.settings["optimizer_state"]) if "optimizer_state" in plan.settings else "fp32"
    # Offload runs on the precision-aware path, as Megatron-LM requires (megatron/training/arguments.py: "The
    # optimizer cpu offload must be used in conjunction with `--use-precision-aware-optimizer`"): then the
    # distributed optimizer keeps no fp32 master on the GPU (optimizer_state.py)
    aware = state != "fp32" or share > 0
    if aware or explicit:
        moments = DTYPES["bf16" if state == "bf16-moments" else "fp32"]
        flag = (f"training.optimizer_offload {share:g}: the hybrid CPU optimizer on the precision-aware path (no fp32 "
                "master on the GPU; megatron/training/arguments.py requires it with optimizer_cpu_offload)"
                if state == "fp32" and share > 0 else f"training.optimizer_state {state}: {why}")
        out += [{"field": "use_precision_aware_optimizer", "value": aware, "comment": flag},
                {"field": "main_params_dtype", "dtype": DTYPES["fp32"],
                 "comment": "fp32 master" + (", stored as remainders" if state != "fp32" else
                                             ", on the host with the offloaded share" if share > 0 else "")},
                {"field": "exp_avg_dtype", "dtype": moments, "comment": "first moment"},
                {"field": "exp_avg_sq_dtype", "dtype": moments, "comment": "second moment"}]
        if state != "fp32":
            out.insert(2, {"field": "store_param_remainders", "value": True, "comment": "the 16 bits the bf16 weight lacks"})
        elif share > 0:  # the hybrid optimizer keeps an fp32 master_param; a checkpoint load must expect fp32
            out.insert(2, {"field": "store_param_remainders", "value": False, "comment":
                           "the hybrid optimizer's master is fp32 (distrib_optimizer.py DistributedOptimizer.load_state_dict"
                           " allocates int16 remainders otherwise)"})
        if state == "fp32" and (explicit or share > 0):  # a recipe built with the precision-aware optimizer may
            # keep bf16 main grads: Megatron-Core's OptimizerConfig asserts fp32 main grads without it (found by the
            # rank probe: DeepSeek-V3's recipe); the offloaded step takes fp32 gradients on the host
            out.append({"field": "main_grads_dtype", "dtype": DTYPES["fp32"], "comment": "fp32 main gradients"})
    if share > 0 or explicit:
        out += [{"field": "optimizer_cpu_offload", "value": share > 0,
                 "comment": f"training.optimizer_offload {share:g}: {_comment(plan.settings['optimizer_offload_fraction'])}"},
                {"field": "optimizer_offload_fraction", "value": float(share), "comment": "share stepped on the CPU"}]
    return out


# Bridge's mixed-precision presets that keep the weights in FP8 between steps (fp8_param_gather=True) for a recipe
# other than delayed scaling (training/mixed_precision.py: bf16_with_fp8_current_scaling_mixed, bf16_with_mxfp8_mixed)
FP8_PARAM_PRESETS = ("fp8-cs", "mxfp8")


def _fp8_param_gather_off(plan: Plan) -> bool:
    """Optimizer offload with FP8 weights is refused by Megatron-LM unless the recipe is delayed scaling
    (megatron/training/arguments.py: "When `--fp8-param-gather` is enabled, the optimizer cpu offload must be used in
    conjunction with `--fp8-recipe delayed`"): on the precision-aware path the distributed optimizer keeps no shard of
    such a weight to offload (distrib_optimizer.py: quantized params get shard_model_param None). The plan keeps bf16
    weights instead, which is what the memory estimate counts."""
    return float(plan.get("optimizer_offload_fraction") or 0.0) > 0 and plan["precision"] in FP8_PARAM_PRESETS


def _set(path: str, plan: Plan, setting: str, value: Any = None, note: str = "") -> dict[str, Any]:
    """One assignment onto Bridge's recipe config: ``cfg.<path> = value``, from the plan's ``setting``."""
    d = plan.settings[setting]
    section, field = path.split(".")
    return {"section": section, "field": field, "value": d.value if value is None else value,
            "comment": (note + "; " if note else "") + _comment(d), "setting": setting}


def recipe_overrides(plan: Plan) -> list[dict[str, Any]]:
    """What ``train.py`` changes on Bridge's recipe config outside the model, field by field: the settings the
    plan decides. Everything else stays the recipe's (its optimizer betas, DDP options, data workers, logger
    timers, environment): the stack test diffs the two ConfigContainers against this list (the lock's
    ``config_fields``)."""
    out = [_set("train.train_iters", plan, "train_iters"), _set("train.global_batch_size", plan, "global_batch_size"),
           _set("train.micro_batch_size", plan, "micro_batch_size"),
           _set("train.exit_signal_handler", plan, "exit_signal_handler")]
    if plan.get("manual_gc"):
        out += [_set("train.manual_gc", plan, "manual_gc"), _set("train.manual_gc_interval", plan, "manual_gc_interval")]
    if plan.get("optimizer") != "muon":  # Muon builds its own OptimizerConfig (the optimizer is the plan's)
        if plan.settings["lr"].source == "user":
            out += [_set("optimizer.lr", plan, "lr"), _set("optimizer.min_lr", plan, "min_lr")]
        out += [_set("optimizer.bf16", plan, "bf16"), _set("optimizer.fp16", plan, "fp16")]
    out += [_set("scheduler.lr_warmup_iters", plan, "lr_warmup_iters"),
            _set("scheduler.lr_decay_iters", plan, "lr_decay_iters"),
            _set("dataset.seq_length", plan, "seq_length"), _set("dataset.random_seed", plan, "seed"),
            _set("dataset.blend", plan, "blend", value=_blend_value(plan))]
    if plan.get("data_type", "mock") != "mock":
        out += [_set("dataset.split", plan, "split"), _set("dataset.path_to_cache", plan, "path_to_cache")]
    log = ["log_interval", "tensorboard_dir"] + [f for f in ("wandb_project", "wandb_exp_name", "wandb_entity")
                                                 if plan.get(f) is not None]
    out += [_set(f"logger.{f}", plan, f) for f in log]
    out += [_set(f"checkpoint.{f}", plan, f) for f in ("save", "load", "save_interval", "ckpt_format", "async_save",
                                                       "pretrained_checkpoint")]
    evaluate = bool(plan.get("eval_interval"))
    out += [_set("validation.eval_iters", plan, "eval_iters", value=plan.get("eval_iters", 0) if evaluate else 0),
            _set("validation.eval_interval", plan, "eval_interval")]
    out += [_set("ddp.grad_reduce_in_fp32", plan, "grad_reduce_in_fp32"),
            _set("ddp.use_distributed_optimizer", plan, "optimizer", value=plan.get("optimizer") != "muon",
                 note="the distributed optimizer (Muon: plain DDP)"),
            _set("ddp.overlap_grad_reduce", plan, "overlap_grad_reduce"),
            _set("ddp.overlap_param_gather", plan, "overlap_param_gather")]
    if plan.get("use_megatron_fsdp"):  # Megatron-FSDP, as Bridge's DeepSeek-V3 GB300 FSDP recipe sets it
        out += [_set("ddp.use_megatron_fsdp", plan, "use_megatron_fsdp"),
                _set("ddp.data_parallel_sharding_strategy", plan, "use_megatron_fsdp", value="optim_grads_params",
                     note="weights, gradients and optimizer state sharded"),
                _set("model.init_model_with_meta_device", plan, "use_megatron_fsdp", value=True,
                     note="build on the meta device; FSDP materialises each shard")]
    out += [_set(f"comm_overlap.{f}", plan, f) for f in ("tp_comm_overlap",) + COMM_OVERLAP_FIELDS]
    out += [_set("rng.seed", plan, "seed"), _set("rng.te_rng_tracker", plan, "use_te_rng_tracker")]
    return out


def _blend_value(plan: Plan) -> Any:
    blend = plan.get("blend")
    return None if blend is None else [list(blend[0]), None if blend[1] is None else list(blend[1])]


def config_fields(plan: Plan) -> dict[str, str]:
    """``section.field`` of every ConfigContainer field ``train.py`` sets on Bridge's recipe config, with the
    lock setting it comes from (the model's fields included, and the sub-configs it replaces as a whole)."""
    if not (plan.model.get("bridge") or {}).get("recipe"):
        return {}
    out = {f"{o['section']}.{o['field']}": o["setting"] for o in recipe_overrides(plan)}
    ctx = context(plan, "")
    for a in ctx["model_assignments"]:
        out[f"model.{a['field']}"] = "model.resized" if a.get("resized") else \
            a["field"] if a["field"] in plan.settings else ALIASES.get(a["field"], a["field"])
    for name, setting in (("moe_token_dispatcher_type", "moe_token_dispatcher_type"),
                          ("moe_flex_dispatcher_backend", "moe_flex_dispatcher_backend"),
                          ("moe_shared_expert_overlap", "moe_shared_expert_overlap")):
        out.setdefault(f"model.{name}", setting)
    for lever in ctx["optimizer_levers"]:
        out[f"optimizer.{lever['field']}"] = "optimizer_offload_fraction" if "offload" in lever["field"] \
            else "optimizer_state"
    out["tokenizer.*"] = "tokenizer_type"
    out["comm_overlap.*"] = "comm_overlap"  # where the recipe has none (its own fields are listed above)
    if plan.get("optimizer") == "muon":
        out["optimizer.*"] = "optimizer"
    if plan.get("use_pytorch_profiler"):
        out["profiling.*"] = "use_pytorch_profiler"
    out["mixed_precision.*"] = "precision"
    out["env_vars"] = "env"
    return out


# Deprecated model aliases train.py clears (Bridge's recipes may set them): the setting that replaces each.
ALIASES = {"cuda_graph_scope": "cuda_graph_modules", "moe_deepep_num_sms": "moe_flex_dispatcher_num_sms",
           "moe_hybridep_num_sms": "moe_flex_dispatcher_num_sms",
           "account_for_embedding_in_pipeline_split": "pipeline_model_parallel_layout",
           "account_for_loss_in_pipeline_split": "pipeline_model_parallel_layout",
           "num_layers_in_first_pipeline_stage": "pipeline_model_parallel_layout",
           "num_layers_in_last_pipeline_stage": "pipeline_model_parallel_layout"}


def context(plan: Plan, source: str) -> dict[str, Any]:
    m = plan.model
    bridge = m.get("bridge") or {}
    recipe = bridge.get("recipe")
    te = plan["te_version"] is not None
    flex = plan["moe_token_dispatcher_type"] == "flex"
    model_assignments = _resized(plan) if recipe else []
    model_assignments += [_assign(plan, f) for f in MODEL_FIELDS if not (flex and f in (
        "moe_token_dispatcher_type", "moe_flex_dispatcher_backend"))]
    model_assignments.insert(0, {"field": "seq_length", "value": plan["seq_length"], "comment": "training.seq_length"})
    if flex and plan["moe_flex_dispatcher_backend"] == "ncclep":  # Megatron-Core builds no NCCL EP dispatcher without it
        model_assignments.append(_assign(plan, "moe_expert_rank_capacity_factor"))
    if recipe and te and plan["gradient_accumulation_fusion"] is False:
        # Bridge's provider turns it on whenever TE imports; without Apex the output layer raises at build
        # (found by the rank probe: the custom-model path set it, Bridge's recipe path did not)
        model_assignments.append(_assign(plan, "gradient_accumulation_fusion"))
    # Deprecated aliases a base recipe may have set: left in place they override or conflict
    # with the fields above (cuda_graph_scope + cuda_graph_modules raises; an SM alias is used by any backend).
    model_assignments += [
        {"field": "cuda_graph_scope", "value": None, "comment": "deprecated alias of cuda_graph_modules; both set raises"},
        {"field": "moe_deepep_num_sms", "value": None, "comment": "deprecated alias of moe_flex_dispatcher_num_sms"},
        {"field": "moe_hybridep_num_sms", "value": None, "comment": "deprecated alias of moe_flex_dispatcher_num_sms"},
    ]
    # The plan's own split (even, or pipeline_model_parallel_layout) replaces a base recipe's
    # uneven-split arguments: MCore rejects a layout combined with any of them.
    model_assignments += [
        {"field": f, "value": v, "comment": "pipeline split comes from the plan (layout or even split)"}
        for f, v in (("account_for_embedding_in_pipeline_split", False), ("account_for_loss_in_pipeline_split", False),
                     ("num_layers_in_first_pipeline_stage", None), ("num_layers_in_last_pipeline_stage", None))]
    planned = {a["field"]: a["value"] for a in model_assignments}
    if flex:
        planned["moe_token_dispatcher_type"] = "flex"
        planned["moe_flex_dispatcher_backend"] = plan["moe_flex_dispatcher_backend"]
        planned["moe_shared_expert_overlap"] = plan["moe_shared_expert_overlap"]
    # CommOverlapConfig: every field set explicitly (None lets Bridge decide, EP-17), each with its reason.
    overlap: dict[str, bool] = {"tp_comm_overlap": False}
    overlap_comments = {"tp_comm_overlap": "TP comm overlap needs TE userbuffers; mocompile does not plan it"}
    for field in COMM_OVERLAP_FIELDS:
        overlap[field] = bool(plan[field])
        overlap_comments[field] = _comment(plan.settings[field])
    t = plan.intent["training"]
    lr = float(t["lr"])
    iters = plan["train_iters"]
    return {
        "source": source,
        "model_display": m.get("display", m.get("id")),
        "gpu_display": plan.hardware["display"],
        "goal": plan.goal,
        "recipe_module": bridge.get("module") if recipe else None,
        "recipe": recipe,
        "needs_hf_config": bool(bridge.get("needs_hf_config")) if recipe else False,
        "hf_id": m.get("hf_id"),
        # model_config: the vendored HF config Bridge's recipe reads instead of the hub (mocompile.hfconfig)
        "vendored": ({"model_id": m["hf_id"], "file": m["vendored_config"]["copy"],
                      "sha256": m["vendored_config"]["sha256"]} if recipe and m.get("vendored_config") else None),
        "custom_model": None if recipe else _custom_model(plan),
        "layer_spec": "default_layer_spec" if te else "local_layer_spec",
        "model_assignments": model_assignments,
        "planned": planned,
        "flex_backend": plan["moe_flex_dispatcher_backend"] if flex else None,
        "flex_comment": _comment(plan.settings["moe_flex_dispatcher_backend"]) if flex else "",
        "overlap": overlap,
        "overlap_comments": overlap_comments,
        "mixed_precision": MIXED_PRECISION[plan["precision"]],
        "fp8_param_gather_off": _fp8_param_gather_off(plan),
        "train": {"train_iters": iters, "global_batch_size": plan["global_batch_size"],
                  "micro_batch_size": plan["micro_batch_size"]},
        "gc": [_assign(plan, "manual_gc"), _assign(plan, "manual_gc_interval")] if plan.get("manual_gc") else [],
        "grad_reduce": _assign(plan, "grad_reduce_in_fp32"),
        "seq_length": plan["seq_length"],
        "vocab_size": m["vocab_size"],
        "seed": plan["seed"],
        "lr": lr,
        "min_lr": float(f"{lr / 10:.6g}"),
        "optimizer": plan.get("optimizer") or "adam",
        "optimizer_levers": optimizer_levers(plan, explicit=bool(recipe)),
        "fsdp": _assign(plan, "use_megatron_fsdp") if plan.get("use_megatron_fsdp") else None,
        "overrides": recipe_overrides(plan) if recipe else [],
        "optimizer_bf16": bool(plan["bf16"]),
        "optimizer_fp16": bool(plan["fp16"]),
        "warmup": max(1, min(500, iters // 10)),
        "env_vars": {k: str(d.value) for k, d in sorted(plan.env.items())},
        "io": training_io(plan),
        # MOCOMPILE_PROBE_KERNELS (mocompile probe): this plan's GEMM shapes and the all-to-all message sizes
        "kernel_gemms": [(g["what"], g["m"], g["n"], g["k"])
                         for g in kernels.gemm_shapes(m, {f: plan[f] for f in KERNEL_SETTINGS})],
        "kernel_a2a_bytes": list(kernels.A2A_BYTES),
        # MOCOMPILE_RANK_PROBE (rankprobe.sh): the rank to impersonate, the substitutions, the estimates
        "rank_probe": rankprobe.spec(plan),
    }
