"""`mocompile init --from <Bridge perf recipe>`: an intent pinned to a shipped, tuned recipe.

The way in for teams that start from NVIDIA's recipes: every knob the recipe sets is pinned, so
the compiled plan is the recipe (checked by the same rules), and unpinning a knob hands it back
to the planner. ``--gpus`` weak-scales the recipe by data parallelism, as Bridge's harness does.
"""

from __future__ import annotations

import difflib
import json
from typing import Any

from mocompile.catalogue import gpus
from mocompile.errors import UsageError
from mocompile.resolve.search import anchors

GRAPHS = {"none": ("none", None), "te_rp": ("transformer_engine", ["moe_router", "moe_preprocess"]),
          "te_arp": ("transformer_engine", ["attn", "moe_router", "moe_preprocess"]),
          "full_iteration": ("full_iteration", None)}


def find(name: str) -> dict[str, Any]:
    names = {a["recipe"]: a for a in anchors()}
    key = name if name.endswith("_config") else name + "_config"
    if key in names:
        return names[key]
    close = difflib.get_close_matches(key, list(names), n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; `mocompile init --list` shows the recipes"
    raise UsageError(f"unknown Bridge perf recipe `{name}`{hint}")


def _flow(d: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in d.items()) + "}"


def intent_text(a: dict[str, Any], gpus_wanted: int | None = None) -> str:
    """The intent YAML for anchor ``a`` (weak-scaled to ``gpus_wanted`` GPUs)."""
    n = gpus_wanted or a["gpus"]
    per_node = gpus()[a["gpu"]]["gpus_per_node"]
    model_parallel = max(a["tp"] * a["pp"] * a["cp"], a["ep"] * a["etp"] * a["pp"])
    if n % model_parallel or n % min(n, per_node) or (n > per_node and n % per_node):
        raise UsageError(f"{n} GPUs: the recipe needs a multiple of {model_parallel} GPUs "
                         f"(and whole nodes of {per_node})")
    scale = n / a["gpus"]
    gbs = int(a["gbs"] * scale)
    if gbs < 1 or gbs != a["gbs"] * scale:
        raise UsageError(f"{n} GPUs: the global batch {a['gbs']} does not scale to a whole number")
    nodes, per = (n // per_node, per_node) if n >= per_node else (1, n)
    par: dict[str, Any] = {k: a[k] for k in ("tp", "pp", "vpp", "ep", "etp", "cp")}
    if a.get("layout"):
        par["layout"] = a["layout"]
    moe: dict[str, Any] = {"dispatcher": a["dispatcher"], "overlap": a["overlap"], "delay_wgrad": a["delay_wgrad"],
                           "force_balance": True}
    if a["dispatcher"] in ("deepep", "hybridep") and a.get("num_sms"):
        moe["num_sms"] = a["num_sms"]
    rc = a["recompute"]
    recompute: dict[str, Any] = {"granularity": "none"} if rc in ("none", []) else \
        {"granularity": "full", "method": "uniform", "num_layers": 1} if rc == "full" else \
        {"granularity": "selective", "modules": list(rc)}
    impl, modules = GRAPHS[a["graphs"]]
    # the recipe's optimizer (Kimi-K2's train with Muon; adam is the intent's default)
    opt = f", optimizer: {a['optimizer']}" if a.get("optimizer", "adam") != "adam" else ""
    graphs: dict[str, Any] = {"impl": impl} if modules is None else {"impl": impl, "modules": modules}
    lines = [
        f"# Pinned to Megatron-Bridge's tuned perf recipe {a['recipe']}",
        f"# ({a['module']}), {'weak-scaled by DP to ' + str(n) + ' GPUs' if scale != 1 else 'as shipped'}.",
        "# Every knob below is the recipe's; set one to `auto` to let mocompile's planner decide it.",
        "schema: 1",
        f"model: {a['model']}",
        f"hardware: {{gpu: {a['gpu']}, nodes: {nodes}, gpus_per_node: {per}}}",
        "goal: throughput",
        f"training: {{seq_length: 4096, micro_batch_size: {a['mbs']}, global_batch_size: {gbs}, "
        f"precision: {a['precision']}{opt}}}",
        f"parallelism: {_flow(par)}",
        f"moe: {_flow(moe)}",
        f"recompute: {_flow(recompute)}",
        f"cuda_graphs: {_flow(graphs)}",
    ]
    return "\n".join(lines) + "\n"
