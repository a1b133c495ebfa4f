"""Derive a JSON Schema for editors from the same cerberus schema the compiler uses."""

from __future__ import annotations

from typing import Any

from mocompile import __version__
from mocompile.catalogue import models
from mocompile.schema import intent_schema, model_schema

SIMPLE = {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean",
          "dict": "object", "list": "array"}


def _rule(r: dict[str, Any]) -> dict[str, Any]:
    t = r.get("type")
    out: dict[str, Any] = {}
    desc = (r.get("meta") or {}).get("description")
    if t == "auto_int":
        inner = {"type": "integer", "minimum": 1, **({"maximum": r["max"]} if "max" in r else {})}
        out = {"anyOf": [inner, {"const": "auto"}]}
    elif t == "auto_bool":
        out = {"anyOf": [{"type": "boolean"}, {"const": "auto"}]}
    elif t == "auto_number":
        inner = {"type": "number", **({"minimum": r["min"]} if "min" in r else {}),
                 **({"maximum": r["max"]} if "max" in r else {})}
        out = {"anyOf": [inner, {"const": "auto"}]}
    elif t == "auto_list":
        out = {"anyOf": [{"type": "array", "items": _rule(r.get("schema", {}))}, {"const": "auto"}]}
    elif isinstance(t, list):
        out = {"type": [SIMPLE[x] for x in t]}
    elif t in SIMPLE:
        out = {"type": SIMPLE[t]}
    if t == "dict" and "schema" in r:
        out.update(_object(r["schema"]))
    elif isinstance(t, list) and "dict" in t and "schema" in r:  # e.g. training.data: `mock` or a mapping
        obj = _object(r["schema"])
        obj.pop("type")  # properties/required apply to objects only; the type list stays
        out.update(obj)
    if t == "dict" and "keysrules" in r:
        out["propertyNames"] = {"pattern": r["keysrules"]["regex"]}
    if t == "dict" and "valuesrules" in r:
        vt = r["valuesrules"]["type"]
        out["additionalProperties"] = {"type": [SIMPLE[x] for x in (vt if isinstance(vt, list) else [vt])]}
    if t == "list" and "schema" in r:
        out["items"] = _rule(r["schema"])
    if "allowed" in r:
        out["enum"] = list(r["allowed"]) + ([None] if r.get("nullable") else [])
    if "min" in r and t != "auto_number":  # bounds on its number branch
        out["minimum"] = r["min"]
    if "minlength" in r:
        out["minItems"] = r["minlength"]
    if "max" in r and t not in ("auto_int", "auto_number"):  # their bounds sit on their number branch
        out["maximum"] = r["max"]
    if "regex" in r:
        out["pattern"] = r["regex"]
    if r.get("nullable") and "type" in out and isinstance(out["type"], str):
        out["type"] = [out["type"], "null"]
    if "default" in r:
        out["default"] = r["default"]
    if desc:
        out["description"] = desc
    return out


def _object(schema: dict[str, Any]) -> dict[str, Any]:
    props = {k: _rule(v) for k, v in schema.items()}
    required = sorted(k for k, v in schema.items() if v.get("required"))
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def _pop_required(node: dict[str, Any]) -> dict[str, Any]:
    """Remove ``required`` from an object schema and its nested properties; return them as a schema of their own
    (the same nesting), which an instance without ``extends`` must also satisfy."""
    out: dict[str, Any] = {}
    required = node.pop("required", None)
    if required:
        out["required"] = required
    props = {k: frag for k, sub in (node.get("properties") or {}).items() if (frag := _pop_required(sub))}
    if props:
        out["properties"] = props
    return out


def json_schema() -> dict[str, Any]:
    root = _object(intent_schema())
    model_obj = _object(model_schema())
    root["properties"]["model"] = {
        "description": root["properties"]["model"].get("description", ""),
        "anyOf": [{"type": "string", "enum": sorted(models())}, model_obj],
    }
    # A recipe that `extends` another inherits the required keys from its base file, nested ones too (a base
    # that names hardware.gpu lets the recipe write only hardware.nodes): every `required` moves to the branch
    # for recipes without `extends`; mocompile itself checks the merged recipe.
    root["if"] = {"required": ["extends"]}
    root["else"] = _pop_required(root)
    return {"$schema": "http://json-schema.org/draft-07/schema#",
            "$id": f"https://mocompile.dev/schema/intent-{__version__}.json",
            "title": "mocompile intent", **root}
