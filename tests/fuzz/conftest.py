"""Print each fuzz strategy's numbers (inputs, inputs/s, slowest input) after the run, without -s."""

from __future__ import annotations

from .harness import STATS


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if STATS:
        terminalreporter.section("mocompile fuzz")
        for stat in STATS.values():
            terminalreporter.write_line(stat.line())


def pytest_collection_modifyitems(config, items):  # noqa: ARG001
    """A sized (nightly) run draws far more inputs than CI's: the per-test limit (pyproject.toml, 300 s)
    would stop it mid-way, so sized runs get six hours per test. Each input keeps its own bound
    (harness.SLOW_S), and CI's run keeps the 300 s limit."""
    import os

    import pytest

    if "MOCOMPILE_FUZZ_EXAMPLES" in os.environ:
        for item in items:
            item.add_marker(pytest.mark.timeout(6 * 3600))
