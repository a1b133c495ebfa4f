#!/usr/bin/env bash
# Issue 24 device driver: Adam's memory levers train the mid TE model (recipes/bench/bench-te-mid2-auto.yaml,
# 2 GPUs) through the generated, unmodified torchrun launcher; interleaved rounds of three plans that differ only
# in the optimizer: fp32 state (baseline), the precision-aware optimizer with bf16 moments, and the whole state
# offloaded to the host CPU. Each run trains ITERS iterations with MOCOMPILE_METRICS (step time, loss, peak
# memory per step); the locks hold the estimates the report compares against.
# Usage (repo root on the host; carry .te .whl .mcdeps):  OUT=<dir> benchmarks/gpu/issue24.sh
# Environment: ROUNDS (2), ITERS (24). Setup is issue20.sh's (skipped when already there).
set -uo pipefail
mkdir -p "${OUT}"
exec > >(tee -a "${OUT}/console.log") 2>&1
t0=${SECONDS}
repo="$(pwd)"
RECIPE=recipes/bench/bench-te-mid2-auto.yaml
ROUNDS="${ROUNDS:-2}"
ITERS="${ITERS:-24}"
OUT="${OUT}" bash benchmarks/gpu/issue20.sh setup > "${OUT}/setup.log" 2>&1 || { tail -30 "${OUT}/setup.log"; exit 4; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export PYTHONPATH="/tmp/mcdeps:${repo}/compiler:/tmp/site${PYTHONPATH:+:${PYTHONPATH}}"
declare -A SETS=(
  [fp32]="--set training.optimizer_state=fp32 --set training.optimizer_offload=0"
  [bf16m]="--set training.optimizer_state=bf16-moments --set training.optimizer_offload=0"
  [offload]="--set training.optimizer_state=fp32 --set training.optimizer_offload=1"
)
for plan in fp32 bf16m offload; do
  # shellcheck disable=SC2086  # SETS holds --set words by design
  python3 -m mocompile compile "${RECIPE}" ${SETS[${plan}]} --set "name=lever-${plan}" --set "training.train_iters=${ITERS}" \
    --set profile=null -o /tmp/levers --force > "${OUT}/compile-${plan}.log" 2>&1 || { cat "${OUT}/compile-${plan}.log"; exit 5; }
  cp "/tmp/levers/lever-${plan}/mocompile.lock.json" "${OUT}/lock-${plan}.json"
  grep -n "optimizer_cpu_offload\|precision_aware\|_dtype=" "/tmp/levers/lever-${plan}/train.py" || true
done
for round in $(seq 1 "${ROUNDS}"); do
  for plan in fp32 bf16m offload; do
    dir="/tmp/levers/runs/${plan}-${round}"; mkdir -p "${dir}"
    start=${SECONDS}
    (cd "${dir}" && MOCOMPILE_METRICS="${dir}/metrics.jsonl" MASTER_PORT=$((29500 + RANDOM % 500)) \
      timeout 300 bash "/tmp/levers/lever-${plan}/torchrun.sh" > "${dir}/log.txt" 2>&1)
    rc=$?
    cp "${dir}/metrics.jsonl" "${OUT}/${plan}-${round}.jsonl" 2>/dev/null
    echo "issue24: ${plan} round ${round} rc=${rc} wall=$((SECONDS - start)) s steps=$(wc -l < "${dir}/metrics.jsonl" 2>/dev/null)"
    [[ ${rc} -ne 0 ]] && { tail -25 "${dir}/log.txt"; cp "${dir}/log.txt" "${OUT}/${plan}-${round}.log"; }
  done
done
nvidia-smi --query-gpu=index,name,uuid --format=csv > "${OUT}/gpus.csv"
(cd "${OUT}" && find . -mindepth 1 -maxdepth 1 ! -name console.log ! -name results.tar.gz -print0 \
  | xargs -0 -r tar czf results.tar.gz --remove-files)
echo "issue24: done at $((SECONDS - t0)) s"
