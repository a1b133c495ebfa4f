"""Stage 2: check a ``Document`` against the intent schema and fill defaults.

The schema is data (``schemas/intent.yaml``, cerberus). Every problem in a file
is reported at once, with its position and, for unknown keys and bad enum
values, a did-you-mean.
"""

from __future__ import annotations

import copy
import functools
import math
import os
import re
import sys
import types
from typing import Any

from mocompile.datafiles import load_yaml
from mocompile.errors import InputError
from mocompile.ir import Diagnostic, Document, Path

SCHEMA_FILE = os.path.join(os.path.dirname(__file__), "schemas", "intent.yaml")


def _import_cerberus() -> None:
    """Import cerberus without importlib.metadata.

    cerberus' ``__init__`` asks ``importlib.metadata.version("Cerberus")`` for its own version, and
    importing importlib.metadata (email, zipfile, csv, pathlib, ...) then scanning ``sys.path`` costs
    about 60 ms, more than the rest of a cold ``lint``. While cerberus is imported a stand-in answers that
    one question from the ``cerberus-<version>.dist-info`` folder beside the package; it is taken out of
    ``sys.modules`` again at once, so a later ``import importlib.metadata`` gets the real module.
    """
    import importlib
    import importlib.util

    if "importlib.metadata" in sys.modules or hasattr(importlib, "metadata"):
        import cerberus  # noqa: F401 - the real module is loaded already: nothing to save
        return
    shim = types.ModuleType("importlib.metadata")

    class PackageNotFoundError(ModuleNotFoundError):
        pass

    def version(name: str) -> str:
        spec = importlib.util.find_spec("cerberus")
        folder = os.path.dirname(os.path.dirname(spec.origin)) if spec and spec.origin else ""
        prefix = name.lower().replace("-", "_") + "-"
        try:
            for entry in os.listdir(folder):
                if entry.lower().startswith(prefix) and entry.endswith((".dist-info", ".egg-info")):
                    return entry[len(prefix):].rsplit(".", 1)[0]
        except OSError:
            pass
        raise PackageNotFoundError(name)

    shim.PackageNotFoundError = PackageNotFoundError  # type: ignore[attr-defined]
    shim.version = version  # type: ignore[attr-defined]
    sys.modules["importlib.metadata"] = shim
    try:
        import cerberus  # noqa: F401
    finally:
        if sys.modules.get("importlib.metadata") is shim:
            del sys.modules["importlib.metadata"]


_import_cerberus()
from cerberus import TypeDefinition, Validator  # noqa: E402
from cerberus import errors as cerr  # noqa: E402
from cerberus.schema import DefinitionSchema, UnvalidatedSchema  # noqa: E402


@functools.lru_cache(maxsize=1)
def raw_schema() -> dict[str, Any]:
    """The schema file as plain data (cached: pre-commit runs many files)."""
    return load_yaml(SCHEMA_FILE)


@functools.lru_cache(maxsize=1)
def intent_schema() -> dict[str, Any]:
    return {k: v for k, v in raw_schema().items() if k != "model_spec"}


@functools.lru_cache(maxsize=1)
def model_schema() -> dict[str, Any]:
    return raw_schema()["model_spec"]["schema"]


class IntentValidator(Validator):
    """Cerberus with the tri-state types: a value or the string ``auto``."""

    types_mapping = dict(Validator.types_mapping)
    types_mapping["auto_int"] = TypeDefinition("auto_int", (int, str), (bool,))
    types_mapping["auto_bool"] = TypeDefinition("auto_bool", (bool, str), ())
    types_mapping["auto_list"] = TypeDefinition("auto_list", (list, str), ())
    types_mapping["auto_number"] = TypeDefinition("auto_number", (int, float, str), (bool,))

    def _validate_type(self, data_type: Any, field: Any, value: Any) -> None:
        # A string is only acceptable to a tri-state type when it is exactly `auto`.
        types = data_type if isinstance(data_type, list) else [data_type]
        if isinstance(value, str) and value != "auto" and all(str(t).startswith("auto_") for t in types):
            self._error(field, cerr.BAD_TYPE)
            return
        if isinstance(value, int) and not isinstance(value, bool) and value < 1 and "auto_int" in types:
            self._error(field, cerr.BAD_TYPE)
            return
        super()._validate_type(data_type, field, value)

    _validate_type.__doc__ = Validator._validate_type.__doc__  # cerberus reads its rule schema from here

    def _validate_regex(self, pattern: str, field: Any, value: Any) -> None:
        # Cerberus matches with `re.match` and a trailing `$`, which also accepts a value ending in
        # "\n" (a name "abc\n" became a folder "abc\n"; a qos "q\n" a stray #SBATCH line). The whole
        # value must match, as in JSON Schema: tests/test_hostile_values.py.
        # re.ASCII: \d and \s mean what they mean in JSON Schema (ECMA-262) and to the emitters' escapers; Python's
        # Unicode \d let '\u0660' (an Arabic-Indic zero) through as a Slurm time limit (tests/fuzz found it)
        if isinstance(value, str) and not re.fullmatch(pattern, value, re.ASCII):
            self._error(field, cerr.REGEX_MISMATCH)

    _validate_regex.__doc__ = Validator._validate_regex.__doc__


TYPE_WORDS = {
    "auto_int": "a positive integer or `auto`",
    "auto_bool": "true, false or `auto`",
    "auto_list": "a list or `auto`",
    "auto_number": "a number or `auto`",
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "dict": "a mapping",
    "list": "a list",
}


def _type_name(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", dict: "mapping",
            list: "list", type(None): "null"}.get(type(value), type(value).__name__)


def _leaves(errs: list[cerr.ValidationError]) -> list[cerr.ValidationError]:
    out: list[cerr.ValidationError] = []
    for e in errs:
        if e.is_group_error and e.child_errors:
            out.extend(_leaves(list(e.child_errors)))
        else:
            out.append(e)
    return out


def _suggest(word: str, options: list[str]) -> str:
    import difflib  # only for a misspelt key or value: not imported by every lint

    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f"did you mean `{close[0]}`?" if close else ""


def _megatron_names(rules: Any) -> list[str]:
    """The Megatron field a key sets, as its description names it in parentheses, e.g. ``ep``'s
    "(expert_model_parallel_size)", with the shorter spellings people type for it ("expert_parallel")."""
    import re

    desc = ((rules or {}).get("meta") or {}).get("description", "") if isinstance(rules, dict) else ""
    out: list[str] = []
    for name in re.findall(r"\(([a-z][a-z0-9]*(?:_[a-z0-9]+)+)\)", str(desc)):
        short = name.removesuffix("_size")
        out += [name, short, short.replace("_model_", "_")]
    return list(dict.fromkeys(out))


def _suggest_key(word: str, keys: dict[str, Any]) -> str:
    """A misspelt key: the section's key it most likely means, matched against each key's name and the Megatron
    field it sets (so `expert_parallel` finds `ep`, not the nearer-spelt `sequence_parallel`)."""
    import difflib

    names = {k: _megatron_names(rules) for k, rules in keys.items()}
    for key, aliases in names.items():
        if word in aliases:
            return f"did you mean `{key}` ({aliases[0]})?"
    spellings = {k: k for k in keys} | {a: k for k, aliases in names.items() for a in aliases}
    close = difflib.get_close_matches(word, list(spellings), n=1, cutoff=0.6)
    if not close:
        return ""
    key = spellings[close[0]]
    return f"did you mean `{key}`{f' ({names[key][0]})' if names[key] else ''}?"


def _rules_at(schema: dict[str, Any], path: Path) -> dict[str, Any]:
    """The schema rules for ``path`` (list indices step into `schema`)."""
    node: dict[str, Any] = {"type": "dict", "schema": schema}
    for part in path:
        sub = node.get("schema", {})
        if isinstance(part, int):
            node = sub if isinstance(sub, dict) and "type" in sub else {}
        else:
            node = sub.get(part, {}) if isinstance(sub, dict) else {}
    return node


def _describe(e: cerr.ValidationError, schema: dict[str, Any], prefix: Path) -> tuple[str, str, Path, bool]:
    """Turn one cerberus error into (message, hint, path, point-at-key)."""
    path = prefix + tuple(e.document_path)
    dotted = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")  # a.b[0].c
    code = e.code
    if code == cerr.UNKNOWN_FIELD.code:
        parent = _rules_at(schema, path[len(prefix):-1]).get("schema", {}) if len(path) > len(prefix) else {}
        known = [k for k in parent if not parent[k].get("meta", {}).get("internal")] if isinstance(parent, dict) else []
        hint = _suggest_key(str(path[-1]), {k: parent[k] for k in known}) \
            or (f"known keys: {', '.join(sorted(known))}" if known else "")
        return f"unknown key `{dotted}`", hint, path, True
    if code == cerr.REQUIRED_FIELD.code:
        return f"missing required key `{dotted}`", f"add `{path[-1]}:`", path[:-1], True
    if code == cerr.BAD_TYPE.code:
        want = e.constraint if isinstance(e.constraint, list) else [e.constraint]
        words = " or ".join(TYPE_WORDS.get(str(w), str(w)) for w in want)
        return f"`{dotted}` must be {words}, got {_type_name(e.value)} {e.value!r}", "", path, False
    if code in (cerr.UNALLOWED_VALUE.code, cerr.UNALLOWED_VALUES.code):
        allowed = [str(a) for a in e.constraint]
        bad = e.value if code == cerr.UNALLOWED_VALUE.code else [v for v in e.value if v not in e.constraint]
        first = bad[0] if isinstance(bad, list) and bad else bad
        hint = _suggest(str(first), allowed)
        return (f"`{dotted}` has unknown value {first!r}; allowed: {', '.join(allowed)}", hint, path, False)
    if code == cerr.MIN_VALUE.code:
        return f"`{dotted}` must be >= {e.constraint}, got {e.value!r}", "", path, False
    if code == cerr.MAX_VALUE.code:  # the field's description says why it is bounded
        desc = _rules_at(schema, path[len(prefix):]).get("meta", {}).get("description", "")
        return f"`{dotted}` must be <= {e.constraint}, got {e.value!r}", desc, path, False
    if code == cerr.MIN_LENGTH.code:
        return f"`{dotted}` needs at least {e.constraint} item(s), got {len(e.value)}", "", path, False
    if code == cerr.REGEX_MISMATCH.code:
        desc = _rules_at(schema, path[len(prefix):]).get("meta", {}).get("description", "")
        return f"`{dotted}` has an invalid value {e.value!r}", desc, path, False
    return f"`{dotted}`: {e.rule} {e.constraint!r} not satisfied (value {e.value!r})", "", path, False


@functools.lru_cache(maxsize=2)
def _validator(which: str) -> IntentValidator:
    """One validator per schema.

    Cerberus checks a schema against its own rule schema when a validator is made (20 ms, a fifth of
    a cold ``lint``). The schema is package data that never changes at run time, so it is checked by
    the tests (``checked_validator``) and not on every start; the expansion of shorthand rules that
    the check would do is still done.
    """
    schema = copy.deepcopy(intent_schema() if which == "intent" else model_schema())
    return IntentValidator(UnvalidatedSchema(DefinitionSchema.expand(schema)))


def checked_validator(which: str) -> IntentValidator:
    """The same validator with cerberus' own check of the schema (raises ``SchemaError``): for tests."""
    return IntentValidator(copy.deepcopy(intent_schema() if which == "intent" else model_schema()))


def _check(data: dict[str, Any], schema: dict[str, Any], doc: Document, prefix: Path) -> tuple[dict[str, Any], list[Diagnostic]]:
    v = _validator("intent" if prefix == () else "model")
    # Cerberus' normalisation re-validates sub-schemas per field and costs ~15x the
    # validation itself; defaults are the only normalisation the schema uses, so we fill
    # them with _defaults() after a non-normalising validation.
    ok = v.validate(data, normalize=False)
    diags: list[Diagnostic] = []
    if not ok:
        for e in _leaves(list(v._errors)):
            msg, hint, path, at_key = _describe(e, schema, prefix)
            pos = doc.positions.get(path + ("<key>",)) if at_key else None
            diags.append(Diagnostic("SCHEMA", "error", msg, pos or doc.position(path), hint))
    return (_defaults(data, schema) if ok else data), diags


def _defaults(data: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """Fill every ``default`` of the schema into ``data`` (recursively, for mappings)."""
    for key, rule in schema.items():
        if key not in data and "default" in rule:
            data[key] = copy.deepcopy(rule["default"])
        if rule.get("type") == "dict" and "schema" in rule and isinstance(data.get(key), dict):
            _defaults(data[key], rule["schema"])
    return data


def _blend_problems(blend: Any) -> list[tuple[int, str, str]]:
    """(index, message, hint) for a blend that Megatron-Core would reject or misread.

    ``get_blend_from_list`` reads a list as prefixes, or as weight/prefix pairs when it starts
    with a number; anything in between fails at dataset build, after the job has started.
    """
    if not isinstance(blend, list) or not blend:
        return []
    out: list[tuple[int, str, str]] = []
    weighted = isinstance(blend[0], (int, float)) and not isinstance(blend[0], bool)
    pair_hint = "write weight/prefix pairs, e.g. [0.7, /data/web/text_document, 0.3, /data/code/text_document]"
    if weighted and len(blend) % 2:
        out.append((len(blend) - 1, "`training.data.blend` has weights, so it needs weight/prefix pairs "
                    f"(even length); got {len(blend)} items", pair_hint))
    for i, item in enumerate(blend):
        want_weight = weighted and i % 2 == 0
        is_num = isinstance(item, (int, float)) and not isinstance(item, bool)
        where = f"`training.data.blend[{i}]`"
        if want_weight and not is_num:
            out.append((i, f"{where} must be a weight (a number), got {item!r}", pair_hint))
        elif want_weight and not (math.isfinite(item) and item > 0):
            out.append((i, f"{where}: weight must be > 0, got {item!r}", "drop the dataset instead of weighting it 0"))
        elif not want_weight and is_num:
            out.append((i, f"{where} must be a dataset prefix (a path), got the number {item!r}",
                        pair_hint if weighted else "give every prefix a weight, or none"))
        elif not want_weight and isinstance(item, str):
            if not item.strip() or any(ord(ch) < 32 for ch in item):
                out.append((i, f"{where} is not a usable path: {item!r}", "a path without control characters"))
            elif item.endswith((".bin", ".idx")):
                out.append((i, f"{where} names a file ({item!r}); Megatron wants the prefix",
                            f"write {item[:-4]!r}: Megatron adds .bin and .idx itself"))
    return out


def _training_io_problems(data: dict[str, Any], doc: Document) -> list[Diagnostic]:
    """Checks of the data keys that a schema cannot express (each one a bad input, exit 2)."""
    training = data.get("training")
    d = training.get("data") if isinstance(training, dict) else None
    if not isinstance(d, dict):
        return []
    out = [Diagnostic("SCHEMA", "error", msg, doc.position(("training", "data", "blend", i)), hint)
           for i, msg, hint in _blend_problems(d.get("blend"))]
    split = d.get("split")
    if isinstance(split, str):
        numbers = [float(x) for x in re.findall(r"\d+(?:\.\d+)?", split)]
        if numbers and sum(numbers) <= 0:
            out.append(Diagnostic("SCHEMA", "error", f"`training.data.split` {split!r} gives every split weight 0",
                                  doc.position(("training", "data", "split")), "e.g. '969,30,1'"))
    return out


def validate(doc: Document) -> dict[str, Any]:
    """Return the intent with defaults filled, or raise ``InputError`` with every problem."""
    intent, diags = _check(copy.deepcopy(doc.data), intent_schema(), doc, ())
    if isinstance(doc.data.get("model"), dict):
        _, mdiags = _check(copy.deepcopy(doc.data["model"]), model_schema(), doc, ("model",))
        diags += mdiags
    diags += _training_io_problems(doc.data, doc)
    if diags:
        raise InputError(sorted(diags, key=lambda d: (d.position, d.message)))
    return intent
