#!/usr/bin/env bash
# mocompile: generated file, do not edit: change the recipe and run `mocompile compile`
# mocompile: source recipes/qwen3-30b-a3b-h100x8-fit.yaml (mocompile 0.1.0)
# mocompile: checksum sha256:800c482a53bf021b input sha256:9f88ae4b995acb74
# qwen3-30b-a3b-h100x8-fit: preflight, run by every launcher before torchrun. Fails in seconds with a rule ID.
#   RUN001 the Python interpreter or torch is missing or too old
#   RUN002 Transformer Engine is missing or too old for this plan
#   RUN003 the dispatcher's package (deep_ep) does not import
#   RUN015 a DeepEP extension carries its own libstdc++ (it would crash at its first ostream use)
#   RUN004 a required environment variable is missing or wrong in the job environment
#   RUN005 HybridEP compiles its kernels at first use: CUDA_HOME must hold bin/nvcc
#   RUN013 HybridEP's buffer must construct on one GPU in a child process (a DeepEP build whose
#          extension crashes is caught here, not at the first dispatch of every rank)
#   RUN011 gradient_accumulation_fusion needs Apex's fused_weight_gradient_mlp_cuda (the output layer)
set -euo pipefail
PYTHON="${PYTHON:-python3}"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "preflight: RUN001 python interpreter '$PYTHON' not found (set PYTHON=...)" >&2
  exit 1
fi

"$PYTHON" - <<'PREFLIGHT'
import os
import sys

REQUIRED_ENV = {'CUDA_DEVICE_MAX_CONNECTIONS': '32', 'NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN': '8', 'USE_MNNVL': '0'}
TORCH_MIN = '2.6.0'
TE_MIN = '1.7.0'
DISPATCH_IMPORT = ('deep_ep', 'HybridEPBuffer')
NEEDS_NVCC = True
NEEDS_APEX = True
RANK_PROBE = bool(os.environ.get("MOCOMPILE_RANK_PROBE"))
if RANK_PROBE:  # rankprobe.sh runs the alltoall dispatcher in place of DeepEP/HybridEP (PRB002): neither is needed
    DISPATCH_IMPORT, NEEDS_NVCC = None, False


def version(text):
    parts = []
    for piece in text.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (3 - len(parts)))


failures = []
try:
    import torch
    if version(torch.__version__) < version(TORCH_MIN):
        failures.append(f"RUN001 torch {torch.__version__} < {TORCH_MIN}")
except ImportError as exc:
    failures.append(f"RUN001 torch does not import: {exc}")
if TE_MIN is not None:
    try:
        import transformer_engine
        te_version = getattr(transformer_engine, "__version__", "0")
        if version(te_version) < version(TE_MIN):
            failures.append(f"RUN002 Transformer Engine {te_version} < {TE_MIN}")
    except ImportError as exc:
        failures.append(f"RUN002 Transformer Engine does not import: {exc}")
if DISPATCH_IMPORT is not None:
    module, name = DISPATCH_IMPORT
    try:
        getattr(__import__(module, fromlist=[name]), name)
    except (ImportError, AttributeError) as exc:
        failures.append(f"RUN003 {module}.{name} does not import ({exc}); build DeepEP's hybrid-ep branch")
    # RUN015: a DeepEP extension that carries its own copy of libstdc++ (linked statically by a compiler wrapper)
    # crashes at its first ostream use (HybridEP's get_comm_id): its .dynstr names std:: symbols but its
    # DT_NEEDED entries lack libstdc++.so.6. Read from the ELF file itself: nodes may have no binutils.
    import importlib.util
    import struct

    def elf_needed_and_strings(path):
        with open(path, "rb") as fh:
            data = fh.read()
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:  # 64-bit little-endian only
            return None, b""
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
        for _name, sh_type, _f, _a, off, size, link, _i, _al, _es in sections:
            if sh_type == 6:  # SHT_DYNAMIC; its sh_link is the string table it uses (.dynstr)
                strtab = data[sections[link][4]:sections[link][4] + sections[link][5]]
                needed = []
                for k in range(0, size, 16):
                    tag, val = struct.unpack_from("<qQ", data, off + k)
                    if tag == 0:
                        break
                    if tag == 1:  # DT_NEEDED
                        needed.append(strtab[val:strtab.index(b"\0", val)].decode(errors="replace"))
                return needed, strtab
        return [], b""

    for ext in ("deep_ep_cpp", "hybrid_ep_cpp"):
        try:
            spec = importlib.util.find_spec(ext)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.origin or not os.path.isfile(spec.origin):
            continue
        try:
            needed, strings = elf_needed_and_strings(spec.origin)
        except (OSError, struct.error, ValueError, IndexError):
            continue
        if needed is not None and "libstdc++.so.6" not in needed and strings.count(b"_ZNSt") > 50:
            failures.append(f"RUN015 {spec.origin} carries its own libstdc++ (it names {strings.count(b'_ZNSt')} std:: "
                            "symbols but does not load libstdc++.so.6): its first ostream use crashes "
                            "(HybridEP's get_comm_id); rebuild DeepEP with CC=/usr/bin/gcc CXX=/usr/bin/g++, not a "
                            "compiler wrapper that links libstdc++ statically")
if NEEDS_NVCC:
    cuda_home = os.environ.get("CUDA_HOME", "")
    if not cuda_home or not os.access(os.path.join(cuda_home, "bin", "nvcc"), os.X_OK):
        failures.append(f"RUN005 CUDA_HOME={cuda_home!r} has no bin/nvcc; HybridEP JIT-compiles its kernels at first use")
# RUN013: construct deep_ep.HybridEPBuffer in a child process on one GPU (a 1-rank group), as the first
# MoE layer does on every rank. A DeepEP build whose hybrid_ep_cpp crashes (seen on the project's hosts:
# SIGSEGV in get_comm_id, DeepEP hybrid-ep 94a9f8f built there) kills the child, not this check.
# MOCOMPILE_SKIP_HYBRIDEP_PROBE=1 skips it.
HYBRIDEP_PROBE = {'hidden': 2048, 'tokens': 16384, 'local_experts': 16}
PROBE_CODE = r"""
import json, socket, sys
import torch
import torch.distributed as dist
if not torch.cuda.is_available():
    print("skip: no CUDA device visible")
    sys.exit(0)
args = json.loads(sys.argv[1])
torch.cuda.set_device(0)
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
port = sock.getsockname()[1]
sock.close()
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=0, world_size=1,
                        device_id=torch.device("cuda", 0))
from deep_ep import HybridEPBuffer
HybridEPBuffer(group=dist.new_group([0]), hidden_dim=args["hidden"], max_num_of_tokens_per_rank=args["tokens"],
               num_local_experts=args["local_experts"], use_fp8=False)
torch.cuda.synchronize()
dist.destroy_process_group()
print("ok")
"""
if os.environ.get("MOCOMPILE_SKIP_HYBRIDEP_PROBE", "") == "1":
    print("preflight: RUN013 skipped (MOCOMPILE_SKIP_HYBRIDEP_PROBE=1)")
elif RANK_PROBE:
    print("preflight: RUN013 skipped (the rank probe runs the alltoall dispatcher instead)")
elif not any(f.startswith(("RUN001", "RUN003", "RUN005", "RUN015")) for f in failures):
    import json
    import signal
    import subprocess
    probe_env = dict(os.environ, NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN="1", USE_MNNVL="0")
    try:
        probe = subprocess.run([sys.executable, "-c", PROBE_CODE, json.dumps(HYBRIDEP_PROBE)], env=probe_env,
                               capture_output=True, text=True, timeout=300)
        if probe.returncode < 0:
            try:
                signame = signal.Signals(-probe.returncode).name
            except ValueError:
                signame = f"signal {-probe.returncode}"
            failures.append(f"RUN013 deep_ep.HybridEPBuffer killed its process with {signame} while being constructed on "
                            f"one GPU: this DeepEP build cannot run moe.dispatcher hybridep here (rebuild DeepEP's "
                            f"hybrid-ep branch with the compiler torch was built with, or set moe.dispatcher: deepep or "
                            f"alltoall)")
        elif probe.returncode != 0:
            last = (probe.stderr.strip().splitlines() or ["no output"])[-1][:300]
            failures.append(f"RUN013 deep_ep.HybridEPBuffer could not be constructed on one GPU: {last}")
        elif probe.stdout.startswith("skip:"):
            print(f"preflight: RUN013 skipped ({probe.stdout.strip()[6:]})")
    except subprocess.TimeoutExpired:
        failures.append("RUN013 deep_ep.HybridEPBuffer did not construct on one GPU within 300 s")
if NEEDS_APEX:
    try:
        import fused_weight_gradient_mlp_cuda  # noqa: F401
    except ImportError as exc:
        failures.append(f"RUN011 gradient_accumulation_fusion is on and Apex's fused_weight_gradient_mlp_cuda does not "
                        f"import ({exc}): Megatron-Core's output layer raises at model build; install Apex with "
                        f"--cuda_ext, or set versions.apex: none")
# Bridge's recipe builds the model from the Hugging Face config of HF_MODEL (AutoBridge.from_hf_pretrained) on
# every rank at start-up: it must be in this node's HF cache, or the hub must answer (RUN014).
HF_MODEL = 'Qwen/Qwen3-30B-A3B'
hub_cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
    os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
snapshots = os.path.join(hub_cache, "models--" + HF_MODEL.replace("/", "--"), "snapshots")
cached = os.path.isdir(snapshots) and any(os.path.isfile(os.path.join(snapshots, s, "config.json"))
                                          for s in os.listdir(snapshots))
offline = "1" in (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
fetch = (f"fetch it where the hub is reachable into the HF cache the nodes share: huggingface-cli download "
         f"{HF_MODEL} --include '*.json' '*.py' (HF_HOME / HF_HUB_CACHE)")
if cached:
    print(f"preflight: RUN014 config of {HF_MODEL} found in the HF cache ({hub_cache})")
elif offline:
    failures.append(f"RUN014 {HF_MODEL}'s config.json is not in the HF cache ({hub_cache}) and the hub is offline "
                    f"(HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE): Bridge's recipe reads it at start-up; {fetch}")
else:
    import urllib.request
    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    try:
        urllib.request.urlopen(urllib.request.Request(f"{endpoint}/api/models/{HF_MODEL}", method="HEAD"), timeout=10)
        print(f"preflight: RUN014 {HF_MODEL}'s config is not cached; the hub answers ({endpoint}): every rank downloads it")
    except Exception as exc:  # unreachable, refused, 401/404: the run would fail the same way at start-up
        failures.append(f"RUN014 {HF_MODEL}'s config.json is not in the HF cache ({hub_cache}) and {endpoint} does not "
                        f"answer ({type(exc).__name__}: {exc}): Bridge's recipe reads it at start-up; {fetch}")
for key, want in REQUIRED_ENV.items():
    have = os.environ.get(key)
    if have != want:
        failures.append(f"RUN004 {key}={have!r} in the job environment, plan needs {want!r}")
for failure in failures:
    print(f"preflight: {failure}", file=sys.stderr)
if failures:
    sys.exit(1)
print("preflight: ok")
PREFLIGHT
