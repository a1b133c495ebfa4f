"""The whole compiler in a few lines: load -> validate -> resolve -> check -> emit."""

from __future__ import annotations

from mocompile.ir import Diagnostic, Document, Plan
from mocompile.load import load
from mocompile.resolve import resolve, training_io
from mocompile.rules.engine import check
from mocompile.schema import validate


class Result:
    """What ``analyse`` and ``compile_recipe`` return (a plain class, as ``project.Settings``)."""

    __slots__ = ("source", "plan", "diagnostics", "files", "doc")

    def __init__(self, source: str, plan: Plan | None, diagnostics: list[Diagnostic],
                 files: dict[str, str] | None = None, doc: Document | None = None):
        self.source, self.plan, self.diagnostics, self.doc = source, plan, diagnostics, doc
        self.files: dict[str, str] = {} if files is None else files  # relative path -> text

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity == "error"]


def analyse(path: str, sets: list[str] | None = None, unsets: list[str] | None = None) -> Result:
    """Everything up to and including the rule check. Raises ``InputError`` for bad input."""
    doc = load(path, sets, unsets)
    intent = validate(doc)
    plan = training_io.apply(resolve(intent, doc), doc)  # data/tokenizer/checkpoint/logging keys (issue 9)
    plan.diagnostics = sorted(check(plan), key=lambda d: (d.position, d.rule))
    return Result(path, plan, plan.diagnostics, doc=doc)


def compile_recipe(path: str, sets: list[str] | None = None, unsets: list[str] | None = None,
                   out_rel: str = "generated") -> Result:
    """Analyse, then emit the artifacts when no error was found. ``out_rel``: the output folder relative
    to the project root, where the launchers look for their recipe folder."""
    from mocompile.emit import render  # jinja2 only when emitting: keeps `lint` fast for pre-commit

    result = analyse(path, sets, unsets)
    if not result.errors and result.plan is not None and result.doc is not None:
        result.files = render.artifacts(result.plan, result.doc, sets or [], unsets or [], out_rel)
    return result
