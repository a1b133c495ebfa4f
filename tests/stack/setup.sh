#!/usr/bin/env bash
# Create (idempotently) the Python 3.12 venv used to validate generated recipes against the
# real Megatron-Bridge 0.6.2 / Megatron-Core 0.19.2 packages on CPU.
#
#   bash tests/stack/setup.sh            # create or update $ROOT/.venv-stack (no-op if current)
#   bash tests/stack/setup.sh --fresh    # delete and rebuild the venv
#
# Pins: tests/stack/requirements.txt (a complete lock, installed with --no-deps) and
# tests/stack/requirements-nodeps.txt (megatron-bridge, installed with --no-deps because its
# declared dependencies pull wandb, flashinfer, mlflow, ... that the config path never imports).
# A stamp file inside the venv records a hash of both files and the interpreter version; when
# it matches, the script exits at once.
# Transformer Engine is not installed: tests put tests/stack/te_shim on sys.path instead.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="$ROOT/.venv-stack"
REQ="$HERE/requirements.txt"
REQ_NODEPS="$HERE/requirements-nodeps.txt"
STAMP="$VENV/.mocompile-stack-stamp"
SHIM="$HERE/te_shim"

FRESH=0
for arg in "$@"; do
    case "$arg" in
        --fresh) FRESH=1 ;;
        -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "setup.sh: unknown argument: $arg" >&2; exit 2 ;;
    esac
done

log() { printf '[stack-setup] %s\n' "$*" >&2; }

# --- find a Python 3.12 interpreter ---------------------------------------------------------
is_py312() {
    "$@" -c 'import sys; raise SystemExit(0 if sys.version_info[:2] == (3, 12) else 1)' \
        >/dev/null 2>&1
}

find_python() {
    if command -v python3.12 >/dev/null 2>&1 && PYENV_VERSION=3.12.1 is_py312 python3.12; then
        # pyenv shim: pin the 3.12.1 build explicitly
        PY_CMD=(env PYENV_VERSION=3.12.1 python3.12)
        return 0
    fi
    if command -v python3.12 >/dev/null 2>&1 && is_py312 python3.12; then
        PY_CMD=(python3.12)
        return 0
    fi
    if [ -x /root/.pyenv/shims/python3.12 ] \
        && PYENV_VERSION=3.12.1 is_py312 /root/.pyenv/shims/python3.12; then
        PY_CMD=(env PYENV_VERSION=3.12.1 /root/.pyenv/shims/python3.12)
        return 0
    fi
    return 1
}

PY_CMD=()
if ! find_python; then
    echo "setup.sh: no Python 3.12 found (tried PYENV_VERSION=3.12.1 python3.12, python3.12," \
        "/root/.pyenv/shims/python3.12)" >&2
    exit 1
fi

# Resolve the real interpreter path so the venv does not depend on pyenv shims.
PY_REAL="$("${PY_CMD[@]}" -c 'import sys; print(sys.executable)')"
PY_VER="$("$PY_REAL" -c 'import platform; print(platform.python_version())')"

# --- stamp check ----------------------------------------------------------------------------
want_stamp() {
    {
        printf 'python=%s\n' "$PY_VER"
        cat "$REQ" "$REQ_NODEPS"
    } | sha256sum | cut -d' ' -f1
}
WANT="$(want_stamp)"

if [ "$FRESH" -eq 0 ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
    && [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import sys' >/dev/null 2>&1; then
    log "up to date: $VENV"
    exit 0
fi

# --- (re)create the venv --------------------------------------------------------------------
if [ "$FRESH" -eq 1 ] && [ -d "$VENV" ]; then
    log "removing $VENV (--fresh)"
    rm -rf "$VENV"
fi
if [ -d "$VENV" ] && ! is_py312 "$VENV/bin/python"; then
    log "existing $VENV is not a working Python 3.12 venv; recreating"
    rm -rf "$VENV"
fi
if [ ! -d "$VENV" ]; then
    log "creating $VENV with $PY_REAL ($PY_VER)"
    "$PY_REAL" -m venv "$VENV"
fi
rm -f "$STAMP"

# --- enough disk? -----------------------------------------------------------------------------
# The lock (torch's CUDA wheels above all) unpacks to ~6.5 GiB in the venv, and pip stages each wheel
# in the temp folder first. Say so up front instead of failing half-way with pip's "[Errno 28]".
free_gib() { df -Pk "$1" 2>/dev/null | awk 'NR == 2 { printf "%d", $4 / 1048576 }'; }
need_space() {
    local dir="$1" want="$2" have
    have="$(free_gib "$dir")"
    if [ -n "$have" ] && [ "$have" -lt "$want" ]; then
        echo "setup.sh: $dir has ${have} GiB free; the Megatron stack venv needs about ${want} GiB there" \
            "(torch's CUDA wheels). Free some space (old clones, pip caches) or set TMPDIR elsewhere." >&2
        exit 1
    fi
}
if "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
    need_space "$VENV" 1          # an update of a venv that already holds torch
else
    need_space "$VENV" 8
    need_space "${TMPDIR:-/tmp}" 2
fi

PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
export PIP_DISABLE_PIP_VERSION_CHECK=1

pip_install() {
    # Runs pip, keeps its real exit status, and shows only the useful tail of its output
    # (this machine's pip config adds file:// indexes that print one warning per package).
    local out status=0
    out="$(mktemp)"
    "${PIP[@]}" install --no-deps --progress-bar off "$@" >"$out" 2>&1 || status=$?
    grep -v -e 'is ignored: it is neither a file nor a directory' "$out" | tail -n 3 >&2 || true
    rm -f "$out"
    return "$status"
}

log "installing pinned lock ($REQ)"
pip_install -r "$REQ"
log "installing megatron-bridge with --no-deps ($REQ_NODEPS)"
pip_install -r "$REQ_NODEPS"

# --- smoke check: the modules the validator needs import on CPU behind the TE shim -----------
log "smoke-importing Megatron-Bridge config modules behind the TE shim"
PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" - <<'PY'
import importlib
import warnings

warnings.simplefilter("ignore")
for name in (
    "megatron.core",
    "megatron.bridge.training.config",
    "megatron.bridge.training.comm_overlap",
    "megatron.bridge.training.flex_dispatcher_backend",
    "megatron.bridge.models.gpt_provider",
    "megatron.bridge.training.gpt_step",
    "megatron.bridge.recipes",
):
    importlib.import_module(name)
import megatron.core
import torch

print(f"[stack-setup] ok: torch {torch.__version__}, megatron-core {megatron.core.__version__}")
PY

printf '%s\n' "$WANT" > "$STAMP"
log "done: $VENV"
