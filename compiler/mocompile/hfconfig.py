"""Vendored Hugging Face model configs (``model_config:``): the model's architecture travels with the recipe.

Bridge's recipe for a catalogue model builds ``cfg.model`` with ``AutoBridge.from_hf_pretrained(<hf id>)``
(Megatron-Bridge models/conversion/auto_bridge.py), which reads the model's ``config.json`` from the hub or
the node's HF cache on every rank at start-up: an air-gapped cluster fails there. A recipe may instead name a
``config.json`` the user downloaded once (``huggingface-cli download <hf id> config.json``), inside the
project; the compiler checks it describes the catalogue model it plans for, copies it into the generated
folder, and ``train.py`` hands Bridge that folder for exactly that id.

The file is untrusted input, read like a cluster profile: confined to the project, size-limited, UTF-8,
JSON errors positioned. Its text joins the compile's hashed inputs (a changed file makes generated files
stale); the copy's sha256 goes into the lock (a hand-edited copy is caught by ``mocompile check``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from mocompile.catalogue import models
from mocompile.errors import InputError
from mocompile.ir import Diagnostic, Document, Position

COPY = "hf_config/config.json"  # where the copy lies in generated/<name>/ (AutoBridge reads the folder)

# Catalogue field -> the HF config.json field it is read from, per ``model_type`` (transformers' config classes,
# as Bridge's model bridges read them: models/qwen/qwen3_moe_bridge.py, models/deepseek/deepseek_v3_bridge.py,
# models/gpt_oss/gpt_oss_bridge.py, models/qwen/qwen3_next_bridge.py, models/glm/glm45_bridge.py). ``len(x)``: the
# length of a list; ``a * b``: a product; ``a|b``: the first present (transformers' ``attribute_map`` aliases: a hub config.json
# may carry either name, e.g. Qwen3-MoE's num_experts is saved as num_local_experts by transformers 5).
# The numbers mocompile plans with; anything else stays Bridge's reading of the file.
_COMMON = (("num_layers", "num_hidden_layers"), ("hidden_size", "hidden_size"),
           ("num_attention_heads", "num_attention_heads"), ("num_query_groups", "num_key_value_heads"))
FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "qwen3_moe": _COMMON + (("kv_channels", "head_dim"), ("ffn_hidden_size", "intermediate_size"),
                            ("moe_ffn_hidden_size", "moe_intermediate_size"),
                            ("num_moe_experts", "num_experts|num_local_experts"), ("moe_router_topk", "num_experts_per_tok"),
                            ("first_k_dense", "len(mlp_only_layers)"),
                            ("vocab_size", "vocab_size")),
    "deepseek_v3": _COMMON + (("kv_channels", "v_head_dim"), ("ffn_hidden_size", "intermediate_size"),
                              ("moe_ffn_hidden_size", "moe_intermediate_size"),
                              ("num_moe_experts", "n_routed_experts|num_local_experts"),
                              ("moe_router_topk", "num_experts_per_tok"),
                              ("first_k_dense", "first_k_dense_replace"),
                              ("shared_expert_size", "moe_intermediate_size * n_shared_experts"),
                              ("vocab_size", "vocab_size")),
    "gpt_oss": _COMMON + (("kv_channels", "head_dim"), ("moe_ffn_hidden_size", "intermediate_size"),
                          ("num_moe_experts", "num_local_experts|num_experts"), ("moe_router_topk", "num_experts_per_tok"),
                          ("vocab_size", "vocab_size")),
    "glm4_moe": _COMMON + (("kv_channels", "head_dim"), ("ffn_hidden_size", "intermediate_size"),
                           ("moe_ffn_hidden_size", "moe_intermediate_size"),
                           ("num_moe_experts", "n_routed_experts|num_local_experts"),
                           ("moe_router_topk", "num_experts_per_tok"), ("first_k_dense", "first_k_dense_replace"),
                           ("shared_expert_size", "moe_intermediate_size * n_shared_experts"),
                           ("mtp_num_layers", "num_nextn_predict_layers"), ("vocab_size", "vocab_size")),
    "qwen3_next": _COMMON + (("kv_channels", "head_dim"), ("ffn_hidden_size", "intermediate_size"),
                             ("moe_ffn_hidden_size", "moe_intermediate_size"),
                             ("num_moe_experts", "num_experts|num_local_experts"), ("moe_router_topk", "num_experts_per_tok"),
                             ("shared_expert_size", "shared_expert_intermediate_size"), ("vocab_size", "vocab_size")),
}


def _error(rule: str, message: str, pos: Position, hint: str = "") -> InputError:
    return InputError([Diagnostic(rule, "error", message, pos, hint)])


def read(doc: Document) -> None:
    """Read the file ``model_config`` names into ``doc.hf_config`` (and its text into the hashed inputs)."""
    from mocompile.load import read_text
    from mocompile.project import project_file

    path = doc.data.get("model_config")
    if path is None:
        return
    pos = doc.position(("model_config",))
    full = project_file(path, "model_config", pos, doc.files[-1], "hf/qwen3-30b-a3b/config.json",
                        "keep the downloaded config.json in the project (e.g. hf/<model>/)")
    if os.path.isdir(full):
        full = os.path.join(full, "config.json")
    if not os.path.exists(full):
        raise _error("INPUT", f"`model_config` names a missing file: {path}", pos,
                     "paths are relative to the recipe that names it; download it with "
                     "`huggingface-cli download <hf id> config.json --local-dir <folder>`")
    text = read_text(full, pos)  # regular file, size limit (LIM001), UTF-8
    data = parse(text, full)
    doc.text[full] = text
    doc.files.insert(0, full)  # hashed like a base file: a changed config makes generated files stale
    doc.hf_config = {"path": path, "file": full, "text": text, "data": data,
                     "sha256": hashlib.sha256(text.encode("utf-8")).hexdigest()}


def parse(text: str, file: str) -> dict[str, Any]:
    """A JSON object, or an ``InputError`` at the line and column where the text stops being one."""
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = value
        return out

    try:
        data = json.loads(text, object_pairs_hook=unique)
    except json.JSONDecodeError as exc:
        raise _error("INPUT", f"malformed JSON: {exc.msg}", Position(file, exc.lineno, exc.colno),
                     "a Hugging Face config.json as the hub serves it") from None
    except (ValueError, RecursionError) as exc:
        raise _error("INPUT", f"malformed JSON: {str(exc) or type(exc).__name__}", Position(file, 1, 1),
                     "a Hugging Face config.json as the hub serves it") from None
    if not isinstance(data, dict):
        raise _error("INPUT", "a Hugging Face config.json is one JSON object", Position(file, 1, 1))
    return data


def _at(file: str, text: str, key: str) -> Position:
    """Where ``"key":`` first stands in the file (its top-level fields are what we read)."""
    m = re.search(r'"' + re.escape(key) + r'"\s*:', text)
    if m is None:
        return Position(file, 1, 1)
    line = text.count("\n", 0, m.start()) + 1
    return Position(file, line, m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1)


def _value(data: dict[str, Any], expr: str) -> tuple[Any, str]:
    """The value of one field expression, and the HF field to point at."""
    if expr.startswith("len("):
        name = expr[4:-1]
        v = data.get(name, [])  # transformers' default for Qwen3-MoE's mlp_only_layers: none
        return (len(v) if isinstance(v, list) else v), name
    if " * " in expr:
        a, b = expr.split(" * ")
        x, y = data.get(a, ...), data.get(b, ...)
        for v, k in ((x, a), (y, b)):
            if v is ... or isinstance(v, bool) or not isinstance(v, int):
                return v, k  # missing or not a whole number: reported against that field
        return x * y, b
    if "|" in expr:
        names = expr.split("|")
        name = next((n for n in names if n in data), names[0])
        return data.get(name, ...), name
    return data.get(expr, ...), expr


def verify(model: dict[str, Any], doc: Document) -> dict[str, Any]:
    """Check the vendored config describes ``model`` (the resolved catalogue entry); record it on the model."""
    vend = getattr(doc, "hf_config", None)
    if not vend:
        return model
    pos = doc.position(("model_config",))
    file, text, data = vend["file"], vend["text"], vend["data"]
    bridge = model.get("bridge") or {}
    if not (bridge.get("recipe") and bridge.get("needs_hf_config") and model.get("hf_id")):
        raise _error("HFC003", f"`model_config` is for a catalogue model whose Bridge recipe reads its Hugging Face "
                     f"config; model `{model.get('id')}` has none (its train.py builds the model from the recipe's "
                     "numbers)", pos, "remove `model_config`")
    want_type, want_arch = bridge.get("hf_model_type"), bridge.get("hf_architectures")
    fields = FIELDS.get(str(want_type))
    if not fields or not want_arch:
        raise _error("HFC003", f"mocompile cannot check a vendored config of {model['hf_id']} (catalogue "
                     f"`{model['id']}`): it has no field map for its Hugging Face config"
                     + (" and Bridge's recipe loads it with trust_remote_code (its code files would travel too)"
                        if bridge.get("trust_remote_code") else ""),
                     pos, "remove `model_config` and fill the nodes' HF cache instead (preflight RUN014)")
    have_type = data.get("model_type")
    if have_type != want_type:
        raise _error("HFC001", f"{os.path.basename(file)} is a `{have_type}` config (model_type), not the "
                     f"`{want_type}` of {model['hf_id']} that Bridge's {bridge['recipe']} builds",
                     _at(file, text, "model_type"), f"download {model['hf_id']}'s own config.json")
    arch = data.get("architectures")
    if arch != want_arch:
        raise _error("HFC001", f"architectures {arch!r} in {os.path.basename(file)}, {model['hf_id']} has "
                     f"{want_arch!r}: Bridge picks its model bridge by this name (AutoBridge._validate_config)",
                     _at(file, text, "architectures"), f"download {model['hf_id']}'s own config.json")
    matched: dict[str, int] = {}
    # A resized catalogue model (catalogue.RESIZABLE): the file is the base's config, which Bridge's recipe reads
    # before train.py sets the new numbers on its provider.
    resized = model.get("resized")
    base = {**model, **models()[resized["from"]]} if resized else model
    for ours, expr in fields:
        value, key = _value(data, expr)
        want = base.get(ours)
        if value is ...:
            raise _error("HFC002", f"{os.path.basename(file)} has no `{key}`: the {ours} mocompile plans with "
                         f"({want}) cannot be checked", pos, f"download {model['hf_id']}'s own config.json")
        if isinstance(value, bool) or not isinstance(value, int) or value != want:
            raise _error("HFC002", f"`{expr}` is {value!r} in {os.path.basename(file)}, the catalogue's "
                         f"{model['id']} plans with {ours} {want!r}: the config is not {model['hf_id']}'s",
                         _at(file, text, key),
                         f"download {model['hf_id']}'s own config.json, or describe another model with "
                         "`model: {base: ..., <numbers>}`")
        matched[ours] = value
    out = dict(model)
    out["vendored_config"] = {"source": vend["file"], "path": vend["path"], "copy": COPY, "sha256": vend["sha256"],
                              "model_type": want_type, "architectures": list(want_arch), "matched": matched}
    return out
