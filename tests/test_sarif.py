"""CI annotations: `--format sarif` validated against the official SARIF 2.1.0 JSON schema (OASIS,
vendored as tests/ecosystem/data/sarif-schema-2.1.0.json from oasis-tcs/sarif-spec,
sarif-2.1/schema/), and `--format github` workflow commands with file, line and column."""

from __future__ import annotations

import functools
import json
import re
import shutil

import pytest
from conftest import ROOT, run_cli

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed (tests/ecosystem/setup.sh)")

SCHEMA = ROOT / "tests" / "ecosystem" / "data" / "sarif-schema-2.1.0.json"
TINY = ROOT / "recipes" / "tiny-moe-h100x2.yaml"
# RFC 3986 URI-reference characters (the schema's "format": "uri-reference", which jsonschema does not
# check without extra packages).
URI_REFERENCE = re.compile(r"^[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]+$")
GH_LINE = re.compile(r"^::(error|warning|notice) file=([^,:]+),line=(\d+),col=(\d+),title=([A-Z0-9]+)::(.+)$")


@functools.lru_cache(maxsize=1)
def validator():
    schema = json.loads(SCHEMA.read_text())
    assert schema["title"].startswith("Static Analysis Results Format (SARIF) Version 2.1.0")
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _cases(tmp_path):
    """name -> (recipe path, expected exit code, rule IDs that must appear)."""
    findings = tmp_path / "findings.yaml"
    findings.write_text(TINY.read_text() + "moe: {overlap: true, dispatcher: allgather}\nparallelism: {ep: 1}\n")
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text("schema: 1\nmodel: tiny-moe\nhardware: {gpu: h100, nodes: 1}\ngoal: fastest\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("schema: 1\nmodel: [unclosed\n")
    return {
        "clean": (TINY, 0, set()),
        "warning": (ROOT / "recipes" / "deepseek-v3-h100-deepep.yaml", 0, {"DSP006"}),
        "findings": (findings, 1, {"OVL001", "OVL002"}),
        "schema-error": (invalid, 2, {"SCHEMA"}),
        "yaml-error": (broken, 2, set()),
    }


@pytest.mark.parametrize("case", ["clean", "warning", "findings", "schema-error", "yaml-error"])
def test_sarif_is_valid_sarif_2_1_0(case, tmp_path):
    path, code, rules = _cases(tmp_path)[case]
    proc = run_cli("lint", str(path), "--format", "sarif")
    assert proc.returncode == code, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(doc)]
    assert errors == []
    run = doc["runs"][0]
    driver = run["tool"]["driver"]
    assert driver["name"] == "mocompile" and driver["version"]
    by_id = {r["id"]: r for r in driver["rules"]}
    assert len(by_id) == len(driver["rules"])
    got = {r["ruleId"] for r in run["results"]}
    assert rules <= got
    if code == 0 and not rules:
        assert run["results"] == []
    if case != "clean":
        assert run["results"]
    for result in run["results"]:
        rule = by_id[result["ruleId"]]  # every result has its rule's metadata
        assert rule["help"]["text"].strip()
        assert rule["shortDescription"]["text"].strip()
        loc = result["locations"][0]["physicalLocation"]
        assert URI_REFERENCE.match(loc["artifactLocation"]["uri"]), loc
        if "region" in loc:
            assert loc["region"]["startLine"] >= 1 and loc["region"]["startColumn"] >= 1


def test_sarif_rules_carry_catalogue_help_and_level(tmp_path):
    path, _, _ = _cases(tmp_path)["findings"]
    doc = json.loads(run_cli("lint", str(path), "--format", "sarif").stdout)
    catalogue = {r["id"]: r for r in json.loads(run_cli("rules", "--format", "json").stdout)}
    for rule in doc["runs"][0]["tool"]["driver"]["rules"]:
        if rule["id"] in catalogue:
            c = catalogue[rule["id"]]
            assert c["hint"] in rule["help"]["text"]
            assert rule["fullDescription"]["text"] == c["message"]
            assert rule["defaultConfiguration"]["level"] == ("error" if c["severity"] == "error" else "warning")


def test_sarif_uri_of_a_path_with_a_space(tmp_path):
    """SARIF artifactLocation.uri is a URI reference: a space must arrive percent-encoded."""
    d = tmp_path / "my recipes"
    d.mkdir()
    shutil.copy(_cases(tmp_path)["findings"][0], d / "bad.yaml")
    doc = json.loads(run_cli("lint", str(d / "bad.yaml"), "--format", "sarif").stdout)
    assert validator().is_valid(doc)
    for result in doc["runs"][0]["results"]:
        uri = result["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        assert URI_REFERENCE.match(uri), uri


def test_github_workflow_commands_point_at_the_pinned_value(tmp_path):
    path, _, _ = _cases(tmp_path)["findings"]
    lines = path.read_text().splitlines()
    proc = run_cli("lint", "findings.yaml", "--format", "github", cwd=tmp_path)
    assert proc.returncode == 1
    out = proc.stdout.strip().splitlines()
    assert out
    seen = set()
    for line in out:
        m = GH_LINE.match(line)
        assert m, line
        level, file, ln, col, rule, msg = m.groups()
        assert file == "findings.yaml" and level == "error"
        seen.add(rule)
        text = lines[int(ln) - 1]
        assert 1 <= int(col) <= len(text)
        if rule == "OVL001":
            assert text[int(col) - 1:].startswith("true") and "overlap" in text  # the pinned value
        assert "%0A" not in msg or "\n" not in msg
    assert {"OVL001", "OVL002"} <= seen


def test_github_escapes_properties_and_message(tmp_path):
    """Workflow-command syntax: ',' and ':' in properties, and newlines anywhere, are %-escaped."""
    d = tmp_path / "a,b:c"
    d.mkdir()
    shutil.copy(_cases(tmp_path)["findings"][0], d / "x.yaml")
    proc = run_cli("lint", str(d / "x.yaml"), "--format", "github")
    for line in proc.stdout.strip().splitlines():
        props = line.split("::")[1]
        assert "a%2Cb%3Ac" in props
        assert len(props.split(",")) == 4  # file, line, col, title


def test_github_is_the_default_format_on_github_actions(tmp_path):
    path, _, _ = _cases(tmp_path)["findings"]
    proc = run_cli("lint", str(path), env={"GITHUB_ACTIONS": "true"})
    assert proc.stdout.startswith("::error file=")
