#!/usr/bin/env bash
# mocompile: generated file, do not edit: change the recipe and run `mocompile compile`
# mocompile: source recipes/bench/bench-te-glm-resized1.yaml (mocompile 0.1.0)
# mocompile: checksum sha256:fcc1d7e42898150a input sha256:6e3ff08eaf4dde34
# bench-te-glm-resized1: preflight, run by every launcher before torchrun. Fails in seconds with a rule ID.
#   RUN001 the Python interpreter or torch is missing or too old
#   RUN002 Transformer Engine is missing or too old for this plan
#   RUN003 the dispatcher's package (deep_ep) does not import
#   RUN015 a DeepEP extension carries its own libstdc++ (it would crash at its first ostream use)
#   RUN004 a required environment variable is missing or wrong in the job environment
#   RUN005 HybridEP compiles its kernels at first use: CUDA_HOME must hold bin/nvcc
set -euo pipefail
PYTHON="${PYTHON:-python3}"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "preflight: RUN001 python interpreter '$PYTHON' not found (set PYTHON=...)" >&2
  exit 1
fi

# the recipe folder, where the vendored model config lies (RUN014)
MOCOMPILE_RECIPE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" "$PYTHON" - <<'PREFLIGHT'
import os
import sys

REQUIRED_ENV = {'CUDA_DEVICE_MAX_CONNECTIONS': '8'}
TORCH_MIN = '2.6.0'
TE_MIN = '1.7.0'
DISPATCH_IMPORT = None
NEEDS_NVCC = False
NEEDS_APEX = False
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
if NEEDS_APEX:
    try:
        import fused_weight_gradient_mlp_cuda  # noqa: F401
    except ImportError as exc:
        failures.append(f"RUN011 gradient_accumulation_fusion is on and Apex's fused_weight_gradient_mlp_cuda does not "
                        f"import ({exc}): Megatron-Core's output layer raises at model build; install Apex with "
                        f"--cuda_ext, or set versions.apex: none")
# The model's architecture travels with this recipe (model_config): train.py hands Bridge's recipe the copy in this
# folder for HF_MODEL (AutoBridge.from_hf_pretrained reads a local folder), not the hub or the HF cache (RUN014).
# What else the run reads through Hugging Face's loaders is listed: it needs the HF cache or the hub.
HF_MODEL = 'zai-org/GLM-4.5-Air'
VENDORED = 'hf_config/config.json'
VENDORED_SHA256 = '3167d02de00ff16ce53f0a80b575038bc86752976ab2a18564a78fdb9491efe0'
HUB_READS = []
import hashlib
copy = os.path.join(os.environ.get("MOCOMPILE_RECIPE_DIR") or ".", VENDORED)
try:
    with open(copy, "rb") as fh:
        digest = hashlib.sha256(fh.read()).hexdigest()
except OSError as exc:
    digest = None
    failures.append(f"RUN014 {copy} (the vendored config of {HF_MODEL}) cannot be read ({exc}): run `mocompile compile`")
if digest is not None and digest != VENDORED_SHA256:
    failures.append(f"RUN014 {copy} is not the config of {HF_MODEL} the lock records (sha256 {digest[:16]}, "
                    f"the lock's {VENDORED_SHA256[:16]}): run `mocompile compile`")
elif digest is not None:
    print(f"preflight: RUN014 the architecture of {HF_MODEL} travels with the recipe ({VENDORED}, sha256 as the "
          f"lock records): no hub or HF cache for the model config")
for key, what in HUB_READS:
    if os.path.isdir(what):
        print(f"preflight: RUN014 {key} {what!r} is a local folder: no hub access")
    else:
        print(f"preflight: RUN014 {key} {what!r} still comes from the HF cache or the hub (RUN007 checks it loads offline)")
if not HUB_READS:
    print("preflight: RUN014 nothing else this run builds is read through Hugging Face's loaders (no HF tokenizer)")
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
