#!/usr/bin/env bash
# mocompile: generated file, do not edit: change the recipe and run `mocompile compile`
# mocompile: source recipes/bench/bench-te-mid2-auto.yaml (mocompile 0.1.0)
# mocompile: checksum sha256:d1c103562d4d9c0f input sha256:514407a2163cdd8e
# bench-te-mid2-auto: preflight, run by every launcher before torchrun. Fails in seconds with a rule ID.
#   RUN001 the Python interpreter or torch is missing or too old
#   RUN002 Transformer Engine is missing or too old for this plan
#   RUN003 the dispatcher's package (deep_ep) does not import
#   RUN004 a required environment variable is missing or wrong in the job environment
#   RUN005 HybridEP compiles its kernels at first use: CUDA_HOME must hold bin/nvcc
set -euo pipefail
PYTHON="${PYTHON:-python3}"

if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "preflight: RUN001 python interpreter '$PYTHON' not found (set PYTHON=...)" >&2
  exit 1
fi

"$PYTHON" - <<'PREFLIGHT'
import os
import sys

REQUIRED_ENV = {'CUDA_DEVICE_MAX_CONNECTIONS': '8'}
TORCH_MIN = '2.6.0'
TE_MIN = '1.7.0'
DISPATCH_IMPORT = None
NEEDS_NVCC = False
NEEDS_APEX = False


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
