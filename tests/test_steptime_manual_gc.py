"""Bridge's scheduled garbage collection in the step model: with ``train.manual_gc`` on, Bridge runs one full
``gc.collect()`` every ``manual_gc_interval`` iterations (training/train.py ``maybe_run_manual_gc``), inside the
interval timer its step time divides, so a run's mean step pays the collection divided by the interval. The
collection's time is measured in a real Bridge training process (benchmarks/results/gcprobe-h200x2-2026-11-28),
not fitted."""

from __future__ import annotations

import json
import statistics
import sys

import pytest
from conftest import ROOT
from mocompile import steptime
from mocompile.catalogue import _defaults, gpus
from mocompile.resolve import search, tuning
from mocompile.steptime import Batch, Candidate

sys.path.insert(0, str(ROOT / "benchmarks"))
import calibrate  # noqa: E402

PROBE = ROOT / "benchmarks" / "results" / "gcprobe-h200x2-2026-11-28" / "runs"
TOY = _defaults({"id": "toy", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 16, "num_query_groups": 4,
                 "kv_channels": 64, "num_moe_experts": 16, "moe_router_topk": 4, "moe_ffn_hidden_size": 512,
                 "vocab_size": 1000})
CAND = Candidate(tp=1, pp=1, vpp=1, ep=8, etp=1, cp=1, dispatcher="alltoall", overlap=False)


def est(interval: int) -> steptime.StepEstimate:
    hw = dict(gpus()["h100"], id="h100", gpus_per_node=8, world_size=8)
    return steptime.StepModel(TOY, hw, Batch(2048, 1, 32, force_balance=True, manual_gc_interval=interval), 8).estimate(CAND)


def probed_collections() -> list[float]:
    out = []
    for path in sorted(PROBE.glob("gcprobe-r*-gc-rank*.json")):
        out += [p["collect_s"] for p in json.loads(path.read_text())["probes"]]
    return out


def test_the_collection_time_is_the_median_of_the_probed_collections():
    """12 timed collections (3 runs x 2 ranks x iterations 10 and 15) over about a million tracked objects."""
    seen = probed_collections()
    assert len(seen) == 12
    assert steptime.facts()["manual_gc_collect_s"] == pytest.approx(statistics.median(seen), abs=0.005)
    objects = [p["tracked_objects"] for path in PROBE.glob("gcprobe-r*-gc-rank*.json")
               for p in json.loads(path.read_text())["probes"]]
    assert min(objects) > 1_000_000  # a Bridge process, not a toy heap


def test_each_step_pays_the_collection_divided_by_the_interval():
    gc_s = steptime.facts()["manual_gc_collect_s"]
    assert est(5).step_s - est(0).step_s == pytest.approx(gc_s / 5, rel=1e-9)
    assert est(100).step_s - est(0).step_s == pytest.approx(gc_s / 100, rel=1e-9)
    assert est(5).terms["manual_gc"] == pytest.approx(gc_s / 5)


@pytest.mark.parametrize("interval", [0, -1])
def test_no_schedule_adds_nothing(interval):
    """Interval 0 is Bridge's 'no periodic collection' (and manual GC off): Python's own collector runs young
    generations, which step_overhead_s holds."""
    assert steptime.manual_gc_seconds(interval) == 0.0
    assert est(interval).terms["manual_gc"] == 0.0


def test_one_iteration_interval_pays_a_whole_collection_every_step():
    assert steptime.manual_gc_seconds(1) == steptime.facts()["manual_gc_collect_s"]


def test_the_launch_factor_of_a_slow_host_does_not_scale_it():
    """A full collection is pure CPU work with no CUDA call: the lent hosts' launch factor is not applied."""
    hw = dict(gpus()["h100"], id="h100", gpus_per_node=8, world_size=8, host_factor=5.0)
    batch = Batch(2048, 1, 32, force_balance=True, manual_gc_interval=5)
    e = steptime.StepModel(TOY, hw, batch, 8).estimate(CAND)
    assert e.terms["manual_gc"] == pytest.approx(steptime.facts()["manual_gc_collect_s"] / 5)


def test_the_planner_scores_its_plans_with_the_interval_it_emits(tmp_path):
    """throughput: manual GC every 100 steps (tuning.host_and_fusion); bring-up: Megatron's default, no schedule."""
    from mocompile.load import load
    from mocompile.resolve import context
    from mocompile.schema import validate

    for goal, interval in (("throughput", 100), ("bring-up", 0)):
        path = tmp_path / f"{goal}.yaml"
        path.write_text(f"schema: 1\nmodel: qwen3-30b-a3b\nhardware: {{gpu: h100, nodes: 2}}\ngoal: {goal}\n")
        doc = load(str(path), None)
        ctx = context(validate(doc), doc)
        tuning.host_and_fusion(ctx)
        assert search.Scorer(ctx).batch.manual_gc_interval == interval


def test_calibration_rows_carry_the_interval_their_step_time_saw():
    rows = {r["id"]: r for r in calibrate.load_rows()}
    # Moonlight's 8-GPU pretraining recipe collects every 5 iterations (recipes/moonlight/h100/moonlight_16b.py)
    assert calibrate.gc_interval(rows["moonlight-h100x8-rc-none"]) == 5
    assert calibrate.gc_interval(rows["moonlight-h100x16-pretrain-hep"]) == 5
    # Bridge's performance scripts: every 100 (scripts/performance/utils/overrides.py)
    assert calibrate.gc_interval(rows["q30-h100x16-natural"]) == 100
    # this project's harness times train_step alone: the collection after it is outside the measured step
    assert calibrate.gc_interval(rows["te-h100x4-ep4-a2a-off"]) == 0
    assert calibrate.setup(rows["moonlight-h100x8-rc-none"])[3].manual_gc_interval == 5


def test_the_harness_step_time_leaves_the_collection_out():
    """Why the lent rows get 0: the probed runs collected at iterations 10 and 15 (0.49-0.61 s each), yet no step
    after the warm-up is even 250 ms above its run's median."""
    runs = sorted(PROBE.glob("gcprobe-r*.jsonl"))
    assert len(runs) == 3
    for path in runs:
        steps = [r["step_ms"] for r in map(json.loads, path.read_text().splitlines()) if r["iteration"] > 5]
        assert len(steps) == 15
        assert max(steps) < statistics.median(steps) + 250.0
