#!/usr/bin/env bash
# Install what the ecosystem tests need (idempotent; a few seconds when everything is there).
#
#   bash tests/ecosystem/setup.sh [VENV]     # VENV defaults to .venv-stack
#
#   - into VENV (pip): pre-commit, check-jsonschema, jsonschema, yamllint; kubeflow-trainer-api (Kubeflow
#     Trainer v2's API models, --no-deps: its one dependency, pydantic, is in the stack's lock)
#   - Debian packages (root + apt-get, only when missing): slurm-wlm, munge, shellcheck
# Tests skip, with the reason, when a tool is missing; tests/run calls this first so that in CI
# every one of them really runs.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${1:-$ROOT/.venv-stack}"
[[ "$VENV" = /* ]] || VENV="$ROOT/$VENV"
log() { printf '[ecosystem-setup] %s\n' "$*" >&2; }

if [[ ! -x "$VENV/bin/python" ]]; then
  echo "setup.sh: no Python at $VENV/bin/python (build it first: bash tests/stack/setup.sh)" >&2
  exit 1
fi

# --- Python tools ---------------------------------------------------------------------------------
if "$VENV/bin/python" - <<'PY' >/dev/null 2>&1
import importlib.util, sys
sys.exit(0 if all(importlib.util.find_spec(m) for m in ("pre_commit", "check_jsonschema", "jsonschema", "yamllint",
                                                       "kubeflow_trainer_api")) else 1)
PY
then
  log "python tools present in $VENV"
else
  log "installing pre-commit, check-jsonschema, jsonschema, yamllint into $VENV"
  out="$(mktemp)"
  status=0
  "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
    pre-commit check-jsonschema jsonschema yamllint >"$out" 2>&1 || status=$?
  [[ "$status" -ne 0 ]] || "$VENV/bin/python" -m pip install --disable-pip-version-check --progress-bar off \
    --no-deps "kubeflow-trainer-api==2.3.0" >>"$out" 2>&1 || status=$?
  grep -v -e 'is ignored: it is neither a file nor a directory' "$out" | tail -n 3 >&2 || true
  rm -f "$out"
  [[ "$status" -eq 0 ]] || exit "$status"
fi

# --- Debian packages ------------------------------------------------------------------------------
missing=()
command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v sbatch >/dev/null 2>&1 \
  || missing+=(slurm-wlm)
command -v munged >/dev/null 2>&1 || missing+=(munge)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
if [[ ${#missing[@]} -eq 0 ]]; then
  log "system tools present (slurm-wlm, munge, shellcheck)"
elif [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
  log "installing ${missing[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  log "cannot install ${missing[*]} (needs root and apt-get); the tests that need them will skip"
fi
