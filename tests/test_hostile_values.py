"""Hostile values and names (quotes, `$()`, newlines, `{{ }}`, NUL, very long) through compile.

For each value, in each field a user can set as free text, the compile either refuses it
cleanly (exit 1 or 2 with a message naming the field) or emits files where: the Python recipe
parses; every shell script passes `bash -n` and shellcheck; and the value arrives byte-exact
where it is used: in the process environment of the real launchers (run with stub `python`,
`srun`, `scontrol` on PATH that record what they receive), as a `srun` argument, in train.py's
literal and in the Kubernetes manifest. A `$(...)` that runs leaves a marker file: it must not.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

RECIPE = ROOT / "recipes" / "tiny-moe-h100x2.yaml"
NAME = "tiny-moe-h100x2"

VALUES = {
    "single quote": "it's",
    "double quote": 'say "hi"',
    "command substitution": "$(touch {marker})",
    "backticks": "`touch {marker}`",
    "variable": "${{HOME}}/$PATH",
    "newline": "line1\nline2",
    "newline then command": "x\ntouch {marker}",
    "trailing newline": "abc\n",
    "carriage return": "a\rb",
    "jinja": "{{{{ 7*7 }}}}{{% if 1 %}}x{{% endif %}}",
    "backslashes": "C:\\path\\n\\t",
    "semicolon and pipe": "a; touch {marker} | cat & echo",
    "leading dash": "--help",
    "hash": "a #not a comment",
    "percent": "100%j %x",
    "unicode": "héllo – ✓",
    "tab": "a\tb",
    "NUL": "a\x00b",
    "4096 characters": "v" * 4096,
    "too long": "v" * 5000,
}

# Fields that carry free text into the launchers, and how to find the value again.
FIELDS = ["launch.env.MY_VAR", "launch.container", "launch.slurm.partition", "launch.slurm.account",
          "launch.slurm.qos"]

STUB_PYTHON = """#!/usr/bin/env bash
if [[ "${1:-}" == "-" ]]; then cat >/dev/null; exit 0; fi
env -0 > "$DUMP/python.env"
"""
STUB_SRUN = """#!/usr/bin/env bash
n=$(ls "$DUMP" | grep -c 'args$' || true)
printf '%s\\0' "$@" > "$DUMP/srun$n.args"
env -0 > "$DUMP/srun$n.env"
"""
STUB_SCONTROL = """#!/usr/bin/env bash
echo localhost
"""


def _set(field: str, value: str) -> str:
    """`--set` text that YAML reads back as exactly ``value`` (a JSON string is a YAML one)."""
    return f"{field}={json.dumps(value, ensure_ascii=False)}"


def _compile(out: Path, field: str, value: str) -> tuple[int, str]:
    sets = ["launch.targets=[torchrun, slurm, kubernetes]", _set(field, value)]
    import contextlib
    import io

    from mocompile.cli import main
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        code = main(["compile", str(RECIPE), "-o", str(out), *[a for s in sets for a in ("--set", s)]])
    return code, buf.getvalue()


def _env(dump: Path) -> dict[str, str]:
    raw = dump.read_bytes().decode("utf-8", "surrogateescape")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _bin(tmp: Path) -> Path:
    stubs = tmp / "bin"
    stubs.mkdir()
    for name, text in (("python", STUB_PYTHON), ("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    return stubs


def _launch(script: Path, stubs: Path, dump: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "PYTHON": str(stubs / "python"), "DUMP": str(dump),
           "MOCOMPILE_RECIPE_DIR": str(script.parent), "SLURM_NNODES": "1", "SLURM_JOB_ID": "7", "HOME": str(cwd)}
    return subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("label", list(VALUES))
def test_hostile_value_arrives_exactly_or_is_refused(tmp_path, field, label):
    marker = tmp_path / "pwned"
    value = VALUES[label].format(marker=marker)
    out = tmp_path / "out"
    code, text = _compile(out, field, value)
    assert "Traceback" not in text and "internal error" not in text, text
    if code != 0:
        assert code in (1, 2), text
        assert field.split(".")[-1] in text or "LIM006" in text, f"refusal does not name the field:\n{text}"
        assert not (out / NAME).exists()
        return
    folder = out / NAME
    train = (folder / "train.py").read_text()
    tree = ast.parse(train)  # the recipe is valid Python
    scripts = [folder / n for n in ("torchrun.sh", "slurm.sbatch", "preflight.sh")]
    for script in scripts:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", "-s", "bash", *map(str, scripts)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout
    stubs, dump = _bin(tmp_path), tmp_path / "dump"
    dump.mkdir()
    for script in scripts[:2]:
        proc = _launch(script, stubs, dump, tmp_path)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"
    assert not marker.exists(), "a value ran as a shell command"
    manifest = (folder / "trainjob.yaml").read_text()
    from ruamel.yaml import YAML
    job = YAML(typ="safe").load(manifest)
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    srun_args = (dump / "srun1.args").read_bytes().decode("utf-8", "surrogateescape").split("\0")
    if field == "launch.env.MY_VAR":
        assert _env(dump / "python.env")["MY_VAR"] == value  # torchrun.sh's environment
        assert _env(dump / "srun1.env")["MY_VAR"] == value  # slurm.sbatch's environment
        literals = [n for n in ast.walk(tree) if isinstance(n, ast.Dict)]
        assert any(isinstance(k, ast.Constant) and k.value == "MY_VAR" and isinstance(v, ast.Constant)
                   and v.value == value for d in literals for k, v in zip(d.keys, d.values, strict=False)), "train.py"
        assert {"name": "MY_VAR", "value": value} in container["env"]
    elif field == "launch.container":
        assert f"--container-image={value}" in srun_args
        assert container["image"] == value
    else:
        option = {"partition": "--partition", "account": "--account", "qos": "--qos"}[field.split(".")[-1]]
        header = [line for line in (folder / "slurm.sbatch").read_text().splitlines() if line.startswith("#SBATCH")]
        assert f"#SBATCH {option}={value}" in header, "the value must stand whole on its #SBATCH line"


@pytest.mark.parametrize("name", ["MY VAR", "A=B", "$(touch x)", "1ABC", "A;B", "A\nB", "", "A-B", "ä"])
def test_hostile_environment_names_are_refused(tmp_path, name):
    (tmp_path / "r.yaml").write_text("schema: 1\nmodel: tiny-moe\nhardware: {gpu: h100, gpus_per_node: 2}\n"
                                     f"goal: bring-up\nlaunch:\n  env:\n    {json.dumps(name)}: '1'\n")
    proc = run_cli("lint", str(tmp_path / "r.yaml"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "launch.env" in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


def test_hostile_values_through_the_real_command_line(tmp_path):
    """The same path as a user's shell: raw `--set` text, a real process, no stubs in between."""
    marker = tmp_path / "pwned"
    proc = run_cli("compile", str(RECIPE), "-o", str(tmp_path / "out"), "--set",
                   f"launch.env.MY_VAR='$(touch {marker})'", "--set", "launch.container=a\"b'c")
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "out" / NAME / "torchrun.sh"
    stubs, dump = _bin(tmp_path), tmp_path / "dump"
    dump.mkdir()
    assert _launch(script, stubs, dump, tmp_path).returncode == 0
    assert _env(dump / "python.env")["MY_VAR"] == f"$(touch {marker})"
    assert not marker.exists()


@pytest.mark.parametrize("key,value", [("launch.slurm.time", "\u0660"), ("launch.slurm.time", "1\u0663:00"),
                                       ("versions.torch", "\u0662.6.0")])
def test_unicode_digits_are_not_digits(tmp_path, key, value):
    """Schema patterns match ASCII digits only, as JSON Schema does and as the escapers expect: an Arabic-Indic
    zero as a Slurm time limit once passed the schema and stopped the emitter with an internal error."""
    from mocompile.errors import InputError
    from mocompile.pipeline import compile_recipe

    path = tmp_path / "r.yaml"
    path.write_text("schema: 1\nname: r\nmodel: tiny-moe\nhardware: {gpu: h100, nodes: 1, gpus_per_node: 2}\n"
                    "goal: throughput\nlaunch: {targets: [slurm]}\n", encoding="utf-8")
    with pytest.raises(InputError, match=f"`{key}` has an invalid value"):
        compile_recipe(str(path), [f"{key}={value}"])
    res = run_cli("lint", str(path), "--set", f"{key}={value}")
    assert res.returncode == 2 and "[SCHEMA]" in res.stdout + res.stderr and "Traceback" not in res.stderr
