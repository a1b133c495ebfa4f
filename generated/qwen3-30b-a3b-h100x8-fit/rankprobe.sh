#!/usr/bin/env bash
# mocompile: generated file, do not edit: change the recipe and run `mocompile compile`
# mocompile: source recipes/qwen3-30b-a3b-h100x8-fit.yaml (mocompile 0.1.0)
# mocompile: checksum sha256:db603d1c0b4064ea input sha256:9f88ae4b995acb74
# qwen3-30b-a3b-h100x8-fit: rank probe for this 8-GPU plan on ONE GPU (issue 23; `mocompile rankprobe` runs it).
# One process impersonates one rank of the full job under torch's fake process group (collectives skipped):
# it builds that rank's real model shard and optimizer state and runs real forward/backward passes, then writes
# measured peak memory, per-iteration time and the memory estimate to MOCOMPILE_RANK_PROBE (a JSON file).
#   MOCOMPILE_RANK_PROBE_RANK  the rank to impersonate (default 0: no pipeline: every rank holds the whole stack, the embedding, the output layer and the loss)
#   MOCOMPILE_RANK_PROBE_ITERS iterations (default 6)
#   MOCOMPILE_RANK_PROBE_SITES=1 also records every allocation and writes where the peak's bytes were allocated
#                              ("peak_sites" in the JSON; slower: use 2 iterations)
# MOCOMPILE_DRY_RUN=1 runs the preflight, prints the command and environment, and exits 0.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
export MOCOMPILE_RANK_PROBE="${MOCOMPILE_RANK_PROBE:-rankprobe.json}"
export MOCOMPILE_RANK_PROBE_RANK="${MOCOMPILE_RANK_PROBE_RANK:-0}"
export MOCOMPILE_RANK_PROBE_ITERS="${MOCOMPILE_RANK_PROBE_ITERS:-6}"
if ! [[ "${MOCOMPILE_RANK_PROBE_RANK}" =~ ^[0-9]+$ ]] || (( MOCOMPILE_RANK_PROBE_RANK >= 8 )); then
  echo "rankprobe: MOCOMPILE_RANK_PROBE_RANK=${MOCOMPILE_RANK_PROBE_RANK} is not a rank of this 8-GPU plan (0..7)" >&2
  exit 2
fi
if ! [[ "${MOCOMPILE_RANK_PROBE_ITERS}" =~ ^[1-9][0-9]*$ ]]; then
  echo "rankprobe: MOCOMPILE_RANK_PROBE_ITERS=${MOCOMPILE_RANK_PROBE_ITERS} is not a positive number of iterations" >&2
  exit 2
fi
# one process, one GPU: the first visible one
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}"
export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES%%,*}"

# Environment (the same block in every launcher; reasons in mocompile.lock.json).
export CUDA_DEVICE_MAX_CONNECTIONS=32
export NCCL_NVLS_ENABLE=0
export NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8
export PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export USE_MNNVL=0

CMD=("$PYTHON" "$HERE/train.py")

if [[ "${MOCOMPILE_DRY_RUN:-0}" == "1" ]]; then
  PYTHON="$PYTHON" bash "$HERE/preflight.sh" || echo "dry run: preflight failed (see above); a real launch would stop here" >&2
  echo "environment:"
  echo "  CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS}"
  echo "  NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE}"
  echo "  NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=${NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN}"
  echo "  PYTHONUNBUFFERED=${PYTHONUNBUFFERED}"
  echo "  PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF}"
  echo "  USE_MNNVL=${USE_MNNVL}"
  echo "  MOCOMPILE_RANK_PROBE=${MOCOMPILE_RANK_PROBE}"
  echo "  MOCOMPILE_RANK_PROBE_RANK=${MOCOMPILE_RANK_PROBE_RANK}"
  echo "  MOCOMPILE_RANK_PROBE_ITERS=${MOCOMPILE_RANK_PROBE_ITERS}"
  echo "  CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES}"
  printf 'command:'
  printf ' %q' "${CMD[@]}"
  printf '\n'
  exit 0
fi

PYTHON="$PYTHON" bash "$HERE/preflight.sh"
exec "${CMD[@]}"
