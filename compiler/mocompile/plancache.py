"""A cache of the planner's verdicts, so that `lint` in a pre-commit hook re-plans only changed intents.

The search is deterministic: the same intent, package code and data give the same winner. A verdict
(the winner, runners-up, excluded and anchor candidates, and the count scored) is stored as JSON under
``$XDG_CACHE_HOME/mocompile/plans`` keyed by the validated intent and a fingerprint of every file of
the package (size and mtime of code and data), so an edit of either misses. On a hit the few stored
candidates are scored and rule-checked again; nothing else is trusted from disk. Only the command
line enables it (library calls and tests always search); ``MOCOMPILE_NO_CACHE=1`` turns it off.
A cache that cannot be read or written is ignored.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from typing import Any

from mocompile import __version__
from mocompile.datafiles import cache_dir, write_json_atomic

ENABLED = False   # set by the command line


@functools.lru_cache(maxsize=1)
def _fingerprint() -> str:
    root = os.path.dirname(os.path.abspath(__file__))
    parts = [__version__]
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".yaml", ".j2")):
                st = os.stat(os.path.join(dirpath, name))
                parts.append(f"{os.path.relpath(os.path.join(dirpath, name), root)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _path(key: Any) -> str | None:
    if not ENABLED or os.environ.get("MOCOMPILE_NO_CACHE"):
        return None
    try:
        text = json.dumps([_fingerprint(), key], sort_keys=True, default=str)
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
