"""Stage 3: decide every knob the user left ``auto``, recording why.

Passes run in a declared order; each reads the values decided before it. The
resolver tries candidates against the rule catalogue, so it never emits a plan
that breaks a rule; derived settings are computed from the final values.
"""

from __future__ import annotations

from typing import Any, Callable

from mocompile.catalogue import resolve_hardware, resolve_model
from mocompile.ir import Document, Plan
from mocompile.resolve import derived, moe, parallelism, recompute
from mocompile.resolve.context import Context

PASSES: tuple[Callable[[Context], None], ...] = (
    parallelism.base,
    parallelism.layout,
    parallelism.pipeline,
    moe.dispatcher,
    moe.overlap,
    recompute.plan,
    derived.graphs,
    derived.p2p_and_grads,
    derived.environment,
    recompute.memory_pass,
)


def resolve(intent: dict[str, Any], doc: Document) -> Plan:
    ctx = Context(intent, doc, resolve_model(intent, doc), resolve_hardware(intent))
    for step in PASSES:
        step(ctx)
    return ctx.plan()
