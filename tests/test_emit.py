"""Emitted artifacts: golden files, determinism, escaping, and real shell tools."""

from __future__ import annotations

import ast
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, overrides, recipe_files, run_cli
from mocompile.emit.header import verify
from mocompile.pipeline import compile_recipe

ALL = recipe_files()


def test_generated_folder_is_current():
    """The committed generated/ is the golden output: it must equal a fresh compile."""
    proc = run_cli("check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("recipe", ALL)
def test_compile_is_deterministic(recipe):
    a = compile_recipe(str(ROOT / recipe)).files
    b = compile_recipe(str(ROOT / recipe)).files
    assert a == b and a


@pytest.mark.parametrize("recipe", ALL)
def test_every_file_has_a_verifying_header(recipe):
    files = compile_recipe(str(ROOT / recipe)).files
    for name, text in files.items():
        if name == "hf_config/config.json":
            # a vendored HF config is copied byte for byte (AutoBridge reads it): the lock's sha256 verifies it
            lock = json.loads(files["mocompile.lock.json"])
            assert lock["model_config"]["sha256"] == hashlib.sha256(text.encode()).hexdigest()
            continue
        assert verify(text) is True, name


@pytest.mark.parametrize("recipe", ALL)
def test_python_recipe_parses_and_names_its_decisions(recipe):
    text = compile_recipe(str(ROOT / recipe)).files["train.py"]
    tree = ast.parse(text)
    names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"build_config", "main"} <= names
    assert 'if __name__ == "__main__":' in text
    for line in text.splitlines():
        if line.strip().startswith("model.") and "=" in line:
            assert "  # " in line, line  # every model assignment says why


def _run_on_scripts(recipe: str, tmp_path, tool: list[str]) -> None:
    """Write each emitted shell script and run ``tool`` on it; every run must pass."""
    for name, text in compile_recipe(str(ROOT / recipe)).files.items():
        if name.endswith((".sh", ".sbatch")):
            path = tmp_path / name
            path.write_text(text)
            proc = subprocess.run([*tool, str(path)], capture_output=True, text=True)
            assert proc.returncode == 0, f"{name}: {proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("recipe", ALL)
def test_shell_scripts_pass_bash_n(recipe, tmp_path):
    _run_on_scripts(recipe, tmp_path, ["bash", "-n"])


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (tests/run installs it)")
@pytest.mark.parametrize("recipe", ALL)
def test_shell_scripts_are_shellcheck_clean(recipe, tmp_path):
    _run_on_scripts(recipe, tmp_path, ["shellcheck", "-s", "bash"])


def test_sbatch_directives_come_before_any_command():
    for recipe in ALL:
        files = compile_recipe(str(ROOT / recipe)).files
        if "slurm.sbatch" not in files:
            continue
        seen_command = False
        for line in files["slurm.sbatch"].splitlines()[1:]:
            if line.startswith("#SBATCH"):
                assert not seen_command, recipe
            elif line.strip() and not line.startswith("#"):
                seen_command = True


HOSTILE = "x'\"; $(touch {marker}) `touch {marker}` \\n\n# injected \"\"\"; __import__('os').system('touch {marker}') #"


def test_values_from_yaml_are_escaped_in_shell_and_python(tmp_path):
    """One value with shell, Python-string and docstring payloads, in the environment, the container
    image and the model's display text: it must arrive verbatim where it is data, and run nowhere."""
    marker = tmp_path / "pwned"
    hostile = HOSTILE.format(marker=marker)
    recipe = tmp_path / "hostile.yaml"
    recipe.write_text((ROOT / "recipes" / "tiny-moe-h100x2.yaml").read_text())
    sets = overrides({"launch.container": f"img:1$(touch {marker})", "launch.env": {"MY_VAR": hostile},
                      "launch.slurm.partition": "gpu", "model": {"base": "tiny-moe", "display": hostile}})
    assert any("display" in s for s in sets)
    result = compile_recipe(str(recipe), sets)
    assert not result.errors, result.errors
    files = result.files
    script = tmp_path / "t.sh"
    script.write_text(files["torchrun.sh"])
    # Run the dry run for real: the hostile value must arrive verbatim, and nothing must execute.
    (tmp_path / "train.py").write_bytes(files["train.py"].encode("utf-8"))
    (tmp_path / "preflight.sh").write_text("exit 0\n")
    proc = subprocess.run(["bash", str(script)], env={"MOCOMPILE_DRY_RUN": "1", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    assert f"MY_VAR=x'\"; $(touch {marker}) `touch {marker}` \\n" in proc.stdout
    env_vars = ast.literal_eval(files["train.py"].split("ENV_VARS = ")[1].split("\n")[0])
    assert env_vars["MY_VAR"] == hostile
    # the module from its bytes: the display text stays inside the docstring, no call is added
    tree = ast.parse(files["train.py"].encode("utf-8"))
    doc = ast.get_docstring(tree)
    assert hostile in doc
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Call) and "system" in ast.dump(n.func)]
    proc = subprocess.run([sys.executable, "-B", "-c", "import ast, sys; compile(open(sys.argv[1], 'rb').read(), "
                           "'train.py', 'exec')", str(tmp_path / "train.py")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    job = files["trainjob.yaml"]
    from ruamel.yaml import YAML
    doc = YAML(typ="safe").load(job)
    env = doc["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "MY_VAR", "value": hostile} in env


def test_environment_is_identical_across_launchers():
    from ruamel.yaml import YAML
    files = compile_recipe(str(ROOT / "recipes" / "qwen3-30b-a3b-h100x16-hybridep.yaml")).files

    def exports(text):
        return sorted(line.split("export ", 1)[1] for line in text.splitlines() if line.startswith("export ")
                      and "=" in line and not line.startswith("export PYTHON RECIPE_DIR") and "MASTER" not in line)

    torchrun, slurm = exports(files["torchrun.sh"]), exports(files["slurm.sbatch"])
    assert torchrun == slurm and torchrun
    doc = YAML(typ="safe").load(files["trainjob.yaml"])
    for role in doc["spec"]["pytorchReplicaSpecs"].values():
        env = role["template"]["spec"]["containers"][0]["env"]
        import shlex
        assert sorted(f"{e['name']}={shlex.quote(e['value'])}" for e in env) == torchrun
    lock = json.loads(files["mocompile.lock.json"])
    assert {k: v["value"] for k, v in lock["env"].items()} == {e["name"]: e["value"] for e in env}


def test_lock_records_versions_plan_and_input_hash():
    lock = json.loads(compile_recipe(str(ROOT / "recipes" / "deepseek-v3-h100-deepep.yaml")).files["mocompile.lock.json"])
    assert lock["versions"]["megatron_core"] == "0.19.2"
    assert lock["_generated"]["input"].startswith("sha256:")
    assert lock["settings"]["expert_model_parallel_size"]["value"] == 64
    assert lock["requirements"]["dispatch_import"] == ["deep_ep", "Buffer"]


# --- gradient_accumulation_fusion and Apex (issue 11: found on the first TE run on 4xH100) -------
# Bridge 0.6.2's provider turns gradient_accumulation_fusion on whenever TE imports
# (fusions.can_enable_gradient_accumulation_fusion), but Megatron-Core's output layer is a plain
# ColumnParallelLinear that raises at model build unless Apex's fused_weight_gradient_mlp_cuda
# imports. Every TE variant died with that RuntimeError on the Apex-less host until the recipe said
# versions.apex: none.

def _artifacts(sets: dict) -> dict[str, str]:
    return compile_recipe(str(ROOT / "recipes/tiny-moe-h100x2.yaml"), overrides(sets)).files


def test_te_without_apex_turns_the_fusion_off_and_skips_the_apex_preflight():
    files = _artifacts({"versions.transformer_engine": "2.12.0", "versions.apex": "none"})
    assert "gradient_accumulation_fusion=False,  # no Apex" in files["train.py"]
    assert "NEEDS_APEX = False" in files["preflight.sh"]
    assert "RUN011" not in files["preflight.sh"].split("set -euo pipefail")[0]


def test_te_with_apex_keeps_the_fusion_and_preflight_checks_apex_imports():
    files = _artifacts({"versions.transformer_engine": "2.12.0", "versions.apex": "present"})
    assert "gradient_accumulation_fusion" not in files["train.py"]  # the provider's default: on
    assert "NEEDS_APEX = True" in files["preflight.sh"]
    assert "import fused_weight_gradient_mlp_cuda" in files["preflight.sh"]


def test_without_te_the_fusion_is_off_whatever_apex_says():
    for apex in ("present", "none"):
        files = _artifacts({"versions.transformer_engine": "none", "versions.apex": apex})
        assert "gradient_accumulation_fusion=False,  # no Transformer Engine" in files["train.py"]
        assert "NEEDS_APEX = False" in files["preflight.sh"]


def test_apex_preflight_fails_with_run011_where_apex_is_missing(tmp_path):
    """Run the emitted preflight for real on this machine, which has torch and no Apex and no TE."""
    files = _artifacts({"versions.transformer_engine": "2.12.0", "versions.apex": "present"})
    script = tmp_path / "preflight.sh"
    script.write_text(files["preflight.sh"])
    import sys
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert proc.returncode != 0
    assert "RUN011" in proc.stderr and "versions.apex: none" in proc.stderr


# training.optimizer: muon builds Megatron-Core's layer-wise Muon as Bridge's Kimi-K2 recipes do.

def test_muon_emits_dist_muon_on_plain_ddp_and_a_preflight_for_emerging_optimizers():
    files = _artifacts({"training.optimizer": "muon"})
    train = files["train.py"]
    assert 'optimizer="dist_muon"' in train and 'muon_scalar_optimizer="adam"' in train
    assert "use_distributed_optimizer=False," in train and '    optimizer="adam"' not in train
    assert "overlap_param_gather=False" in train
    assert "RUN012" in files["preflight.sh"] and "emerging-optimizers" in files["preflight.sh"]
    assert json.loads(files["mocompile.lock.json"])["requirements"]["emerging_optimizers"] == "0.2.0"


def test_adam_is_the_default_and_has_no_muon_preflight():
    files = _artifacts({})
    assert 'optimizer="adam"' in files["train.py"] and "dist_muon" not in files["train.py"]
    assert "RUN012" not in files["preflight.sh"]
    assert "emerging_optimizers" not in json.loads(files["mocompile.lock.json"])["requirements"]


def test_muon_preflight_fails_with_run012_without_emerging_optimizers(tmp_path):
    """This machine has torch and no emerging-optimizers."""
    files = _artifacts({"training.optimizer": "muon"})
    script = tmp_path / "preflight.sh"
    script.write_text(files["preflight.sh"])
    import sys
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable})
    assert proc.returncode != 0
    assert "RUN012" in proc.stderr and "training.optimizer: adam" in proc.stderr


# RUN014: a catalogue model's Bridge recipe reads its Hugging Face config at start-up on every rank.

def _qwen_preflight(tmp_path: Path) -> Path:
    files = compile_recipe(str(ROOT / "recipes/qwen3-30b-a3b-h100x8-fit.yaml"), []).files
    script = tmp_path / "preflight.sh"
    script.write_text(files["preflight.sh"])
    return script


def _run14(script: Path, **env: str) -> list[str]:
    import sys
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, **env})
    return [ln for ln in (proc.stdout + proc.stderr).splitlines() if "RUN014" in ln]


def test_preflight_run014_fails_offline_without_the_models_config_in_the_hf_cache(tmp_path):
    script = _qwen_preflight(tmp_path)
    [line] = _run14(script, HF_HUB_CACHE=str(tmp_path / "empty"), HF_HUB_OFFLINE="1")
    assert "Qwen/Qwen3-30B-A3B's config.json is not in the HF cache" in line and "huggingface-cli download" in line


def test_preflight_run014_passes_with_the_config_cached(tmp_path):
    script = _qwen_preflight(tmp_path)
    snap = tmp_path / "hub" / "models--Qwen--Qwen3-30B-A3B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    [line] = _run14(script, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    assert line.startswith("preflight: RUN014 config of Qwen/Qwen3-30B-A3B found in the HF cache")


def test_preflight_run014_fails_when_the_hub_does_not_answer(tmp_path):
    import socket
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = _qwen_preflight(tmp_path)
    [line] = _run14(script, HF_HUB_CACHE=str(tmp_path / "empty"), HF_ENDPOINT=f"http://127.0.0.1:{port}")
    assert f"http://127.0.0.1:{port} does not answer" in line


def test_custom_models_need_no_hub_and_get_no_run014():
    files = _artifacts({})
    assert "RUN014" not in files["preflight.sh"]


# training.deterministic: what Bridge's apply_determinism_overrides sets, and nothing when it is off.

def test_deterministic_mode_emits_bridges_determinism_overrides():
    files = _artifacts({"training.deterministic": True, "versions.transformer_engine": "2.12.0"})
    train, launch = files["train.py"], files["torchrun.sh"]
    assert "model.deterministic_mode = True" in train
    assert "model.cross_entropy_loss_fusion = False  # goal: training.deterministic" in train
    for line in ("export CUBLAS_WORKSPACE_CONFIG=:4096:8", "export NCCL_ALGO=Ring",
                 "export NVTE_ALLOW_NONDETERMINISTIC_ALGO=0"):
        assert line in launch
    lock = json.loads(files["mocompile.lock.json"])
    assert lock["settings"]["deterministic_mode"]["value"] is True
    assert lock["env"]["NCCL_ALGO"]["reason"].startswith("training.deterministic")


def test_without_deterministic_mode_nothing_of_it_is_emitted():
    files = _artifacts({"versions.transformer_engine": "2.12.0"})
    assert "model.deterministic_mode = False" in files["train.py"]
    assert "NCCL_ALGO" not in files["torchrun.sh"] and "CUBLAS_WORKSPACE_CONFIG" not in files["torchrun.sh"]
