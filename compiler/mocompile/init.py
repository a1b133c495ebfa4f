"""`mocompile init --from <Bridge perf recipe>`: an intent pinned to a shipped, tuned recipe.

The way in for teams that start from NVIDIA's recipes: every knob the recipe sets is pinned, so
the compiled plan is the recipe (checked by the same rules), and unpinning a knob hands it back
to the planner. ``--gpus`` weak-scales the recipe by data parallelism, as Bridge's harness does. A recipe
whose layout needs more GPUs than its name says (DeepSeek-V3's 64-GPU H100 recipe: PP8 x EP64) is written at
the smallest size that holds it, and says so.

Routing is the model's own (``moe.force_balance`` left ``auto``): a real run must learn its routing. NVIDIA's
perf recipes measure with force-balanced routing (random router logits); ``--benchmark`` pins that, with a
comment saying the model does not learn routing then.
"""

from __future__ import annotations

import difflib
import json
import math
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


def model_parallel(a: dict[str, Any]) -> int:
    """The GPU count every size must be a multiple of: a pipeline stage holds TP x CP ranks for attention and
    ETP x EP for the experts (Megatron-Core folds both into the same ranks), so the world is a multiple of
    PP x lcm(TP x CP, ETP x EP)."""
    return a["pp"] * math.lcm(a["tp"] * a["cp"], a["ep"] * a["etp"])


def _holds(n: int, a: dict[str, Any], per_node: int) -> bool:
    return n % model_parallel(a) == 0 and (n <= per_node or n % per_node == 0)


def smallest_size(a: dict[str, Any]) -> int:
    """The recipe's own GPU count if its layout fits there, else the fewest whole nodes at a multiple of the
    listed count (so that the global batch weak-scales to a whole number) that hold it."""
    per_node = gpus()[a["gpu"]]["gpus_per_node"]
    n = a["gpus"]
    while not _holds(n, a, per_node):
        n += a["gpus"]
    return n


def intent_text(a: dict[str, Any], gpus_wanted: int | None = None, benchmark: bool = False) -> str:
    """The intent YAML for anchor ``a`` (weak-scaled to ``gpus_wanted`` GPUs, or to the smallest size that
    holds the recipe's layout when its listed size does not)."""
    per_node = gpus()[a["gpu"]]["gpus_per_node"]
    n = gpus_wanted or smallest_size(a)
    if not _holds(n, a, per_node):
        raise UsageError(f"{n} GPUs: the recipe needs a multiple of {model_parallel(a)} GPUs "
                         f"(and whole nodes of {per_node})")
    scale = n / a["gpus"]
    gbs = int(a["gbs"] * scale)
    if gbs < 1 or gbs != a["gbs"] * scale:
        raise UsageError(f"{n} GPUs: the global batch {a['gbs']} does not scale to a whole number")
    nodes, per = (n // per_node, per_node) if n >= per_node else (1, n)
    par: dict[str, Any] = {k: a[k] for k in ("tp", "pp", "vpp", "ep", "etp", "cp")}
    if a.get("layout"):
        par["layout"] = a["layout"]
    par["fsdp"] = False  # the shipped recipes (anchors) run the distributed optimizer, as its memory was measured
    moe: dict[str, Any] = {"dispatcher": a["dispatcher"], "overlap": a["overlap"], "delay_wgrad": a["delay_wgrad"]}
    if benchmark:
        moe["force_balance"] = True
    if a["dispatcher"] in ("deepep", "hybridep") and a.get("num_sms"):
        moe["num_sms"] = a["num_sms"]
    rc = a["recompute"]
    recompute: dict[str, Any] = {"granularity": "none"} if rc in ("none", []) else \
        {"granularity": "full", "method": "uniform", "num_layers": 1} if rc == "full" else \
        {"granularity": "selective", "modules": list(rc)}
    recompute["offload_modules"] = []  # no shipped recipe of the table offloads activations (its memory as measured)
    impl, modules = GRAPHS[a["graphs"]]
    # the recipe's optimizer (Kimi-K2's train with Muon; adam is the intent's default)
    opt = f", optimizer: {a['optimizer']}" if a.get("optimizer", "adam") != "adam" else ""
    graphs: dict[str, Any] = {"impl": impl} if modules is None else {"impl": impl, "modules": modules}
    if gpus_wanted is None and n != a["gpus"]:
        size = (f"written at {n} GPUs, weak-scaled by DP: its layout (PP{a['pp']} x EP{a['ep']}"
                f"{' x ETP' + str(a['etp']) if a['etp'] > 1 else ''}, TP{a['tp']}) does not fit the {a['gpus']} "
                "GPUs its name says")
    else:
        size = f"weak-scaled by DP to {n} GPUs" if scale != 1 else "as shipped"
    routing = ("# moe.force_balance: true is how NVIDIA measures this recipe (--benchmark): random router logits,\n"
               "# so the model does not learn routing. Remove it for a real training run."
               if benchmark else
               "# Routing is the model's own; NVIDIA measured this recipe with force-balanced routing (--benchmark).")
    lines = [
        f"# Pinned to Megatron-Bridge's tuned perf recipe {a['recipe']}",
        f"# ({a['module']}), {size}.",
        "# Every knob below is the recipe's; set one to `auto` to let mocompile's planner decide it.",
        routing,
        "schema: 1",
        f"model: {a['model']}",
        f"hardware: {{gpu: {a['gpu']}, nodes: {nodes}, gpus_per_node: {per}}}",
        "goal: throughput",
        f"training: {{seq_length: 4096, micro_batch_size: {a['mbs']}, global_batch_size: {gbs}, "
        f"precision: {a['precision']}{opt}, optimizer_state: fp32, optimizer_offload: 0}}",
        f"parallelism: {_flow(par)}",
        f"moe: {_flow(moe)}",
        f"recompute: {_flow(recompute)}",
        f"cuda_graphs: {_flow(graphs)}",
    ]
    text = "\n".join(lines) + "\n"
    if not benchmark and "MEM001" in _errors(text):
        # NVIDIA's recompute plan was measured with balanced routing; natural routing sends some experts more
        # tokens than the average (the estimator's routing imbalance), so the recipe's recompute may not fit.
        at = lines.index(f"recompute: {_flow(recompute)}")
        lines[at:at + 1] = [f"# The recipe's recompute ({_flow(recompute)}) fits only with force-balanced routing by "
                            "mocompile's memory estimate:", "# `auto` lets the planner add the recompute natural "
                            "routing needs (explain says what it chose).", "recompute: {granularity: auto, offload_modules: []}"]
        text = "\n".join(lines) + "\n"
        if "MEM001" in _errors(text):  # recompute is not enough: the micro-batch's activations are the rest
            at = next(i for i, line in enumerate(lines) if line.startswith("training: "))
            lines[at:at + 1] = [f"# The recipe's micro_batch_size {a['mbs']} does not fit natural routing even with "
                                "recompute: `auto` searches it within memory.",
                                lines[at].replace(f"micro_batch_size: {a['mbs']}", "micro_batch_size: auto")]
            text = "\n".join(lines) + "\n"
    return text


def _errors(text: str) -> set[str]:
    """The rule IDs of the errors the intent compiles to (the intent is written to a scratch file)."""
    import os
    import tempfile

    from mocompile.errors import InputError
    from mocompile.pipeline import analyse

    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "intent.yaml")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            return {d.rule for d in analyse(path).errors}
        except InputError as exc:
            return {d.rule for d in exc.diagnostics}
