"""Editors: `mocompile schema` (JSON Schema of the intent format, derived from the cerberus schema),
the recipes' yaml-language-server modelines, and every recipe checked with the real
`check-jsonschema` against the schema its modeline names."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, recipe_files, run_cli
from mocompile.schema import intent_schema, model_schema

MODELINE = re.compile(r"^# yaml-language-server: \$schema=(\S+)$")
SCHEMA_FILE = ROOT / "schemas" / "intent.schema.json"




RECIPES = recipe_files()


def check_jsonschema(*args: str) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("check_jsonschema") is None:
        pytest.skip("check-jsonschema not installed (tests/ecosystem/setup.sh installs it)")
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--no-cache", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def _modeline_target(recipe: str) -> Path:
    first = (ROOT / recipe).read_text().splitlines()[0]
    m = MODELINE.match(first)
    assert m, f"{recipe}: first line must be the yaml-language-server modeline, got {first!r}"
    return (ROOT / recipe).parent.joinpath(m.group(1)).resolve()


def test_schema_command_writes_the_committed_file(tmp_path):
    out = tmp_path / "intent.schema.json"
    assert run_cli("schema", "-o", str(out)).returncode == 0
    assert out.read_text() == SCHEMA_FILE.read_text()


def test_schema_is_valid_draft7():
    proc = check_jsonschema("--check-metaschema", str(SCHEMA_FILE))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_modeline_names_the_schema(recipe):
    assert _modeline_target(recipe) == SCHEMA_FILE.resolve()


@pytest.mark.parametrize("recipe", RECIPES)
def test_check_jsonschema_accepts_every_recipe(recipe):
    target = _modeline_target(recipe)
    proc = check_jsonschema("--schemafile", str(target), str(ROOT / recipe))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_jsonschema_and_mocompile_agree_on_bad_values(tmp_path):
    base = (ROOT / "recipes" / "tiny-moe-h100x2.yaml").read_text()
    cases = {
        "enum": base.replace("goal: throughput", "goal: fastest"),
        "unknown-key": base + "moe: {overlapp: true}\n",
        "type": base.replace("train_iters: 30", "train_iters: thirty"),
        "gpu": base.replace("gpu: h100", "gpu: h300"),
        "missing": base.replace("goal: throughput\n", ""),
    }
    for name, text in cases.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text.replace("../schemas/", str(ROOT / "schemas") + "/"))
        proc = check_jsonschema("--schemafile", str(SCHEMA_FILE), str(path))
        assert proc.returncode == 1, (name, proc.stdout)
        assert run_cli("lint", str(path)).returncode == 2, name


def _pairs(cerb: dict, js: dict, path: str = ""):
    """Walk the cerberus schema and the JSON Schema side by side."""
    for key, rule in cerb.items():
        node = js["properties"][key]
        yield f"{path}{key}", rule, node
        if rule.get("type") == "dict" and "schema" in rule:
            yield from _pairs(rule["schema"], node, f"{path}{key}.")


def test_descriptions_and_enums_come_from_the_cerberus_schema():
    js = json.loads(run_cli("schema").stdout)
    model_js = next(a for a in js["properties"]["model"]["anyOf"] if a.get("type") == "object")
    n_enum = n_desc = 0
    for where, (cerb, node) in {"intent": (intent_schema(), js), "model": (model_schema(), model_js)}.items():
        for key, rule, jnode in _pairs(cerb, node):
            if key == "model" and where == "intent":
                continue
            if "allowed" in rule:
                n_enum += 1
                assert [v for v in jnode["enum"] if v is not None] == list(rule["allowed"]), key
            desc = (rule.get("meta") or {}).get("description")
            if desc:
                n_desc += 1
                assert jnode["description"] == desc, key
            if "." not in key:  # the root's required keys apply unless the recipe `extends` a base
                required = node.get("required") or node.get("else", {}).get("required", [])
                assert (rule.get("required") is True) == (key in required), key
    assert n_enum >= 5 and n_desc >= 20
    from mocompile.catalogue import models
    assert js["properties"]["model"]["anyOf"][0]["enum"] == sorted(models())


def test_a_recipe_that_extends_a_base_may_leave_nested_required_keys_to_it():
    """`extends` merges the base under the recipe: `hardware: {nodes: 4}` is complete when the base names the
    GPU. Without `extends` the same nested keys are required, as mocompile requires them."""
    jsonschema = pytest.importorskip("jsonschema")
    validator = jsonschema.Draft7Validator(json.loads(SCHEMA_FILE.read_text()))
    child = {"extends": "base.yaml", "hardware": {"nodes": 4}, "tokenizer": {"type": "huggingface"},
             "profile": {"start": 5}}
    assert list(validator.iter_errors(child)) == []
    alone = {"schema": 1, "model": "qwen3-30b-a3b", "goal": "throughput", "hardware": {"nodes": 4}}
    errors = [(list(e.absolute_path), e.message) for e in validator.iter_errors(alone)]
    assert errors == [(["hardware"], "'gpu' is a required property")]
    for missing in ({"tokenizer": {"type": "huggingface"}}, {"profile": {"start": 5}},
                    {"training": {"data": {"type": "megatron"}}}):
        full = dict(alone, hardware={"gpu": "h100", "nodes": 4}, **missing)
        assert [e.validator for e in validator.iter_errors(full)] == ["required"], missing
