"""Hostile file names and string values must never become code in what mocompile writes.

A recipe is untrusted: its file name, and every string in it that reaches a generated file
(model display text, environment values, container image, data, tokenizer, checkpoint and
logging paths, W&B fields). Hypothesis builds them from injection fragments (newlines, `$()`,
backquotes, quotes, triple quotes, `\\N`, encoding declarations, terminal escapes, bidi
overrides, Jinja syntax) mixed with arbitrary text, writes the recipe under that file name
in a sandbox project, and compiles it. When the compile succeeds, in that sandbox:

- every generated Python file declares no encoding but UTF-8 and compiles from its *bytes*
  (what the interpreter reads), and the calls in the AST parsed from those bytes are a
  subset of the calls mocompile's own committed ``generated/*/train.py`` make;
- ``bash -n`` accepts every shell script; ``torchrun.sh`` and ``slurm.sbatch`` run their
  ``MOCOMPILE_DRY_RUN=1`` path (real preflight Python, stub ``srun``/``scontrol``), the
  Kubernetes container's command runs under ``bash -c``, and ``train.py`` is imported with
  the Megatron/torch stack stubbed;
- no payload ran: the marker file every payload would create does not exist.

A compile that refuses must do so with exit 1 or 2 and no traceback.
CI draws ``CI_COUNTS["injection"]`` inputs; ``MOCOMPILE_FUZZ_EXAMPLES=100000`` is the nightly size.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import subprocess
import sys
import tokenize
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .harness import ROOT, examples, nightly, stats

MARK = "@MARK@"  # replaced by the sandbox's marker path
FRAGMENTS = [
    "\n", "\r", "\r\n", "\x1b[31m", "\u202e", "\u2028", "\x0c", "\x0b", "\x85", "#", "'", '"', '"""', "'''",
    "\\", "\\N", "\\N{", "\\x", "$", "`", ";", "&", "|", "{{ 7*7 }}", "{% if 1 %}", "%", "${HOME}",
    f"$(touch {MARK})", f"`touch {MARK}`", f"\ntouch {MARK}\n", f"'; touch {MARK}; '", f'"; touch {MARK}; "',
    f'"""; __import__("os").system("touch {MARK}"); """', f"'); __import__('os').system('touch {MARK}'); ('",
    f"\n__import__('os').system('touch {MARK}')\n", "# -*- coding: shift_jis -*-", " coding=shift_jis ",
    "coding: latin-1", "\u00e9", "\u30a2", "\u5b57", "\x81", "\x00", " ",
]
# Text for values: fragments mixed with arbitrary characters.
VALUE = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=6)), min_size=1, max_size=6).map("".join)
# File names: the same, minus what no file system stores ('/', NUL), capped below NAME_MAX.
STEM = VALUE.map(lambda s: s.replace("/", "_").replace("\x00", "_")).filter(
    lambda s: s not in ("", ".", "..") and len(s.encode("utf-8")) <= 200)

# Where each drawn value goes in the recipe (dotted path) - every free-text field that compiles.
FIELDS = ["model.display", "launch.env.MY_VAR", "launch.container", "checkpoint.save", "logging.tensorboard",
          "logging.wandb.project", "logging.wandb.name", "logging.wandb.entity", "training.data.cache",
          "tokenizer.path"]

BASE = {
    "schema": 1, "name": "inj", "model": {"base": "tiny-moe"}, "hardware": {"gpu": "h100", "gpus_per_node": 2},
    "goal": "bring-up", "launch": {"targets": ["torchrun", "slurm", "kubernetes"]},
}

STUB_SRUN = '#!/usr/bin/env bash\nwhile [[ "${1:-}" == -* ]]; do shift; done\nexec "$@"\n'
STUB_SCONTROL = "#!/usr/bin/env bash\necho localhost\n"
# train.py imported with the stack stubbed: every megatron/torch module is a stand-in whose
# attributes are callables returning stand-ins; importing runs the module body, not main().
IMPORT_STUBBED = r"""
import importlib.abc, importlib.machinery, sys, types
class Any:
    def __init__(self, *a, **k): pass
    def __call__(self, *a, **k): return Any()
    def __getattr__(self, name): return Any()
    def __mro_entries__(self, bases): return (object,)
class Stub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("megatron", "torch", "transformer_engine", "deep_ep"):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
    def create_module(self, spec):
        m = types.ModuleType(spec.name); m.__path__ = []; m.__getattr__ = lambda n: Any(); return m
    def exec_module(self, module): pass
sys.meta_path.insert(0, Stub())
sys.path.insert(0, sys.argv[1])
import train
"""


def _allowed_calls() -> set[str]:
    """Every call name the committed generated train.py files make (parsed from bytes)."""
    names: set[str] = set()
    for path in (ROOT / "generated").glob("*/train.py"):
        names |= _calls(ast.parse(path.read_bytes()))
    return names


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return f"<{type(node).__name__}>"


def _calls(tree: ast.AST) -> set[str]:
    return {_dotted(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}


ALLOWED = _allowed_calls()


def _put(data: dict, dotted: str, value: str) -> None:
    *path, last = dotted.split(".")
    node = data
    for key in path:
        node = node.setdefault(key, {})
    node[last] = value


def _check_python(path: Path) -> None:
    data = path.read_bytes()
    encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    assert encoding in ("utf-8", "utf-8-sig"), f"{path.name} declares encoding {encoding}"
    compile(data, str(path), "exec", dont_inherit=True)  # the bytes, as the interpreter reads them
    extra = _calls(ast.parse(data)) - ALLOWED
    assert not extra, f"{path.name} gained calls {sorted(extra)}"


def _run_outputs(sandbox: Path, folder: Path, marker: Path) -> None:
    stubs = sandbox / "bin"
    stubs.mkdir(exist_ok=True)
    for name, text in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL)):
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "PYTHON": sys.executable, "HOME": str(sandbox),
           "MOCOMPILE_DRY_RUN": "1", "MOCOMPILE_RECIPE_DIR": str(folder), "SLURM_NNODES": "1",
           "SLURM_NODEID": "0", "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "n0"}
    scripts = sorted(p for p in folder.iterdir() if p.suffix in (".sh", ".sbatch"))
    for script in scripts:
        proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{script.name}: {proc.stderr}"
    for script in ("torchrun.sh", "slurm.sbatch"):
        proc = subprocess.run(["bash", str(folder / script)], cwd=sandbox, env=env, capture_output=True,
                              timeout=120)
        assert proc.returncode == 0, f"{script} dry run: {proc.stderr[-2000:]!r}"
    from ruamel.yaml import YAML
    job = YAML(typ="safe").load((folder / "trainjob.yaml").read_text(encoding="utf-8"))
    container = job["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["bash", "-c"]
    # the pod's command line, from the project root, with the interpreter's name pointing at a stub
    (stubs / "python3").write_text("#!/usr/bin/env bash\nexit 0\n")
    (stubs / "python3").chmod(0o755)
    proc = subprocess.run(["bash", "-c", container["args"][0]], cwd=sandbox, env={**env, "PYTHON": "python3"},
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, f"trainjob command: {proc.stderr[-2000:]!r}"
    proc = subprocess.run([sys.executable, "-B", "-c", IMPORT_STUBBED, str(folder)], cwd=sandbox, capture_output=True,
                          timeout=120, env={"PATH": env["PATH"], "HOME": str(sandbox)})
    assert proc.returncode == 0, f"import train.py: {proc.stderr[-2000:]!r}"
    assert not marker.exists(), "a hostile value ran as code"


def _one(sandbox: Path, stem: str, assignments: list[tuple[str, str]]) -> str:
    from mocompile.cli import main

    marker = sandbox / "pwned"
    recipe = BASE | {"model": {"base": "tiny-moe"}, "launch": dict(BASE["launch"])}
    for field, value in assignments:
        _put(recipe, field, value.replace(MARK, str(marker)))
    (sandbox / "recipes").mkdir(parents=True, exist_ok=True)
    path = sandbox / "recipes" / f"{stem.replace(MARK, str(marker).replace('/', '_'))}.yaml"
    path.write_text(json.dumps(recipe, ensure_ascii=True), encoding="utf-8")  # JSON is YAML
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), contextlib.chdir(sandbox):
        code = main(["compile", str(path.relative_to(sandbox))])
    text = out.getvalue()
    assert "Traceback" not in text and "internal error" not in text, text
    assert code in (0, 1, 2), text
    if code:
        return "refused"
    folder = sandbox / "generated" / "inj"
    for py in folder.glob("*.py"):
        _check_python(py)
    _run_outputs(sandbox, folder, marker)
    # check certifies what compile wrote, and only that
    report = io.StringIO()
    with contextlib.redirect_stdout(report), contextlib.chdir(sandbox):
        assert main(["check", str(path.relative_to(sandbox))]) == 0, report.getvalue()
    return "emitted"


def test_the_call_allow_list_is_not_empty_and_excludes_the_payloads():
    assert {"build_config", "GPTModelProvider"} & ALLOWED
    assert not {"__import__", "exec", "eval", "os.system", "compile", "__import__.system"} & ALLOWED


@settings(max_examples=examples("injection"), deadline=None, derandomize=not nightly(),
          suppress_health_check=list(HealthCheck), database=None)
@given(stem=STEM, values=st.lists(st.tuples(st.sampled_from(FIELDS), VALUE), min_size=1, max_size=4))
def test_hostile_names_and_values_never_become_code(tmp_path_factory, stem, values):
    sandbox = tmp_path_factory.mktemp("inj")
    (sandbox / "pyproject.toml").write_text("")  # the sandbox is the project root
    outcome = _one(sandbox, stem, values)
    stat = stats("injection")
    stat.add(outcome, 0.0, 0.0, stem)
    stat.note = "each emitted input: Python compiled from bytes, launchers dry-run, train.py imported; 0 markers"


# The reproductions from the report, pinned (hypothesis may or may not draw them on a given run).
REPRODUCTIONS = [
    ('x\ntouch "$(printf \'\\057tmp\\057pwned\')" #', []),  # newline in the file name
    (f"x\ntouch {MARK} #", []),
    ("x coding=shift_jis y", [("launch.env.MY_VAR", "\x81\\'; __import__('os').system('touch " + MARK + "') #")]),
    ("# -*- coding: latin-1 -*-", [("model.display", "\u00e9")]),
    ("x", [("model.display", f'x"""; __import__("os").system("touch {MARK}"); """')]),
    ("x", [("model.display", "\\N")]),
    ("x", [("model.display", "\x1b[2J\u202e\r\n")]),
]


def test_the_reported_reproductions_are_inert(tmp_path):
    for i, (stem, values) in enumerate(REPRODUCTIONS):
        sandbox = tmp_path / str(i)
        sandbox.mkdir()
        (sandbox / "pyproject.toml").write_text("")
        assert _one(sandbox, stem, values) == "emitted", (stem, values)
        header = (sandbox / "generated" / "inj" / "torchrun.sh").read_text(encoding="utf-8").splitlines()[2]
        assert header.startswith("# mocompile: source recipes/") and "\n" not in header
