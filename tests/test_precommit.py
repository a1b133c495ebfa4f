"""pre-commit, for real: the `pre-commit` from PyPI runs this repository's .pre-commit-hooks.yaml in
a temporary git repository, with this repository (its working tree, committed into a temporary
hook-source repository) as the hook source. pre-commit builds its own virtualenv and pip-installs
mocompile from that source, exactly as for users."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

pytestmark = pytest.mark.skipif(importlib.util.find_spec("pre_commit") is None,
                                reason="pre-commit not installed (tests/ecosystem/setup.sh installs it)")

GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.com", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=dict(os.environ, **GIT_ENV), check=True,
                          capture_output=True, text=True).stdout


def _hook_source(dest: Path) -> tuple[Path, str]:
    """This repository's working tree (tracked and untracked, not ignored files) as a git repo."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_symlink():  # e.g. compiler/mocompile/schemas -> ../../schemas
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.readlink(src), dest / rel)
        elif src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "hook source")
    return dest, git(dest, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A user's repository: one recipe, its generated output, and a .pre-commit-config.yaml naming
    both hooks from the hook source. Returns (path, env for pre-commit)."""
    base = tmp_path_factory.mktemp("precommit")
    source, rev = _hook_source(base / "hook-source")
    proj = base / "user"
    (proj / "recipes").mkdir(parents=True)
    shutil.copy(ROOT / "recipes" / "tiny-moe-h100x2.yaml", proj / "recipes" / "tiny.yaml")
    (proj / "schemas").mkdir()
    shutil.copy(ROOT / "schemas" / "intent.schema.json", proj / "schemas")
    (proj / "pyproject.toml").write_text('[tool.mocompile]\nrecipes = ["recipes/*.yaml"]\noutput = "generated"\n')
    (proj / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {source}\n    rev: {rev}\n    hooks:\n      - id: mocompile-lint\n"
        "      - id: mocompile-check\n")
    proc = run_cli("compile", "recipes/tiny.yaml", cwd=proj)
    assert proc.returncode == 0, proc.stderr
    git(proj, "init", "-q", "-b", "main")
    git(proj, "add", "-A")
    git(proj, "commit", "-q", "-m", "init")
    env = dict(os.environ, **GIT_ENV, PRE_COMMIT_HOME=str(base / "pre-commit-home"), NO_COLOR="1")
    env.pop("PYTHONPATH", None)  # the hook must run the mocompile that pre-commit installed
    env.pop("VIRTUAL_ENV", None)
    install = subprocess.run([sys.executable, "-m", "pre_commit", "install-hooks"], cwd=proj, env=env,
                             capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    return proj, env


def pre_commit(project, *args: str) -> subprocess.CompletedProcess:
    proj, env = project
    return subprocess.run([sys.executable, "-m", "pre_commit", "run", "--color", "never", *args], cwd=proj,
                          env=env, capture_output=True, text=True, timeout=300)


def test_hooks_manifest_is_what_pre_commit_expects():
    from pre_commit.clientlib import load_manifest
    hooks = {h["id"]: h for h in load_manifest(str(ROOT / ".pre-commit-hooks.yaml"))}
    assert set(hooks) == {"mocompile-lint", "mocompile-check"}
    assert hooks["mocompile-lint"]["pass_filenames"] is True and "yaml" in hooks["mocompile-lint"]["types"]
    check = hooks["mocompile-check"]
    assert check["pass_filenames"] is False and check["require_serial"] is True


def test_good_recipe_passes(project):
    proc = pre_commit(project, "--all-files")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "mocompile lint" in proc.stdout and "mocompile check" in proc.stdout
    assert "Failed" not in proc.stdout


def test_broken_recipe_fails_with_the_diagnostic(project):
    proj, _ = project
    bad = proj / "recipes" / "bad.yaml"
    bad.write_text((proj / "recipes" / "tiny.yaml").read_text() + "moe: {overlap: true}\nparallelism: {ep: 1}\n")
    try:
        git(proj, "add", "recipes/bad.yaml")
        proc = pre_commit(project, "mocompile-lint")
        assert proc.returncode == 1, proc.stdout
        assert "mocompile lint" in proc.stdout and "Failed" in proc.stdout
        assert "recipes/bad.yaml:" in proc.stdout and "[OVL001]" in proc.stdout, proc.stdout
        assert "hint:" in proc.stdout
    finally:
        git(proj, "rm", "-q", "--cached", "recipes/bad.yaml")
        bad.unlink()


def test_stale_generated_file_fails(project):
    proj, _ = project
    recipe = proj / "recipes" / "tiny.yaml"
    original = recipe.read_text()
    recipe.write_text(original.replace("train_iters: 30", "train_iters: 31"))
    try:
        git(proj, "add", "recipes/tiny.yaml")
        lint = pre_commit(project, "mocompile-lint")
        assert lint.returncode == 0, lint.stdout  # the recipe itself is fine ...
        proc = pre_commit(project, "mocompile-check")
        assert proc.returncode == 1, proc.stdout  # ... but generated/ was not recompiled
        assert "stale" in proc.stdout and "mocompile compile recipes/tiny.yaml" in proc.stdout
        hand = proj / "generated" / "tiny" / "torchrun.sh"
        recipe.write_text(original)
        git(proj, "add", "recipes/tiny.yaml")
        hand.write_text(hand.read_text().replace("29500", "29501"))
        git(proj, "add", "generated/tiny/torchrun.sh")  # pre-commit checks what is staged
        proc = pre_commit(project, "mocompile-check")
        assert proc.returncode == 1 and "edited" in proc.stdout, proc.stdout
    finally:
        recipe.write_text(original)
        git(proj, "reset", "-q")
        git(proj, "checkout", "-q", "--", ".")
    assert pre_commit(project, "--all-files").returncode == 0
