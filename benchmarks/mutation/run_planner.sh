#!/usr/bin/env bash
# Mutation testing of the planner (steptime.py, resolve/search.py, resolve/decide.py, memory.py) with
# cosmic-ray (issue 13); not part of CI.
#   SERIAL=1 benchmarks/mutation/run_planner.sh [SCRATCH]   # about 25 minutes on 2 shared CPUs (9645a81)
# Like run.sh: each session works on a `git archive HEAD` copy (cosmic-ray edits files in place).
# The full set (several thousand mutants after the operator filter) takes many hours, so each module
# runs a fixed random sample (sample.py, seed 13; the same commit, seed and size give the same
# mutants). Sizes (0 = all): N_STEPTIME (300), N_SEARCH (80), N_DECIDE (60), N_MEMORY (80), the sizes
# docs/mutation.md reports (at db654b8 the run used 500, 100, all 109 and no memory.py).
# SERIAL=1 runs the sessions one after another (one CPU) instead of two side by side.
# The interpreter: $PYTHON, else .venv-mut (Python 3.12, created here; git ignores it).
# Tests per mutant: tests/test_steptime.py for steptime.py; tests/test_resolve.py,
# tests/test_steptime.py and tests/test_plancache.py for the search and decide modules, plus
# tests/test_lint_fast_paths.py (the Estimator against the full estimate) for memory.py. The one test
# that reads generated/ (test_the_planner_picks_a_measured_good_plan_for_the_te_grid) is deselected in
# cosmic-ray-planner.toml: a golden-file comparison, and generated/ is not in the archive, so it would
# fail for every mutant. Each session first runs its tests on the unmutated copy and stops if they fail
# (a failing baseline would count every mutant as killed). Then report_planner.md is written to
# SCRATCH; docs/mutation.md quotes it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv-mut/bin/python}"
if [[ -z "${PYTHON:-}" && ! -x "$PY" ]]; then
  # Python 3.12: a pyenv shim needs its version pinned (as tests/stack/setup.sh does); else python3.12 on PATH
  if PYENV_VERSION=3.12.1 python3.12 -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    PYENV_VERSION=3.12.1 python3.12 -m venv "$ROOT/.venv-mut"
  else
    python3.12 -m venv "$ROOT/.venv-mut"
  fi
fi
N_STEPTIME="${N_STEPTIME:-300}" N_SEARCH="${N_SEARCH:-80}" N_DECIDE="${N_DECIDE:-60}" N_MEMORY="${N_MEMORY:-80}"
SCRATCH="${1:-$(mktemp -d -t mocompile-mutation-planner-XXXXXX)}"
SEED="${SEED:-13}"
"$PY" -m pip install -q --disable-pip-version-check -r "$ROOT/benchmarks/mutation/requirements.txt" pytest hypothesis \
  "ruamel.yaml>=0.18" "cerberus>=1.3.5" "jinja2>=3.1"
CR="$(dirname "$PY")/cosmic-ray"
FILTER="$(dirname "$PY")/cr-filter-operators"
PLANNER_TESTS="tests/test_resolve.py tests/test_steptime.py tests/test_plancache.py"

session() {  # NAME MODULE SAMPLE-SIZE(0 = all) TESTS
  local dir="$SCRATCH/$1"
  mkdir -p "$dir"
  git -C "$ROOT" archive HEAD compiler tests recipes schemas pyproject.toml README.md | tar -x -C "$dir"
  sed -e "s|^module-path = .*|module-path = [\"$2\"]|" -e "s|PYTHON -m pytest|$PY -m pytest|" -e "s|TESTS|$4|" \
    "$ROOT/benchmarks/mutation/cosmic-ray-planner.toml" > "$dir/cr.toml"
  local baseline
  baseline="$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["cosmic-ray"]["test-command"])' "$dir/cr.toml")"
  (cd "$dir" && XDG_CACHE_HOME="$dir/.cache" bash -c "$baseline" > baseline.log 2>&1) \
    || { echo "$1: the tests fail on the unmutated copy (see $dir/baseline.log)" >&2; return 1; }
  (cd "$dir" && "$CR" init cr.toml session.sqlite && "$FILTER" session.sqlite cr.toml \
    && { [[ "$3" == 0 ]] || "$PY" "$ROOT/benchmarks/mutation/sample.py" session.sqlite "$3" --seed "$SEED"; } \
    && XDG_CACHE_HOME="$dir/.cache" "$CR" exec cr.toml session.sqlite > exec.log 2>&1)
}

first() {
  session steptime compiler/mocompile/steptime.py "$N_STEPTIME" tests/test_steptime.py
  session decide compiler/mocompile/resolve/decide.py "$N_DECIDE" "$PLANNER_TESTS"
}
second() {
  session search compiler/mocompile/resolve/search.py "$N_SEARCH" "$PLANNER_TESTS"
  session memory compiler/mocompile/memory.py "$N_MEMORY" "$PLANNER_TESTS tests/test_lint_fast_paths.py"
}
if [[ "${SERIAL:-0}" == 1 ]]; then
  first
  second
else
  first & second & wait
fi
"$PY" "$ROOT/benchmarks/mutation/report.py" --planner --commit "$(git -C "$ROOT" rev-parse --short HEAD)" \
  "$SCRATCH"/{steptime,search,decide,memory}/session.sqlite > "$SCRATCH/report_planner.md"
echo "wrote $SCRATCH/report_planner.md"
