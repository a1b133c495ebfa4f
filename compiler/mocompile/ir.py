"""Typed values that flow between the compiler stages.

Every stage is a function from one of these to the next; problems travel as
``Diagnostic`` values, never as exceptions, so all of them can be shown at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

Path = tuple[str | int, ...]


class Position(NamedTuple):
    """A 1-based place in a source file; line 0 means 'no line' (e.g. --set). A tuple (ordered, hashable, immutable)
    rather than a frozen dataclass: a dataclass costs every command-line run ~2 ms to build at import."""

    file: str
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}" if self.line else self.file


class Diagnostic(NamedTuple):
    """One finding: a rule ID, where it is, what is wrong and how to fix it (a tuple, as ``Position``)."""

    rule: str
    severity: str  # "error" | "warning" | "info"
    message: str
    position: Position
    hint: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "file": self.position.file,
            "line": self.position.line,
            "column": self.position.column,
            "rule": self.rule,
            "severity": self.severity,
            "message": self.message,
            "hint": self.hint,
        }


@dataclass
class Document:
    """Merged YAML data plus the source position of every key and value."""

    data: dict[str, Any]
    positions: dict[Path, Position]
    files: list[str]  # every file read, base files first (for the lock hash)
    text: dict[str, str] = field(default_factory=dict)
    cluster: dict[str, Any] | None = None  # the cluster profile hardware.cluster names (mocompile.cluster)
    hf_config: dict[str, Any] | None = None  # the Hugging Face config.json model_config names (mocompile.hfconfig)

    def position(self, path: Path) -> Position:
        """Position of ``path``, or of its nearest ancestor that has one."""
        p = tuple(path)
        while p:
            if p in self.positions:
                return self.positions[p]
            p = p[:-1]
        return self.positions.get((), Position(self.files[-1] if self.files else "<input>"))


@dataclass
class Decision:
    """Why a setting has its value: who set it, the reason, what was rejected."""

    value: Any
    source: str  # user | goal | hardware | derived | default | model
    reason: str
    rejected: list[tuple[Any, str]] = field(default_factory=list)
    position: Position | None = None
    rules: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "source": self.source, "reason": self.reason}
        if self.rejected:
            out["rejected"] = [{"value": v, "why": w} for v, w in self.rejected]
        if self.rules:
            out["rules"] = list(self.rules)
        if self.position is not None:
            out["at"] = str(self.position)
        return out


@dataclass
class Plan:
    """The fully resolved configuration, keyed by Megatron's own field names."""

    name: str
    source: str
    goal: str
    settings: dict[str, Decision]
    env: dict[str, Decision]
    model: dict[str, Any]
    hardware: dict[str, Any]
    intent: dict[str, Any]
    memory: dict[str, Any] = field(default_factory=dict)
    planner: dict[str, Any] = field(default_factory=dict)
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return self.settings[key].value

    def get(self, key: str, default: Any = None) -> Any:
        d = self.settings.get(key)
        return default if d is None else d.value

    def values(self) -> dict[str, Any]:
        """Plain ``{field: value}`` view that rule checks read."""
        return {k: d.value for k, d in self.settings.items()}
