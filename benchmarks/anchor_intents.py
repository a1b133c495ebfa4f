"""Intents a new user would write for each shipped perf recipe (shared by calibrate and plan_quality)."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "compiler"))
# The benchmarks run the compiler in-process: they need its dependencies, not only the stdlib.
_MISSING = [name for name in ("ruamel", "cerberus") if importlib.util.find_spec(name) is None]
if _MISSING:
    sys.exit(f"{os.path.basename(sys.argv[0])}: missing {', '.join(_MISSING)}. Run it with mocompile's environment: "
             "`bin/mocompile --version` creates .venv once, then `.venv/bin/python benchmarks/<script>.py`")

from mocompile.catalogue import gpus  # noqa: E402
from mocompile.load import load  # noqa: E402
from mocompile.resolve import context  # noqa: E402
from mocompile.resolve.context import Context  # noqa: E402
from mocompile.resolve.search import anchors  # noqa: E402
from mocompile.schema import validate  # noqa: E402


def intent_text(a: dict[str, Any], scale: int = 1, optimizer: bool = False) -> str:
    """model, GPU, node count, goal throughput, the recipe's batch shape and precision, forced balance;
    ``optimizer=True``: also the recipe's optimizer (training.optimizer: muon for Kimi-K2's; adam is the default)."""
    gpn = gpus()[a["gpu"]]["gpus_per_node"]
    n = a["gpus"] * scale
    nodes, per = (n // gpn, gpn) if n >= gpn else (1, n)
    opt = f", optimizer: {a['optimizer']}" if optimizer and a.get("optimizer", "adam") != "adam" else ""
    return (f"schema: 1\nname: pq\nmodel: {a['model']}\nhardware: {{gpu: {a['gpu']}, nodes: {nodes}, gpus_per_node: {per}}}\n"
            f"goal: throughput\ntraining: {{seq_length: 4096, micro_batch_size: {a['mbs']}, "
            f"global_batch_size: {a['gbs'] * scale}, precision: {a['precision']}{opt}}}\nmoe: {{force_balance: true}}\n")


def consistent(a: dict[str, Any]) -> bool:
    """Can the recipe's layout run on its own GPU count? (a few shipped rows cannot: EP*PP > GPUs)"""
    n = a["gpus"]
    return n % (a["tp"] * a["pp"] * a["cp"]) == 0 and n % (a["ep"] * a["etp"] * a["pp"]) == 0


def shipped_rows() -> list[dict[str, Any]]:
    return [a for a in anchors() if not a["variant"]]


def context_for(text: str) -> Context:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "pq.yaml")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        doc = load(path)
        return context(validate(doc), doc)
