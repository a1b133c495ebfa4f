"""Stage 1: read recipe YAML into a ``Document`` that remembers every position.

Handles ``extends:`` (deep merge, child wins, lists replace; cycles, long chains and bases
outside the project refused) and the CLI's ``--set a.b=v`` / ``--unset a.b`` which apply
last, in order. Every text passes ``limits.scan`` before a node tree is built.
"""

from __future__ import annotations

import functools
import os
import stat
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.constructor import ConstructorError
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from mocompile import limits
from mocompile.errors import InputError
from mocompile.ir import Diagnostic, Document, Path, Position
from mocompile.project import project_root  # noqa: F401  (re-exported: where `extends` may reach)

CLI = "<command line>"


def _diag(message: str, pos: Position, hint: str = "", rule: str = "INPUT") -> Diagnostic:
    return Diagnostic(rule, "error", message, pos, hint)


def _loader() -> YAML:
    """A fresh C-accelerated safe loader (nodes keep their marks, at a seventh of round-trip's cost).

    Fresh for each text: one shared loader keeps everything it ever read (ruamel appends a
    DocInfo per compose and its constructor caches every node), which grew a long fuzz run to
    24 GB; a pre-commit hook over many files or an editor integration would leak the same way.
    """
    return YAML(typ="safe", pure=False)


@functools.lru_cache(maxsize=1)
def _constructor() -> Any:
    """One scalar constructor; ``_scalar`` drops what it caches after each value."""
    return _loader().constructor


def _pos(file: str, mark: Any) -> Position:
    return Position(file, mark.line + 1, mark.column + 1)


def _plain(node: Node, file: str, path: Path, positions: dict[Path, Position]) -> Any:
    """Convert a composed node to plain Python, recording 1-based positions.

    A value's position is where it starts; for a block mapping or list it is its key's,
    which is where an editor should point.
    """
    if isinstance(node, MappingNode):
        out: dict[str, Any] = {}
        for knode, vnode in node.value:
            if not isinstance(knode, ScalarNode):
                raise InputError([_diag("a mapping key must be a plain value, not a list or mapping",
                                        _pos(file, knode.start_mark), "write `key: value`")])
            key = str(_scalar(knode))
            limits.check_string(key, _pos(file, knode.start_mark), f"the key under `{'.'.join(map(str, path))}`")
            sub = path + (key,)
            if key in out:
                raise InputError([_diag(f"duplicate key `{'.'.join(map(str, sub))}`", _pos(file, knode.start_mark),
                                        "each key may appear once per mapping")])
            block = isinstance(vnode, (MappingNode, SequenceNode)) and vnode.value and not vnode.flow_style
            positions[sub] = _pos(file, knode.start_mark if block else vnode.start_mark)
            positions[sub + ("<key>",)] = _pos(file, knode.start_mark)
            out[key] = _plain(vnode, file, sub, positions)
        return out
    if isinstance(node, SequenceNode):
        items = []
        for i, item in enumerate(node.value):
            positions[path + (i,)] = _pos(file, item.start_mark)
            items.append(_plain(item, file, path + (i,), positions))
        return items
    value = _scalar(node)
    what = f"`{'.'.join(map(str, path))}`" if path else "the value"
    limits.check_number(value, _pos(file, node.start_mark), what)
    limits.check_string(value, _pos(file, node.start_mark), what)
    return value


def _scalar(node: Node) -> Any:
    """Construct one scalar with YAML 1.2 safe rules (ints, floats, booleans, null, strings)."""
    if not isinstance(node, ScalarNode):
        raise InputError([_diag("a mapping key must be a plain value", Position("<input>"))])
    constructor = _constructor()
    try:
        value = constructor.construct_object(node, deep=True)
    except (ValueError, KeyError, TypeError, OverflowError) as exc:
        # an explicit tag the text does not satisfy (`!!int abc`, `!!bool maybe`): positioned at the value
        kind = str(node.tag or "value").rsplit(":", 1)[-1]
        raise ConstructorError(None, None, f"{node.value!r} is not a valid {kind} "
                               f"({type(exc).__name__}: {exc})", node.start_mark) from None
    finally:
        constructor.constructed_objects.pop(node, None)
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return value
    return str(value) if isinstance(value, str) else value


def parse_text(text: str, file: str) -> tuple[dict[str, Any], dict[Path, Position]]:
    """Parse one YAML text; raise ``InputError`` with a position on failure."""
    positions: dict[Path, Position] = {(): Position(file, 1, 1)}
    if not text.strip():
        raise InputError([_diag("file is empty; a recipe needs at least `schema`, `model`, `hardware` and `goal`",
                                Position(file, 1, 1), "start from one of the files in recipes/")])
    try:
        loader = _loader()
        limits.scan(loader.parse(text), file)
        node = loader.compose(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = (exc.problem or exc.context or "invalid YAML").strip()
        raise InputError([_diag(f"malformed YAML: {problem}", Position(file, line, col),
                                "fix the YAML syntax at this position")]) from None
    except YAMLError as exc:
        raise InputError([_diag(f"malformed YAML: {exc}", Position(file, 1, 1))]) from None
    if node is None:
        raise InputError([_diag("file holds no YAML document (only comments?)", Position(file, 1, 1),
                                "start from one of the files in recipes/")])
    if not isinstance(node, MappingNode):
        raise InputError([_diag("top level must be a mapping of `key: value` lines", Position(file, 1, 1),
                                "write `key: value` lines")])
    try:
        return _plain(node, file, (), positions), positions
    except (ConstructorError, ValueError) as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError([_diag(f"malformed YAML value: {getattr(exc, 'problem', exc)}",
                                _pos(file, mark) if mark else Position(file, 1, 1))]) from None


def _merge(base: dict[str, Any], bpos: dict[Path, Position], child: dict[str, Any],
           cpos: dict[Path, Position], path: Path = ()) -> dict[str, Any]:
    """Deep-merge ``child`` over ``base``; mappings merge, everything else replaces."""
    out = dict(base)
    for key, value in child.items():
        sub = path + (key,)
        merged = isinstance(value, dict) and isinstance(out.get(key), dict)
        if merged:
            out[key] = _merge(out[key], bpos, value, cpos, sub)
        else:
            for p in [p for p in bpos if p[: len(sub)] == sub]:
                del bpos[p]
            out[key] = value
        for p, pos in cpos.items():
            # a replaced (or new) subtree keeps every child position; a merged one got them in the recursion
            if p[: len(sub)] == sub and (p == sub or p == sub + ("<key>",) or not merged):
                bpos[p] = pos
        if isinstance(value, dict):
            bpos[sub] = cpos.get(sub, bpos.get(sub, Position(CLI)))
            bpos[sub + ("<key>",)] = cpos.get(sub + ("<key>",), bpos[sub])
    return out


def read_text(path: str, pos: Position | None = None) -> str:
    """Read one recipe as UTF-8, refusing non-regular files and files over the size limit.

    Opens without blocking (a FIFO named as a recipe must not hang the hook) and reads at most
    one byte past the limit, so a 10 GB file costs no more than a small one.
    """
    where = pos or Position(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        raise InputError([_diag(f"file not found: {path}", where, "check the path")]) from None
    except OSError as exc:
        raise InputError([_diag(f"cannot read {path}: {exc.strerror or exc.__class__.__name__}", where)]) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise limits.refuse(limits.NOT_REGULAR, f"{path} is not a regular file", where)
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(limits.FILE_BYTES.value + 1)
        except OSError as exc:
            raise InputError([_diag(f"cannot read {path}: {exc.strerror or exc.__class__.__name__}", where)]) from None
    if len(data) > limits.FILE_BYTES.value:
        raise limits.refuse(limits.FILE_BYTES, f"file is larger than {limits.FILE_BYTES.value // 1024} KiB",
                            Position(path, 1, 1))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise InputError([_diag(f"not UTF-8 text: byte 0x{data[exc.start]:02x}", Position(path, line, col),
                                "save the recipe as UTF-8")]) from None


def _read(path: str, chain: list[str], texts: dict[str, str], root: str,
          pos: Position | None = None) -> tuple[dict[str, Any], dict[Path, Position], list[str]]:
    """Read ``path`` and, recursively, the bases it extends; ``chain`` holds the extenders."""
    real = os.path.realpath(path)
    text = read_text(path, pos)
    texts[path] = text
    data, positions = parse_text(text, path)
    files = [path]
    parent = data.pop("extends", None)
    if parent is not None:
        ppos = positions.get(("extends",), Position(path, 1, 1))
        if not isinstance(parent, str) or not parent:
            raise InputError([_diag("`extends` must be a file path (string)", ppos)])
        base_path = os.path.normpath(os.path.join(os.path.dirname(path), parent))
        base_real = os.path.realpath(base_path)
        if base_real in chain + [real]:
            cycle = " -> ".join(os.path.relpath(p) for p in chain + [real, base_real])
            raise limits.refuse(limits.EXTENDS_CYCLE, f"`extends` cycle: {cycle}", ppos)
        if len(chain) + 1 > limits.EXTENDS_DEPTH.value:
            raise limits.refuse(limits.EXTENDS_DEPTH, f"more than {limits.EXTENDS_DEPTH.value} bases in one "
                                                      "`extends` chain", ppos)
        if os.path.commonpath([root, base_real]) != root:
            raise limits.refuse(limits.EXTENDS_ROOT, f"`extends: {parent}` resolves to {base_real}, outside the "
                                                     f"project root {root}", ppos)
        if not os.path.exists(base_path):
            raise InputError([_diag(f"`extends` names a missing file: {parent}", ppos,
                                    "paths are relative to the recipe that extends")])
        base, bpos, bfiles = _read(base_path, chain + [real], texts, root, ppos)
        base.pop("name", None)  # a name never inherits: each recipe is its own output
        for p in [p for p in bpos if p and p[0] == "name"]:
            del bpos[p]
        data = _merge(base, bpos, data, positions)
        positions = bpos
        files = bfiles + files
    return data, positions, files


def parse_override(expr: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as a YAML scalar or flow node, under the same
    limits as a file (an alias bomb on the command line is refused too)."""
    if "=" not in expr:
        raise InputError([_diag(f"--set needs KEY=VALUE, got {_short(expr)}", Position(CLI))])
    key, raw = expr.split("=", 1)
    if len(expr) > limits.STRING.value:
        raise limits.refuse(limits.STRING, f"--set {_short(key)}=... is {len(expr)} characters "
                                           f"(at most {limits.STRING.value})", Position(CLI))
    keys = [k for k in key.strip().split(".")]
    if not all(keys):
        raise InputError([_diag(f"--set key {_short(key)} has an empty part", Position(CLI))])
    if len(keys) > limits.DEPTH.value:
        raise limits.refuse(limits.DEPTH, f"--set key nests deeper than {limits.DEPTH.value} levels",
                            Position(CLI))
    if not raw.strip():
        return keys, ""
    try:
        loader = _loader()
        limits.scan(loader.parse(raw), CLI)
        node = loader.compose(raw)
        if node is None:
            return keys, None
        return keys, _plain(node, CLI, tuple(keys), {})
    except (YAMLError, ValueError):
        return keys, raw  # not YAML: the text itself is the value
    except InputError as exc:  # say which --set it was
        raise InputError([d._replace(message=f"--set {_short(key, 40)}: {d.message}")
                          for d in exc.diagnostics]) from None


def _short(text: str, width: int = 60) -> str:
    """A repr short enough for one message line."""
    return repr(text if len(text) <= width else text[:width] + "...")


def apply_overrides(doc: Document, sets: list[str], unsets: list[str]) -> Document:
    """Apply ``--unset`` then ``--set`` (each in the order given) on top of the file."""
    for expr in unsets:
        keys = [k for k in expr.split(".") if k]
        node: Any = doc.data
        for k in keys[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict) and keys and keys[-1] in node:
            del node[keys[-1]]
            prefix = tuple(keys)
            for p in [p for p in doc.positions if p[: len(prefix)] == prefix]:
                del doc.positions[p]
    for expr in sets:
        keys, value = parse_override(expr)
        node = doc.data
        for i, k in enumerate(keys[:-1]):
            if not isinstance(node.get(k), dict):
                node[k] = {}
                doc.positions[tuple(keys[: i + 1])] = Position(CLI)
            node = node[k]
        node[keys[-1]] = value
        prefix = tuple(keys)
        for p in [p for p in doc.positions if p[: len(prefix)] == prefix]:
            del doc.positions[p]
        doc.positions[prefix] = Position(CLI)
        doc.positions[prefix + ("<key>",)] = Position(CLI)
    return doc


def load(path: str, sets: list[str] | None = None, unsets: list[str] | None = None) -> Document:
    """Read ``path`` (following ``extends``) and apply command-line overrides."""
    texts: dict[str, str] = {}
    data, positions, files = _read(path, [], texts, project_root(path))
    doc = Document(data=data, positions=positions, files=files, text=texts)
    doc.positions[()] = Position(path, 1, 1)
    if "name" not in doc.data:
        stem = os.path.splitext(os.path.basename(path))[0]
        doc.data["name"] = stem
        doc.positions[("name",)] = Position(path, 1, 1)
    doc = apply_overrides(doc, sets or [], unsets or [])
    from mocompile import cluster, hfconfig
    cluster.read(doc)
    hfconfig.read(doc)
    return doc
