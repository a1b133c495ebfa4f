"""Run the rule catalogue over a plan and turn violations into diagnostics."""

from __future__ import annotations

import functools
import os
import re
from typing import Any, NamedTuple

from mocompile import memory
from mocompile.datafiles import load_yaml
from mocompile.ir import Diagnostic, Plan, Position
from mocompile.layout import layout_error
from mocompile.rules.checks import CHECKS, DEEPEP_GROUP_SIZES, missing_package, node_gpus
from mocompile.versions import in_range

CATALOGUE = os.path.join(os.path.dirname(__file__), "catalogue.yaml")
VERSION_KEYS = {"megatron_core": "mcore_version", "megatron_bridge": "bridge_version",
                "torch": "torch_version", "transformer_engine": "te_version"}


class Rule(NamedTuple):
    """One catalogue rule (a tuple, as ``ir.Position``: built at import by every command-line run)."""

    id: str
    name: str
    severity: str
    fields: tuple[str, ...]
    message: str
    hint: str
    upstream: str
    source: str
    versions: tuple[tuple[str, str], ...]
    examples: dict[str, Any]
    # fields this rule, broken, leaves without a meaning (PAR001: DP is not a whole number): rules that read
    # them are not reported beside it, so an error has one root cause, not its consequences too
    masks: tuple[str, ...] = ()

    def applies(self, cfg: dict[str, Any]) -> bool:
        """A rule keyed by versions holds only where the target stack is in range."""
        return all(in_range(cfg.get(VERSION_KEYS[k]), spec) for k, spec in self.versions)

    def broken(self, cfg: dict[str, Any]) -> bool:
        return self.applies(cfg) and CHECKS[self.id](cfg)


@functools.lru_cache(maxsize=1)
def rules() -> tuple[Rule, ...]:
    entries = load_yaml(CATALOGUE)
    out = []
    for e in entries:
        out.append(Rule(e["id"], e["name"], e["severity"], tuple(e["fields"]), e["message"], e["hint"],
                        e["upstream"], e["source"], tuple(sorted((e.get("versions") or {}).items())),
                        e.get("examples") or {}, tuple(e.get("masks") or ())))
    ids = [r.id for r in out]
    if len(set(ids)) != len(ids) or set(ids) != set(CHECKS):
        raise RuntimeError(f"rule catalogue and checks disagree: {sorted(set(ids) ^ set(CHECKS))}")
    return tuple(out)


def by_id() -> dict[str, Rule]:
    return {r.id: r for r in rules()}


def context(cfg: dict[str, Any]) -> dict[str, Any]:
    """Values that messages may quote, beyond the plain fields."""
    ctx = dict(cfg)
    vpp = cfg.get("virtual_pipeline_model_parallel_size") or 1
    pp = cfg.get("pipeline_model_parallel_size", 1)
    ctx.update(
        vpp=vpp,
        cp2=2 * cfg.get("context_parallel_size", 1),
        ep_group=cfg.get("expert_model_parallel_size", 1) * cfg.get("expert_tensor_parallel_size", 1),
        missing_package=missing_package(cfg) if "moe_token_dispatcher_type" in cfg else None,
        deepep_sizes=", ".join(map(str, DEEPEP_GROUP_SIZES)),
        nccl_algo=(cfg.get("env") or {}).get("NCCL_ALGO"),
        nvte_nondeterministic=(cfg.get("env") or {}).get("NVTE_ALLOW_NONDETERMINISTIC_ALGO"),
        nvte_cpu_offload=(cfg.get("env") or {}).get("NVTE_CPU_OFFLOAD_V1"),
        hybridep_ranks=cfg.get("hybridep_ranks_per_domain"),
        te_display=f"Transformer Engine {cfg['te_version']}" if cfg.get("te_version") else "no Transformer Engine",
        stages=pp * vpp,
        node_gpus=node_gpus(cfg),
        attention_width=(cfg.get("num_attention_heads") or 0) * (cfg.get("kv_channels") or 0),
        layers_per_rank=cfg.get("num_layers", 0) // max(1, pp),
        num_microbatches=cfg.get("global_batch_size", 0)
        // max(1, cfg.get("micro_batch_size", 1) * cfg.get("data_parallel_size", 1)),
    )
    ctx.update(_memory_values(cfg))
    ctx.update(_batch_values(cfg))
    if cfg.get("pipeline_model_parallel_layout"):
        ctx["layout_error"] = layout_error(cfg["pipeline_model_parallel_layout"], pp, vpp,
                                           cfg.get("num_layers", 0), cfg.get("mtp_num_layers") or 0)
    return ctx


def _memory_values(cfg: dict[str, Any]) -> dict[str, Any]:
    """What MEM001/MEM002 quote beyond the plain fields: where the limit comes from and the margin over the GPU."""
    gib, est = cfg.get("gpu_memory_gib"), cfg.get("memory_estimate_gib")
    if not gib or est is None:
        return {}
    err = memory.limits()["measured_error"]
    shipped = cfg.get("shipped_recipe")
    basis = (f"its {gib} GiB plus the memory estimate's measured error of {err:.1%}: {shipped} run as shipped"
             if shipped else f"{memory.limits()['headroom']:.0%} of its {gib} GiB: the planner's headroom")
    return {"memory_limit_basis": basis, "memory_over_gib": f"{est - gib:.2f}", "memory_over_pct": f"{est / gib - 1:.1%}",
            "memory_error_pct": f"{err:.1%}",
            "memory_limit_gib": cfg.get("memory_limit_gib") or memory.usable_gib(gib)}


def _batch_values(cfg: dict[str, Any]) -> dict[str, Any]:
    """What PAR007's message quotes: the unit the global batch must be a multiple of (micro-batch size x data
    parallelism) and the nearest global batches that are, so a user whose layout the planner chose (and who never
    wrote a DP size) sees numbers to write instead of a rule to work out."""
    gbs, mbs, dp = (_count(cfg.get(k)) for k in ("global_batch_size", "micro_batch_size", "data_parallel_size"))
    if gbs is None or mbs is None:
        return {}
    unit = mbs * (dp or 1)
    below = gbs // unit * unit
    near = [n for n in (below, below + unit) if n > 0 and n != gbs]
    return {"batch_unit": unit, "batch_near": " or ".join(map(str, near))}


def _count(value: Any) -> int | None:
    """``value`` where it is a positive whole number (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def broken_rules(cfg: dict[str, Any]) -> list[Rule]:
    """Every rule the flat settings break (used by the resolver and the parity tests)."""
    return [r for r in rules() if r.broken(cfg)]


def check(plan: Plan) -> list[Diagnostic]:
    """Diagnostics for every broken rule, at the first pinned value it reads."""
    cfg = plan.values()
    ctx = context(cfg)
    out = []
    broken = broken_rules(cfg)
    masked = {f for r in broken if r.severity == "error" for f in r.masks}
    failing = any(r.severity == "error" for r in broken)
    for rule in broken:
        if not rule.masks and masked.intersection(rule.fields):
            continue  # a consequence of a broken rule's meaningless value, not a cause of its own
        if failing and rule.severity != "error" and not any(
                (d := plan.settings.get(f)) is not None and d.source == "user" for f in rule.fields):
            continue  # advice on a knob the planner chose, for a plan that cannot run: noise beside the error
        pos = None
        for f in rule.fields:
            d = plan.settings.get(f)
            if d is not None and d.source == "user" and d.position is not None:
                pos = d.position
                break
        if pos is None:
            pos = next((plan.settings[f].position for f in rule.fields
                        if f in plan.settings and plan.settings[f].position is not None), None)
        out.append(Diagnostic(rule.id, rule.severity, rule.message.format_map(_Safe(ctx)),
                              pos or Position(plan.source, 1, 1), _fill(rule.hint, ctx)))
    return out


def _fill(hint: str, ctx: dict[str, Any]) -> str:
    """A hint's ``{name}`` placeholders filled from the rule's context. Only bare names are replaced: a hint may
    quote YAML (``{type: huggingface, ...}``), which ``str.format`` would read as a field with a format spec."""
    return re.sub(r"\{(\w+)\}", lambda m: str(ctx[m.group(1)]) if m.group(1) in ctx else m.group(0), hint)


class _Safe(dict):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"
