#!/usr/bin/env bash
# Issue 10 device driver: one call on a 4-GPU host. Usage (from the repo root, on the host):
#   OUT=<dir> benchmarks/gpu/issue10.sh TAG DEADLINE_S FIRST_ROUND REPEATS HYBRIDEP_MIN VARIANTS...
# - run.sh prepares the host and DeepEP (RUN_BENCH=0); a freshly built deep_ep wheel is kept in $OUT;
# - HYBRIDEP_MIN=1: benchmarks/gpu/hybridep_min.py in modes megatron, default, sidestream (torchrun, 4 ranks);
# - nvidia-smi samples utilization.gpu (busy share) and memory every 500 ms during the grid;
# - run_bench.py runs the generated launchers of VARIANTS over REPEATS interleaved rounds from
#   FIRST_ROUND, starting no run after DEADLINE_S seconds of this script.
# Everything lands in $OUT (at most 8 files).
set -uo pipefail
tag="$1"; deadline="$2"; first="$3"; repeats="$4"; hmin="$5"; shift 5
variants="$(IFS=,; echo "$*")"
t0=${SECONDS}
mkdir -p "${OUT}"
exec > >(tee -a "${OUT}/console-${tag}.log") 2>&1
echo "issue10: ${tag} start $(date -u +%FT%TZ) variants=${variants}"
nvidia-smi --query-gpu=index,name,memory.total,driver_version,clocks.max.sm --format=csv
nvidia-smi topo -m 2>/dev/null | head -8
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
DEEPEP_WHEEL_OUT="${OUT}" RUN_BENCH=0 bash benchmarks/gpu/run.sh
echo "issue10: run.sh (prepare+DeepEP) rc=$? at $((SECONDS - t0)) s"
export PYTHONPATH=/tmp/site${PYTHONPATH:+:${PYTHONPATH}}
CUDA_HOME="$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")"
export CUDA_HOME
if [[ "${hmin}" == "1" ]]; then
  mkdir -p /tmp/hmin
  for mode in megatron default sidestream; do
    echo "issue10: hybridep_min ${mode} at $((SECONDS - t0)) s"
    NUM_OF_HYBRID_EP_RANKS_PER_NVLINK_DOMAIN=4 USE_MNNVL=0 PYTHONFAULTHANDLER=1 timeout 150 \
      python3 -m torch.distributed.run --nproc-per-node 4 --master-port $((29400 + RANDOM % 50)) \
      benchmarks/gpu/hybridep_min.py "${mode}" > "/tmp/hmin/${mode}.log" 2>&1
    rc=$?
    echo "issue10: hybridep_min ${mode} rc=${rc}"; grep -E "RESULT|check:|time:|Fatal|Segmentation|File \"|step:|Error|error" "/tmp/hmin/${mode}.log" | head -40
  done
  tar czf "${OUT}/hybridep-min-${tag}.tar.gz" -C /tmp hmin
fi
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader -lms 500 > "/tmp/smi-${tag}.csv" 2>/dev/null &
smi=$!
left=$((deadline - (SECONDS - t0)))
echo "issue10: grid with ${left} s left (start no run after that)"
python3 benchmarks/gpu/run_bench.py --deepep-status "$(find /tmp -maxdepth 1 -name 'deepep_status.*.json' -printf '%T@ %p\n' | sort -rn | head -1 | cut -d' ' -f2)" \
  --host-tag "${tag}" --only "${variants}" --repeats "${repeats}" --first-round "${first}" \
  --warmup 4 --timeout 240 --deadline "${left}" --logs "/tmp/bench-logs-${tag}"
echo "issue10: run_bench rc=$? at $((SECONDS - t0)) s"
kill "${smi}" 2>/dev/null
gzip -c "/tmp/smi-${tag}.csv" > "${OUT}/smi-${tag}.csv.gz"
cp "benchmarks/results/${tag}.json" "${OUT}/" 2>/dev/null
cp "benchmarks/results/logs/${tag}.tar.gz" "${OUT}/logs-${tag}.tar.gz" 2>/dev/null
# Profiler traces (recipes with profile:, rank 0): as many as fit one 15 MB file, smallest first.
tdir="bench-logs-${tag}-traces"
if [[ -d "/tmp/${tdir}" ]]; then
  total=0; keep=()
  while read -r size f; do
    if (( total + size < 15000000 )); then keep+=("${f}"); total=$((total + size)); fi
  done < <(cd /tmp && find "${tdir}" -type f -name '*.json*' -printf '%s %p\n' | sort -n)
  (( ${#keep[@]} )) && tar cf "${OUT}/traces-${tag}.tar" -C /tmp "${keep[@]}"
  echo "issue10: traces kept ${#keep[@]} ($((total / 1000000)) MB) of $(find "/tmp/${tdir}" -type f | wc -l)"
fi
ls -la "${OUT}"
echo "issue10: done at $((SECONDS - t0)) s"
