"""The memory estimate against the measured peaks of the 4x H100 Transformer Engine grid (issue 11).

benchmarks/results/te-h100x4-2026-11-26/grid.json holds torch.cuda.max_memory_allocated of every rank of
every run (max over ranks and runs per plan); the committed locks hold the estimate each plan compiles to.
Acceptance (issue 10/11): within +-10 % of every measured peak allocated.
"""

from __future__ import annotations

import json

import pytest

from conftest import ROOT
from mocompile import memory

GRID = ROOT / "benchmarks" / "results" / "te-h100x4-2026-11-26" / "grid.json"
PINNED = ["bench-te-mid-ep4-off", "bench-te-mid-ep4-off-moeact", "bench-te-mid-ep4-on",
          "bench-te-mid-ep4-on-graphs", "bench-te-mid-ep4-on-wgrad"]


def _measured() -> dict[str, float]:
    doc = json.loads(GRID.read_text())
    return {n: v["summary"]["peak_allocated_gib"] for n, v in doc["variants"].items() if v["runs"]}


def _lock(name: str) -> dict:
    return json.loads((ROOT / "generated" / name / "mocompile.lock.json").read_text())


@pytest.mark.parametrize("name", PINNED)
def test_te_grid_peak_allocated_is_estimated_within_ten_percent(name):
    est = _lock(name)["memory"]["estimate_gib"]
    meas = _measured()[name]
    assert abs(est / meas - 1) <= 0.10, (name, est, meas)


def test_te_scoped_graph_buffers_count_in_peak_allocated():
    """moe_router + moe_preprocess graphs with EP overlap measured +2.0 GiB allocated (39.24 vs 37.25 GiB):
    static inputs/outputs and their gradients, per layer and per micro-batch in flight (2 under overlap),
    4 hidden-sized bf16 tensors per token: 4 x 16 layers x 2 x 4096 tokens x 2048 x 2 B = 2.0 GiB."""
    graphs = _lock("bench-te-mid-ep4-on-graphs")["memory"]
    plain = _lock("bench-te-mid-ep4-on")["memory"]
    assert graphs["graph_buffers_gib"] == pytest.approx(2.0, abs=0.01)
    assert graphs["estimate_gib"] - plain["estimate_gib"] == pytest.approx(2.0, abs=0.02)
    meas = _measured()
    assert meas["bench-te-mid-ep4-on-graphs"] - meas["bench-te-mid-ep4-on"] == pytest.approx(2.0, abs=0.1)


def test_the_te_activation_factor_is_fitted_on_measured_te_peaks():
    """Was 0.8 from one published peak of unknown kind; the six measured TE peaks put it near 1."""
    assert 0.9 <= memory.TE_ACTIVATION_FACTOR <= 1.05
