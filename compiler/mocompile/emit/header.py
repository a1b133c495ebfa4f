"""Headers with the source recipe and a checksum of the body, and how to read them back.

Like cog's checksums: a file whose body no longer matches its checksum was edited
by hand; a file that verifies but differs from a fresh compile is stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from mocompile import __version__
from mocompile.textsafe import header_path

MARK = "mocompile:"
DO_NOT_EDIT = "generated file, do not edit: change the recipe and run `mocompile compile`"
SUM_RE = re.compile(r"^(?:#|//) mocompile: checksum sha256:([0-9a-f]{16}) input sha256:([0-9a-f]{16})$", re.M)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def stamp_comment(body: str, source: str, input_hash: str, shebang: str | None = None) -> str:
    """Prefix ``body`` with ``#`` header lines (after a shebang, if any). The source path is
    percent-encoded (:func:`mocompile.textsafe.header_path`): a header line never carries raw
    input, so a file name cannot end the comment or declare the file's encoding."""
    head = [shebang] if shebang else []
    head += [f"# {MARK} {DO_NOT_EDIT}",
             f"# {MARK} source {header_path(source)} (mocompile {__version__})",
             f"# {MARK} checksum sha256:{digest(body)} input sha256:{input_hash}"]
    return "\n".join(head) + "\n" + body


def stamp_json(body: dict, source: str, input_hash: str) -> str:
    text = json.dumps(body, indent=2, sort_keys=True) + "\n"
    meta = {"note": DO_NOT_EDIT, "source": source, "mocompile": __version__,
            "checksum": f"sha256:{digest(text)}", "input": f"sha256:{input_hash}"}
    return json.dumps({"_generated": meta, **body}, indent=2, sort_keys=False) + "\n"


def _split_comment(text: str) -> tuple[str | None, str]:
    """Return (stored checksum, body) for a ``#``-header file."""
    lines = text.split("\n")
    for i, line in enumerate(lines[:6]):
        m = SUM_RE.match(line)
        if m:
            return m.group(1), "\n".join(lines[i + 1:])
    return None, text


def verify(text: str) -> bool | None:
    """True: body matches its checksum; False: edited; None: no mocompile header."""
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return False
        meta = data.pop("_generated", None) if isinstance(data, dict) else None
        if not isinstance(meta, dict):
            return None
        body = json.dumps(data, indent=2, sort_keys=True) + "\n"
        return meta.get("checksum") == f"sha256:{digest(body)}"
    stored, body = _split_comment(text)
    if stored is None:
        return None
    return stored == digest(body)


def compare(path: str, fresh: str, recorded_sha256: str | None = None) -> tuple[str, str]:
    """Status of ``path`` against a fresh compile: current, missing, edited, stale. ``recorded_sha256``: for a
    file copied verbatim (no header), the sha256 the lock beside it records."""
    if not os.path.exists(path):
        return "missing", "not generated yet"
    with open(path, encoding="utf-8", errors="replace", newline="") as fh:  # byte-exact: no CR translation
        text = fh.read()
    if text == fresh:
        return "current", ""
    if recorded_sha256 is not None:
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != recorded_sha256:
            return "edited", "edited by hand (its sha256 no longer matches the one mocompile.lock.json records)"
        return "stale", "the file model_config names changed since it was copied"
    ok = verify(text)
    if ok is None:
        return "edited", "has no mocompile header (written by hand?)"
    if not ok:
        return "edited", "edited by hand (its checksum no longer matches its body)"
    return "stale", "the recipe, a file it extends, or mocompile changed since it was generated"
