"""What the generated launchers do when run, stated as behaviour (not compared with committed text).

torchrun.sh is run for real with bash; the Python it starts is a stand-in that runs the preflight's
checks with the real interpreter and fake runtime packages, and records the torch.distributed.run
command line instead of training. Each test says which launcher line it holds to account, so a
launcher that loses the line fails here even when generated/ is recompiled from the changed template.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from test_slurm import fake_site

GEN = ROOT / "generated" / "tiny-moe-h100x2"


def _standin(tmp_path: Path) -> tuple[Path, Path]:
    """A PYTHON for the launcher: `-m torch.distributed.run ...` is recorded (one JSON argv per line) and
    answered with exit 0; anything else (the preflight's checks) runs in the real interpreter."""
    record = tmp_path / "launched.jsonl"
    script = tmp_path / "python-standin"
    script.write_text(f"""#!/bin/sh
if [ "$1" = "-m" ] && [ "$2" = "torch.distributed.run" ]; then
  {shlex.quote(sys.executable)} -c 'import json, sys; open(sys.argv[1], "a").write(json.dumps(sys.argv[2:]) + "\\n")' \\
    {shlex.quote(str(record))} "$@"
  exit 0
fi
exec {shlex.quote(sys.executable)} "$@"
""")
    script.chmod(0o755)
    return script, record


def _run(tmp_path: Path, env: dict[str, str], torch: str | None = "2.11.0") -> tuple[subprocess.CompletedProcess, Path]:
    python, record = _standin(tmp_path)
    site = fake_site(tmp_path / "site", torch=torch)
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
            "PYTHON": str(python), "PYTHONPATH": str(site)}
    proc = subprocess.run(["bash", str(GEN / "torchrun.sh")], env={**base, **env}, capture_output=True, text=True,
                          timeout=60)
    return proc, record


def _launched(record: Path) -> list[list[str]]:
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_a_failed_preflight_stops_torchrun_sh_before_training(tmp_path):
    """`set -euo pipefail` and the preflight line before `exec`: with torch missing the preflight fails
    with RUN001, the launcher exits with its code, and torch.distributed.run is never started."""
    proc, record = _run(tmp_path, {}, torch=None)
    assert proc.returncode != 0 and "RUN001" in proc.stdout + proc.stderr
    assert _launched(record) == []


def test_a_real_launch_runs_the_preflight_then_torchrun_with_the_rendezvous_it_was_given(tmp_path):
    """The command line torchrun.sh execs: nodes, rank, processes per node, the master address and port
    taken from the environment (multi-node jobs set them), and this folder's train.py."""
    proc, record = _run(tmp_path, {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.7",
                                   "MASTER_PORT": "29611"})
    assert proc.returncode == 0, proc.stderr
    assert "preflight: ok" in proc.stdout
    gpus = json.loads((GEN / "mocompile.lock.json").read_text())["hardware"]["gpus_per_node"]
    assert _launched(record) == [["-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1",
                                  "--nproc-per-node", str(gpus), "--master-addr", "10.0.0.7", "--master-port", "29611",
                                  str(GEN / "train.py")]]


def test_the_dry_run_prints_the_exact_command_shell_quoted_and_starts_nothing(tmp_path):
    proc, record = _run(tmp_path, {"MOCOMPILE_DRY_RUN": "1", "MASTER_PORT": "29612"})
    assert proc.returncode == 0 and _launched(record) == []
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("command:"))
    argv = shlex.split(line[len("command:"):])
    assert argv[1:3] == ["-m", "torch.distributed.run"] and argv[-1] == str(GEN / "train.py")
    assert argv[argv.index("--master-port") + 1] == "29612"


def test_slurm_asks_for_whole_nodes():
    """`#SBATCH --exclusive`: a training job shares no node (another job's kernels on the same GPUs or NICs
    would skew every step, and NCCL assumes it owns the NVLink fabric)."""
    for path in (ROOT / "generated").glob("*/slurm.sbatch"):
        assert re.search(r"^#SBATCH --exclusive$", path.read_text(), re.M), path


def test_the_kubernetes_container_runs_its_args_as_one_shell_command():
    """`command: ["bash", "-c"]`: the single args entry chains the preflight and torchrun with `&&`, which
    only a shell understands; without it the container would try to exec that whole string as a file."""
    from ruamel.yaml import YAML

    for path in (ROOT / "generated").glob("*/trainjob.yaml"):
        job = YAML(typ="safe").load(path.read_text())
        for spec in job["spec"]["pytorchReplicaSpecs"].values():
            container = spec["template"]["spec"]["containers"][0]
            assert container["command"] == ["bash", "-c"], path
            assert len(container["args"]) == 1 and " && exec " in container["args"][0]


# ---------------------------------------------------------------- train.py, read from its bytes
def _build_config(path: Path) -> ast.FunctionDef:
    tree = ast.parse(path.read_bytes())
    return next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "build_config")


@pytest.mark.parametrize("train", sorted((ROOT / "generated").glob("*/train.py")), ids=lambda p: p.parent.name)
def test_build_config_checks_the_plan_last_and_seeds_from_the_recipe(train):
    """build_config() ends by calling check_plan(cfg) (a silent fallback by Bridge's helpers stops the job
    instead of training another plan) and returns cfg; the RNG seed is the recipe's `training.seed`."""
    fn = _build_config(train)
    *_, check, ret = fn.body
    assert isinstance(ret, ast.Return) and isinstance(ret.value, ast.Name) and ret.value.id == "cfg"
    call = check.value if isinstance(check, ast.Expr) else None
    assert isinstance(call, ast.Call) and getattr(call.func, "id", None) == "check_plan", ast.dump(check)
    lock = json.loads((train.parent / "mocompile.lock.json").read_text())
    seeds = [kw.value for n in ast.walk(fn) if isinstance(n, ast.Call) for kw in n.keywords if kw.arg == "random_seed"]
    # on a Bridge recipe config the field is assigned: cfg.dataset.random_seed = <seed>
    seeds += [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Attribute) and t.attr == "random_seed"]
    assert len(seeds) == 1 and ast.literal_eval(seeds[0]) == lock["settings"]["seed"]["value"]


@pytest.mark.parametrize("train", sorted((ROOT / "generated").glob("*/train.py")), ids=lambda p: p.parent.name)
def test_every_name_train_py_uses_is_defined_or_imported(train):
    """A Bridge class used but no longer imported (e.g. TokenizerConfig, forward_step) is a NameError only
    when that code path runs on the GPUs: every load of a free name must have a binding in the module or
    in the function that loads it, or be a builtin."""
    import builtins

    tree = ast.parse(train.read_bytes())
    module_names = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names} | {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))} \
        | {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
           for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)} \
        | {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments)
           for a in n.posonlyargs + n.args + n.kwonlyargs + [x for x in (n.vararg, n.kwarg) if x is not None]} \
        | {n.name for n in ast.walk(tree) if isinstance(n, ast.ExceptHandler) and n.name} \
        | {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    loads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    module_globals = {"__file__"}  # set by the import system for every module (the vendored-config hook reads it)
    assert loads - module_names - module_globals - set(dir(builtins)) == set()
