"""Load the package's YAML data (schema, catalogues, rules) quickly.

pre-commit starts a fresh process per run, and parsing a few hundred lines of YAML
costs more than the rest of `lint`. Parsed data is cached as JSON under
``$XDG_CACHE_HOME/mocompile`` keyed by path, size, mtime and version; a cache
that cannot be read or written is simply ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from typing import Any

from mocompile import __version__


def _cache_path(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}|{__version__}"
    return os.path.join(cache_dir(), hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")


def cache_dir() -> str:
    """``$XDG_CACHE_HOME/mocompile`` (or ``~/.cache/mocompile``): parsed data and planner verdicts."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mocompile")


CACHE_ENTRIES = 4000  # per cache folder: beyond it the least recently written entries go (a few MB at most)
STALE_TMP_S = 3600  # a temporary file this old was left by a writer that died (a kill mid-write)
_pruned: set[str] = set()


def write_json_atomic(path: str, data: Any) -> None:
    """Write JSON beside ``path`` and rename it into place; a cache that cannot be written is ignored, and a
    write that fails leaves no temporary file behind. The first write of a process into a folder prunes it."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return
    folder = os.path.dirname(path)
    if folder not in _pruned:
        _pruned.add(folder)
        prune(folder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def prune(folder: str, keep: int = CACHE_ENTRIES) -> None:
    """Bound a cache folder: temporary files of writers that died (their process is gone, or they are older
    than an hour) are removed, and beyond ``keep`` entries the oldest are, down to nine tenths of it."""
    import time

    try:
        names = os.listdir(folder)
    except OSError:
        return
    now = time.time()
    entries: list[tuple[float, str]] = []
    for name in names:
        full = os.path.join(folder, name)
        try:
            st = os.lstat(full)
        except OSError:
            continue
        if name.endswith(".tmp"):
            pid = name.rsplit(".", 2)[-2] if name.count(".") >= 2 else ""
            dead = not pid.isdigit() or not _alive(int(pid))
            if dead or now - st.st_mtime > STALE_TMP_S:
                _remove(full)
        elif name.endswith(".json"):
            entries.append((st.st_mtime, full))
    if len(entries) > keep:
        entries.sort()
        for _, full in entries[: len(entries) - keep * 9 // 10]:
            _remove(full)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def load_yaml(path: str) -> Any:
    cache = _cache_path(path)
    if cache and os.path.exists(cache):
        try:
            with open(cache, encoding="utf-8") as fh:
                return json.load(fh)
        except (OSError, ValueError):
            pass
    from ruamel.yaml import YAML

    with open(path, encoding="utf-8") as fh:
        data = YAML(typ="safe").load(fh)
    if cache:
        write_json_atomic(cache, data)
    return data


def _content_entry(kind: str, raw: bytes) -> str:
    import binascii  # small: no hashlib (OpenSSL) needed to name an entry
    return os.path.join(cache_dir(), f"{kind}-{binascii.crc32(raw):08x}-{len(raw)}.json")


def parsed(kind: str, raw: bytes) -> Any:
    """What ``remember`` stored for exactly these bytes (the entry holds them: a CRC collision or an edit
    reads nothing), or None."""
    try:
        with open(_content_entry(kind, raw), encoding="utf-8") as fh:
            entry = json.load(fh)
        if entry["python"] == list(sys.version_info[:2]) and entry["text"] == raw.decode("utf-8"):
            return entry["data"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def remember(kind: str, raw: bytes, data: Any) -> None:
    """Store the parse of ``raw`` (as JSON; data JSON cannot hold is not stored)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return
    write_json_atomic(_content_entry(kind, raw), {"python": list(sys.version_info[:2]), "text": text, "data": data})
