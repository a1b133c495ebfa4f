#!/usr/bin/env bash
# Mutation testing of the planner (steptime.py, resolve/search.py, resolve/decide.py) with cosmic-ray
# (issue 13); not part of CI.
#   benchmarks/mutation/run_planner.sh [SCRATCH]   # about 40 minutes on 2 shared CPUs
# Like run.sh: each session works on a `git archive HEAD` copy (cosmic-ray edits files in place).
# The full set (3720 mutants after the operator filter) takes many hours, so steptime.py and
# search.py run a fixed random sample (sample.py, seed 13: 500 of 2336 and 100 of 1275; the same
# commit, seed and size give the same mutants); decide.py runs in full (109).
# The interpreter: $PYTHON, else .venv-mut (Python 3.12, created here; git ignores it).
# Tests per mutant: tests/test_steptime.py for steptime.py; tests/test_resolve.py,
# tests/test_steptime.py and tests/test_plancache.py for the search and decide modules. Then
# report_planner.md is written to SCRATCH; docs/mutation.md quotes it.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv-mut/bin/python}"
if [[ -z "${PYTHON:-}" && ! -x "$PY" ]]; then
  python3.12 -m venv "$ROOT/.venv-mut"
fi
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
  sed -e "s|^module-path = .*|module-path = [\"$2\"]|" -e "s|PYTHON -m pytest|$PY -m pytest|" -e "s|TESTS\"|$4\"|" \
    "$ROOT/benchmarks/mutation/cosmic-ray-planner.toml" > "$dir/cr.toml"
  (cd "$dir" && "$CR" init cr.toml session.sqlite && "$FILTER" session.sqlite cr.toml \
    && { [[ "$3" == 0 ]] || "$PY" "$ROOT/benchmarks/mutation/sample.py" session.sqlite "$3" --seed "$SEED"; } \
    && XDG_CACHE_HOME="$dir/.cache" "$CR" exec cr.toml session.sqlite > exec.log 2>&1)
}

{ session steptime compiler/mocompile/steptime.py 500 tests/test_steptime.py
  session decide compiler/mocompile/resolve/decide.py 0 "$PLANNER_TESTS"; } &
session search compiler/mocompile/resolve/search.py 100 "$PLANNER_TESTS" &
wait
"$PY" "$ROOT/benchmarks/mutation/report.py" --planner --commit "$(git -C "$ROOT" rev-parse --short HEAD)" \
  "$SCRATCH/steptime/session.sqlite" "$SCRATCH/search/session.sqlite" "$SCRATCH/decide/session.sqlite" \
  > "$SCRATCH/report_planner.md"
echo "wrote $SCRATCH/report_planner.md"
