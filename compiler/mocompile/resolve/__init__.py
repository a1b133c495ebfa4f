"""Stage 3: decide every knob the user left ``auto``, recording why.

Passes run in a declared order. ``decide.plan`` runs the planner: a joint search
over everything left ``auto``, scored by the step-time model and checked against
the rule catalogue, so an auto plan never breaks a rule; derived settings are
computed from the final values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mocompile import cluster, hfconfig
from mocompile.catalogue import resolve_hardware, resolve_model
from mocompile.ir import Document, Plan
from mocompile.resolve import decide, derived, parallelism, tuning
from mocompile.resolve.context import Context

PASSES: tuple[Callable[[Context], None], ...] = (
    parallelism.base,
    tuning.host_and_fusion,   # before the search: the gradient dtype changes what fits
    decide.plan,
    derived.p2p_and_grads,
    derived.ncclep_budget,
    derived.environment,
    derived.memory_pass,
)


def _model(intent: dict[str, Any], doc: Document) -> dict[str, Any]:
    """The model's numbers, checked against the Hugging Face config the recipe vendors (``model_config``), if any."""
    return hfconfig.verify(resolve_model(intent, doc), doc)


def resolve(intent: dict[str, Any], doc: Document) -> Plan:
    ctx = Context(intent, doc, _model(intent, doc), cluster.apply(resolve_hardware(intent), doc))
    for step in PASSES:
        step(ctx)
    return ctx.plan()


def context(intent: dict[str, Any], doc: Document) -> Context:
    """A context with the facts set (model, hardware, stack, batch): what the planner starts from."""
    ctx = Context(intent, doc, _model(intent, doc), cluster.apply(resolve_hardware(intent), doc))
    for step in PASSES[:PASSES.index(decide.plan)]:
        step(ctx)
    return ctx
