"""The fuzz harness's speed bound bites: an input over ``SLOW_S`` fails unless the reference intent, compiled at the
same moment, has slowed down by as much since the session began (``machine_factor``)."""

from __future__ import annotations

import pytest

from . import harness
from .harness import RECIPES, Workdir, compile_text


def test_a_slow_input_fails_on_a_process_as_fast_as_at_the_start_and_passes_on_one_that_slowed_as_much(
        tmp_path, monkeypatch):
    w = Workdir(tmp_path)
    text = (RECIPES / "tiny-moe-h100x2.yaml").read_bytes()
    path = w.path_for("tiny-moe-h100x2.yaml")
    monkeypatch.setattr(harness, "SLOW_S", 1e-6)  # every compile is over this bound
    monkeypatch.setattr(harness, "HEAVY_MARGIN", 0.0)  # and the reference's own cost gives it no room
    monkeypatch.setattr(harness, "_BASELINE", [1e9])  # the reference has not slowed down: factor 1
    with pytest.raises(AssertionError, match="the reference intent's slow-down"):
        compile_text(text, path)
    monkeypatch.setattr(harness, "_BASELINE", [1e-12])  # the reference is now far slower than at the start
    assert compile_text(text, path) == "plan"
    monkeypatch.setattr(harness, "_BASELINE", [])  # no baseline measured: nothing to scale by
    assert harness.machine_factor(path.parent) == 1.0


def test_ci_allows_an_input_half_again_the_heaviest_reference_search_and_no_more(monkeypatch):
    """CI's bound is the larger of SLOW_S and 1.5x the reference's first compile (the heaviest search the fuzzers draw),
    so a VM on which that search itself takes 1.9 s does not fail it by chance; a sized run keeps SLOW_S."""
    monkeypatch.delenv("MOCOMPILE_FUZZ_EXAMPLES", raising=False)
    monkeypatch.setattr(harness, "SLOW_S", 2.0)
    monkeypatch.setattr(harness, "_BASELINE", [1.9])
    assert harness.limit_s() == pytest.approx(2.85)
    monkeypatch.setattr(harness, "_BASELINE", [1.0])  # a fast machine: SLOW_S binds
    assert harness.limit_s() == 2.0
    monkeypatch.setattr(harness, "_BASELINE", [])
    assert harness.limit_s() == 2.0
    monkeypatch.setenv("MOCOMPILE_FUZZ_EXAMPLES", "100000")  # the nightly holds the bound
    monkeypatch.setattr(harness, "_BASELINE", [1.9])
    assert harness.limit_s() == 2.0
