"""`mocompile explain ID` answers for every ID the tool can print: catalogue rules, input limits, the reading
and writing stages, `check`, and the generated preflight's run-time checks (data/checks.yaml)."""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT, run_cli
from mocompile.limits import ALL as LIMITS
from mocompile.rules.engine import by_id
from mocompile.rules.stages import checks

PACKAGE = ROOT / "compiler" / "mocompile"


def printed_ids() -> set[str]:
    """Every ID in the package's source that reaches a user: Diagnostic("ID", ...) and rule="ID" in the code,
    and the RUNnnn checks of the generated preflight (templates)."""
    ids: set[str] = set()
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        ids |= set(re.findall(r'Diagnostic\(\s*"([A-Z][A-Z0-9]*)"', text))
        ids |= set(re.findall(r'rule\s*=\s*"([A-Z][A-Z0-9]*)"', text))
        ids |= set(re.findall(r'"rule":\s*"([A-Z][A-Z0-9]*)"', text))  # findings built as dicts (rankprobe.py)
        ids |= set(re.findall(r'\b_error\(\s*"([A-Z][A-Z0-9]*)"', text))  # a module's error helper (hfconfig.py)
    for path in (PACKAGE / "emit" / "templates").glob("*.j2"):
        ids |= set(re.findall(r"\b(?:RUN|PRB)\d{3}\b", path.read_text()))
    return ids


def test_the_source_prints_the_ids_this_test_expects():
    ids = printed_ids()
    # a test that found nothing would pass vacuously: these are known to be printed today
    assert {"INPUT", "SCHEMA", "WRITE", "EDITED", "RUN001", "RUN013"} <= ids


@pytest.mark.parametrize("rule", sorted(printed_ids() | {lim.id for lim in LIMITS} | set(by_id())))
def test_every_printable_id_has_an_explain_page(rule):
    proc = run_cli("explain", rule)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"({rule})" in proc.stdout and "not found" not in proc.stdout + proc.stderr


def test_every_entry_of_the_data_file_is_an_id_the_tool_prints():
    """No stale pages: an entry whose ID nothing prints any more is a page about nothing."""
    assert set(checks()) <= printed_ids()


def test_an_explain_page_is_case_blind_and_has_a_json_form():
    proc = run_cli("explain", "run011", "--format", "json")
    page = json.loads(proc.stdout)
    assert proc.returncode == 0 and page["id"] == "RUN011" and page["stage"] == "preflight"
    assert "versions.apex: none" in page["fix"]


def test_a_file_named_like_an_id_is_explained_as_a_file(tmp_path):
    (tmp_path / "SCHEMA").write_text("not: [a recipe")
    proc = run_cli("explain", "SCHEMA", cwd=tmp_path)
    assert proc.returncode == 2 and "malformed YAML" in proc.stdout + proc.stderr


def test_the_rule_reference_lists_the_ids_outside_the_catalogue():
    text = (ROOT / "docs" / "rules.md").read_text()
    for rule in [*checks(), *(lim.id for lim in LIMITS)]:
        assert f"| {rule} |" in text
