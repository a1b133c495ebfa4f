#!/usr/bin/env bash
# mocompile: generated file, do not edit: change the recipe and run `mocompile compile`
# mocompile: source recipes/bench/bench-te-glm-resized1.yaml (mocompile 0.1.0)
# mocompile: checksum sha256:9e6f9da3b97b4e8f input sha256:6e3ff08eaf4dde34
# bench-te-glm-resized1: torchrun launcher for 1 GPUs (1 node(s) x 1).
# Run it on every node. Multi-node: set NNODES, NODE_RANK, MASTER_ADDR and MASTER_PORT.
# MOCOMPILE_DRY_RUN=1 runs the preflight, prints the command and environment, and exits 0.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-python3}"
NNODES="${NNODES:-1}"
NODE_RANK="${NODE_RANK:-0}"
NPROC_PER_NODE="${NPROC_PER_NODE:-1}"
MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"
MASTER_PORT="${MASTER_PORT:-29500}"

# Environment (the same block in every launcher; reasons in mocompile.lock.json).
export CUDA_DEVICE_MAX_CONNECTIONS=8
export NCCL_NVLS_ENABLE=0
export PYTHONUNBUFFERED=1
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True

CMD=("$PYTHON" -m torch.distributed.run
  --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC_PER_NODE"
  --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT"
  "$HERE/train.py")

if [[ "${MOCOMPILE_DRY_RUN:-0}" == "1" ]]; then
  PYTHON="$PYTHON" bash "$HERE/preflight.sh" || echo "dry run: preflight failed (see above); a real launch would stop here" >&2
  echo "environment:"
  echo "  CUDA_DEVICE_MAX_CONNECTIONS=${CUDA_DEVICE_MAX_CONNECTIONS}"
  echo "  NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE}"
  echo "  PYTHONUNBUFFERED=${PYTHONUNBUFFERED}"
  echo "  PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF}"
  printf 'command:'
  printf ' %q' "${CMD[@]}"
  printf '\n'
  exit 0
fi

PYTHON="$PYTHON" bash "$HERE/preflight.sh"
exec "${CMD[@]}"
