"""One function per output format for diagnostics (text, json, github, sarif)."""

from __future__ import annotations

import json
import os
from typing import Any

from mocompile import __version__
from mocompile.ir import Diagnostic
from mocompile.textsafe import visible

COLOURS = {"error": "\033[31m", "warning": "\033[33m", "info": "\033[36m"}
RESET, DIM, BOLD = "\033[0m", "\033[2m", "\033[1m"


def text(diags: list[Diagnostic], colour: bool = False) -> str:
    """One line per diagnostic (and one per hint). File names, messages and hints carry
    input (keys, values, the recipe's file name): they are shown with escapes, never raw."""
    lines = []
    for d in diags:
        sev = f"{COLOURS.get(d.severity, '')}{d.severity}{RESET}" if colour else d.severity
        pos = visible(d.position)
        where = f"{BOLD}{pos}{RESET}" if colour else pos
        lines.append(f"{where}: {sev} [{visible(d.rule)}] {visible(d.message)}")
        if d.hint:
            lines.append(f"    {DIM if colour else ''}hint: {visible(d.hint)}{RESET if colour else ''}")
    return "\n".join(lines)


def as_json(diags: list[Diagnostic]) -> str:
    return json.dumps([d.as_dict() for d in diags], indent=2)


def _gh_escape(value: str, prop: bool = False) -> str:
    """GitHub's workflow-command escaping, after control characters other than CR/LF became escapes."""
    value = visible(value, keep="\r\n").replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return value.replace(":", "%3A").replace(",", "%2C") if prop else value


def github(diags: list[Diagnostic]) -> str:
    """GitHub Actions workflow commands: one annotation per diagnostic."""
    out = []
    for d in diags:
        level = {"error": "error", "warning": "warning"}.get(d.severity, "notice")
        props = [f"file={_gh_escape(d.position.file, True)}"]
        if d.position.line:
            props += [f"line={d.position.line}", f"col={d.position.column}"]
        props.append(f"title={_gh_escape(d.rule, True)}")
        msg = d.message + (f" (hint: {d.hint})" if d.hint else "")
        out.append(f"::{level} {','.join(props)}::{_gh_escape(msg)}")
    return "\n".join(out)


def _uri(path: str) -> str:
    """SARIF wants URI references: relative paths percent-encoded, absolute ones as file: URIs."""
    import urllib.parse  # only SARIF needs it: not imported by every lint

    posix = path.replace(os.sep, "/")
    return "file://" + urllib.parse.quote(posix) if os.path.isabs(path) else urllib.parse.quote(posix)


def sarif(diags: list[Diagnostic], rules: list[Any]) -> str:
    """SARIF 2.1.0 with rule metadata (name, help text, default level)."""
    used = {d.rule for d in diags}
    meta = [r for r in rules if r.id in used]
    known = {r.id for r in meta}
    rule_objs = [{
        "id": r.id, "name": r.name,
        "shortDescription": {"text": r.name.replace("-", " ")},
        "fullDescription": {"text": r.message},
        "help": {"text": f"{r.hint} (upstream: {r.source})"},
        "defaultConfiguration": {"level": "error" if r.severity == "error" else "warning"},
        "properties": {"upstream": r.upstream},
    } for r in meta]
    for rid in sorted(used - known):
        rule_objs.append({"id": rid, "name": rid.lower(), "shortDescription": {"text": "input problem"},
                          "help": {"text": "fix the recipe input"}})
    results = []
    for d in diags:
        region = {"startLine": d.position.line, "startColumn": d.position.column} if d.position.line else None
        loc: dict[str, Any] = {"physicalLocation": {"artifactLocation": {"uri": _uri(d.position.file)}}}
        if region:
            loc["physicalLocation"]["region"] = region
        results.append({
            "ruleId": d.rule,
            "level": {"error": "error", "warning": "warning"}.get(d.severity, "note"),
            "message": {"text": d.message + (f" Hint: {d.hint}" if d.hint else "")},
            "locations": [loc],
        })
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{"tool": {"driver": {"name": "mocompile", "version": __version__,
                                      "informationUri": "https://pypi.org/project/mocompile/",
                                      "rules": rule_objs}},
                  "results": results}],
    }
    return json.dumps(doc, indent=2)
