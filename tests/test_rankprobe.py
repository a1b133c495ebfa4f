"""The rank probe (issue 23) on the CPU: which rank it impersonates, what it substitutes and what that hides in the
estimate, the generated rankprobe.sh (dry run, refused arguments), the preflight in probe mode, and `mocompile
rankprobe` on bad input and on a result file. The GPU part (the generated train.py's rank_probe()) runs in
benchmarks/gpu/issue23_rankprobe.sh; its model path runs on CPU in tests/stack/test_rankprobe_build.py."""

from __future__ import annotations

import ast
import json
import os
import subprocess

import pytest
from conftest import ROOT, run_cli
from mocompile import memory, rankprobe
from mocompile.pipeline import compile_recipe

DSV3 = """schema: 1
model: deepseek-v3
hardware: {gpu: h100, nodes: 128, gpus_per_node: 8}
goal: throughput
training: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 16384, precision: bf16,
  optimizer_state: fp32, optimizer_offload: 0}
parallelism: {tp: 2, pp: 8, vpp: 4, ep: 64, etp: 1, cp: 1, layout: "Et|(tt|)*30mL"}
moe: {dispatcher: "hybridep", overlap: false, delay_wgrad: false, force_balance: true, num_sms: 32}
recompute: {granularity: "selective", modules: ["mla_up_proj", "mlp"]}
cuda_graphs: {impl: "none"}
"""

# a plan whose last stage is the most loaded: full recompute leaves little activation memory on the first stage,
# and the last holds GPT-OSS's 201k-token logits
LAST = """schema: 1
model: gpt-oss-20b
hardware: {gpu: h100, nodes: 1, gpus_per_node: 8}
goal: throughput
training: {seq_length: 4096, micro_batch_size: 1, global_batch_size: 32}
parallelism: {tp: 1, pp: 2, ep: 4, etp: 1, cp: 1}
moe: {dispatcher: alltoall}
recompute: {granularity: full, method: uniform, num_layers: 1}
"""

# natural routing, DeepEP, 16 GPUs in 2 stages (the stack test builds this plan's shards on CPU)
TINY16 = """schema: 1
model: tiny-moe
hardware: {gpu: h100, nodes: 2, gpus_per_node: 8}
goal: throughput
training: {seq_length: 2048, global_batch_size: 64, micro_batch_size: 1, train_iters: 10}
parallelism: {tp: 1, pp: 2, ep: 8, etp: 1, cp: 1}
moe: {dispatcher: deepep}
versions: {transformer_engine: none}
"""


def _plan(tmp_path, text: str, name: str = "p"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    res = compile_recipe(str(path), [], [], "generated")
    assert res.plan is not None and not res.errors, [d.message for d in res.diagnostics]
    return res


def test_a_1024_gpu_hybridep_plan_probes_rank_0_with_alltoall_and_says_what_the_swap_hides(tmp_path):
    res = _plan(tmp_path, DSV3)
    spec = rankprobe.spec(res.plan)
    # the layout Et|(tt|)*30mL gives stage 0 seven layers (one dense) and stage 2 eight MoE layers with 35 of its
    # chunk forwards in flight (2 x 5 + 3 x 8 + 1) against stage 0's 39 on 7: the estimate calls stage 2 most
    # loaded, global rank 2 x 1024/8 = 256
    assert (spec["rank"], spec["stage"], spec["stages"], spec["world_size"]) == (256, 2, 8, 1024)
    assert "3rd of 8 pipeline stages" in spec["rank_why"]
    # HybridEP -> alltoall (PRB002); routing already forced (no PRB003); 16 of 256 micro-batches (PRB004)
    assert [s["rule"] for s in spec["substitutions"]] == ["PRB002", "PRB004"]
    assert spec["model"] == {"moe_token_dispatcher_type": "alltoall"}
    assert spec["microbatches"] == {"plan": 256, "probe": 16} and spec["global_batch_size"] == 1024
    # the allocator's estimate is the same; what the GPU holds differs by exactly HybridEP's buffers
    est = spec["estimate"]
    assert est["plan"]["estimate_gib"] == est["probe"]["estimate_gib"] == res.plan.memory["estimate_gib"]
    assert est["probe"]["dispatcher_buffers_gib"] == 0.0
    assert est["difference_gib"]["total"] == pytest.approx(est["plan"]["dispatcher_buffers_gib"], abs=0.011)
    # the step-time model's compute for the probe is the plan's scaled by 16/256
    assert spec["model_compute_s"]["probe"] == pytest.approx(spec["model_compute_s"]["plan"] / 16, abs=1e-3)
    found = rankprobe.findings(spec, gpu_gib=79.2)
    assert [f["rule"] for f in found] == ["PRB002", "PRB004"]
    assert "3.5 GiB" in found[0]["message"]
    # on a GPU smaller than the rank's estimate the probe refuses (PRB001) instead of running out of memory
    assert rankprobe.findings(spec, gpu_gib=40.0)[0]["rule"] == "PRB001"


def test_the_last_stage_is_probed_where_the_logits_make_it_the_most_loaded(tmp_path):
    res = _plan(tmp_path, LAST)
    spec = rankprobe.spec(res.plan)
    est = spec["estimate"]["probe"]
    assert est["logits_gib"] > 0  # the estimator chose the last stage
    assert (spec["stage"], spec["rank"]) == (1, 4)  # its first rank: 8 GPUs / 2 stages
    assert "last of 2 pipeline stages" in spec["rank_why"]


def test_natural_routing_is_forced_to_balance_and_the_imbalance_term_is_stated(tmp_path):
    res = _plan(tmp_path, TINY16)
    spec = rankprobe.spec(res.plan)
    assert spec["model"]["moe_router_force_load_balancing"] is True
    diff = spec["estimate"]["difference_gib"]["allocated"]
    # the estimate's 1.2x routing imbalance is what the balanced probe cannot show
    assert diff > 0
    plan_est = memory.estimate(res.plan.model, {**res.plan.values(), "moe_router_force_load_balancing": True})
    assert diff == pytest.approx(res.plan.memory["estimate_gib"] - plan_est["estimate_gib"], abs=0.011)
    prb3 = next(f for f in rankprobe.findings(spec) if f["rule"] == "PRB003")
    assert f"{diff:+g} GiB" in prb3["message"]


def test_a_pipeline_free_plan_keeps_two_micro_batches(tmp_path):
    res = _plan(tmp_path, (ROOT / "recipes" / "tiny-moe-h100x2.yaml").read_text(), "tiny")
    spec = rankprobe.spec(res.plan)
    assert spec["rank"] == 0 and spec["stages"] == 1 and spec["microbatches"]["probe"] == 2
    assert spec["global_batch_size"] == 2 * 2 * res.plan["data_parallel_size"] * res.plan["micro_batch_size"] // 2


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gen")
    (tmp / "dsv3.yaml").write_text(DSV3)
    proc = run_cli("compile", str(tmp / "dsv3.yaml"), "-o", str(tmp / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp / "out" / "dsv3"


def test_train_py_carries_the_spec_as_one_literal(generated, tmp_path):
    tree = ast.parse((generated / "train.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "RANK_PROBE")
    literal = ast.literal_eval(node.value)
    assert literal == json.loads(json.dumps(rankprobe.spec(_plan(tmp_path, DSV3).plan)))
    text = (generated / "train.py").read_text()
    assert 'os.environ.get("MOCOMPILE_RANK_PROBE")' in text and 'init_process_group("fake"' in text


def _launch(generated, env: dict) -> subprocess.CompletedProcess:
    e = {"PATH": os.environ["PATH"], "PYTHON": "python3", **env}
    return subprocess.run(["bash", str(generated / "rankprobe.sh")], env=e, capture_output=True, text=True, timeout=60)


def test_rankprobe_sh_dry_run_prints_one_process_on_one_gpu(generated):
    proc = _launch(generated, {"MOCOMPILE_DRY_RUN": "1", "CUDA_VISIBLE_DEVICES": "3,4"})
    assert proc.returncode == 0, proc.stderr
    assert "MOCOMPILE_RANK_PROBE_RANK=256" in proc.stdout and "MOCOMPILE_RANK_PROBE_ITERS=6" in proc.stdout
    assert "CUDA_VISIBLE_DEVICES=3\n" in proc.stdout  # the first visible GPU only
    command = proc.stdout.split("command:")[1]
    assert command.strip().endswith("train.py") and "torch.distributed.run" not in command
    # the environment block is the plan's (the same as torchrun.sh exports)
    assert "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=" in proc.stdout
    # preflight in probe mode: the flex dispatcher's package is not needed (PRB002)
    assert "RUN003" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("env, says", [
    ({"MOCOMPILE_RANK_PROBE_RANK": "1024"}, "not a rank of this 1024-GPU plan (0..1023)"),
    ({"MOCOMPILE_RANK_PROBE_RANK": "-1"}, "not a rank"),
    ({"MOCOMPILE_RANK_PROBE_RANK": "$(touch x)"}, "not a rank"),
    ({"MOCOMPILE_RANK_PROBE_ITERS": "0"}, "not a positive number of iterations"),
])
def test_rankprobe_sh_refuses_a_rank_or_iteration_count_outside_the_plan(generated, env, says, tmp_path):
    proc = subprocess.run(["bash", str(generated / "rankprobe.sh")], env={"PATH": os.environ["PATH"], **env},
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 2 and says in proc.stderr
    assert not (tmp_path / "x").exists()


def test_preflight_outside_probe_mode_still_wants_the_flex_package(generated):
    proc = subprocess.run(["bash", str(generated / "preflight.sh")], env={"PATH": os.environ["PATH"]},
                          capture_output=True, text=True, timeout=120)
    assert "RUN003" in proc.stdout + proc.stderr  # no deep_ep here: only the probe may go without it


def test_a_rank_picked_by_the_caller_is_judged_against_its_own_stage(tmp_path):
    """MOCOMPILE_RANK_PROBE_RANK may pick a rank of another stage than the estimate's most loaded one: its
    measurement is compared with that stage's estimate, which the spec carries for every stage."""
    spec = rankprobe.spec(_plan(tmp_path, DSV3).plan)
    by_stage = spec["estimate"]["probe_by_stage_gib"]
    assert len(by_stage) == spec["stages"] == 8
    assert by_stage[spec["stage"]] == spec["estimate"]["probe"]["estimate_gib"] == max(by_stage)
    last = 7 * 1024 // 8
    assert by_stage[7] < by_stage[spec["stage"]] - 1.0   # the stages differ by more than rounding
    path = _result(tmp_path, spec, by_stage[7], rank=last)
    rep = json.loads(run_cli("rankprobe", "--from-result", path, "--format", "json").stdout)
    assert rep["rank"] == last and rep["summary"]["estimate_gib"] == by_stage[7] and rep["summary"]["error"] == 0.0
    assert "chosen by the caller: stage 8 of 8" in rep["rank_why"]
    # the spec's own rank keeps the spec's estimate
    rep = json.loads(run_cli("rankprobe", "--from-result", _result(tmp_path, spec, 50.0), "--format", "json").stdout)
    assert rep["summary"]["estimate_gib"] == spec["estimate"]["probe"]["estimate_gib"]


def _train_helpers(generated) -> dict:
    """The generated train.py's pure helpers (no torch needed)."""
    tree = ast.parse((generated / "train.py").read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("_site", "_peak_sites")]
    ns: dict = {}
    exec(compile(ast.Module(body=body, type_ignores=[]), "train.py", "exec"), ns)  # noqa: S102
    return ns


def test_peak_sites_sums_the_blocks_alive_at_the_traced_peak_by_the_frame_that_allocated_them(generated):
    """MOCOMPILE_RANK_PROBE_SITES=1: the allocator's trace is replayed; a block freed before the peak does not count,
    one allocated after it does not either, and a block freed only after the peak does."""
    peak_sites = _train_helpers(generated)["_peak_sites"]
    te = {"filename": "/v/site-packages/transformer_engine/pytorch/module/grouped_linear.py", "line": 150, "name": "forward"}
    mc = {"filename": "/v/site-packages/megatron/core/transformer/moe/experts.py", "line": 900, "name": "forward"}
    gib = 2 ** 30
    trace = [{"action": "alloc", "addr": 1, "size": 2 * gib, "frames": [te, mc]},
             {"action": "alloc", "addr": 2, "size": 3 * gib, "frames": []},            # freed before the peak
             {"action": "free_requested", "addr": 2}, {"action": "free_completed", "addr": 2},
             {"action": "alloc", "addr": 3, "size": 4 * gib, "frames": [mc]},
             {"action": "alloc", "addr": 4, "size": 1 * gib, "frames": [te, mc]},      # the peak: 2 + 4 + 1
             {"action": "free_requested", "addr": 3},
             {"action": "alloc", "addr": 5, "size": 3 * gib, "frames": [mc]}]          # after the peak: 2 + 1 + 3
    out = peak_sites({"device_traces": [trace]})
    assert out["traced_peak_gib"] == 7.0 and out["peak_event"] == 5
    assert out["by_allocation_site"] == [
        {"site": "megatron/core/transformer/moe/experts.py:900 forward", "blocks": 1, "gib": 4.0},
        {"site": "transformer_engine/pytorch/module/grouped_linear.py:150 forward", "blocks": 2, "gib": 3.0}]
    assert out["by_module"] == [{"site": "megatron/core/transformer/moe/experts.py:900 forward", "blocks": 3, "gib": 7.0}]


def _result(tmp_path, spec: dict, alloc_gib: float, iterations: int = 6, error=None, rank=None) -> str:
    rows = [{"iteration": i + 1, "step_ms": 1000.0 + 10 * i, "loss": None,
             "max_memory_allocated": int(alloc_gib * memory.GIB), "max_memory_reserved": int((alloc_gib + 2) * memory.GIB)}
            for i in range(iterations)]
    data = {"spec": spec, "rank": spec["rank"] if rank is None else rank, "world_size": spec["world_size"],
            "device_name": "NVIDIA H100 80GB HBM3",
            "gpu_memory_gib": 79.19, "iterations": rows, "replaced_at_run_time": [], "error": error,
            "max_memory_allocated": int(alloc_gib * memory.GIB), "max_memory_reserved": int((alloc_gib + 2) * memory.GIB)}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_result_inside_the_band_exits_0_and_prints_measured_beside_estimated(tmp_path):
    spec = rankprobe.spec(_plan(tmp_path, DSV3).plan)
    proc = run_cli("rankprobe", "--from-result", _result(tmp_path, spec, 57.0))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "measured peak allocated 57.00 GiB, reserved 59.00 GiB over 6 iteration(s)" in proc.stdout
    assert "61.88 GiB: +8.6%, within +-10%" in proc.stdout
    # the median of iterations 2..6 (1030 ms), scaled to the plan's 256 micro-batches (x16)
    assert "iteration 1030.0 ms (16.48 s scaled" in proc.stdout
    assert "PRB002" in proc.stdout and "PRB004" in proc.stdout
    rep = json.loads(run_cli("rankprobe", "--from-result", _result(tmp_path, spec, 57.0), "--format", "json").stdout)
    assert rep["summary"]["error"] == pytest.approx((61.88 - 57.0) / 57.0, abs=1e-4)


def test_a_result_outside_the_band_or_without_iterations_exits_1(tmp_path):
    spec = rankprobe.spec(_plan(tmp_path, DSV3).plan)
    proc = run_cli("rankprobe", "--from-result", _result(tmp_path, spec, 50.0))
    assert proc.returncode == 1 and "+23.8%, outside +-10%" in proc.stdout
    proc = run_cli("rankprobe", "--from-result", _result(tmp_path, spec, 30.0, iterations=0, error="out of memory: x"))
    assert proc.returncode == 1 and "error: out of memory: x" in proc.stdout


@pytest.mark.parametrize("args, says", [
    ([], "a recipe to run, or --from-result FILE"),
    (["recipes/tiny-moe-h100x2.yaml", "--from-result", "x.json"], "one of them"),
    (["--from-result", "/nonexistent/r.json"], "not a rank-probe result"),
    (["--from-result", "pyproject.toml"], "not a rank-probe result"),
    (["recipes/tiny-moe-h100x2.yaml", "--rank", "2"], "--rank 2 is not a rank of this 2-GPU plan (0..1)"),
    (["recipes/tiny-moe-h100x2.yaml", "--iterations", "0"], "--iterations must be at least 1"),
    (["no-such.yaml"], "no such recipe"),
])
def test_bad_input_is_a_clear_message_and_exit_2(args, says, tmp_path):
    proc = run_cli("rankprobe", *args, "--work", str(tmp_path / "w"))
    assert proc.returncode == 2 and says in proc.stderr, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_json_file_of_the_wrong_shape_is_refused(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"spec": {"estimate": {}}, "iterations": "x"}))
    proc = run_cli("rankprobe", "--from-result", str(tmp_path / "r.json"))
    assert proc.returncode == 2 and "not a rank-probe result" in proc.stderr and "Traceback" not in proc.stderr


def test_without_a_gpu_the_command_runs_the_launcher_and_reports_its_failure(tmp_path):
    """On this CPU host the generated train.py cannot take a GPU: the command says so with the log, exit 1."""
    proc = run_cli("rankprobe", "recipes/tiny-moe-h100x2.yaml", "--work", str(tmp_path / "w"), "--timeout", "100",
                   env={"MOCOMPILE_SKIP_HYBRIDEP_PROBE": "1"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "rank probe: rank 0 of 2" in proc.stdout and "exited" in proc.stdout
    assert (tmp_path / "w" / "generated" / "tiny-moe-h100x2" / "rankprobe.sh").is_file()
    assert (tmp_path / "w" / "tiny-moe-h100x2.log").is_file()
