#!/usr/bin/env bash
# mocompile: generated file, do not edit: change the recipe and run `mocompile compile`
# mocompile: source recipes/qwen3-30b-a3b-h100x16-ncclep.yaml (mocompile 0.1.0)
# mocompile: checksum sha256:75a3d3c3e40157df input sha256:13d24490739bdef6
# qwen3-30b-a3b-h100x16-ncclep: preflight, run by every launcher before torchrun. Fails in seconds with a rule ID.
#   RUN001 the Python interpreter or torch is missing or too old
#   RUN002 Transformer Engine is missing or too old for this plan
#   RUN003 the dispatcher's package (deep_ep) does not import
#   RUN015 a DeepEP extension carries its own libstdc++ (it would crash at its first ostream use)
#   RUN004 a required environment variable is missing or wrong in the job environment
#   RUN005 HybridEP compiles its kernels at first use: CUDA_HOME must hold bin/nvcc
#   RUN016 moe.dispatcher ncclep: Transformer Engine's NCCL EP must import, be built in, and find NCCL >= 2.30.4
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

REQUIRED_ENV = {'CUDA_DEVICE_MAX_CONNECTIONS': '32'}
TORCH_MIN = '2.6.0'
TE_MIN = '1.7.0'
DISPATCH_IMPORT = None
NEEDS_NVCC = False
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
# RUN016: NCCL EP through Transformer Engine (megatron-core's fused_a2a.py imports transformer_engine.pytorch.ep);
# its ep_* functions exist only in a TE built with NCCL EP, and TE's ep.py wants libnccl.so.2 >= 2.30.4.
if not RANK_PROBE:  # rankprobe.sh runs the alltoall dispatcher instead (PRB002)
    try:
        from transformer_engine.pytorch import ep as te_ep  # noqa: F401
        import transformer_engine_torch
        if not hasattr(transformer_engine_torch, "ep_initialize"):
            failures.append("RUN016 Transformer Engine was built without NCCL EP (transformer_engine_torch has no "
                            "ep_initialize): rebuild it with NVTE_WITH_NCCL_EP=1 and an arch >= 90, or set "
                            "moe.dispatcher: alltoall")
        import ctypes
        nccl_version = ctypes.c_int(0)
        if ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(nccl_version)) == 0:
            n = nccl_version.value
            if (n // 10000, (n // 100) % 100, n % 100) < (2, 30, 4):
                failures.append(f"RUN016 NCCL EP needs NCCL >= 2.30.4; libnccl.so.2 here is {n // 10000}."
                                f"{(n // 100) % 100}.{n % 100}")
    except (ImportError, OSError) as exc:
        failures.append(f"RUN016 transformer_engine.pytorch.ep does not import ({exc}): moe.dispatcher ncclep needs "
                        f"Transformer Engine >= 2.17 built with NCCL EP")
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
