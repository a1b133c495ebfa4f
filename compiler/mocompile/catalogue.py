"""Model and hardware catalogues (package data, each number with its source)."""

from __future__ import annotations

import functools
import os
from typing import Any

from mocompile.datafiles import load_yaml
from mocompile.errors import InputError
from mocompile.ir import Diagnostic, Document

DATA = os.path.join(os.path.dirname(__file__), "data")

# What a custom model must state, and what may be left out.
REQUIRED_MODEL_KEYS = ("num_layers", "hidden_size", "num_attention_heads", "num_moe_experts",
                       "moe_router_topk", "moe_ffn_hidden_size", "vocab_size")

# The numbers a catalogue model's Bridge provider takes as plain fields (emit/python_recipe.py _resized says
# which provider field each becomes). A `base:` that changes only these is the same architecture at
# another size: train.py keeps Bridge's recipe for the base (MLA, router kind, attention sinks, hybrid
# layers, RoPE scaling stay the family's) and sets the new numbers on its provider.
RESIZABLE = frozenset({"num_layers", "first_k_dense", "hidden_size", "ffn_hidden_size", "moe_ffn_hidden_size",
                       "num_moe_experts", "moe_router_topk", "shared_expert_size", "num_attention_heads",
                       "num_query_groups", "kv_channels", "mtp_num_layers", "vocab_size", "q_lora_rank"})
# Not architecture: a label, or figures mocompile never computes with.
_LABELS = frozenset({"base", "display", "params_b", "active_params_b"})
# What the generic GPTModelProvider of a custom model (no Bridge recipe) cannot build: planning with it would
# cost a model that train.py does not train.
_GENERIC_UNBUILDABLE = ("q_lora_rank", "sliding_window", "softmax_sinks", "window_attn_skip_freq",
                        "linear_attention_freq", "linear_num_key_heads", "attention_output_gate")


@functools.cache
def _load(name: str) -> dict[str, Any]:
    return load_yaml(os.path.join(DATA, name))


def models() -> dict[str, dict[str, Any]]:
    return _load("models.yaml")["models"]


def gpus() -> dict[str, dict[str, Any]]:
    return _load("hardware.yaml")["gpus"]


def _defaults(spec: dict[str, Any]) -> dict[str, Any]:
    """Fill what Megatron itself would default, so every field is explicit."""
    out = dict(spec)
    h, heads = out["hidden_size"], out["num_attention_heads"]
    out.setdefault("display", "custom MoE")
    out.setdefault("hf_id", None)
    out.setdefault("first_k_dense", 0)
    out.setdefault("ffn_hidden_size", 4 * h)
    out.setdefault("shared_expert_size", 0)
    out.setdefault("num_query_groups", heads)
    out.setdefault("kv_channels", h // heads if heads else h)
    out.setdefault("attention", "gqa")
    out.setdefault("mtp_num_layers", 0)
    out.setdefault("gated_linear_unit", True)
    out.setdefault("add_bias_linear", False)
    out.setdefault("qk_layernorm", False)
    out.setdefault("moe_router_score_function", "softmax")
    out.setdefault("shared_expert_overlap_default", False)
    out.setdefault("bridge", {"module": None, "recipe": None, "needs_hf_config": False})
    out.setdefault("sources", [])
    return out


def resolve_model(intent: dict[str, Any], doc: Document) -> dict[str, Any]:
    """Turn ``model:`` (an id, or a mapping with an optional ``base``) into numbers."""
    spec = intent["model"]
    catalogue = models()
    if isinstance(spec, str):
        if spec not in catalogue:
            import difflib  # only for an unknown model
            close = difflib.get_close_matches(spec, list(catalogue), n=1, cutoff=0.5)
            hint = f"did you mean `{close[0]}`?" if close else f"known models: {', '.join(sorted(catalogue))}"
            raise InputError([Diagnostic("SCHEMA", "error", f"unknown model `{spec}`",
                                         doc.position(("model",)), hint)])
        return _defaults({"id": spec, **catalogue[spec]})
    base_id = spec.get("base")
    merged: dict[str, Any] = {}
    if base_id is not None:
        if base_id not in catalogue:
            import difflib
            close = difflib.get_close_matches(base_id, list(catalogue), n=1, cutoff=0.5)
            raise InputError([Diagnostic("SCHEMA", "error", f"unknown base model `{base_id}`",
                                         doc.position(("model", "base")),
                                         f"did you mean `{close[0]}`?" if close else "")])
        merged = dict(catalogue[base_id])
        changed = {k: v for k, v in spec.items() if k not in _LABELS and merged.get(k, ...) != v}
        if changed and set(changed) <= RESIZABLE and (merged.get("bridge") or {}).get("recipe") \
                and _generic_lacks(merged):
            # Same family at another size, one the generic provider cannot build: Bridge's recipe for the base
            # builds the family's provider (reading the base's HF config), train.py then sets these numbers on it.
            # (A family it can build, e.g. Qwen3-MoE, stays a custom model: no HF config to fetch on the nodes.)
            derived = _mla_groups_follow_heads(changed, spec, base_id, doc) \
                if merged.get("attention") == "mla" and "num_attention_heads" in changed else []
            merged["resized"] = {"from": base_id, "fields": dict(sorted(changed.items())),
                                 **({"derived": derived} if derived else {})}
            if "display" not in spec:  # the base's name alone would claim the base's size
                merged["display"] = f"{merged.get('display', base_id)} resized (" + ", ".join(
                    f"{k} {v}" for k, v in sorted(changed.items())) + ")"
        elif changed:
            # A changed architecture no longer matches the upstream recipe's model.
            merged["bridge"] = {"module": None, "recipe": None, "needs_hf_config": False}
            merged["hf_id"] = None  # nor does the upstream checkpoint's id describe it any more
            if "display" not in spec:  # nor its name: "Qwen3-30B-A3B" would claim 30B for a 12-layer slice
                merged["display"] = f"custom MoE from {merged.get('display', base_id)} (" + ", ".join(
                    f"{k} {v}" for k, v in sorted(changed.items())) + ")"
    merged.update({k: v for k, v in spec.items() if k != "base"})
    merged.update((merged.get("resized") or {}).get("fields", {}))  # with what follows from them (MLA's groups)
    _check_router_groups(merged, base_id, doc)
    if not (merged.get("bridge") or {}).get("recipe"):
        _refuse_unbuildable(merged, base_id, spec, doc)
    missing = [k for k in REQUIRED_MODEL_KEYS if k not in merged]
    if missing:
        raise InputError([Diagnostic("SCHEMA", "error",
                                     f"custom model is missing {', '.join('`' + m + '`' for m in missing)}",
                                     doc.position(("model",)), "state the architecture numbers or add `base: <catalogue id>`")])
    merged["id"] = f"{base_id}+custom" if base_id and len(spec) > 1 else (base_id or "custom")
    return _defaults(merged)


def _mla_groups_follow_heads(changed: dict[str, Any], spec: dict[str, Any], base_id: str, doc: Document) -> list[str]:
    """MLA has no key/value groups: Megatron-Core's MLASelfAttention hands num_query_groups to Transformer Engine's
    DotProductAttention as its GQA groups, which asserts heads % groups == 0 when the model is built (DeepSeek-V3's
    128 groups with 8 heads failed there on a GPU). Resized heads take the groups along (MDL003 if told otherwise);
    returns the fields set here rather than by the intent."""
    heads = changed["num_attention_heads"]
    groups = spec.get("num_query_groups", heads)
    if groups != heads:
        raise InputError([Diagnostic(
            "MDL003", "error", f"{base_id} uses multi-latent attention, which has no key/value groups: "
            f"num_query_groups must equal num_attention_heads ({heads}), not {groups}",
            doc.position(("model", "num_query_groups")), f"leave `num_query_groups` out (it follows the heads) or set {heads}")])
    changed["num_query_groups"] = heads
    return [] if "num_query_groups" in spec else ["num_query_groups"]


def _generic_lacks(model: dict[str, Any]) -> list[str]:
    """What of ``model``'s architecture Bridge's generic GPTModelProvider cannot build (empty: it can)."""
    kinds = [f"attention `{model['attention']}`"] if model.get("attention", "gqa") != "gqa" else []
    # its router is Megatron-Core's default softmax with an aux loss; a sigmoid router with expert bias is not
    router = model.get("moe_router_score_function") or "softmax"
    kinds += [f"`{router}` router (with expert bias)"] if router != "softmax" else []
    return kinds + [f"`{k}`" for k in _GENERIC_UNBUILDABLE if model.get(k) not in (None, 0, False)]


def _check_router_groups(merged: dict[str, Any], base_id: str | None, doc: Document) -> None:
    """A resized model keeps its base's group-limited router (DeepSeek-V3: top 4 of 8 expert groups), so the
    resized numbers must suit it: MDL002 (the groups divide the experts: TransformerConfig asserts it) and MDL004
    (top-k at least the kept groups: Megatron-Core's ``group_limited_topk`` scores a group by the sum of its top
    ``moe_router_topk // moe_router_group_topk`` experts, which is 0 below that, so every group scores 0 and every
    token keeps the same groups; nothing asserts it). Both at once."""
    if not merged.get("resized"):
        return
    groups = int(merged.get("moe_router_num_groups") or 1)
    kept, topk = int(merged.get("moe_router_group_topk") or 0), int(merged["moe_router_topk"])
    found = []
    if merged["num_moe_experts"] % groups:
        found.append(Diagnostic(
            "MDL002", "error", f"{merged['num_moe_experts']} experts do not divide into {base_id}'s {groups} router "
            "groups (group-limited routing: Megatron-Core's TransformerConfig asserts num_moe_experts % "
            "moe_router_num_groups == 0)", doc.position(("model", "num_moe_experts")),
            f"use a multiple of {groups} experts"))
    if groups > 1 and 0 < kept < groups and topk < kept:
        found.append(Diagnostic(
            "MDL004", "error", f"top-{topk} routing under {base_id}'s group-limited router (each token keeps {kept} of "
            f"{groups} expert groups): Megatron-Core's group_limited_topk scores a group by the sum of its top "
            f"moe_router_topk // moe_router_group_topk = {topk // kept} experts, so every group scores 0 and every token "
            f"keeps the same {kept} groups; the experts of the other {groups - kept} never get a token",
            doc.position(("model", "moe_router_topk")), f"use moe_router_topk >= {kept}"))
    if found:
        raise InputError(found)


def _refuse_unbuildable(merged: dict[str, Any], base_id: str | None, spec: dict[str, Any], doc: Document) -> None:
    """MDL001: a custom model is built by Bridge's generic GPTModelProvider (standard attention, an
    aux-loss router); planning it as MLA, hybrid or sink/window attention would cost another model."""
    kinds = _generic_lacks(merged)
    if not kinds:
        return
    edited = sorted(k for k in spec if k not in _LABELS and k not in RESIZABLE)
    where = ("model",) if not edited else ("model", edited[0])
    # MLA's query projection is a number only an MLA family's recipe takes
    takes = sorted(k for k in RESIZABLE if k != "q_lora_rank" or models().get(base_id or "", {}).get("attention") == "mla")
    hint = (f"change only the numbers Bridge's {base_id} recipe takes ({', '.join(takes)}): train.py then "
            f"keeps that recipe's architecture" if base_id else
            "start from a catalogue model of that architecture with `base:` and change only its numbers")
    if any("router" in k for k in kinds):
        hint += "; or, to train it with the generic provider's router, set `moe_router_score_function: softmax`"
    raise InputError([Diagnostic("MDL001", "error",
                                 f"a custom model is built by Megatron-Bridge's generic GPTModelProvider, which has no "
                                 f"{', '.join(kinds)}"
                                 + (f" (changing {', '.join('`' + k + '`' for k in edited)} leaves {base_id}'s recipe)"
                                    if base_id and edited else ""),
                                 doc.position(where), hint)])


def nvlink_segment(nodes: int, gpus_per_node: int, rack_gpus: int) -> int:
    """How many nodes (trays) of a multi-node NVLink job share one NVLink domain. A rack (an NVL72: 18 trays of 4)
    joins only its own trays, so a job larger than one rack is placed as equal segments of whole trays inside racks:
    its node count if one rack holds it, else its largest divisor a rack holds (Slurm's ``--segment``, as
    Megatron-Bridge's performance launcher asks for it: ``scripts/performance/utils/executors.py``). 64 trays run as
    4 segments of 16 (64 GPUs of NVLink each), 72 as 4 of 18, 24 as 2 of 12."""
    rack_nodes = max(1, rack_gpus // gpus_per_node)
    if nodes <= rack_nodes:
        return nodes
    return next(d for d in range(rack_nodes, 0, -1) if nodes % d == 0)


def resolve_hardware(intent: dict[str, Any]) -> dict[str, Any]:
    hw = intent["hardware"]
    gpu = dict(gpus()[hw["gpu"]])
    gpu["id"] = hw["gpu"]
    gpu["nodes"] = hw.get("nodes", 1)
    gpu["gpus_per_node"] = hw.get("gpus_per_node") or gpu["gpus_per_node"]
    gpu["world_size"] = gpu["nodes"] * gpu["gpus_per_node"]
    if gpu.get("mnnvl"):
        gpu["segment_nodes"] = nvlink_segment(gpu["nodes"], gpu["gpus_per_node"], gpu["nvlink_domain"])
        gpu["rack_gpus"] = gpu["nvlink_domain"]
        gpu["nvlink_domain"] = gpu["segment_nodes"] * gpu["gpus_per_node"]
    # An NVLink domain never spans more GPUs than exist, nor (without MNNVL) a node.
    domain = gpu["nvlink_domain"] if gpu.get("mnnvl") else min(gpu["nvlink_domain"], gpu["gpus_per_node"])
    gpu["nvlink_domain_effective"] = min(domain, gpu["world_size"])
    return gpu
