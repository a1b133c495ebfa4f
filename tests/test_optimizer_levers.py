"""Adam's memory levers (training.optimizer_state, training.optimizer_offload): the bytes each keeps on the
GPU, what the offload costs per step, the ladder `fit` and `throughput` climb when nothing fits, what MEM001
says when the recipe closes it, and what train.py emits."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from mocompile import optimizer_state, steptime
from mocompile.steptime import Candidate
from test_steptime import TOY, hw


@pytest.mark.parametrize("state,offload,fp8_master,rest,peak", [
    ("fp32", 0.0, False, 12.0, 12.0),             # fp32 master 4 + moments 8
    ("fp32-remainders", 0.0, False, 10.0, 12.0),  # 2 + 8 at rest; at the step as fp32 (measured on 2x H200): +2
    ("bf16-moments", 0.0, False, 6.0, 16.0),      # 2 + 2 + 2 at rest; + 2 as above + 8: TE FusedAdam's fp32 copies
    ("fp32-remainders", 0.0, True, 12.0, 12.0),   # FP8 (not delayed): Megatron-Core keeps an fp32 master
    ("bf16-moments", 0.0, True, 8.0, 16.0),       # 4 + 2 + 2, + 8
    # offload on the precision-aware path: the offloaded share keeps nothing on the GPU (no fp32 master shard,
    # host-side fp32 copy and moments); the GPU share keeps its fp32 copy and moments, 12 B (measured: 12.55 GiB
    # peak against 20.10 with the fp32 master kept, benchmarks/results/levers-2026-11-27/round3)
    ("fp32", 1.0, False, 0.0, 0.0),
    ("fp32", 0.5, False, 6.0, 6.0),               # 12 * 0.5
    ("fp32", 0.25, False, 9.0, 9.0),              # 12 * 0.75
    ("fp32", 0.25, True, 9.0, 9.0),               # FP8 recipes too: offload turns the precision-aware path on
])
def test_adam_state_bytes_per_parameter_at_rest_and_at_the_steps_peak(state, offload, fp8_master, rest, peak):
    assert optimizer_state.adam_bytes(state, offload, fp8_master) == rest
    assert optimizer_state.adam_peak_bytes(state, offload, fp8_master) == peak
    assert optimizer_state.state_bytes_per_param("adam", 4, state=state, offload=offload, fp8_master=fp8_master) == rest / 4


def test_the_step_adds_fp32_gradient_copies_only_over_a_bf16_gradient_buffer():
    """Megatron's distributed optimizer copies each bf16 gradient shard to fp32 for the step (4 B); with the
    gradient buffer already fp32 (grad_reduce_in_fp32) there is nothing to copy."""
    assert optimizer_state.step_bytes("fp32", main_grad_copies=True) == 4.0
    assert optimizer_state.step_bytes("fp32", main_grad_copies=False) == 0.0
    assert optimizer_state.step_bytes("bf16-moments", main_grad_copies=True) == 4.0 + 2.0 + 8.0


def test_with_offload_only_the_gpu_shares_gradients_are_copied_to_fp32():
    """On the precision-aware path gradients reach the hybrid optimizer as views of the buffer (decoupled_grad);
    only the GPU share's are converted (HybridDeviceOptimizer._set_sub_optimizer_grads: grad.to(fp32)), a copy
    only from a bf16 buffer."""
    assert optimizer_state.step_bytes("fp32", offload=0.5, main_grad_copies=True) == 2.0
    assert optimizer_state.step_bytes("fp32", offload=1.0, main_grad_copies=True) == 0.0
    assert optimizer_state.step_bytes("fp32", offload=0.5, main_grad_copies=False) == 0.0


def test_the_step_peak_matches_the_measured_runs():
    """The mid TE model (recipes/bench/bench-te-mid2-auto.yaml, 2 GPUs) measured 32.90 GiB with fp32 state and
    with remainders, 38.27 with bf16 moments; 64.51 on one GPU (bench-te-mid1-det). The estimate of each, within
    2.5 % (benchmarks/results/levers-2026-11-27, deterministic-2026-11-27). Offloaded on the precision-aware
    path: 12.55 GiB, the estimate within the 7.4 % the planner's headroom covers (round3)."""
    from mocompile.pipeline import analyse

    mid2 = str(ROOT / "recipes" / "bench" / "bench-te-mid2-auto.yaml")
    for sets, measured in ((["training.optimizer_state=fp32"], 32.90),
                           (["training.optimizer_state=fp32-remainders"], 32.90),
                           (["training.optimizer_state=bf16-moments"], 38.27)):
        est = analyse(mid2, sets + ["profile=null"]).plan.memory["estimate_gib"]
        assert abs(est / measured - 1) <= 0.025, (sets, est, measured)
    off = analyse(mid2, ["training.optimizer_state=fp32", "training.optimizer_offload=1", "profile=null"]).plan.memory
    assert -0.074 <= off["estimate_gib"] / 12.55 - 1 <= 0.0, off["estimate_gib"]
    one = analyse(str(ROOT / "recipes" / "bench" / "bench-te-mid1-det.yaml")).plan.memory
    assert abs(one["estimate_gib"] / 64.51 - 1) <= 0.025 and one["optimizer_step_gib"] > 5


def test_muon_ignores_adams_levers():
    assert optimizer_state.state_bytes_per_param("muon", 2, 0.0, "bf16-moments", 1.0) == 8.0 / 2


def test_offload_costs_host_link_traffic_and_a_cpu_step_and_c2c_is_cheaper_than_pcie():
    """Worked answer: TOY's parameters per GPU at EP 2 on 2 GPUs, all offloaded: 8 bytes per parameter over the
    host link (fp32 gradient out, fp32 parameter back) plus the CPU step at cpu_adam_params_per_s."""
    c = steptime.constants()
    cand = Candidate(ep=2)
    on_gpu = steptime.optimizer_seconds(TOY, hw(), cand, 2)
    p = steptime.parameters(TOY)
    shard = (p["attention"] + p["dense_mlp"] + p["shared"] + p["router"] + p["embedding"]) / 2 + p["experts"] / 2
    full = steptime.optimizer_seconds(TOY, hw(), cand, 2, offload=1.0)
    assert full == pytest.approx(shard * (8.0 / 64e9 + 1.0 / c["cpu_adam_params_per_s"]))
    half = steptime.optimizer_seconds(TOY, hw(), cand, 2, offload=0.5)
    assert half == pytest.approx(on_gpu / 2 + full / 2)
    c2c = steptime.optimizer_seconds(TOY, hw(host_link_gbps=450), cand, 2, offload=1.0)
    link_pcie, link_c2c = shard * 8.0 / 64e9, shard * 8.0 / 450e9
    assert full - c2c == pytest.approx(link_pcie - link_c2c)  # only the link term changes, ~7x


def _intent(tmp_path: Path, text: str) -> Path:
    (tmp_path / "pyproject.toml").write_text("")
    p = tmp_path / "r.yaml"
    p.write_text("schema: 1\nname: r\n" + text)
    return p


def _settings(path: Path, *sets: str) -> dict:
    args = [a for s in sets for a in ("--set", s)]
    res = run_cli("explain", str(path), *args, "--format", "json")
    assert res.returncode in (0, 1), res.stderr
    return json.loads(res.stdout)


GPT_OSS_8_B200 = "model: gpt-oss-120b\nhardware: {gpu: b200, nodes: 1}\ngoal: fit\n"


def test_gpt_oss_120b_fits_one_b200_node_on_the_first_rung_that_fits(tmp_path):
    """fp32 state: ~246 GiB. The precision-aware states are no rungs (at the step's peak they hold 12 and 16 bytes
    against fp32's 12); activation offload moves nothing off the peak (the optimizer step's, after the activations
    are freed); offload 0.25 (~205 GiB) does not fit the 165.6 GiB usable (92 % of 180), 0.5 (~165 GiB: goal fit
    weighs every recompute rung, so its plan is the least-memory one) does (the offloaded share keeps nothing on the
    GPU), and the ladder stops there."""
    out = _settings(_intent(tmp_path, GPT_OSS_8_B200))
    s = out["settings"]
    assert s["optimizer_state"]["value"] == "fp32" and s["optimizer_offload_fraction"]["value"] == 0.5
    why = s["optimizer_state"]["reason"]
    assert "remainders" not in why and "bf16-moments" not in why and "offload 0.75" not in why
    assert "offload 0.25: 20" in why
    half = float(why.split("offload 0.5: ", 1)[1].split(" GiB", 1)[0])
    assert 160.0 < half <= 165.6
    assert not [d for d in out["diagnostics"] if d["severity"] == "error"]
    assert out["memory"]["total_gib"] <= 180 * 0.92
    # host memory: 16 B per offloaded parameter, half of a GPU's ~15 G-parameter shard, 8 GPUs: under 75 % of 2 TiB
    assert 0 < s["memory_host_node_gib"]["value"] <= s["host_memory_limit_gib"]["value"] == 1536.0


def test_a_recipe_on_bf16_moments_climbs_to_a_rung_that_holds_less_at_the_peak(tmp_path):
    """DeepSeek-V3's Bridge recipe keeps bf16 moments (16 B at the peak): from there fp32 state (12 B, with or
    without remainders) is a rung down, and the plan says it starts from the recipe's state."""
    out = _settings(_intent(tmp_path, "model: deepseek-v3\nhardware: {gpu: h100, nodes: 21}\ngoal: fit\n"))
    s = out["settings"]["optimizer_state"]
    assert s["value"] in ("bf16-moments", "fp32-remainders", "fp32")
    assert "deepseek_v3_pretrain_config" in s["reason"] or "bf16-moments Adam state" in s["reason"]


def test_pinning_the_state_to_fp32_climbs_to_the_least_offload_share_that_fits(tmp_path):
    out = _settings(_intent(tmp_path, GPT_OSS_8_B200), "training.optimizer_state=fp32")
    s = out["settings"]
    share = s["optimizer_offload_fraction"]["value"]
    assert share in (0.25, 0.5, 0.75, 1.0) and s["optimizer_state"]["value"] == "fp32"
    assert "least offload share that fits" in s["optimizer_offload_fraction"]["reason"]
    assert out["estimate"]["chosen"]["terms_s"]["optimizer"] > 1.0  # the host link and the CPU step: seconds
    if share > 0.25:  # the share below did not fit
        below = _settings(_intent(tmp_path, GPT_OSS_8_B200), "training.optimizer_state=fp32",
                          f"training.optimizer_offload={share - 0.25}")
        assert any(d["rule"] == "MEM001" for d in below["diagnostics"])


def test_with_every_lever_closed_mem001_names_the_gpu_count_and_the_lever_that_would_fit_here(tmp_path):
    path = _intent(tmp_path, GPT_OSS_8_B200)
    res = run_cli("lint", str(path), "--set", "training.optimizer_state=fp32", "--set", "training.optimizer_offload=0")
    assert res.returncode == 1 and "[MEM001]" in res.stdout and "is 16" in res.stdout
    dsv3 = _intent(tmp_path, "model: deepseek-v3\nhardware: {gpu: h100, nodes: 7}\ngoal: fit\n")
    res = run_cli("lint", str(dsv3))
    # one node fewer than fits with the whole state offloaded: MEM001 says how many GPUs fit with the recipe's
    # optimizer state (bf16 moments: 16 B at the step's peak), and with the offload: 8 nodes
    assert res.returncode == 1 and "is 224 (64 with training.optimizer_offload: 1" in res.stdout
    # and what the fewer GPUs cost: at the same global batch each of 64 GPUs computes 224/64 = 3.5x the tokens of
    # one of 224 and the CPU Adam step comes on top; against that, its data-parallel traffic stays on NVLink (a
    # pipeline stage of 8 GPUs fits a node: steptime._dp_link_gbps) where the 224's crosses the network, and its
    # larger GEMMs run nearer the peak: a few times the step, not the 1.0 of a missing estimate nor runaway
    ratio = float(re.search(r"predicted ([0-9.]+)x the step time on 224\)", res.stdout).group(1))
    assert 2.0 < ratio < 10
    eight = _intent(tmp_path, "model: deepseek-v3\nhardware: {gpu: h100, nodes: 8}\ngoal: fit\n")
    assert run_cli("lint", str(eight)).returncode == 0
    # with the offload pinned off, no lever is left open that fits on fewer GPUs: no note
    res = run_cli("lint", str(dsv3), "--set", "training.optimizer_offload=0")
    assert res.returncode == 1 and "is 224\n" in res.stdout


def test_deepseek_v3_fits_64_h100s_with_the_whole_optimizer_offloaded(tmp_path):
    """Issue 24's case: bf16 weights (2 B) and the fp32 gradient buffer (4 B) of a GPU's 1/64 share are ~59 GiB;
    on the precision-aware path the offloaded optimizer keeps nothing else on the GPU, so offload 1 fits under
    the 73.6 GiB headroom, and its 16 B per parameter on the host (~1.27 TiB per node) fit 75 % of 2 TiB."""
    out = _settings(_intent(tmp_path, "model: deepseek-v3\nhardware: {gpu: h100, nodes: 8}\ngoal: fit\n"))
    s = out["settings"]
    assert s["optimizer_offload_fraction"]["value"] == 1.0 and s["optimizer_state"]["value"] == "fp32"
    assert not [d for d in out["diagnostics"] if d["severity"] == "error"]
    assert out["memory"]["total_gib"] <= 80 * 0.92
    assert 1100 < s["memory_host_node_gib"]["value"] <= s["host_memory_limit_gib"]["value"]
    assert "offload 0.75: 9" in s["optimizer_state"]["reason"]  # the share below does not fit
    assert out["estimate"]["chosen"]["terms_s"]["optimizer"] > 5.0  # the price: the host link and the CPU step


def test_mem003_the_host_bounds_the_offload_and_mem001_counts_it(tmp_path):
    """On GB200 a tray has 960 GiB of host memory for 4 GPUs (720 usable): DeepSeek-V3 on 11 trays with 0.75 of
    the state offloaded fits the GPUs but pins ~746 GiB per tray (MEM003); on 12 it fits both. MEM001 at 8 trays
    counts the host too: a lighter share on more trays, not the heaviest share on fewer."""
    pins = "training: {optimizer_state: fp32, optimizer_offload: 0.75}\n"
    eleven = _intent(tmp_path, "model: deepseek-v3\nhardware: {gpu: gb200, nodes: 11}\ngoal: fit\n" + pins)
    res = run_cli("lint", str(eleven))
    assert res.returncode == 1 and "[MEM003]" in res.stdout and "[MEM001]" not in res.stdout
    twelve = _intent(tmp_path, "model: deepseek-v3\nhardware: {gpu: gb200, nodes: 12}\ngoal: fit\n" + pins)
    assert run_cli("lint", str(twelve)).returncode == 0
    eight = _intent(tmp_path, "model: deepseek-v3\nhardware: {gpu: gb200, nodes: 8}\ngoal: fit\n")
    res = run_cli("lint", str(eight))
    assert res.returncode == 1 and "(48 with training.optimizer_offload: 0.75" in res.stdout
    # the ladder at 11 trays skips the rungs the host cannot hold and says why
    out = _settings(_intent(tmp_path, "model: deepseek-v3\nhardware: {gpu: gb200, nodes: 11}\ngoal: fit\n"))
    assert "GiB of host memory per node over 720 (MEM003)" in out["settings"]["optimizer_state"]["reason"]


def test_a_plan_that_fits_keeps_the_recipes_optimizer_state_and_says_why(tmp_path):
    out = _settings(_intent(tmp_path, "model: gpt-oss-20b\nhardware: {gpu: h100, nodes: 2}\ngoal: throughput\n"))
    s = out["settings"]
    assert s["optimizer_state"]["value"] == "fp32" and s["optimizer_offload_fraction"]["value"] == 0.0
    assert "unless no plan fits" in s["optimizer_state"]["reason"]
    # Qwen3-30B-A3B's Bridge recipe builds the precision-aware optimizer: the plan keeps it and estimates it
    out = _settings(_intent(tmp_path, "model: qwen3-30b-a3b\nhardware: {gpu: h100, nodes: 2}\ngoal: throughput\n"))
    s = out["settings"]["optimizer_state"]
    assert s["value"] == "fp32-remainders" and "qwen3_30b_a3b_pretrain_config" in s["reason"]
    fp32 = _settings(_intent(tmp_path, "model: qwen3-30b-a3b\nhardware: {gpu: h100, nodes: 2}\ngoal: throughput\n"),
                     "training.optimizer_state=fp32")
    # the remainders hold 2 B less at rest, and as much as fp32 state at the optimizer step (measured)
    assert out["memory"]["weights_and_optimizer_gib"] < fp32["memory"]["weights_and_optimizer_gib"]
    assert out["memory"]["estimate_gib"] <= fp32["memory"]["estimate_gib"]


def test_muon_has_no_levers_to_climb(tmp_path):
    out = _settings(_intent(tmp_path, "model: gpt-oss-120b\nhardware: {gpu: b200, nodes: 1}\ngoal: fit\n"
                                      "training: {optimizer: muon}\n"))
    assert out["settings"]["optimizer_state"]["value"] == "fp32"
    assert any(d["rule"] == "MEM001" for d in out["diagnostics"])


def test_train_py_passes_the_levers_to_optimizer_config(tmp_path):
    path = _intent(tmp_path, GPT_OSS_8_B200)
    res = run_cli("compile", str(path), "-o", str(tmp_path / "gen"))
    assert res.returncode == 0, res.stdout + res.stderr
    train = tmp_path / "gen" / "r" / "train.py"
    text = train.read_text()
    # GPT-OSS-120B builds on Bridge's recipe: train.py sets the recipe optimizer's fields, every one explicit
    # offload runs on the precision-aware path with fp32 dtypes (Megatron-LM requires the flag with offload) and
    # an fp32 master on the host, not remainders
    for line in ("cfg.optimizer.optimizer_cpu_offload = True", "cfg.optimizer.optimizer_offload_fraction = 0.5",
                 "cfg.optimizer.use_precision_aware_optimizer = True", "cfg.optimizer.exp_avg_dtype = torch.float32",
                 "cfg.optimizer.main_params_dtype = torch.float32", "cfg.optimizer.store_param_remainders = False"):
        assert line in text
    subprocess.run([sys.executable, "-m", "py_compile", str(train)], check=True)
    # pinned bf16 moments (GPT-OSS-20B on two nodes fits with them)
    small = _intent(tmp_path, "model: gpt-oss-20b\nhardware: {gpu: h100, nodes: 2}\ngoal: throughput\n"
                              "training: {optimizer_state: bf16-moments}\n")
    res = run_cli("compile", str(small), "-o", str(tmp_path / "gen"), "--force")
    assert res.returncode == 0, res.stdout + res.stderr
    text = train.read_text()
    for line in ("use_precision_aware_optimizer = True", "exp_avg_dtype = torch.bfloat16",
                 "exp_avg_sq_dtype = torch.bfloat16", "main_params_dtype = torch.float32", "store_param_remainders = True",
                 "optimizer_cpu_offload = False"):
        assert f"cfg.optimizer.{line}" in text


@pytest.mark.parametrize("precision,offload,off", [
    ("fp8-cs", 0.5, True),    # Bridge's current-scaling preset gathers FP8 weights: refused with offload, so bf16
    ("mxfp8", 0.5, True),     # the MXFP8 preset too
    ("fp8-cs", 0.0, False),   # no offload: the preset as Bridge ships it
    ("fp8-ds", 0.5, False),   # delayed scaling: Megatron-LM allows offload with FP8 weights
])
def test_offload_keeps_bf16_weights_where_megatron_lm_refuses_fp8_ones(tmp_path, precision, offload, off):
    """megatron/training/arguments.py: with --optimizer-cpu-offload, --fp8-param-gather needs --fp8-recipe delayed."""
    gpu = "b200" if precision == "mxfp8" else "h100"
    path = _intent(tmp_path, f"model: qwen3-30b-a3b\nhardware: {{gpu: {gpu}, nodes: 1}}\ngoal: fit\n"
                             f"training: {{precision: {precision}, optimizer_state: fp32, optimizer_offload: {offload}}}\n")
    res = run_cli("compile", str(path), "-o", str(tmp_path / "gen"))
    assert res.returncode == 0, res.stdout + res.stderr
    text = (tmp_path / "gen" / "r" / "train.py").read_text()
    assert ("cfg.mixed_precision.fp8_param_gather = False" in text) is off


def test_throughput_climbs_a_lever_past_its_first_fitting_rung_while_the_plan_gets_faster(tmp_path):
    """DeepSeek-V3 on 64 B200s, bf16 moments: nothing fits without a lever. Offload 0.25 fits only a TP8 alltoall
    plan (~70 s/step); 0.5 frees enough for a TP4 PP8 HybridEP plan at ~51 s, its CPU step included. The same plan
    costs more at a heavier rung, but the freed memory lets a faster plan fit, so throughput climbs while each rung
    is faster than the last, and stops at the first that is not (only more CPU step)."""
    out = _settings(_intent(tmp_path, "model: deepseek-v3\nhardware: {gpu: b200, nodes: 8}\ngoal: throughput\n"
                                      "training: {seq_length: 4096, micro_batch_size: auto, global_batch_size: 1024}\n"))
    s = out["settings"]
    ladder = {float(m): float(t) for m, t in re.findall(r"offload ([\d.]+): [\d.]+ GiB, ([\d.]+) s/step",
                                                        s["optimizer_state"]["reason"])}
    share, step = s["optimizer_offload_fraction"]["value"], out["estimate"]["chosen"]["step_time_s"]
    assert 0.25 in ladder and share > 0.25  # a lighter share fits ...
    assert step < ladder[0.25]  # ... and the heavier one's plan is faster
    assert ladder[share] == pytest.approx(step, abs=0.01) == min(ladder.values())
    assert "fastest" in s["optimizer_offload_fraction"]["reason"]
    # the climb stopped at the first rung no faster: every tried share before the last was faster than the one before it
    times = [ladder[k] for k in sorted(ladder)]
    assert all(b < a for a, b in zip(times[:-2], times[1:-1], strict=True))
    assert times[-1] >= times[-2] or max(ladder) == 1.0


def test_the_plan_line_names_an_optimizer_offload_and_the_step_share_it_costs(tmp_path):
    """The plan's label has no offload: GPT-OSS-20B on two H100s at full offload spends 25.6 of its 40.2 s/step in the
    host's Adam step, which the line the plan is explained by must say (next to a 4-GPU plan it reads 3x faster)."""
    out = _settings(_intent(tmp_path, "model: gpt-oss-20b\nhardware: {gpu: h100, nodes: 1, gpus_per_node: 2}\n"
                                      "goal: throughput\ntraining: {seq_length: 4096, global_batch_size: 256}\n"))
    s = out["settings"]
    share, opt = s["optimizer_offload_fraction"]["value"], out["estimate"]["chosen"]["terms_s"]["optimizer"]
    assert share > 0
    assert (f"with {share:g} of Adam's state and step on the host CPU ({opt:.2f} s of the step"
            in s["tensor_model_parallel_size"]["reason"])


def test_a_pins_own_rule_error_does_not_climb_the_memory_ladder(tmp_path):
    """DeepSeek-V3 with two MTP layers and EP overlap pinned on: every plan breaks OVL011 (the pins' own error),
    and the least-broken plan fits. A memory lever frees memory and makes no rule hold, so the ladder is not
    climbed: the plan keeps the recipe's optimizer state and no FSDP (the ladder's rung searches had taken it to
    Megatron-FSDP, and a pre-commit lint of this file from 0.5 s to 2 s). Where nothing fits, the ladder still
    climbs (test_throughput_climbs_a_lever_past_its_first_fitting_rung_while_the_plan_gets_faster)."""
    path = _intent(tmp_path, "model: {base: deepseek-v3, mtp_num_layers: 2}\nhardware: {gpu: h100, nodes: 32}\n"
                             "goal: throughput\nmoe: {overlap: true}\n"
                             "training: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 4096}\n")
    out = _settings(path)
    assert [d["rule"] for d in out["diagnostics"]] == ["OVL011"]
    s = out["settings"]
    assert s["memory_estimate_gib"]["value"] <= 73.6  # the least-broken plan fits: nothing for a lever to do
    assert s["optimizer_state"]["source"] == "default" and "ladder" not in s["optimizer_state"]["reason"]
    assert s["optimizer_offload_fraction"]["value"] == 0.0
    assert s["use_megatron_fsdp"]["value"] is False
