"""A cache of the planner's verdicts, so that `lint` in a pre-commit hook re-plans only changed intents.

The search is deterministic: the same intent, package code and data give the same winner. A verdict
(the winner, runners-up, excluded and anchor candidates, and the count scored) is stored as JSON under
``$XDG_CACHE_HOME/mocompile/plans`` keyed by the validated intent and a fingerprint of the compiler
(the content of every file of the package, code and data; see ``fingerprint``), so an edit of either
misses. On a hit the few stored
candidates are scored and rule-checked again; nothing else is trusted from disk. Only the command
line enables it (library calls and tests always search); ``MOCOMPILE_NO_CACHE=1`` turns it off.
A cache that cannot be read or written is ignored.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from typing import Any

from mocompile import __version__
from mocompile.datafiles import cache_dir, write_json_atomic

ENABLED = False   # set by the command line


DEPENDENCIES = ("cerberus", "ruamel.yaml")


def _dependency(name: str) -> str:
    """Where a dependency lives and its version folder, without importing it (cheap; a change misses)."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return f"{name}:?"
    if spec is None or not spec.origin:
        return f"{name}:?"
    site = os.path.dirname(os.path.dirname(spec.origin)) if "." not in name else \
        os.path.dirname(os.path.dirname(os.path.dirname(spec.origin)))
    prefix = name.replace(".", "_").lower() + "-"
    try:
        infos = sorted(e for e in os.listdir(site) if e.lower().startswith(prefix))
        st = os.stat(spec.origin)
    except OSError:
        return f"{name}:{spec.origin}"
    return f"{name}:{spec.origin}:{st.st_size}:{st.st_mtime_ns}:{','.join(infos)}"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """The compiler's identity: version, Python, dependencies, and the content of every package file
    (code, rule catalogue, model/GPU catalogues, schema, step-time data, templates)."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256(f"{__version__}\n{sys.version}\n".encode())
    for dep in DEPENDENCIES:
        h.update(_dependency(dep).encode() + b"\n")
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".yaml", ".j2", ".json")):
                full = os.path.join(dirpath, name)
                with open(full, "rb") as fh:
                    data = fh.read()
                h.update(f"{os.path.relpath(full, root)}:{len(data)}\n".encode())
                h.update(data)
    return h.hexdigest()


def _path(key: Any) -> str | None:
    if not ENABLED or os.environ.get("MOCOMPILE_NO_CACHE"):
        return None
    try:
        text = json.dumps([fingerprint(), key], sort_keys=True, default=str)
    except (TypeError, ValueError, OSError):
        return None
    return os.path.join(cache_dir(), "plans", hashlib.sha256(text.encode()).hexdigest()[:32] + ".json")


def get(key: Any) -> dict[str, Any] | None:
    path = _path(key)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def put(key: Any, verdict: dict[str, Any]) -> None:
    path = _path(key)
    if path:
        write_json_atomic(path, verdict)
