#!/usr/bin/env bash
# One command on a GPU host (no internet needed): prepare the host from the wheel folder, make
# DeepEP (hybrid-ep branch) available if possible, run every generated/bench-*/torchrun.sh
# unmodified over interleaved repeats, and write benchmarks/results/<host-tag>.json plus
# benchmarks/results/logs/<host-tag>.tar.gz. Then, on any machine: python3 benchmarks/gpu/report.py
#
# Usage: benchmarks/gpu/run.sh [run_bench.py options, e.g. --repeats 3 --deadline 480]
# Environment:
#   WHEEL_DIR   wheel folder from fetch_wheels.sh (default <repo>/.whl)
#   SITE        install target (default /tmp/site)
#   PYTHON      interpreter with torch (default python3)
#   DEEPEP      auto (install a prebuilt wheel, else build from source), build, off (default auto)
#   DEEPEP_WHEEL  a deep_ep wheel built on a host like this one (default WHEEL_DIR/aux/deep_ep-*.whl)
#   DEEPEP_SRC    source archive of deepseek-ai/DeepEP branch hybrid-ep (default WHEEL_DIR/aux/deepep-hybrid-ep-*.tar.gz)
#   DEEPEP_BUILD_TIMEOUT  seconds for the on-host build (default 300)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
cd "${repo}"
WHEEL_DIR="${WHEEL_DIR:-${repo}/.whl}"
SITE="${SITE:-/tmp/site}"
PYTHON="${PYTHON:-python3}"
DEEPEP="${DEEPEP:-auto}"
export PYTHON

# Multicast stays off on shared hosts (the generated launchers add their own block on top).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1

# PREPARE=auto (default) skips prepare_host.sh when this SITE was already prepared from the same
# wheel set on this host (a second call on a still-warm machine); PREPARE=always forces it; PREPARE=skip
# trusts a SITE another driver prepared (issue22_grid.sh builds DeepEP here while jobs run from SITE).
stamp="${SITE}/.mocompile-prepared"
want="$(find "${WHEEL_DIR}" -maxdepth 1 -name '*.whl' -printf '%f\n' 2>/dev/null | sort | md5sum | cut -c1-16)"
if [[ "${PREPARE:-auto}" == "skip" ]]; then
  echo "run.sh: PREPARE=skip: using ${SITE} as it is"
elif [[ "${PREPARE:-auto}" == "always" || ! -f "${stamp}" || "$(cat "${stamp}")" != "${want}" ]]; then
  bash "${here}/prepare_host.sh" "${WHEEL_DIR}" "${SITE}"
  echo "${want}" > "${stamp}"
else
  echo "run.sh: ${SITE} already prepared from this wheel set (PREPARE=always to redo)"
fi
export PYTHONPATH="${SITE}${PYTHONPATH:+:${PYTHONPATH}}"

# HybridEP JIT-compiles kernels at first use with ${CUDA_HOME}/bin/nvcc (csrc/hybrid_ep/jit/compiler.cu).
if [[ -z "${CUDA_HOME:-}" ]] && command -v nvcc >/dev/null 2>&1; then
  CUDA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
fi
# Hosts preset CUDA_HOME=/usr/local/cuda, a symlink: `find` does not descend into a symlinked
# start folder, so the CCCL search below found nothing and the DeepEP build failed at
# cuda/std/tuple. Always work with the resolved path (issue 10).
if [[ -n "${CUDA_HOME:-}" ]]; then
  CUDA_HOME="$(readlink -f "${CUDA_HOME}")"
  export CUDA_HOME
fi
echo "run.sh: CUDA_HOME=${CUDA_HOME:-unset}"

status="$(mktemp /tmp/deepep_status.XXXXXX.json)"
deepep_status() { # ok status reason [build_s]
  "${PYTHON}" -c 'import json, sys; ok, st, why, b = sys.argv[1:5]; json.dump({"ok": ok == "true", "status": st, "reason": why, "build_s": int(b) if b else None, "source": "deepseek-ai/DeepEP branch hybrid-ep"}, open(sys.argv[5], "w"))' \
    "$1" "$2" "$3" "${4:-}" "${status}"
  echo "run.sh: deepep: $2: $3"
}
deepep_check() { # prints HAVE flags; fails unless Buffer and HybridEPBuffer import
  "${PYTHON}" - <<'PY'
import megatron.core.transformer.moe.fused_a2a as f
from deep_ep import Buffer, HybridEPBuffer  # noqa: F401
print(f"HAVE_DEEP_EP={f.HAVE_DEEP_EP} HAVE_HYBRIDEP={getattr(f, 'HAVE_HYBRIDEP', None)}")
PY
}
if [[ "${DEEPEP}" == "off" ]]; then
  deepep_status false skipped "DEEPEP=off"
else
  # .deepep/ and .deepep-src/ (git-ignored, beside .whl/) keep them out of .whl/ so that .whl + .te + the
  # DeepEP wheel fit one call's 64 MiB (issue11.sh); WHEEL_DIR/aux/ still works
  wheel="${DEEPEP_WHEEL:-$(compgen -G "${WHEEL_DIR}/aux/deep_ep-*.whl" || compgen -G "${WHEEL_DIR}/../.deepep/deep_ep-*.whl" || true)}"
  wheel="${wheel%%$'\n'*}"
  srctar="${DEEPEP_SRC:-$(compgen -G "${WHEEL_DIR}/aux/deepep-hybrid-ep-*.tar.gz" || compgen -G "${WHEEL_DIR}/../.deepep-src/deepep-hybrid-ep-*.tar.gz" || true)}"
  srctar="${srctar%%$'\n'*}"
  if [[ "${DEEPEP}" == "auto" && -n "${wheel}" && -f "${wheel}" ]]; then
    "${PYTHON}" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "${SITE}" "${wheel}"
    if have="$(deepep_check 2>/tmp/deepep_check.err | tail -1)"; then
      deepep_status true installed "prebuilt wheel $(basename "${wheel}"); ${have}"
    else
      deepep_status false failed "prebuilt wheel does not import: $(tail -1 /tmp/deepep_check.err)"
    fi
  elif [[ -n "${srctar}" && -f "${srctar}" ]]; then
    arch="$("${PYTHON}" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))')"
    cccl="$(find -L "$(readlink -f "${CUDA_HOME:-/usr/local/cuda}")" -path '*/cccl/cuda/std/tuple' 2>/dev/null | head -1)"
    cccl="${cccl%/cuda/std/tuple}"
    if [[ -z "${cccl}" ]]; then
      echo "run.sh: warning: no cccl/cuda/std/tuple under CUDA_HOME=${CUDA_HOME:-unset}; the DeepEP build will likely fail" >&2
    fi
    rm -rf /tmp/deepep-build && mkdir -p /tmp/deepep-build
    tar xzf "${srctar}" -C /tmp/deepep-build
    src="$(find /tmp/deepep-build -maxdepth 2 -name setup.py -printf '%h\n' | head -1)"
    t0=${SECONDS}
    echo "run.sh: building DeepEP from $(basename "${srctar}") for sm ${arch} (CPATH+=${cccl}, log /tmp/deepep-build.log)"
    # The system compilers, not the hosts' CC/CXX wrappers: those link a private static libstdc++ into the
    # extensions, whose first ostream use then segfaults (HybridEP's get_comm_id; preflight RUN015 finds it).
    if (cd "${src}" && CC="${DEEPEP_CC:-/usr/bin/gcc}" CXX="${DEEPEP_CXX:-/usr/bin/g++}" \
          CPATH="${cccl}${CPATH:+:${CPATH}}" TORCH_CUDA_ARCH_LIST="${arch}" MAX_JOBS="$(nproc)" \
          timeout "${DEEPEP_BUILD_TIMEOUT:-300}" "${PYTHON}" -m pip wheel --no-build-isolation --no-deps --no-index \
          -w /tmp/deepep-build/dist .) > /tmp/deepep-build.log 2>&1; then
      "${PYTHON}" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "${SITE}" /tmp/deepep-build/dist/deep_ep-*.whl
      # DEEPEP_WHEEL_OUT: keep the built wheel (bring it back and put it in .whl/aux to skip the build next time)
      if [[ -n "${DEEPEP_WHEEL_OUT:-}" ]]; then mkdir -p "${DEEPEP_WHEEL_OUT}" && cp /tmp/deepep-build/dist/deep_ep-*.whl "${DEEPEP_WHEEL_OUT}/"; fi
      if have="$(deepep_check 2>/tmp/deepep_check.err | tail -1)"; then
        deepep_status true built "built on host in $((SECONDS - t0)) s, sm ${arch}; ${have}" "$((SECONDS - t0))"
      else
        deepep_status false failed "built in $((SECONDS - t0)) s but does not import: $(tail -1 /tmp/deepep_check.err)"
      fi
    else
      rc=$?
      deepep_status false failed "build rc=${rc} after $((SECONDS - t0)) s (124 = time box ${DEEPEP_BUILD_TIMEOUT:-300} s): $(grep -m1 -E 'error|Error' /tmp/deepep-build.log | cut -c1-200)"
    fi
  else
    deepep_status false skipped "no DeepEP wheel or hybrid-ep source archive under ${WHEEL_DIR}/aux (see README)"
  fi
fi

# RUN_BENCH=0: prepare the host and DeepEP only (e.g. before a diagnostic script).
if [[ "${RUN_BENCH:-1}" == "0" ]]; then
  "${PYTHON}" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if d["ok"] or d["status"] == "skipped" else 1)' "${status}"
  exit $?
fi
# Exits non-zero (3) when a requested variant could not run (e.g. flex variants without deep_ep).
"${PYTHON}" "${here}/run_bench.py" --deepep-status "${status}" "$@"
