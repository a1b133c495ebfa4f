#!/usr/bin/env bash
# Issue 11 device driver: Transformer Engine on the host, then the TE grid, in ONE call.
# Usage (repo root, on a 4-GPU host; carry .te .whl .deepep):
#   OUT=<dir> benchmarks/gpu/issue11.sh TAG DEADLINE_S FIRST_ROUND REPEATS HYBRIDEP_MIN VARIANTS...
# 1. benchmarks/gpu/te.sh: TE from the .te/ pack (te_pack.py) into /tmp/site + GPU smoke test;
#    stops here when TE does not work (its JSON says why);
# 2. benchmarks/gpu/issue10.sh: prepare the Megatron wheel set, DeepEP from .deepep/ (prebuilt
#    wheel), nvidia-smi sampling, run_bench.py over VARIANTS in REPEATS interleaved rounds.
# What fits in one call's 64 MiB: the repo (~5 MiB), .whl (37 MiB), .te (12 MiB), the DeepEP wheel
# (10 MiB); the DeepEP source stays behind (.deepep-src/), so DeepEP is never rebuilt here.
set -uo pipefail
tag="$1"; deadline="$2"; shift 2
mkdir -p "${OUT}"
t0=${SECONDS}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ! OUT="${OUT}" bash benchmarks/gpu/te.sh > "${OUT}/te-console-${tag}.log" 2>&1; then
  tail -40 "${OUT}/te-console-${tag}.log"
  echo "issue11: TE did not install or failed its smoke test; no grid" >&2
  exit 4
fi
tail -3 "${OUT}/te-console-${tag}.log"
wheel="$(compgen -G '.deepep/deep_ep-*.whl' | head -1 || true)"
export DEEPEP_WHEEL="${wheel:+$(pwd)/${wheel}}"
OUT="${OUT}" bash benchmarks/gpu/issue10.sh "${tag}" "$((deadline - (SECONDS - t0)))" "$@"
