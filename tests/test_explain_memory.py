"""`explain`'s memory line is a sum a reader can check: the allocator's peak term by term (CUDA-graph and
unfused-wgrad buffers included), then dispatcher buffers and NCCL/context, adding up to the total."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT, recipe_files, run_cli
from mocompile.pipeline import analyse

TERMS = ("weights_and_optimizer_gib", "activations_gib", "logits_gib", "graph_buffers_gib", "unfused_wgrad_gib",
         "optimizer_step_gib")


@pytest.mark.parametrize("recipe", recipe_files())
def test_the_memory_terms_add_up_to_the_peak_and_the_total(recipe):
    m = analyse(str(ROOT / recipe)).plan.memory
    assert abs(sum(m[t] for t in TERMS) - m["estimate_gib"]) <= 0.03, m  # each term rounded to 0.01
    assert abs(m["estimate_gib"] + m["dispatcher_buffers_gib"] + m["nccl_context_gib"] - m["total_gib"]) <= 0.02, m
    assert min(m[t] for t in TERMS) >= 0


def test_explain_prints_every_term_and_the_numbers_add_up():
    recipe = "recipes/qwen3-30b-a3b-h100x16-hybridep.yaml"  # CUDA graphs: 6 GiB of buffers the line once left out
    line = next(ln for ln in run_cli("explain", recipe).stdout.splitlines() if ln.startswith("memory estimate:"))
    numbers = [float(x) for x in re.findall(r"(?<![\w.])(\d+(?:\.\d+)?)(?![\w.])", line.split("=", 1)[1])]
    peak, *parts, dispatcher, nccl = numbers
    total = float(re.search(r"estimate: ([\d.]+) GiB", line).group(1))
    assert "CUDA-graph buffers 6.0" in line
    assert abs(sum(parts) - peak) <= 0.03 and abs(peak + dispatcher + nccl - total) <= 0.02
