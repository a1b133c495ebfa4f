"""Input limits: refuse hostile or runaway input before composing it, in well under a second.

A recipe is a few dozen lines. Anything far past that is a mistake or an attack (a YAML alias
bomb expands a 1 KB file into billions of nodes; a 10,000-deep list overflows a recursive
walk), and a pre-commit hook or CI job must not hang on it. So ``scan`` walks the parser's
*event stream* once, before any node tree is built, and counts what composing it would cost:
alias expansions are counted by the size of the node they repeat, never expanded. Each limit
has a stable ID so users can search for it; README "Input limits" lists them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from ruamel.yaml.events import AliasEvent, CollectionEndEvent, CollectionStartEvent, MappingStartEvent, ScalarEvent

from mocompile.errors import InputError
from mocompile.ir import Diagnostic, Position


class Limit(NamedTuple):
    """One input limit: its stable ID, the bound, and what the user should do instead (a tuple, as ``ir.Position``)."""

    id: str
    name: str
    value: int
    hint: str


FILE_BYTES = Limit("LIM001", "file-too-large", 256 * 1024,
                   "a recipe is a few dozen lines; split generated data out of it")
NOT_REGULAR = Limit("LIM002", "not-a-regular-file", 0,
                    "pass a recipe file, not a directory, pipe or device")
DEPTH = Limit("LIM003", "nesting-too-deep", 32,
              "the intent schema nests 4 levels; flatten the value")
NODES = Limit("LIM004", "too-many-values", 20_000,
              "aliases (*name) count once per use; write the values out or drop the aliases")
KEYS = Limit("LIM005", "too-many-keys", 1_000,
             "no mapping in the intent schema has more than a few dozen keys")
STRING = Limit("LIM006", "string-too-long", 4_096,
               "keep paths, names and environment values under the limit")
NUMBER = Limit("LIM007", "number-out-of-range", 2 ** 53,
               "no intent field accepts a number this large (or infinity, or NaN)")
EXTENDS_DEPTH = Limit("LIM008", "extends-chain-too-long", 8,
                      "let a recipe extend a base that extends at most a few others")
EXTENDS_CYCLE = Limit("LIM009", "extends-cycle", 0,
                      "remove one `extends:` so the chain ends")
EXTENDS_ROOT = Limit("LIM010", "extends-outside-project", 0,
                     "a base must lie inside the project root (the nearest folder above the recipe "
                     "holding pyproject.toml or .git, else the recipe's own folder), symlinks resolved")
NUL = Limit("LIM011", "nul-character", 0,
            "no environment variable, argument or file name can hold a NUL character (\\0); remove it")

ALL = (FILE_BYTES, NOT_REGULAR, DEPTH, NODES, KEYS, STRING, NUMBER, EXTENDS_DEPTH, EXTENDS_CYCLE, EXTENDS_ROOT,
       NUL)


def refuse(limit: Limit, message: str, pos: Position) -> InputError:
    """The error for a broken limit: one positioned diagnostic carrying the limit's ID."""
    return InputError([Diagnostic(limit.id, "error", message, pos, limit.hint)])


def where(file: str, mark: Any) -> Position:
    """1-based position of a ruamel mark (or the file's start when there is none)."""
    return Position(file, mark.line + 1, mark.column + 1) if mark is not None else Position(file, 1, 1)


def check_string(value: Any, pos: Position, what: str = "a value") -> None:
    """Refuse a string holding NUL: launchers could not pass it on byte-exact (C strings end there)."""
    if isinstance(value, str) and "\x00" in value:
        raise refuse(NUL, f"{what} holds a NUL character (\\0)", pos)


def check_number(value: Any, pos: Position, what: str = "number") -> None:
    """Refuse a number no field could accept; keeps every later computation small and finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise refuse(NUMBER, f"{what} {value} is not a finite number", pos)
    if abs(value) > NUMBER.value:
        shown = f"{value:.3g}" if isinstance(value, float) else f"with {len(str(abs(value)))} digits"
        raise refuse(NUMBER, f"{what} {shown} is out of range (at most 2**53 = {NUMBER.value})", pos)


class _Frame:
    """One open collection of ``scan``'s walk (a plain class: a dataclass costs every run ~1 ms to build)."""

    __slots__ = ("anchor", "start_nodes", "mapping", "children", "height")

    def __init__(self, anchor: str | None, start_nodes: int, mapping: bool, children: int = 0, height: int = 1):
        self.anchor, self.start_nodes, self.mapping, self.children, self.height = \
            anchor, start_nodes, mapping, children, height


def scan(events: Iterable[Any], file: str) -> None:
    """Walk parser events once; raise ``InputError`` at the first limit broken.

    Counts nodes as composing would (an alias adds the size of the node it names), nesting
    depth including the depth an alias brings along, keys per mapping and scalar length.
    Stops at the first problem, so a huge input costs only the prefix read.
    """
    nodes = 0
    stack: list[_Frame] = []
    sizes: dict[str, tuple[int, int]] = {}  # anchor -> (expanded node count, height)

    def add_child(mark: Any, height: int) -> None:
        if not stack:
            return
        top = stack[-1]
        top.children += 1
        top.height = max(top.height, height + 1)
        if top.mapping and top.children > 2 * KEYS.value:
            raise refuse(KEYS, f"a mapping with more than {KEYS.value} keys", where(file, mark))

    for ev in events:
        if isinstance(ev, AliasEvent):
            count, height = sizes.get(ev.anchor, (1, 0))
            nodes += count
            if nodes > NODES.value:
                raise refuse(NODES, f"alias *{ev.anchor} expands the document past {NODES.value} values "
                                    "(nested aliases multiply)", where(file, ev.start_mark))
            if len(stack) + height > DEPTH.value:
                raise refuse(DEPTH, f"alias *{ev.anchor} nests values deeper than {DEPTH.value} levels",
                             where(file, ev.start_mark))
            add_child(ev.start_mark, height)
        elif isinstance(ev, ScalarEvent):
            nodes += 1
            if nodes > NODES.value:
                raise refuse(NODES, f"the document has more than {NODES.value} values", where(file, ev.start_mark))
            if len(ev.value) > STRING.value:
                raise refuse(STRING, f"a value of {len(ev.value)} characters (at most {STRING.value})",
                             where(file, ev.start_mark))
            if ev.anchor:
                sizes[ev.anchor] = (1, 0)
            add_child(ev.start_mark, 0)
        elif isinstance(ev, CollectionStartEvent):
            nodes += 1
            if len(stack) + 1 > DEPTH.value:
                raise refuse(DEPTH, f"values nested deeper than {DEPTH.value} levels", where(file, ev.start_mark))
            stack.append(_Frame(ev.anchor, nodes - 1, isinstance(ev, MappingStartEvent)))
        elif isinstance(ev, CollectionEndEvent) and stack:
            frame = stack.pop()
            if frame.anchor:
                sizes[frame.anchor] = (nodes - frame.start_nodes, frame.height)
            add_child(ev.start_mark, frame.height)
