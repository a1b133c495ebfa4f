"""Rule predicates, keyed by catalogue ID. Each returns True when the rule is broken.

A predicate reads only the flat ``{Megatron field: value}`` view of a plan, so the
same function can be exercised against any settings (the parity tests do that).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from mocompile import memory
from mocompile.layout import layout_error
from mocompile.versions import at_least

Cfg = dict[str, Any]
Check = Callable[[Cfg], bool]

DEEPEP_GROUP_SIZES = (2, 4, 8, 16, 24, 32, 64, 128, 144, 160)
TE_GRAPH_IMPLS = ("transformer_engine",)


def _ep_group(c: Cfg) -> int:
    return int(c["expert_model_parallel_size"]) * int(c["expert_tensor_parallel_size"])


def node_gpus(c: Cfg) -> int | None:
    """How many GPUs one node (one host) of this GPU type has in the hardware catalogue (a GB200 tray: 4)."""
    from mocompile.catalogue import gpus

    entry = gpus().get(c.get("gpu") or "")
    return int(entry["gpus_per_node"]) if entry else None


def _vpp(c: Cfg) -> int:
    return c["virtual_pipeline_model_parallel_size"] or 1


def _overlap(c: Cfg) -> bool:
    return bool(c["overlap_moe_expert_parallel_comm"])


def _profiling(c: Cfg) -> bool:
    """The PyTorch profiler is on (read with .get: candidate trials run before training settings exist)."""
    return bool(c.get("use_pytorch_profiler"))


def _modules(c: Cfg) -> list[str]:
    return list(c["recompute_modules"] or []) if c["recompute_granularity"] == "selective" else []


def _scopes(c: Cfg) -> list[str]:
    return list(c["cuda_graph_modules"] or []) if c["cuda_graph_impl"] not in (None, "none") else []


def _te_graphs(c: Cfg) -> bool:
    return c["cuda_graph_impl"] in TE_GRAPH_IMPLS


def _te_below(c: Cfg, version: str) -> bool:
    """True when the target has no TE, or one older than ``version``."""
    return c["te_version"] is None or not at_least(c["te_version"], version)


def _microbatches(c: Cfg) -> int:
    denom = c["micro_batch_size"] * c["data_parallel_size"]
    return c["global_batch_size"] // denom if denom else 0


def idle_overlap(overlap: bool, pp: int, microbatches: int) -> bool:
    """OVL014's condition, shared with the planner (``search.without_idle_overlap``): EP overlap with no pipeline
    and fewer than two micro-batches per step, where Megatron-Core's combined 1F1B schedule for no pipelining has
    no second micro-batch to pair one's forward with another's backward, so it hides nothing."""
    return overlap and pp == 1 and microbatches < 2


def _all_moe(c: Cfg) -> bool:
    return int(c["first_k_dense"] or 0) == 0


def _backend(c: Cfg) -> str | None:
    return c["moe_flex_dispatcher_backend"] if c["moe_token_dispatcher_type"] == "flex" else None


def _layers_per_rank(c: Cfg) -> int:
    return c["num_layers"] // max(1, c["pipeline_model_parallel_size"])


def split_share(split: str | None, index: int) -> float | None:
    """Share of split ``index`` (0 train, 1 validation, 2 test) as Megatron-Core normalises it."""
    if not split:
        return None
    parts = [float(x) for x in re.findall(r"[.0-9]+", split)]  # parse_and_normalize_split's reading
    parts += [0.0] * (3 - len(parts))
    total = sum(parts[:3])
    return parts[index] / total if total > 0 else None


def _ckpt_used(c: Cfg) -> bool:
    return bool(c.get("save") or c.get("load") or c.get("pretrained_checkpoint"))


def memory_limit(c: dict[str, Any]) -> float:
    """The most the plan may fill per GPU (``memory_limit_gib``, set from the final estimate's plan); before it is
    set, the planner's headroom (``memory.usable_gib``)."""
    limit = c.get("memory_limit_gib")
    return limit if limit is not None else memory.usable_gib(c["gpu_memory_gib"])


# the package each flex backend imports (what `mocompile probe` records as missing)
FLEX_PACKAGES = {"deepep": "deep_ep", "hybridep": "hybrid_ep"}
# NCCL algorithms Bridge accepts in deterministic mode (training/config.py _validate_and_apply_deterministic_mode)
DETERMINISTIC_NCCL_ALGOS = ("Tree", "Ring", "CollnetDirect", "CollnetChain", "^NVLS")


def package_missing(backend: str | None, missing: list[str] | None) -> str | None:
    """The package flex ``backend`` imports, if the cluster profile's probe found it missing there (``missing``:
    the plan's ``cluster_missing``); else None. The planner does not offer such a backend, and CLU001 refuses
    a pinned one."""
    need = FLEX_PACKAGES.get(backend or "")
    return need if need and need in (missing or []) else None


# Where NCCL EP (flex backend ``ncclep``) first exists in each package of the target stack, and the rule that
# refuses a target below it (the rule catalogue cites the upstream sources).
NCCLEP_MINIMUMS = (("DSP011", "te_version", "2.17.0"), ("DSP012", "mcore_version", "0.19.0"),
                   ("DSP013", "bridge_version", "0.6.2"))


def ncclep_unavailable(c: Any) -> str | None:
    """The rule ID that refuses ``ncclep`` on this target stack (no Transformer Engine, or a TE, Megatron-Core or
    Megatron-Bridge release before NCCL EP), else None. The planner offers ``ncclep`` only where this is None."""
    for rule, key, minimum in NCCLEP_MINIMUMS:
        if not at_least(c[key], minimum):  # c: flat settings, or the resolver's Context
            return rule
    return None


def missing_package(c: Cfg) -> str | None:
    """The package the chosen flex backend needs that the cluster profile's probe found missing there."""
    return package_missing(_backend(c), c.get("cluster_missing"))


CHECKS: dict[str, Check] = {
    "PAR001": lambda c: c["world_size"] % (c["tensor_model_parallel_size"] * c["pipeline_model_parallel_size"]
                                           * c["context_parallel_size"]) != 0,
    "PAR002": lambda c: c["world_size"] % (_ep_group(c) * c["pipeline_model_parallel_size"]) != 0,
    "PAR003": lambda c: c["num_moe_experts"] % c["expert_model_parallel_size"] != 0,
    "PAR004": lambda c: c["num_attention_heads"] % c["tensor_model_parallel_size"] != 0,
    "PAR005": lambda c: (c["num_query_groups"] % c["tensor_model_parallel_size"] != 0
                         and c["tensor_model_parallel_size"] % c["num_query_groups"] != 0),
    "PAR006": lambda c: bool(c["sequence_parallel"]) and c["tensor_model_parallel_size"] <= 1,
    "PAR007": lambda c: c["global_batch_size"] % (c["micro_batch_size"] * max(1, c["data_parallel_size"])) != 0,
    "PAR008": lambda c: c["context_parallel_size"] > 1 and c["seq_length"] % (2 * c["context_parallel_size"]) != 0,
    "PAR009": lambda c: (c["expert_model_parallel_size"] > 1 and c["tensor_model_parallel_size"] > 1
                         and not c["sequence_parallel"]),
    "PAR010": lambda c: bool(c["add_bias_linear"]) and c["expert_tensor_parallel_size"] != 1,
    "PAR011": lambda c: c["expert_model_parallel_size"] > c["num_moe_experts"],
    "PAR012": lambda c: bool(c["sequence_parallel"]) and c.get("transformer_impl") == "local",
    "PAR014": lambda c: (node_gpus(c) or c["gpus_per_node"]) < c["gpus_per_node"],
    "PAR013": lambda c: bool(c.get("num_query_groups")) and c["num_attention_heads"] % c["num_query_groups"] != 0,
    "PAR015": lambda c: not c.get("multi_latent_attention") and c["hidden_size"] % c["num_attention_heads"] != 0
    and c["kv_channels"] == c["hidden_size"] // c["num_attention_heads"],
    "PP001": lambda c: _vpp(c) > 1 and c["pipeline_model_parallel_size"] <= 1,
    "PP002": lambda c: (not c["pipeline_model_parallel_layout"]
                        and (c["num_layers"] % c["pipeline_model_parallel_size"] != 0
                             or _layers_per_rank(c) % _vpp(c) != 0)),
    "PP003": lambda c: bool(c["pipeline_model_parallel_layout"]) and layout_error(
        c["pipeline_model_parallel_layout"], c["pipeline_model_parallel_size"], _vpp(c),
        c["num_layers"], c["mtp_num_layers"] or 0) is not None,
    "PP004": lambda c: _vpp(c) > 1 and c["pipeline_model_parallel_size"] <= 2 and not c["overlap_p2p_comm"],
    "PP005": lambda c: _vpp(c) > 1 and c["pipeline_model_parallel_size"] > 1
    and _microbatches(c) < c["pipeline_model_parallel_size"],
    "PP006": lambda c: c["pipeline_model_parallel_size"] * _vpp(c) > c["num_layers"],
    "OVL001": lambda c: _overlap(c) and c["expert_model_parallel_size"] <= 1,
    "OVL002": lambda c: _overlap(c) and c["moe_token_dispatcher_type"] not in ("alltoall", "flex"),
    "OVL003": lambda c: _overlap(c) and not (c["bf16"] or c["fp16"]),
    "OVL004": lambda c: _overlap(c),  # catalogue versions: torch < 2.6.0
    "OVL005": lambda c: _overlap(c) and c["pipeline_model_parallel_size"] > 1
    and c["virtual_pipeline_model_parallel_size"] is None,
    "OVL006": lambda c: _overlap(c) and c["recompute_granularity"] == "full",
    "OVL007": lambda c: _overlap(c) and c["recompute_method"] is not None,
    "OVL008": lambda c: _overlap(c) and c["recompute_num_layers"] is not None,
    "OVL009": lambda c: _overlap(c) and "moe" in (c["recompute_modules"] or []),
    "OVL010": lambda c: _overlap(c) and bool(c["moe_shared_expert_overlap"]),
    "OVL011": lambda c: _overlap(c) and (c["mtp_num_layers"] or 0) > 1,
    "OVL012": lambda c: _overlap(c) and _te_graphs(c) and bool({"moe", "mlp"} & set(_scopes(c))),
    "OVL013": lambda c: _overlap(c) and c["num_moe_experts"] <= 1,
    "OVL014": lambda c: idle_overlap(_overlap(c), c["pipeline_model_parallel_size"], _microbatches(c)),
    "DW001": lambda c: bool(c["delay_wgrad_compute"]) and not _overlap(c),
    "DW002": lambda c: bool(c["delay_wgrad_compute"]) and c["te_version"] is None,
    # No TE counts as older than 2.10: Megatron-Core then reads TE 0.0.0 and raises (seen in the parity run).
    "DW003": lambda c: bool(c["delay_wgrad_compute"]) and _te_graphs(c) and _te_below(c, "2.10.0"),
    "DW004": lambda c: bool(c["delay_wgrad_compute"]) and bool(c["overlap_grad_reduce"]) and _te_below(c, "2.7.0"),
    "DW005": lambda c: bool(c["delay_wgrad_compute"]) and _te_graphs(c)  # catalogue versions: TE < 2.12.0
    and ("attn" in _scopes(c) or ("moe_router" in _scopes(c) and bool(c["moe_shared_expert_intermediate_size"])
                                  and not c["moe_shared_expert_overlap"])),
    "DW007": lambda c: bool(c["delay_wgrad_compute"]) and not c["gradient_accumulation_fusion"] and _te_graphs(c)
    and ("attn" in _scopes(c) or ("moe_router" in _scopes(c) and bool(c["moe_shared_expert_intermediate_size"])
                                  and not c["moe_shared_expert_overlap"])),
    "DW006": lambda c: bool(c["delay_wgrad_compute"]) and "attn" in _scopes(c) and bool(c["add_bias_linear"]),
    "DSP001": lambda c: _backend(c) == "deepep" and "deepep" not in c["gpu_flex_backends"],
    "DSP002": lambda c: _backend(c) == "hybridep" and "hybridep" not in c["gpu_flex_backends"],
    "DSP003": lambda c: _backend(c) == "deepep" and _ep_group(c) > 1 and _ep_group(c) not in DEEPEP_GROUP_SIZES,
    "DSP004": lambda c: c["moe_token_dispatcher_type"] == "flex" and _ep_group(c) <= 1,
    "DSP005": lambda c: _backend(c) == "hybridep" and _ep_group(c) % c["hybridep_ranks_per_domain"] != 0,
    "DSP006": lambda c: _backend(c) == "deepep" and _ep_group(c) > c["nvlink_domain"],
    # DSP006 on the 8-GPU nodes of B200/B300, where NVIDIA's own internode DeepEP runs have failed (a warning)
    "DSP016": lambda c: _backend(c) == "deepep" and _ep_group(c) > c["nvlink_domain"] and c["gpu_arch"] == "blackwell",
    "DSP017": lambda c: _backend(c) == "hybridep" and _ep_group(c) > c["nvlink_domain"],
    "DSP018": lambda c: _backend(c) == "hybridep" and 1 < _ep_group(c) < c["nvlink_domain"]
    and c["nvlink_domain"] % _ep_group(c) != 0,
    "DSP019": lambda c: c["moe_token_dispatcher_type"] != "flex" and c.get("moe_flex_dispatcher_num_sms") is not None,
    # Megatron-Core checks shared-expert overlap only when the model has shared experts (tc:1637-1650).
    "DSP007": lambda c: bool(c["moe_shared_expert_overlap"]) and c["moe_shared_expert_intermediate_size"] is not None
    and c["moe_token_dispatcher_type"] not in ("alltoall", "flex"),
    "DSP008": lambda c: c["moe_token_dispatcher_type"] == "flex" and c["moe_flex_dispatcher_num_sms"] is not None
    and c["moe_flex_dispatcher_num_sms"] % 2 != 0,
    "DSP009": lambda c: _backend(c) == "hybridep" and c["fp8_dispatch"],
    # NCCL EP (moe.dispatcher ncclep): Bridge's GPU check, then the first releases that have it (NCCLEP_MINIMUMS)
    "DSP010": lambda c: _backend(c) == "ncclep" and "ncclep" not in c["gpu_flex_backends"],
    "DSP011": lambda c: _backend(c) == "ncclep" and _te_below(c, "2.17.0"),
    "DSP012": lambda c: _backend(c) == "ncclep",  # catalogue versions: megatron-core < 0.19.0
    "DSP013": lambda c: _backend(c) == "ncclep",  # catalogue versions: Megatron-Bridge < 0.6.2
    # offload_modules non-empty is what turns fine_grained_activation_offloading on (resolve/derived.py)
    "DSP014": lambda c: _backend(c) == "ncclep" and _overlap(c) and "expert_fc1" in (c.get("offload_modules") or []),
    "DSP015": lambda c: _backend(c) == "ncclep" and _overlap(c),
    "RC001": lambda c: "moe_act" in _modules(c) and not c["moe_grouped_gemm"],
    "RC002": lambda c: "mla_up_proj" in _modules(c) and not c["multi_latent_attention"],
    "RC003": lambda c: c["recompute_granularity"] == "full"
    and (c["recompute_method"] is None or c["recompute_num_layers"] is None),
    "RC004": lambda c: c["recompute_granularity"] == "selective"
    and (c["recompute_num_layers"] is not None or c["recompute_method"] is not None),
    "RC005": lambda c: "shared_experts" in _modules(c) and bool(c["moe_shared_expert_overlap"])
    and c["moe_shared_expert_intermediate_size"] is not None,
    "RC006": lambda c: c["fp8"] == "delayed" and bool({"moe_act", "layernorm"} & set(_modules(c))),
    "RC008": lambda c: c["fp8"] is not None and bool({"moe_act", "layernorm"} & set(_modules(c))),  # TE < 2.6.0
    "RC009": lambda c: c.get("transformer_impl") == "local" and "layernorm" in _modules(c),
    "RC007": lambda c: c["recompute_granularity"] == "full" and c["recompute_num_layers"] is not None
    and not 1 <= c["recompute_num_layers"] <= _layers_per_rank(c),
    "CG001": lambda c: c["cuda_graph_impl"] == "local",
    "CG002": lambda c: c["cuda_graph_impl"] == "full_iteration" and bool(c["cuda_graph_modules"]),
    "CG003": lambda c: {"moe", "moe_router"} <= set(_scopes(c)),
    "CG004": lambda c: "moe_preprocess" in _scopes(c) and "moe_router" not in _scopes(c),
    "CG005": lambda c: "mlp" in _scopes(c) and _all_moe(c),
    "CG006": lambda c: "moe" in _scopes(c) and c["moe_expert_capacity_factor"] is None,
    "CG007": lambda c: c["recompute_granularity"] == "full" and c["cuda_graph_impl"] not in (None, "none", "full_iteration"),
    "CG008": lambda c: _te_graphs(c) and "moe_router" in _scopes(c) and "moe" in _modules(c),
    "CG009": lambda c: _te_graphs(c) and c["te_version"] is None,
    "PREC001": lambda c: (c["fp8"] is not None or c["fp4"] is not None) and c["te_version"] is None,
    "PREC002": lambda c: (c["fp8"] == "mxfp8" or c["fp4"] is not None) and c["gpu_arch"] != "blackwell",
    "PREC003": lambda c: c["fp8"] is not None and c["gpu_arch"] == "ampere",
    "PREC004": lambda c: c["fp4"] is not None,  # catalogue versions: TE < 2.7.0
    "MOE001": lambda c: bool(c["moe_grouped_gemm"]) and c["te_version"] is None,
    "MOE002": lambda c: bool(c["moe_router_force_load_balancing"]),
    "MOE003": lambda c: (c.get("first_k_dense") or 0) >= c["num_layers"],
    "MOE004": lambda c: bool(c.get("num_moe_experts")) and c["moe_router_topk"] > c["num_moe_experts"],
    "ENV001": lambda c: _overlap(c) and str(c["env"].get("CUDA_DEVICE_MAX_CONNECTIONS", "")) == "1",
    "MEM001": lambda c: c.get("memory_estimate_gib", 0) > memory_limit(c),
    "MEM003": lambda c: c.get("host_memory_limit_gib") is not None
    and c.get("memory_host_node_gib", 0.0) > c["host_memory_limit_gib"],
    "MEM002": lambda c: bool(c.get("shipped_recipe"))
    and c["gpu_memory_gib"] < c.get("memory_estimate_gib", 0) <= memory_limit(c),
    "VER001": lambda c: not at_least(c["torch_version"], "2.6.0"),
    # Optimizer choice (training.optimizer). The catalogue's versions key OPT002/OPT003 to old stacks.
    "OPT001": lambda c: c.get("optimizer", "adam") == "muon" and bool(c["fp16"]),
    "OPT002": lambda c: c.get("optimizer", "adam") == "muon",  # catalogue versions: megatron-core < 0.16.0
    "OPT003": lambda c: c.get("optimizer", "adam") == "muon",  # catalogue versions: Megatron-Bridge < 0.3.0
    # training.deterministic against a launch environment the user set
    "DET001": lambda c: bool(c.get("deterministic_mode")) and str((c.get("env") or {}).get("NCCL_ALGO", "Ring"))
    not in DETERMINISTIC_NCCL_ALGOS,
    "DET002": lambda c: bool(c.get("deterministic_mode")) and c.get("te_version") is not None
    and str((c.get("env") or {}).get("NVTE_ALLOW_NONDETERMINISTIC_ALGO", "0")) != "0",
    # Adam's memory levers (training.optimizer_state, training.optimizer_offload)
    "OPT004": lambda c: c.get("optimizer", "adam") != "adam" and c.get("optimizer_state", "fp32") != "fp32",
    "OPT005": lambda c: c.get("optimizer_state", "fp32") != "fp32" and c.get("te_version") is None
    and not c.get("optimizer_offload_fraction"),
    "OPT006": lambda c: c.get("optimizer_state", "fp32") != "fp32" and bool(c.get("optimizer_offload_fraction")),
    "OPT007": lambda c: c.get("optimizer", "adam") != "adam" and bool(c.get("optimizer_offload_fraction")),
    # fine-grained activation offload (recompute.offload_modules)
    "AOF001": lambda c: "attn_proj" in (c.get("offload_modules") or []) and "core_attn" not in (c.get("offload_modules") or []),
    "AOF002": lambda c: c.get("recompute_granularity") == "selective" and "moe" in (c.get("recompute_modules") or [])
    and bool({"moe_act", "expert_fc1"} & set(c.get("offload_modules") or [])),
    "AOF003": lambda c: bool(c.get("offload_modules")) and c.get("te_version") is None,
    "AOF004": lambda c: bool(c.get("offload_modules")) and c.get("te_version") is not None
    and str((c.get("env") or {}).get("NVTE_CPU_OFFLOAD_V1", "1")) != "1",
    "AOF005": lambda c: c.get("cuda_graph_impl") == "local"
    and bool(set(c.get("offload_modules") or []) - {"expert_fc1", "moe_act"}),
    # Megatron-FSDP (parallelism.fsdp)
    "FSD001": lambda c: bool(c.get("use_megatron_fsdp")) and bool(c.get("overlap_moe_expert_parallel_comm"))
    and (c.get("virtual_pipeline_model_parallel_size") or 1) > 1,
    "FSD002": lambda c: bool(c.get("use_megatron_fsdp")) and str((c.get("env") or {}).get("CUDA_DEVICE_MAX_CONNECTIONS")) == "1",
    "FSD004": lambda c: bool(c.get("use_megatron_fsdp")) and _ckpt_used(c) and c.get("ckpt_format") != "fsdp_dtensor",
    "FSD003": lambda c: bool(c.get("use_megatron_fsdp")) and c.get("data_parallel_size") == 1
    and c.get("expert_data_parallel_size") == 1,
    "FSD005": lambda c: bool(c.get("use_megatron_fsdp")) and float(c.get("optimizer_offload_fraction") or 0) > 0,
    # Data, tokenizer, checkpoint and logging (issue 9). These read with .get: the resolver's
    # candidate trials run before these settings exist, and a missing one means "not configured".
    "TOK001": lambda c: (c.get("tokenizer_vocab_size") or 0) > c["vocab_size"],
    "TOK002": lambda c: c.get("data_type", "mock") != "mock" and c.get("tokenizer_type", "NullTokenizer") == "NullTokenizer",
    "CLU001": lambda c: missing_package(c) is not None,
    "LAU002": lambda c: bool(c.get("kubernetes_target")) and c["nodes"] > 1 and not c.get("kubernetes_rdma"),
    "LAU001": lambda c: any("," in p or ":" in p for p in c.get("container_mounts") or []),
    "DATA001": lambda c: bool(c.get("eval_interval")) and split_share(c.get("split"), 1) == 0.0,
    "CKPT001": lambda c: bool(c.get("load")) and not c.get("save"),
    "CKPT002": lambda c: bool(c.get("async_save")) and c.get("ckpt_format", "torch_dist") != "torch_dist",
    "CKPT003": lambda c: bool(c.get("async_save")) and not c.get("save"),
    "CKPT004": lambda c: bool(c.get("save")) and (c.get("save_interval") or 0) > c["train_iters"],
    "CKPT005": lambda c: c.get("ckpt_format") == "fsdp_dtensor" and _ckpt_used(c) and not c.get("use_megatron_fsdp"),
    "CKPT006": lambda c: c.get("ckpt_format") in ("torch", "torch_dcp") and _ckpt_used(c),
    "LOG001": lambda c: (c.get("log_interval") or 1) > c["train_iters"],
    "PROF001": lambda c: _profiling(c) and c["profile_step_end"] <= c["profile_step_start"],
    "PROF002": lambda c: _profiling(c) and c["profile_step_end"] > c["train_iters"],
    "PROF003": lambda c: _profiling(c) and any(
        r >= c["world_size"] for r in c["profile_ranks"] or []),
    "PROF004": lambda c: _profiling(c) and not c.get("tensorboard_dir"),
    # Adam plans emit the distributed optimizer (seen on 2xH100); a Muon plan's layer-wise optimizer keeps its
    # Adam groups in torch/TE Adam too, unverified without TE, so the rule holds for both. Versions: mcore 0.19.2.
    "CKPT007": lambda c: bool(c.get("load")) and c["te_version"] is None,
}
