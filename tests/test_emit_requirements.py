"""What the preflight checks at launch (render.requirements) follows from the plan, and every generated
file ends with one newline. Behaviour, not golden files: each value is derived here from the rule it encodes."""

from __future__ import annotations

import pytest
from conftest import ROOT
from mocompile.emit import render
from mocompile.pipeline import analyse, compile_recipe

WGRAD = ROOT / "recipes" / "bench" / "bench-te-mid-ep4-on-wgrad.yaml"  # TE 2.12, overlap + delayed wgrad, no graphs


def _req(path, *sets):
    r = analyse(str(path), list(sets))
    assert not r.errors, [d.message for d in r.errors]
    return render.requirements(r.plan), r.plan


@pytest.mark.parametrize("sets,te_min", [
    ((), "2.7.0"),                                                   # delayed wgrad with grad overlap: TE 2.7
    (("cuda_graphs.impl=transformer_engine", "cuda_graphs.modules=[moe_router]"), "2.10.0"),  # + TE graphs: 2.10
    (("cuda_graphs.impl=transformer_engine", "cuda_graphs.modules=[attn]", "versions.apex=present"), "2.12.0"),  # + attention
])
def test_the_te_minimum_is_the_highest_any_used_feature_needs(sets, te_min):
    req, plan = _req(WGRAD, *sets)
    assert plan["delay_wgrad_compute"] is True
    assert req["transformer_engine"] == te_min


def test_graphed_attention_without_delayed_wgrad_needs_no_newer_te():
    req, plan = _req(WGRAD, "moe.delay_wgrad=false", "cuda_graphs.impl=transformer_engine", "cuda_graphs.modules=[attn]")
    assert plan["delay_wgrad_compute"] is False and req["transformer_engine"] == "1.7.0"


def test_the_hybridep_probe_holds_one_layers_local_experts():
    req, plan = _req(ROOT / "recipes" / "bench" / "bench-tiny-flex-hybridep.yaml")
    ep = plan["expert_model_parallel_size"]
    assert ep > 1
    assert req["hybridep_probe"]["local_experts"] == plan.model["num_moe_experts"] // ep
    assert req["hybridep_probe"]["tokens"] == plan["seq_length"] * plan["micro_batch_size"]


@pytest.mark.parametrize("recipe", ["tiny-moe-h100x2.yaml", "qwen3-235b-a22b-gb200.yaml"])
def test_every_generated_file_ends_with_exactly_one_newline(recipe):
    for name, text in compile_recipe(str(ROOT / "recipes" / recipe)).files.items():
        assert text.endswith("\n") and not text.endswith("\n\n"), name


def _plan(tmp_path, extra: str):
    path = tmp_path / "r.yaml"
    path.write_text("schema: 1\nmodel: tiny-moe\nhardware: {gpu: h100, gpus_per_node: 2}\ngoal: bring-up\n" + extra)
    r = analyse(str(path))
    assert not r.errors, [d.message for d in r.errors]
    return r.plan


@pytest.mark.parametrize("extra", [
    "tokenizer: {type: huggingface, path: /tok}\n",         # the tokenizer alone
    "checkpoint: {save: /ckpt}\n",                          # a folder written alone
    "checkpoint: {load: /ckpt}\n",                          # a checkpoint read alone
    "checkpoint: {pretrained: /base}\n",
])
def test_any_single_input_or_output_makes_the_launcher_say_where_the_run_reads_and_writes(tmp_path, extra):
    assert render.preflight_io(_plan(tmp_path, extra))["any"] is True


def test_a_run_that_reads_and_writes_nothing_says_nothing(tmp_path):
    assert render.preflight_io(_plan(tmp_path, ""))["any"] is False


@pytest.mark.parametrize("nodes,roles", [(1, {"Master": 1}), (2, {"Master": 1, "Worker": 1}), (4, {"Master": 1, "Worker": 3})])
def test_the_kubernetes_job_has_one_master_and_a_worker_per_further_node(tmp_path, nodes, roles):
    from ruamel.yaml import YAML

    path = tmp_path / "r.yaml"
    path.write_text(f"schema: 1\nmodel: tiny-moe\nhardware: {{gpu: h100, nodes: {nodes}, gpus_per_node: 2}}\n"
                    "goal: bring-up\nlaunch: {targets: [kubernetes]}\n")
    job = YAML(typ="safe").load(compile_recipe(str(path)).files["trainjob.yaml"])
    assert {k: v["replicas"] for k, v in job["spec"]["pytorchReplicaSpecs"].items()} == roles


def test_a_long_name_becomes_a_63_character_kubernetes_name(tmp_path):
    from ruamel.yaml import YAML

    path = tmp_path / "r.yaml"
    path.write_text("schema: 1\nname: " + "A_" * 40 + "\nmodel: tiny-moe\nhardware: {gpu: h100, gpus_per_node: 2}\n"
                    "goal: bring-up\nlaunch: {targets: [kubernetes]}\n")
    name = YAML(typ="safe").load(compile_recipe(str(path)).files["trainjob.yaml"])["metadata"]["name"]
    assert name == ("a-" * 40).strip("-")[:63] and len(name) == 63  # Kubernetes names stop at 63 characters


def test_without_transformer_engine_no_te_minimum_is_required(tmp_path):
    plan = _plan(tmp_path, "versions: {transformer_engine: none}\n")
    assert plan["te_version"] is None and render.requirements(plan)["transformer_engine"] is None


def test_fp4_needs_te_2_7_and_plain_te_needs_1_7():
    plain, _ = _req(WGRAD, "moe.delay_wgrad=false", "moe.overlap=false")
    assert plain["transformer_engine"] == "1.7.0"
    fp4, plan = _req(ROOT / "recipes" / "bench" / "bench-te-mid-ep4-off.yaml", "hardware.gpu=b200", "training.precision=nvfp4")
    assert plan["fp4"] is not None and fp4["transformer_engine"] == "2.7.0"


def test_a_failed_preflight_stops_the_slurm_script_before_training(tmp_path):
    """Under `set -e` the first srun (the preflight) failing ends the job script: the training srun never runs."""
    import os
    import subprocess

    path = tmp_path / "r.yaml"
    path.write_text("schema: 1\nmodel: tiny-moe\nhardware: {gpu: h100, gpus_per_node: 2}\ngoal: bring-up\n"
                    "launch: {targets: [slurm]}\n")
    files = compile_recipe(str(path)).files
    folder = tmp_path / "job"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "srun").write_text('#!/usr/bin/env bash\necho "srun $*" >> "$LOG"\n'
                                'while [[ "${1:-}" == -* ]]; do shift; done\nexec "$@"\n')
    (stubs / "scontrol").write_text("#!/usr/bin/env bash\necho localhost\n")
    for f in stubs.iterdir():
        f.chmod(0o755)
    log = tmp_path / "srun.log"
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "LOG": str(log), "PYTHON": str(tmp_path / "no-such-python"),
           "MOCOMPILE_RECIPE_DIR": str(folder), "SLURM_NNODES": "1", "SLURM_JOB_ID": "7", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", str(folder / "slurm.sbatch")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and "RUN001" in proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    assert len(calls) == 1 and calls[0].endswith("preflight.sh"), calls  # the training srun never ran
    assert os.path.exists(folder / "train.py")
