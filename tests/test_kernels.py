"""The kernel probe: the shapes train.py measures, the fits over what it measures, and what the step-time
model takes from a cluster profile's `kernels` entry (mocompile.kernels, probe.kernel_section)."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT, run_cli
from mocompile import kernels, probe, steptime
from mocompile.steptime import Batch, Candidate
from test_probe_tune import kernel_result
from test_steptime import EASY, TOY, hw


def _settings(**over):
    s = {"tensor_model_parallel_size": 1, "context_parallel_size": 1, "expert_model_parallel_size": 8,
         "expert_tensor_parallel_size": 1, "seq_length": 4096, "micro_batch_size": 1}
    s.update(over)
    return s


QWEN30 = {"hidden_size": 2048, "num_attention_heads": 32, "num_query_groups": 4, "kv_channels": 128,
          "num_moe_experts": 128, "moe_router_topk": 8, "moe_ffn_hidden_size": 768, "gated_linear_unit": True}


def test_the_expert_gemms_get_the_rows_one_micro_batch_routes_to_each_local_expert():
    """Qwen3-30B-A3B at EP 8, seq 4096: 4096 tokens x top-8 spread over 128 experts, 16 of them local:
    4096 * 8 * 8 / 128 = 2048 rows per expert (the step-time model's rows_expert); fc1 is gated (2 x 768)."""
    shapes = {g["what"]: (g["m"], g["n"], g["k"]) for g in kernels.gemm_shapes(QWEN30, _settings())}
    assert shapes["reference"] == (8192, 8192, 8192)
    assert shapes["expert fc1"] == (2048, 1536, 2048) and shapes["expert fc2"] == (2048, 2048, 768)
    assert shapes["attention qkv"] == (4096, (32 + 2 * 4) * 128, 2048)


def test_tp_splits_the_qkv_width_and_the_expert_rows_and_etp_the_expert_width():
    shapes = {g["what"]: (g["m"], g["n"], g["k"]) for g in
              kernels.gemm_shapes(QWEN30, _settings(tensor_model_parallel_size=2, expert_tensor_parallel_size=2,
                                                    micro_batch_size=2))}
    assert shapes["attention qkv"] == (8192, 40 * 128 // 2, 2048)
    assert shapes["expert fc1"] == (2048, 768, 2048)  # 8192 / 2 (SP) * 8 * 8 / 128; 2 x 768 / ETP 2


def test_rows_are_capped_and_never_zero():
    wide = kernels.gemm_shapes(QWEN30, _settings(seq_length=131072, micro_batch_size=4))
    assert max(g["m"] for g in wide) == kernels.MAX_ROWS
    few = kernels.gemm_shapes(dict(QWEN30, num_moe_experts=100000), _settings(seq_length=128))
    assert min(g["m"] for g in few) == 1


def test_all_to_all_fit_recovers_bandwidth_and_latency_of_a_worked_example():
    """4 ranks; a rank sends 3/4 of its buffer to the others; 30 us + those bytes at 300 GB/s."""
    points = [{"bytes": b, "us": 30.0 + b * 0.75 / 300e9 * 1e6} for b in kernels.A2A_BYTES]
    fit = kernels.fit_a2a(points, 4)
    assert fit["gbps"] == pytest.approx(300.0, abs=0.1) and fit["ranks"] == 4
    assert fit["latency_us"] == pytest.approx(30.0 + 2 ** 16 * 0.75 / 300e9 * 1e6, abs=0.1)  # the smallest message


def test_all_to_all_fit_needs_two_large_messages_and_a_positive_slope():
    assert kernels.fit_a2a([{"bytes": 2 ** 16, "us": 20.0}, {"bytes": 2 ** 22, "us": 40.0}], 2) is None
    flat = [{"bytes": b, "us": 50.0} for b in kernels.A2A_BYTES]
    assert kernels.fit_a2a(flat, 2) is None
    assert kernels.fit_a2a([{"bytes": 2 ** 24, "us": 10.0}, {"bytes": 2 ** 26, "us": 40.0}], 1) is None


def test_scales_are_ratios_to_the_reference_and_only_for_its_architecture():
    c = steptime.constants()
    k = probe.kernel_section(kernel_result(gemm_share=c["probe_reference_gemm_share"],
                                           a2a_gbps=c["probe_reference_a2a_share"] * 450), "h100")
    assert (k["gemm_scale"], k["a2a_scale"]) == (1.0, 1.0)       # a reference-healthy Hopper node: no change
    assert k["a2a_latency_us"] == k["all_to_all"]["nccl_intra_node"]["latency_us"]
    b = probe.kernel_section(kernel_result(), "b200")
    assert b["gemm_scale"] is None and b["a2a_scale"] is None and "blackwell" in b["why"]
    assert b["gemm_share"] is not None                                # recorded all the same
    absent = probe.kernel_section(None, "h100", "rc 1, see kernels.log")
    assert absent["measured"] is False and absent["why"] == "rc 1, see kernels.log"
    assert probe.not_measured(absent)[:2] == ["gemm_efficiency", "all_to_all_inside_nodes"]
    broken = probe.kernel_section(kernel_result(gemm_share=5.0), "h100")
    assert broken["gemm_scale"] == kernels.SCALE_BOUNDS[1]           # clamped: a broken timer, not a faster GPU


def test_the_model_runs_gemms_at_gemm_scale_and_nccl_all_to_all_at_a2a_scale():
    batch = Batch(seq_length=1024, micro_batch_size=1, global_batch_size=8)
    cand = Candidate(ep=8)
    base = steptime.StepModel(TOY, hw(), batch, 8, EASY)._compute_terms(1, 1, 8)
    slow = steptime.StepModel(TOY, hw(gemm_scale=0.5), batch, 8, EASY)._compute_terms(1, 1, 8)
    # (per_rank, attention GEMMs, attention core, experts, shared, dense, elementwise, logits, ...)
    for i in (1, 3, 7):  # the tensor-core GEMMs take twice as long
        assert slow[i] == pytest.approx(2 * base[i])
    assert slow[6] == base[6]  # elementwise work is HBM-bound: a slower GEMM does not change it
    assert steptime.estimate(TOY, hw(gemm_scale=0.5), cand, batch, 8, EASY).step_s > \
        steptime.estimate(TOY, hw(), cand, batch, 8, EASY).step_s
    t = steptime.a2a_seconds(TOY, hw(), cand, 4096, EASY, 1.0)
    t_half = steptime.a2a_seconds(TOY, hw(a2a_scale=0.5, a2a_latency_s=1e-4), cand, 4096, EASY, 1.0)
    assert t_half == pytest.approx(2 * t + 1e-4)
    flex = Candidate(ep=8, dispatcher="deepep")  # the flex kernels were not measured: unchanged
    assert steptime.a2a_seconds(TOY, hw(a2a_scale=0.5), flex, 4096, EASY, 1.0) == \
        steptime.a2a_seconds(TOY, hw(), flex, 4096, EASY, 1.0)


def test_a_profile_with_kernel_scales_slows_the_plan_it_measures_and_the_lock_says_so(tmp_path):
    recipe = ROOT / "recipes" / "bench" / "bench-te-mid-auto.yaml"
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "r.yaml").write_text(recipe.read_text())
    pins = ["--set", "parallelism.ep=4", "--set", "moe.overlap=false", "--set", "training.micro_batch_size=2"]
    times = {}
    for name, kern in (("ref", "{gemm_scale: 1.0, a2a_scale: 1.0, a2a_latency_us: null}"),
                       ("slow", "{gemm_scale: 0.5, a2a_scale: 0.5, a2a_latency_us: 200.0}")):
        (tmp_path / f"{name}.yaml").write_text(f"schema: 1\nname: {name}\nhost_factor: 1.0\nkernels: {kern}\n")
        res = run_cli("explain", str(tmp_path / "r.yaml"), *pins, "--set", f"hardware.cluster={name}.yaml",
                      "--format", "json")
        assert res.returncode == 0, res.stderr
        times[name] = json.loads(res.stdout)["estimate"]["chosen"]["terms_s"]
    # the GEMMs (most of the compute term; elementwise work is not slowed) and the all-to-all (twice the time,
    # plus the measured latency per call instead of the default)
    assert 1.6 * times["ref"]["compute"] < times["slow"]["compute"] < 2 * times["ref"]["compute"]
    assert times["slow"]["a2a_total"] > 2 * times["ref"]["a2a_total"]


@pytest.mark.parametrize("bad,message", [
    ("{gemm_scale: 5}", "`kernels.gemm_scale` must be null or a number from 0.1 to 2"),
    ("{a2a_scale: yes}", "`kernels.a2a_scale` must be null or a number"),
    ("[1, 2]", "`kernels` must be a mapping"),
])
def test_a_broken_kernels_entry_is_a_positioned_error(tmp_path, bad, message):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "r.yaml").write_text((ROOT / "recipes" / "bench" / "bench-te-mid-auto.yaml").read_text())
    (tmp_path / "c.yaml").write_text(f"schema: 1\nname: c\nkernels: {bad}\n")
    res = run_cli("lint", str(tmp_path / "r.yaml"), "--set", "hardware.cluster=c.yaml")
    assert res.returncode != 0 and message in res.stdout + res.stderr
    assert "c.yaml:3:" in res.stdout + res.stderr


def test_generated_train_py_measures_this_plans_shapes_under_mocompile_probe_kernels():
    from mocompile.emit.python_recipe import KERNEL_SETTINGS
    from mocompile.pipeline import analyse

    recipe = ROOT / "recipes" / "bench" / "bench-te-mid-auto.yaml"
    plan = analyse(str(recipe), []).plan
    expected = [(g["what"], g["m"], g["n"], g["k"])
                for g in kernels.gemm_shapes(plan.model, {f: plan[f] for f in KERNEL_SETTINGS})]
    train = ROOT / "generated" / "bench-te-mid-auto" / "train.py"
    text = train.read_text()
    assert repr(expected) in text and 'os.environ.get("MOCOMPILE_PROBE_KERNELS")' in text
    assert repr(list(kernels.A2A_BYTES)) in text
    compile(text, str(train), "exec")  # literals only: valid Python (no __pycache__ written into generated/)
