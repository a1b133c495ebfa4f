"""Launch scripts on a real Slurm (slurm-wlm + munge on this machine) and their preflight.

The session fixture starts a small cluster with tests/ecosystem/slurm_up.sh: this host and a second
real slurmd (``vnode1``) on it, plus configuration-only nodes so that ``sbatch --test-only`` can
judge requests for up to 256 nodes. Everything is torn down after the session.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

GENERATED = sorted((ROOT / "generated").glob("*/slurm.sbatch"))
PREFLIGHTS = sorted((ROOT / "generated").glob("*/preflight.sh"))
SLURM_UP = ROOT / "tests" / "ecosystem" / "slurm_up.sh"


def _directive(text: str, name: str) -> str | None:
    m = re.search(rf"^#SBATCH --{name}=(\S+)$", text, re.M)
    return m.group(1) if m else None


# --------------------------------------------------------------------------------------------------
# fake runtime packages: just enough for the preflight's imports and version checks
# --------------------------------------------------------------------------------------------------
# FAKE_HYBRIDEP=segv|raise|ok decides what constructing the buffer does; FAKE_HYBRIDEP_ARGS names a file that
# receives the constructor's arguments and the child's HybridEP environment.
FAKE_HYBRIDEP = """import json, os, signal


class HybridEPBuffer:
    def __init__(self, **kwargs):
        if os.environ.get("FAKE_HYBRIDEP_ARGS"):
            kwargs.pop("group", None)
            kwargs["ranks_per_domain"] = os.environ.get("NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN")
            with open(os.environ["FAKE_HYBRIDEP_ARGS"], "w") as fh:
                json.dump(kwargs, fh)
        mode = os.environ.get("FAKE_HYBRIDEP", "ok")
        if mode == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if mode == "raise":
            raise RuntimeError("fake: no NVLink peers")
"""


def fake_site(path: Path, torch: str | None = "2.11.0", te: str | None = "2.12.0",
              deep_ep: tuple[str, ...] | None = ("Buffer", "HybridEPBuffer"), apex: bool = True,
              emerging: str | None = "0.2.0", nccl_ep: bool = False) -> Path:
    """A folder for PYTHONPATH with fake torch / transformer_engine / deep_ep packages, Apex's
    fused_weight_gradient_mlp_cuda (RUN011) and an installed emerging-optimizers distribution (RUN012).
    A package given as None/False is made to fail its import, so that a real one elsewhere cannot hide
    the failure."""
    path.mkdir(parents=True, exist_ok=True)

    def pkg(name: str, body: str) -> None:
        (path / name).mkdir(exist_ok=True)
        (path / name / "__init__.py").write_text(body)

    broken = "raise ImportError('fake: not installed')\n"
    pkg("torch", f"__version__ = {torch!r}\nfrom . import cuda, distributed\n\n\ndef device(*args):\n    return args\n"
        if torch else broken)
    if torch:  # what preflight's HybridEP probe (RUN013) touches; FAKE_CUDA=1 makes a GPU visible
        # FAKE_CUDA_ASYNC=1: the buffer's kernels fail asynchronously, surfacing at the next synchronize
        # (as CUDA reports an illegal memory access); FAKE_DIST_ARGS receives init_process_group's init_method
        pkg("torch/cuda", "import os\n\n\ndef is_available():\n    return os.environ.get('FAKE_CUDA') == '1'\n\n\n"
                          "def set_device(i):\n    pass\n\n\ndef synchronize():\n"
                          "    if os.environ.get('FAKE_CUDA_ASYNC') == '1':\n"
                          "        raise RuntimeError('CUDA error: an illegal memory access was encountered')\n")
        pkg("torch/distributed", "import os\n\n\ndef init_process_group(*a, **k):\n"
                                 "    if os.environ.get('FAKE_DIST_ARGS'):\n"
                                 "        open(os.environ['FAKE_DIST_ARGS'], 'w').write(k.get('init_method', ''))\n"
                                 "\n\ndef new_group(ranks):\n    return ranks\n"
                                 "\n\ndef destroy_process_group():\n    pass\n")
    pkg("transformer_engine", f"__version__ = {te!r}\n" if te else broken)
    if te and nccl_ep:  # RUN016: a TE built with NCCL EP (its pytorch.ep module and the ep_* bindings)
        pkg("transformer_engine/pytorch", "")
        (path / "transformer_engine" / "pytorch" / "ep.py").write_text("")
        (path / "transformer_engine_torch.py").write_text("def ep_initialize(*args, **kwargs):\n    pass\n")
    pkg("deep_ep", "".join(FAKE_HYBRIDEP if c == "HybridEPBuffer" else f"class {c}:\n    pass\n" for c in deep_ep)
        if deep_ep is not None else broken)
    pkg("fused_weight_gradient_mlp_cuda", "" if apex else broken)
    if emerging is not None:  # preflight reads the distribution's version, then imports the Muon module
        pkg("emerging_optimizers", "")
        pkg("emerging_optimizers/orthogonalized_optimizers", "")
        meta = path / f"emerging_optimizers-{emerging}.dist-info"
        meta.mkdir(exist_ok=True)
        (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: emerging-optimizers\nVersion: {emerging}\n")
    return path


def run_preflight(script: Path, env: dict[str, str], timeout: float = 30) -> tuple[subprocess.CompletedProcess, float]:
    base = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    base.update(env)
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(script)], env=base, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - t0


def _lock(script: Path) -> dict:
    return json.loads((script.parent / "mocompile.lock.json").read_text())


def _runtime_env(req: dict, tmp_path: Path) -> dict[str, str]:
    """The job environment a plan needs: its variables, a CUDA_HOME with nvcc for HybridEP's JIT, and an HF cache
    holding the model's config where Bridge's recipe reads one."""
    env = dict(req["env"])
    if req.get("needs_nvcc"):
        nvcc = tmp_path / "cuda" / "bin" / "nvcc"
        nvcc.parent.mkdir(parents=True, exist_ok=True)
        nvcc.write_text("#!/bin/sh\nexit 0\n")
        nvcc.chmod(0o755)
        env["CUDA_HOME"] = str(tmp_path / "cuda")
    if req.get("nccl_ep"):  # RUN016 asks libnccl.so.2 for its version: a stand-in library reporting 2.30.4
        lib = tmp_path / "lib"
        lib.mkdir(parents=True, exist_ok=True)
        src = lib / "nccl.c"
        src.write_text("int ncclGetVersion(int *version) { *version = 23004; return 0; }\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(lib / "libnccl.so.2"), str(src)], check=True)
        env["LD_LIBRARY_PATH"] = str(lib)
    if req.get("hf_config"):  # RUN014: the model's HF config in the nodes' cache
        snap = tmp_path / "hf" / ("models--" + req["hf_config"].replace("/", "--")) / "snapshots" / "0"
        snap.mkdir(parents=True, exist_ok=True)
        (snap / "config.json").write_text("{}")
        env["HF_HUB_CACHE"] = str(tmp_path / "hf")
    return env


# --------------------------------------------------------------------------------------------------
# preflight, run for real (no Slurm needed)
# --------------------------------------------------------------------------------------------------
def _reads_real_files(script: Path) -> bool:
    """Plans with a corpus, tokenizer or checkpoints: their preflight needs those files (RUN006-RUN009),
    so it runs against real ones in tests/stack/test_data_pipeline.py instead."""
    settings = _lock(script)["settings"]
    return any((settings.get(k) or {}).get("value") for k in ("blend", "tokenizer_model", "save", "load",
                                                                "pretrained_checkpoint"))


@pytest.mark.parametrize("script", [p for p in PREFLIGHTS if not _reads_real_files(p)], ids=lambda p: p.parent.name)
def test_preflight_passes_with_the_required_runtime(script, tmp_path):
    req = _lock(script)["requirements"]
    site = fake_site(tmp_path / "site", nccl_ep=bool(req.get("nccl_ep")))
    proc, _ = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(site), **_runtime_env(req, tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "preflight: ok" in proc.stdout


@pytest.mark.parametrize("script", [p for p in PREFLIGHTS if _lock(p)["requirements"].get("needs_nvcc")],
                         ids=lambda p: p.parent.name)
def test_preflight_fails_with_RUN005_when_hybridep_has_no_nvcc(script, tmp_path):
    req = _lock(script)["requirements"]
    site = fake_site(tmp_path / "site")
    proc, seconds = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(site), **req["env"]})
    assert proc.returncode != 0 and "RUN005" in proc.stderr
    assert seconds < 10


@pytest.mark.parametrize("script", PREFLIGHTS, ids=lambda p: p.parent.name)
def test_preflight_fails_in_seconds_with_RUN001_when_torch_does_not_import(script, tmp_path):
    req = _lock(script)["requirements"]
    site = fake_site(tmp_path / "site", torch=None)
    proc, took = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(site), **req["env"]})
    assert proc.returncode != 0
    assert "RUN001" in proc.stderr and "torch does not import" in proc.stderr
    assert took < 10, f"preflight took {took:.1f} s"


def test_preflight_RUN001_for_a_missing_interpreter_and_an_old_torch(tmp_path):
    script = ROOT / "generated" / "tiny-moe-h100x2" / "preflight.sh"
    env = _lock(script)["requirements"]["env"]
    proc, _ = run_preflight(script, {"PYTHON": str(tmp_path / "no-such-python"), **env})
    assert proc.returncode != 0 and "RUN001" in proc.stderr and "not found" in proc.stderr
    site = fake_site(tmp_path / "old", torch="2.5.1")
    proc, _ = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(site), **env})
    assert proc.returncode != 0 and "RUN001 torch 2.5.1 < 2.6.0" in proc.stderr


@pytest.mark.parametrize("script", PREFLIGHTS, ids=lambda p: p.parent.name)
def test_preflight_RUN004_names_each_missing_job_variable(script, tmp_path):
    req = _lock(script)["requirements"]
    assert "CUDA_DEVICE_MAX_CONNECTIONS" in req["env"]
    site = fake_site(tmp_path / "site")
    for key in req["env"]:
        env = {k: v for k, v in req["env"].items() if k != key}
        proc, took = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(site), **env})
        assert proc.returncode != 0, key
        assert f"RUN004 {key}=None in the job environment" in proc.stderr, proc.stderr
        assert took < 10


def test_preflight_checks_hybridep_package_and_variables(tmp_path):
    script = ROOT / "generated" / "qwen3-30b-a3b-h100x16-hybridep" / "preflight.sh"
    req = _lock(script)["requirements"]
    assert req["dispatch_import"] == ["deep_ep", "HybridEPBuffer"]
    assert "NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN" in req["env"]
    # deep_ep without the hybrid-ep branch: Buffer only
    site = fake_site(tmp_path / "a", deep_ep=("Buffer",))
    proc, _ = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(site), **req["env"]})
    assert proc.returncode != 0 and "RUN003 deep_ep.HybridEPBuffer does not import" in proc.stderr
    site = fake_site(tmp_path / "b", deep_ep=None)
    proc, _ = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(site), **req["env"]})
    assert proc.returncode != 0 and "RUN003" in proc.stderr
    site = fake_site(tmp_path / "c", te="1.6.0")
    proc, _ = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(site), **req["env"]})
    assert proc.returncode != 0 and f"RUN002 Transformer Engine 1.6.0 < {req['transformer_engine']}" in proc.stderr


def _extension(site: Path, name: str, static_libstdcxx: bool) -> None:
    """A real C++ extension file beside the fake deep_ep, built with the system g++: one that uses an
    ostringstream (as HybridEP's get_comm_id does), linked against libstdc++.so.6 or with its own static copy
    (what the GPU hosts' compiler wrapper did)."""
    src = site / f"{name}.cpp"
    src.write_text("#include <sstream>\n#include <string>\n"
                   "std::string comm_id(int rank) { std::ostringstream o; o << rank; return o.str(); }\n")
    flags = ["-static-libstdc++"] if static_libstdcxx else []
    out = site / f"{name}.cpython-312-x86_64-linux-gnu.so"
    subprocess.run(["g++", "-shared", "-fPIC", *flags, "-o", str(out), str(src)], check=True, capture_output=True)
    # importlib finds it under the interpreter's own suffix only
    import importlib.machinery
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    if not out.name.endswith(suffix):
        out.rename(site / f"{name}{suffix}")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs the system g++ to build the fake extensions")
@pytest.mark.parametrize("static,fails", [(True, True), (False, False)])
def test_preflight_run015_finds_a_deepep_extension_carrying_its_own_libstdcxx(tmp_path, static, fails):
    req = _lock(HYBRIDEP_PREFLIGHT)["requirements"]
    site = fake_site(tmp_path / "site")
    _extension(site, "hybrid_ep_cpp", static)
    proc, _ = run_preflight(HYBRIDEP_PREFLIGHT, {"PYTHON": sys.executable, "PYTHONPATH": str(site),
                                                 **_runtime_env(req, tmp_path)})
    found = [ln for ln in proc.stderr.splitlines() if "RUN015" in ln]
    if fails:
        assert proc.returncode != 0 and found, proc.stderr
        assert "hybrid_ep_cpp" in found[0] and "CC=/usr/bin/gcc CXX=/usr/bin/g++" in found[0]
        # with a GPU visible and a buffer that would crash, RUN013 is not attempted once RUN015 has failed
        proc, _ = run_preflight(HYBRIDEP_PREFLIGHT, {"PYTHON": sys.executable, "PYTHONPATH": str(site), "FAKE_CUDA": "1",
                                                     "FAKE_HYBRIDEP": "segv", **_runtime_env(req, tmp_path)})
        assert "RUN015" in proc.stderr and "RUN013" not in proc.stderr, proc.stderr
    else:
        assert not found and proc.returncode == 0, proc.stdout + proc.stderr


HYBRIDEP_PREFLIGHT = ROOT / "generated" / "qwen3-30b-a3b-h100x16-hybridep" / "preflight.sh"


@pytest.mark.parametrize("mode,fails,says", [
    ("segv", True, "RUN013 deep_ep.HybridEPBuffer killed its process with SIGSEGV while being constructed on one GPU"),
    ("raise", True, "RUN013 deep_ep.HybridEPBuffer could not be constructed on one GPU: RuntimeError: fake: no NVLink peers"),
    ("ok", False, "preflight: ok"),
])
def test_preflight_RUN013_constructs_the_hybridep_buffer_in_a_child(tmp_path, mode, fails, says):
    """A DeepEP build whose HybridEP extension crashes (seen on 4x H200 and 1x H100: SIGSEGV in the
    constructor) fails preflight in seconds instead of every rank's first MoE layer."""
    req = _lock(HYBRIDEP_PREFLIGHT)["requirements"]
    site = fake_site(tmp_path / "site")
    args = tmp_path / "args.json"
    proc, took = run_preflight(HYBRIDEP_PREFLIGHT, {"PYTHON": sys.executable, "PYTHONPATH": str(site), "FAKE_CUDA": "1",
                                                    "FAKE_HYBRIDEP": mode, "FAKE_HYBRIDEP_ARGS": str(args),
                                                    **_runtime_env(req, tmp_path)})
    assert (proc.returncode != 0) is fails
    assert says in (proc.stderr if fails else proc.stdout), proc.stderr
    assert took < 10
    # the buffer one MoE layer of this plan builds (Qwen3-30B-A3B: hidden 2048, 128 experts over EP 16), on a 1-rank group
    assert json.loads(args.read_text()) == {"hidden_dim": 2048, "max_num_of_tokens_per_rank": 4096,
                                            "num_local_experts": 8, "use_fp8": False, "ranks_per_domain": "1"}


def test_preflight_RUN013_waits_for_the_buffers_kernels_and_uses_a_free_port(tmp_path):
    """CUDA reports a kernel's failure at the next synchronisation: the probe synchronises before it calls
    the construction good, so an asynchronous crash is RUN013 here, not an error at the first dispatch. Its
    one-rank group meets on a port the OS gave it (bound first), never port 0."""
    req = _lock(HYBRIDEP_PREFLIGHT)["requirements"]
    site = fake_site(tmp_path / "site")
    dist_args = tmp_path / "dist.txt"
    env = {"PYTHON": sys.executable, "PYTHONPATH": str(site), "FAKE_CUDA": "1", "FAKE_DIST_ARGS": str(dist_args),
           **_runtime_env(req, tmp_path)}
    proc, _ = run_preflight(HYBRIDEP_PREFLIGHT, {**env, "FAKE_CUDA_ASYNC": "1"})
    assert proc.returncode != 0 and "RUN013" in proc.stderr and "illegal memory access" in proc.stderr
    proc, _ = run_preflight(HYBRIDEP_PREFLIGHT, env)
    assert proc.returncode == 0
    m = re.fullmatch(r"tcp://127\.0\.0\.1:(\d+)", dist_args.read_text())
    assert m and 1024 <= int(m.group(1)) <= 65535


def test_preflight_RUN013_is_skipped_without_a_gpu_or_on_request(tmp_path):
    req = _lock(HYBRIDEP_PREFLIGHT)["requirements"]
    site = fake_site(tmp_path / "site")
    env = {"PYTHON": sys.executable, "PYTHONPATH": str(site), "FAKE_HYBRIDEP": "segv", **_runtime_env(req, tmp_path)}
    proc, _ = run_preflight(HYBRIDEP_PREFLIGHT, env)  # no CUDA device visible: nothing to probe
    assert proc.returncode == 0 and "RUN013 skipped (no CUDA device visible)" in proc.stdout
    proc, _ = run_preflight(HYBRIDEP_PREFLIGHT, {**env, "FAKE_CUDA": "1", "MOCOMPILE_SKIP_HYBRIDEP_PROBE": "1"})
    assert proc.returncode == 0 and "RUN013 skipped (MOCOMPILE_SKIP_HYBRIDEP_PROBE=1)" in proc.stdout
    # no probe for other dispatchers
    assert "HYBRIDEP_PROBE" not in (ROOT / "generated" / "deepseek-v3-h100-deepep" / "preflight.sh").read_text()


def test_deepep_preflight_needs_deep_ep_buffer(tmp_path):
    script = ROOT / "generated" / "deepseek-v3-h100-deepep" / "preflight.sh"
    req = _lock(script)["requirements"]
    assert req["dispatch_import"] == ["deep_ep", "Buffer"]
    site = fake_site(tmp_path / "s", deep_ep=None)
    proc, _ = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(site), **req["env"]})
    assert proc.returncode != 0 and "RUN003 deep_ep.Buffer does not import" in proc.stderr


# --------------------------------------------------------------------------------------------------
# a real Slurm
# --------------------------------------------------------------------------------------------------
def _slurm_missing() -> str | None:
    for tool in ("slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "munged", "munge"):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install slurm-wlm munge; tests/ecosystem/setup.sh does it)"
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd runs jobs as their user)"
    return None


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """SLURM_CONF for a running local cluster; partitions: debug plus those the sbatches name."""
    why = _slurm_missing()
    if why:
        pytest.skip(why)
    partitions = sorted({p for f in GENERATED if (p := _directive(f.read_text(), "partition"))})
    state = tmp_path_factory.mktemp("slurm")
    proc = subprocess.run(["bash", str(SLURM_UP), "up", str(state), *partitions], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        subprocess.run(["bash", str(SLURM_UP), "down", str(state)], capture_output=True, timeout=60)
        pytest.fail(f"local Slurm did not start:\n{proc.stdout}\n{proc.stderr}")
    env = dict(os.environ, SLURM_CONF=str(state / "slurm.conf"))
    env.pop("SLURM_JOB_ID", None)
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
    try:
        yield {"env": env, "host": host, "dir": state}
    finally:
        subprocess.run(["bash", str(SLURM_UP), "down", str(state)], capture_output=True, timeout=60)


def _hostnames(nodelist: str, env: dict) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], env=env, capture_output=True, text=True,
                         check=True).stdout
    return out.split()


@pytest.mark.parametrize("sbatch", GENERATED, ids=lambda p: p.parent.name)
def test_every_generated_sbatch_is_accepted_by_sbatch_test_only(slurm, sbatch, tmp_path):
    """`sbatch --test-only` parses the script's #SBATCH lines and asks slurmctld whether and where the
    job would run, without submitting it. Validity means: exit 0 and "Job N to start at T using C
    processors on nodes L in partition P" with exactly the node count and the partition the script
    asks for. An invalid request (unknown partition or option, more GPUs per node than a node has, a
    bad time) exits non-zero instead; and if any command came before an #SBATCH line, sbatch would
    stop reading directives there, so the node count or partition would not match."""
    text = sbatch.read_text()
    proc = subprocess.run(["sbatch", "--test-only", str(sbatch)], cwd=tmp_path, env=slurm["env"],
                          capture_output=True, text=True, timeout=60)
    segment = re.search(r"^#SBATCH --segment=(\d+)$", text, re.M)
    if segment and "--segment" not in _sbatch_help(slurm):
        # NVL72 plans ask for Slurm's --segment (Slurm >= 24.05, topology/block), which this cluster's Slurm
        # (Debian's 22.05) does not know: it must refuse exactly that option, and accept the script without it
        assert proc.returncode != 0 and f"unrecognized option '--segment={segment.group(1)}'" in proc.stderr, \
            proc.stderr
        sbatch = tmp_path / "without-segment.sbatch"
        sbatch.write_text(text.replace(segment.group(0) + "\n", ""))
        proc = subprocess.run(["sbatch", "--test-only", str(sbatch)], cwd=tmp_path, env=slurm["env"],
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.search(r"Job \d+ to start at \S+ using (\d+) processors on nodes (\S+) in partition (\S+)", proc.stderr)
    assert m, proc.stderr
    nodes = _hostnames(m.group(2), slurm["env"])
    assert len(nodes) == int(_directive(text, "nodes"))
    assert m.group(3) == (_directive(text, "partition") or "debug")


def _sbatch_help(slurm) -> str:
    return subprocess.run(["sbatch", "--help"], env=slurm["env"], capture_output=True, text=True, timeout=60).stdout


def test_nvl72_sbatch_asks_for_the_segment_of_its_nvlink_domain():
    """The plan's NVLink domain on a multi-rack GB200/GB300 job is a Slurm segment of whole trays inside a rack;
    the launcher must ask for exactly that segment, and an 8-GPU-node launcher for none."""
    for sbatch in GENERATED:
        lock = json.loads((sbatch.parent / "mocompile.lock.json").read_text())
        hw = lock["hardware"]
        segment = re.search(r"^#SBATCH --segment=(\d+)$", sbatch.read_text(), re.M)
        domain = lock["settings"]["nvlink_domain"]["value"]
        if hw["gpu"] in ("gb200", "gb300") and hw["nodes"] > 1:
            assert segment and int(segment.group(1)) * hw["gpus_per_node"] == domain, sbatch
        else:
            assert segment is None, sbatch


def test_sbatch_test_only_rejects_an_impossible_request(slurm, tmp_path):
    """The control for the test above: the same cluster refuses what it cannot run."""
    sbatch = ROOT / "generated" / "tiny-moe-h100x2" / "slurm.sbatch"
    for extra in (["--gpus-per-node=9"], ["--partition=no-such-partition"], ["--nodes=1000"]):
        proc = subprocess.run(["sbatch", "--test-only", *extra, str(sbatch)], cwd=tmp_path, env=slurm["env"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0, extra


def _project_with(tmp_path: Path, gen_dir: Path) -> Path:
    proj = tmp_path / "proj"
    shutil.copytree(gen_dir, proj / "generated" / gen_dir.name)
    return proj


def _submit_dry_run(slurm, proj: Path, sbatch_rel: str, nodelist: str, extra: list[str], env: dict,
                    dry_run: bool = True, want: str = "COMPLETED") -> tuple[str, str]:
    """Submit for real, wait for the job (polling scontrol: faster than `sbatch --wait`), return its log."""
    e = dict(slurm["env"], **env)
    export = "--export=ALL,MOCOMPILE_DRY_RUN=1" if dry_run else "--export=ALL"
    e.pop("MOCOMPILE_DRY_RUN", None)
    proc = subprocess.run(["sbatch", "--parsable", export, "-w", nodelist,
                           *extra, sbatch_rel], cwd=proj, env=e, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job = proc.stdout.strip().split(";")[0]
    state, deadline = "", time.monotonic() + 120
    while time.monotonic() < deadline:
        info = subprocess.run(["scontrol", "show", "job", "-o", job], env=e, capture_output=True, text=True).stdout
        m = re.search(r"JobState=(\S+).*ExitCode=(\S+)", info)
        state = m.group(1) if m else ""
        if state and state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(0.2)
    outs = list(proj.glob(f"*-{job}.out"))
    log = outs[0].read_text() if outs else ""
    if want == "COMPLETED":
        assert state == "COMPLETED" and m and m.group(2) == "0:0", f"job {job}: {state}\n{info}\n{log}"
    else:
        assert state == want, f"job {job}: {state}\n{info}\n{log}"
    assert outs, f"no output file for job {job} in {proj}: {os.listdir(proj)}"
    return job, log


def _expected_command(python: str, nnodes: int, rank: int, nproc: int, endpoint: str, job: str, recipe_dir: Path):
    return (f"{python} -m torch.distributed.run --nnodes {nnodes} --node-rank {rank} --nproc-per-node {nproc} "
            f"--rdzv-backend c10d --rdzv-endpoint {endpoint} --rdzv-id {job} {recipe_dir}/train.py")


def _env_lines(lock: dict) -> list[str]:
    return [f"  {k}={v['value']}" for k, v in sorted(lock["env"].items())]


def test_single_node_dry_run_prints_preflight_command_and_environment(slurm, tmp_path):
    """The tiny recipe's sbatch, submitted for real with MOCOMPILE_DRY_RUN=1 and -N 1: the preflight
    runs through srun, then the node prints the exact torchrun command it would exec."""
    gen = ROOT / "generated" / "tiny-moe-h100x2"
    proj = _project_with(tmp_path, gen)
    site = fake_site(tmp_path / "site")
    job, log = _submit_dry_run(slurm, proj, "generated/tiny-moe-h100x2/slurm.sbatch", slurm["host"], ["-N", "1"],
                               {"PYTHON": sys.executable, "PYTHONPATH": str(site)})
    lock = json.loads((gen / "mocompile.lock.json").read_text())
    port = 20000 + int(job) % 20000
    endpoint = f"{slurm['host']}:{port}"
    assert "preflight: ok" in log
    assert f"master: {endpoint} nodes: 1" in log
    env_block = log.split("environment:\n", 1)[1].split("srun:", 1)[0].splitlines()
    assert env_block == _env_lines(lock)
    recipe_dir = proj / "generated" / "tiny-moe-h100x2"
    want = _expected_command(sys.executable, 1, 0, lock["hardware"]["gpus_per_node"], endpoint, job, recipe_dir)
    assert f"node {slurm['host']} rank 0 command: {want}" in log.splitlines(), log
    assert "srun: --nodes=1 --ntasks-per-node=1 --kill-on-bad-exit=1" in log


def test_two_node_dry_run_derives_rendezvous_from_the_allocation(slurm, tmp_path):
    """A real 2-node job (this host and vnode1, two slurmds): a 2-node recipe compiled without its
    container (no pyxis here), submitted as generated, with its own --nodes=2. Every node runs the
    preflight, and each prints its command: the same rendezvous endpoint (first node of the
    allocation, port from the job ID), --nnodes 2, and node ranks 0 and 1 from srun."""
    recipe = "recipes/qwen3-30b-a3b-h100x16-hybridep.yaml"
    proj = tmp_path / "proj"
    proc = run_cli("compile", recipe, "--unset", "launch.container", "-o", str(proj / "generated"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    gen = proj / "generated" / "qwen3-30b-a3b-h100x16-hybridep"
    text = (gen / "slurm.sbatch").read_text()
    assert _directive(text, "nodes") == "2" and "--container-image" not in text
    lock = json.loads((gen / "mocompile.lock.json").read_text())
    site = fake_site(tmp_path / "site")
    runtime = _runtime_env(lock["requirements"], tmp_path)  # nvcc for HybridEP's JIT (RUN005), the HF config (RUN014)
    job, log = _submit_dry_run(slurm, proj, "generated/qwen3-30b-a3b-h100x16-hybridep/slurm.sbatch",
                               f"{slurm['host']},vnode1", [],
                               {"PYTHON": sys.executable, "PYTHONPATH": str(site), "CUDA_HOME": runtime["CUDA_HOME"],
                                "HF_HUB_CACHE": runtime["HF_HUB_CACHE"]})
    assert log.count("preflight: ok") == 2, log
    first = _hostnames(f"{slurm['host']},vnode1", slurm["env"])[0]
    endpoint = f"{first}:{20000 + int(job) % 20000}"
    assert f"master: {endpoint} nodes: 2" in log
    assert log.split("environment:\n", 1)[1].split("srun:", 1)[0].splitlines() == _env_lines(lock)
    lines = log.splitlines()
    for rank, node in enumerate(_hostnames(f"{slurm['host']},vnode1", slurm["env"])):
        want = _expected_command(sys.executable, 2, rank, lock["hardware"]["gpus_per_node"], endpoint, job, gen)
        assert f"node {node} rank {rank} command: {want}" in lines, log


def test_real_launch_stops_at_the_preflight_with_the_rule_id(slurm, tmp_path):
    """Without the dry-run switch: torch does not import, so the job fails in the preflight step with
    RUN001 and torchrun is never started."""
    gen = ROOT / "generated" / "tiny-moe-h100x2"
    proj = _project_with(tmp_path, gen)
    site = fake_site(tmp_path / "site", torch=None)
    t0 = time.monotonic()
    _, log = _submit_dry_run(slurm, proj, "generated/tiny-moe-h100x2/slurm.sbatch", slurm["host"], [],
                             {"PYTHON": sys.executable, "PYTHONPATH": str(site)}, dry_run=False, want="FAILED")
    assert "preflight: RUN001 torch does not import" in log, log
    assert "command:" not in log
    assert time.monotonic() - t0 < 30


# --------------------------------------------------------------------------------------------------
# `mocompile probe --launcher slurm`: the measure loop through the plan's own batch script, on this Slurm
# --------------------------------------------------------------------------------------------------
def _node_python(tmp_path: Path, site: Path, step_ms: float) -> Path:
    """The nodes' Python as the job sees it: the real interpreter with the fake packages for everything the
    preflight and the probe ask, while `-m torch.distributed.run ... train.py` (the training, which needs GPUs)
    writes what train.py writes: a metrics line per step, or the kernel probe's JSON."""
    from test_probe_tune import kernel_result

    kern = json.dumps(kernel_result())
    script = tmp_path / "node-python"
    script.write_text(
        "#!/bin/bash\n"
        'if [[ "$1" == "-m" && "$2" == "torch.distributed.run" ]]; then\n'
        '  echo "node $(hostname -s): torchrun $*" >&2\n'
        f"  if [[ -n \"${{MOCOMPILE_PROBE_KERNELS:-}}\" ]]; then echo '{kern}' > \"$MOCOMPILE_PROBE_KERNELS\"; exit 0; fi\n"
        f'  for i in $(seq 1 25); do echo "{{\\"iteration\\": $i, \\"step_ms\\": {step_ms}}}" >> "$MOCOMPILE_METRICS"; done\n'
        "  exit 0\n"
        "fi\n"
        f"PYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    script.chmod(0o755)
    return script


def test_probe_through_slurm_submits_the_plans_batch_script_and_fits_from_the_jobs_metrics(slurm, tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pyproject.toml").write_text("")
    site = fake_site(tmp_path / "site")
    python = _node_python(tmp_path, site, 500.0)
    env = dict(slurm["env"], PYTHON=str(python), PYTHONPATH=f"{ROOT / 'compiler'}")
    proc = subprocess.run([sys.executable, "-m", "mocompile", "probe", "-o", "clusters/c.yaml", "--gpu", "h100",
                           "--gpus-per-node", "2", "--repeats", "2", "--python", str(python), "--launcher", "slurm",
                           "--sbatch-args", f"-w {slurm['host']}", "--format", "json"],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["measured_ms"] == 500.0 and rep["kernels"]["gemm_scale"] == pytest.approx(0.9)
    runs = proj / ".mocompile" / "probe" / "runs"
    # each run is a Slurm job of the generated batch script: its output (preflight, the node's torchrun) in the log
    for log in ("probe-1.log", "probe-2.log", "kernels.log"):
        text = (runs / log).read_text()
        assert "preflight: ok" in text and f"node {slurm['host']}: torchrun" in text, text
        assert "generated/mocompile-probe/train.py" in text
    assert (proj / ".mocompile" / "probe" / "generated" / "mocompile-probe" / "slurm.sbatch").is_file()
    assert "host_factor:" in (proj / "clusters" / "c.yaml").read_text()


def test_tune_through_slurm_needs_the_recipe_to_target_slurm(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "pyproject.toml").write_text("")
    recipe = proj / "r.yaml"
    recipe.write_text((ROOT / "recipes" / "bench" / "bench-te-mid2-auto.yaml").read_text())
    res = run_cli("tune", str(recipe), "--launcher", "slurm", "--max-plans", "1", "--repeats", "1")
    assert res.returncode == 2 and "launch.targets has no slurm" in res.stderr


@pytest.mark.parametrize("script", [p for p in PREFLIGHTS if _lock(p)["requirements"].get("nccl_ep")],
                         ids=lambda p: p.parent.name)
def test_preflight_fails_with_RUN016_without_nccl_ep_or_with_an_old_nccl(script, tmp_path):
    """moe.dispatcher ncclep: a TE without transformer_engine.pytorch.ep (TE 2.12, the lent hosts' own) stops the
    job before it starts; so does an NCCL older than the 2.30.4 TE's ep.py asks for."""
    req = _lock(script)["requirements"]
    env = _runtime_env(req, tmp_path)
    plain = fake_site(tmp_path / "plain")
    proc, _ = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(plain), **env})
    assert proc.returncode == 1 and "RUN016 transformer_engine.pytorch.ep does not import" in proc.stderr
    site = fake_site(tmp_path / "site", nccl_ep=True)
    old = tmp_path / "old"
    old.mkdir()
    (old / "nccl.c").write_text("int ncclGetVersion(int *version) { *version = 22809; return 0; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(old / "libnccl.so.2"), str(old / "nccl.c")], check=True)
    proc, _ = run_preflight(script, {"PYTHON": sys.executable, "PYTHONPATH": str(site), **env,
                                     "LD_LIBRARY_PATH": str(old)})
    assert proc.returncode == 1 and "RUN016 NCCL EP needs NCCL >= 2.30.4; libnccl.so.2 here is 2.28.9" in proc.stderr
