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
        # A changed architecture no longer matches the upstream recipe's model.
        if set(spec) - {"base", "display"}:
            merged["bridge"] = {"module": None, "recipe": None, "needs_hf_config": False}
            merged["hf_id"] = None  # nor does the upstream checkpoint's id describe it any more
    merged.update({k: v for k, v in spec.items() if k != "base"})
    missing = [k for k in REQUIRED_MODEL_KEYS if k not in merged]
    if missing:
        raise InputError([Diagnostic("SCHEMA", "error",
                                     f"custom model is missing {', '.join('`' + m + '`' for m in missing)}",
                                     doc.position(("model",)), "state the architecture numbers or add `base: <catalogue id>`")])
    merged["id"] = f"{base_id}+custom" if base_id and len(spec) > 1 else (base_id or "custom")
    return _defaults(merged)


def resolve_hardware(intent: dict[str, Any]) -> dict[str, Any]:
    hw = intent["hardware"]
    gpu = dict(gpus()[hw["gpu"]])
    gpu["id"] = hw["gpu"]
    gpu["nodes"] = hw.get("nodes", 1)
    gpu["gpus_per_node"] = hw.get("gpus_per_node") or gpu["gpus_per_node"]
    gpu["world_size"] = gpu["nodes"] * gpu["gpus_per_node"]
    # An NVLink domain never spans more GPUs than exist, nor (without MNNVL) a node.
    domain = gpu["nvlink_domain"] if gpu.get("mnnvl") else min(gpu["nvlink_domain"], gpu["gpus_per_node"])
    gpu["nvlink_domain_effective"] = min(domain, gpu["world_size"])
    return gpu
