#!/usr/bin/env bash
# Real tokens + resume on a 2-GPU host (issue 9), with the committed generated launcher, unmodified:
#   A : generated/tiny-moe-real-data/torchrun.sh from scratch, 40 iterations (checkpoints at 20, 40);
#   B1: the same launcher from scratch, killed (SIGKILL to every process of the launch, like a node
#       failure) as soon as Bridge's tracker file says iteration 20 is saved;
#   B2: the same launcher again: preflight reports the resume point, Bridge resumes at 21 and runs to 40.
# Then compares the per-iteration loss (rank 0, the generated MOCOMPILE_METRICS callback) of B2 with A.
# Usage, from the project root on the GPU host: benchmarks/real_data_resume.sh OUTDIR
# Needs: python3 with torch; the wheels of benchmarks/gpu/wheels.txt in .whl (prepare_host.sh).
# Environment: LAUNCHER (default generated/tiny-moe-real-data/torchrun.sh) and RUN_DIR (its recipe's run folder,
# default build/tiny-moe-real-data) run another real-data recipe, e.g. the TE deterministic variant
# recipes/bench/bench-te-tiny-real-det.yaml (benchmarks/gpu/issue22_grid.sh resume); PREPARE=skip trusts SITE as it is;
# KILL_AT (20) is the saved iteration after which B1 is killed.
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${repo}" || exit 1
out="$(mkdir -p "${1:?usage: real_data_resume.sh OUTDIR}" && cd "$1" && pwd)"
logs="$(mktemp -d /tmp/real-data-logs.XXXXXX)"
export PYTHON="${PYTHON:-python3}" SITE="${SITE:-/tmp/site}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

# Skip the install when benchmarks/gpu/run.sh already prepared this SITE from the same wheels (its stamp: the
# same listing as run.sh's, so the stamps agree; an `ls ./*.whl` listing never matched it).
want="$(find "${repo}/.whl" -maxdepth 1 -name '*.whl' -printf '%f\n' 2>/dev/null | sort | md5sum | cut -c1-16)"
if [[ "${PREPARE:-auto}" != "skip" && "$(cat "${SITE}/.mocompile-prepared" 2>/dev/null)" != "${want}" ]]; then
  bash benchmarks/gpu/prepare_host.sh "${repo}/.whl" "${SITE}" >"${logs}/prepare.log" 2>&1 \
    || { tail -20 "${logs}/prepare.log"; exit 1; }
  echo "${want}" >"${SITE}/.mocompile-prepared"
fi
export PYTHONPATH="${SITE}${PYTHONPATH:+:${PYTHONPATH}}"
"${PYTHON}" tests/stack/tiny_corpus.py build/tiny-corpus >"${out}/corpus.json" 2>"${logs}/corpus.log" \
  || { tail -20 "${logs}/corpus.log"; exit 1; }
echo "corpus: $(cat "${out}/corpus.json")"

launcher="${LAUNCHER:-generated/tiny-moe-real-data/torchrun.sh}"
run_dir="${RUN_DIR:-build/tiny-moe-real-data}"
kill_at="${KILL_AT:-20}"
tracker="${run_dir}/checkpoints/latest_checkpointed_iteration.txt"
echo "launcher: ${launcher}; run folder: ${run_dir}; B1 killed after the iteration-${kill_at} save"

descendants() { # every process below PID (by parent id), deepest first
  local pid="$1" child
  for child in $(ps -o pid= --ppid "${pid}" 2>/dev/null); do
    descendants "${child}"
    echo "${child}"
  done
}

rm -rf "${run_dir}"
t0=$SECONDS
MOCOMPILE_METRICS="${out}/a.jsonl" bash "${launcher}" >"${logs}/a.log" 2>&1
echo "A: rc=$? in $((SECONDS - t0)) s; tracker: $(cat "${tracker}" 2>/dev/null)"
tar -czf "${out}/logs.tar.gz" -C "${logs}" .  # refreshed after each phase: a time-out still returns logs

rm -rf "${run_dir}"
t0=$SECONDS
MOCOMPILE_METRICS="${out}/b1.jsonl" bash "${launcher}" >"${logs}/b1.log" 2>&1 &
launch=$!
for _ in $(seq 1 1500); do
  [[ "$(cat "${tracker}" 2>/dev/null)" == "${kill_at}" ]] && break
  kill -0 "${launch}" 2>/dev/null || break
  sleep 0.2
done
mapfile -t pids < <(descendants "${launch}")
kill -KILL "${pids[@]}" "${launch}" 2>/dev/null
wait "${launch}" 2>/dev/null
tar -czf "${out}/logs.tar.gz" -C "${logs}" .
echo "B1: killed after $((SECONDS - t0)) s at tracker $(cat "${tracker}" 2>/dev/null); last metric: $(tail -1 "${out}/b1.jsonl" 2>/dev/null)"

t0=$SECONDS
MOCOMPILE_METRICS="${out}/b2.jsonl" bash "${launcher}" >"${logs}/b2.log" 2>&1
echo "B2: rc=$? in $((SECONDS - t0)) s; tracker: $(cat "${tracker}" 2>/dev/null)"
grep -h "preflight:" "${logs}/b1.log" "${logs}/b2.log"

"${PYTHON}" - "${out}" "${kill_at}" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
kill_at = int(sys.argv[2])

def losses(name):
    path = out / f"{name}.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return {r["iteration"]: r["loss"] for r in rows}

a, b1, b2 = losses("a"), losses("b1"), losses("b2")
resumed = sorted(i for i in b2 if i > kill_at)
diffs = {i: abs(a[i] - b2[i]) for i in resumed if i in a and a[i] is not None and b2[i] is not None}
first = {i: abs(a[i] - b1[i]) for i in range(1, kill_at + 1) if i in a and i in b1}
summary = {
    "a_iterations": sorted(a), "b1_iterations": sorted(b1), "b2_iterations": sorted(b2),
    "b2_first_iteration": min(b2) if b2 else None,
    "resumed_from": kill_at, "resumed_compared": len(diffs), "resumed_max_abs_diff": max(diffs.values()) if diffs else None,
    "resumed_bitwise_equal": sum(1 for d in diffs.values() if d == 0.0),
    "before_kill_max_abs_diff": max(first.values()) if first else None,
    "before_kill_bitwise_equal": sum(1 for d in first.values() if d == 0.0), "before_kill_compared": len(first),
    "loss": {"a": a, "b1": b1, "b2": b2},
}
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps({k: v for k, v in summary.items() if k != "loss"}))
for i in resumed:
    print(f"it {i:2d}  A {a.get(i)!r:>22}  B2 {b2[i]!r:>22}")
PY
ls -la "${run_dir}/checkpoints" >"${logs}/checkpoints.txt" 2>&1
tar -czf "${out}/logs.tar.gz" -C "${logs}" .
