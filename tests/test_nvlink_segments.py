"""Multi-node NVLink (GB200/GB300 NVL72) jobs larger than one rack: only a rack's trays share NVLink.

A rack joins 72 GPUs (18 trays of 4). Megatron-Bridge's performance launcher submits 4-GPU trays with Slurm's
``--segment``: the job's node count if one rack holds it, else its largest divisor a rack holds
(``scripts/performance/utils/executors.py``), so every segment of consecutive nodes sits inside one rack. Megatron-Core
gives an expert group ETP x EP consecutive ranks starting at a multiple of its size, so a group stays on NVLink
exactly when its size divides the segment's GPUs (or is a multiple of them). The planner sees the segment as the NVLink
domain, the step-time model costs a straddling group's network share, HybridEP is refused where groups straddle
(DSP018), and the Slurm launcher asks for the segment."""

from __future__ import annotations

import math

import pytest
from conftest import ROOT
from mocompile import steptime
from mocompile.catalogue import _defaults, gpus, models, nvlink_segment, resolve_hardware
from mocompile.pipeline import analyse


@pytest.mark.parametrize("nodes,segment", [
    (1, 1), (16, 16), (18, 18),    # one rack holds the job: one segment of all of it
    (19, 1),                       # a prime tray count past one rack: no two trays share NVLink
    (24, 12), (36, 18), (64, 16), (72, 18), (96, 16), (100, 10),
])
def test_the_segment_is_the_node_count_or_its_largest_divisor_one_rack_holds(nodes, segment):
    assert nvlink_segment(nodes, 4, 72) == segment   # NVL72 trays of 4: a rack holds 18
    assert segment <= 18 and nodes % segment == 0
    if nodes > 18:  # largest: no divisor between it and a rack
        assert all(nodes % d for d in range(segment + 1, 19))


@pytest.mark.parametrize("gpu,nodes,domain", [("gb200", 16, 64), ("gb200", 36, 72), ("gb200", 64, 64),
                                              ("gb300", 24, 48), ("gb200", 19, 4), ("h100", 128, 8)])
def test_the_nvlink_domain_is_the_segment_not_the_rack(gpu, nodes, domain):
    hw = resolve_hardware({"hardware": {"gpu": gpu, "nodes": nodes}})
    assert hw["nvlink_domain_effective"] == domain
    if gpus()[gpu].get("mnnvl"):
        assert hw["rack_gpus"] == 72 and hw["segment_nodes"] * hw["gpus_per_node"] == domain
    # the step model's width is the same domain, for resolved hardware and for a bare catalogue entry alike
    bare = dict(gpus()[gpu], id=gpu, world_size=nodes * gpus()[gpu]["gpus_per_node"])
    assert steptime.nvlink_width(hw) == steptime.nvlink_width(bare) == domain


def test_an_expert_group_that_straddles_two_segments_pays_the_network():
    """EP 16 on 36 trays (segments of 72 GPUs): the group of ranks 64-79 has 8 ranks in each rack, so its
    all-to-all crosses the network like EP 16 over two 8-GPU shares; EP 8 and EP 24 (divisors of 72) stay on NVLink."""
    m = _defaults({"id": "deepseek-v3", **models()["deepseek-v3"]})
    hw = resolve_hardware({"hardware": {"gpu": "gb200", "nodes": 36}})
    c = steptime.constants()

    def one(ep: int) -> float:
        cand = steptime.Candidate(ep=ep, dispatcher="alltoall")
        return steptime.a2a_seconds(m, hw, cand, 4096.0, c, 1.0)

    split = dict(hw, nvlink_domain=8, segment_nodes=2)  # the same group over domains of 8: what straddling means
    assert math.gcd(16, 72) == 8
    assert one(16) == pytest.approx(steptime.a2a_seconds(m, split, steptime.Candidate(ep=16, dispatcher="alltoall"),
                                                         4096.0, c, 1.0))
    inside = dict(hw, nvlink_domain=64)
    assert one(16) > steptime.a2a_seconds(m, inside, steptime.Candidate(ep=16, dispatcher="alltoall"), 4096.0, c, 1.0)
    for ep in (8, 24):  # divisors of 72: every group inside one rack, no network bytes
        assert one(ep) == pytest.approx(steptime.a2a_seconds(m, dict(hw, nvlink_domain=ep * 3), steptime.Candidate(
            ep=ep, dispatcher="alltoall"), 4096.0, c, 1.0))


@pytest.mark.parametrize("nodes", [24, 36, 72])
def test_no_planned_hybridep_group_straddles_a_segment(tmp_path, nodes):
    path = tmp_path / "r.yaml"
    path.write_text(f"schema: 1\nname: r\nmodel: deepseek-v3\nhardware: {{gpu: gb200, nodes: {nodes}}}\n"
                    "goal: throughput\n")
    plan = analyse(str(path)).plan
    assert plan is not None
    group = plan["expert_model_parallel_size"] * plan["expert_tensor_parallel_size"]
    domain = plan["nvlink_domain"]
    if plan["moe_flex_dispatcher_backend"] == "hybridep" and plan["moe_token_dispatcher_type"] == "flex":
        assert domain % group == 0 or group % domain == 0, (nodes, group, domain)
        assert plan["hybridep_ranks_per_domain"] == min(domain, group)


def test_the_slurm_launcher_asks_for_the_segment_on_nvl72_and_nothing_on_8_gpu_nodes():
    from mocompile.commands import compile_recipe

    gb = compile_recipe(str(ROOT / "recipes" / "deepseek-v3-gb200-hybridep.yaml")).files["slurm.sbatch"]
    assert "#SBATCH --segment=16\n" in gb          # 64 trays: 4 segments of 16 (64 GPUs each)
    assert "every 16 consecutive nodes (64 GPUs)" in gb
    h100 = compile_recipe(str(ROOT / "recipes" / "qwen3-235b-a22b-h100-alltoall.yaml")).files["slurm.sbatch"]
    assert "--segment" not in h100
