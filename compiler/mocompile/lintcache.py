"""Whole-file lint verdicts, so that a repeat `mocompile lint` of an unchanged file costs a cache read.

pre-commit starts a fresh process per run and passes the staged files; most are unchanged since the
last run. The verdict of one file (its diagnostics, from which the exit code follows) is stored as
JSON under ``$XDG_CACHE_HOME/mocompile/lint``, keyed by:

* the file's bytes, the path as given, the working folder and its project root (what ``extends`` may
  reach), and the ``--set``/``--unset`` overrides;
* the compiler: a hash of the content of every file of the package (code, rules, catalogues, schema,
  step-time data), its version, the Python version and where its dependencies live
  (``plancache.fingerprint``).

The bases a file ``extends`` are recorded in the entry with the hash of their bytes (and where their
symlinks lead) and read again on every lookup, so an edited base misses too. Only a finished analysis is
stored (never an input error, whose cause may lie outside the file, e.g. a missing base), and only when the text the compiler read
is the text the key was made from. A lookup needs no YAML parser, no cerberus and no planner, so a hit
imports none of them. Only the command line enables it; ``MOCOMPILE_NO_CACHE=1`` turns it off; a cache
that cannot be read or written is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from typing import Any

from mocompile import plancache
from mocompile.datafiles import cache_dir, write_json_atomic
from mocompile.project import project_root  # light: no YAML loader

ENABLED = False     # set by the command line
MAX_BYTES = 256 * 1024  # LIM001: a larger file is the full path's to refuse


def _enabled() -> bool:
    return ENABLED and not os.environ.get("MOCOMPILE_NO_CACHE")


def read_bytes(path: str) -> bytes | None:
    """A regular file's bytes, without blocking (a FIFO is the full path's to refuse); None otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            data = fh.read(MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        if fd >= 0:
            os.close(fd)
    return data if len(data) <= MAX_BYTES else None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def key(path: str, sets: list[str], unsets: list[str]) -> tuple[str, str] | None:
    """(cache file, hash of the file's bytes) for linting ``path``; None when disabled or unreadable."""
    if not _enabled():
        return None
    data = read_bytes(path)
    if data is None:
        return None
    digest = _sha(data)
    try:
        text = json.dumps(["lint", plancache.fingerprint(), os.getcwd(), path, os.path.realpath(path),
                           project_root(path), list(sets), list(unsets), digest])
    except (OSError, TypeError, ValueError):
        return None
    return os.path.join(cache_dir(), "lint", _sha(text.encode())[:32] + ".json"), digest


def get(path: str, sets: list[str], unsets: list[str]) -> list[dict[str, Any]] | None:
    """The stored diagnostics (as dicts) of linting ``path``, or None (a miss)."""
    k = key(path, sets, unsets)
    if k is None:
        return None
    try:
        with open(k[0], encoding="utf-8") as fh:
            entry = json.load(fh)
        for dep, real, digest in entry["deps"]:
            data = read_bytes(dep)
            if data is None or _sha(data) != digest or os.path.realpath(dep) != real:
                return None
        diags = entry["diagnostics"]
        if not isinstance(diags, list):
            return None
        return diags
    except (OSError, ValueError, KeyError, TypeError):
        return None


def put(path: str, sets: list[str], unsets: list[str], digest: str, texts: dict[str, str], files: list[str],
        diags: list[dict[str, Any]]) -> None:
    """Store the verdict of ``path`` when the text the compiler read (``texts``) hashes to ``digest``."""
    k = key(path, sets, unsets)
    if k is None or k[1] != digest or path not in texts or _sha(texts[path].encode("utf-8")) != digest:
        return  # the file changed while it was linted: store nothing
    try:
        deps = [[f, os.path.realpath(f), _sha(texts[f].encode("utf-8"))] for f in files if f != path]
    except (KeyError, UnicodeEncodeError):
        return
    write_json_atomic(k[0], {"deps": deps, "diagnostics": diags})
