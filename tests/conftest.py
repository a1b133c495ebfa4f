"""Shared helpers: run the compiler in-process on files and overrides."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
RULE_BASE = FIXTURES / "rule_base.yaml"
sys.path.insert(0, str(ROOT / "compiler"))


def recipe_files() -> list[str]:
    """The project's recipes as [tool.mocompile] lists them, relative to the repository root."""
    from mocompile.project import load_settings
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return sorted(load_settings().recipe_files())
    finally:
        os.chdir(cwd)


def _value(v):
    """Render a Python value as the text `--set` parses (YAML flow)."""
    import json
    if v is None:
        return "null"
    if isinstance(v, str):
        return v if v not in ("true", "false", "null", "auto") else v
    return json.dumps(v)


def overrides(d: dict) -> list[str]:
    return [f"{k}={_value(v)}" for k, v in d.items()]


@pytest.fixture
def analyse_with():
    from mocompile.pipeline import analyse

    def run(sets: dict | None = None, path: Path = RULE_BASE):
        return analyse(str(path), overrides(sets or {}))
    return run


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real command line in a subprocess (exit codes, stdout, stderr)."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT / "compiler") + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("MOCOMPILE_DEBUG", None)
    if env:
        e.update(env)
    return subprocess.run([sys.executable, "-m", "mocompile", *args], cwd=cwd or ROOT, env=e,
                          capture_output=True, text=True, timeout=120)


def tune_project(tmp_path: Path) -> Path:
    """A project (pyproject.toml, recipes/, clusters/) holding the mid TE recipe and the lent 4x H100 profile it
    names: the measure loop's tests edit the profile and the recipe, never the repository's."""
    import shutil

    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "recipes").mkdir()
    (tmp_path / "clusters").mkdir()
    shutil.copy(ROOT / "clusters" / "lent-h100x4.yaml", tmp_path / "clusters")
    text = (ROOT / "recipes" / "bench" / "bench-te-mid-auto.yaml").read_text().replace("../../clusters", "../clusters")
    (tmp_path / "recipes" / "te.yaml").write_text(text)
    return tmp_path / "recipes" / "te.yaml"
