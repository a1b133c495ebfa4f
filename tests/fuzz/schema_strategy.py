"""Hypothesis strategies built from the intent's JSON Schema (``mocompile schema``).

Why not hypothesis-jsonschema: its last release (0.23.1, 2024) calls ``many.more()``, which
the hypothesis pinned by the test environment (6.170) no longer has, so every object schema
fails to draw (AttributeError). The subset of JSON Schema the intent uses is small (object,
array, enum, const, anyOf, type lists, minimum/maximum, pattern, propertyNames), so this maps
it straight onto hypothesis primitives. Integers mix uniform draws with each bound's edge
(min, min+1, max-1, max), where most rules change their verdict.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

# Upper bounds this suite would put on fields the schema leaves open, each with the reason. None today:
# the planner no longer enumerates the world size's divisors, so even 10**10 nodes plan in well under a
# second (tests/fuzz/test_fuzz_schema.py::test_huge_cluster_is_planned_or_refused_quickly).
OPEN_BOUNDS: dict[str, int] = {}


def _integers(schema: dict[str, Any], path: str) -> st.SearchStrategy[int]:
    lo = schema.get("minimum")
    hi = schema.get("maximum", OPEN_BOUNDS.get(path))
    edges = [v for v in (lo, None if lo is None else lo + 1, None if hi is None else hi - 1, hi) if v is not None]
    edges += [v for v in (0, 1, 2, 3, 4, 8, 16, 24, 64, 128, 1024) if (lo is None or v >= lo) and (hi is None or v <= hi)]
    return st.one_of(st.sampled_from(sorted(set(edges))), st.integers(min_value=lo, max_value=hi))


def _strings(schema: dict[str, Any]) -> st.SearchStrategy[str]:
    if "pattern" in schema:
        return st.from_regex(schema["pattern"], fullmatch=True)
    return st.text(max_size=24)


def _object(schema: dict[str, Any], path: str) -> st.SearchStrategy[dict[str, Any]]:
    props = schema.get("properties", {})
    required = set(schema.get("required", []))
    fixed = {k: from_schema(v, f"{path}.{k}".lstrip(".")) for k, v in props.items() if k in required}
    optional = {k: from_schema(v, f"{path}.{k}".lstrip(".")) for k, v in props.items() if k not in required}
    base = st.fixed_dictionaries(fixed, optional=optional)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict) and extra:
        names = _strings(schema.get("propertyNames", {})).filter(lambda k: k not in props)
        more = st.dictionaries(names, from_schema(extra, path + ".*"), max_size=4)
        return st.tuples(base, more).map(lambda pair: {**pair[1], **pair[0]})
    return base


def from_schema(schema: dict[str, Any], path: str = "") -> st.SearchStrategy[Any]:
    """Values that satisfy ``schema`` (the intent schema's subset of JSON Schema)."""
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "anyOf" in schema or "oneOf" in schema:
        return st.one_of([from_schema(s, path) for s in schema.get("anyOf", schema.get("oneOf"))])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, path) for k in kind])
    if kind == "object":
        return _object(schema, path)
    if kind == "array":
        return st.lists(from_schema(schema.get("items", {}), path + "[]"), max_size=4)
    if kind == "integer":
        return _integers(schema, path)
    if kind == "number":
        return st.floats(min_value=schema.get("minimum"), max_value=schema.get("maximum"), allow_nan=False,
                         allow_infinity=False)
    if kind == "string":
        return _strings(schema)
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.text(max_size=8))
