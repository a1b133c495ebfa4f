#!/usr/bin/env bash
# Make Transformer Engine importable on a lent GPU host (no internet) and prove it on the GPU.
# Input: the pack written here by `python3 benchmarks/gpu/te_pack.py` (git-ignored `.te/`, ~22 MiB:
# the core library with only sm_90 device code, xz-compressed; the metapackage; the PyTorch
# binding's source). On the host, from the repo root:
#   OUT=<dir> benchmarks/gpu/te.sh            (SITE defaults to /tmp/site, TE_PACK to .te)
# Steps, each timed into $OUT/te.json:
#   1. the PyTorch binding: take TE_PACK/transformer_engine_torch-*.whl if one was built before,
#      else build it from the source distribution against the host's torch (C++ only, no device
#      code: 28 files, 59 s with 64 cores) and keep the wheel in $OUT for the next call;
#   2. install the metapackage, the core wheel (minus library), the binding and the pure-Python
#      needs into SITE in one pip call;
#   3. decompress the library into SITE/transformer_engine/wheel_lib/;
#   4. smoke test on the GPU (benchmarks/gpu/te_smoke.py; TE_SMOKE=0 skips it): import, Linear and GroupedLinear
#      forward/backward against a float32 reference, fused permute, DotProductAttention.
# Exit status: 0 when TE imports and the smoke test passes, else non-zero (the JSON says where).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
pack="${TE_PACK:-${repo}/.te}"
wheel_dir="${WHEEL_DIR:-${repo}/.whl}"
site="${SITE:-/tmp/site}"
out="${OUT:-/tmp/te-out}"
py="${PYTHON:-python3}"
mkdir -p "${site}" "${out}"
json="${out}/te.json"
t0=${SECONDS}
declare -A secs
status="ok"; failed_step=""

step() {  # step NAME CMD...: run, time, stop at the first failure
  local name="$1"; shift
  [[ -n "${failed_step}" ]] && return 1
  local s=${SECONDS}
  echo "te.sh: ${name} ..."
  if "$@"; then secs[${name}]=$((SECONDS - s)); echo "te.sh: ${name} ok in ${secs[${name}]} s"
  else secs[${name}]=$((SECONDS - s)); status="failed"; failed_step="${name}"; echo "te.sh: ${name} FAILED" >&2; return 1; fi
}

install_wheels() {  # one pip call: the wheels share the transformer_engine/ folder, and pip
  # --target --upgrade replaces a top-level folder wholesale, so separate calls would undo each other
  shopt -s nullglob
  local wheels=("${pack}"/transformer_engine-*.whl "${pack}"/transformer_engine_cu*nolib*.whl
                /tmp/te-wheel/transformer_engine_torch-*.whl "${pack}"/einops-*.whl "${pack}"/nvdlfw_inspect-*.whl
                "${wheel_dir}"/pydantic-*.whl "${wheel_dir}"/pydantic_core-*.whl "${wheel_dir}"/annotated_types-*.whl
                "${wheel_dir}"/typing_inspection-*.whl)  # TE's recipe module needs pydantic: from the Megatron wheel set
  shopt -u nullglob
  ((${#wheels[@]} >= 3)) || { echo "te.sh: pack incomplete in ${pack} (${wheels[*]}); run benchmarks/gpu/te_pack.py" >&2; return 1; }
  "${py}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "${site}" "${wheels[@]}"
}

unpack_library() {
  "${py}" - "${pack}/libtransformer_engine.so.xz" "${site}/transformer_engine/wheel_lib/libtransformer_engine.so" <<'PY'
import hashlib, json, lzma, pathlib, sys
src, dst = map(pathlib.Path, sys.argv[1:])
data = lzma.decompress(src.read_bytes())
want = json.loads((src.parent / "te-pack.json").read_text())["library_stripped"]["sha256"]
got = hashlib.sha256(data).hexdigest()
if got != want:
    sys.exit(f"te.sh: library hash {got} != pack manifest {want}")
dst.parent.mkdir(parents=True, exist_ok=True)
dst.write_bytes(data)
dst.chmod(0o755)
print(f"te.sh: library {len(data) / 2**20:.0f} MiB -> {dst}")
PY
}

cuda_includes() {  # the header folders of the NVIDIA pip packages beside the host's torch (cudnn.h, nccl.h)
  "${py}" - <<'PY'
import glob, os
import nvidia
roots = list(nvidia.__path__)
print(":".join(sorted({d for r in roots for d in glob.glob(os.path.join(r, "*", "include")) + glob.glob(os.path.join(r, "*", "*", "include"))})))
PY
}

binding() {  # -> /tmp/te-wheel/transformer_engine_torch-*.whl
  shopt -s nullglob
  local built=("${pack}"/transformer_engine_torch-*.whl)
  local sdist=("${pack}"/transformer_engine_torch-*.tar.gz)
  shopt -u nullglob
  rm -rf /tmp/te-wheel && mkdir -p /tmp/te-wheel
  if ((${#built[@]} > 0)); then
    echo "te.sh: using the binding built earlier: ${built[0]}"
    cp "${built[0]}" /tmp/te-wheel/
    return
  fi
  ((${#sdist[@]} > 0)) || { echo "te.sh: no binding source in ${pack}" >&2; return 1; }
  rm -rf /tmp/te-build && mkdir -p /tmp/te-build && tar xzf "${sdist[0]}" -C /tmp/te-build
  local src; src="$(find /tmp/te-build -maxdepth 1 -mindepth 1 -type d | head -1)"
  local inc; inc="$(cuda_includes)"
  echo "te.sh: building the binding in ${src} with $(nproc) jobs; extra includes: ${inc}"
  (cd "${src}" && CUDA_HOME="$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")" CPATH="${inc}${CPATH:+:${CPATH}}" \
     NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS="$(nproc)" "${py}" setup.py -q bdist_wheel -d /tmp/te-wheel \
     > /tmp/te-build/build.log 2>&1)
  local rc=$?
  tail -5 /tmp/te-build/build.log
  gzip -c /tmp/te-build/build.log > "${out}/te-build.log.gz"
  ((rc == 0)) || return "${rc}"
  local whl; whl="$(compgen -G '/tmp/te-wheel/transformer_engine_torch-*.whl' | head -1)"
  [[ -n "${whl}" ]] || { echo "te.sh: the build wrote no wheel" >&2; return 1; }
  ls -la "${whl}"
  cp "${whl}" "${out}/"   # bring it back: put it in .te/ and the next host skips the build
}

smoke() {
  PYTHONPATH="${site}${PYTHONPATH:+:${PYTHONPATH}}" "${py}" "${here}/te_smoke.py" "${out}/te-smoke.json"
}

step binding binding
step install install_wheels
step library unpack_library
if [[ "${TE_SMOKE:-1}" == "0" ]]; then echo "te.sh: TE_SMOKE=0: smoke test skipped"; else step smoke smoke; fi

"${py}" - "${json}" "${status}" "${failed_step}" "$((SECONDS - t0))" "$(declare -p secs)" "${pack}/te-pack.json" <<'PY'
import json, pathlib, re, sys
path, status, failed, total, secs_decl, manifest = sys.argv[1:]
secs = {k: int(v) for k, v in re.findall(r'\[(\w+)\]="?(\d+)"?', secs_decl)}
smoke_path = pathlib.Path(path).with_name("te-smoke.json")
doc = {"status": status, "failed_step": failed or None, "seconds": secs, "total_s": int(total),
       "pack": json.loads(pathlib.Path(manifest).read_text()) if pathlib.Path(manifest).exists() else None,
       "smoke": json.loads(smoke_path.read_text()) if smoke_path.exists() else None}
pathlib.Path(path).write_text(json.dumps(doc, indent=2) + "\n")
print(f"te.sh: {status} in {total} s; steps {secs}")
PY
[[ "${status}" == "ok" ]]
