"""With `launch.container`, the job sees every path it reads or writes: the Slurm script bind-mounts them
(pyxis --container-mounts) and the Kubeflow job mounts them as hostPath volumes; relative paths resolve in the
submit directory, which is mounted and is the container's working directory (as without a container)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli
from mocompile.pipeline import analyse

IMAGE = "nvcr.io/nvidia/nemo:25.11"


def _project(tmp_path: Path, extra_launch: str = "") -> tuple[Path, dict[str, Path]]:
    """A project whose recipe reads real files at absolute paths outside it (data, tokenizer) and writes to
    others (checkpoints, index cache), plus a relative TensorBoard folder."""
    outside = tmp_path / "cluster fs"  # a space: the mounts are quoted words, not split
    paths = {"data": outside / "datasets" / "corpus", "tok": outside / "models" / "tok",
             "ckpt": outside / "ckpt" / "run1", "cache": outside / "scratch" / "index", "extra": outside / "opt"}
    paths["data"].mkdir(parents=True)
    for ext in (".bin", ".idx"):
        (paths["data"] / f"text_document{ext}").write_bytes(b"\0")
    paths["tok"].mkdir(parents=True)
    paths["extra"].mkdir(parents=True)
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pyproject.toml").write_text("")
    (proj / "r.yaml").write_text(
        "schema: 1\nname: r\nmodel: tiny-moe\nhardware: {gpu: h100, nodes: 2, gpus_per_node: 2}\ngoal: throughput\n"
        f"training: {{data: {{type: megatron, blend: [{json.dumps(str(paths['data'] / 'text_document'))}], "
        f"cache: {json.dumps(str(paths['cache']))}}}}}\n"
        f"tokenizer: {{path: {json.dumps(str(paths['tok']))}}}\n"
        f"checkpoint: {{save: {json.dumps(str(paths['ckpt']))}, load: {json.dumps(str(paths['ckpt']))}}}\n"
        "logging: {tensorboard: runs/tb}\n"
        f"launch: {{targets: [torchrun, slurm, kubernetes], container: {json.dumps(IMAGE)}{extra_launch}}}\n")
    return proj, paths


def _srun_args(proj: Path, tmp_path: Path) -> list[list[str]]:
    """Run the generated sbatch with bash, srun and scontrol replaced by recorders: the srun lines as argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    record = tmp_path / "srun.log"
    (bin_dir / "srun").write_text(f"#!{sys.executable}\nimport json, sys\n"
                                  f"open({str(record)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(proj), "SLURM_JOB_ID": "7",
           "SLURM_NNODES": "2", "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", "generated/r/slurm.sbatch"], cwd=proj, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [json.loads(line) for line in record.read_text().splitlines()]


def test_the_slurm_job_mounts_every_folder_the_run_touches_and_works_in_the_submit_directory(tmp_path):
    proj, paths = _project(tmp_path)
    assert run_cli("compile", "r.yaml", cwd=proj).returncode == 0
    calls = _srun_args(proj, tmp_path)
    assert len(calls) == 2  # preflight, then the training command: both inside the container
    for argv in calls:
        opts = dict(a.split("=", 1) for a in argv if a.startswith("--container-"))
        assert opts["--container-image"] == IMAGE and opts["--container-workdir"] == str(proj)
        mounts = [m.split(":") for m in opts["--container-mounts"].split(",")]
        assert all(src == dst for src, dst in mounts)  # every folder at its own path inside
        sources = {src for src, _ in mounts}
        want = {str(proj / "generated" / "r"), str(proj), str(paths["data"]), str(paths["tok"]),
                str(paths["ckpt"]), str(paths["cache"])}
        assert sources == want, sources ^ want
    # the folders the job writes exist before the mount needs them; the inputs were already there
    assert paths["ckpt"].is_dir() and paths["cache"].is_dir()
    lock = json.loads((proj / "generated" / "r" / "mocompile.lock.json").read_text())
    assert sorted(lock["settings"]["container_mounts"]["value"]) == sorted(want - {str(proj), str(proj / "generated" / "r")})


def test_launch_mounts_add_folders_and_nested_ones_collapse_to_the_outermost(tmp_path):
    proj, paths = _project(tmp_path, extra_launch=f", mounts: [{json.dumps(str(paths_root(tmp_path)))}]")
    r = analyse(str(proj / "r.yaml"))
    assert not r.errors
    assert r.plan["container_mounts"] == [str(paths_root(tmp_path))]  # everything lies under it


def paths_root(tmp_path: Path) -> Path:
    return tmp_path / "cluster fs"


def test_a_dry_run_creates_nothing(tmp_path):
    proj, paths = _project(tmp_path)
    assert run_cli("compile", "r.yaml", cwd=proj).returncode == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    for tool in ("srun", "scontrol"):
        (bin_dir / tool).chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(proj), "MOCOMPILE_DRY_RUN": "1",
           "HOME": str(tmp_path)}
    proc = subprocess.run(["bash", "generated/r/slurm.sbatch"], cwd=proj, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not paths["ckpt"].exists() and not paths["cache"].exists()


def test_a_container_run_that_names_no_absolute_path_mounts_only_the_recipe_and_submit_folders(tmp_path):
    proj, _ = _project(tmp_path)
    text = (proj / "r.yaml").read_text()
    text = text.split("training:")[0] + f'launch: {{container: "{IMAGE}"}}\n'  # mock data, no folders named
    (proj / "r.yaml").write_text(text)
    d = analyse(str(proj / "r.yaml")).plan.settings["container_mounts"]
    assert d.value == [] and "no absolute path" in d.reason
    _, paths = _project(tmp_path / "two")
    d = analyse(str(tmp_path / "two" / "proj" / "r.yaml")).plan.settings["container_mounts"]
    assert len(d.value) == 4 and "these absolute paths the run reads or writes" in d.reason


def test_without_a_container_nothing_is_mounted_or_made(tmp_path):
    proj, _ = _project(tmp_path)
    text = (proj / "r.yaml").read_text().replace(f', container: "{IMAGE}"', "")
    (proj / "r.yaml").write_text(text)
    r = analyse(str(proj / "r.yaml"))
    assert r.plan["container_mounts"] is None
    assert run_cli("compile", "r.yaml", cwd=proj).returncode == 0
    sbatch = (proj / "generated" / "r" / "slurm.sbatch").read_text()
    assert "--container" not in sbatch and "mkdir" not in sbatch


def test_the_kubeflow_job_mounts_the_same_folders_as_host_paths(tmp_path):
    from ruamel.yaml import YAML
    proj, paths = _project(tmp_path)
    assert run_cli("compile", "r.yaml", cwd=proj).returncode == 0
    job = YAML(typ="safe").load((proj / "generated" / "r" / "trainjob.yaml").read_text())
    for role in job["spec"]["pytorchReplicaSpecs"].values():
        spec = role["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounted = {m["mountPath"]: volumes[m["name"]] for m in spec["containers"][0]["volumeMounts"]}
        for key in ("data", "tok", "ckpt", "cache"):
            vol = mounted[str(paths[key])]
            assert vol["hostPath"]["path"] == str(paths[key])
            # the folders the job writes may be created on the node; inputs must already be there
            assert vol["hostPath"]["type"] == ("DirectoryOrCreate" if key in ("ckpt", "cache") else "Directory")
    try:
        from test_kubernetes import _errors
    except pytest.skip.Exception:
        return
    assert _errors(job) == []


def test_a_path_pyxis_cannot_express_is_refused_at_compile_time(tmp_path):
    proj, _ = _project(tmp_path)
    text = (proj / "r.yaml").read_text().replace("ckpt", "ck,pt")
    (proj / "r.yaml").write_text(text)
    proc = run_cli("lint", "r.yaml", cwd=proj)
    assert proc.returncode == 1 and "LAU001" in proc.stdout and "ck,pt" in proc.stdout
    # launch.mounts refuses them in the schema, with the key's position
    proj2, _ = _project(tmp_path / "two", extra_launch=', mounts: ["/a:b"]')
    proc = run_cli("lint", "r.yaml", cwd=proj2)
    assert proc.returncode == 2 and "launch.mounts" in proc.stdout + proc.stderr
