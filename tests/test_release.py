"""The release bookkeeping: one version source, a dated CHANGELOG section for it, a licence."""

from __future__ import annotations

import re

from conftest import ROOT
from mocompile import __version__


def test_the_version_lives_only_in_the_package():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M)
    assert not re.search(r'^version\s*=\s*"', pyproject, re.M)  # no literal second copy to drift
    assert 'version = {attr = "mocompile.__version__"}' in pyproject


def test_the_newest_dated_changelog_section_is_this_version():
    text = (ROOT / "CHANGELOG.md").read_text()
    dated = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$", text, re.M)
    assert dated and dated[0][0] == __version__
    assert text.index("## [Unreleased]") < text.index(f"## [{__version__}]")  # new work goes above it


def test_the_licence_is_the_apache_2_0_text_the_metadata_names():
    assert "Apache License\n                           Version 2.0, January 2004" in (ROOT / "LICENSE").read_text()
    assert 'license = {text = "Apache-2.0"}' in (ROOT / "pyproject.toml").read_text()


def test_the_readmes_pre_commit_snippet_names_this_release_and_the_hooks_it_ships():
    from ruamel.yaml import YAML
    readme = (ROOT / "README.md").read_text()
    block = readme.split("```yaml\nrepos:", 1)[1].split("```", 1)[0]
    config = YAML(typ="safe").load("repos:" + block)
    repo = config["repos"][0]
    hooks = {h["id"] for h in YAML(typ="safe").load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert repo["rev"] == f"v{__version__}" and {h["id"] for h in repo["hooks"]} == hooks
