#!/usr/bin/env bash
# Issue 22 device driver for the 1- and 2-GPU hosts. Phases run in the order given:
#   setup       TE from .te/ (te.sh, smoke test skipped: TE_SMOKE=0 unless set), the Megatron wheel set
#               (prepare_host.sh), mocompile's four dependencies from .mcdeps/, and DeepEP from a wheel in .deepep/
#               (built on a host like this one) when there is one
#   deepep-bg   build DeepEP (hybrid-ep 94a9f8f, .deepep-src/) in the background with the system compilers
#               (benchmarks/gpu/run.sh DEEPEP=build PREPARE=skip RUN_BENCH=0; the hosts' CC/CXX wrappers link a
#               static libstdc++ into the extensions, which crashes HybridEP); the wheel comes back in $OUT;
#               deepep-wait waits for it and installs nothing more (run.sh installed it into /tmp/site)
#   resume      1 GPU: recipes/bench/bench-te-tiny-real-det.yaml (the TE variant of the real-data recipe under
#               training.deterministic, checkpoint load = save) through benchmarks/real_data_resume.sh: A trains
#               40 iterations; B is killed after the iteration-20 save and relaunched unmodified, resumes, trains to
#               40; the per-iteration losses of B after the kill are compared with A's bit for bit
#   ncclep      whether this Transformer Engine has NCCL EP (Megatron-Core's 'ncclep' flex backend needs
#               transformer_engine.pytorch.ep, a TE built with NVTE_BUILD_WITH_NCCL_EP=1)
#   det         2 GPUs: the mid TE model (recipes/bench/bench-te-mid2-auto.yaml: 8 layers, 64 experts top-8) at EP 2,
#               each plan of DET_PLANS with training.deterministic, DET_ITERS iterations (losses compared bit for bit)
#   noise       the harness's own host settings (CPU shares per rank, Python GC) A/B on one plan, interleaved rounds
#   gcprobe     GC_ROUNDS runs of one plan (NOISE_PLAN) with benchsite's GC probe: a full gc.collect() timed inside
#               the training loop at iterations 10 and 15 on every rank, with the tracked-object count (the cost of
#               Bridge's manual_gc every manual_gc_interval iterations), plus the same collection on a synthetic heap
#   time        the plans of TIME_PLANS, deterministic off, force-balanced routing (the recipe's), TIME_ITERS
#               iterations, rounds interleaved with the order rotated, until TIME_ROUNDS rounds or DEADLINE s into
#               the call (no run starts later)
# Plans (the same knobs pinned in every one: TP 1, PP 1, EP 2, no delayed wgrad; graphs and recompute off unless
# named): a2a-off a2a-on deepep-off deepep-on hybridep-off hybridep-on, and a2a-on-moeact (selective recompute of
# moe_act with EP overlap), a2a-on-graphs (TE CUDA graphs of moe_router + moe_preprocess with EP overlap).
# Launchers come from GEN/<name>/ when compiled there beforehand, else they are compiled on the host with this
# checkout's compiler into /tmp/i22/gen (names i22-<plan>-det and i22-<plan>). Every run goes through the generated
# torchrun.sh, unmodified, with MOCOMPILE_METRICS and benchsite/sitecustomize.py (per-rank peak memory, CPU shares).
#   slots       4-GPU host as two 2-GPU slots (benchmarks/gpu/issue22_slots.py, started in its own session so it runs on
#               between device calls): SLOT4_PLANS (4 GPUs) first, TIME_ROUNDS rounds of TIME_PLANS, SLOT_DET_PLANS
#               deterministic, no start after SLOTS_BUDGET s; `wait` follows it until CALL_END s into a call (exit 6 at
#               once on a machine without it). Table: benchmarks/gpu/slots_report.py. Plans pp2vpp2-on/-off are the
#               16-layer model at PP2 x VPP2 x EP2 (4 GPUs); `auto` pins nothing.
# `compile` writes every launcher into GEN and runs nothing (COMPILER: the compiler folder, MC_PYTHON: an interpreter
# with mocompile's dependencies, e.g. GEN=benchmarks/gpu/work-issue22/gen MC_PYTHON=.venv/bin/python OUT=/tmp/c ... compile).
# Usage (repo root on the host; carry .te .whl .mcdeps and .deepep or .deepep-src):
#   OUT=$OUT bash benchmarks/gpu/issue22_grid.sh setup deepep-bg resume deepep-wait     # nvidia-h100-x1
#   OUT=$OUT bash benchmarks/gpu/issue22_grid.sh setup ncclep det time                  # nvidia-h100-x2
#   BASE=recipes/bench/bench-te-mid-auto.yaml EP=4 OUT=$OUT bash benchmarks/gpu/issue22_grid.sh setup det  # -x4
# $OUT gets console.log, results.tar.gz (rewritten after every run) and, after deepep-wait, the DeepEP wheel.
set -uo pipefail
mkdir -p "${OUT:?set OUT}" /tmp/i22/out
exec > >(tee -a "${OUT}/console.log") 2>&1
W=/tmp/i22/out
keep() { tar czf "${OUT}/results.tar.gz" -C "${W}" . ; }
t0=${SECONDS}
repo="$(pwd)"
say() { echo "issue22: $* at $((SECONDS - t0)) s"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="/tmp/mcdeps:${COMPILER:-${repo}/compiler}:/tmp/site${PYTHONPATH:+:${PYTHONPATH}}"
mc() { "${MC_PYTHON:-python3}" -m mocompile "$@"; }
CUDA_HOME="$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")"; export CUDA_HOME
GEN="${GEN:-/tmp/i22/gen}"
BASE="${BASE:-recipes/bench/bench-te-mid2-auto.yaml}"   # 4 GPUs: BASE=recipes/bench/bench-te-mid-auto.yaml EP=4
DET_ITERS="${DET_ITERS:-10}"
TIME_ITERS="${TIME_ITERS:-20}"
DET_PLANS="${DET_PLANS:-a2a-off a2a-on deepep-off deepep-on hybridep-off hybridep-on}"
TIME_PLANS="${TIME_PLANS:-${DET_PLANS}}"
COMMON="--set parallelism.tp=1 --set parallelism.pp=1 --set parallelism.ep=${EP:-2} --set moe.delay_wgrad=false --set profile=null"
declare -A SETS=(
  [a2a-off]="--set moe.dispatcher=alltoall --set moe.overlap=false"
  [a2a-on]="--set moe.dispatcher=alltoall --set moe.overlap=true"
  [deepep-off]="--set moe.dispatcher=deepep --set moe.overlap=false"
  [deepep-on]="--set moe.dispatcher=deepep --set moe.overlap=true"
  [hybridep-off]="--set moe.dispatcher=hybridep --set moe.overlap=false"
  [hybridep-on]="--set moe.dispatcher=hybridep --set moe.overlap=true"
  [a2a-on-moeact]="--set moe.dispatcher=alltoall --set moe.overlap=true --set recompute.granularity=selective --set recompute.modules=[moe_act] --set cuda_graphs.impl=none"
  [a2a-on-graphs]="--set moe.dispatcher=alltoall --set moe.overlap=true --set recompute.granularity=none --set cuda_graphs.impl=transformer_engine --set cuda_graphs.modules=[moe_router,moe_preprocess]"
)
DEFAULTS="--set recompute.granularity=none --set cuda_graphs.impl=none"   # overridden by the plan's own words
# Plans on their own base and layout (the 4-GPU pipeline plan of the grid): PLAN_BASE replaces BASE, PLAN_COMMON COMMON
declare -A PLAN_BASE=([pp2vpp2-on]=recipes/bench/bench-te-mid-auto.yaml [pp2vpp2-off]=recipes/bench/bench-te-mid-auto.yaml)
declare -A PLAN_COMMON=(
  [pp2vpp2-on]="--set parallelism.tp=1 --set parallelism.pp=2 --set parallelism.vpp=2 --set parallelism.ep=2 --set moe.delay_wgrad=false --set profile=null --set moe.dispatcher=alltoall --set moe.overlap=true"
  [pp2vpp2-off]="--set parallelism.tp=1 --set parallelism.pp=2 --set parallelism.vpp=2 --set parallelism.ep=2 --set moe.delay_wgrad=false --set profile=null --set moe.dispatcher=alltoall --set moe.overlap=false"
)
SETS[pp2vpp2-on]=""
SETS[pp2vpp2-off]=""
SETS[auto]=""                                  # the planner's own plan: nothing pinned but the run's length
PLAN_COMMON[auto]="--set profile=null"

gpus_of() {  # PLAN -> the GPUs its launcher runs on: 4 for the plans on their own base (PP 2 x VPP 2 x EP 2), else 2
  if [[ -n "${PLAN_BASE[$1]:-}" ]]; then echo 4; else echo 2; fi
}

plan_dir() {  # PLAN det|time -> GEN/<name> (compiled on demand)
  local plan="$1" mode="$2" name det iters
  if [[ "${mode}" == det ]]; then name="i22-${plan}-det"; det=true; iters="${DET_ITERS}"
  else name="i22-${plan}"; det=false; iters="${TIME_ITERS}"; fi
  if [[ ! -f "${GEN}/${name}/torchrun.sh" ]]; then
    local defaults="${DEFAULTS}"; [[ "${plan}" == auto ]] && defaults=""
    # shellcheck disable=SC2086  # the sets are lists of --set words by design
    mc compile "${PLAN_BASE[${plan}]:-${BASE}}" ${PLAN_COMMON[${plan}]:-${COMMON}} ${defaults} ${SETS[${plan}]} --set "training.deterministic=${det}" \
      --set "training.train_iters=${iters}" --set "name=${name}" -o "${GEN}" --force > "${W}/compile-${name}.log" 2>&1 \
      || { cat "${W}/compile-${name}.log" >&2; return 1; }
  fi
  cp "${GEN}/${name}/mocompile.lock.json" "${W}/lock-${name}.json"
  echo "${GEN}/${name}"
}

run_plan() {  # GENERATED_DIR TAG: one launcher run in its own folder
  local gen="$1" tag="$2" dir="/tmp/i22/runs/$2" start=${SECONDS}
  [[ "${gen}" == /* ]] || gen="${repo}/${gen}"
  rm -rf "${dir}"; mkdir -p "${dir}"
  (cd "${dir}" && PYTHONPATH="${repo}/benchmarks/gpu/benchsite:${PYTHONPATH}" MOCOMPILE_BENCH_RANKSTATS="${dir}/rankstats" \
    MOCOMPILE_BENCH_AFFINITY="${BENCH_AFFINITY:-1}" MOCOMPILE_BENCH_GC="${BENCH_GC:-}" MOCOMPILE_BENCH_GCPROBE="${BENCH_GCPROBE:-}" MOCOMPILE_METRICS="${dir}/metrics.jsonl" MASTER_PORT=$((29500 + RANDOM % 500)) \
    timeout "${RUN_TIMEOUT:-300}" bash "${gen}/torchrun.sh" > "${dir}/log.txt" 2>&1)
  local rc=$?
  cp "${dir}/metrics.jsonl" "${W}/${tag}.jsonl" 2>/dev/null
  for f in "${dir}"/gcprobe/gc-rank*.json; do [[ -f "${f}" ]] && cp "${f}" "${W}/${tag}-$(basename "${f}")"; done
  for f in "${dir}"/rankstats/rank*.json; do [[ -f "${f}" ]] && cp "${f}" "${W}/${tag}-$(basename "${f}")"; done
  gzip -c "${dir}/log.txt" > "${W}/${tag}.log.gz"
  python3 - "${dir}/metrics.jsonl" "${tag}" "${rc}" "$((SECONDS - start))" <<'PY'
import json, os, statistics, sys
path, tag, rc, wall = sys.argv[1:]
rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
ms = [r["step_ms"] for r in rows if r["iteration"] > 5]
last = rows[-1] if rows else {}
print(f"issue22: {tag} rc={rc} wall={wall} s steps={len(rows)} median(6-)="
      + (f"{statistics.median(ms):.1f} ms" if ms else "-") + f" last loss={last.get('loss')!r}"
      + (f" peak alloc rank0={last.get('max_memory_allocated', 0) / 2**30:.2f} GiB" if last else ""))
PY
  [[ ${rc} -ne 0 ]] && zcat "${W}/${tag}.log.gz" | grep -v Warning | tail -25
  nvidia-smi --query-gpu=index,name,uuid,memory.total --format=csv > "${W}/gpus.csv" 2>/dev/null
  keep
  return 0
}

for phase in "$@"; do
  case "${phase}" in
    compile)  # every launcher the other phases use, into GEN (here or on the host), nothing run
      mc compile recipes/bench/bench-te-tiny-real-det.yaml -o "${GEN}" --force > "${W}/compile-resume.log" 2>&1 || cat "${W}/compile-resume.log"
      for plan in ${DET_PLANS}; do plan_dir "${plan}" det > /dev/null; done
      for plan in ${TIME_PLANS} ${SLOT4_PLANS:-}; do plan_dir "${plan}" time > /dev/null; done
      for plan in ${SLOT_DET_PLANS:-}; do plan_dir "${plan}" det > /dev/null; done
      say "compiled into ${GEN}: $(find "${GEN}" -mindepth 1 -maxdepth 1 -printf '%f ')"
      ;;
    setup)
      if python3 -c "import transformer_engine.pytorch, megatron.bridge, ruamel.yaml, cerberus" 2>/dev/null; then
        say "setup: already there"
      else
        TE_SMOKE="${TE_SMOKE:-0}" OUT="${W}" bash benchmarks/gpu/te.sh > "${W}/te-console.log" 2>&1 || { tail -30 "${W}/te-console.log"; say "TE failed"; keep; exit 4; }
        bash benchmarks/gpu/prepare_host.sh .whl /tmp/site > "${W}/prepare.log" 2>&1 || { tail -30 "${W}/prepare.log"; keep; exit 4; }
        python3 -m pip install -q --no-index --no-deps --target /tmp/mcdeps .mcdeps/*.whl
      fi
      wheel="$(compgen -G ".deepep/deep_ep-*.whl" | head -1)"
      if [[ -n "${wheel}" ]]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "${wheel}" && say "DeepEP from ${wheel}"
      fi
      nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "${W}/gpus.csv"
      say "setup done"
      ;;
    deepep-bg)
      mkdir -p /tmp/i22/deepep
      # in its own session (setsid), like the slots: a device call's end must not kill the build
      # shellcheck disable=SC2016  # the script expands its own variables (W and DEEPEP_SRC come through the environment)
      DEEPEP_SRC="$(compgen -G ".deepep-src/deepep-hybrid-ep-*.tar.gz" | head -1)" W="${W}" setsid nohup bash -c '
        DEEPEP=build PREPARE=skip RUN_BENCH=0 SITE=/tmp/site DEEPEP_WHEEL_OUT=/tmp/i22/deepep \
          DEEPEP_BUILD_TIMEOUT="${DEEPEP_BUILD_TIMEOUT:-420}" bash benchmarks/gpu/run.sh > "${W}/deepep-build.log" 2>&1; rc=$?
        # the rc file is the slots gate for the flex jobs: rc=0 only when deep_ep and hybrid_ep import
        if [[ ${rc} == 0 ]] && ! python3 -c "import deep_ep, hybrid_ep_cpp" >> "${W}/deepep-build.log" 2>&1; then rc=import; fi
        echo "rc=${rc}" > "${W}/deepep-build.rc.tmp" && mv "${W}/deepep-build.rc.tmp" "${W}/deepep-build.rc"' > /dev/null 2>&1 &
      deepep_pid=$!
      export DEEPEP_GATE="${W}/deepep-build.rc"   # slots: the DeepEP/HybridEP jobs wait for it
      say "DeepEP build started (pid ${deepep_pid})"
      ;;
    deepep-wait)
      while [[ ! -f "${W}/deepep-build.rc" ]]; do sleep 5; done
      say "DeepEP build $(cat "${W}/deepep-build.rc" 2>/dev/null): $(grep 'run.sh: deepep' "${W}/deepep-build.log" | tail -1)"
      cp /tmp/deepep-build.log "${W}/deepep-build-detail.log" 2>/dev/null
      cp /tmp/i22/deepep/deep_ep-*.whl "${OUT}/" 2>/dev/null   # outside W: not packed twice
      keep
      ;;
    resume)
      name=bench-te-tiny-real-det
      if [[ ! -f "${GEN}/${name}/torchrun.sh" ]]; then
        mc compile "recipes/bench/${name}.yaml" -o "${GEN}" --force > "${W}/compile-${name}.log" 2>&1 \
          || { cat "${W}/compile-${name}.log"; keep; exit 5; }
      fi
      cp "${GEN}/${name}/mocompile.lock.json" "${W}/lock-${name}.json"
      say "resume: ${GEN}/${name}/torchrun.sh"
      mkdir -p "${W}/resume"
      LAUNCHER="${GEN}/${name}/torchrun.sh" RUN_DIR="build/${name}" PREPARE=skip \
        bash benchmarks/real_data_resume.sh "${W}/resume"
      say "resume rc=$?"
      keep
      ;;
    ncclep)
      python3 - > "${W}/ncclep.txt" 2>&1 <<'PY'
import importlib.util, traceback
import transformer_engine, transformer_engine.pytorch as te  # noqa: F401
print("transformer_engine", transformer_engine.__version__, "at", transformer_engine.__file__)
print("transformer_engine.pytorch.ep spec:", importlib.util.find_spec("transformer_engine.pytorch.ep"))
try:
    from transformer_engine.pytorch import ep  # noqa: F401
    print("ncclep: transformer_engine.pytorch.ep imports")
except Exception:
    print("ncclep: transformer_engine.pytorch.ep does not import:")
    traceback.print_exc(limit=1)
import megatron.core.transformer.moe.fused_a2a as f
print("megatron.core fused_a2a HAVE_TE_EP =", f.HAVE_TE_EP, "; new_nccl_ep_buffer =", f.new_nccl_ep_buffer)
PY
      grep -v Warning "${W}/ncclep.txt" | grep -v "warnings.warn" | tail -8
      say "ncclep checked"
      keep
      ;;
    det)
      for plan in ${DET_PLANS}; do
        if (( SECONDS - t0 > ${DEADLINE:-540} )); then say "deadline: det ${plan} not started"; continue; fi
        gen="$(plan_dir "${plan}" det)" || continue
        run_plan "${gen}" "det-${plan}"
      done
      # shellcheck disable=SC2086  # one argument per plan
      python3 - "${W}" ${DET_PLANS} <<'PY'
import json, os, sys
w, plans = sys.argv[1], sys.argv[2:]
loss = {}
for p in plans:
    f = os.path.join(w, f"det-{p}.jsonl")
    if os.path.exists(f):
        loss[p] = [json.loads(l)["loss"] for l in open(f)]
for p in loss:
    row = [f"{sum(a == b for a, b in zip(loss[p], loss[q]))}/{min(len(loss[p]), len(loss[q]))}" for q in loss]
    print(f"issue22: det bitwise-equal iterations {p:>13}: " + " ".join(f"{q}={r}" for q, r in zip(loss, row)))
PY
      ;;
    time)
      rounds="${TIME_ROUNDS:-3}"
      read -r -a plans <<< "${TIME_PLANS}"
      n=${#plans[@]}
      for round in $(seq 1 "${rounds}"); do
        for k in $(seq 0 $((n - 1))); do
          plan="${plans[$(( (k + round - 1) % n ))]}"
          if (( SECONDS - t0 > ${DEADLINE:-540} )); then say "deadline: time ${plan} round ${round} not started"; continue; fi
          gen="$(plan_dir "${plan}" time)" || continue
          run_plan "${gen}" "time-${plan}-r${round}"
        done
      done
      ;;
    noise)  # the harness's host-side settings A/B on one plan (NOISE_PLAN, default a2a-off = this host's auto plan):
            # each of NOISE_SETTINGS (plain: no CPU shares, Python GC on; affinity: one CPU share per local rank;
            # affinity-gcoff: and gc.disable(), benchsite/sitecustomize.py) in NOISE_ROUNDS interleaved rounds, order
            # rotated; a run whose metrics are already in the results (an earlier call on this machine) is skipped, so
            # the same command continues where the last call's DEADLINE stopped it
      read -r -a settings <<< "${NOISE_SETTINGS:-plain affinity affinity-gcoff}"
      n=${#settings[@]}
      gen="$(plan_dir "${NOISE_PLAN:-a2a-off}" time)" || { say "noise: no launcher"; continue; }
      for round in $(seq 1 "${NOISE_ROUNDS:-3}"); do
        for k in $(seq 0 $((n - 1))); do
          s="${settings[$(( (k + round - 1) % n ))]}"; tag="noise-${s}-r${round}"
          [[ -f "${W}/${tag}.jsonl" ]] && continue
          if (( SECONDS - t0 > ${DEADLINE:-540} )); then say "deadline: ${tag} not started"; continue; fi
          case "${s}" in
            plain) aff=0 gc=on ;;
            affinity) aff=1 gc=on ;;
            affinity-gcoff) aff=1 gc=off ;;
            gcoff) aff=0 gc=off ;;
            *) say "noise: unknown setting ${s}"; continue ;;
          esac
          BENCH_AFFINITY="${aff}" BENCH_GC="${gc}" run_plan "${gen}" "${tag}"
        done
      done
      ;;
    gcprobe)  # GC_ROUNDS runs of NOISE_PLAN (default a2a-off) with the GC probe (benchsite/sitecustomize.py), and a
              # synthetic-heap collection (python3 gc over 1e6 one-item lists) as this host's per-object reference
      gen="$(plan_dir "${NOISE_PLAN:-a2a-off}" time)" || { say "gcprobe: no launcher"; continue; }
      python3 -c 'import gc, json, time
heap = [[i] for i in range(1_000_000)]
t = time.perf_counter(); gc.collect(); dt = time.perf_counter() - t
print(json.dumps({"synthetic_dicts": len(heap), "tracked_objects": len(gc.get_objects()), "collect_s": dt}))' > "${W}/gc-synthetic.json"
      cat "${W}/gc-synthetic.json"
      for round in $(seq 1 "${GC_ROUNDS:-2}"); do
        tag="gcprobe-r${round}"
        [[ -f "${W}/${tag}.jsonl" ]] && continue
        if (( SECONDS - t0 > ${DEADLINE:-540} )); then say "deadline: ${tag} not started"; continue; fi
        BENCH_GCPROBE="/tmp/i22/runs/${tag}/gcprobe" run_plan "${gen}" "${tag}"
        cat "${W}/${tag}"-gc-rank*.json 2>/dev/null; echo
      done
      ;;
    slots)  # 4-GPU host as two 2-GPU slots: TIME_ROUNDS interleaved rounds of TIME_PLANS (2 GPUs each) and
            # SLOT4_PLANS (4 GPUs, once per round, waits for both slots), then DET_PLANS deterministic (2 GPUs), all
            # through benchmarks/gpu/issue22_slots.py started in its own session, so it runs on between device calls;
            # no run starts after SLOTS_BUDGET s from here; runs already in DONE (a folder) are skipped
      # the slots read frozen copies: a later device call re-copies the working tree under running jobs
      F=/tmp/i22/frozen
      rm -rf "${F}"; mkdir -p "${F}"
      cp -r benchmarks/gpu/benchsite benchmarks/gpu/issue22_slots.py "${F}/"
      jobs="${W}/jobs.json"
      : > "${W}/jobs.txt"
      add() {  # TAG PLAN MODE GPUS
        local gen; gen="$(plan_dir "$2" "$3")" || exit 5
        [[ -d "${F}/gen/$(basename "${gen}")" ]] || { mkdir -p "${F}/gen"; cp -r "${gen}" "${F}/gen/"; }
        echo "$1 ${F}/gen/$(basename "${gen}") $4" >> "${W}/jobs.txt"
      }
      read -r -a plans <<< "${TIME_PLANS}"
      n=${#plans[@]}
      rounds="${TIME_ROUNDS:-3}"
      # 4-GPU plans first (SLOT4_FIRST=1, default): one wait for both slots instead of one per round
      if [[ "${SLOT4_FIRST:-1}" == 1 ]]; then
        for round in $(seq 1 "${rounds}"); do for plan in ${SLOT4_PLANS:-}; do add "time-${plan}-r${round}" "${plan}" time 4; done; done
      fi
      # SLOT_DET_FIRST=1: the deterministic runs before the timing rounds (short; they must not be cut by the deadline)
      if [[ "${SLOT_DET_FIRST:-0}" == 1 ]]; then for plan in ${SLOT_DET_PLANS:-}; do add "det-${plan}" "${plan}" det "$(gpus_of "${plan}")"; done; fi
      for round in $(seq 1 "${rounds}"); do
        for k in $(seq 0 $((n - 1))); do
          plan="${plans[$(( (k + round - 1) % n ))]}"
          add "time-${plan}-r${round}" "${plan}" time 2
        done
        if [[ "${SLOT4_FIRST:-1}" != 1 ]]; then for plan in ${SLOT4_PLANS:-}; do add "time-${plan}-r${round}" "${plan}" time 4; done; fi
      done
      if [[ "${SLOT_DET_FIRST:-0}" != 1 ]]; then for plan in ${SLOT_DET_PLANS:-}; do add "det-${plan}" "${plan}" det "$(gpus_of "${plan}")"; done; fi
      python3 - "${W}/jobs.txt" "${jobs}" <<'PY'
import json, os, sys
jobs = []
gate = os.environ.get("DEEPEP_GATE", "")  # set by deepep-bg in this call: flex jobs wait for the build
for line in open(sys.argv[1]):
    tag, gen, gpus = line.split()
    job = {"tag": tag, "gen": gen, "gpus": int(gpus), "group": "hybridep" if "hybridep" in tag else ""}
    if gate and ("deepep" in tag or "hybridep" in tag):
        job["needs"] = gate
    jobs.append(job)
json.dump(jobs, open(sys.argv[2], "w"), indent=1)
print(f"issue22: {len(jobs)} jobs queued")
PY
      (setsid nohup nvidia-smi --query-gpu=timestamp,index,utilization.gpu,clocks.sm,clocks.mem,power.draw,temperature.gpu \
        --format=csv -lms 1000 > "${W}/smi.csv" 2>/dev/null &)
      # shellcheck disable=SC2086  # DONE is one optional folder
      (setsid nohup python3 "${F}/issue22_slots.py" "${jobs}" --work "${W}" \
        --deadline "$(( $(date +%s) + ${SLOTS_BUDGET:-1400} ))" --timeout "${RUN_TIMEOUT:-300}" --slots "$(( $(nvidia-smi -L | wc -l) >= 4 ? 2 : 1 ))" \
        ${DONE:+--done "${DONE}"} > "${W}/slots.log" 2>&1 &)
      say "slots started"
      ;;
    wait)   # follow the slots' log until they are done or CALL_END s into this call, packing results as they come
      # a fresh machine (the last one went back) has no slots: say so at once rather than wait out CALL_END
      # slots started in this call: its log appears within seconds
      for _ in 1 2 3 4 5 6 7 8 9 10; do [[ -f "${W}/slots.log" || ! -f "${W}/jobs.json" ]] && break; sleep 2; done
      if [[ ! -f "${W}/slots.log" ]]; then say "no slots on this machine (a fresh one?): nothing to wait for"; keep; exit 6; fi
      shown=0
      while [[ ! -f "${W}/slots.done" ]] && (( SECONDS - t0 < ${CALL_END:-570} )); do
        sleep 10
        lines=$(wc -l < "${W}/slots.log" 2>/dev/null || echo 0)
        if (( lines > shown )); then sed -n "$((shown + 1)),${lines}p" "${W}/slots.log" | grep "^issue22:"; shown=${lines}; keep; fi
      done
      if [[ -f "${W}/slots.done" ]]; then say "slots done"; else say "slots still running"; fi
      keep
      ;;
    *) echo "unknown phase ${phase}" >&2; exit 2 ;;
  esac
done
keep
say "done"
