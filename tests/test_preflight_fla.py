"""Preflight RUN017: a hybrid model's Gated DeltaNet layers need fla, whose gated delta rule backward
(fla/ops/common/chunk_o.py chunk_bwd_dqkwg) raises on Hopper with Triton >= 3.4 and < 3.7.1 (fla issue 640).
The check is emitted for hybrid models only; its logic runs here against a fake fla and a fake torch whose
GPU capability the test sets, as the RUN015/RUN016 tests run the preflight against fake packages."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT
from mocompile.pipeline import compile_recipe

HYBRID = "schema: 1\nmodel: qwen3-next-80b-a3b\nhardware: {gpu: h100, nodes: 4, gpus_per_node: 8}\ngoal: bring-up\n"

# fla 0.5.2's guard, word for word (fla/ops/common/chunk_o.py chunk_bwd_dqkwg), behind its @dispatch('common')
GUARDED = '''from fla.ops.backends import dispatch
from fla.utils import IS_NVIDIA_HOPPER, TRITON_ABOVE_3_4_0, TRITON_ABOVE_3_7_1


@dispatch('common')
def chunk_bwd_dqkwg(q, k, v, do, h, dh, w=None, g=None, g_gamma=None, dv=None, scale=None):
    if g is not None and IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1:
        raise RuntimeError("Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results (see #640)")
    return q, k, g
'''
UNGUARDED = "def chunk_bwd_dqkwg(q, k, v, do, h, dh, w=None, g=None):\n    return q, k, g\n"

# a stand-in for fla/ops/backends/__init__.py: a registry per operation, each backend available or not
BACKENDS = '''import os

_DISPATCH_DISABLED = os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") == "1"


class BackendRegistry:
    _registries = {}

    def __init__(self, operation):
        self.backends = []
        BackendRegistry._registries[operation] = self

    @classmethod
    def ensure_initialized(cls, operation):
        __import__(f"fla.ops.{operation}.backends")

    def _get_sorted_backends(self):
        return list(self.backends)


def dispatch(operation):
    return lambda func: func
'''
TILELANG = '''from fla.ops.backends import BackendRegistry


class TileLangBackend:
    backend_type = "tilelang"

    @classmethod
    def is_available(cls):
        return {available!r}

    @classmethod
    def is_enabled(cls):
        return True

    def chunk_bwd_dqkwg(self, *args, **kwargs):
        pass


BackendRegistry("common").backends.append(TileLangBackend())
'''


def fake_site(path: Path, chunk_o: str | None = GUARDED, triton_371: bool = False,
              tilelang: bool | None = None) -> Path:
    """PYTHONPATH folder: a torch whose GPU (FAKE_CUDA_CAP=major.minor, none when unset) the test picks, a
    Triton 3.5.1, and an fla whose flags are computed as fla's own fla/utils (Hopper: capability 9) with
    TRITON_ABOVE_3_7_1 as given. chunk_o None: an fla that fails to import. tilelang: a TileLang backend
    registered for 'common', available or not."""
    def write(rel: str, text: str) -> None:
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)

    write("torch/__init__.py", "__version__ = '2.11.0'\nfrom . import cuda\n")
    write("torch/cuda.py", "import os\n\n\ndef is_available():\n    return bool(os.environ.get('FAKE_CUDA_CAP'))\n\n\n"
                           "def get_device_capability(index=0):\n"
                           "    return tuple(int(x) for x in os.environ['FAKE_CUDA_CAP'].split('.'))\n")
    write("triton/__init__.py", "__version__ = '3.5.1'\n")
    if chunk_o is None:
        write("fla/__init__.py", "raise ImportError('fake: fla is broken')\n")
        return path
    write("fla/__init__.py", "__version__ = '0.5.2'\n")
    write("fla/utils.py", "import torch\n\nIS_NVIDIA_HOPPER = torch.cuda.is_available() and "
                          "torch.cuda.get_device_capability()[0] == 9\nTRITON_ABOVE_3_4_0 = True\n"
                          f"TRITON_ABOVE_3_7_1 = {triton_371!r}\n")
    write("fla/modules/__init__.py", "")
    write("fla/modules/convolution.py", "def causal_conv1d(*args, **kwargs):\n    pass\n")
    write("fla/modules/l2norm.py", "def l2norm(x):\n    return x\n")
    write("fla/ops/__init__.py", "")
    write("fla/ops/backends/__init__.py", BACKENDS)
    write("fla/ops/common/__init__.py", "")
    write("fla/ops/common/chunk_o.py", chunk_o)
    write("fla/ops/common/backends/__init__.py",
          TILELANG.format(available=tilelang) if tilelang is not None else "")
    write("fla/ops/gated_delta_rule/__init__.py", "from fla.ops.common.chunk_o import chunk_bwd_dqkwg  # noqa\n\n\n"
                                                  "def chunk_gated_delta_rule(*args, **kwargs):\n    pass\n")
    return path


def _files(tmp_path: Path, recipe: str = HYBRID) -> dict[str, str]:
    path = tmp_path / "r.yaml"
    path.write_text(recipe)
    return compile_recipe(str(path), []).files


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("hybrid")
    out = tmp / "preflight.sh"
    out.write_text(_files(tmp)["preflight.sh"])
    return out


def _run17(script: Path, site: Path | None, **env: str) -> tuple[list[str], list[str]]:
    """The RUN017 lines of stdout (reports) and stderr (failures); the other checks fail here as they may."""
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "HF_HUB_OFFLINE": "1",
                               **({"PYTHONPATH": str(site)} if site else {}), **env})
    assert "Traceback" not in proc.stderr, proc.stderr
    return ([ln for ln in proc.stdout.splitlines() if "RUN017" in ln],
            [ln for ln in proc.stderr.splitlines() if "RUN017" in ln])


def test_the_check_is_emitted_for_a_hybrid_model(tmp_path):
    files = _files(tmp_path)
    head = files["preflight.sh"].split("set -euo pipefail")[0]
    assert "RUN017" in head and "MOCOMPILE_SKIP_FLA_CHECK" in files["preflight.sh"]
    # Qwen3-Next: 48 layers, every 4th full attention (memory.full_attention_layers), the rest Gated DeltaNet
    assert json.loads(files["mocompile.lock.json"])["requirements"]["gated_delta_net_layers"] == 36


def test_the_hybrid_preflight_is_valid_bash_and_python(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        proc = subprocess.run(["shellcheck", "-s", "bash", str(script)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    ast.parse(script.read_text().split("<<'PREFLIGHT'\n", 1)[1].rsplit("\nPREFLIGHT", 1)[0])


@pytest.mark.parametrize("recipe", ["tiny-moe-h100x2.yaml", "qwen3-30b-a3b-h100x8-fit.yaml"])
def test_the_check_is_not_emitted_for_a_model_without_gated_deltanet(recipe):
    files = compile_recipe(str(ROOT / "recipes" / recipe), []).files
    assert "RUN017" not in files["preflight.sh"] and "fla" not in files["preflight.sh"]
    assert "gated_delta_net_layers" not in json.loads(files["mocompile.lock.json"])["requirements"]


def test_hopper_with_a_triton_below_3_7_1_fails_with_run017(script, tmp_path):
    out, err = _run17(script, fake_site(tmp_path / "site"), FAKE_CUDA_CAP="9.0")
    assert len(err) == 1 and not out, (out, err)
    assert err[0].startswith("preflight: RUN017 fla refuses the gated delta rule's backward here (compute "
                             "capability 9.0, Triton 3.5.1, fla 0.5.2): chunk_bwd_dqkwg in fla/ops/common/chunk_o.py")
    assert "g is not None and IS_NVIDIA_HOPPER and TRITON_ABOVE_3_4_0 and not TRITON_ABOVE_3_7_1" in err[0]
    assert "fla issue 640" in err[0] and "Triton >= 3.7.1" in err[0] and "tilelang" in err[0]


@pytest.mark.parametrize("cap,triton_371", [("9.0", True), ("10.0", False), ("8.0", False)])
def test_a_newer_triton_or_another_gpu_passes(script, tmp_path, cap, triton_371):
    out, err = _run17(script, fake_site(tmp_path / "site", triton_371=triton_371), FAKE_CUDA_CAP=cap)
    assert not err and out == [f"preflight: RUN017 fla imports; its guard does not refuse this GPU (compute "
                               f"capability {cap}, Triton 3.5.1, fla 0.5.2)"], (out, err)


def test_an_fla_without_the_guard_passes(script, tmp_path):
    out, err = _run17(script, fake_site(tmp_path / "site", chunk_o=UNGUARDED), FAKE_CUDA_CAP="9.0")
    assert not err and len(out) == 1 and "has no Triton/Hopper guard" in out[0], (out, err)


@pytest.mark.parametrize("available", [True, False])
def test_fla_dispatching_to_an_available_backend_passes(script, tmp_path, available):
    """fla's @dispatch('common') hands chunk_bwd_dqkwg to its TileLang backend where tilelang and nvcc are installed:
    the Triton guard then never runs."""
    out, err = _run17(script, fake_site(tmp_path / "site", tilelang=available), FAKE_CUDA_CAP="9.0")
    if available:
        assert not err and len(out) == 1 and "fla's tilelang backend takes the call" in out[0], (out, err)
    else:
        assert len(err) == 1 and "RUN017 fla refuses" in err[0], (out, err)
    out, err = _run17(script, fake_site(tmp_path / "site", tilelang=available), FAKE_CUDA_CAP="9.0",
                      FLA_DISABLE_BACKEND_DISPATCH="1")  # fla then calls the Triton kernel itself
    assert len(err) == 1 and "RUN017 fla refuses" in err[0], (out, err)


def test_an_fla_that_does_not_import_fails_with_run017(script, tmp_path):
    out, err = _run17(script, fake_site(tmp_path / "site", chunk_o=None), FAKE_CUDA_CAP="9.0")
    assert len(err) == 1 and err[0].startswith("preflight: RUN017 fla does not import (ImportError: fake: fla is broken)")
    assert "megatron/core/ssm/gated_delta_net/common.py" in err[0]


def test_without_a_gpu_only_the_package_is_checked(script, tmp_path):
    out, err = _run17(script, fake_site(tmp_path / "site"))
    assert not err and out == ["preflight: RUN017 skipped (no CUDA device visible; fla's Hopper guard depends on "
                               "the GPU)"], (out, err)
    bare = tmp_path / "bare"  # this environment has no fla: nothing for Megatron-Core's GDN layers
    bare.mkdir()
    out, err = _run17(script, bare)
    assert len(err) == 1 and err[0].startswith("preflight: RUN017 fla is not installed; pip install fla-core")


def test_the_escape_hatch_skips_the_check(script, tmp_path):
    out, err = _run17(script, fake_site(tmp_path / "site"), FAKE_CUDA_CAP="9.0", MOCOMPILE_SKIP_FLA_CHECK="1")
    assert not err and out == ["preflight: RUN017 skipped (MOCOMPILE_SKIP_FLA_CHECK=1)"]


def test_a_guard_it_cannot_evaluate_is_reported_not_failed(script, tmp_path):
    """A condition that calls a function is not evaluated (the check runs nothing of fla but its import)."""
    odd = GUARDED.replace("if g is not None and IS_NVIDIA_HOPPER", "if g is not None and bool(IS_NVIDIA_HOPPER)")
    out, err = _run17(script, fake_site(tmp_path / "site", chunk_o=odd), FAKE_CUDA_CAP="9.0")
    assert not err and len(out) == 1 and "is not evaluated here" in out[0], (out, err)
