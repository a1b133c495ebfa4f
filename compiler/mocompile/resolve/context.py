"""The resolver's working state: decisions so far, and how to test a candidate."""

from __future__ import annotations

from typing import Any

from mocompile.ir import Decision, Document, Plan
from mocompile.rules.engine import broken_rules

# Neutral starting values: every field a rule reads exists from the first pass on.
NEUTRAL: dict[str, Any] = {
    "virtual_pipeline_model_parallel_size": None, "pipeline_model_parallel_layout": None,
    "moe_token_dispatcher_type": "alltoall", "moe_flex_dispatcher_backend": None, "moe_flex_dispatcher_num_sms": None,
    "hybridep_ranks_per_domain": 1, "overlap_moe_expert_parallel_comm": False, "delay_wgrad_compute": False,
    "moe_shared_expert_overlap": False, "recompute_granularity": None, "recompute_method": None,
    "recompute_num_layers": None, "recompute_modules": None, "cuda_graph_impl": "none", "cuda_graph_modules": [],
    "overlap_p2p_comm": False, "batch_p2p_comm": False, "overlap_grad_reduce": False, "overlap_param_gather": False,
    "use_te_rng_tracker": False, "num_microbatches": 1, "memory_estimate_gib": 0.0,
    "manual_gc": False, "apply_rope_fusion": False, "cross_entropy_loss_fusion": False,
    "moe_permute_fusion": False, "grad_reduce_in_fp32": True, "bias_activation_fusion": False, "moe_router_fusion": False,
    "memory_biggest_term": None, "memory_min_gpus": None, "memory_limit_gib": None, "shipped_recipe": None,
    "step_time_estimate_s": None, "memory_host_node_gib": 0.0, "host_memory_limit_gib": None,
}


class Context:
    """Holds the intent, catalogue entries and the decisions made so far."""

    def __init__(self, intent: dict[str, Any], doc: Document, model: dict[str, Any], hw: dict[str, Any]):
        self.intent, self.doc, self.model, self.hw = intent, doc, model, hw
        self.goal: str = intent["goal"]
        self.s: dict[str, Decision] = {}
        self.env: dict[str, Decision] = {}
        self.memory: dict[str, Any] = {}
        self.planner: dict[str, Any] = {}  # the search's winner, runners-up and anchor (explain, lock)
        self.by_micro_batch: dict[int, Any] = {}  # micro_batch_size auto: the search at each size that fits
        self.searches: dict[str, Any] = {}  # this compile's search verdicts by their plan-cache key (search.search)
        for name, value in NEUTRAL.items():  # so rule trials can read fields not decided yet
            self.set(name, value, "default", "not decided yet")

    # -- reading the intent -------------------------------------------------
    def pinned(self, *path: str) -> Any:
        """The user's value at ``path``, or None when left ``auto``/unset."""
        node: Any = self.intent
        for key in path:
            if not isinstance(node, dict) or key not in node:
                return None
            node = node[key]
        return None if node == "auto" else node

    def explicit(self, *path: str) -> bool:
        """Did the user write this key (in the file, a base file or --set)?"""
        return tuple(path) in self.doc.positions and self.pinned(*path) is not None

    # -- recording decisions -------------------------------------------------
    def set(self, name: str, value: Any, source: str, reason: str,
            rejected: list[tuple[Any, str]] | None = None, path: tuple[str, ...] | None = None,
            rules: list[str] | None = None) -> Any:
        pos = self.doc.positions.get(path) if path else None
        self.s[name] = Decision(value, source, reason, list(rejected or []), pos, list(rules or []))
        return value

    def user_or(self, name: str, path: tuple[str, ...], default: Any, source: str, reason: str,
                rejected: list[tuple[Any, str]] | None = None) -> Any:
        """Take a pinned value (keeping its position) or fall back to ``default``."""
        value = self.pinned(*path)
        if value is not None and self.explicit(*path):
            return self.set(name, value, "user", "pinned in the recipe", path=path)
        return self.set(name, default, source, reason, rejected)

    def is_user(self, name: str) -> bool:
        return name in self.s and self.s[name].source == "user"

    def __getitem__(self, name: str) -> Any:
        return self.s[name].value

    def values(self) -> dict[str, Any]:
        return {k: d.value for k, d in self.s.items()}

    def errors_if(self, **trial: Any) -> list[str]:
        """IDs of error rules the current values break with ``trial`` applied."""
        cfg = self.values()
        cfg.update(trial)
        return [r.id for r in broken_rules(cfg) if r.severity == "error" and (set(r.fields) & set(trial))]

    def plan(self) -> Plan:
        return Plan(name=self.intent["name"], source=self.doc.files[-1], goal=self.goal, settings=self.s,
                    env=self.env, model=self.model, hardware=self.hw, intent=self.intent, memory=self.memory,
                    planner=self.planner)
