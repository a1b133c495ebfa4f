#!/usr/bin/env bash
# Issue 23 device driver: the rank probe of NVIDIA's shipped MoE recipes at full size, on ONE GPU. Each recipe's
# intent (build/rankprobe/intents/<name>.yaml, from `mocompile init --from <recipe> --benchmark`) is compiled on the
# host and its generated, unmodified rankprobe.sh runs the most-loaded rank under torch's fake process group.
# Usage (repo root on the host; carry .te .whl .mcdeps build/rankprobe):  OUT=<dir> benchmarks/gpu/issue23_rankprobe.sh NAME[@RANK]...
# (@RANK: impersonate that global rank instead of the one the estimate calls most loaded; results are NAME-rRANK.*)
# build/rankprobe holds: intents/ (the intents), hf/hub (an offline HF cache of config.json files built from mocompile's
# catalogue by benchmarks/gpu/rankprobe_hf.py: Bridge's recipes read them at start-up), wheels/ (fla-core and
# flash-linear-attention for Qwen3-Next's Gated DeltaNet, emerging-optimizers and absl-py for Kimi-K2's Muon).
# Environment: FLA_SKIP_HOPPER_CHECK=1 (see below), SETS (--set words for every compile, e.g. "--set versions.apex=none"), ITERS (6), TIMEOUT (per recipe, 240 s), DEADLINE (no recipe starts later, 480 s).
# $OUT gets console.log and results.tar.gz (rewritten after every recipe).
set -uo pipefail
mkdir -p "${OUT}" /tmp/rankprobe/out
exec > >(tee -a "${OUT}/console.log") 2>&1
keep() { tar czf "${OUT}/results.tar.gz" -C /tmp/rankprobe/out . ; }
t0=${SECONDS}
repo="$(pwd)"
W=/tmp/rankprobe/out
OUT="${W}" bash benchmarks/gpu/issue20.sh setup > "${W}/setup.log" 2>&1 || { tail -30 "${W}/setup.log"; keep; exit 4; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site build/rankprobe/wheels/*.whl > "${W}/wheels.log" 2>&1 \
  || tail -5 "${W}/wheels.log"
if [[ "${FLA_SKIP_HOPPER_CHECK:-0}" == 1 && -f /tmp/site/fla/ops/common/chunk_o.py ]]; then
  # fla-core 0.5.2 refuses the gated delta rule's backward on Hopper with Triton >= 3.4, < 3.7.1 (its issue 640: wrong
  # gradient values); the hosts' torch 2.11 ships an older Triton and neither Triton 3.7.1 nor tilelang fits the
  # carry. A memory probe measures allocations and kernel time, not values: lift the refusal for the probe only.
  sed -i 's/and not TRITON_ABOVE_3_7_1:/and not TRITON_ABOVE_3_7_1 and False:/' /tmp/site/fla/ops/common/chunk_o.py
  echo "issue23: fla Hopper/Triton refusal lifted for this probe (FLA_SKIP_HOPPER_CHECK=1; gradient values not trusted)"
fi
echo "issue23: setup done at $((SECONDS - t0)) s"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
export PYTHONPATH="/tmp/mcdeps:${repo}/compiler:/tmp/site${PYTHONPATH:+:${PYTHONPATH}}"
export HF_HUB_CACHE="${repo}/build/rankprobe/hf/hub" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "${W}/gpus.csv"
for item in "$@"; do
  name="${item%@*}"; rank=""; tag="${name}"
  if [[ "${item}" == *@* ]]; then rank="${item#*@}"; tag="${name}-r${rank}"; fi
  if (( SECONDS - t0 > ${DEADLINE:-480} )); then echo "issue23: deadline, ${name} not started"; continue; fi
  # shellcheck disable=SC2086  # SETS holds --set words by design
  python3 -m mocompile compile "build/rankprobe/intents/${name}.yaml" ${SETS:-} -o /tmp/rankprobe/gen --force \
    > "${W}/compile-${name}.log" 2>&1 || { echo "issue23: ${name} compile failed"; tail -5 "${W}/compile-${name}.log"; continue; }
  cp "/tmp/rankprobe/gen/${name}/mocompile.lock.json" "${W}/lock-${tag}.json"
  start=${SECONDS}
  env MOCOMPILE_RANK_PROBE="${W}/${tag}.json" MOCOMPILE_RANK_PROBE_ITERS="${ITERS:-6}" ${rank:+MOCOMPILE_RANK_PROBE_RANK="${rank}"} \
    timeout "${TIMEOUT:-240}" bash "/tmp/rankprobe/gen/${name}/rankprobe.sh" > "${W}/${tag}.log" 2>&1
  rc=$?
  echo "issue23: ${tag} rc=${rc} wall=$((SECONDS - start)) s"
  python3 - "${W}/${tag}.json" <<'PY' || true
import json, sys
from mocompile import rankprobe
r = json.load(open(sys.argv[1]))
est = rankprobe.probed_estimate_gib(r["spec"], int(r["rank"]))  # the impersonated rank's stage
alloc = r["max_memory_allocated"] / 2**30
print(f"  rank {r['rank']}/{r['world_size']} iterations {len(r['iterations'])} peak allocated {alloc:.2f} GiB "
      f"reserved {r['max_memory_reserved'] / 2**30:.2f} GiB estimate {est} GiB "
      f"({(est - alloc) / alloc:+.1%})" if alloc else "  no peak", "error:", r.get("error"))
print("  step ms:", [round(x["step_ms"]) for x in r["iterations"]])
PY
  [[ ${rc} -ne 0 ]] && grep -v "Warning\|warn(" "${W}/${tag}.log" | tail -25
  keep
done
echo "issue23: done at $((SECONDS - t0)) s"
