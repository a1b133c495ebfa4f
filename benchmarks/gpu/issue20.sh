#!/usr/bin/env bash
# Issue 20 device driver: the measure loop on a 4-GPU host, run through mocompile's own commands.
# Usage (repo root on the host; carry .te .whl .mcdeps):  OUT=<dir> benchmarks/gpu/issue20.sh PHASE...
# Environment: RECIPE (default recipes/bench/bench-te-mid2-auto.yaml, 2 GPUs), GPUS (2), PROFILE.
#   setup     TE from .te/ (te.sh), the Megatron wheel set (prepare_host.sh), mocompile's own four
#             dependencies from .mcdeps/ into /tmp/mcdeps; skipped when /tmp/site already has them
#   probe     mocompile probe -> $PROFILE (copied to $OUT), its kernel probe included (PROBE_OVERLAP=1: --overlap,
#             the probe plan again with EP overlap on, for the profile's overlap_host_factor)
#   kernels   the kernel probe (MOCOMPILE_PROBE_KERNELS) at RECIPE's shapes through its torchrun launcher
#   ab:N      round N of the diagnose A/B: RECIPE's plan as compiled (traced, iterations 26-28),
#             `mocompile diagnose` on that run, then the change it ranks first compiled and run; both
#             timed on iterations 6-24 (the profiled ones left out of both)
#   grid      benchmarks/gpu/issue20_grid.py: the mid TE model's plans round-robin until GRID_END (s)
#   tune      mocompile tune RECIPE with the probed profile (TUNE_SETS: more --set words)
#   bg PHASE...  the phases in the background (own session, so a device call's end does not kill them), in
#             /tmp/i20w; then `follow`. Lets a probe + tune that outlast one device call (600 s) span several.
#   follow    wait until the background phases end or CALL_END s (default 570) into this call; pack /tmp/i20w
#             into $OUT either way (exit 6 on a fresh machine with nothing running)
# Everything lands in $OUT: console log, metrics, diagnose/tune/probe JSON, the profile, traces (small).
set -uo pipefail
if [[ "${1:-}" == bg || "${1:-}" == follow ]]; then
  W=/tmp/i20w; mkdir -p "${OUT}"; s0=${SECONDS}
  if [[ "$1" == bg ]]; then
    shift; rm -rf "${W}"; mkdir -p "${W}"
    # shellcheck disable=SC2016  # the inner shell expands its own positional parameters
    (OUT="${W}" setsid nohup bash -c 'bash "$0" "$@"; echo $? > "${OUT}/bg.rc"' "$0" "$@" > "${W}/bg.log" 2>&1 &)
    sleep 5
  fi
  [[ -f "${W}/bg.log" ]] || { echo "issue20: nothing running on this machine (a fresh one?)"; exit 6; }
  while [[ ! -f "${W}/bg.rc" ]] && (( SECONDS - s0 < ${CALL_END:-570} )); do sleep 10; done
  if [[ -f "${W}/bg.rc" ]]; then echo "issue20: background phases ended rc=$(cat "${W}/bg.rc")"; else echo "issue20: still running"; fi
  cp "${W}/console.log" "${OUT}/console.log" 2>/dev/null
  tar czf "${OUT}/results.tar.gz" -C "${W}" --exclude console.log --exclude '*.whl' .
  tail -25 "${W}/console.log" 2>/dev/null
  exit 0
fi
mkdir -p "${OUT}"
exec > >(tee -a "${OUT}/console.log") 2>&1
t0=${SECONDS}
repo="$(pwd)"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="/tmp/mcdeps:${repo}/compiler:/tmp/site${PYTHONPATH:+:${PYTHONPATH}}"
CUDA_HOME="$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")"; export CUDA_HOME
mc() { python3 -m mocompile "$@"; }
say() { echo "issue20: $* at $((SECONDS - t0)) s"; }
RECIPE="${RECIPE:-recipes/bench/bench-te-mid2-auto.yaml}"   # the plan under study (its name = its file's)
GPUS="${GPUS:-2}"                                           # GPUs of this host the probe uses
PROFILE="${PROFILE:-clusters/probed-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -qi h200 && echo h200 || echo h100)x${GPUS}.yaml}"
NAME="$(basename "${RECIPE}" .yaml)"

run_plan() {  # GENERATED_DIR RUN_DIR: one launcher run in its own folder (Bridge writes ./torch_profile there)
  local gen="$1" dir="$2"
  mkdir -p "${dir}"
  (cd "${dir}" && MOCOMPILE_METRICS="${dir}/metrics.jsonl" MASTER_PORT=$((29500 + RANDOM % 500)) \
    timeout 300 bash "${repo}/${gen}/torchrun.sh" > "${dir}/log.txt" 2>&1)
  local rc=$?
  python3 - "${dir}/metrics.jsonl" "${rc}" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])] if __import__("os").path.exists(sys.argv[1]) else []
ms = [r["step_ms"] for r in rows if 5 < r["iteration"] < 25]
print(f"  rc={sys.argv[2]} steps={len(rows)} median(6-24)={statistics.median(ms):.1f} ms" if ms else f"  rc={sys.argv[2]} no steps")
EOF
}

for phase in "$@"; do
  case "${phase}" in
    setup)
      if python3 -c "import transformer_engine.pytorch, megatron.bridge, ruamel.yaml, cerberus" 2>/dev/null; then
        say "setup: already there"; continue
      fi
      OUT="${OUT}" bash benchmarks/gpu/te.sh > "${OUT}/te-console.log" 2>&1 || { tail -30 "${OUT}/te-console.log"; say "TE failed"; exit 4; }
      bash benchmarks/gpu/prepare_host.sh .whl /tmp/site > "${OUT}/prepare.log" 2>&1 || { tail -30 "${OUT}/prepare.log"; exit 4; }
      python3 -m pip install -q --no-index --no-deps --target /tmp/mcdeps .mcdeps/*.whl
      python3 -c "import transformer_engine.pytorch, megatron.bridge, ruamel.yaml, cerberus, jinja2; print('imports ok')"
      nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
      nproc
      say "setup done"
      ;;
    probe)
      gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -qi h200 && echo h200 || echo h100)"
      mc probe -o "${PROFILE}" --gpu "${gpu}" --gpus-per-node "${GPUS}" --name "$(basename "${PROFILE}" .yaml)" --repeats "${PROBE_REPEATS:-3}" --iterations "${PROBE_ITERATIONS:-25}" \
        ${PROBE_OVERLAP:+--overlap} --format json > "${OUT}/probe.json"
      say "probe rc=$?"; head -40 "${OUT}/probe.json"
      cp "${PROFILE}" "${OUT}/" 2>/dev/null
      mkdir -p "${OUT}/probe-runs"; cp .mocompile/probe/runs/*.jsonl .mocompile/probe/runs/kernels.* .mocompile/probe/runs/environment.json "${OUT}/probe-runs/" 2>/dev/null
      tail -5 .mocompile/probe/runs/probe-1.log 2>/dev/null
      ;;
    ab:*)
      n="${phase#ab:}"
      say "A/B round ${n}: auto"
      run_plan "generated/${NAME}" "/tmp/ab/auto-${n}"
      if [[ ! -f /tmp/ab/change ]]; then
        mc diagnose "/tmp/ab/auto-${n}" --lock "generated/${NAME}/mocompile.lock.json" --recipe "${RECIPE}" \
          --format json > "${OUT}/diagnose-auto-${n}.json"
        mc diagnose "/tmp/ab/auto-${n}" --lock "generated/${NAME}/mocompile.lock.json" --recipe "${RECIPE}"
        python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['set_line'] or '')" \
          "${OUT}/diagnose-auto-${n}.json" > /tmp/ab/change
        cp /tmp/ab/change "${OUT}/change.txt"
      fi
      change="$(cat /tmp/ab/change)"
      if [[ -n "${change}" ]]; then
        # shellcheck disable=SC2086  # the --set line is one or more words by design
        mc compile "${RECIPE}" ${change} --set name=bench-te-mid-change -o generated --force > /dev/null
        say "A/B round ${n}: ${change}"
        run_plan generated/bench-te-mid-change "/tmp/ab/change-${n}"
      fi
      mkdir -p "${OUT}/ab"
      for d in /tmp/ab/*-"${n}"; do cp "${d}/metrics.jsonl" "${OUT}/ab/$(basename "${d}").jsonl" 2>/dev/null; done
      cp /tmp/ab/auto-"${n}"/log.txt "${OUT}/ab/auto-${n}.log" 2>/dev/null
      ;;
    kernels)
      # the kernel probe at RECIPE's own shapes, through its generated launcher (train.py measures, no training)
      mc compile "${RECIPE}" -o generated --force > /dev/null
      (MOCOMPILE_PROBE_KERNELS="${OUT}/kernels-${NAME}.json" MASTER_PORT=$((29500 + RANDOM % 500)) \
        timeout 300 bash "generated/${NAME}/torchrun.sh" > "${OUT}/kernels-${NAME}.log" 2>&1)
      say "kernels rc=$?"; cat "${OUT}/kernels-${NAME}.json" 2>/dev/null || tail -20 "${OUT}/kernels-${NAME}.log"
      ;;
    grid)
      # the mid TE model's plans with the probed profile, round-robin until GRID_END s into this call
      python3 benchmarks/gpu/issue20_grid.py --out "${OUT}" --profile "${PROFILE}" \
        --deadline $(( ${GRID_END:-560} - (SECONDS - t0) ))
      say "grid rc=$?"
      ;;
    tune)
      # shellcheck disable=SC2086  # TUNE_SETS is a list of --set words by design
      mc tune "${RECIPE}" --set "hardware.cluster=../../${PROFILE}" ${TUNE_SETS:-} --max-plans "${TUNE_PLANS:-4}" \
        --iterations "${TUNE_ITERATIONS:-20}" --repeats "${TUNE_REPEATS:-3}" \
        --timeout 240 --format json > "${OUT}/tune.json"
      say "tune rc=$?"; head -60 "${OUT}/tune.json"
      cp "${PROFILE}" "${OUT}/" 2>/dev/null
      mkdir -p "${OUT}/tune-runs"; cp ".mocompile/tune/${NAME}/runs/"*.jsonl "${OUT}/tune-runs/" 2>/dev/null
      cp ".mocompile/tune/${NAME}/state.json" "${OUT}/tune-state.json" 2>/dev/null
      ;;
    *) echo "unknown phase ${phase}" >&2; exit 2 ;;
  esac
done
# the first traced auto run's rank-0 trace, if small enough to come back
t="$(find /tmp/ab -path '*auto-1*' -name '*.json*' -size -15M 2>/dev/null | grep -v metrics | head -1)"
if [[ -n "${t}" && ! -f "${OUT}/trace-auto-1.json.gz" ]]; then
  case "${t}" in *.gz) cp "${t}" "${OUT}/trace-auto-1.json.gz" ;; *) gzip -c "${t}" > "${OUT}/trace-auto-1.json.gz" ;; esac
fi
# A call brings back at most 8 files: everything but the console log and the TE binding wheel (carried
# into the next call's .te/ so that te.sh skips its build) goes into one archive.
(cd "${OUT}" && find . -mindepth 1 -maxdepth 1 ! -name console.log ! -name '*.whl' ! -name results.tar.gz -print0 \
  | xargs -0 -r tar czf results.tar.gz --remove-files)
say "done"
