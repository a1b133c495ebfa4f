#!/usr/bin/env bash
# Mutation testing of rules/ and layout.py with cosmic-ray (issue 13); not part of CI.
#   benchmarks/mutation/run.sh [SCRATCH]     # about an hour on 2 CPUs; SCRATCH defaults to a temp folder
# Copies the committed tree (git archive HEAD) to SCRATCH, splits the modules over two cosmic-ray
# sessions run side by side (one per CPU), plants the bugs issue 13 named (named_survivors.py), then
# writes docs/mutation.md from both sessions and benchmarks/mutation/equivalent.yaml (the reasons a
# surviving mutant is harmless). After adding tests for survivors, retest_survivors.py replays only those.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="${PYTHON:-$ROOT/.venv-stack/bin/python}"
SCRATCH="${1:-$(mktemp -d -t mocompile-mutation-XXXXXX)}"
"$PY" -m pip install -q --disable-pip-version-check -r "$ROOT/benchmarks/mutation/requirements.txt"
CR="$(dirname "$PY")/cosmic-ray"
FILTER="$(dirname "$PY")/cr-filter-operators"

session() {  # NAME "module paths as TOML list items"
  local dir="$SCRATCH/$1"
  mkdir -p "$dir"
  git -C "$ROOT" archive HEAD compiler tests recipes schemas pyproject.toml README.md | tar -x -C "$dir"
  sed -e "s|^module-path = .*|module-path = [$2]|" -e "s|PYTHON -m pytest|$PY -m pytest|" \
    "$ROOT/benchmarks/mutation/cosmic-ray.toml" > "$dir/cr.toml"
  (cd "$dir" && "$CR" init cr.toml session.sqlite && "$FILTER" session.sqlite cr.toml \
    && "$CR" exec cr.toml session.sqlite > exec.log 2>&1)
}

session checks '"compiler/mocompile/rules/checks.py"' &
session layout '"compiler/mocompile/layout.py", "compiler/mocompile/rules/engine.py"' &
wait
"$PY" "$ROOT/benchmarks/mutation/named_survivors.py" > "$SCRATCH/named.txt" || true
# The planner's section (run_planner.sh) is kept as it is.
planner="$(sed -n '/^## The planner (issue 13)/,$p' "$ROOT/docs/mutation.md")"
"$PY" "$ROOT/benchmarks/mutation/report.py" --commit "$(git -C "$ROOT" rev-parse --short HEAD)" \
  --named "$SCRATCH/named.txt" --notes "$ROOT/benchmarks/mutation/notes.md" "$SCRATCH/checks/session.sqlite" "$SCRATCH/layout/session.sqlite" \
  > "$ROOT/docs/mutation.md"
if [[ -n "$planner" ]]; then printf '\n%s\n' "$planner" >> "$ROOT/docs/mutation.md"; fi
echo "wrote docs/mutation.md (sessions in $SCRATCH)"
