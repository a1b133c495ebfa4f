#!/usr/bin/env bash
# mocompile: generated file, do not edit: change the recipe and run `mocompile compile`
# mocompile: source recipes/qwen3-30b-a3b-h100x8-fit.yaml (mocompile 0.1.0)
# mocompile: checksum sha256:e76f9e17ce179a84 input sha256:9f88ae4b995acb74
# qwen3-30b-a3b-h100x8-fit: torchrun launcher for 8 GPUs (1 node(s) x 8).
# Run it on every node. Multi-node: set NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT.
# MOCOMPILE_DRY_RUN=1 runs the preflight, prints the command and environment, and exits 0.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
NPROC_PER_NODE="${NPROC_PER_NODE:-8}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"

# Environment (the same block in every launcher; reasons in mocompile.lock.json).
export CUDA_DEVICE_MAX_CONNECTIONS=32
export NCCL_NVLS_ENABLE=0
export NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=8
export PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export USE_MNNVL=0

CMD=("$PYTHON" -m torch.distributed.run
  --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC_PER_NODE"
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"
  "$HERE/train.py")

if [[ "${MOCOMPILE_DRY_RUN:-0}" == "1" ]]; then
  PYTHON="$PYTHON" bash "$HERE/preflight.sh" || echo "dry run: preflight failed (see above); a real launch would stop here" >&2
  echo "environment:"
  echo "  CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS}"
  echo "  NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE}"
  echo "  NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=${NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN}"
  echo "  PYTHONUNBUFFERED=${PYTHONUNBUFFERED}"
  echo "  PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF}"
  echo "  USE_MNNVL=${USE_MNNVL}"
  printf 'command:'
  printf ' %q' "${CMD[@]}"
  printf '\n'
  exit 0
fi

PYTHON="$PYTHON" bash "$HERE/preflight.sh"
exec "${CMD[@]}"
