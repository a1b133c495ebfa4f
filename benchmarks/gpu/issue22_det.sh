#!/usr/bin/env bash
# Issue 22 device driver: deterministic mode on one GPU. The mid TE model (recipes/bench/bench-te-mid1-det.yaml,
# training.deterministic: true) runs twice through its generated torchrun launcher; the same plan without
# deterministic mode runs once between them for the cost. The report compares the losses bit for bit.
# Usage (repo root on the host; carry .te .whl .mcdeps):  OUT=<dir> benchmarks/gpu/issue22_det.sh
# $OUT gets console.log and results.tar.gz (rewritten after every run).
set -uo pipefail
mkdir -p "${OUT}" /tmp/det/out
exec > >(tee -a "${OUT}/console.log") 2>&1
keep() { tar czf "${OUT}/results.tar.gz" -C /tmp/det/out . ; }
t0=${SECONDS}
repo="$(pwd)"
W=/tmp/det/out
OUT="${W}" bash benchmarks/gpu/issue20.sh setup > "${W}/setup.log" 2>&1 || { tail -30 "${W}/setup.log"; keep; exit 4; }
mv -f "${W}/results.tar.gz" "${W}/setup.tar.gz" 2>/dev/null
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export PYTHONPATH="/tmp/mcdeps:${repo}/compiler:/tmp/site${PYTHONPATH:+:${PYTHONPATH}}"
RECIPE=recipes/bench/bench-te-mid1-det.yaml
python3 -m mocompile compile "${RECIPE}" -o /tmp/det --force > "${W}/compile-det.log" 2>&1 || { cat "${W}/compile-det.log"; keep; exit 5; }
python3 -m mocompile compile "${RECIPE}" --set training.deterministic=false --set name=bench-te-mid1-nodet \
  -o /tmp/det --force > "${W}/compile-nodet.log" 2>&1 || { cat "${W}/compile-nodet.log"; keep; exit 5; }
for name in bench-te-mid1-det bench-te-mid1-nodet; do cp "/tmp/det/${name}/mocompile.lock.json" "${W}/lock-${name}.json"; done
for run in det-a:bench-te-mid1-det nodet:bench-te-mid1-nodet det-b:bench-te-mid1-det; do
  tag="${run%%:*}"; name="${run#*:}"
  dir="/tmp/det/runs/${tag}"; mkdir -p "${dir}"
  start=${SECONDS}
  (cd "${dir}" && MOCOMPILE_METRICS="${dir}/metrics.jsonl" MASTER_PORT=$((29500 + RANDOM % 500)) \
    timeout 300 bash "/tmp/det/${name}/torchrun.sh" > "${dir}/log.txt" 2>&1)
  rc=$?
  cp "${dir}/metrics.jsonl" "${W}/${tag}.jsonl" 2>/dev/null
  echo "issue22: ${tag} rc=${rc} wall=$((SECONDS - start)) s steps=$(wc -l < "${dir}/metrics.jsonl" 2>/dev/null)"
  [[ ${rc} -ne 0 ]] && { tail -30 "${dir}/log.txt"; cp "${dir}/log.txt" "${W}/${tag}.log"; }
  nvidia-smi --query-gpu=index,name,uuid --format=csv > "${W}/gpus.csv"
  keep
done
python3 - "${W}/det-a.jsonl" "${W}/det-b.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
same = [x["loss"] == y["loss"] for x, y in zip(a, b)]
print(f"issue22: det-a vs det-b: {sum(same)} of {len(same)} iterations with bitwise-equal loss")
PY
keep
echo "issue22: done at $((SECONDS - t0)) s"
