"""Print each fuzz strategy's numbers (inputs, inputs/s, slowest input) after the run, without -s."""

from __future__ import annotations

from .harness import STATS


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # noqa: ARG001
    if STATS:
        terminalreporter.section("mocompile fuzz")
        for stat in STATS.values():
            terminalreporter.write_line(stat.line())
