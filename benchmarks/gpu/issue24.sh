#!/usr/bin/env bash
# Issue 24 device driver: Adam's memory levers train the mid TE model (recipes/bench/bench-te-mid2-auto.yaml,
# 2 GPUs) through the generated, unmodified torchrun launcher; interleaved rounds of three plans that differ only
# in the optimizer: fp32 state (baseline), the precision-aware optimizer with bf16 moments, and the whole state
# offloaded to the host CPU. Each run trains ITERS iterations with MOCOMPILE_METRICS (step time, loss, peak
# memory per step); the locks hold the estimates the report compares against.
# Usage (repo root on the host; carry .te .whl .mcdeps):  OUT=<dir> benchmarks/gpu/issue24.sh
# Environment: PLANS ("fp32 bf16m offload"; also "rem": fp32-remainders; "fp32d remd bf16md": deterministic;
# "fsdp": Megatron-FSDP; "actoff": activation offload of core_attn,attn_proj), ROUNDS (2), ITERS (24), DEADLINE
# (480: no run starts later, in s). Setup is issue20.sh's.
# $OUT gets two files, console.log and results.tar.gz (rewritten after every run, so a call cut short keeps
# what finished); everything else is collected in /tmp/levers/out.
set -uo pipefail
mkdir -p "${OUT}" /tmp/levers/out
exec > >(tee -a "${OUT}/console.log") 2>&1
keep() { tar czf "${OUT}/results.tar.gz" -C /tmp/levers/out . ; }
t0=${SECONDS}
repo="$(pwd)"
RECIPE=recipes/bench/bench-te-mid2-auto.yaml
ROUNDS="${ROUNDS:-2}"
ITERS="${ITERS:-24}"
W=/tmp/levers/out
OUT="${W}" bash benchmarks/gpu/issue20.sh setup > "${W}/setup.log" 2>&1 || { tail -30 "${W}/setup.log"; keep; exit 4; }
mv -f "${W}/results.tar.gz" "${W}/setup.tar.gz" 2>/dev/null
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export PYTHONPATH="/tmp/mcdeps:${repo}/compiler:/tmp/site${PYTHONPATH:+:${PYTHONPATH}}"
declare -A SETS=(
  [fp32]="--set training.optimizer_state=fp32 --set training.optimizer_offload=0"
  [bf16m]="--set training.optimizer_state=bf16-moments --set training.optimizer_offload=0"
  [offload]="--set training.optimizer_state=fp32 --set training.optimizer_offload=1"
  [rem]="--set training.optimizer_state=fp32-remainders --set training.optimizer_offload=0"
  # deterministic twins: loss curves compared bit for bit where the optimizer path allows
  [fp32d]="--set training.optimizer_state=fp32 --set training.optimizer_offload=0 --set training.deterministic=true"
  [remd]="--set training.optimizer_state=fp32-remainders --set training.optimizer_offload=0 --set training.deterministic=true"
  [bf16md]="--set training.optimizer_state=bf16-moments --set training.optimizer_offload=0 --set training.deterministic=true"
  [fsdp]="--set training.optimizer_state=fp32 --set training.optimizer_offload=0 --set parallelism.fsdp=true"
  # an experiment, not a plan mocompile emits: offload with Megatron-Core's overlap_cpu_optimizer_d2h_h2d (one CPU
  # optimizer per parameter, copies on side streams), patched into the generated train.py below
  [offloadov]="--set training.optimizer_state=fp32 --set training.optimizer_offload=1"
  [actoff]="--set training.optimizer_state=fp32 --set training.optimizer_offload=0 --set recompute.offload_modules=[core_attn,attn_proj]"
)
PLANS="${PLANS:-fp32 bf16m offload}"
for plan in ${PLANS}; do
  # shellcheck disable=SC2086  # SETS holds --set words by design
  python3 -m mocompile compile "${RECIPE}" ${SETS[${plan}]} --set "name=lever-${plan}" --set "training.train_iters=${ITERS}" \
    --set profile=null -o /tmp/levers --force > "${W}/compile-${plan}.log" 2>&1 || { cat "${W}/compile-${plan}.log"; keep; exit 5; }
  cp "/tmp/levers/lever-${plan}/mocompile.lock.json" "${W}/lock-${plan}.json"
  if [[ ${plan} == offloadov ]]; then
    sed -i 's/^\( *\)optimizer_cpu_offload=True,.*$/&\n\1overlap_cpu_optimizer_d2h_h2d=True,  # experiment (issue24.sh)/' \
      "/tmp/levers/lever-${plan}/train.py"
  fi
  grep -n "optimizer_cpu_offload\|precision_aware\|_dtype=" "/tmp/levers/lever-${plan}/train.py" || true
done
keep
for round in $(seq 1 "${ROUNDS}"); do
  for plan in ${PLANS}; do
    if (( SECONDS - t0 > ${DEADLINE:-480} )); then echo "issue24: deadline, ${plan} round ${round} not started"; continue; fi
    dir="/tmp/levers/runs/${plan}-${round}"; mkdir -p "${dir}"
    start=${SECONDS}
    (cd "${dir}" && MOCOMPILE_METRICS="${dir}/metrics.jsonl" MASTER_PORT=$((29500 + RANDOM % 500)) \
      timeout 300 bash "/tmp/levers/lever-${plan}/torchrun.sh" > "${dir}/log.txt" 2>&1)
    rc=$?
    cp "${dir}/metrics.jsonl" "${W}/${plan}-${round}.jsonl" 2>/dev/null
    echo "issue24: ${plan} round ${round} rc=${rc} wall=$((SECONDS - start)) s steps=$(wc -l < "${dir}/metrics.jsonl" 2>/dev/null)"
    [[ ${rc} -ne 0 ]] && { tail -25 "${dir}/log.txt"; cp "${dir}/log.txt" "${W}/${plan}-${round}.log"; }
    nvidia-smi --query-gpu=index,name,uuid --format=csv > "${W}/gpus.csv"
    keep
  done
done
echo "issue24: done at $((SECONDS - t0)) s"
