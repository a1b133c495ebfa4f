#!/usr/bin/env bash
# Prepare a GPU test host (no internet) for the generated Megatron-Bridge 0.6.2 recipes.
#  1. installs the pinned wheels (benchmarks/gpu/wheels.txt, fetched by fetch_wheels.sh) with
#     --no-index --no-deps into a target directory (default /tmp/site) beside the host's torch;
#  2. applies the two environment fixes of shared/knowledge/gpu-host.md section 3 to the
#     INSTALLED packages (never to generated files):
#       a. megatron/bridge/peft/lora_layers.py: TE import made optional (Bridge 0.6.2 imports
#          transformer_engine.pytorch at module level; only LoRA code uses it);
#       b. megatron/core/datasets/Makefile: a no-op Makefile (the megatron-core wheel ships the
#          prebuilt helpers .so but not the Makefile that Bridge's init runs `make` on);
#  3. prints an import check.
# Usage: benchmarks/gpu/prepare_host.sh [WHEEL_DIR] [SITE]
#   then: export PYTHONPATH=SITE${PYTHONPATH:+:$PYTHONPATH}
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
wheels="${1:-${WHEEL_DIR:-${repo}/.whl}}"
site="${2:-${SITE:-/tmp/site}}"
py="${PYTHON:-python3}"

shopt -s nullglob
files=("${wheels}"/*.whl)
shopt -u nullglob
if ((${#files[@]} == 0)); then
  echo "prepare_host: no wheels in ${wheels}; run benchmarks/gpu/fetch_wheels.sh on a machine with internet" >&2
  exit 1
fi

echo "prepare_host: installing ${#files[@]} wheels from ${wheels} into ${site}"
"${py}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "${site}" "${files[@]}"

# Fix a: optional Transformer Engine import in Bridge's LoRA layers (idempotent).
"${py}" - "${site}" <<'PY'
import pathlib
import sys

path = pathlib.Path(sys.argv[1]) / "megatron/bridge/peft/lora_layers.py"
text = path.read_text()
old = "import transformer_engine.pytorch as te\n"
new = (
    "try:  # mocompile prepare_host.sh: TE is optional (only LoRA's fused path uses it)\n"
    "    import transformer_engine.pytorch as te\n"
    "except ImportError:\n"
    "    te = None\n"
)
if new in text:
    print(f"prepare_host: fix a already applied: {path}")
elif old in text:
    text = text.replace(old, new, 1)
    if "from __future__ import annotations" not in text:
        text = "from __future__ import annotations\n" + text
    path.write_text(text)
    print(f"prepare_host: fix a applied (optional TE import): {path}")
else:
    sys.exit(f"prepare_host: fix a: expected line not found in {path}; Bridge version differs?")
PY

# Fix c (found on the 2xH200 host, 2026-11-25): megatron/bridge/recipes/__init__.py star-imports
# every model family, and the flux family imports `diffusers` (not on the hosts), so ANY import
# below megatron.bridge.recipes (e.g. recipes.utils.optimizer_utils) fails with
# "ModuleNotFoundError: No module named 'diffusers'". Make each family import tolerant.
# Generated recipes of custom models (e.g. the tiny bench MoE) no longer import below
# megatron.bridge.recipes; FIX_C=0 skips this fix to prove that. Catalogue recipes still need it.
if [[ "${FIX_C:-1}" == "1" ]]; then
"${py}" - "${site}" <<'PY'
import pathlib
import re
import sys

path = pathlib.Path(sys.argv[1]) / "megatron/bridge/recipes/__init__.py"
text = path.read_text()
marker = "# mocompile prepare_host.sh fix c"
if marker in text:
    print(f"prepare_host: fix c already applied: {path}")
    sys.exit(0)
pattern = re.compile(r"^from (megatron\.bridge\.recipes\.[\w.]+) import \*$", re.M)
count = len(pattern.findall(text))
if not count:
    sys.exit(f"prepare_host: fix c: no family star-imports found in {path}; Bridge version differs?")
text = pattern.sub(
    lambda m: (
        f"try:  {marker}\n"
        f"    from {m.group(1)} import *\n"
        "except ImportError as _exc:\n"
        f"    _skipped_recipe_families.append(({m.group(1)!r}, str(_exc)))"
    ),
    text,
)
text = text.replace('"""\n\n', '"""\n\n_skipped_recipe_families = []  ' + marker + "\n", 1)
path.write_text(text)
print(f"prepare_host: fix c applied ({count} recipe-family imports made tolerant): {path}")
PY
else
  echo "prepare_host: fix c skipped (FIX_C=0)"
fi

# Fix b: no-op Makefile for the prebuilt dataset helpers.
ds="${site}/megatron/core/datasets"
if ! compgen -G "${ds}/helpers_cpp*.so" >/dev/null; then
  echo "prepare_host: fix b: no prebuilt helpers_cpp*.so in ${ds}; the no-op Makefile would hide a missing extension" >&2
  exit 1
fi
printf 'default:\n\t@true\n' > "${ds}/Makefile"
echo "prepare_host: fix b applied (no-op Makefile): ${ds}/Makefile"

# Import check.
PYTHONPATH="${site}${PYTHONPATH:+:${PYTHONPATH}}" "${py}" - <<'PY'
import importlib
import sys

ok = True
required = [
    "torch", "megatron.core", "megatron.training", "megatron.bridge",
    "megatron.bridge.training.config", "megatron.bridge.training.pretrain",
    "megatron.bridge.training.gpt_step", "megatron.bridge.training.callbacks",
    "megatron.bridge.models.gpt_provider", "megatron.core.datasets.helpers_cpp",
]
optional = ["transformer_engine", "deep_ep", "hybrid_ep", "grouped_gemm", "apex", "flash_attn"]
for name in required:
    try:
        mod = importlib.import_module(name)
        print(f"  ok       {name} {getattr(mod, '__version__', '')}")
    except Exception as exc:  # noqa: BLE001 - report every failure
        ok = False
        print(f"  FAILED   {name}: {type(exc).__name__}: {exc}")
for name in optional:
    try:
        mod = importlib.import_module(name)
        print(f"  present  {name} {getattr(mod, '__version__', '')}")
    except Exception as exc:  # noqa: BLE001
        print(f"  absent   {name} ({type(exc).__name__})")
try:
    import torch
    print(f"  torch {torch.__version__}, CUDA {torch.version.cuda}, GPUs {torch.cuda.device_count()}")
except Exception:  # noqa: BLE001
    pass
sys.exit(0 if ok else 1)
PY
echo "prepare_host: done; use: export PYTHONPATH=${site}\${PYTHONPATH:+:\$PYTHONPATH}"
