"""Project settings from ``[tool.mocompile]`` in pyproject.toml."""

from __future__ import annotations

import glob
import os
import sys
from typing import Any

from mocompile import datafiles
from mocompile.errors import InputError, UsageError
from mocompile.ir import Diagnostic, Position
from mocompile.textsafe import visible


class Settings:
    """``[tool.mocompile]`` of the project's pyproject.toml (a plain class: every command-line run builds this
    module, and a dataclass costs ~1 ms to build)."""

    __slots__ = ("root", "recipes", "output", "strict")

    def __init__(self, root: str = ".", recipes: list[str] | None = None, output: str = "generated",
                 strict: bool = False):
        self.root, self.output, self.strict = root, output, strict
        self.recipes = ["recipes/*.yaml"] if recipes is None else recipes

    def _fields(self) -> tuple[Any, ...]:
        return (self.root, self.recipes, self.output, self.strict)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Settings) and self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass was

    def __repr__(self) -> str:
        return f"Settings(root={self.root!r}, recipes={self.recipes!r}, output={self.output!r}, strict={self.strict!r})"

    def recipe_files(self) -> list[str]:
        files: set[str] = set()
        for pattern in self.recipes:
            files.update(glob.glob(os.path.join(self.root, pattern)))
        return sorted(os.path.relpath(f) for f in files)


def find_root(start: str = ".") -> str | None:
    here = os.path.abspath(start)
    while True:
        if os.path.exists(os.path.join(here, "pyproject.toml")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def load_settings(start: str = ".") -> Settings:
    root = find_root(start)
    if root is None:
        return Settings()
    data = _pyproject(os.path.join(root, "pyproject.toml"))
    conf = data.get("tool", {}).get("mocompile", {})
    unknown = set(conf) - {"recipes", "output", "strict"}
    if unknown:
        raise UsageError(f"pyproject.toml [tool.mocompile]: unknown key(s) {', '.join(sorted(unknown))}; "
                         "known: recipes, output, strict")
    s = Settings(root=os.path.relpath(root))
    if "recipes" in conf:
        if not isinstance(conf["recipes"], list) or not all(isinstance(x, str) for x in conf["recipes"]):
            raise UsageError("pyproject.toml [tool.mocompile] recipes must be a list of glob strings")
        s.recipes = conf["recipes"]
    output = conf.get("output", s.output)
    if not isinstance(output, str) or not output or os.path.isabs(output) or \
            os.path.normpath(output).split(os.sep)[0] == os.pardir or any(ord(c) < 32 for c in output):
        # a committed pyproject.toml is as untrusted as a recipe: its output folder stays in the project
        raise UsageError(f"pyproject.toml [tool.mocompile] output must be a folder inside the project, "
                         f"relative to pyproject.toml (got {visible(repr(output))})")
    s.output = os.path.normpath(os.path.join(s.root, output))
    s.strict = bool(conf.get("strict", False))
    return s


def _pyproject(path: str) -> dict[str, Any]:
    """pyproject.toml parsed; the parse of the same bytes is kept as JSON (``datafiles.parsed``), so the
    usual run imports no TOML parser (tomllib and its parse cost a cold ``lint`` about 3 ms)."""
    with open(path, "rb") as fh:
        raw = fh.read()
    data = datafiles.parsed("pyproject", raw)
    if isinstance(data, dict):
        return data
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        data = tomllib.loads(raw.decode())  # what tomllib.load does with the file's bytes
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"pyproject.toml: {exc}") from None
    datafiles.remember("pyproject", raw, data)
    return data


def project_root(recipe: str) -> str:
    """Where ``extends`` may reach: the nearest folder above ``recipe`` holding pyproject.toml
    or .git, else the recipe's own folder (symlinks resolved)."""
    start = os.path.dirname(os.path.realpath(recipe))
    here = start
    while True:
        if any(os.path.exists(os.path.join(here, m)) for m in ("pyproject.toml", ".git")):
            return here
        parent = os.path.dirname(here)
        if parent == here:
            return start
        here = parent


def project_file(path: Any, key: str, pos: Position, recipe: str, example: str, keep: str) -> str:
    """The file a recipe key names (``hardware.cluster``, ``model_config``): a path without control characters,
    relative to the file that names it (``pos.file``, else ``recipe``), inside the project (``project_root``, symlinks
    resolved). ``example`` and ``keep`` are the hints of the two refusals."""
    if not isinstance(path, str) or not path or any(ord(c) < 32 for c in path):
        raise InputError([Diagnostic("INPUT", "error", f"`{key}` must be a file path", pos, f"e.g. {example}")])
    named_by = pos.file if pos.file and os.path.exists(pos.file) else recipe
    full = os.path.normpath(os.path.join(os.path.dirname(named_by), path))
    root = project_root(recipe)
    if os.path.commonpath([root, os.path.realpath(full)]) != root:
        raise InputError([Diagnostic("INPUT", "error", f"`{key}: {path}` resolves to {os.path.realpath(full)}, outside "
                                     f"the project root {root}", pos, keep)])
    return full
